"""What the classifying baselines share: model files, labels, top-k replies, request parsing, errors.

Replies follow the app's contract: {"request_id", "variant", "model", "predictions", "timings_ms"}, and
errors are {"error": {"code", "message"}} with the status from app.errors.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from app import guards
from app.errors import ServiceError
from app.models import MODEL_NAME, ModelFiles, default_files
from app.preprocess import preprocess
from app.runtime import OrtEngine, RuntimeOptions, onnxruntime_engine, softmax
from benchmarks import multipart

DEFAULT_VARIANT = "fp32"
MAX_TOP_K = 20


@dataclass(frozen=True)
class Classified:
    """One image's result before it becomes a reply."""

    variant: str
    probabilities: np.ndarray
    decode_ms: float
    inference_ms: float
    batch_size: int


def model_paths(files: ModelFiles | None = None) -> dict[str, str]:
    files = files or default_files()
    return {"fp32": str(files.fp32), "int8": str(files.int8)}


def load_runners(opts: RuntimeOptions, files: ModelFiles | None = None) -> dict[str, OrtEngine]:
    return {name: onnxruntime_engine(path, opts) for name, path in model_paths(files).items()}


def load_labels(files: ModelFiles | None = None) -> list[str]:
    path = (files or default_files()).labels
    if not path.is_file():
        raise FileNotFoundError(f"labels not found: {path} (run `python -m app.models build`)")
    return path.read_text().splitlines()


def choose_variant(headers: Mapping[str, str], available: Mapping[str, Any]) -> str:
    wanted = headers.get("x-model-variant") or DEFAULT_VARIANT
    if wanted not in available:
        raise ServiceError("unknown_variant", f"variant {wanted!r} is not served; choose one of {sorted(available)}")
    return wanted


def parse_top_k(raw: str | None) -> int:
    """The app's own rule (app.guards.parse_top_k): the peers answer `?top_k=` exactly as the app does."""
    return guards.parse_top_k(raw, 5, MAX_TOP_K)


def request_images(body: bytes, content_type: str, many: bool) -> list[bytes]:
    """The image bytes of a request: the raw body, or the multipart `file` part(s)."""
    try:
        found = multipart.files(body, content_type)
    except multipart.MultipartError as e:
        raise ServiceError("bad_multipart", str(e)) from e
    if multipart.boundary_of(content_type) is None:
        if many:
            raise ServiceError("unsupported_media_type", "the batch endpoint takes multipart/form-data `file` parts")
        if not body:
            raise ServiceError("empty_body", "the request carried no image bytes")
        return [body]
    if not found:
        raise ServiceError("missing_file", "multipart body has no `file` part")
    return found if many else found[:1]


def decode(data: bytes, size: int) -> np.ndarray:
    return preprocess(data, size)


def predictions(probs: np.ndarray, labels: list[str], top_k: int) -> list[dict[str, Any]]:
    top = np.argsort(-probs)[:top_k]
    return [{"class_id": int(i), "label": labels[i], "score": round(float(probs[i]), 6)} for i in top]


def reply(result: Classified, labels: list[str], top_k: int, total_ms: float) -> dict[str, Any]:
    return {
        "request_id": uuid.uuid4().hex,
        "variant": result.variant,
        "model": MODEL_NAME,
        "predictions": predictions(result.probabilities, labels, top_k),
        "timings_ms": {
            "decode": round(result.decode_ms, 3),
            "inference": round(result.inference_ms, 3),
            "total": round(total_ms, 3),
            "batch_size": result.batch_size,
        },
    }


def error_reply(e: ServiceError) -> tuple[int, dict[str, Any], dict[str, str]]:
    """(status, body, headers) for a ServiceError."""
    return e.status, e.body(), e.headers()


def internal_error(e: Exception) -> ServiceError:
    """An unexpected failure reported as a retryable 503, never a bare 500."""
    return ServiceError("replica_failed", f"{type(e).__name__}: {e}")


def infer(runner: OrtEngine, images: list[np.ndarray]) -> np.ndarray:
    """Probabilities [n, classes] for preprocessed images."""
    return softmax(runner.logits(np.stack(images)).astype(np.float32))
