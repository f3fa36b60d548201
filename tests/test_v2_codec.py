"""The Open Inference Protocol codec (app/protocol/v2/) against the real, unmodified tritonclient.

Requests are built by `InferenceServerClient.generate_request_body` and responses
read by `InferResult.from_response_body`, the same code `client.infer` runs, so a
pass here means a stock Triton HTTP client can talk to the service. No Ray, no
server, no model: pure and fast.
"""

from __future__ import annotations

import base64
import gzip
import json
import pickle
import struct
import zlib
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.http._utils import _get_error
from tritonclient.utils import InferenceServerException

from app.config import Limits
from app.errors import STATUS, ServiceError
from app.http.routes import ROUTES
from app.protocol import v2
from app.protocol.paths import PathTable

HW = (224, 224)
MODEL = "efficientnet_lite0"  # the built-in model's declared name (args.model.name)
AB_MODEL, INT8_MODEL, FP32_MODEL = (v2.model_name_for(MODEL, v) for v in (None, "int8", "fp32"))
LIMITS = Limits()
LABELS = [f"label_{i}" for i in range(1000)]
# Stand-ins for encoded files: JPEG/PNG magic, bytes that are not UTF-8, a zero byte inside.
JPEG = b"\xff\xd8\xff\xe0" + bytes(range(256)) + b"\x00\xff\xd9"
PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 7 + b"\xfe"
# The route table's V2 paths (app/http/routes.py), each to its operation's name: what the Router matches on.
V2_PATHS = PathTable((r.method, r.path, r.name) for r in ROUTES if v2.is_v2_path(r.path))


def _body(inputs: list[Any], outputs: list[Any] | None = None, **kw: Any) -> tuple[bytes, int | None]:
    body, header_length = httpclient.InferenceServerClient.generate_request_body(inputs, outputs=outputs, **kw)
    return body, header_length


def _bytes_input(images: list[bytes], binary: bool = True) -> httpclient.InferInput:
    inp = httpclient.InferInput(v2.IMAGE_BYTES_INPUT, [len(images)], "BYTES")
    data = images if binary else [base64.b64encode(i) for i in images]
    inp.set_data_from_numpy(np.array(data, dtype=np.object_), binary_data=binary)
    return inp


def _pixel_input(pixels: np.ndarray, binary: bool = True) -> httpclient.InferInput:
    inp = httpclient.InferInput(v2.IMAGE_INPUT, list(pixels.shape), "UINT8")
    inp.set_data_from_numpy(pixels, binary_data=binary)
    return inp


def _parse(
    body: bytes, header_length: int | None, hw: tuple[int, int] = HW, limits: Limits = LIMITS
) -> v2.InferRequest:
    return v2.parse_infer_request(body, header_length, limits, hw)


def _result(body: bytes, headers: dict[str, str]) -> httpclient.InferResult:
    length = headers.get(v2.HEADER_LENGTH)
    return httpclient.InferenceServerClient.parse_response_body(body, header_length=int(length) if length else None)


def _fake_model(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(n, 1000)).astype(np.float32)
    z = np.exp(logits - logits.max(axis=1, keepdims=True))
    return logits, (z / z.sum(axis=1, keepdims=True)).astype(np.float32)


def _code(exc: pytest.ExceptionInfo[ServiceError]) -> tuple[str, int]:
    return exc.value.code, exc.value.status


# --------------------------------------------------------------------------- names, paths, metadata


def test_model_names_come_from_base_and_variants() -> None:
    assert (v2.model_name_for(MODEL), v2.model_name_for(MODEL, "int8"), v2.model_name_for(MODEL, "fp32")) == (
        "efficientnet_lite0",
        "efficientnet_lite0-int8",
        "efficientnet_lite0-fp32",
    )
    names = v2.model_names("efficientnet_lite0", ["int8", "fp32"])
    assert names == {"efficientnet_lite0": None, "efficientnet_lite0-fp32": "fp32", "efficientnet_lite0-int8": "int8"}
    assert v2.resolve_model("efficientnet_lite0-int8", "efficientnet_lite0", ["int8", "fp32"]) == "int8"
    assert v2.resolve_model("efficientnet_lite0", "efficientnet_lite0", ["int8", "fp32"], version="1") is None
    for name, version in (("resnet50", None), ("efficientnet_lite0", "2")):
        with pytest.raises(ServiceError) as e:
            v2.resolve_model(name, "efficientnet_lite0", ["int8", "fp32"], version=version)
        assert _code(e) == ("not_found", 404)


