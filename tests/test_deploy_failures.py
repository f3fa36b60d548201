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

from app.models import ModelFiles
from tests.conftest import ServeDeployer, local_config, wait_until

pytestmark = pytest.mark.slow

BROKEN = "broken"


def one_variant_app(model_files: ModelFiles, model_path: str | None = None, **changes: Any) -> dict[str, Any]:
    """A small single-variant app at /broken; `changes` patch deployments by name."""
    args: dict[str, Any] = {
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
    assert "cannot load model" in message and str(bad) in message


def test_negative_weight_fails_at_deploy_naming_the_field(deploy_beside: Any, model_files: ModelFiles) -> None:
    message = deploy_beside(one_variant_app(model_files, Router={"user_config": {"weights": {"fp32": -1}}}))
    assert "weights" in message and ">= 0" in message


def test_batch_larger_than_max_ongoing_fails_at_deploy(deploy_beside: Any, model_files: ModelFiles) -> None:
    message = deploy_beside(one_variant_app(model_files, Classifier_fp32={"user_config": {"max_batch_size": 16}}))
    assert "max_batch_size (16)" in message and "max_ongoing_requests (8)" in message


def test_require_gpu_on_a_cpu_only_replica_fails_saying_so(deploy_beside: Any, model_files: ModelFiles) -> None:
    message = deploy_beside(one_variant_app(model_files, args={"device": "cuda", "require_gpu": True}))
    assert "require_gpu" in message and "CPUExecutionProvider" in message
