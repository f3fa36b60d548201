"""What the protocol says about the server and its models: the health replies, the server and model metadata, the
`image` input's size read from a Classifier's spec, and the protocol's error object."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from app.errors import STATUS, ServiceError
from app.protocol.v2.names import (
    EXTENSIONS,
    IMAGE_BYTES_INPUT,
    IMAGE_INPUT,
    INPUT_DATATYPES,
    LOGITS,
    PLATFORM,
    PROBABILITIES,
    SERVER_NAME,
    TOP_K,
)

# --------------------------------------------------------------------------- health


def server_live() -> dict[str, bool]:
    """GET /v2/health/live: the protocol's `{"live": true}`. Triton answers an empty body, which tritonclient
    accepts as it reads only the status; KServe's clients read the body."""
    return {"live": True}


def readiness(ready: bool, model: str | None = None) -> dict[str, Any]:
    """GET /v2/health/ready: `{"ready": bool}`; GET /v2/models/{name}/ready: `{"name": name, "ready": bool}`.
    200 when ready, else 503 (the status is what Triton's clients read, the body what KServe's read)."""
    return {"ready": ready} if model is None else {"name": model, "ready": ready}


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
            # [-1, 1], as Triton reports a batching model's dims [1] (`app.protocol.v2.triton_config`): its tools size
            # a request from it (perf_analyzer refuses an input with no dimension past the batch). [N] is taken as well.
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