@pytest.mark.parametrize(
    ("method", "path", "expected"),
    [
        ("GET", "/v2", ("server_metadata", {})),
        ("GET", "/v2/", ("server_metadata", {})),
        ("GET", "/v2/health/live", ("server_live", {})),
        ("GET", "/v2/health/ready", ("server_ready", {})),
        ("GET", "/v2/models/m", ("model_metadata", {"model": "m", "version": ""})),
        ("GET", "/v2/models/m/versions/1", ("model_metadata", {"model": "m", "version": "1"})),
        ("GET", "/v2/models/m/ready", ("model_ready", {"model": "m", "version": ""})),
        ("GET", "/v2/models/m/versions/1/ready", ("model_ready", {"model": "m", "version": "1"})),
        (
            "POST",
            "/v2/models/efficientnet_lite0-int8/infer",
            ("infer", {"model": "efficientnet_lite0-int8", "version": ""}),
        ),
        ("POST", "/v2/models/m/versions/1/infer", ("infer", {"model": "m", "version": "1"})),
        ("GET", "/v1/models", None),
        ("GET", "/v2/models", None),
        ("GET", "/v2/models/m/versions/1/stats", ("model_stats", {"model": "m", "version": "1"})),
        ("GET", "/v2/models/m/config", ("model_config", {"model": "m", "version": ""})),
        ("GET", "/v2/models/stats", ("model_stats", {})),
        ("GET", "/v2/models/m/trace/setting", None),
        ("POST", "/v2x", None),
    ],
)
def test_match_v2_path(method: str, path: str, expected: Any) -> None:
    assert v2.match_v2_path(method, path, V2_PATHS) == expected


@pytest.mark.parametrize(
    ("method", "path"), [("POST", "/v2"), ("GET", "/v2/models/m/infer"), ("DELETE", "/v2/models/m")]
)
def test_wrong_method_on_a_v2_path_is_405(method: str, path: str) -> None:
    with pytest.raises(ServiceError) as e:
        v2.match_v2_path(method, path, V2_PATHS)
    assert _code(e) == ("method_not_allowed", 405)
    want = "POST" if path.endswith("/infer") else "GET"
    assert e.value.headers() == {"Allow": want}  # RFC 9110: a 405 names what the resource takes
    assert pickle.loads(pickle.dumps(e.value)).headers() == {"Allow": want}  # as it crosses Ray


def test_server_metadata_lists_only_what_is_implemented() -> None:
    meta = v2.server_metadata("0.1.0")
    assert meta == {
        "name": v2.SERVER_NAME,
        "version": "0.1.0",
        "extensions": ["binary_tensor_data", "classification", "model_configuration", "statistics"],
    }


def test_model_metadata_from_the_classifier_spec() -> None:
    # What Classifier.describe()["input"] returns for the built-in model (the keys the metadata reads).
    spec: dict[str, Any] = {
        "size": [224, 224],
        "channels": 3,
        "classes": 1000,
        "graph": {"input": {"name": "image", "shape": [-1, 224, 224, 3], "dtype": "uint8", "layout": "NHWC"}},
    }
    meta = v2.model_metadata(INT8_MODEL, ["1"], spec, 1000)
    assert meta["name"] == "efficientnet_lite0-int8" and meta["versions"] == ["1"] and meta["platform"] == "onnx_onnxv1"
    assert meta["inputs"] == [
        {"name": "image_bytes", "datatype": "BYTES", "shape": [-1, 1]},
        {"name": "image", "datatype": "UINT8", "shape": [-1, 224, 224, 3]},
    ]
    assert meta["outputs"] == [
        {"name": "logits", "datatype": "FP32", "shape": [-1, 1000]},
        {"name": "probabilities", "datatype": "FP32", "shape": [-1, 1000]},
        {"name": "top_k", "datatype": "BYTES", "shape": [-1, -1]},
    ]
    assert v2.model_metadata("m", ["1"], {"size": [96, 128]}, None)["outputs"][0]["shape"] == [-1, -1]
    # a one-channel model's pixels are [N, H, W, 1]; its classes come from its graph
    grey = v2.model_metadata("digits", ["1"], {"size": [28, 28], "channels": 1}, 10)
    assert grey["inputs"][1]["shape"] == [-1, 28, 28, 1] and grey["outputs"][0]["shape"] == [-1, 10]
    assert v2.image_shape({"size": [28, 28], "channels": 1}) == (28, 28, 1) and v2.image_shape(spec) == (224, 224, 3)
    json.dumps(meta)  # plain JSON


