"""The Open Inference Protocol (KServe V2 / Triton HTTP) for this service: the pure half, no Ray, no server.

The Router owns the HTTP side (reading the body, calling the deployments,
sending the reply); this package owns the protocol: which paths exist, what the
metadata says, how an inference request is parsed and checked, how a response
is encoded. Every function here takes and returns plain values, so the whole
protocol is tested without a cluster against the real, unmodified tritonclient.

This module is the package's face: `from app.protocol import v2`, then `v2.parse_infer_request(...)`. One
concept a module:

    names.py          the constants, the V2 model names and their resolution, the path grammar (`MODEL_PATH`,
                      `match_v2_path`)
    metadata.py       the health replies, server and model metadata, the `image` input's size, the protocol's
                      error object
    request.py        the parsed request (`InferRequest`, `RequestedOutput`)
    parsing.py        a request's JSON and binary tensor data -> `InferRequest`, every check and limit
    encoding.py       the requested outputs (top-k strings included) and the response, JSON or binary
    triton_config.py  Triton's model configuration (`GET /v2/models/{name}/config`)
    grpc.py           the same protocol over gRPC, from and to Triton's messages
    parse_pool.py     large requests parsed in child processes, so the event loop never waits on them

The last three are imported by name (`from app.protocol.v2 import grpc`), not through this face.

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
(triton_config.py) and `statistics` (app/pipeline/inferstats.py), which Triton's tools
(perf_analyzer) need. Not implemented: shared memory (refused with 400),
sequences, model repository, trace, logging.

Errors are `{"error": "<message>"}` (the protocol's error object) with the
status from `app.errors.STATUS`, like every other failure of the service.
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
