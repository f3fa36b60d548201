"""Metrics through Ray's Prometheus export, shadow comparisons and /v1/ab/summary, on-demand profiling."""

from __future__ import annotations

import asyncio
import json
import re
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import ray

from app.served_model import ModelFiles
from app.toolchain.samples import sample_bytes
from tests.conftest import METRICS_PORT, ServeDeployer, deployment, driver_handle, local_config, wait_until
from tests.test_app import post_many, small_png

pytestmark = pytest.mark.slow

SAMPLE_RE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(\{(?P<labels>.*)\})?\s+(?P<value>\S+)$")


def scrape() -> list[tuple[str, dict[str, str], float]]:
    text = httpx.get(f"http://127.0.0.1:{METRICS_PORT}/metrics", timeout=10).text
    out = []
    for line in text.splitlines():
        m = SAMPLE_RE.match(line)
        if not m or line.startswith("#"):
            continue
        labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m["labels"] or ""))
        out.append((m["name"], labels, float(m["value"])))
    return out


def total(samples: list[tuple[str, dict[str, str], float]], name: str, **labels: str) -> float:
    return sum(v for n, lab, v in samples if n == name and all(lab.get(k) == x for k, x in labels.items()))


def ab_summary(url: str) -> dict[str, Any]:
    return httpx.get(url + "/v1/ab/summary", timeout=10).json()


def settled(name: str, quiet_s: float = 6.0, **labels: str) -> float:
    """The counter's value once earlier tests' traffic has finished reaching the exporter."""
    history: list[tuple[float, float]] = []

    def stable() -> float | None:
        history.append((time.monotonic(), total(scrape(), name, **labels)))
        same = [t for t, v in history if v == history[-1][1]]
        return history[-1][1] + 1e-9 if history[-1][0] - same[0] >= quiet_s else None  # +1e-9: 0 is a value

    return wait_until(stable, 60, 1.0, f"{name} settled") - 1e-9


def test_metrics_reach_prometheus_with_labels_and_counts(local_app: ServeDeployer) -> None:
    ok_before = settled("ray_app_requests_total", endpoint="/v1/classify", variant="fp32", status="200")
    err_before = total(scrape(), "ray_app_errors_total", code="undecodable_image")
    for i in range(6):
        r = httpx.post(
            local_app.url + "/v1/classify",
            content=small_png(i),
            headers={"Content-Type": "image/png", "X-Model-Variant": "fp32"},
            timeout=30,
        )
        assert r.status_code == 200
    assert (
        httpx.post(
            local_app.url + "/v1/classify", content=b"junk", headers={"Content-Type": "image/png"}, timeout=30
        ).status_code
        == 400
    )

    def counted() -> list[tuple[str, dict[str, str], float]] | None:
        s = scrape()
        ok = total(s, "ray_app_requests_total", endpoint="/v1/classify", variant="fp32", status="200")
        return (
            s
            if ok - ok_before >= 6 and total(s, "ray_app_errors_total", code="undecodable_image") > err_before
            else None
        )

    samples = wait_until(counted, 60, 1.0, "request counters exported")
    assert (
        total(samples, "ray_app_requests_total", endpoint="/v1/classify", variant="fp32", status="200") - ok_before == 6
    )
    # per-stage latency histograms, per variant
    for stage in ("receive", "preprocess", "queue", "inference", "total"):
        assert total(samples, "ray_app_stage_latency_ms_count", stage=stage, variant="fp32") >= 6, stage
    assert total(samples, "ray_app_batch_size_count", variant="fp32") >= 1
    # the mean batch size from exact counts (a histogram's exported _sum is estimated from its buckets)
    images, batches = (total(samples, f"ray_app_{n}_total", variant="fp32") for n in ("batch_images", "batches"))
    assert images >= batches >= 1
    assert total(samples, "ray_app_input_bytes_count") >= 7
    assert total(samples, "ray_app_input_pixels_count") >= 6
    providers = [lab for n, lab, v in samples if n == "ray_app_execution_provider" and v == 1]
    models = httpx.get(local_app.url + "/v1/models", timeout=10).json()["variants"]
    assert {(p["variant"], p["provider"]) for p in providers} >= {
        (v, models[v]["execution_provider"]) for v in ("fp32", "int8")
    }

    # Each replica's own start-up measurement, per batch size, on the engine it chose (as /v1/models says now).
    # Gauges reach the scrape some seconds after they are set, and a replaced replica's series linger: poll.
    seen: dict[str, Any] = {}

    def measured() -> set[tuple[str, str, str]] | None:
        now = httpx.get(local_app.url + "/v1/models", timeout=10).json()["variants"]
        seen["wanted"] = {(v, now[v]["engine"], b) for v in ("fp32", "int8") for b in ("1", "16")}
        seen["got"] = {
            (lab["variant"], lab["engine"], lab["batch"])
            for n, lab, _ in scrape()
            if n == "ray_app_engine_images_per_second"
        }
        return seen["got"] if seen["got"] >= seen["wanted"] else None

    try:
        wait_until(measured, 60, 1.0, "start-up measurements of the engines /v1/models names")
    except AssertionError as e:
        raise AssertionError(f"{e}; last scrape: {seen}") from None
    gate = [v for n, lab, v in samples if n == "ray_app_speed_gate_speedup" and lab["variant"] == "int8"]
    assert gate == [models["int8"]["speed_gate"]["speedup"]]
    # Serve's own tags are on every sample, and the declared model's name on every one of the app's own
    assert all("deployment" in lab for n, lab, _ in samples if n.startswith("ray_app_"))
    ours = [lab for n, lab, _ in samples if n.startswith("ray_app_") and not n.startswith("ray_app_rollout")]
    assert ours and all(lab["model"] == "efficientnet_lite0" for lab in ours if lab["application"] == "classifier")