# --------------------------------------------------------------------------- requests from tritonclient


def test_binary_bytes_input_round_trip() -> None:
    outputs = [httpclient.InferRequestedOutput("top_k", binary_data=True, class_count=3)]
    body, hl = _body([_bytes_input([JPEG, PNG])], outputs, request_id="req-7")
    assert hl is not None
    req = _parse(body, hl)
    assert req.input_name == "image_bytes" and req.images == [JPEG, PNG] and req.pixels is None
    assert req.id == "req-7" and req.batch_size == 2
    assert req.outputs == (v2.RequestedOutput("top_k", binary=True, class_count=3),)
    assert req.max_k == 3 and not req.needs_logits and not req.needs_probabilities


def test_json_bytes_input_is_base64() -> None:
    body, hl = _body(
        [_bytes_input([JPEG], binary=False)], [httpclient.InferRequestedOutput("top_k", binary_data=False)]
    )
    assert hl is None  # all JSON
    req = _parse(body, hl)
    assert req.images == [JPEG]
    assert req.outputs == (v2.RequestedOutput("top_k", binary=False, class_count=0),)


def test_uint8_binary_input() -> None:
    pixels = np.random.default_rng(1).integers(0, 256, size=(2, 224, 224, 3), dtype=np.uint8)
    body, hl = _body([_pixel_input(pixels)])
    req = _parse(body, hl)
    assert req.input_name == "image" and req.images is None
    assert req.pixels is not None and req.pixels.dtype == np.uint8
    np.testing.assert_array_equal(req.pixels, pixels)


def test_uint8_json_input_flat_or_nested() -> None:
    pixels = np.arange(2 * 4 * 5 * 3, dtype=np.uint8).reshape(2, 4, 5, 3)
    body, hl = _body([_pixel_input(pixels, binary=False)])
    req = _parse(body, hl, hw=(4, 5))
    np.testing.assert_array_equal(req.pixels, pixels)
    nested = {"inputs": [{"name": "image", "datatype": "UINT8", "shape": [2, 4, 5, 3], "data": pixels.tolist()}]}
    np.testing.assert_array_equal(_parse(json.dumps(nested).encode(), None, hw=(4, 5)).pixels, pixels)


def test_no_outputs_requested_returns_all_three_binary() -> None:
    """tritonclient with outputs=None sets binary_data_output: every output comes back, binary."""
    body, hl = _body([_bytes_input([JPEG, PNG])], request_id="abc")
    req = _parse(body, hl)
    assert [o.name for o in req.outputs] == ["logits", "probabilities", "top_k"]
    assert req.binary_outputs == {"logits", "probabilities", "top_k"}
    assert req.needs_logits and req.needs_probabilities and req.max_k == LIMITS.default_top_k

    logits, probs = _fake_model(2)
    out, headers = v2.encode_infer_response(
        req, AB_MODEL, LABELS, logits=logits, probabilities=probs, parameters={"variant": "int8"}
    )
    assert headers["Content-Type"] == "application/octet-stream"
    assert int(headers[v2.HEADER_LENGTH]) < len(out)
    result = _result(out, headers)
    np.testing.assert_array_equal(result.as_numpy("logits"), logits)
    np.testing.assert_array_equal(result.as_numpy("probabilities"), probs)
    top = result.as_numpy("top_k")
    assert top.shape == (2, LIMITS.default_top_k) and top.dtype == np.object_
    best = int(np.argmax(probs[1]))
    assert top[1][0] == f"{probs[1, best]:f}:{best}:label_{best}".encode()
    response = result.get_response()
    assert response["model_name"] == "efficientnet_lite0" and response["model_version"] == "1"
    assert response["id"] == "abc" and response["parameters"] == {"variant": "int8"}


def test_requested_outputs_only_mixed_binary_and_json() -> None:
    outputs = [
        httpclient.InferRequestedOutput("probabilities", binary_data=False),
        httpclient.InferRequestedOutput("top_k", binary_data=True, class_count=2),
    ]
    body, hl = _body([_bytes_input([JPEG])], outputs)
    req = _parse(body, hl)
    assert not req.needs_logits and req.needs_probabilities
    _, probs = _fake_model(1, seed=3)
    out, headers = v2.encode_infer_response(req, FP32_MODEL, LABELS, probabilities=probs)
    result = _result(out, headers)
    assert [o["name"] for o in result.get_response()["outputs"]] == ["probabilities", "top_k"]
    assert result.as_numpy("logits") is None
    np.testing.assert_allclose(result.as_numpy("probabilities"), probs, rtol=1e-7)  # through JSON text
    assert result.as_numpy("top_k").shape == (1, 2)
    assert "id" not in result.get_response()  # no id asked, none echoed


