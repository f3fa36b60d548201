"""The Open Inference Protocol (KServe V2 / Triton HTTP) for this service: the pure half, no Ray, no server.

The Router's handlers own the transport (reading the body, calling the pipeline, sending the reply); this package
owns the protocol: which paths and model names exist (`names`), what the metadata and health replies say
(`metadata`), how an inference request is parsed and checked (`request`, `parsing`), how a response is encoded
(`encoding`). Every function takes and returns plain values, so the whole protocol is tested without a cluster
against the real, unmodified tritonclient. This module is the package's face (`from app.protocol import v2`);
`triton_config` (Triton's model configuration), `grpc` (the same protocol over gRPC) and `parse_pool` (large
requests parsed in child processes) are imported by name.

What is served (the model names `<name>`, `<name>-int8`, `<name>-fp32`; the inputs `image_bytes` and `image`; the
outputs `logits`, `probabilities`, `top_k` and the classification extension; the extensions listed in the server
metadata; the error object) is the API guide's "Open Inference Protocol (KServe V2)" section, which the tests hold
to it.
"""

from app.protocol.v2.encoding import (
    binary_tensor,
    build_infer_response,
    compute_outputs,
    encode_infer_response,
    top_k_strings,
    top_strings,
)
from app.protocol.v2.metadata import (
    image_hw,
    image_shape,
    model_metadata,
    readiness,
    server_live,
    server_metadata,
    v2_error,
)
from app.protocol.v2.names import (
    BINARY_CONTENT_TYPE,
    DEFAULT_VERSION,
    EXTENSIONS,
    HEADER_LENGTH,
    IMAGE_BYTES_INPUT,
    IMAGE_INPUT,
    INPUT_DATATYPES,
    JSON_CONTENT_TYPE,
    LOGITS,
    MODEL_PATH,
    OUTPUTS,
    PLATFORM,
    PROBABILITIES,
    SERVER_NAME,
    TOP_K,
    is_v2_path,
    match_v2_path,
    model_name_for,
    model_names,
    resolve_model,
)
from app.protocol.v2.parsing import decompress_body, parse_header_length, parse_infer_doc, parse_infer_request
from app.protocol.v2.request import InferRequest, RequestedOutput

__all__ = [
    "BINARY_CONTENT_TYPE",
    "DEFAULT_VERSION",
    "EXTENSIONS",
    "HEADER_LENGTH",
    "IMAGE_BYTES_INPUT",
    "IMAGE_INPUT",
    "INPUT_DATATYPES",
    "JSON_CONTENT_TYPE",
    "LOGITS",
    "MODEL_PATH",
    "OUTPUTS",
    "PLATFORM",
    "PROBABILITIES",
    "SERVER_NAME",
    "TOP_K",
    "InferRequest",
    "RequestedOutput",
    "binary_tensor",
    "build_infer_response",
    "compute_outputs",
    "decompress_body",
    "encode_infer_response",
    "image_hw",
    "image_shape",
    "is_v2_path",
    "match_v2_path",
    "model_metadata",
    "model_name_for",
    "model_names",
    "parse_header_length",
    "parse_infer_doc",
    "parse_infer_request",
    "readiness",
    "resolve_model",
    "server_live",
    "server_metadata",
    "top_k_strings",
    "top_strings",
    "v2_error",
]
