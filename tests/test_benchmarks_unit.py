"""benchmarks/: the arithmetic, the corpus, the safety rails, the report writer, and one tiny live load run
against the FastAPI baseline served in-process on an ephemeral loopback port. No Ray."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from statistics import mean
from typing import Any

import pytest

from app.config import Limits
from app.http.inputs import multipart_images
from app.imaging.probe import probe_dimensions
from app.protocol import v2
from app.served_model import ModelFiles
from benchmarks.corpus import SIZES, CorpusImage, build_corpus, describe, render
from benchmarks.load import (
    NonLoopbackURL,
    Sample,
    Workload,
    build_payloads,
    closed_step,
    multipart_body,
    open_run,
    poisson_schedule,
    read_reply,
    require_loopback,
    summarize,
    v2_request,
    wrk_step,
)
from benchmarks.report import markdown_table, steps_table
from benchmarks.stats import knee, latency_summary, percentile

# --- percentiles and the knee ----------------------------------------------------------------------------


def test_percentile_interpolates_like_numpy() -> None:
    values = list(range(1, 101))
    assert percentile(values, 50) == pytest.approx(50.5)
    assert percentile(values, 99) == pytest.approx(99.01)
    assert percentile([7.0], 99) == 7.0
    assert percentile([], 50) is None


def test_latency_summary_is_in_milliseconds() -> None:
    s = latency_summary([0.010, 0.020, 0.030])
    assert s["p50_ms"] == pytest.approx(20.0)
    assert s["max_ms"] == pytest.approx(30.0)
    assert s["mean_ms"] == pytest.approx(20.0)
    assert latency_summary([])["p99_ms"] is None


def test_knee_is_the_smallest_batch_within_five_percent_of_the_best() -> None:
    batches = [1, 2, 4, 8, 16, 32, 64]
    assert knee(batches, [50, 90, 150, 190, 199, 200, 196]) == 8  # 190 >= 0.95 * 200
    assert knee(batches, [50, 90, 150, 189, 199, 200, 196]) == 16  # 189 < 190
    assert knee(batches, [100, 90, 80, 70, 60, 50, 40]) == 1  # batching never helps


def test_knee_ignores_missing_points_and_rejects_mismatched_lengths() -> None:
    assert knee([1, 2, 4], [10.0, float("nan"), 10.2]) == 1
    assert knee([], []) is None
    with pytest.raises(ValueError):
        knee([1, 2], [1.0])


# --- the open-loop schedule ------------------------------------------------------------------------------


def test_poisson_schedule_has_the_requested_mean_rate() -> None:
    arrivals = poisson_schedule(rate=50.0, duration_s=1e9, max_requests=20_000, seed=1)
    gaps = [b - a for a, b in zip([0.0, *arrivals], arrivals, strict=False)]
    assert len(arrivals) == 20_000
    assert mean(gaps) == pytest.approx(1 / 50.0, rel=0.03)
    assert arrivals == sorted(arrivals)


def test_poisson_schedule_is_bounded_by_time_and_count_and_seeded() -> None:
    timed = poisson_schedule(rate=100.0, duration_s=2.0, max_requests=10_000, seed=3)
    assert all(t < 2.0 for t in timed) and 120 < len(timed) < 280  # mean 200, sd ~14
    assert len(poisson_schedule(rate=100.0, duration_s=60.0, max_requests=25)) == 25
    assert timed == poisson_schedule(rate=100.0, duration_s=2.0, max_requests=10_000, seed=3)
    with pytest.raises(ValueError):
        poisson_schedule(rate=0, duration_s=1.0, max_requests=1)


# --- the corpus -----------------------------------------------------------------------------------------


def test_corpus_has_every_size_up_to_1080p() -> None:
    corpus = build_corpus()
    assert {(im.width, im.height) for im in corpus} == set(SIZES)
    assert max(w * h for w, h in SIZES) == 1920 * 1080
    for im in corpus:
        info = probe_dimensions(im.data)
        assert info is not None and (info.format, info.width, info.height) == ("jpeg", im.width, im.height)
    assert len({im.name for im in corpus}) == len(corpus) >= 2 * len(SIZES)


def test_corpus_is_deterministic_and_cached() -> None:
    assert render("chelsea", 320, 240) == render("chelsea", 320, 240)
    assert build_corpus() is build_corpus()


def test_corpus_description() -> None:
    corpus = build_corpus(((320, 240), (640, 480)))
    kb = sorted(len(im.data) // 1000 for im in corpus)
    assert describe(corpus) == f"{len(corpus)} JPEGs, sizes 320x240, 640x480 ({kb[0]}-{kb[-1]} kB)"


# --- requests and replies -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8000/v1/classify",
        "http://127.9.8.7/v1/classify",
        "http://[::1]:8000/v1/classify",
        "http://localhost:8000/v1/classify",
    ],
)
def test_loopback_urls_are_accepted(url: str) -> None:
    assert require_loopback(url) == url


@pytest.mark.parametrize(
    "url",
    [
        "http://10.0.0.1:8000/v1/classify",
        "http://192.0.2.10/v1/classify",
        "http://0.0.0.0:8000/v1/classify",
        "http://example.org/v1/classify",
        "http://127.0.0.1.example.org/v1/classify",
        "ftp://127.0.0.1/v1/classify",
        "127.0.0.1:8000/v1/classify",
    ],
)
def test_non_loopback_urls_are_refused(url: str) -> None:
    with pytest.raises(NonLoopbackURL):
        require_loopback(url)


def test_every_step_refuses_a_remote_target_before_sending_anything() -> None:
    remote = Workload(url="http://192.0.2.10:8000/v1/classify")
    with pytest.raises(NonLoopbackURL):
        asyncio.run(closed_step(remote, 1, 1.0, 0.0, 1))
    with pytest.raises(NonLoopbackURL):
        asyncio.run(open_run(remote, 10.0, 1.0, 0.0))
    with pytest.raises(NonLoopbackURL):
        wrk_step(remote, 1, 1.0, 0.0)


def test_targets_and_payloads() -> None:
    assert Workload(images_per_request=16).target == "http://127.0.0.1:8000/v1/classify/batch"
    assert Workload("http://127.0.0.1:8000/v1/classify/").target == "http://127.0.0.1:8000/v1/classify"
    corpus = build_corpus()
    single = build_payloads(corpus, 1)
    assert single[0] == (corpus[0].data, {"Content-Type": "image/jpeg"})
    many = build_payloads(corpus, 16)
    assert len(many) == len(corpus)
    # The app's own multipart reader takes the load generator's bodies.
    files = multipart_images(many[0][0], many[0][1]["Content-Type"], 64)
    assert files == [corpus[i % len(corpus)].data for i in range(16)]
    with pytest.raises(ValueError):
        build_payloads(corpus, 0, "v2")


def test_multipart_body_keeps_bytes_that_look_like_delimiters() -> None:
    tricky = b"\r\n--not-the-boundary\r\n\r\n" + bytes(range(256))
    body, headers = multipart_body([CorpusImage("a", 1, 1, tricky), CorpusImage("b", 1, 1, b"\xff", "image/png")])
    assert multipart_images(body, headers["Content-Type"], 2) == [tricky, b"\xff"]


def test_v2_payloads_are_what_the_app_parses() -> None:
    image = build_corpus(((320, 240),))[0].data
    body, headers = v2_request(image, top_k=3)
    req = v2.parse_infer_request(body, v2.parse_header_length(headers[v2.HEADER_LENGTH]), Limits(), (224, 224))
    assert req.images == [image] and req.max_k == 3
    wl = Workload("http://127.0.0.1:8000/v1/classify", "int8", protocol="v2")
    assert wl.target == "http://127.0.0.1:8000/v2/models/efficientnet_lite0-int8/infer" and wl.headers() == {}
    assert wl.payloads()[0][1]["Content-Type"] == v2.BINARY_CONTENT_TYPE
    corpus = build_corpus(((320, 240), (640, 480)))
    body, headers = Workload(protocol="v2", images_per_request=3, sizes=((320, 240), (640, 480))).payloads()[1]
    req = v2.parse_infer_request(body, v2.parse_header_length(headers[v2.HEADER_LENGTH]), Limits(), (224, 224))
    assert req.images == [corpus[1].data, corpus[2].data, corpus[3].data] and req.batch_size == 3


def test_read_reply_takes_variant_and_batch_sizes() -> None:
    one = json.dumps({"variant": "int8", "timings_ms": {"batch_size": 4}}).encode()
    assert read_reply(200, {"X-Model-Variant": "fp32"}, one) == ("fp32", [4])
    assert read_reply(200, {}, one) == ("int8", [4])
    many = json.dumps({"results": [{"timings_ms": {"batch_size": 16}}, {"error": {"code": "x"}}]}).encode()
    assert read_reply(200, {}, many) == (None, [16])
    assert read_reply(503, {"X-Model-Variant": "fp32"}, b"{}") == ("fp32", [])
    assert read_reply(200, {}, b"not json") == (None, [])


# --- the Markdown writer --------------------------------------------------------------------------------


def test_markdown_table() -> None:
    table = markdown_table(["target", "req/s", "note"], [["a|b", 12.345, None], ["c", 3, {"503": 2}]])
    assert table == ("| target | req/s | note |\n|---|---|---|\n| a\\|b | 12.3 | n/a |\n| c | 3 | 503=2 |\n")
    with pytest.raises(ValueError):
        markdown_table(["one", "two"], [["only one"]])


def test_steps_table_has_one_row_per_step() -> None:
    step = {
        "workload": "sweep",
        "concurrency": 4,
        "images_per_request": 1,
        "variant": "fp32",
        "requests": 100,
        "throughput_rps": 50.0,
        "images_per_s": 50.0,
        "latency_ms": {"p50_ms": 10.0, "p90_ms": 12.0, "p99_ms": 20.0, "max_ms": 25.0},
        "errors": {"503": 1},
        "variants": {"fp32": 99},
        "median_batch_size": 1.0,
    }
    lines = steps_table([step, {**step, "workload": "batch", "errors": {}, "variant": None}]).splitlines()
    assert len(lines) == 4 and lines[0].startswith("| workload | concurrency | images per request | variant |")
    assert (
        lines[2] == "| sweep | 4 | 1 | fp32 | 100 | 50.0 | 50.0 | 10.0 | 12.0 | 20.0 | 25.0 | 503=1 | fp32=99 | 1.0 |"
    )
    assert lines[3].startswith("| batch | 4 | 1 | n/a |") and "| - |" in lines[3]


def _step(workload: str, concurrency: int, rps: float, variant: str = "fp32", **extra: object) -> dict[str, object]:
    return {
        "workload": workload,
        "mode": "closed",
        "concurrency": concurrency,
        "variant": variant,
        "throughput_rps": rps,
        "images_per_s": rps * (16 if workload == "batch" else 1),
        "latency_ms": {"p50_ms": 1000.0 / rps},
        "errors": {},
        **extra,
    }


def test_targets_are_computed_from_the_steps_of_one_run() -> None:
    from benchmarks.run import TARGET_HEADERS, pair_ratios, target_rows

    app_batch = [
        _step("batch", 8, 10.0, "fp32", pair=0),
        _step("batch", 8, 17.0, "int8", pair=0),
        _step("batch", 8, 15.0, "int8", pair=1),  # alternating order
        _step("batch", 8, 10.0, "fp32", pair=1),
        _step("batch", 8, 12.0, "fp32", pair=2),
        _step("batch", 8, 18.0, "int8", pair=2),
    ]
    assert pair_ratios(app_batch, "int8", "fp32") == [1.7, 1.5, 1.5]
    result = {
        "targets": [
            {"key": "fastapi", "steps": [_step("sweep", 1, 100.0), _step("sweep", 16, 140.0)]},
            {"key": "single_default", "steps": [_step("sweep", 1, 40.0), _step("sweep", 32, 60.0)]},
            {"key": "single", "steps": [_step("sweep", 1, 80.0), _step("sweep", 32, 150.0)]},
            {
                "key": "app",
                "steps": [_step("sweep", 1, 50.0), _step("sweep", 32, 120.0), _step("v2", 32, 108.0), *app_batch],
            },
            {"key": "nobatch", "steps": [_step("sweep", 32, 80.0)]},
        ]
    }
    rows = {r[0]: dict(zip(TARGET_HEADERS, r, strict=True)) for r in target_rows(result)}
    c32 = "single image, FP32, c=32: app / 1-deployment Serve, "
    assert (rows[c32 + "default runtime"]["ratio"], rows[c32 + "default runtime"]["met"]) == ("2.00x", True)
    # The same peer on the app's runtime is reported, never judged.
    assert (rows[c32 + "same serve.env"]["ratio"], rows[c32 + "same serve.env"]["met"]) == ("0.80x", None)
    p50 = rows["p50 at c=1: app / 1-deployment Serve, default runtime"]
    assert (p50["ratio"], p50["met"]) == ("0.80x", True)  # 20 ms against 25 ms
    multi = next(v for k, v in rows.items() if k.startswith("16 images/request, c=8, FP32 img/s"))
    assert (multi["ratio"], multi["met"]) == (f"{160 / 140:.2f}x", True)  # median FP32 160 img/s vs 140 req/s
    int8 = next(
        v for k, v in rows.items() if k == "16 images/request, c=8: INT8 / FP32 img/s (median of alternating pairs)"
    )
    assert rows["16 images/request, c=8: INT8 / FP32 img/s, FastAPI + ORT, one process"]["ratio"] is None  # no steps
    assert (int8["ratio"], int8["met"]) == ("1.50x", False)  # the median pair, not the best one
    assert rows["dynamic batching on / off, single image, c=32"]["ratio"] == "1.50x"
    v2_row = next(v for k, v in rows.items() if k.startswith("single image, FP32, c=32, app: V2 infer / /v1/classify"))
    assert (v2_row["measured"], v2_row["ratio"], v2_row["met"]) == ("108.0 / 120.0 req/s", "0.90x", True)  # >= 0.9x
    assert rows["errors, app, every step (up to c=32)"]["met"] is True
    # A target that failed to start gives n/a, not a crash.
    result["targets"][1]["error"] = "did not start"
    again = {r[0]: r for r in target_rows(result)}
    assert again[c32 + "default runtime"][2] is None and again[c32 + "default runtime"][4] is None


def test_triton_rows_compare_the_app_on_the_cpu_ep_with_triton_and_the_ceiling() -> None:
    from benchmarks.run import TARGET_HEADERS, triton_rows

    many = {"images_per_s": 64.0}
    result = {
        "plan": {"floor": {"ceiling_images_per_s": 100.0}},
        "targets": [
            {"key": "app_ortcpu", "steps": [_step("sweep", 32, 90.0), _step("v2", 32, 99.0), _step("v2", 1, 30.0)]},
            {
                "key": "triton",
                "steps": [_step("v2", 32, 100.0), _step("v2", 1, 20.0), _step("v2batch", 8, 4.0, **many)],
            },
        ],
    }
    result["targets"][0]["steps"].append(_step("v2batch", 8, 5.0, images_per_s=80.0))
    rows = {r[0]: dict(zip(TARGET_HEADERS, r, strict=True)) for r in triton_rows(result)}
    one = rows["single image, c=32: app /v1/classify / Triton V2"]
    assert (one["ratio"], one["met"]) == ("0.90x", False)
    assert rows["single image, c=32: app V2 / Triton V2"]["ratio"] == "0.99x"
    assert rows["16 images/request, c=8, V2 img/s: app / Triton"]["met"] is True  # 80 against 64 img/s
    assert rows["p50 at c=1, V2: app / Triton"]["ratio"] == "0.67x"  # 1000/30 ms against 1000/20 ms: lower is better
    ceiling = rows["16 images/request, c=8, V2 img/s: app / the machine's ceiling"]
    assert (ceiling["ratio"], ceiling["met"]) == ("0.80x", True)
    del result["plan"], result["targets"][1]  # no Triton, no floor: n/a rows, not a crash
    assert all(r["met"] is None for r in (dict(zip(TARGET_HEADERS, x, strict=True)) for x in triton_rows(result)))


def test_cpu_per_image_is_the_server_cpu_over_the_images_served() -> None:
    from benchmarks import cost

    step = {"images_per_s": 50.0, "window_s": 10.0, "server_cpu_s": 12.5}
    assert cost.per_image(step, 20.0) == {
        "cpu_ms_per_image": 25.0,
        "path_ms_per_image": 5.0,
        "client_ms_per_image": None,
    }
    assert cost.per_image({**step, "client_cpu_s": 0.25}, None) == {
        "cpu_ms_per_image": 25.0,
        "path_ms_per_image": None,
        "client_ms_per_image": 0.5,
    }
    assert cost.per_image({**step, "server_cpu_s": None}, 20.0) == {}
    assert cost.per_image({**step, "images_per_s": None}, 20.0) == {}
    import os

    assert cost.tree_cpu_s([os.getpid()]) > 0 and cost.tree_cpu_s([2**22 + 7]) == 0.0  # a pid that cannot exist


def test_the_nobatch_config_switches_off_both_kinds_of_batching_and_nothing_else(tmp_path: Path) -> None:
    import yaml

    from app.config import validate_serve_config
    from benchmarks.run import write_config
    from tests.conftest import deployment, load_config

    cfg = yaml.safe_load(write_config(tmp_path, "nobatch").read_text())
    validate_serve_config(cfg)
    base = load_config("local.yaml")
    assert deployment(cfg, "Router")["user_config"]["coalesce_max"] == 1
    for name in ("Classifier_int8", "Classifier_fp32"):
        assert deployment(cfg, name)["user_config"] == {**deployment(base, name)["user_config"], "max_batch_size": 1}
    assert cfg["applications"][0]["args"]["decode_in"] == base["applications"][0]["args"]["decode_in"]
    assert all(Path(v["model_path"]).is_absolute() for v in cfg["applications"][0]["args"]["variants"].values())


def test_the_split_config_decodes_in_a_preprocessor_and_differs_from_ortcpu_in_nothing_else(tmp_path: Path) -> None:
    import yaml

    from app.config import validate_serve_config
    from benchmarks.run import write_config
    from tests.conftest import deployment

    split = yaml.safe_load(write_config(tmp_path, "split").read_text())
    ortcpu = yaml.safe_load(write_config(tmp_path, "ortcpu").read_text())
    assert validate_serve_config(split).decode_in == "preprocessor"
    assert validate_serve_config(ortcpu).decode_in == "router"
    assert deployment(split, "Preprocessor")["ray_actor_options"] == {"num_cpus": 0.25}
    assert deployment(split, "Router")["ray_actor_options"] == {"num_cpus": 0.25}
    names = [d["name"] for d in split["applications"][0]["deployments"]]
    assert names == ["Router", "Preprocessor", *(d["name"] for d in ortcpu["applications"][0]["deployments"][1:])]
    for cfg in (split, ortcpu):
        assert all(v["engine"] == "cpu" for v in cfg["applications"][0]["args"]["variants"].values())
    for name in names[2:]:
        assert deployment(split, name) == deployment(ortcpu, name)


def test_a_step_counts_what_was_due_in_the_window_and_what_completed_in_it() -> None:
    samples = [
        Sample(0.5, 0.1, 200, "fp32", [4]),  # warm-up
        Sample(1.0, 0.5, 200, "fp32", [8]),
        Sample(1.1, 0.01, 503),
        Sample(1.2, 0.03, 503),
        Sample(1.3, 0, "timeout"),
        Sample(2.9, 0.5, 200, "int8", [16]),  # due inside, done outside
    ]
    out = summarize(Workload(images_per_request=2), samples, (1.0, 3.0), mode="closed", concurrency=4)
    assert (out["requests"], out["ok"], out["errors"]) == (5, 2, {"503": 2, "timeout": 1})
    assert (out["throughput_rps"], out["images_per_s"], out["window_s"]) == (0.5, 1.0, 2.0)
    assert out["variants"] == {"fp32": 1, "int8": 1} and out["median_batch_size"] == 12
    assert out["latency_ms"]["p50_ms"] == pytest.approx(500.0) and out["url"].endswith("/v1/classify/batch")


# --- one tiny live run against the FastAPI baseline -----------------------------------------------------


@pytest.fixture(scope="module")
def fastapi_baseline(model_files: ModelFiles) -> Iterator[str]:
    """The FastAPI + ONNX Runtime baseline on an ephemeral loopback port, in a thread of this process."""
    import httpx
    import uvicorn

    from benchmarks.baselines.fastapi_onnx import create_app

    app = create_app(device="cpu", threads=1, files=model_files)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off"))
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while True:  # poll readiness against a deadline
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, "the FastAPI baseline did not become ready in 30 s"
        thread.join(timeout=0.05)
    yield url
    server.should_exit = True
    thread.join(timeout=10)
    sock.close()


def test_tiny_load_run_records_statuses_and_the_variant_split(fastapi_baseline: str) -> None:
    url = f"{fastapi_baseline}/v1/classify"
    small = ((320, 240), (640, 480))
    int8 = asyncio.run(
        closed_step(
            Workload(url, "int8", sizes=small),
            concurrency=2,
            duration_s=30,
            warmup_s=0,
            max_requests=10,
        )
    )
    served = asyncio.run(
        closed_step(Workload(url, None, sizes=small), concurrency=1, duration_s=30, warmup_s=0, max_requests=5)
    )
    assert (int8["requests"], int8["ok"], int8["errors"]) == (10, 10, {})
    assert int8["variants"] == {"int8": 10}
    assert int8["median_batch_size"] == 1
    assert int8["latency_ms"]["p50_ms"] > 0 and int8["throughput_rps"] > 0
    assert served["variants"] == {"fp32": 5}  # the server's default when no variant is forced
    batch = asyncio.run(
        closed_step(
            Workload(url, "fp32", images_per_request=4, sizes=small),
            concurrency=1,
            duration_s=30,
            warmup_s=0,
            max_requests=2,
        )
    )
    assert (batch["ok"], batch["median_batch_size"], batch["images_per_request"]) == (2, 4, 4)


def test_the_peer_answers_requests_by_the_apps_rules(fastapi_baseline: str) -> None:
    import httpx

    photo = build_corpus(((320, 240),))[0].data
    with httpx.Client(base_url=fastapi_baseline, timeout=30) as client:
        r = client.post("/v1/classify?top_k=2", content=photo, headers={"Content-Type": "image/jpeg"})
        assert r.status_code == 200 and len(r.json()["predictions"]) == 2 and r.headers["X-Model-Variant"] == "fp32"
        refused = {
            415: client.post("/v1/classify", content=photo, headers={"Content-Type": "text/plain"}),
            422: client.post("/v1/classify?top_k=0", content=photo, headers={"Content-Type": "image/jpeg"}),
            400: client.post("/v1/classify", content=b"", headers={"Content-Type": "image/jpeg"}),
        }
        assert {status: r.status_code for status, r in refused.items()} == {415: 415, 422: 422, 400: 400}
        body, headers = multipart_body([CorpusImage("ok", 1, 1, photo), CorpusImage("bad", 1, 1, b"not an image")])
        r = client.post("/v1/classify/batch?top_k=1", content=body, headers=headers)
        ok, bad = r.json()["results"]  # a bad image fails alone, as in the app
        assert len(ok["predictions"]) == 1 and bad["error"]["code"] == "undecodable_image"


def test_a_wrk_step_counts_statuses_variants_and_batch_sizes(fastapi_baseline: str) -> None:
    small = ((320, 240),)
    ok = wrk_step(Workload(f"{fastapi_baseline}/v1/classify", "int8", 2, sizes=small), 1, 1.0, 0.0)
    assert ok["ok"] == ok["requests"] > 0 and ok["errors"] == {} and ok["client"] == "wrk"
    assert (ok["variants"], ok["median_batch_size"], ok["latency_ms"]["p50_ms"] > 0) == ({"int8": ok["ok"]}, 2, True)
    refused = wrk_step(Workload(f"{fastapi_baseline}/v1/classify", "bf16", sizes=small), 1, 1.0, 0.0)
    assert refused["ok"] == 0 and refused["errors"] == {"422": refused["requests"]} and refused["throughput_rps"] == 0


def test_the_ortcpu_config_forces_every_variant_onto_the_cpu_ep_and_nothing_else(tmp_path: Path) -> None:
    import yaml

    from app.config import validate_serve_config
    from benchmarks.run import write_config
    from tests.conftest import load_config

    cfg = yaml.safe_load(write_config(tmp_path, "ortcpu").read_text())
    args = validate_serve_config(cfg)
    assert {v.engine for v in args.variants.values()} == {"cpu"}
    base = load_config("local.yaml")
    assert cfg["applications"][0]["deployments"] == base["applications"][0]["deployments"]


def test_engine_auto_is_judged_against_the_forced_cpu_ep_only_when_it_chose_openvino() -> None:
    from benchmarks.run import TARGET_HEADERS, engine_rows

    answers = {"fp32": {"top1": {"chelsea": 285}}, "int8": {"top1": {"chelsea": 285}}}
    auto: dict[str, dict[str, Any]] = {"fp32": {**answers["fp32"], "engine": "openvino"}, "int8": answers["int8"]}
    batch = [_step("batch", 8, 14.0, "fp32", pair=0), _step("batch", 8, 16.0, "fp32", pair=1)]
    forced = [_step("batch", 8, 10.0, "fp32", pair=0), _step("batch", 8, 10.0, "fp32", pair=1)]
    result: dict[str, Any] = {
        "targets": [
            {"key": "app", "steps": batch, "engines": auto},
            {"key": "app_ortcpu", "steps": forced, "engines": answers},
        ]
    }
    rows = [dict(zip(TARGET_HEADERS, r, strict=True)) for r in engine_rows(result)]
    assert (rows[0]["ratio"], rows[0]["met"]) == (f"{15 * 16 / (10 * 16):.2f}x", True)
    assert rows[1]["met"] is True
    result["targets"][1]["engines"] = {"fp32": {"top1": {"chelsea": 281}}, "int8": answers["int8"]}
    auto["fp32"]["engine"] = "cpu"
    rows = [dict(zip(TARGET_HEADERS, r, strict=True)) for r in engine_rows(result)]
    assert rows[0]["met"] is None and "chose the CPU EP" in rows[0]["goal"]
    assert rows[1]["met"] is False


def test_cascade_served_configs_deploy_as_written_and_the_summary_divides_by_fp32(tmp_path: Path) -> None:
    import yaml

    from app.config import validate_serve_config
    from benchmarks.cascade_served import CASCADE, config, summarize

    for cascade, shadow in (({"margin": "auto", "min_samples": 180}, 1.0), ({"margin": 0.31}, 0.0)):
        cfg = yaml.safe_load(config(tmp_path, cascade, shadow, "cpu").read_text())
        args = validate_serve_config(cfg)
        assert args.cascades[CASCADE].margin == cascade["margin"]
        assert all(v.engine == "cpu" for v in args.variants.values())  # both starts: the same INT8 kernels
        assert cfg["applications"][0]["deployments"][0]["user_config"]["shadow_fraction"] == shadow
        # --engine auto: local.yaml's own engines (auto), the cascade and shadows as above.
        as_is = validate_serve_config(yaml.safe_load(config(tmp_path, cascade, shadow, "auto").read_text()))
        assert all(v.engine == "auto" for v in as_is.variants.values()) and CASCADE in as_is.cascades
    steps = [
        {"variant": v, "images_per_s": r} for v, r in (("fp32", 40.0), ("int8", 60.0), (CASCADE, 45.0), ("fp32", 50.0))
    ]
    s = summarize({"threshold": 0.31, "measured": {"steps": steps, "agreement": 0.99, "escalation": 0.6}})
    assert s["vs_fp32"] == {"int8": 1.333, CASCADE: 1.0} and s["img_per_s"]["fp32 (mean of first and last)"] == 45.0


def test_recalibrate_judges_agreement_on_the_held_out_half_and_auto_on_the_fit_half() -> None:
    import numpy as np

    from benchmarks.recalibrate import judge

    # 100 images: INT8 sure and right on the even ones, unsure (margin 0.02) and wrong on the odd held-out ones.
    probs = np.zeros((100, 4), dtype=np.float32)
    probs[:, 0], probs[:, 1] = 0.9, 0.05
    fp32_top1 = np.zeros(100, dtype=np.int64)
    for i in range(1, 100, 2):
        probs[i, 0], probs[i, 1] = 0.49, 0.51  # INT8 says class 1, margin 0.02
    fp32_top1[1::2] = 0
    got = judge(probs, fp32_top1, slice(0, None, 2), slice(1, None, 2))
    # The fit half (even) never disagrees: auto is 0, and the held-out half (odd) shows what that costs.
    assert got == {"agreement": 0.0, "auto": 0.0, "cascade_agreement": 0.0, "escalated": 0.0}


def test_int8_kernels_times_top1_per_image_and_renders_every_row(tmp_path: Path) -> None:
    import numpy as np

    from benchmarks.int8_kernels import plot, timed, to_markdown

    class Engine:
        calls: list[int] = []

        def logits(self, x: np.ndarray) -> np.ndarray:
            self.calls.append(len(x))
            out = np.zeros((len(x), 3), dtype=np.float32)
            out[np.arange(len(x)), x[:, 0, 0, 0] % 3] = 1.0
            return out

    pixels = np.arange(40, dtype=np.uint8).reshape(40, 1, 1, 1)
    engine = Engine()
    top1, rate = timed(engine, pixels)
    assert top1.tolist() == [i % 3 for i in range(40)] and rate > 0
    assert engine.calls == [16, 16, 16, 8]  # one warm-up batch, then batches of 16
    result = {
        "images": 40,
        "overflowing_layers": {"shipped (pair-limited)": 0, "as calibrated": 34},
        "rows": [
            {"build": "FP32", "way": "ORT fused", "agreement": 1.0, "img_per_s": 50.0},
            {
                "build": "shipped (pair-limited)",
                "way": "ORT fused",
                "agreement": 0.917,
                "img_per_s": 70.0,
                "vs_fp32": 1.4,
            },
            {"build": "as calibrated", "way": "ORT fused", "agreement": 0.778, "img_per_s": 71.0, "vs_fp32": 1.42},
        ],
    }
    md = to_markdown(result)
    assert "| shipped (pair-limited) | ORT fused | 0.917 | 70.0 | 1.40x |" in md
    assert "| as calibrated | ORT fused | 0.778 | 71.0 | 1.42x |" in md and "'as calibrated': 34" in md
    assert plot(result, tmp_path / "k.png").stat().st_size > 0


def test_every_config_of_this_app_runs_behind_the_front_and_no_peer_does() -> None:
    from benchmarks import overload, run

    targets = {t.key: t for t in [*run.TARGETS, *overload.TARGETS.values()]}
    assert targets["nobatch"].with_front and targets["app_ortcpu"].with_front and targets["app_split"].with_front
    assert not targets["app_router"].with_front  # the one without it, by choice
    assert not any(targets[k].with_front for k in ("fastapi", "echo", "single", "triton", "litserve"))
