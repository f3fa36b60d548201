"""The Open Inference Protocol over gRPC, pure: messages built and read by the real, unmodified tritonclient.grpc.

No Ray here: app/protocol/v2/grpc.py turns Triton's messages into the service's InferRequest and back, and the
statistics and configuration extensions are dicts that must parse into Triton's messages as they are.
"""

from __future__ import annotations

from typing import Any

import grpc
import numpy as np
import pytest
from tritonclient.grpc import InferInput, InferRequestedOutput, InferResult
from tritonclient.grpc import _utils as triton_utils
from tritonclient.grpc import service_pb2 as pb

from app.config import Limits
from app.errors import STATUS, ServiceError
from app.pipeline.inferstats import ModelStatsTable
from app.protocol import v2
from app.protocol.v2 import grpc as v2_grpc
from app.protocol.v2 import triton_config

LIMITS = Limits()
AB_MODEL = "efficientnet_lite0"  # the A/B model's V2 name is the declared model name
SIZE = (224, 224)
LABELS = [f"class{i}" for i in range(10)]


def request(inputs: list[InferInput], outputs: list[InferRequestedOutput] | None = None, **params: Any) -> Any:
    """A ModelInferRequest exactly as tritonclient.grpc's InferenceServerClient.infer builds it."""
    return triton_utils._get_inference_request(
        AB_MODEL, inputs, "", "req-1", outputs, 0, False, False, 0, None, params or None
    )


def bytes_input(images: list[bytes], shape: list[int]) -> InferInput:
    inp = InferInput(v2.IMAGE_BYTES_INPUT, shape, "BYTES")
    inp.set_data_from_numpy(np.array(images, dtype=np.object_).reshape(shape))
    return inp


def test_image_bytes_as_raw_contents_arrive_as_the_same_files() -> None:
    files = [b"\xff\xd8jpeg-one", b"\x89PNG-two"]
    req = v2_grpc.infer_request(request([bytes_input(files, [2, 1])]), LIMITS, SIZE)
    assert req.images == files and req.id == "req-1"
    assert [o.name for o in req.outputs] == list(v2.OUTPUTS)  # none named: every output, as the protocol says


def test_pixels_as_raw_contents_arrive_as_the_same_array() -> None:
    pixels = np.random.default_rng(0).integers(0, 256, (2, 224, 224, 3), dtype=np.uint8)
    inp = InferInput(v2.IMAGE_INPUT, list(pixels.shape), "UINT8")
    inp.set_data_from_numpy(pixels)
    req = v2_grpc.infer_request(request([inp]), LIMITS, SIZE)
    assert req.pixels is not None and np.array_equal(req.pixels, pixels)


def test_typed_contents_are_taken_too() -> None:
    msg = pb.ModelInferRequest(model_name=AB_MODEL)
    t = msg.inputs.add(name=v2.IMAGE_BYTES_INPUT, datatype="BYTES", shape=[2])
    t.contents.bytes_contents.extend([b"a", b"bc"])
    assert v2_grpc.infer_request(msg, LIMITS, SIZE).images == [b"a", b"bc"]
    msg = pb.ModelInferRequest(model_name=AB_MODEL)
    t = msg.inputs.add(name=v2.IMAGE_INPUT, datatype="UINT8", shape=[1, 224, 224, 3])
    t.contents.uint_contents.extend([7] * (224 * 224 * 3))
    req = v2_grpc.infer_request(msg, LIMITS, SIZE)
    assert req.pixels is not None and int(req.pixels.max()) == 7
    assert v2_grpc.request_bytes(msg) == 224 * 224 * 3


def _refused(msg: Any) -> tuple[str, int]:
    with pytest.raises(ServiceError) as e:
        v2_grpc.infer_request(msg, LIMITS, SIZE)
    return e.value.code, e.value.status


