"""The Open Inference Protocol (KServe V2 / Triton HTTP) for this service: the pure half, no Ray, no server.

The Router owns the HTTP side (reading the body, calling the deployments,
sending the reply); this module owns the protocol: which paths exist, what the
metadata says, how an inference request is parsed and checked, how a response
is encoded. Every function here takes and returns plain values, so the whole
protocol is tested without a cluster against the real, unmodified tritonclient.

Models. One model name per way of choosing a variant, all built by
`model_name_for(base, variant)` from the declared model name (`args.model.name`):

    <name>         A/B routed (weights, sticky header, override header), like /v1
    <name>-int8    always Classifier_int8
    <name>-fp32    always Classifier_fp32

Each has the single version "1" (`DEFAULT_VERSION`).

Inputs. A request carries exactly ONE of two inputs; the metadata lists both
(Triton clients read `inputs` as "what this model accepts", and each entry has
its own name, so a client picks the one it has):

    image_bytes  BYTES [-1, 1]        encoded image files (JPEG, PNG, ...), decoded by the Preprocessor.
                                      [N] is taken as [N, 1] (Triton's batched BYTES models use dims [1],
                                      and the metadata says so; KServe clients often send [N]).
                                      Binary extension: 4-byte little-endian length + bytes per element.
                                      JSON `data`: each element is the file as a base64 string (JSON strings
                                      cannot carry arbitrary bytes; raw JPEG/PNG bytes are never valid UTF-8).
    image        UINT8 [-1, H, W, C]  pixels already at the model's size (H, W, C from its graph) in the channel
                                      order it declares (model.preprocess.color), sent straight to the
                                      Classifier, which normalises them as declared. Always uint8 NHWC: that
                                      is what a Classifier accepts, whatever the graph's own input (a float
                                      NCHW graph included: its normalisation is the server's, never the client's).

Outputs (all batched, row i answers image i):

    logits         FP32  [-1, C]  the model's output
    probabilities  FP32  [-1, C]  softmax of logits
    top_k          BYTES [-1, k]  "score:index:label" strings, best first (Triton's classification format);
                                  k = the output's `classification` parameter, else the request parameter
                                  `top_k`, else Limits.default_top_k.

Triton's classification extension also works on `logits` and `probabilities`:
`{"name": "probabilities", "parameters": {"classification": 3}}` returns BYTES
[-1, 3] instead of the FP32 tensor. When a request names no outputs, all three
are returned (the protocol's rule: "all outputs produced by the model"), as
binary when the request parameter `binary_data_output` is true (tritonclient
sets it whenever it is given no outputs), else as JSON.

Extensions implemented, and so listed in the server metadata:
`binary_tensor_data`, `classification`, and Triton's `model_configuration`
(app/protocol/v2_config.py) and `statistics` (app/pipeline/inferstats.py), which Triton's tools
(perf_analyzer) need. Not implemented: shared memory (refused with 400),
sequences, model repository, trace, logging.

Errors are `{"error": "<message>"}` (the protocol's error object) with the
status from `app.errors.STATUS`, like every other failure of the service.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import reprlib
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from app.config import Limits
from app.errors import STATUS, ServiceError
from app.request.body import inflate
from app.request.guards import byte_count

# --------------------------------------------------------------------------- names and constants

SERVER_NAME = "ray-image-classifier"
EXTENSIONS: tuple[str, ...] = ("binary_tensor_data", "classification", "model_configuration", "statistics")
PLATFORM = "onnx_onnxv1"  # Triton's platform name for ONNX models
DEFAULT_VERSION = "1"

HEADER_LENGTH = "Inference-Header-Content-Length"
JSON_CONTENT_TYPE = "application/json"
BINARY_CONTENT_TYPE = "application/octet-stream"

IMAGE_BYTES_INPUT = "image_bytes"
IMAGE_INPUT = "image"
INPUT_DATATYPES: dict[str, str] = {IMAGE_BYTES_INPUT: "BYTES", IMAGE_INPUT: "UINT8"}

LOGITS = "logits"
PROBABILITIES = "probabilities"
TOP_K = "top_k"
OUTPUTS: tuple[str, ...] = (LOGITS, PROBABILITIES, TOP_K)


def model_name_for(base: str, variant: str | None = None) -> str:
    """The V2 model name of one variant (`base-variant`), or of the A/B routed model (`base`) when variant is None."""
    return base if variant is None else f"{base}-{variant}"


def model_names(base: str, variants: Iterable[str]) -> dict[str, str | None]:
    """Every V2 model name -> its variant (None: A/B routed). The A/B model first, then variants sorted."""
    names: dict[str, str | None] = {model_name_for(base): None}
    for v in sorted(variants):
        names[model_name_for(base, v)] = v
    return names


def resolve_model(
    name: str,
    base: str,
    variants: Iterable[str],
    version: str | None = None,
    versions: Sequence[str] = (DEFAULT_VERSION,),
) -> str | None:
    """The variant a V2 model name pins (None: A/B routed). Unknown name or version -> ServiceError not_found (404)."""
    names = model_names(base, variants)
    if name not in names:
        raise ServiceError("not_found", f"unknown model {name!r}; models: {sorted(names)}")
    if version and version not in versions:
        raise ServiceError("not_found", f"model {name!r} has no version {version!r}; versions: {list(versions)}")
    return names[name]


# --------------------------------------------------------------------------- paths

_MODEL = r"/v2/models/(?P<model>[^/]+)(?:/versions/(?P<version>[^/]+))?"
_ROUTES: tuple[tuple[re.Pattern[str], str, str], ...] = (
    (re.compile(r"/v2"), "GET", "server_metadata"),
    (re.compile(r"/v2/health/live"), "GET", "server_live"),
    (re.compile(r"/v2/health/ready"), "GET", "server_ready"),
    (re.compile(r"/v2/models/stats"), "GET", "model_stats"),  # before _MODEL, which would read "stats" as a name
    (re.compile(_MODEL), "GET", "model_metadata"),
    (re.compile(_MODEL + r"/ready"), "GET", "model_ready"),
    (re.compile(_MODEL + r"/config"), "GET", "model_config"),
    (re.compile(_MODEL + r"/stats"), "GET", "model_stats"),
    (re.compile(_MODEL + r"/infer"), "POST", "infer"),
)


def match_v2_path(method: str, path: str) -> tuple[str, dict[str, str]] | None:
    """Map a request to a V2 handler name and its path parameters.

    Handler names: server_metadata, server_live, server_ready, model_metadata,
    model_ready, model_config, model_stats, infer. Model routes give {"model": name,
    "version": v or ""}; `/v2/models/stats` (every model) gives {}.
    None: not a V2 path. A V2 path with the wrong method raises
    ServiceError("method_not_allowed") (405).
    """
    if path != "/":
        path = path.rstrip("/")
    for pattern, want, handler in _ROUTES:
        m = pattern.fullmatch(path)
        if m is None:
            continue
        if method.upper() != want:
            raise ServiceError("method_not_allowed", f"{method} is not allowed on {path}; use {want}")
        params = {k: v or "" for k, v in m.groupdict().items()}
        return handler, params
    return None


# --------------------------------------------------------------------------- metadata


def server_metadata(version: str, name: str = SERVER_NAME) -> dict[str, Any]:
    """GET /v2: name, version and the extensions this module implements."""
    return {"name": name, "version": version, "extensions": list(EXTENSIONS)}


def image_shape(model_spec: Mapping[str, Any]) -> tuple[int, int, int]:
    """(height, width, channels) of the `image` input, from a Classifier's `describe()["input"]`."""
    h, w = image_hw(model_spec)
    channels = model_spec.get("channels", 3)
    return h, w, channels if isinstance(channels, int) else 3


