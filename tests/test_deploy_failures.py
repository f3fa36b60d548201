"""Configs that cannot work fail at deploy, visibly in `serve status`, naming the field or file.

Each case is deployed as a second application beside the running one, so the
shared app keeps serving; the broken app is removed afterwards.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from ray import serve

from app.runtime.measure import MAX_SPEEDUP
from app.served_model import BUILTIN_MODEL, ModelFiles
from tests.conftest import ServeDeployer, driver_handle, local_config, wait_until

pytestmark = pytest.mark.slow

BROKEN = "broken"


def one_variant_app(model_files: ModelFiles, model_path: str | None = None, **changes: Any) -> dict[str, Any]:
    """A small single-variant app at /broken; `changes` patch deployments by name."""
    args: dict[str, Any] = {
        "model": BUILTIN_MODEL,  # declared: a model_path of another name is not taken for the built-in model
        "variants": {"fp32": {"model_path": model_path or str(model_files.fp32)}},
        "device": "cpu",
        "build_default_models": False,
    }
    args.update(changes.pop("args", {}))
    deployments: dict[str, dict[str, Any]] = {
        "Router": {"user_config": {"weights": {"fp32": 1}}, "ray_actor_options": {"num_cpus": 0.05}},
        "Preprocessor": {"ray_actor_options": {"num_cpus": 0.05}},
        "Classifier_fp32": {
            "max_ongoing_requests": 8,
            "ray_actor_options": {"num_cpus": 0.1},
            "user_config": {"max_batch_size": 2},
            "max_constructor_retry_count": 1,
        },
    }
    for name, patch in changes.items():
        for key, value in patch.items():
            if isinstance(value, dict) and isinstance(deployments[name].get(key), dict):
                deployments[name][key].update(value)
            else:
                deployments[name][key] = value
    for d in deployments.values():
        d.setdefault("max_constructor_retry_count", 1)
    return {
        "name": BROKEN,
        "route_prefix": "/broken",
        "import_path": "app.main:build_app",
        "args": args,
        "deployments": [{"name": n, **d} for n, d in deployments.items()],
    }


@pytest.fixture
def deploy_beside(local_app: ServeDeployer, model_files: ModelFiles) -> Iterator[Any]:
    base = local_config(model_files)

    def deploy(app_cfg: dict[str, Any]) -> str:
        cfg = copy.deepcopy(base)
        cfg["applications"].append(app_cfg)
        local_app.client.deploy_apps(_schema(cfg))

        def failed() -> str | None:
            st = serve.status().applications.get(BROKEN)
            if st is None:
                return None
            if st.status == "RUNNING":
                raise AssertionError("the broken app started")
            if st.status != "DEPLOY_FAILED":
                return None
            return st.message + " " + " ".join(d.message for d in st.deployments.values())

        return wait_until(failed, 120, 0.5, "DEPLOY_FAILED")

    yield deploy
    local_app.client.deploy_apps(_schema(base))
    wait_until(lambda: BROKEN not in serve.status().applications, 60, what="broken app removed")
    assert httpx.get(local_app.url + "/readyz").status_code == 200


def _schema(cfg: dict[str, Any]) -> Any:
    from ray.serve.schema import ServeDeploySchema

    return ServeDeploySchema.model_validate(
        {k: v for k, v in cfg.items() if k not in ("http_options", "proxy_location")}
    )


def test_missing_model_file_names_the_field(deploy_beside: Any, model_files: ModelFiles, tmp_path: Path) -> None:
    message = deploy_beside(one_variant_app(model_files, str(tmp_path / "nope.onnx")))
    assert "variants.fp32.model_path" in message and "nope.onnx" in message


def test_corrupt_model_file_fails_the_replica_naming_the_path(
    deploy_beside: Any, model_files: ModelFiles, tmp_path: Path
) -> None:
    bad = tmp_path / "corrupt.onnx"
    bad.write_bytes(b"this is not a protobuf" * 100)
    message = deploy_beside(one_variant_app(model_files, str(bad)))
    assert "variants.fp32.model_path" in message and str(bad) in message and "not a readable ONNX file" in message


def test_a_declaration_contradicting_the_graph_fails_at_deploy_naming_the_field(
    deploy_beside: Any, model_files: ModelFiles
) -> None:
    """The built-in graph is 224 x 224: a shorter side of 200 cannot be cropped to it."""
    model = {"name": "mine", "preprocess": {"resize_shorter": 200, "crop": "center"}}
    message = deploy_beside(one_variant_app(model_files, args={"model": model}))
    assert "model.preprocess.resize_shorter: 200" in message and str(model_files.fp32) in message


def test_negative_weight_fails_at_deploy_naming_the_field(deploy_beside: Any, model_files: ModelFiles) -> None:
    message = deploy_beside(one_variant_app(model_files, Router={"user_config": {"weights": {"fp32": -1}}}))
    assert "weights" in message and ">= 0" in message


def test_batch_larger_than_max_ongoing_fails_at_deploy(deploy_beside: Any, model_files: ModelFiles) -> None:
    message = deploy_beside(one_variant_app(model_files, Classifier_fp32={"user_config": {"max_batch_size": 16}}))
    assert "max_batch_size (16)" in message and "max_ongoing_requests (8)" in message


def test_require_gpu_on_a_cpu_only_replica_fails_saying_so(deploy_beside: Any, model_files: ModelFiles) -> None:
    message = deploy_beside(one_variant_app(model_files, args={"device": "cuda", "require_gpu": True}))
    assert "require_gpu" in message and "CPUExecutionProvider" in message


# A speed gate's min_speedup that no measurement meets: a measured speed-up reads at most MAX_SPEEDUP.
UNREACHABLE = 2 * MAX_SPEEDUP


def two_variant_app(model_files: ModelFiles, gate: dict[str, Any]) -> dict[str, Any]:
    """INT8 and FP32 on the CPU EP at /broken, with a speed gate against FP32."""
    app = one_variant_app(model_files, args={"speed_gate": gate})
    app["args"]["variants"] = {
        "fp32": {"model_path": str(model_files.fp32), "engine": "cpu"},
        "int8": {"model_path": str(model_files.int8), "engine": "cpu", "precision": "int8"},
    }
    router = next(d for d in app["deployments"] if d["name"] == "Router")
    router["user_config"]["weights"] = {"fp32": 1, "int8": 1}
    fp32 = next(d for d in app["deployments"] if d["name"] == "Classifier_fp32")
    app["deployments"].append({**copy.deepcopy(fp32), "name": "Classifier_int8"})
    return app


def test_speed_gate_fail_keeps_a_variant_that_is_not_fast_enough_from_starting(
    deploy_beside: Any, model_files: ModelFiles
) -> None:
    # A gate no measurement passes, whatever this machine's speed: the INT8 replica refuses to start, quoting both
    # figures.
    gate = {"baseline": "fp32", "min_speedup": UNREACHABLE, "action": "fail"}
    message = deploy_beside(two_variant_app(model_files, gate))
    assert "Classifier_int8" in message and "speed gate" in message
    assert f"is below min_speedup {UNREACHABLE}x" in message and "img/s" in message


def test_speed_gate_warn_serves_and_flags_the_slow_variant(local_app: ServeDeployer, model_files: ModelFiles) -> None:
    app = two_variant_app(model_files, {"baseline": "fp32", "min_speedup": UNREACHABLE, "action": "warn"})
    app["name"], app["route_prefix"] = "gated", "/gated"
    base = local_config(model_files)
    local_app.client.deploy_apps(_schema({**base, "applications": [*base["applications"], app]}))
    try:

        def running() -> bool:
            st = serve.status().applications.get("gated")
            assert st is None or st.status != "DEPLOY_FAILED", st.message
            return st is not None and st.status == "RUNNING"

        wait_until(running, 180, 0.5, "gated app running")
        # The Router serves at the root only, so the gated app's Classifiers are asked directly.
        int8 = driver_handle("Classifier_int8", "gated").describe.remote().result(timeout_s=30)
        fp32 = driver_handle("Classifier_fp32", "gated").describe.remote().result(timeout_s=30)
        gate = int8["speed_gate"]
        assert gate["passed"] is False and gate["action"] == "warn" and gate["min_speedup"] == UNREACHABLE
        assert gate["speedup"] > 0 and gate["baseline_img_per_s"] > 0  # both sides were measured
        assert int8["engine"] == "cpu" and "speed_gate" not in fp32
        assert driver_handle("Classifier_int8", "gated").ready.remote().result(timeout_s=30) is True  # still serves
    finally:
        local_app.client.deploy_apps(_schema(base))
        wait_until(lambda: "gated" not in serve.status().applications, 60, what="gated app removed")