def test_all_json_response_is_application_json() -> None:
    outputs = [httpclient.InferRequestedOutput(n, binary_data=False) for n in ("logits", "top_k")]
    body, hl = _body([_bytes_input([JPEG])], outputs, parameters={"top_k": 4})
    req = _parse(body, hl)
    assert req.top_k == 4
    logits, probs = _fake_model(1)
    out, headers = v2.encode_infer_response(req, INT8_MODEL, LABELS, logits=logits, probabilities=probs)
    assert headers == {"Content-Type": "application/json"}
    result = _result(out, headers)
    np.testing.assert_allclose(result.as_numpy("logits"), logits, rtol=1e-7)
    top = result.as_numpy("top_k")  # JSON BYTES come back as str
    assert top.shape == (1, 4)
    score, index, label = top[0][0].split(":")
    assert int(index) == int(np.argmax(probs[0])) and label == f"label_{index}"
    assert abs(float(score) - float(probs[0].max())) < 1e-6


def test_classification_extension_on_probabilities_and_logits() -> None:
    outputs = [
        httpclient.InferRequestedOutput("probabilities", class_count=3),
        httpclient.InferRequestedOutput("logits", binary_data=False, class_count=2),
    ]
    body, hl = _body([_bytes_input([JPEG, PNG, JPEG])], outputs)
    req = _parse(body, hl)
    assert not req.needs_probabilities and req.needs_logits and req.max_k == 3
    logits, probs = _fake_model(3)
    result = _result(*v2.encode_infer_response(req, AB_MODEL, LABELS, logits=logits, probabilities=probs))
    cls = result.as_numpy("probabilities")
    assert cls.shape == (3, 3) and result.get_output("probabilities")["datatype"] == "BYTES"
    for r in range(3):
        idx = [int(s.split(b":")[1]) for s in cls[r]]
        assert idx == list(np.argsort(-probs[r], kind="stable")[:3])
    lg = result.as_numpy("logits")
    assert lg.shape == (3, 2) and float(lg[0][0].split(":")[0]) == pytest.approx(float(logits[0].max()), abs=1e-6)


def test_top_k_from_the_classifiers_top_lists_matches_full_probabilities() -> None:
    """Scores.top (class_id, probability) lists are enough when no full tensor is asked for."""
    body, hl = _body([_bytes_input([JPEG, PNG])], [httpclient.InferRequestedOutput("top_k", class_count=5)])
    req = _parse(body, hl)
    _, probs = _fake_model(2)
    top = [[(int(i), float(p[i])) for i in np.argsort(-p, kind="stable")[: req.max_k]] for p in probs]
    from_top = v2.compute_outputs(req, LABELS, top=top)["top_k"]
    from_probs = v2.compute_outputs(req, LABELS, probabilities=probs)["top_k"]
    np.testing.assert_array_equal(from_top, from_probs)
    with pytest.raises(ServiceError) as e:  # a Router that forgot to return probabilities
        v2.compute_outputs(req, LABELS)
    assert e.value.code == "internal_error"


def test_top_k_strings_format() -> None:
    probs = np.array([[0.1, 0.6, 0.3], [0.5, 0.25, 0.25]], dtype=np.float32)
    assert v2.top_k_strings(probs, 2, ["a", "b", "c"]) == [
        [b"0.600000:1:b", b"0.300000:2:c"],
        [b"0.500000:0:a", b"0.250000:1:b"],  # tie: lower index first
    ]
    assert v2.top_k_strings(probs[0], 5, []) == [[b"0.600000:1", b"0.300000:2", b"0.100000:0"]]  # no labels


def test_build_infer_response_raw_layout() -> None:
    """Binary outputs follow the JSON header in output order; BYTES are length-prefixed, FP32 little-endian."""
    fp = np.array([[1.5, -2.0]], dtype=np.float32)
    body, headers = v2.build_infer_response("m", None, None, {"a": fp, "b": [[b"x", b"yz"]]}, {"a", "b"}, None)
    n = int(headers[v2.HEADER_LENGTH])
    head = json.loads(body[:n])
    assert "model_version" not in head and "id" not in head and "parameters" not in head
    assert head["outputs"] == [
        {"name": "a", "datatype": "FP32", "shape": [1, 2], "parameters": {"binary_data_size": 8}},
        {"name": "b", "datatype": "BYTES", "shape": [1, 2], "parameters": {"binary_data_size": 11}},
    ]
    assert body[n:] == struct.pack("<2f", 1.5, -2.0) + struct.pack("<I", 1) + b"x" + struct.pack("<I", 2) + b"yz"