def image_hw(model_spec: Mapping[str, Any]) -> tuple[int, int]:
    """The model's input height and width from a Classifier's `describe()["input"]` (the runner's spec).

    Takes the spec (`{"input": {...}, "size": [h, w], "layout": ...}`) or just its
    `input` entry (`{"name", "shape": [N, H, W, 3], "dtype"}`, NHWC).
    """
    size = model_spec.get("size")
    if isinstance(size, Sequence) and len(size) == 2:
        return int(size[0]), int(size[1])
    inp = model_spec.get("input", model_spec)
    shape = list(inp.get("shape", [])) if isinstance(inp, Mapping) else []
    if len(shape) == 4 and isinstance(shape[1], int) and isinstance(shape[2], int):
        return shape[1], shape[2]
    raise ValueError(f"cannot read the input size from model spec {dict(model_spec)!r}")


def model_metadata(
    name: str,
    versions: Sequence[str],
    model_spec: Mapping[str, Any],
    num_classes: int | None,
    platform: str = PLATFORM,
) -> dict[str, Any]:
    """GET /v2/models/{name}: both accepted inputs (a request sends exactly one) and the three outputs.

    model_spec: a Classifier's `describe()["input"]`. num_classes: the number of
    labels (None or 0 when unknown: the class dimension is reported as -1).
    """
    h, w, channels = image_shape(model_spec)
    c = num_classes if num_classes and num_classes > 0 else -1
    return {
        "name": name,
        "versions": list(versions),
        "platform": platform,
        "inputs": [
            # [-1, 1], as Triton reports a batching model's dims [1] (app/protocol/v2_config.py): its tools size a
            # request from it (perf_analyzer refuses an input with no dimension past the batch). [N] is taken as well.
            {"name": IMAGE_BYTES_INPUT, "datatype": INPUT_DATATYPES[IMAGE_BYTES_INPUT], "shape": [-1, 1]},
            {"name": IMAGE_INPUT, "datatype": INPUT_DATATYPES[IMAGE_INPUT], "shape": [-1, h, w, channels]},
        ],
        "outputs": [
            {"name": LOGITS, "datatype": "FP32", "shape": [-1, c]},
            {"name": PROBABILITIES, "datatype": "FP32", "shape": [-1, c]},
            {"name": TOP_K, "datatype": "BYTES", "shape": [-1, -1]},
        ],
    }