def test_bad_requests_get_the_rest_endpoints_errors() -> None:
    msg = pb.ModelInferRequest(model_name=AB_MODEL)
    t = msg.inputs.add(name=v2.IMAGE_INPUT, datatype="UINT8", shape=[1, 224, 224, 3])
    t.contents.uint_contents.extend([256] + [0] * (224 * 224 * 3 - 1))
    assert _refused(msg) == ("invalid_tensor", 400)
    wrong_type = InferInput(v2.IMAGE_BYTES_INPUT, [1], "INT32")
    wrong_type.set_data_from_numpy(np.array([1], dtype=np.int32))
    assert _refused(request([wrong_type])) == ("invalid_tensor", 400)
    two_raw = request([bytes_input([b"x"], [1])])
    two_raw.raw_input_contents.append(b"extra")
    assert _refused(two_raw) == ("bad_request", 400)
    no_data = pb.ModelInferRequest(model_name=AB_MODEL)
    no_data.inputs.add(name=v2.IMAGE_BYTES_INPUT, datatype="BYTES", shape=[1])
    assert _refused(no_data) == ("invalid_tensor", 400)
    too_many = bytes_input([b"x"] * (LIMITS.max_batch_files + 1), [LIMITS.max_batch_files + 1])
    assert _refused(request([too_many])) == ("too_many_files", 413)
    assert _refused(request([bytes_input([b"x"], [1])], top_k=0)) == ("invalid_parameter", 422)


def test_classification_on_an_output_is_read_from_its_parameters() -> None:
    out = InferRequestedOutput(v2.PROBABILITIES, class_count=3)
    req = v2_grpc.infer_request(request([bytes_input([b"x"], [1])], [out]), LIMITS, SIZE)
    assert req.outputs == (v2.RequestedOutput(v2.PROBABILITIES, False, 3),) and req.max_k == 3


def test_the_reply_reads_back_through_tritonclient() -> None:
    req = v2_grpc.infer_request(request([bytes_input([b"x", b"y"], [2])]), LIMITS, SIZE)
    logits = np.random.default_rng(1).normal(size=(2, 10)).astype(np.float32)
    probs = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    outputs = v2.compute_outputs(req, LABELS, logits=logits, probabilities=probs)
    reply = v2_grpc.infer_response(AB_MODEL, "1", req.id, outputs, {"variant": "int8", "failover": True})
    result = InferResult(reply)
    assert np.array_equal(result.as_numpy(v2.LOGITS), logits)
    assert np.allclose(result.as_numpy(v2.PROBABILITIES), probs)
    top = result.as_numpy(v2.TOP_K)
    best = int(np.argmax(probs[0]))
    assert top.shape == (2, LIMITS.default_top_k) and top[0, 0].decode().split(":")[1:] == [str(best), LABELS[best]]
    params = result.get_response().parameters
    assert params["variant"].string_param == "int8" and params["failover"].bool_param is True
    assert result.get_response().id == "req-1"


@pytest.mark.parametrize("code", sorted(STATUS))
def test_every_error_has_a_grpc_status(code: str) -> None:
    status, details, trailing = v2_grpc.status_of(ServiceError(code, "why"))
    assert isinstance(status, grpc.StatusCode) and details == "why"
    meta = dict(trailing)
    assert meta["error-code"] == code
    assert ("retry-after" in meta) == (STATUS[code] in (429, 503)) == ("grpc-retry-pushback-ms" in meta)


def test_status_codes_say_what_a_client_should_do() -> None:
    assert v2_grpc.status_of(ServiceError("overloaded", ""))[0] == grpc.StatusCode.UNAVAILABLE
    assert v2_grpc.status_of(ServiceError("inference_timeout", ""))[0] == grpc.StatusCode.DEADLINE_EXCEEDED
    assert v2_grpc.status_of(ServiceError("invalid_tensor", ""))[0] == grpc.StatusCode.INVALID_ARGUMENT
    assert v2_grpc.status_of(ServiceError("payload_too_large", ""))[0] == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert v2_grpc.status_of(ServiceError("not_found", ""))[0] == grpc.StatusCode.NOT_FOUND
    assert dict(v2_grpc.status_of(ServiceError("overloaded", ""))[2])["grpc-retry-pushback-ms"] == "1000"


