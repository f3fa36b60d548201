"""The inference response: the requested outputs from what the Classifier returned (full tensors, or Triton's
classification strings), and their encoding as JSON or binary tensor data."""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from app.errors import ServiceError
from app.protocol.v2.names import BINARY_CONTENT_TYPE, DEFAULT_VERSION, HEADER_LENGTH, JSON_CONTENT_TYPE, LOGITS
from app.protocol.v2.request import InferRequest


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
