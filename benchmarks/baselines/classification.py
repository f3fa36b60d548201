"""What the classifying peers share: the models, and the app's own request reading (app.http.inputs with the
default app.config.Limits) and top-k (app.served_model.outputs), so every server in a comparison answers a request
the same way. Replies: {"variant", "model", "predictions", "timings_ms"}, {"results": [...]} for a batch (a bad
image fails alone); errors: {"error": {"code", "message"}} with app.errors' status.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from starlette.requests import Request
from starlette.responses import JSONResponse

from app.config import Limits
from app.errors import ServiceError
from app.http import inputs
from app.imaging.preprocess import preprocess
from app.runtime import onnxruntime_engine
from app.served_model import MODEL_NAME, ModelFiles, builtin_transform, default_files, outputs
from benchmarks.device import runtime_options

LIMITS = Limits()
DEFAULT_VARIANT = "fp32"


class Models:
    """Both variants' ONNX Runtime sessions, loaded once (not per request), and the labels."""

    def __init__(self, device: str = "auto", threads: int | None = None, files: ModelFiles | None = None) -> None:
        files, opts = files or default_files(), runtime_options(device, threads)
        self.runners = {"fp32": onnxruntime_engine(files.fp32, opts), "int8": onnxruntime_engine(files.int8, opts)}
        self.labels = files.labels.read_text().splitlines()
        # What the app serves the built-in model (configs/local.yaml's declaration), so every peer does its work.
        self.transform = builtin_transform(self.runners[DEFAULT_VARIANT].spec.height)

    def health(self) -> dict[str, Any]:
        providers, threads = {v: r.active_provider for v, r in self.runners.items()}, self.runners["fp32"].opts.threads
        return {"status": "ok", "model": MODEL_NAME, "providers": providers, "threads": threads}


@dataclass(frozen=True)
class Asked:
    variant: str
    top_k: int
    images: list[bytes]
    many: bool  # /v1/classify/batch


def read_request(request: Request, body: bytes, many: bool, variants: Sequence[str]) -> Asked:
    """/v1/classify (raw image or one multipart `file`) or /v1/classify/batch (`file` parts), by the app's rules."""
    top_k = inputs.top_k(request.query_params.get("top_k"), LIMITS)
    variant = request.headers.get("x-model-variant") or DEFAULT_VARIANT
    if variant not in variants:
        raise ServiceError("unknown_variant", f"variant {variant!r} is not served; choose one of {sorted(variants)}")
    if len(body) > LIMITS.max_body_bytes:
        raise ServiceError("payload_too_large", f"{len(body)} bytes; the limit is {LIMITS.max_body_bytes}")
    content_type = request.headers.get("content-type")
    if not many:
        return Asked(variant, top_k, [inputs.single_image(body, content_type)], many)
    inputs.check_batch_media(content_type)
    return Asked(variant, top_k, inputs.multipart_images(body, content_type or "", LIMITS.max_batch_files), many)


@dataclass(frozen=True)
class Classified:
    variant: str
    probabilities: np.ndarray
    batch_size: int


def classify(models: Models, items: Sequence[tuple[bytes, str]]) -> list[Classified | ServiceError]:
    """(image, variant) pairs: each decoded, then one inference call per variant; a bad image fails alone."""
    out: list[Classified | ServiceError] = [ServiceError("replica_failed", "not classified")] * len(items)
    groups: dict[str, list[tuple[int, np.ndarray]]] = {}
    for i, (data, variant) in enumerate(items):
        try:
            groups.setdefault(variant, []).append((i, preprocess(data, models.transform)))
        except ServiceError as e:
            out[i] = e
    for variant, group in groups.items():
        try:
            logits = models.runners[variant].logits(np.stack([tensor for _, tensor in group]))
            for (i, _), p in zip(group, outputs.softmax(logits.astype(np.float32)), strict=True):
                out[i] = Classified(variant, p, len(group))
        except Exception as e:
            for i, _ in group:
                out[i] = ServiceError("replica_failed", f"{type(e).__name__}: {e}")
    return out


def answer(asked: Asked, results: list[Classified | ServiceError], labels: list[str], start: float) -> JSONResponse:
    """The reply to a request whose images gave `results`; a single image's error is raised."""

    def entry(r: Classified | ServiceError) -> dict[str, Any]:
        if isinstance(r, ServiceError):
            if asked.many:
                return r.body()
            raise r
        top = outputs.top_k(r.probabilities, asked.top_k)
        return {
            "variant": r.variant,
            "model": MODEL_NAME,
            "predictions": [{"class_id": c, "label": labels[c], "score": round(p, 6)} for c, p in top],
            "timings_ms": {"total": round((time.perf_counter() - start) * 1000, 3), "batch_size": r.batch_size},
        }

    body = {"results": [entry(r) for r in results]} if asked.many else entry(results[0])
    return JSONResponse(body, headers={"X-Model-Variant": asked.variant})


async def error_response(_: Any, e: Exception) -> JSONResponse:
    """Any failure as the app reports it; an unexpected one as a retryable 503, never a bare 500."""
    err = e if isinstance(e, ServiceError) else ServiceError("replica_failed", f"{type(e).__name__}: {e}")
    return JSONResponse(err.body(), status_code=err.status, headers=err.headers())