SPEC = {"name": "image", "shape": [-1, 224, 224, 3], "dtype": "uint8", "size": [224, 224]}
DESCRIBED = {
    "variant": "int8",
    "precision": "int8",
    "execution_provider": "CPUExecutionProvider",
    "batching": {"max_batch_size": 16, "batch_wait_timeout_s": 0.004},
}


def test_model_config_is_triton_s_model_config_message() -> None:
    cfg = triton_config.model_config(AB_MODEL + "-int8", SPEC, 1000, 64, DESCRIBED)
    msg = v2_grpc.model_config(cfg).config  # raises on any field Triton's ModelConfig does not have
    assert msg.max_batch_size == 64 and msg.platform == "onnxruntime_onnx"
    assert [(i.name, i.optional) for i in msg.input] == [(v2.IMAGE_BYTES_INPUT, True), (v2.IMAGE_INPUT, True)]
    assert list(msg.input[1].dims) == [224, 224, 3] and list(msg.output[0].dims) == [1000]
    assert msg.dynamic_batching.preferred_batch_size == [16]
    assert msg.dynamic_batching.max_queue_delay_microseconds == 4000
    assert msg.parameters["variant"].string_value == "int8"


def test_model_config_of_a_declared_float_nchw_model_names_its_graph() -> None:
    """A PyTorch export: `image` is still uint8 NHWC at the graph's size; the graph's own input is a parameter."""
    spec = {
        "size": [240, 240],
        "channels": 3,
        "classes": 10,
        "graph": {"input": {"name": "input", "shape": [-1, 3, 240, 240], "dtype": "float32", "layout": "NCHW"}},
        "transform": {"height": 240, "width": 240, "channels": 3, "resize_shorter": 274, "interpolation": "cubic",
                      "color": "RGB"},
        "prologue": {"steps": ["Transpose", "Cast", "Conv"], "scale": [0.0078125] * 3, "shift": [0.99] * 3},
    }  # fmt: skip
    cfg = triton_config.model_config("lite1-fp32", spec, 10, 64, {**DESCRIBED, "model": "lite1"})
    msg = v2_grpc.model_config(cfg).config
    assert list(msg.input[1].dims) == [240, 240, 3] and list(msg.output[0].dims) == [10]
    assert msg.parameters["model"].string_value == "lite1"
    assert msg.parameters["graph_input"].string_value == "input float32 NCHW [3,240,240]"
    assert msg.parameters["prologue"].string_value == "Transpose > Cast > Conv"
    assert "resize_shorter=274" in msg.parameters["preprocess"].string_value


def test_statistics_add_up_across_routers_and_parse_as_triton_s_message() -> None:
    a, b = ModelStatsTable(), ModelStatsTable()
    timings = {"total_s": 0.05, "queue_s": 0.01, "input_s": 0.02, "infer_s": 0.015, "output_s": 0.001}
    a.success(AB_MODEL, 16, 1000, **timings)
    b.success(AB_MODEL, 1, 2000, **timings)
    b.failure(AB_MODEL, 0.002)
    a.merge(b)
    stats = a.triton([AB_MODEL, AB_MODEL + "-fp32"], "1")
    msg = v2_grpc.model_statistics(stats)
    ab, fp32 = msg.model_stats
    assert (ab.name, ab.version, ab.inference_count, ab.execution_count) == (AB_MODEL, "1", 17, 2)
    assert ab.last_inference == 2000
    assert ab.inference_stats.success.count == 2 and ab.inference_stats.success.ns == 100_000_000
    assert ab.inference_stats.compute_infer.ns == 30_000_000 and ab.inference_stats.fail.count == 1
    assert fp32.inference_count == 0 and fp32.inference_stats.success.count == 0


def test_metadata_messages_parse() -> None:
    meta = v2_grpc.model_metadata(v2.model_metadata(AB_MODEL, ["1"], SPEC, 1000))
    assert [(i.name, i.datatype) for i in meta.inputs] == [(v2.IMAGE_BYTES_INPUT, "BYTES"), (v2.IMAGE_INPUT, "UINT8")]
    server = v2_grpc.server_metadata(v2.server_metadata("0.1.0"))
    assert "statistics" in server.extensions and "model_configuration" in server.extensions
