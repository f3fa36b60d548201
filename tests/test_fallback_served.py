"""The declared fallback served: a Classifier replica on a GPU node without TensorRT (stood in, tests/cuda_stand_in.py)
serves its INT8 variant's FP16 fallback, and its description (what /v1/models shows), its metrics' labels and its
start-up log name what runs and why; the A/B summary says what each variant runs. The Classifier is deployed alone
(tests/fallback_app.py) as a second application beside the session's app, then removed."""

from __future__ import annotations

import copy
import glob
from pathlib import Path
from typing import Any

import httpx
import pytest
import ray
from ray import serve

from app.protocol.v1 import ABSummary, VariantInfo
from app.served_model import BUILTIN_MODEL, ModelFiles
from tests.conftest import REPO, ServeDeployer, driver_handle, local_config, wait_until
from tests.cuda_stand_in import SITECUSTOMIZE
from tests.test_observability import scrape, total

pytestmark = pytest.mark.slow

APP = "fallback"


@pytest.fixture(scope="module")
def fp16_file(model_files: ModelFiles) -> Path:
    if not model_files.fp16.is_file():
        from app.toolchain.fp16 import convert

        convert(model_files.fp32, model_files.fp16)
    return model_files.fp16


def fallback_app(model_files: ModelFiles, fp16: Path, stand_in: Path) -> dict[str, Any]:
    variant = {"model_path": str(model_files.int8), "precision": "int8"}
    variant["fallback"] = {"precision": "fp16", "model_path": str(fp16)}
    return {
        "name": APP,
        "route_prefix": f"/{APP}",
        "import_path": "tests.fallback_app:build",  # the Classifier alone
        "runtime_env": {"env_vars": {"PYTHONPATH": f"{stand_in}:{REPO}"}},  # its workers start on a stood-in GPU
        "args": {
            "model": BUILTIN_MODEL,
            "variants": {"int8": variant},
            "device": "cuda",
            "build_default_models": False,
        },
        "deployments": [
            {
                "name": "Classifier_int8",
                "max_ongoing_requests": 8,
                "ray_actor_options": {"num_cpus": 0.1},
                "user_config": {"max_batch_size": 2},
                "max_constructor_retry_count": 1,
            },
        ],
    }


def _schema(cfg: dict[str, Any]) -> Any:
    from ray.serve.schema import ServeDeploySchema

    kept = {k: v for k, v in cfg.items() if k not in ("http_options", "proxy_location")}
    return ServeDeploySchema.model_validate(kept)


def test_a_gpu_node_without_tensorrt_serves_the_fallback_and_every_report_names_it(
    local_app: ServeDeployer, model_files: ModelFiles, fp16_file: Path, tmp_path: Path
) -> None:
    (tmp_path / "sitecustomize.py").write_text(SITECUSTOMIZE)
    base = local_config(model_files)
    cfg = copy.deepcopy(base)
    cfg["applications"].append(fallback_app(model_files, fp16_file, tmp_path))
    local_app.client.deploy_apps(_schema(cfg))
    try:

        def settled() -> Any:
            st = serve.status().applications.get(APP)
            return st if st is not None and st.status in ("RUNNING", "DEPLOY_FAILED") else None

        st = wait_until(settled, 180, 0.5, "fallback app running or failed")
        assert st.status == "RUNNING", f"{st.message} {[d.message for d in st.deployments.values()]}"
        described = driver_handle("Classifier_int8", APP).describe.remote().result(timeout_s=30)
        # /v1/models shows this dict (the Router adds the routing fields): typed, the fallback in it
        routing = {"deployment": "Classifier_int8", "weight": 1.0, "traffic_fraction": 1.0, "description": ""}
        VariantInfo.model_validate({**described, **routing})
        assert described["precision"] == "fp16" and described["requested_precision"] == "int8"
        fallback = described["fallback"]
        assert fallback["model_file"] == str(fp16_file) and fallback["requested_model_file"] == str(model_files.int8)
        assert fallback["reason"].startswith("TensorRT not loadable: ") and "libnvinfer.so.10" in fallback["reason"]
        assert described["input"]["file"] == str(fp16_file)

        def exported() -> list[tuple[str, dict[str, str], float]] | None:
            s = scrape()
            on = total(s, "ray_app_variant_fallback", variant="int8", precision="fp16", requested_precision="int8")
            provider = total(s, "ray_app_execution_provider", variant="int8", precision="fp16")
            return s if on >= 1 and provider >= 1 else None

        samples = wait_until(exported, 60, 1.0, "the fallback's metrics exported")
        reasons = [lab["reason"] for n, lab, v in samples if n == "ray_app_variant_fallback" and v == 1]
        assert any(r.startswith("TensorRT not loadable") for r in reasons)

        # This Ray's own session directory (not /tmp/ray/session_latest, which a second Ray on the machine moves).
        session = getattr(ray.init(ignore_reinit_error=True), "address_info", {})["session_dir"]

        def logged() -> str | None:
            for path in glob.glob(f"{session}/logs/serve/replica_fallback_Classifier_int8_*.log"):
                text = Path(path).read_text(errors="replace")
                if "int8 requested, fp16 serving: TensorRT not loadable" in text:
                    return text
            return None

        wait_until(logged, 30, 0.5, "the replica's start-up log naming the fallback")
    finally:
        local_app.client.deploy_apps(_schema(base))
        wait_until(lambda: APP not in serve.status().applications, 60, what="fallback app removed")


def test_the_ab_summary_says_what_each_variant_runs(local_app: ServeDeployer) -> None:
    summary = httpx.get(local_app.url + "/v1/ab/summary", timeout=30).json()
    ABSummary.model_validate(summary)
    serving = summary["serving"]
    assert set(serving) == {"int8", "fp32"}
    assert serving["int8"]["precision"] == "int8" and serving["fp32"]["precision"] == "fp32"
    assert serving["int8"]["fallback_reason"] is None and serving["int8"]["engine"] in ("cpu", "openvino")
