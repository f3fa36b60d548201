"""The Open Inference Protocol over gRPC: the pure half, from and to the protocol's own messages.

The messages are Triton's `inference.GRPCInferenceService` (grpc_service.proto, the superset of KServe's
grpc_predict_v2.proto that adds ModelConfig and ModelStatistics), generated under the app's own package
(`app.protocol.v2.pb`, by `python -m app.ops.proto_gen` from the descriptors compiled into Triton's own client
package), so the wire format is the one its clients and perf_analyzer speak, and each message pickles by reference
(what Serve's Python gRPC proxy does to hand a request to a replica).

A gRPC request is turned into the same `InferRequest` the REST endpoint parses (`app.protocol.v2.parse_infer_doc`),
so both protocols share every check, limit and error; the answer goes back as `raw_output_contents`, as
Triton's gRPC server sends it. Inputs may come as `raw_input_contents` or as typed `contents`
(`bytes_contents` for BYTES, `uint_contents` for UINT8).

Errors: a ServiceError becomes a gRPC status (`status_of`): the code from the HTTP status of the one table,
the message as details, the service's own error code in the trailing metadata (`error-code`), and for a
retryable error the retry hint twice: `retry-after` (seconds, as HTTP says it) and `grpc-retry-pushback-ms`
(gRFC A6, which gRPC's own retry policy obeys).
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from typing import Any

import grpc
import numpy as np
from google.protobuf import json_format

from app.config import Limits
from app.errors import RETRY_AFTER_S, ServiceError
from app.protocol import v2
from app.protocol.v2.pb import grpc_service_pb2 as pb

# HTTP status of the one table (`app.errors`) -> gRPC status code.
GRPC_CODES: dict[int, grpc.StatusCode] = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.NOT_FOUND,
    405: grpc.StatusCode.UNIMPLEMENTED,
    408: grpc.StatusCode.DEADLINE_EXCEEDED,
    409: grpc.StatusCode.FAILED_PRECONDITION,
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,  # what gRPC itself answers to a message over its size limit
    414: grpc.StatusCode.RESOURCE_EXHAUSTED,
    415: grpc.StatusCode.INVALID_ARGUMENT,
    422: grpc.StatusCode.INVALID_ARGUMENT,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,  # gRPC's own mapping of HTTP 429 (doc/http-grpc-status-mapping.md)
    503: grpc.StatusCode.UNAVAILABLE,
    500: grpc.StatusCode.INTERNAL,
}
RETRY_PUSHBACK_MS = str(RETRY_AFTER_S * 1000)


def status_of(err: ServiceError) -> tuple[grpc.StatusCode, str, tuple[tuple[str, str], ...]]:
    """(code, details, trailing metadata) for a ServiceError."""
    code = grpc.StatusCode.DEADLINE_EXCEEDED if err.code == "inference_timeout" else GRPC_CODES[err.status]
    trailing: tuple[tuple[str, str], ...] = (("error-code", err.code),)
    if err.retryable:
        trailing += (("retry-after", str(RETRY_AFTER_S)), ("grpc-retry-pushback-ms", RETRY_PUSHBACK_MS))
    return code, err.message, trailing


# --------------------------------------------------------------------------- request


def _value(p: Any) -> Any:
    """An InferParameter's value (its oneof), or None when unset."""
    which = p.WhichOneof("parameter_choice")
    return getattr(p, which) if which else None


def _params(params: Mapping[str, Any]) -> dict[str, Any]:
    return {k: _value(p) for k, p in params.items()}


def request_bytes(msg: pb.ModelInferRequest) -> int:
    """What a request carries in tensor data: the figure the body limit bounds (its raw and typed contents)."""
    n = sum(len(r) for r in msg.raw_input_contents)
    for inp in msg.inputs:
        c = inp.contents
        n += sum(len(b) for b in c.bytes_contents) + 4 * len(c.bytes_contents) + len(c.uint_contents)
    return n


