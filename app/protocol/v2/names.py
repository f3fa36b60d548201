"""The protocol's names for this service: its constants, the V2 model names (one per way of choosing a variant,
`model_name_for`) and its path grammar: the model paths (`MODEL_PATH`) and their matching (`match_v2_path`, on the
route table's V2 paths)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TypeVar

from app.errors import ServiceError
from app.protocol.paths import PathTable

T = TypeVar("T")

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

PREFIX = "/v2"  # every path under it is the protocol's (its 404 and 405 in the protocol's error shape)
MODEL_PATH = "/v2/models/{model}[/versions/{version}]"  # a model's paths: its name, optionally its version


def is_v2_path(path: str) -> bool:
    return path.startswith(PREFIX)


def match_v2_path(method: str, path: str, paths: PathTable[T]) -> tuple[T, dict[str, str]] | None:
    """Map a request to its entry in `paths` (the route table's V2 paths, `app.http.routes`) and its path
    parameters.

    Model paths (`MODEL_PATH`) give {"model": name, "version": v or ""}; a literal path such as
    `/v2/models/stats` (every model) gives {}. None: not a V2 path. A V2 path with the wrong method raises
    ServiceError("method_not_allowed") (405), with Allow.
    """
    if path != "/":
        path = path.rstrip("/")
    found = paths.resource(path)
    if found is None:
        return None
    methods, params = found
    if method.upper() not in methods:
        want = ", ".join(methods)
        raise ServiceError("method_not_allowed", f"{method} is not allowed on {path}; use {want}", allow=want)
    return methods[method.upper()], params