# --------------------------------------------------------------------------- errors


def v2_error(err: ServiceError) -> tuple[int, dict[str, str]]:
    """The protocol's error object `{"error": message}` and its status from the one table.

    The Router adds `err.headers()` (Retry-After on 503) to the reply.
    """
    return STATUS[err.code], {"error": err.message}


def _tensor_error(message: str) -> ServiceError:
    return ServiceError("invalid_tensor", message)


_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = 64
_REPR.maxlist = _REPR.maxdict = 8
_REPR.maxlevel = 3


def _short(value: Any) -> str:
    """A client's value as it appears in an error message: bounded, however large or deep it is."""
    return _REPR.repr(value)


# --------------------------------------------------------------------------- request


@dataclass(frozen=True)
class RequestedOutput:
    """One output the response must carry."""

    name: str
    binary: bool = False  # binary tensor data extension: raw bytes after the JSON header
    class_count: int = 0  # > 0: Triton classification, BYTES [N, class_count] "score:index:label"


@dataclass
class InferRequest:
    """A parsed, checked POST /v2/models/{name}/infer body."""

    id: str | None
    input_name: str  # IMAGE_BYTES_INPUT or IMAGE_INPUT
    outputs: tuple[RequestedOutput, ...]
    top_k: int  # k of the top_k output when it has no classification count
    images: list[bytes] | None = None  # image_bytes: encoded files, for Preprocessor.many
    pixels: np.ndarray | None = None  # image: uint8 [N, H, W, C] (read-only), for the Classifier as is
    parameters: dict[str, Any] = field(default_factory=dict)  # the request's own parameters, unchecked extras

    @property
    def batch_size(self) -> int:
        if self.images is not None:
            return len(self.images)
        assert self.pixels is not None
        return int(self.pixels.shape[0])

    @property
    def binary_outputs(self) -> set[str]:
        return {o.name for o in self.outputs if o.binary}

    def k_of(self, output: RequestedOutput) -> int:
        """How many classes a top-k style output carries (0: a full tensor)."""
        if output.class_count:
            return output.class_count
        return self.top_k if output.name == TOP_K else 0

    @property
    def needs_logits(self) -> bool:
        """The Classifier must return the logits rows (an output is logits, full or classified)."""
        return any(o.name == LOGITS for o in self.outputs)

    @property
    def needs_probabilities(self) -> bool:
        """The Classifier must return full probability rows (top-k lists are not enough)."""
        return any(o.name == PROBABILITIES and not o.class_count for o in self.outputs)

    @property
    def max_k(self) -> int:
        """The largest top-k of probabilities any output needs: ask the Classifier for this top_k."""
        ks = [self.k_of(o) for o in self.outputs if o.name != LOGITS]
        return max([k for k in ks if k] or [self.top_k])


def parse_header_length(raw: str | None) -> int | None:
    """The Inference-Header-Content-Length header as an int (None when absent); junk -> 400 bad_request."""
    return byte_count(raw, HEADER_LENGTH)