def _contents(inp: Any) -> bytes | None:
    """Typed `contents` as binary tensor data (None: the input has none)."""
    c = inp.contents
    if c.bytes_contents:
        return b"".join(struct.pack("<I", len(b)) + b for b in c.bytes_contents)
    if c.uint_contents:
        values = np.fromiter(c.uint_contents, dtype=np.uint64, count=len(c.uint_contents))
        if values.max() > 255:
            raise ServiceError("invalid_tensor", f"input {inp.name!r}: UINT8 values must be 0..255")
        return values.astype(np.uint8).tobytes()
    for typed in ("bool_contents", "int_contents", "int64_contents", "uint64_contents", "fp32_contents"):
        if getattr(c, typed):
            raise ServiceError("invalid_tensor", f"input {inp.name!r}: {typed} does not fit its datatype")
    return None


def infer_request(msg: pb.ModelInferRequest, limits: Limits, image_size: tuple[int, ...]) -> v2.InferRequest:
    """A ModelInferRequest as the service's InferRequest, through the REST endpoint's own checks."""
    raw = list(msg.raw_input_contents)
    if raw and len(raw) != len(msg.inputs):
        raise ServiceError(
            "bad_request", f"{len(raw)} raw_input_contents for {len(msg.inputs)} inputs: one per input is needed"
        )
    inputs, rest = [], b""
    for i, inp in enumerate(msg.inputs):
        entry: dict[str, Any] = {
            "name": inp.name,
            "datatype": inp.datatype,
            "shape": list(inp.shape),
            "parameters": _params(inp.parameters),
        }
        data = raw[i] if raw else _contents(inp)
        if data is not None:
            entry["parameters"]["binary_data_size"] = len(data)
            rest += data
        inputs.append(entry)
    outputs = [{"name": o.name, "parameters": _params(o.parameters)} for o in msg.outputs]
    doc = {"id": msg.id or None, "parameters": _params(msg.parameters), "inputs": inputs, "outputs": outputs}
    return v2.parse_infer_doc(doc, rest, True, limits, image_size)


# --------------------------------------------------------------------------- response


def _parameter(value: Any) -> pb.InferParameter:
    if isinstance(value, bool):
        return pb.InferParameter(bool_param=value)
    if isinstance(value, int):
        return pb.InferParameter(int64_param=value)
    if isinstance(value, float):
        return pb.InferParameter(double_param=value)
    return pb.InferParameter(string_param=str(value))


def infer_response(
    model_name: str,
    model_version: str,
    request_id: str | None,
    outputs: Mapping[str, np.ndarray | Sequence[Sequence[bytes]]],
    parameters: Mapping[str, Any] | None = None,
) -> pb.ModelInferResponse:
    """The outputs as raw contents, in order, as Triton's gRPC server answers."""
    out = pb.ModelInferResponse(model_name=model_name, model_version=model_version, id=request_id or "")
    for k, value in (parameters or {}).items():
        out.parameters[k].CopyFrom(_parameter(value))
    for name, value in outputs.items():
        arr, datatype, data = v2.binary_tensor(value)
        out.outputs.add(name=name, datatype=datatype, shape=[int(d) for d in arr.shape])
        out.raw_output_contents.append(data)
    return out


def server_metadata(meta: Mapping[str, Any]) -> pb.ServerMetadataResponse:
    return json_format.ParseDict(meta, pb.ServerMetadataResponse())


def model_metadata(meta: Mapping[str, Any]) -> pb.ModelMetadataResponse:
    return json_format.ParseDict(meta, pb.ModelMetadataResponse())


def model_config(config: Mapping[str, Any]) -> pb.ModelConfigResponse:
    """`app.protocol.v2.triton_config`'s dict is the ModelConfig message in its JSON form."""
    return json_format.ParseDict({"config": config}, pb.ModelConfigResponse())


def model_statistics(stats: Mapping[str, Any]) -> pb.ModelStatisticsResponse:
    """`app.pipeline.inferstats`'s `{"model_stats": [...]}` is the message in its JSON form."""
    return json_format.ParseDict(stats, pb.ModelStatisticsResponse())
