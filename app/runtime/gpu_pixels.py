"""`decode_in: gpu`, the Classifier's half: the encoded images of one engine batch -> the model's pixels per request.

The Router sends a Classifier encoded bytes (app.imaging.payloads.Encoded), header-checked there; every request of one
engine batch is decoded by ONE `BatchDecode` call (app/imaging/gpu_decode.py: the limits again, then JPEGs to the
device decoder, everything else and whatever the device declines to the CPU path). A device image then goes through
the model's declared transform (`ImageTransform`: the transform graph on ORT's CUDA EP, fed by device pointer and
ordered on the decoder's stream, app/runtime/cuda_transform.py); an image whose device transform fails takes the CPU
path instead (counted as a fallback), so a GPU-side failure never fails an image the CPU path can serve. Out come, per
request, `Pixels` exactly as a Preprocessor would have answered: the rows of the images that decoded, the per-image
`ServiceError`s by position (the same codes and statuses as the CPU path), and the batch's decode time.

Pure of CUDA: the decoder and the transform are injected (tests: app/imaging/standin_decoder.py and the transform
graph on the CPU EP).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from app.errors import ServiceError
from app.imaging.gpu_decode import COUNTS, BatchDecode, Decoded
from app.imaging.payloads import Pixels

logger = logging.getLogger(__name__)


class ImageTransform(Protocol):
    """The declared transform of one decoded image (the device decoder's kind of image) -> uint8 [1, h, w, C]."""

    def __call__(self, image: Any, /) -> np.ndarray: ...


class GpuPixels:
    """Encoded requests -> `Pixels` per request; `totals`: where every image so far was decoded (gpu_decode.COUNTS,
    plus `transform_fallback`: device images whose transform failed, decoded again by the CPU path)."""

    def __init__(self, decode: BatchDecode[Any], transform: ImageTransform) -> None:
        self.decode = decode
        self.transform = transform
        self.shape = decode.transform.shape
        self.totals: Counter[str] = Counter(dict.fromkeys((*COUNTS, "transform_fallback"), 0))
        self._lock = threading.Lock()  # batches may run in parallel (max_concurrent_batches)

    def __call__(self, requests: Sequence[Sequence[bytes]]) -> tuple[list[Pixels], dict[str, int]]:
        """Per request its Pixels; and where this call's images were decoded (for the metrics)."""
        started = time.perf_counter()
        flat = [bytes(image) for request in requests for image in request]
        result = self.decode(flat)
        counts: Counter[str] = Counter(result.counts)
        rows = [self._pixels(data, d, counts) for data, d in zip(flat, result.images, strict=True)]
        with self._lock:
            self.totals.update(counts)
        decode_ms = round((time.perf_counter() - started) * 1000.0, 3)
        out, start = [], 0
        for request in requests:
            mine = rows[start : start + len(request)]
            start += len(request)
            good = [(i, r) for i, r in enumerate(mine) if isinstance(r, np.ndarray)]
            array = np.stack([r for _, r in good]) if good else np.zeros((0, *self.shape), np.uint8)
            errors = {i: r for i, r in enumerate(mine) if isinstance(r, ServiceError)}
            out.append(Pixels(array, decode_ms, errors, [i for i, _ in good]))
        return out, dict(counts)

    def counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self.totals)

    def reset_counts(self) -> None:
        """From zero again (after the warm-up's batch: /v1/models counts what requests brought, as the metric does)."""
        with self._lock:
            self.totals = Counter(dict.fromkeys(self.totals, 0))

    def _pixels(self, data: bytes, d: Decoded[Any], counts: Counter[str]) -> np.ndarray | ServiceError:
        """One image's model pixels [h, w, C], or its ServiceError."""
        if d.error is not None:
            return d.error
        if d.pixels is not None:
            return d.pixels
        try:
            out = self.transform(d.device)
            if out.shape[1:] != self.shape or out.dtype != np.uint8:
                raise RuntimeError(f"the transform gave {out.dtype} {out.shape}, not uint8 {(1, *self.shape)}")
            return out[0]
        except Exception:
            logger.warning(
                "the GPU transform of a %s-decoded image failed; the CPU path decodes it", d.where, exc_info=True
            )
        counts[d.where] -= 1
        counts["transform_fallback"] += 1
        again = self.decode.cpu(data)
        counts[again.where] += 1
        if again.error is not None:
            return again.error
        assert again.pixels is not None
        return again.pixels


__all__ = ["GpuPixels", "ImageTransform"]
