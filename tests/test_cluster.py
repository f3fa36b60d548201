"""configs/prod.yaml on a local multi-node cluster: a head with no CPUs, a CPU node advertising
`cpu_pool`, and a node that declares one GPU.

No real GPU exists here. The GPU node only *declares* `num_gpus=1` (a Ray resource, not a
device), so this checks placement and what a replica does when it was granted a GPU that
ONNX Runtime cannot use: it must fall back to CPU and say so, or refuse to start with
`require_gpu`. Run separately from the session cluster: `pytest -m cluster`.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import ray
from ray import serve
from ray.cluster_utils import Cluster

from app.models import ModelFiles
from app.models.samples import sample_bytes
from tests.conftest import load_config, wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

PORT = 18100
URL = f"http://127.0.0.1:{PORT}"


def prod_for_test(model_files: ModelFiles) -> dict[str, Any]:
    """configs/prod.yaml, shrunk to fit one machine; placement settings untouched."""
    cfg = copy.deepcopy(load_config("prod.yaml"))
    app = cfg["applications"][0]
    args = app["args"]
    args["variants"]["int8"]["model_path"] = str(model_files.int8)
    args["variants"]["fp32"]["model_path"] = str(model_files.fp32)
    args["labels_path"] = str(model_files.labels)
    args["device"] = "auto"  # CUDA when a GPU was granted; this machine has no CUDA, so ORT falls back
    args["require_gpu"] = False
    for d in app["deployments"]:
        auto = d["autoscaling_config"]
        auto["min_replicas"] = 2 if d["name"] == "Preprocessor" else 1
        auto["max_replicas"] = auto["min_replicas"]
        if d["name"].startswith("Classifier_"):
            d["user_config"]["max_batch_size"] = 4  # warm-up of 1..64 on one CPU thread takes a minute
            d["user_config"]["max_concurrent_batches"] = 1
    return cfg


@pytest.fixture(scope="module")
def cluster(model_files: ModelFiles) -> Iterator[dict[str, Any]]:
    if ray.is_initialized():
        serve.shutdown()
        ray.shutdown()
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    cpu = c.add_node(num_cpus=4, resources={"cpu_pool": 100})
    gpu = c.add_node(num_cpus=2, num_gpus=1)
    ray.init(address=c.address, namespace="serve", log_to_driver=False)
    from ray.serve._private import api as serve_api
    from ray.serve.schema import ServeDeploySchema

    client = serve_api.serve_start(http_options={"host": "127.0.0.1", "port": PORT}, proxy_location="HeadOnly")
    cfg = prod_for_test(model_files)
    client.deploy_apps(ServeDeploySchema.model_validate({"applications": cfg["applications"]}))
    wait_until(lambda: httpx.get(URL + "/readyz", timeout=5).status_code == 200, 240, 0.5, "prod app ready")
    yield {"cluster": c, "cpu": cpu, "gpu": gpu, "client": client, "cfg": cfg}
    serve.shutdown()
    ray.shutdown()
    c.shutdown()


def node_ids_of(deployment: str, calls: int = 24) -> set[str]:
    handle = serve.get_deployment_handle(deployment, app_name="classifier")
    return {handle.describe.remote().result(timeout_s=30)["node_id"] for _ in range(calls)}


def test_classifiers_land_on_the_gpu_node_and_cpu_work_does_not(cluster: dict[str, Any]) -> None:
    gpu_id, cpu_id = cluster["gpu"].node_id, cluster["cpu"].node_id
    assert node_ids_of("Classifier_int8") == {gpu_id}
    assert node_ids_of("Classifier_fp32") == {gpu_id}
    assert node_ids_of("Preprocessor") == {cpu_id}


def test_a_granted_gpu_that_onnx_runtime_cannot_use_is_reported_as_cpu_fallback(cluster: dict[str, Any]) -> None:
    models = httpx.get(URL + "/v1/models", timeout=10).json()["variants"]
    for v in models.values():
        assert v["requested_providers"] == ["CUDAExecutionProvider", "CPUExecutionProvider"]
        assert v["execution_provider"] == "CPUExecutionProvider"
        assert v["fell_back_to_cpu"] is True and v["on_gpu"] is False


def test_prod_config_serves_end_to_end(cluster: dict[str, Any]) -> None:
    # prod.yaml refuses the override header, so the weights (5% int8) decide.
    r = httpx.post(
        URL + "/v1/classify",
        content=sample_bytes("grace_hopper"),
        headers={"Content-Type": "image/jpeg", "X-Model-Variant": "int8"},
        timeout=30,
    )
    assert r.status_code == 403
    r = httpx.post(
        URL + "/v1/classify", content=sample_bytes("grace_hopper"), headers={"Content-Type": "image/jpeg"}, timeout=30
    )
    assert r.status_code == 200, r.text
    assert r.json()["predictions"][0]["class_id"] == 652
