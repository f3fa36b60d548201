"""An inference request's body to an `InferRequest`: its JSON, and the binary tensor data after it (the binary
tensor data extension), with every check and limit; the request's Content-Encoding and header length."""

from __future__ import annotations

import base64
import binascii
import json
import reprlib
import struct
from collections.abc import Mapping
from typing import Any

import numpy as np

from app.config import Limits
from app.errors import ServiceError
from app.protocol.v2.names import HEADER_LENGTH, IMAGE_BYTES_INPUT, IMAGE_INPUT, INPUT_DATATYPES, OUTPUTS
from app.protocol.v2.request import InferRequest, RequestedOutput
from app.request.body_gate import inflate
from app.request.guards import byte_count


def _tensor_error(message: str) -> ServiceError:
    return ServiceError("invalid_tensor", message)


_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = 64
_REPR.maxlist = _REPR.maxdict = 8
_REPR.maxlevel = 3


def _short(value: Any) -> str:
    """A client's value as it appears in an error message: bounded, however large or deep it is."""
    return _REPR.repr(value)


def parse_header_length(raw: str | None) -> int | None:
    """The Inference-Header-Content-Length header as an int (None when absent); junk -> 400 bad_request."""
    return byte_count(raw, HEADER_LENGTH)


def decompress_body(body: bytes, content_encoding: str | None, max_bytes: int, max_ratio: float | None = None) -> bytes:
    """Undo a request's Content-Encoding (tritonclient's request_compression_algorithm: gzip or deflate).

    The inflated size is bounded by max_bytes (413 beyond), and, given max_ratio, by that many times
    the compressed size (never below 1 MiB; `app.request.body_gate.inflate`, which this is). Other encodings -> 415.
    """
    return inflate(body, content_encoding, max_bytes, max_ratio)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _load_json(header: bytes) -> dict[str, Any]:
    try:
        doc = json.loads(header, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ServiceError("bad_request", f"the inference request is not valid JSON: {str(e)[:200]}") from None
    if not isinstance(doc, dict):
        raise ServiceError("bad_request", "the inference request must be a JSON object")
    return doc


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _params(obj: Mapping[str, Any], where: str) -> dict[str, Any]:
    params = obj.get("parameters")
    if params is None:
        return {}
    if not isinstance(params, dict):
        raise ServiceError("bad_request", f"{where}: parameters must be a JSON object")
    if any(isinstance(k, str) and k.startswith("shared_memory") for k in params):
        raise ServiceError("bad_request", f"{where}: the shared-memory extension is not supported")
    return params


def _count(value: Any, name: str, limits: Limits, allow_zero: bool) -> int:
    if not _is_int(value) or value < (0 if allow_zero else 1) or value > limits.max_top_k:
        low = 0 if allow_zero else 1
        raise ServiceError("invalid_parameter", f"{name} must be an integer from {low} to {limits.max_top_k}")
    return int(value)


def _flatten(data: Any, out: list[Any], depth: int = 0) -> None:
    if depth > 8:
        raise _tensor_error("tensor data is nested too deeply")
    for item in data:
        if isinstance(item, list):
            _flatten(item, out, depth + 1)
        else:
            out.append(item)


def _parse_shape(inp: Mapping[str, Any], name: str) -> list[int]:
    shape = inp.get("shape")
    if not isinstance(shape, list) or not all(_is_int(d) and 0 <= d < 2**63 for d in shape):
        raise _tensor_error(f"input {name!r}: shape must be a list of non-negative integers, got {_short(shape)}")
    return shape


def _split_bytes(raw: bytes, count: int, name: str) -> list[bytes]:
    """BYTES tensor data: per element a 4-byte little-endian length, then that many bytes."""
    items, offset = [], 0
    for i in range(count):
        if offset + 4 > len(raw):
            raise _tensor_error(f"input {name!r}: binary data ends before element {i} of {count}")
        (n,) = struct.unpack_from("<I", raw, offset)
        offset += 4
        if offset + n > len(raw):
            raise _tensor_error(f"input {name!r}: element {i} declares {n} bytes, only {len(raw) - offset} remain")
        items.append(raw[offset : offset + n])
        offset += n
    if offset != len(raw):
        raise _tensor_error(f"input {name!r}: {len(raw) - offset} bytes left after {count} elements (shape mismatch)")
    return items


def _json_bytes(data: Any, count: int, name: str) -> list[bytes]:
    flat: list[Any] = []
    _flatten(data, flat)
    if len(flat) != count:
        raise _tensor_error(f"input {name!r}: shape says {count} elements, data has {len(flat)}")
    images = []
    for i, s in enumerate(flat):
        if not isinstance(s, str):
            raise _tensor_error(f"input {name!r}: element {i} must be a base64 string")
        try:
            images.append(base64.b64decode(s, validate=True))
        except (binascii.Error, ValueError):
            raise _tensor_error(
                f"input {name!r}: element {i} is not base64; in JSON, BYTES images are base64 strings "
                "(or send them as binary tensor data)"
            ) from None
    return images


def _json_pixels(data: Any, shape: tuple[int, ...], name: str) -> np.ndarray:
    try:
        arr = np.asarray(data)
    except (ValueError, TypeError, OverflowError):
        raise _tensor_error(f"input {name!r}: data is not a rectangular array of integers") from None
    if arr.dtype.kind not in "iu":
        raise _tensor_error(f"input {name!r}: UINT8 data must be integers, got {arr.dtype.kind!r} values")
    expected = int(np.prod(shape))
    if arr.size != expected:
        raise _tensor_error(f"input {name!r}: shape {list(shape)} needs {expected} values, data has {arr.size}")
    if arr.size and (arr.min() < 0 or arr.max() > 255):
        raise _tensor_error(f"input {name!r}: UINT8 values must be 0..255")
    return arr.astype(np.uint8).reshape(shape)


def _parse_outputs(doc: Mapping[str, Any], params: Mapping[str, Any], limits: Limits) -> tuple[RequestedOutput, ...]:
    default_binary = params.get("binary_data_output", False)
    if not isinstance(default_binary, bool):
        raise ServiceError("bad_request", "parameters.binary_data_output must be true or false")
    raw = doc.get("outputs")
    if raw is None or raw == []:
        return tuple(RequestedOutput(name, default_binary) for name in OUTPUTS)
    if not isinstance(raw, list) or not all(isinstance(o, dict) for o in raw):
        raise ServiceError("bad_request", "outputs must be a list of JSON objects")
    outputs: list[RequestedOutput] = []
    for o in raw:
        name = o.get("name")
        if not isinstance(name, str) or name not in OUTPUTS:
            raise _tensor_error(f"unknown output {_short(name)}; this model's outputs are {list(OUTPUTS)}")
        if any(r.name == name for r in outputs):
            raise _tensor_error(f"output {name!r} is requested twice")
        oparams = _params(o, f"output {name!r}")
        binary = oparams.get("binary_data", default_binary)
        if not isinstance(binary, bool):
            raise ServiceError("bad_request", f"output {name!r}: parameters.binary_data must be true or false")
        count = _count(oparams.get("classification", 0), f"output {name!r}: classification", limits, True)
        outputs.append(RequestedOutput(name, binary, count))
    return tuple(outputs)


def _hwc(image_size: tuple[int, ...]) -> tuple[int, int, int]:
    h, w, *c = image_size
    return h, w, c[0] if c else 3


def parse_infer_request(
    body: bytes, header_length: int | None, limits: Limits, image_size: tuple[int, ...]
) -> InferRequest:
    """Parse and check an inference request: JSON only, or JSON header + binary tensor data.

    header_length: the Inference-Header-Content-Length header (`parse_header_length`),
    None when the whole body is JSON. image_size: the model's (height, width[, channels]) (`image_shape` of a
    Classifier's spec; channels 3 unless given), the only H, W, C an `image` input may have.

    Errors (all ServiceError): bad JSON, header length beyond the body, binary
    length mismatch -> bad_request (400); wrong input or output name, datatype,
    shape, element count or data -> invalid_tensor (400); an empty image ->
    empty_body (400); more than limits.max_batch_files images -> too_many_files
    (413); top_k / classification outside 1..limits.max_top_k -> invalid_parameter (422).
    """
    if header_length is None:
        header, rest = body, b""
    else:
        if header_length > len(body):
            raise ServiceError(
                "bad_request", f"{HEADER_LENGTH} is {header_length} but the body has only {len(body)} bytes"
            )
        header, rest = body[:header_length], body[header_length:]
    return parse_infer_doc(_load_json(header), rest, header_length is not None, limits, image_size)


def parse_infer_doc(
    doc: Mapping[str, Any], rest: bytes, binary_allowed: bool, limits: Limits, image_size: tuple[int, ...]
) -> InferRequest:
    """`parse_infer_request` after the JSON: the request object, and the binary data that followed it.

    binary_allowed: the request came with binary tensor data (REST: the header-length header; gRPC: always,
    as raw contents), so inputs may declare `binary_data_size`.
    """
    request_id = _request_id(doc)
    params = _params(doc, "request")
    top_k = _count(params.get("top_k", limits.default_top_k), "parameters.top_k", limits, False)
    outputs = _parse_outputs(doc, params, limits)
    inp, name, shape = _the_input(doc, limits, image_size)
    size = _binary_data_size(inp, name, rest, binary_allowed)

    req = InferRequest(id=request_id, input_name=name, outputs=outputs, top_k=top_k, parameters=dict(params))
    if name == IMAGE_BYTES_INPUT:
        req.images = _input_images(inp, name, shape[0], size, rest)
    else:
        req.pixels = _input_pixels(inp, name, shape, _hwc(image_size), size, rest)
    return req


def _request_id(doc: Mapping[str, Any]) -> str | None:
    request_id = doc.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise ServiceError("bad_request", "id must be a string")
    return request_id


def _the_input(
    doc: Mapping[str, Any], limits: Limits, image_size: tuple[int, ...]
) -> tuple[Mapping[str, Any], str, list[int]]:
    """The request's one input, its name and its shape: a known name and datatype, a shape the model takes, a batch
    of 1..limits.max_batch_files images."""
    inputs = doc.get("inputs")
    if not isinstance(inputs, list) or not all(isinstance(i, dict) for i in inputs):
        raise ServiceError("bad_request", "inputs must be a list of JSON objects")
    if len(inputs) != 1:
        raise _tensor_error(
            f"this model takes exactly one input ({IMAGE_BYTES_INPUT!r} BYTES [-1] or {IMAGE_INPUT!r} "
            f"UINT8 [-1, {', '.join(map(str, _hwc(image_size)))}]), got {len(inputs)}"
        )
    inp = inputs[0]
    name = inp.get("name")
    if not isinstance(name, str) or name not in INPUT_DATATYPES:  # a JSON object as a name is unhashable
        raise _tensor_error(
            f"unknown input {_short(name)}; send {IMAGE_BYTES_INPUT!r} (BYTES) or {IMAGE_INPUT!r} (UINT8)"
        )
    datatype = inp.get("datatype")
    if datatype != INPUT_DATATYPES[name]:
        raise _tensor_error(f"input {name!r} must have datatype {INPUT_DATATYPES[name]}, got {_short(datatype)}")
    shape = _parse_shape(inp, name)
    h, w, c = _hwc(image_size)
    # [N, 1] too: what clients of a Triton model with max_batch_size > 0 and dims [1] send.
    if name == IMAGE_BYTES_INPUT and (not shape or shape[1:] not in ([], [1])):
        raise _tensor_error(
            f"input {name!r} must have shape [N] or [N, 1] (one encoded image per element), got {_short(shape)}"
        )
    if name == IMAGE_INPUT and (len(shape) != 4 or shape[1:] != [h, w, c]):
        raise _tensor_error(f"input {name!r} must have shape [N, {h}, {w}, {c}], got {_short(shape)}")
    n = shape[0]
    if n == 0:
        raise _tensor_error(f"input {name!r} has no images (shape {_short(shape)})")
    if n > limits.max_batch_files:
        raise ServiceError("too_many_files", f"{n} images in one request; the limit is {limits.max_batch_files}")
    return inp, name, shape


def _binary_data_size(inp: Mapping[str, Any], name: str, rest: bytes, binary_allowed: bool) -> int | None:
    """The input's `binary_data_size` (None: its data is JSON), checked against the bytes that followed the JSON."""
    iparams = _params(inp, f"input {name!r}")
    size = iparams.get("binary_data_size")
    if size is not None and "data" in inp:
        raise _tensor_error(f"input {name!r} has both JSON data and binary_data_size")
    if size is None and "data" not in inp:
        raise _tensor_error(f"input {name!r} has no data (neither data nor parameters.binary_data_size)")
    if size is not None:
        if not binary_allowed:
            raise ServiceError("bad_request", f"input {name!r} is binary but the {HEADER_LENGTH} header is missing")
        if not _is_int(size) or size < 0:
            raise _tensor_error(f"input {name!r}: binary_data_size must be a non-negative integer")
    declared = size or 0
    if declared != len(rest):
        raise ServiceError(
            "bad_request",
            f"binary data length mismatch: inputs declare {declared} bytes, {len(rest)} follow the JSON header",
        )
    return size


def _input_images(inp: Mapping[str, Any], name: str, n: int, size: int | None, rest: bytes) -> list[bytes]:
    """The n encoded files of an `image_bytes` input, from binary tensor data (size given) or JSON base64."""
    if size is not None:
        images = _split_bytes(rest, n, name)
    else:
        if not isinstance(inp["data"], list):
            raise _tensor_error(f"input {name!r}: data must be a list")
        images = _json_bytes(inp["data"], n, name)
    for i, img in enumerate(images):
        if not img:
            raise ServiceError("empty_body", f"image {i} of input {name!r} is empty")
    return images


def _input_pixels(
    inp: Mapping[str, Any], name: str, shape: list[int], hwc: tuple[int, int, int], size: int | None, rest: bytes
) -> np.ndarray:
    """An `image` input's uint8 [N, H, W, C] pixels, from binary tensor data (size given) or JSON integers."""
    n = shape[0]
    h, w, c = hwc
    if size is not None:
        expected = n * h * w * c
        if size != expected:
            raise _tensor_error(f"input {name!r}: shape {_short(shape)} is {expected} bytes of UINT8, got {size}")
        return np.frombuffer(rest, dtype=np.uint8).reshape(n, h, w, c)
    if not isinstance(inp["data"], list):
        raise _tensor_error(f"input {name!r}: data must be a list")
    return _json_pixels(inp["data"], (n, h, w, c), name)