def test_shadow_every_request_and_summary_counts_match(local_app: ServeDeployer, model_files: ModelFiles) -> None:
    local_app.deploy(local_config(model_files, shadow_fraction=1.0))
    try:
        httpx.post(local_app.url + "/v1/ab/reset", timeout=10).raise_for_status()
        photos = ["chelsea", "coffee", "grace_hopper", "astronaut", "rocket"] * 4
        bodies = [(sample_bytes(p), {}) for p in photos]
        responses = asyncio.run(post_many(local_app.url, bodies, concurrency=4))
        assert all(r.status_code == 200 for r in responses)
        n = len(responses)
        summary = wait_until(
            lambda: (s := ab_summary(local_app.url))["pairs"].get("fp32|int8", {}).get("shadowed") == n and s,
            60,
            0.5,
            "every request shadowed",
        )
        assert sum(v["requests"] for v in summary["variants"].values()) == n
        pair = summary["pairs"]["fp32|int8"]
        assert pair["dropped"] == 0
        assert 0.7 <= pair["top1_agreement"] <= 1.0  # INT8 agrees with FP32 on these photographs
        lo, hi = pair["top1_agreement_ci95"]
        assert lo <= pair["top1_agreement"] <= hi
        assert 0 <= pair["mean_abs_top1_prob_delta"] < 0.2 and 0.5 < pair["mean_top5_overlap"] <= 1
        for v in summary["variants"].values():
            assert v["errors"] == 0 and v["latency_ms"]["p50"] > 0
        # The cascades' evidence rode along: every comparison, whichever variant answered, counted once by INT8's
        # margin (three cascades share the pair in the test app), and far below min_samples: not fitted yet.
        cascade = summary["cascades"]["int8>fp32"]
        assert cascade["evidence"]["comparisons"] == n and len(cascade["curve"]) == 101
        assert cascade["fit"]["fitted"] is False and cascade["threshold"] == cascade["default_margin"]
        assert cascade["evidence"]["disagreements"] == round(n * (1 - pair["top1_agreement"]))
        reset = httpx.post(local_app.url + "/v1/ab/reset", timeout=10).json()
        assert reset["before"]["pairs"]["fp32|int8"]["shadowed"] == n
        after = ab_summary(local_app.url)
        assert after["pairs"] == {} and after["cascades"]["int8>fp32"]["evidence"]["comparisons"] == 0
    finally:
        local_app.deploy(local_config(model_files))


