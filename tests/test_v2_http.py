"""The Open Inference Protocol (KServe V2) over real HTTP, driven by tritonclient, a real, unmodified client."""

from __future__ import annotations

import base64
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from app.imaging.preprocess import preprocess
from app.served_model import ModelFiles, builtin_transform
from app.toolchain.samples import sample_bytes
from tests.conftest import ServeDeployer, local_config, wait_until

pytestmark = pytest.mark.slow

AB, FP32, INT8 = "efficientnet_lite0", "efficientnet_lite0-fp32", "efficientnet_lite0-int8"
# The top-1 of each sample photograph as the service prepares it (the built-in declaration: shorter side 256,
# centre 224, bicubic): docs/model.md "The model" says why chelsea is a tiger cat here and grace_hopper a near-tie.
EXPECTED = {"chelsea": 282, "coffee": 967, "rocket": 657}


@pytest.fixture(scope="module")
def client(local_app: ServeDeployer) -> triton.InferenceServerClient:
    return triton.InferenceServerClient(local_app.url.removeprefix("http://"), network_timeout=60)


def bytes_input(photos: list[str], binary: bool) -> triton.InferInput:
    inp = triton.InferInput("image_bytes", [len(photos)], "BYTES")
    if binary:
        inp.set_data_from_numpy(np.array([sample_bytes(p) for p in photos], dtype=np.object_), binary_data=True)
    else:  # JSON has no raw bytes: BYTES images travel as base64 strings
        data = [base64.b64encode(sample_bytes(p)).decode() for p in photos]
        inp.set_data_from_numpy(np.array(data, dtype=np.object_), binary_data=False)
    return inp


def top1(result: Any, row: int = 0) -> int:
    entry = result.as_numpy("top_k")[row][0]  # "score:index:label"; bytes in binary mode, str in JSON
    return int((entry.decode() if isinstance(entry, bytes) else entry).split(":")[1])


def test_server_and_model_health_and_metadata(client: triton.InferenceServerClient) -> None:
    assert client.is_server_live() and client.is_server_ready()
    for name in (AB, FP32, INT8):
        assert client.is_model_ready(name)
        meta = client.get_model_metadata(name)
        assert meta["name"] == name and meta["platform"] == "onnx_onnxv1"
        inputs = {i["name"]: i for i in meta["inputs"]}
        assert inputs["image"]["datatype"] == "UINT8" and inputs["image"]["shape"] == [-1, 224, 224, 3]
        assert inputs["image_bytes"]["datatype"] == "BYTES" and inputs["image_bytes"]["shape"] == [-1, 1]
        outputs = {o["name"]: o for o in meta["outputs"]}
        assert outputs["logits"]["shape"] == [-1, 1000] and outputs["logits"]["datatype"] == "FP32"
    assert not client.is_model_ready("resnet50")
    server = client.get_server_metadata()
    assert "binary_tensor_data" in server["extensions"] and "classification" in server["extensions"]


def test_triton_config_and_statistics_extensions_over_rest(client: triton.InferenceServerClient) -> None:
    config = client.get_model_config(FP32)
    assert config["name"] == FP32 and config["max_batch_size"] == 64
    assert [(i["name"], i["optional"]) for i in config["input"]] == [("image_bytes", True), ("image", True)]
    before = client.get_inference_statistics(FP32)["model_stats"][0]
    assert before["name"] == FP32 and before["version"] == "1"
    client.infer(FP32, [bytes_input(["chelsea", "coffee"], binary=True)])
    # the answering Router adds its unsent counts, so its own requests show at once or within a flush
    wait_until(
        lambda: (
            client.get_inference_statistics(FP32)["model_stats"][0]["inference_count"] >= before["inference_count"] + 2
        ),
        20,
        0.25,
        "two images in the statistics",
    )
    every = client.get_inference_statistics()["model_stats"]
    assert {m["name"] for m in every} == {AB, FP32, INT8}
    with pytest.raises(InferenceServerException) as e:
        client.get_model_config("resnet50")
    assert e.value.status() == "404"


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_bytes_input_batch_of_several_images(client: triton.InferenceServerClient, binary: bool) -> None:
    photos = sorted(EXPECTED)
    outputs = [triton.InferRequestedOutput("top_k", binary_data=binary, class_count=3)]
    result = client.infer(FP32, [bytes_input(photos, binary)], outputs=outputs)
    assert result.as_numpy("top_k").shape == (3, 3)
    assert [top1(result, i) for i in range(3)] == [EXPECTED[p] for p in photos]
    assert result.get_response()["parameters"]["variant"] == "fp32"


