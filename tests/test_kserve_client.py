"""KServe's Python SDK, unmodified, against the app (configs/local.yaml, HAProxy in front, as `make serve` runs it):
health, model readiness, inference over REST (BYTES binary, UINT8 pixels in JSON and binary) and gRPC, and an
unknown model refused as that client reports it. The client runs in its own venv (tests/kserve_client.py says why),
one script run for every call; tritonclient's calls on the same endpoints are tests/test_v2_http.py and
tests/test_v2_grpc.py."""

from __future__ import annotations

from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.http as triton

from app.imaging.preprocess import preprocess
from app.served_model import builtin_transform
from app.toolchain.samples import sample_bytes
from tests import kserve_client
from tests.conftest import ServeDeployer

pytestmark = pytest.mark.slow

FP32 = "efficientnet_lite0-fp32"
EXPECTED = {"chelsea": 282, "coffee": 967}  # as the service prepares them (tests/test_v2_http.py)


@pytest.fixture(scope="module")
def report(local_app: ServeDeployer, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    reason = kserve_client.why_not_runnable()
    if reason:
        pytest.skip(reason)
    tmp = tmp_path_factory.mktemp("kserve")
    images = []
    for name in EXPECTED:
        images.append(tmp / f"{name}.jpg")
        images[-1].write_bytes(sample_bytes(name))
    pixels = tmp / "pixels.npy"
    np.save(pixels, np.stack([preprocess(sample_bytes(p), builtin_transform()) for p in EXPECTED]))
    return kserve_client.run(local_app.url, local_app.grpc_url, FP32, images, pixels)


def value(report: dict[str, Any], call: str) -> Any:
    assert "value" in report[call], f"{call}: {report[call]}"
    return report[call]["value"]


def test_health_bodies_are_the_protocols(local_app: ServeDeployer) -> None:
    live = httpx.get(local_app.url + "/v2/health/live", timeout=10)
    assert live.status_code == 200 and live.json() == {"live": True}
    assert live.headers["content-type"] == "application/json"
    ready = httpx.get(local_app.url + "/v2/health/ready", timeout=10)
    assert ready.status_code == 200 and ready.json() == {"ready": True}
    model = httpx.get(local_app.url + f"/v2/models/{FP32}/ready", timeout=10)
    assert model.status_code == 200 and model.json() == {"name": FP32, "ready": True}
    unknown = httpx.get(local_app.url + "/v2/models/resnet50/ready", timeout=10)
    assert unknown.status_code == 404 and "resnet50" in unknown.json()["error"]
    # tritonclient reads only the status, and still does with a body
    client = triton.InferenceServerClient(local_app.url.removeprefix("http://"))
    assert client.is_server_live() and client.is_server_ready() and client.is_model_ready(FP32)


def test_health_and_readiness(report: dict[str, Any]) -> None:
    for call in ("rest_live", "rest_ready", "rest_model_ready", "grpc_live", "grpc_ready", "grpc_model_ready"):
        assert value(report, call) is True, call
    assert value(report, "rest_unknown_model_ready") is False


def test_inference_over_rest_and_grpc(report: dict[str, Any]) -> None:
    for call in ("rest_bytes_binary", "rest_pixels_json", "rest_pixels_binary", "grpc_bytes", "grpc_pixels"):
        got = value(report, call)
        assert got["model_name"] == FP32 and got["top1"] == list(EXPECTED.values()), (call, got)
    assert value(report, "rest_bytes_binary")["id"] == "kserve-rest"
    assert value(report, "grpc_pixels")["id"] == "kserve-grpc"


def test_an_unknown_model_is_refused_as_the_client_reports_it(report: dict[str, Any]) -> None:
    rest = report["rest_unknown_model"]
    # the protocol's {"error": ...} message, which the client puts in its exception's text
    assert rest["error"] == "HTTPStatusError" and rest["status"] == 404, rest
    assert "resnet50" in rest["message"].split(", '404")[0], rest
    grpc = report["grpc_unknown_model"]
    assert grpc["code"] == "NOT_FOUND" and "resnet50" in grpc["details"], grpc