def test_slow_or_dead_shadow_target_does_not_touch_user_requests(
    local_app: ServeDeployer, model_files: ModelFiles
) -> None:
    # Users all go to fp32; every request is shadowed on int8, which is made slow: a batch waits a full
    # second to fill. Then int8's replica is killed outright.
    cfg = local_config(model_files, weights={"fp32": 1, "int8": 0}, shadow_fraction=1.0)
    deployment(cfg, "Classifier_int8")["user_config"] = {"max_batch_size": 16, "batch_wait_timeout_s": 1.0}
    local_app.deploy(cfg)
    try:

        def shadows_done() -> int:  # compared or dropped; the summary flushes this Router's evidence first
            pair = ab_summary(local_app.url)["pairs"].get("fp32|int8", {})
            return int(pair.get("shadowed", 0) + pair.get("dropped", 0))

        start = shadows_done()
        # One user at a time: each is answered, and its shadow sits in int8's batch meanwhile (alone, it waits the
        # full second). A user answered before its own shadow was done is the claim: had users waited on their
        # shadows, each one's would be done by the time it was answered.
        answered_first = None
        for i in range(40):
            r = httpx.post(
                local_app.url + "/v1/classify", content=small_png(i), headers={"Content-Type": "image/png"}, timeout=60
            )
            assert r.status_code == 200 and r.headers["x-model-variant"] == "fp32", r.text
            if answered_first is None and shadows_done() - start < i + 1:
                answered_first = i
        assert answered_first is not None, "every user was answered only after its shadow was done"
        wait_until(lambda: shadows_done() - start >= 40, 60, 0.5, "the shadows done after their users")

        int8 = driver_handle("Classifier_int8")
        replica = int8.describe.remote().result(timeout_s=30)["replica_id"]
        ray.kill(
            ray.get_actor(f"SERVE_REPLICA::classifier#Classifier_int8#{replica}", namespace="serve"), no_restart=True
        )
        bodies = [(small_png(i), {}) for i in range(40)]
        responses = asyncio.run(post_many(local_app.url, bodies, concurrency=4))
        assert all(r.status_code == 200 and r.headers["x-model-variant"] == "fp32" for r in responses)
    finally:
        local_app.deploy(local_config(model_files))


def test_profiling_writes_a_trace_for_exactly_n_batches(
    local_app: ServeDeployer, model_files: ModelFiles, tmp_path: Path
) -> None:
    cfg = local_config(model_files)
    cfg["applications"][0]["args"]["variants"]["fp32"]["engine"] = "cpu"  # ONNX Runtime's profiler, not OpenVINO's
    deployment(cfg, "Classifier_fp32")["user_config"].update(profile_batches=3, profile_dir=str(tmp_path))
    local_app.deploy(cfg)
    try:
        for i in range(6):  # one at a time: each request is one batch
            r = httpx.post(
                local_app.url + "/v1/classify",
                content=small_png(i),
                headers={"Content-Type": "image/png", "X-Model-Variant": "fp32"},
                timeout=30,
            )
            assert r.status_code == 200

        def finished() -> dict[str, Any] | None:
            p = httpx.get(local_app.url + "/v1/models").json()["variants"]["fp32"]["profiling"]
            return p if not p["active"] and p["last"] else None

        state = wait_until(finished, 30, 0.5, "profiling finished")
        traces = list(tmp_path.glob("fp32-*.json"))
        assert len(traces) == 1 and str(traces[0]) == state["last"]["trace"]
        events = json.loads(traces[0].read_text())
        assert sum(1 for e in events if e.get("name") == "model_run") == 3
        expensive = state["last"]["most_expensive"]
        costs = [e["total_ms"] for e in expensive]
        assert 0 < len(expensive) <= 10 and costs == sorted(costs, reverse=True)  # the most expensive first
        assert {"Conv"} <= {e["op"] for e in expensive}
        assert len(state["last"]["most_frequent"]) <= 10
        # and it stays off: more traffic writes nothing new
        httpx.post(
            local_app.url + "/v1/classify",
            content=small_png(9),
            headers={"Content-Type": "image/png", "X-Model-Variant": "fp32"},
            timeout=30,
        )
        assert list(tmp_path.glob("fp32-*.json")) == traces
    finally:
        local_app.deploy(local_config(model_files))