# --------------------------------------------------------------------------- errors


def _raw(doc: dict[str, Any], tail: bytes = b"") -> tuple[bytes, int | None]:
    head = json.dumps(doc).encode()
    return head + tail, (len(head) if tail else None)


def _bytes_doc(**inp: Any) -> dict[str, Any]:
    return {"inputs": [{"name": "image_bytes", "datatype": "BYTES", "shape": [1], **inp}]}


ONE_JPEG = struct.pack("<I", len(JPEG)) + JPEG


def _pixels_doc(data: Any, shape: list[int] | None = None) -> tuple[bytes, None]:
    doc = {"inputs": [{"name": "image", "datatype": "UINT8", "shape": shape or [1, 224, 224, 3], "data": data}]}
    return json.dumps(doc).encode(), None


N_PIXELS = 224 * 224 * 3
TOO_MANY = LIMITS.max_batch_files + 1


def _typed(name: str, shape: list[int], datatype: str, array: np.ndarray) -> httpclient.InferInput:
    return httpclient.InferInput(name, shape, datatype).set_data_from_numpy(array)


BAD_REQUESTS: list[tuple[str, Any, str, str]] = [
    # wrong datatype / shape / name / element count: 400 invalid_tensor
    (
        "bytes as UINT8",
        lambda: _body([_typed("image_bytes", [1], "UINT8", np.zeros(1, np.uint8))]),
        "invalid_tensor",
        "datatype BYTES",
    ),
    (
        "pixels as FP32",
        lambda: _body([_typed("image", [1, 224, 224, 3], "FP32", np.zeros((1, 224, 224, 3), np.float32))]),
        "invalid_tensor",
        "datatype UINT8",
    ),
    (
        "pixels 100x100",
        lambda: _body([_pixel_input(np.zeros((1, 100, 100, 3), np.uint8))]),
        "invalid_tensor",
        "shape [N, 224, 224, 3]",
    ),
    (
        "pixels RGBA",
        lambda: _body([_pixel_input(np.zeros((1, 224, 224, 4), np.uint8))]),
        "invalid_tensor",
        "shape [N, 224, 224, 3]",
    ),
    (
        "bytes [1,2]",
        lambda: _raw(_bytes_doc(shape=[1, 2], parameters={"binary_data_size": len(ONE_JPEG)}), ONE_JPEG),
        "invalid_tensor",
        "shape [N] or [N, 1]",
    ),
    ("bytes []", lambda: _raw(_bytes_doc(shape=[], data=["eA=="])), "invalid_tensor", "shape [N] or [N, 1]"),
    ("negative dim", lambda: _raw(_bytes_doc(shape=[-1], data=["eA=="])), "invalid_tensor", "non-negative"),
    (
        "unknown input",
        lambda: _raw({"inputs": [{"name": "input0", "datatype": "BYTES", "shape": [1], "data": ["eA=="]}]}),
        "invalid_tensor",
        "unknown input",
    ),
    (
        "two inputs",
        lambda: _body([_bytes_input([JPEG]), _pixel_input(np.zeros((1, 224, 224, 3), np.uint8))]),
        "invalid_tensor",
        "exactly one input",
    ),
    ("no inputs", lambda: _raw({"inputs": []}), "invalid_tensor", "exactly one input"),
    ("empty batch", lambda: _raw(_bytes_doc(shape=[0], data=[])), "invalid_tensor", "no images"),
    (
        "count > elements",
        lambda: _raw(_bytes_doc(shape=[2], parameters={"binary_data_size": len(ONE_JPEG)}), ONE_JPEG),
        "invalid_tensor",
        "ends before element 1",
    ),
    (
        "count < elements",
        lambda: _raw(_bytes_doc(parameters={"binary_data_size": 2 * len(ONE_JPEG)}), 2 * ONE_JPEG),
        "invalid_tensor",
        "left after 1 elements",
    ),
    (
        "element overruns",
        lambda: _raw(_bytes_doc(parameters={"binary_data_size": 6}), b"\x09\x00\x00\x00ab"),
        "invalid_tensor",
        "declares 9 bytes",
    ),
    ("json count", lambda: _raw(_bytes_doc(data=["eA==", "eA=="])), "invalid_tensor", "data has 2"),
    ("not base64", lambda: _raw(_bytes_doc(data=["not base64!"])), "invalid_tensor", "not base64"),
    ("number as BYTES", lambda: _raw(_bytes_doc(data=[1])), "invalid_tensor", "base64 string"),
    ("no data", lambda: _raw(_bytes_doc()), "invalid_tensor", "has no data"),
    (
        "data and binary",
        lambda: _raw(_bytes_doc(data=["eA=="], parameters={"binary_data_size": 5}), b"\x01\x00\x00\x00x"),
        "invalid_tensor",
        "both",
    ),
    (
        "uint8 size",
        lambda: _raw(
            {
                "inputs": [
                    {
                        "name": "image",
                        "datatype": "UINT8",
                        "shape": [1, 224, 224, 3],
                        "parameters": {"binary_data_size": 10},
                    }
                ]
            },
            bytes(10),
        ),
        "invalid_tensor",
        "150528 bytes",
    ),
    ("pixel 256", lambda: _pixels_doc([256] * N_PIXELS), "invalid_tensor", "0..255"),
    ("pixel -1", lambda: _pixels_doc([-1] * N_PIXELS), "invalid_tensor", "0..255"),
    ("pixel float", lambda: _pixels_doc([0.5] * N_PIXELS), "invalid_tensor", "integers"),
    ("pixel bool", lambda: _pixels_doc([True] * N_PIXELS), "invalid_tensor", "integers"),
    ("pixel string", lambda: _pixels_doc(["1"] * N_PIXELS), "invalid_tensor", "integers"),
    ("pixel count", lambda: _pixels_doc([1] * (N_PIXELS - 1)), "invalid_tensor", "data has 150527"),
    ("pixel ragged", lambda: _pixels_doc([[1, 2], [3]]), "invalid_tensor", "rectangular"),
    (
        "unknown output",
        lambda: _body([_bytes_input([JPEG])], [httpclient.InferRequestedOutput("scores")]),
        "invalid_tensor",
        "unknown output",
    ),
    (
        "output twice",
        lambda: _body([_bytes_input([JPEG])], [httpclient.InferRequestedOutput("top_k")] * 2),
        "invalid_tensor",
        "twice",
    ),
    # malformed request: 400 bad_request
    ("cut JSON", lambda: (b'{"inputs": [', None), "bad_request", "not valid JSON"),
    ("not UTF-8", lambda: (b"\xff\xfe garbage", None), "bad_request", "not valid JSON"),
    ("JSON array", lambda: (b"[1, 2]", None), "bad_request", "JSON object"),
    ("NaN", lambda: (b'{"inputs": [{"name": "image", "data": [NaN]}]}', None), "bad_request", "not valid JSON"),
    ("deep nesting", lambda: (b"[" * 100_000, None), "bad_request", "not valid JSON"),
    ("inputs not list", lambda: _raw({"inputs": "x"}), "bad_request", "inputs must be a list"),
    ("id not string", lambda: _raw({"id": 7, **_bytes_doc(data=["eA=="])}), "bad_request", "id must be a string"),
    (
        "binary, no header",
        lambda: (_raw(_bytes_doc(parameters={"binary_data_size": len(ONE_JPEG)}))[0] + ONE_JPEG, None),
        "bad_request",
        "not valid JSON",
    ),
    (
        "binary size, JSON only",
        lambda: _raw(_bytes_doc(parameters={"binary_data_size": len(ONE_JPEG)})),
        "bad_request",
        "header is missing",
    ),
    (
        "shared memory",
        lambda: _raw(_bytes_doc(parameters={"shared_memory_region": "r", "shared_memory_byte_size": 8})),
        "bad_request",
        "shared-memory",
    ),
    (
        "binary_data_output",
        lambda: _raw({**_bytes_doc(data=["eA=="]), "parameters": {"binary_data_output": "yes"}}),
        "bad_request",
        "binary_data_output",
    ),
    # an empty image: 400 empty_body, as on /v1
    (
        "empty image",
        lambda: _raw(_bytes_doc(parameters={"binary_data_size": 4}), b"\x00\x00\x00\x00"),
        "empty_body",
        "empty",
    ),
    # too many images: 413, as /v1/classify/batch
    ("too many images", lambda: _body([_bytes_input([JPEG] * TOO_MANY)]), "too_many_files", f"{TOO_MANY} images"),
    # parameter values out of range: 422, as /v1's top_k
    (
        "top_k too big",
        lambda: _body([_bytes_input([JPEG])], parameters={"top_k": LIMITS.max_top_k + 1}),
        "invalid_parameter",
        "top_k",
    ),
    ("top_k zero", lambda: _body([_bytes_input([JPEG])], parameters={"top_k": 0}), "invalid_parameter", "top_k"),
    (
        "class_count < 0",
        lambda: _body([_bytes_input([JPEG])], [httpclient.InferRequestedOutput("top_k", class_count=-1)]),
        "invalid_parameter",
        "classification",
    ),
]


