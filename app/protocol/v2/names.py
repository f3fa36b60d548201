"""The protocol's names for this service: its constants, the V2 model names (one per way of choosing a variant,
`model_name_for`) and the paths it serves (`match_v2_path`)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from app.errors import ServiceError

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
            raise ServiceError("method_not_allowed", f"{method} is not allowed on {path}; use {want}", allow=want)
        params = {k: v or "" for k, v in m.groupdict().items()}
        return handler, params
    return None
