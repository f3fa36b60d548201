"""The Open Inference Protocol over real gRPC, driven by tritonclient.grpc, a real, unmodified client, on both of
Serve's ingresses: HAProxy with the admission front (configs/serve.env, the session's app) and Serve's Python proxy
(`serve run` on a plain Ray, which pickles each request to hand it to a Router: the messages are the app's own,
app/protocol/v2/pb/); what each says it runs (/v1/models `ingress`, the Router's log); and Triton's own
perf_analyzer over HTTP and gRPC."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as triton
from tritonclient.utils import InferenceServerException

from app.imaging.preprocess import preprocess
from app.served_model import builtin_transform
from app.toolchain.samples import sample_bytes
from benchmarks import perf_analyzer
from tests.conftest import PythonProxyApp, ServeDeployer, wait_until

pytestmark = pytest.mark.slow

AB, FP32, INT8 = "efficientnet_lite0", "efficientnet_lite0-fp32", "efficientnet_lite0-int8"
EXPECTED = {"chelsea": 282, "coffee": 967}  # as the service prepares them (tests/test_v2_http.py)


RUNTIMES = ("haproxy+admission-front", "serve-python-proxy")  # as /v1/models' `ingress.runs` names them


@pytest.fixture(scope="module", params=RUNTIMES)
def app(
    request: pytest.FixtureRequest, local_app: ServeDeployer, model_files: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServeDeployer | PythonProxyApp]:
    """The app on each ingress: the session's (HAProxy), or a `serve run` of its own without serve.env."""
    if request.param == "haproxy+admission-front":
        yield local_app
        return
    with PythonProxyApp(model_files, tmp_path_factory.mktemp("python-proxy")) as started:
        yield started


@pytest.fixture(scope="module")
def client(app: ServeDeployer | PythonProxyApp) -> triton.InferenceServerClient:
    return triton.InferenceServerClient(app.grpc_url)


def bytes_input(photos: list[str], shape: list[int] | None = None) -> triton.InferInput:
    data = np.array([sample_bytes(p) for p in photos], dtype=np.object_)
    inp = triton.InferInput("image_bytes", shape or [len(photos)], "BYTES")
    inp.set_data_from_numpy(data.reshape(shape or [len(photos)]))
    return inp


def top1(result: Any, row: int = 0) -> int:
    return int(result.as_numpy("top_k")[row][0].decode().split(":")[1])


def test_health_metadata_config_over_grpc(client: triton.InferenceServerClient) -> None:
    assert client.is_server_live() and client.is_server_ready()
    server = client.get_server_metadata()
    assert {"binary_tensor_data", "classification", "model_configuration", "statistics"} <= set(server.extensions)
    for name in (AB, FP32, INT8):
        assert client.is_model_ready(name)
        meta = client.get_model_metadata(name)
        assert meta.name == name and [i.name for i in meta.inputs] == ["image_bytes", "image"]
        config = client.get_model_config(name).config
        assert config.name == name and config.max_batch_size == 64 and all(i.optional for i in config.input)
        assert config.dynamic_batching.preferred_batch_size[0] >= 1
    variant = client.get_model_config(INT8).config.parameters["variant"].string_value
    assert variant == "int8"


def test_unknown_model_is_not_found(client: triton.InferenceServerClient) -> None:
    with pytest.raises(InferenceServerException) as e:
        client.get_model_metadata("resnet50")
    assert e.value.status() == "StatusCode.NOT_FOUND"


def test_infer_with_jpeg_bytes_and_with_pixels_gives_the_rest_answer(
    client: triton.InferenceServerClient, app: ServeDeployer | PythonProxyApp
) -> None:
    result = client.infer(FP32, [bytes_input(list(EXPECTED), [2, 1])], request_id="r1")
    assert [top1(result, i) for i in range(2)] == list(EXPECTED.values())
    response = result.get_response()
    assert response.id == "r1" and response.model_name == FP32 and len(response.raw_output_contents) == 3
    assert response.parameters["variant"].string_param == "fp32"
    pixels = np.stack([preprocess(sample_bytes(p), builtin_transform()) for p in EXPECTED])
    image = triton.InferInput("image", list(pixels.shape), "UINT8")
    image.set_data_from_numpy(pixels)
    out = [triton.InferRequestedOutput("probabilities"), triton.InferRequestedOutput("top_k", class_count=3)]
    by_pixels = client.infer(FP32, [image], outputs=out)
    probs = by_pixels.as_numpy("probabilities")
    assert probs.shape == (2, 1000) and list(probs.argmax(axis=1)) == list(EXPECTED.values())
    rest = httpx.post(
        f"{app.url}/v1/classify?top_k=1",
        content=sample_bytes("chelsea"),
        headers={"Content-Type": "image/jpeg", "X-Model-Variant": "fp32"},
        timeout=30,
    ).json()
    assert abs(rest["predictions"][0]["score"] - float(probs[0].max())) < 1e-4


def test_routing_headers_travel_as_metadata(client: triton.InferenceServerClient) -> None:
    for variant in ("int8", "fp32"):
        result = client.infer(AB, [bytes_input(["chelsea"])], headers={"x-model-variant": variant})
        params = result.get_response().parameters
        assert params["variant"].string_param == variant and params["routing"].string_param == "override"
    sticky = {
        client.infer(AB, [bytes_input(["chelsea"])], headers={"x-user-id": "u-42"})
        .get_response()
        .parameters["variant"]
        .string_param
        for _ in range(4)
    }
    assert len(sticky) == 1