@pytest.mark.parametrize(("make", "code", "fragment"), [c[1:] for c in BAD_REQUESTS], ids=[c[0] for c in BAD_REQUESTS])
def test_bad_requests_get_the_right_code(make: Any, code: str, fragment: str) -> None:
    body, hl = make()
    with pytest.raises(ServiceError) as e:
        _parse(body, hl)
    assert e.value.code == code, e.value.message
    assert e.value.status == STATUS[code]
    assert fragment in e.value.message


@pytest.mark.parametrize("cut", ["truncate", "extend", "beyond"])
def test_binary_length_mismatch_is_400(cut: str) -> None:
    body, hl = _body([_bytes_input([JPEG, PNG])])
    assert hl is not None
    if cut == "truncate":
        body = body[:-3]
    elif cut == "extend":
        body += b"junk"
    else:
        hl = len(body) + 1
    with pytest.raises(ServiceError) as e:
        _parse(body, hl)
    assert _code(e) == ("bad_request", 400)


def test_binary_body_without_header_is_400() -> None:
    body, _ = _body([_bytes_input([JPEG])])
    with pytest.raises(ServiceError) as e:
        _parse(body, None)  # the Router lost Inference-Header-Content-Length: the tail is not JSON
    assert _code(e) == ("bad_request", 400)