def decompress_body(body: bytes, content_encoding: str | None, max_bytes: int, max_ratio: float | None = None) -> bytes:
    """Undo a request's Content-Encoding (tritonclient's request_compression_algorithm: gzip or deflate).

    The inflated size is bounded by max_bytes (413 beyond), and, given max_ratio, by that many times
    the compressed size (never below 1 MiB; `app.request.body.inflate`, which this is). Other encodings -> 415.
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
    request_id = doc.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise ServiceError("bad_request", "id must be a string")
    params = _params(doc, "request")
    top_k = _count(params.get("top_k", limits.default_top_k), "parameters.top_k", limits, False)
    outputs = _parse_outputs(doc, params, limits)

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

    req = InferRequest(id=request_id, input_name=name, outputs=outputs, top_k=top_k, parameters=dict(params))
    if name == IMAGE_BYTES_INPUT:
        if size is not None:
            req.images = _split_bytes(rest, n, name)
        else:
            if not isinstance(inp["data"], list):
                raise _tensor_error(f"input {name!r}: data must be a list")
            req.images = _json_bytes(inp["data"], n, name)
        for i, img in enumerate(req.images):
            if not img:
                raise ServiceError("empty_body", f"image {i} of input {name!r} is empty")
    else:
        if size is not None:
            expected = n * h * w * c
            if size != expected:
                raise _tensor_error(f"input {name!r}: shape {_short(shape)} is {expected} bytes of UINT8, got {size}")
            req.pixels = np.frombuffer(rest, dtype=np.uint8).reshape(n, h, w, c)
        else:
            if not isinstance(inp["data"], list):
                raise _tensor_error(f"input {name!r}: data must be a list")
            req.pixels = _json_pixels(inp["data"], (n, h, w, c), name)
    return req


# --------------------------------------------------------------------------- response


def _class_string(score: float, index: int, labels: Sequence[str]) -> bytes:
    # Triton formats the value like C's "%f" (std::to_string); the label is optional.
    label = labels[index] if 0 <= index < len(labels) else ""
    s = f"{score:f}:{index}:{label}" if label else f"{score:f}:{index}"
    return s.encode("utf-8")


def top_k_strings(probs: np.ndarray, k: int, labels: Sequence[str]) -> list[list[bytes]]:
    """Per row of probs [N, C] (or one row [C]), the k best as b"score:index:label", best first.

    The classification extension's format; ties keep the lower index first.
    """
    p = np.asarray(probs)
    if p.ndim == 1:
        p = p[None]
    k = max(0, min(k, p.shape[1]))
    order = np.argsort(-p, axis=1, kind="stable")[:, :k]
    return [[_class_string(float(p[r, i]), int(i), labels) for i in row] for r, row in enumerate(order)]


def top_strings(top: Sequence[Sequence[tuple[int, float]]], k: int, labels: Sequence[str]) -> list[list[bytes]]:
    """The same strings from the Classifier's `Scores.top` lists ((class_id, probability), best first)."""
    rows = []
    for r, row in enumerate(top):
        if len(row) < k:
            raise ServiceError("internal_error", f"row {r} has {len(row)} top classes, {k} are needed")
        rows.append([_class_string(p, c, labels) for c, p in row[:k]])
    return rows


def _need(arr: np.ndarray | None, what: str) -> np.ndarray:
    if arr is None:
        raise ServiceError("internal_error", f"the response needs {what}, which the Classifier did not return")
    return np.asarray(arr)


def compute_outputs(
    request: InferRequest,
    labels: Sequence[str],
    *,
    logits: np.ndarray | None = None,
    probabilities: np.ndarray | None = None,
    top: Sequence[Sequence[tuple[int, float]]] | None = None,
) -> dict[str, np.ndarray]:
    """The requested outputs, in request order, from what the Classifier returned.

    Pass logits [N, C] when `request.needs_logits`, probabilities [N, C] when
    `request.needs_probabilities`; top-k style outputs come from probabilities
    when given, else from `top` (Scores.top computed with top_k >= request.max_k).
    """
    out: dict[str, np.ndarray] = {}
    for o in request.outputs:
        k = request.k_of(o)
        if o.name == LOGITS:
            x = _need(logits, "logits")
            out[o.name] = _bytes_array(top_k_strings(x, k, labels)) if k else x.astype(np.float32, copy=False)
        elif not k:
            out[o.name] = _need(probabilities, "probabilities").astype(np.float32, copy=False)
        elif probabilities is not None:
            out[o.name] = _bytes_array(top_k_strings(probabilities, k, labels))
        elif top is not None:
            out[o.name] = _bytes_array(top_strings(top, k, labels))
        else:
            raise ServiceError("internal_error", f"output {o.name!r} needs probabilities or top-k lists")
    return out


def _bytes_array(rows: list[list[bytes]]) -> np.ndarray:
    arr = np.empty((len(rows), len(rows[0]) if rows else 0), dtype=np.object_)
    for r, row in enumerate(rows):
        arr[r, :] = row
    return arr


_DATATYPES: dict[str, str] = {
    "bool": "BOOL",
    "uint8": "UINT8",
    "uint16": "UINT16",
    "uint32": "UINT32",
    "uint64": "UINT64",
    "int8": "INT8",
    "int16": "INT16",
    "int32": "INT32",
    "int64": "INT64",
    "float16": "FP16",
    "float32": "FP32",
    "float64": "FP64",
}