def _status(fn: Any) -> tuple[str, str]:
    with pytest.raises(InferenceServerException) as e:
        fn()
    return str(e.value.status()), str(e.value.message())


def test_errors_are_grpc_status_codes(client: triton.InferenceServerClient) -> None:
    bad = triton.InferInput("image_bytes", [1], "BYTES")
    bad.set_data_from_numpy(np.array([b"not an image"], dtype=np.object_))
    code, message = _status(lambda: client.infer(AB, [bad]))
    assert code == "StatusCode.INVALID_ARGUMENT" and message
    wrong = triton.InferInput("image_bytes", [1], "INT32")
    wrong.set_data_from_numpy(np.array([1], dtype=np.int32))
    assert _status(lambda: client.infer(AB, [wrong]))[0] == "StatusCode.INVALID_ARGUMENT"
    assert _status(lambda: client.infer("resnet50", [bytes_input(["chelsea"])]))[0] == "StatusCode.NOT_FOUND"
    forged = {"x-model-variant": "fp64"}
    assert _status(lambda: client.infer(AB, [bytes_input(["chelsea"])], headers=forged))[0] == (
        "StatusCode.INVALID_ARGUMENT"
    )


def test_each_ingress_says_what_it_runs(app: ServeDeployer | PythonProxyApp) -> None:
    """/v1/models' `ingress`: the runtime, and configs/serve.env's settings in force or missing; a Router started
    without them says so in its log too."""
    from app.config import read_serve_env

    ingress = httpx.get(app.url + "/v1/models", timeout=10).json()["ingress"]
    serve_env = ingress["serve_env"]
    assert serve_env["read"] and serve_env["differs"] == {}
    if isinstance(app, ServeDeployer):
        assert ingress["runs"] == "haproxy+admission-front"
        assert serve_env["in_force"] == sorted(read_serve_env()) and serve_env["missing"] == []
        return
    assert ingress["runs"] == "serve-python-proxy"
    assert serve_env["missing"] == sorted(read_serve_env()) and serve_env["in_force"] == []
    line = wait_until(
        lambda: [ln for ln in app.log().splitlines() if "ingress: serve-python-proxy" in ln], 30, 0.5, "the log line"
    )
    assert "RAY_SERVE_ENABLE_HA_PROXY" in line[0] and "missing" in line[0]


def test_a_message_over_the_limit_is_refused_before_the_router(local_app: ServeDeployer) -> None:
    """configs/serve.env caps a gRPC message at 16 MiB (Serve's default is 2 GiB, buffered whole)."""
    channel = grpc.insecure_channel(local_app.grpc_url, options=[("grpc.max_send_message_length", 64 << 20)])
    from tritonclient.grpc import service_pb2 as pb
    from tritonclient.grpc import service_pb2_grpc as pb_grpc

    stub = pb_grpc.GRPCInferenceServiceStub(channel)
    msg = pb.ModelInferRequest(model_name=AB)
    msg.inputs.add(name="image_bytes", datatype="BYTES", shape=[1])
    msg.raw_input_contents.append(b"\0" * (20 << 20))
    with pytest.raises(grpc.RpcError) as e:
        stub.ModelInfer(msg, timeout=30)
    assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert stub.ServerLive(pb.ServerLiveRequest(), timeout=10).live  # and the server is still there


def test_statistics_count_what_was_served(client: triton.InferenceServerClient) -> None:
    def count() -> int:
        (entry,) = client.get_inference_statistics(INT8).model_stats
        return int(entry.inference_count)

    before = count()
    client.infer(INT8, [bytes_input(["chelsea", "coffee", "chelsea"])])
    # The Router ships its counts to the ledger about once a second; the answering Router adds its unsent ones.
    wait_until(lambda: count() >= before + 3, 20, 0.25, "the three images in the statistics")
    (entry,) = client.get_inference_statistics(INT8).model_stats
    stats = entry.inference_stats
    assert stats.success.count >= 1 and stats.compute_infer.ns > 0 and stats.compute_input.ns > 0
    every = {m.name for m in client.get_inference_statistics().model_stats}
    assert every == {AB, FP32, INT8}


@pytest.fixture(scope="module")
def perf_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    reason = perf_analyzer.why_not_runnable()
    if reason:
        pytest.skip(reason)
    return perf_analyzer.input_data(tmp_path_factory.mktemp("pa") / "data.json", [sample_bytes("chelsea")])


@pytest.mark.parametrize(("protocol", "model"), [("http", AB), ("grpc", AB), ("grpc", INT8), ("http", FP32)])
def test_perf_analyzer_runs_unmodified(local_app: ServeDeployer, perf_data: Path, protocol: str, model: str) -> None:
    url = local_app.url.removeprefix("http://") if protocol == "http" else local_app.grpc_url
    result = perf_analyzer.run(url, model, protocol, perf_data, concurrency=2, window_ms=1500)
    figures = perf_analyzer.summary(result)
    print(json.dumps(figures))
    assert figures["infer_per_s"] > 0 and figures["p50_ms"] > 0
    assert figures["server_compute_infer_ms"] > 0  # read from the statistics extension