def test_uint8_pixels_go_straight_to_the_classifier(client: triton.InferenceServerClient) -> None:
    # prepared as the model declares (what a client sending pixels must do too)
    pixels = np.stack([preprocess(sample_bytes(p), builtin_transform()) for p in ("chelsea", "coffee")])
    inp = triton.InferInput("image", list(pixels.shape), "UINT8")
    inp.set_data_from_numpy(pixels, binary_data=True)
    result = client.infer(
        INT8, [inp], outputs=[triton.InferRequestedOutput("logits"), triton.InferRequestedOutput("probabilities")]
    )
    logits, probs = result.as_numpy("logits"), result.as_numpy("probabilities")
    assert logits.shape == probs.shape == (2, 1000) and logits.dtype == np.float32
    assert list(logits.argmax(1)) == [282, 967]
    np.testing.assert_allclose(probs.sum(1), 1.0, rtol=1e-4)


def test_only_requested_outputs_come_back(client: triton.InferenceServerClient) -> None:
    result = client.infer(FP32, [bytes_input(["coffee"], True)], outputs=[triton.InferRequestedOutput("logits")])
    names = {o["name"] for o in result.get_response()["outputs"]}
    assert names == {"logits"}
    assert result.as_numpy("top_k") is None


def test_results_equal_v1_classify(client: triton.InferenceServerClient, local_app: ServeDeployer) -> None:
    for photo in EXPECTED:
        v1 = httpx.post(
            local_app.url + "/v1/classify",
            content=sample_bytes(photo),
            params={"top_k": 5},
            headers={"Content-Type": "image/jpeg", "X-Model-Variant": "fp32"},
            timeout=30,
        ).json()
        result = client.infer(
            FP32, [bytes_input([photo], True)], outputs=[triton.InferRequestedOutput("probabilities")]
        )
        probs = result.as_numpy("probabilities")[0]
        top = np.argsort(-probs)[:5]
        assert [p["class_id"] for p in v1["predictions"]] == [int(i) for i in top]
        np.testing.assert_allclose([p["score"] for p in v1["predictions"]], probs[top], atol=1e-5)


def test_ab_model_name_honours_the_weights(
    client: triton.InferenceServerClient, local_app: ServeDeployer, model_files: ModelFiles
) -> None:
    local_app.deploy(local_config(model_files, weights={"int8": 1, "fp32": 0}))
    try:
        variants = {
            client.infer(AB, [bytes_input(["coffee"], True)]).get_response()["parameters"]["variant"] for _ in range(12)
        }
        assert variants == {"int8"}
        # and the A/B headers apply to V2 too
        forced = client.infer(AB, [bytes_input(["coffee"], True)], headers={"X-Model-Variant": "fp32"})
        assert forced.get_response()["parameters"]["variant"] == "fp32"
    finally:
        local_app.deploy(local_config(model_files))


def test_errors(client: triton.InferenceServerClient, local_app: ServeDeployer) -> None:
    with pytest.raises(InferenceServerException) as e:
        client.infer("resnet50", [bytes_input(["coffee"], True)])
    assert e.value.status() == "404"
    wrong_type = triton.InferInput("image", [1, 224, 224, 3], "FP32")
    wrong_type.set_data_from_numpy(np.zeros((1, 224, 224, 3), np.float32))
    with pytest.raises(InferenceServerException) as e:
        client.infer(FP32, [wrong_type])
    assert e.value.status() == "400"
    wrong_shape = triton.InferInput("image", [1, 100, 100, 3], "UINT8")
    wrong_shape.set_data_from_numpy(np.zeros((1, 100, 100, 3), np.uint8))
    with pytest.raises(InferenceServerException) as e:
        client.infer(FP32, [wrong_shape])
    assert e.value.status() == "400"
    # the protocol's flat error shape, over plain HTTP
    r = httpx.post(local_app.url + "/v2/models/efficientnet_lite0/infer", content=b"{not json", timeout=10)
    assert r.status_code == 400 and isinstance(r.json()["error"], str)
    assert httpx.get(local_app.url + "/v2/models/nope").status_code == 404


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_compressed_requests_from_tritonclient(client: triton.InferenceServerClient, algorithm: str) -> None:
    """tritonclient's own request compression passes the inflation-ratio limit, JSON pixels included (the most
    compressible real encoding), and gives the same answer."""
    pixels = np.stack([preprocess(sample_bytes(p), builtin_transform()) for p in ("chelsea", "coffee")])
    inp = triton.InferInput("image", list(pixels.shape), "UINT8")
    inp.set_data_from_numpy(pixels, binary_data=False)
    outputs = [triton.InferRequestedOutput("top_k", class_count=1)]
    result = client.infer(FP32, [inp], outputs=outputs, request_compression_algorithm=algorithm)
    assert [top1(result, i) for i in range(2)] == [282, 967]
    result = client.infer(FP32, [bytes_input(["rocket"], True)], request_compression_algorithm=algorithm)
    assert top1(result) == 657


def test_objects_where_names_belong_are_400(local_app: ServeDeployer) -> None:
    url = local_app.url + "/v2/models/efficientnet_lite0/infer"
    for name in ({"a": 1}, ["image_bytes"]):
        doc = {"inputs": [{"name": name, "datatype": "BYTES", "shape": [1], "data": ["eA=="]}]}
        r = httpx.post(url, json=doc, timeout=30)
        assert r.status_code == 400 and isinstance(r.json()["error"], str), r.text