def _as_tensor(value: np.ndarray | Sequence[Sequence[bytes]]) -> tuple[np.ndarray, str]:
    if isinstance(value, np.ndarray) and value.dtype != np.object_ and value.dtype.kind != "S":
        datatype = _DATATYPES.get(value.dtype.name)
        if datatype is None:
            raise ServiceError("internal_error", f"no V2 datatype for numpy {value.dtype}")
        return value, datatype
    if isinstance(value, np.ndarray):
        return value.astype(np.object_, copy=False), "BYTES"
    return _bytes_array([list(row) for row in value]), "BYTES"


def _element_bytes(e: Any) -> bytes:
    return e if isinstance(e, bytes) else str(e).encode("utf-8")


def binary_tensor(value: np.ndarray | Sequence[Sequence[bytes]]) -> tuple[np.ndarray, str, bytes]:
    """An output as (array, V2 datatype, its binary tensor data): BYTES length-prefixed, numbers little-endian."""
    arr, datatype = _as_tensor(value)
    if datatype == "BYTES":
        return arr, datatype, _serialize_bytes(arr)
    return arr, datatype, np.ascontiguousarray(arr).astype(arr.dtype.newbyteorder("<"), copy=False).tobytes()


def _serialize_bytes(arr: np.ndarray) -> bytes:
    """BYTES tensor as binary data: per element (row-major) a 4-byte little-endian length, then the bytes."""
    parts = []
    for e in arr.ravel(order="C"):
        b = _element_bytes(e)
        parts.append(struct.pack("<I", len(b)))
        parts.append(b)
    return b"".join(parts)


def build_infer_response(
    model_name: str,
    model_version: str | None,
    request_id: str | None,
    outputs: Mapping[str, np.ndarray | Sequence[Sequence[bytes]]],
    binary: Iterable[str] = (),
    parameters: Mapping[str, Any] | None = None,
) -> tuple[bytes, dict[str, str]]:
    """Encode an inference response: the body and the headers to send with status 200.

    outputs: name -> numeric array (FP32 etc.) or BYTES ([N, k] object array of
    bytes, or nested lists of bytes), in the order they appear in the response.
    Outputs named in `binary` go as binary tensor data after the JSON header
    (Content-Type application/octet-stream + Inference-Header-Content-Length);
    with none, the body is plain JSON (application/json). `id` is echoed only
    when the request gave one. parameters: response parameters (values must be
    strings, numbers or booleans), e.g. the variant that answered.
    """
    binary = set(binary)
    header: dict[str, Any] = {"model_name": model_name}
    if model_version:
        header["model_version"] = model_version
    if request_id:
        header["id"] = request_id
    if parameters:
        header["parameters"] = dict(parameters)
    entries: list[dict[str, Any]] = []
    blobs: list[bytes] = []
    for name, value in outputs.items():
        arr, datatype = _as_tensor(value)
        entry: dict[str, Any] = {"name": name, "datatype": datatype, "shape": [int(d) for d in arr.shape]}
        if name in binary:
            _, _, raw = binary_tensor(arr)
            entry["parameters"] = {"binary_data_size": len(raw)}
            blobs.append(raw)
        elif datatype == "BYTES":
            entry["data"] = [_element_bytes(e).decode("utf-8", errors="replace") for e in arr.ravel(order="C")]
        else:
            entry["data"] = arr.ravel(order="C").tolist()
        entries.append(entry)
    header["outputs"] = entries
    head = json.dumps(header, separators=(",", ":")).encode("utf-8")
    if not blobs:
        return head, {"Content-Type": JSON_CONTENT_TYPE}
    return head + b"".join(blobs), {"Content-Type": BINARY_CONTENT_TYPE, HEADER_LENGTH: str(len(head))}


def encode_infer_response(
    request: InferRequest,
    model_name: str,
    labels: Sequence[str],
    *,
    logits: np.ndarray | None = None,
    probabilities: np.ndarray | None = None,
    top: Sequence[Sequence[tuple[int, float]]] | None = None,
    model_version: str | None = DEFAULT_VERSION,
    parameters: Mapping[str, Any] | None = None,
) -> tuple[bytes, dict[str, str]]:
    """`compute_outputs` then `build_infer_response` with the request's id and binary flags."""
    outputs = compute_outputs(request, labels, logits=logits, probabilities=probabilities, top=top)
    return build_infer_response(model_name, model_version, request.id, outputs, request.binary_outputs, parameters)