def test_wrong_shape_error_reads_through_tritonclient() -> None:
    """v2_error's body is what tritonclient turns into InferenceServerException(msg, status)."""
    body, hl = _body([_pixel_input(np.zeros((1, 100, 100, 3), np.uint8))])
    with pytest.raises(ServiceError) as e:
        _parse(body, hl)
    status, payload = v2.v2_error(e.value)
    assert status == 400 and set(payload) == {"error"} and "224" in payload["error"]

    class FakeResponse:  # the two things tritonclient reads from an HTTP response
        status_code = status

        def read(self) -> bytes:
            return json.dumps(payload).encode()

    err = _get_error(FakeResponse())
    assert isinstance(err, InferenceServerException)
    assert err.status() == "400" and err.message() == payload["error"]


def test_v2_error_uses_the_status_table() -> None:
    for code in ("not_found", "too_many_files", "overloaded", "invalid_tensor", "internal_error"):
        status, body = v2.v2_error(ServiceError(code, f"msg {code}"))
        assert status == STATUS[code] and body == {"error": f"msg {code}"}


def test_parse_header_length() -> None:
    assert v2.parse_header_length(None) is None
    assert v2.parse_header_length(" 123 ") == 123
    for junk in ("", "-1", "1e3", "abc", "١٢", "9" * 40):
        with pytest.raises(ServiceError) as e:
            v2.parse_header_length(junk)
        assert _code(e) == ("bad_request", 400)


def test_decompress_body() -> None:
    body, _ = _body([_bytes_input([JPEG])])
    assert v2.decompress_body(body, None, 10_000) == body
    assert v2.decompress_body(gzip.compress(body), "gzip", 10_000) == body
    assert v2.decompress_body(zlib.compress(body), "deflate", 10_000) == body  # what tritonclient sends
    bomb = gzip.compress(b"\x00" * 1_000_000)
    for raw, enc, code in (
        (bomb, "gzip", "payload_too_large"),
        (b"not gzip", "gzip", "bad_request"),
        (gzip.compress(body)[:-10], "gzip", "bad_request"),
        (body, "br", "unsupported_media_type"),
    ):
        with pytest.raises(ServiceError) as e:
            v2.decompress_body(raw, enc, 10_000)
        assert e.value.code == code


