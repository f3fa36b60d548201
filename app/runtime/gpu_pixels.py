"""`decode_in: gpu`, the Classifier's half: the encoded images of one engine batch -> the model's pixels per request.

The Router sends a Classifier encoded bytes (app.imaging.payloads.Encoded), header-checked there; every request of one
engine batch is decoded by ONE `BatchDecode` call (`app.imaging.gpu_decode`: the limits again, then JPEGs to the
device decoder, everything else and whatever the device declines to the CPU path). A device image then goes through
the model's declared transform (`ImageTransform`: the transform graph on ORT's CUDA EP, fed by device pointer and
ordered on the decoder's stream, `app.runtime.cuda_transform`); an image whose device transform fails takes the CPU
path instead (counted as a fallback), so a GPU-side failure never fails an image the CPU path can serve. Out come, per
request, `Pixels` exactly as a Preprocessor would have answered: the rows of the images that decoded, the per-image
`ServiceError`s by position (the same codes and statuses as the CPU path), and the batch's decode time.

The device mode (`into`): the same decode, but every image's pixels go into a row of ONE `DeviceBatch`
(`app.runtime.device_batch`), the engine's input buffer: the transform writes a device image's row in place
(`transform.into`, its output bound by pointer), a CPU-decoded image is copied up into its row. Rows are claimed in
batch order by the images the decode did not refuse; one whose transform fails and whose CPU decode then fails too
leaves its row a hole (the engine runs it, its logits are never read). Per request a `DeviceRows`: the same facts as
`Pixels`, and the row of each of its images instead of an array.

Pure of CUDA: the decoder and the transform are injected (tests: `app.imaging.standin_decoder` and the transform
graph on the CPU EP).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import numpy as np

from app.errors import ServiceError
from app.imaging.gpu_decode import COUNTS, BatchDecode, Decoded
from app.imaging.payloads import Pixels

if TYPE_CHECKING:
    from app.runtime.device_batch import DeviceBatch

logger = logging.getLogger(__name__)
T = TypeVar("T")


class ImageTransform(Protocol):
    """The declared transform of one decoded image (the device decoder's kind of image) -> uint8 [1, h, w, C]."""

    def __call__(self, image: Any, /) -> np.ndarray: ...


class DeviceTransform(ImageTransform, Protocol):
    """An ImageTransform that also writes its uint8 [1, h, w, C] output in place: at `ptr`, a DeviceBatch's row."""

    def into(self, image: Any, ptr: int, /) -> None: ...


@dataclass
class DeviceRows:
    """The device mode's answer for one request: its images' rows in the DeviceBatch (rows[j]: the image at
    positions[j]), its errors by position, and the batch's decode time (`preprocess_ms`, as `Pixels` names it)."""

    rows: list[int]
    preprocess_ms: float
    errors: dict[int, ServiceError]
    positions: list[int]


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

        def pixels(mine: list[Any], decode_ms: float) -> Pixels:
            good = [(i, r) for i, r in enumerate(mine) if isinstance(r, np.ndarray)]
            array = np.stack([r for _, r in good]) if good else np.zeros((0, *self.shape), np.uint8)
            errors = {i: r for i, r in enumerate(mine) if isinstance(r, ServiceError)}
            return Pixels(array, decode_ms, errors, [i for i, _ in good])

        return self._decoded(requests, self._pixels, pixels)

    @property
    def writes_in_place(self) -> bool:
        """Whether the transform can write into a DeviceBatch's row (`DeviceTransform`)."""
        return callable(getattr(self.transform, "into", None))

    def into(self, requests: Sequence[Sequence[bytes]], batch: DeviceBatch) -> tuple[list[DeviceRows], dict[str, int]]:
        """The device mode: every image that decodes into the next row of `batch`; per request its DeviceRows, and
        where this call's images were decoded."""

        def fill(data: bytes, d: Decoded[Any], counts: Counter[str]) -> int | ServiceError:
            return d.error if d.error is not None else self._fill(data, d, counts, batch)

        def rows(mine: list[Any], decode_ms: float) -> DeviceRows:
            placed = [(i, r) for i, r in enumerate(mine) if isinstance(r, int)]
            errors = {i: r for i, r in enumerate(mine) if isinstance(r, ServiceError)}
            return DeviceRows([r for _, r in placed], decode_ms, errors, [i for i, _ in placed])

        return self._decoded(requests, fill, rows)

    def _decoded(
        self,
        requests: Sequence[Sequence[bytes]],
        fate: Callable[[bytes, Decoded[Any], Counter[str]], Any],
        answer: Callable[[list[Any], float], T],
    ) -> tuple[list[T], dict[str, int]]:
        """One decode call for every image of the batch; `fate` each image's (pixels, row or ServiceError), `answer`
        each request's from its images' fates and the batch's decode time."""
        started = time.perf_counter()
        flat = [bytes(image) for request in requests for image in request]
        result = self.decode(flat)
        counts: Counter[str] = Counter(result.counts)
        fates = [fate(data, d, counts) for data, d in zip(flat, result.images, strict=True)]
        with self._lock:
            self.totals.update(counts)
        decode_ms = round((time.perf_counter() - started) * 1000.0, 3)
        out, start = [], 0
        for request in requests:
            out.append(answer(fates[start : start + len(request)], decode_ms))
            start += len(request)
        return out, dict(counts)

    def counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self.totals)

    def reset_counts(self) -> None:
        """From zero again (after the warm-up's batch: /v1/models counts what requests brought, as the metric does)."""
        with self._lock:
            self.totals = Counter(dict.fromkeys(self.totals, 0))

    def _fill(self, data: bytes, d: Decoded[Any], counts: Counter[str], batch: DeviceBatch) -> int | ServiceError:
        """One decoded image into the batch's next row: its row, or the ServiceError of a hole."""
        row = batch.claim()
        if d.pixels is not None:
            batch.upload(row, d.pixels)
            return row
        try:
            self.transform.into(d.device, batch.row_ptr(row))  # type: ignore[attr-defined]
            return row
        except Exception:
            logger.warning(
                "the GPU transform of a %s-decoded image failed; the CPU path decodes it", d.where, exc_info=True
            )
        again = self._again(data, d, counts)
        if isinstance(again, ServiceError):
            return again
        batch.upload(row, again)
        return row

    def _again(self, data: bytes, d: Decoded[Any], counts: Counter[str]) -> np.ndarray | ServiceError:
        """A device image whose transform failed, decoded by the CPU path (counted as a transform_fallback)."""
        counts[d.where] -= 1
        counts["transform_fallback"] += 1
        again = self.decode.cpu(data)
        counts[again.where] += 1
        if again.error is not None:
            return again.error
        assert again.pixels is not None
        return again.pixels

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
        return self._again(data, d, counts)


__all__ = ["DeviceRows", "DeviceTransform", "GpuPixels", "ImageTransform"]