def test_decompress_body_bounds_the_ratio_when_asked() -> None:
    bomb = gzip.compress(b'{"inputs":[' + b"[]," * 1_000_000 + b"[]]}")  # 3 MB from ~3 KB
    assert len(v2.decompress_body(bomb, "gzip", 10 << 20)) > 3_000_000  # no ratio given: the size limit only
    with pytest.raises(ServiceError) as e:
        v2.decompress_body(bomb, "gzip", 10 << 20, max_ratio=LIMITS.max_inflate_ratio)
    assert e.value.code == "payload_too_large" and "times its size" in e.value.message


# --------------------------------------------------------------------------- any JSON type in any field

ODD_VALUES: list[Any] = [{}, {"a": 1}, [], [[]], [{"a": [1]}], None, True, 1.5, -1, 2**70, "x", ""]


def _valid_docs() -> list[tuple[dict[str, Any], tuple[int, int]]]:
    """A JSON bytes request and a JSON pixels request (4x5 images) with every optional field present."""
    common = {
        "id": "r1",
        "outputs": [{"name": "top_k", "parameters": {"classification": 3, "binary_data": False}}],
        "parameters": {"top_k": 3, "binary_data_output": False},
    }
    bytes_inp = {"name": "image_bytes", "datatype": "BYTES", "shape": [1], "data": ["eA=="], "parameters": {}}
    pixels_inp = {"name": "image", "datatype": "UINT8", "shape": [1, 4, 5, 3], "data": [7] * 60}
    return [({**common, "inputs": [bytes_inp]}, HW), ({**common, "inputs": [pixels_inp]}, (4, 5))]


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every place in a JSON document that holds a value (dict keys and list indices), the data arrays' first only."""
    out: list[tuple[Any, ...]] = []
    items = value.items() if isinstance(value, dict) else enumerate(value[:1]) if isinstance(value, list) else ()
    for k, v in items:
        out.append((*prefix, k))
        out.extend(_paths(v, (*prefix, k)))
    return out


def _replaced(doc: Any, path: tuple[Any, ...], value: Any) -> Any:
    copy = json.loads(json.dumps(doc))
    target = copy
    for k in path[:-1]:
        target = target[k]
    target[path[-1]] = value
    return copy


@pytest.mark.parametrize("value", ODD_VALUES, ids=[json.dumps(v) for v in ODD_VALUES])
def test_any_json_type_in_any_field_is_a_4xx_never_a_crash(value: Any) -> None:
    """An object or array where a name, datatype, shape, parameter or datum belongs: the protocol's 400/413/422."""
    tried = 0
    for doc, hw in _valid_docs():
        _parse(json.dumps(doc).encode(), None, hw=hw)  # the unchanged request is valid
        for path in _paths(doc):
            body = json.dumps(_replaced(doc, path, value)).encode()
            tried += 1
            try:
                _parse(body, None, hw=hw)
            except ServiceError as e:
                assert 400 <= e.status < 500, (path, e.code, e.message)
                assert len(e.message) < 400, (path, e.message)
    assert tried > 20


@pytest.mark.parametrize("name", [{"a": 1}, ["image"], [["image_bytes"]], {"image": "image"}])
def test_an_input_name_that_is_an_object_or_array_is_400(name: Any) -> None:
    """The issue's 500: `name not in INPUT_DATATYPES` hashed the value (a dict is unhashable)."""
    for doc in (
        {"inputs": [{"name": name, "datatype": "BYTES", "shape": [1], "data": ["eA=="]}]},
        {
            "inputs": [{"name": "image_bytes", "datatype": "BYTES", "shape": [1], "data": ["eA=="]}],
            "outputs": [{"name": name}],
        },
    ):
        with pytest.raises(ServiceError) as e:
            _parse(json.dumps(doc).encode(), None)
        assert _code(e) == ("invalid_tensor", 400)
        status, payload = v2.v2_error(e.value)
        assert status == 400 and set(payload) == {"error"} and "unknown" in payload["error"]


def test_bytes_shape_n_by_1_is_taken_as_n_like_a_batched_triton_model() -> None:
    body, n = _raw(_bytes_doc(shape=[2, 1], parameters={"binary_data_size": 2 * len(ONE_JPEG)}), 2 * ONE_JPEG)
    req = v2.parse_infer_request(body, n, Limits(), (224, 224))
    assert req.images == [JPEG, JPEG] and req.batch_size == 2
    json_doc = _raw(_bytes_doc(shape=[1, 1], data=[[base64.b64encode(JPEG).decode()]]))
    assert v2.parse_infer_request(*json_doc, Limits(), (224, 224)).images == [JPEG]
