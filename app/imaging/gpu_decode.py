"""A batch's JPEGs decoded on the GPU in one call, everything else (and whatever the GPU declines) by the CPU path.

`decode_in: gpu`: a Classifier's batch goes through `BatchDecode`. Every image first passes `check_header` (the pixel
limit and the decode budget, `app.imaging.preprocess`): a refused image never reaches the device. The JPEGs the device
takes go to the injected `DeviceDecoder` in ONE call (`app.imaging.nvimgcodec_decoder`: nvImageCodec's hardware
decoder, then its hybrid CUDA decoder); the rest go to `preprocess`, so the CPU path's pixels, errors and status codes
come out unchanged. Which images the CPU path takes (`cpu_reason`), from what the probe (`app.imaging.probe`) reads:
  not a JPEG                  nvImageCodec's GPU decoders here decode JPEG only;
  4 components (CMYK, YCCK)   decoded as OpenCV decodes them, so the model sees the colours it was calibrated on;
  more than 8 bits            12-bit JPEGs: OpenCV's 16-bit result, converted as the CPU path converts it;
  buffered (decoder_bytes)    progressive, or sequential in several scans: the hardware decoder declines progressive
                              (nvjpegDecodeBatchedSupported, extensions/nvjpeg/hw_decoder.cpp); the probe does not
                              tell the two apart, so both go to the CPU;
  over the device's max_pixels larger than the GPU memory preallocated at warm-up, which is never grown for one request.
Chroma subsampling (4:1:1, 4:1:0, which the hardware declines) the probe reads but ImageInfo does not carry: those reach
the device, whose hybrid decoder takes them. Then, per image, the CPU path also takes what the device returned None for
(declined or failed). An exception from the device for the whole call (or an answer of the wrong length) is logged and
counted, and the whole batch takes the CPU path: a GPU decode error never fails a request that the CPU could serve.

Where decoding ran is counted per batch and in total: hardware, hybrid, cpu, failed (no pixels: the header check's or
the CPU path's ServiceError), fallback (meant for the device, decoded by the CPU path), device_errors (whole calls).
Pure Python and numpy: nvImageCodec is never imported here; tests run the logic with a stand-in decoder.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable, Sequence
from concurrent.futures import Executor, Future
from dataclasses import dataclass, field
from typing import Generic, Literal, Protocol, TypeVar

import numpy as np

from app.errors import ServiceError
from app.imaging.decode_cost import DEFAULT_MAX_DECODE_BYTES
from app.imaging.opencv import DEFAULT_MAX_PIXELS
from app.imaging.preprocess import check_header, preprocess
from app.imaging.probe import ImageInfo
from app.imaging.transform import Transform

logger = logging.getLogger(__name__)

ImageT = TypeVar("ImageT")
ImageT_co = TypeVar("ImageT_co", covariant=True)
DeviceBackend = Literal["hardware", "hybrid"]
Where = Literal["hardware", "hybrid", "cpu", "failed"]
COUNTS = ("hardware", "hybrid", "cpu", "failed", "fallback", "device_errors")


class DeviceDecoder(Protocol[ImageT_co]):
    """What the batch logic needs of a GPU JPEG decoder (nvImageCodec in production, a stand-in in tests)."""

    @property
    def max_pixels(self) -> int:
        """The largest image (width x height) its preallocated GPU memory is sized for; larger ones go to the CPU."""
        ...

    def decode(self, images: Sequence[bytes]) -> Sequence[tuple[ImageT_co, DeviceBackend] | None]:
        """Decode encoded JPEGs in one call: per image, in order, (uint8 RGB [H, W, 3] on the device, full size, EXIF
        orientation applied; the backend that decoded it), or None where every device backend declined or failed."""
        ...


@dataclass(frozen=True)
class Decoded(Generic[ImageT]):
    """One image of a batch: decoded on the device (`device`, for the transform graph), by the CPU path (`pixels`: the
    model's pixels, transform applied) or not at all (`error`: what `preprocess` raises for it)."""

    where: Where
    device: ImageT | None = None
    pixels: np.ndarray | None = None
    error: ServiceError | None = None


@dataclass(frozen=True)
class BatchResult(Generic[ImageT]):
    images: list[Decoded[ImageT]]
    counts: dict[str, int] = field(default_factory=dict)  # every key of COUNTS


def cpu_reason(info: ImageInfo, max_device_pixels: int) -> str:
    """Why an image that passed the header check goes to the CPU path instead of the device; "" if the device takes
    it (see the module's docstring)."""
    if info.format != "jpeg":
        return f"a {info.format} image"
    if info.channels == 4:
        return "a CMYK or YCCK JPEG"
    if info.sample_bytes > 1:
        return "a JPEG of more than 8 bits per sample"
    if info.decoder_bytes > 0:
        return "a progressive or multi-scan JPEG"
    if info.width * info.height > max_device_pixels:
        return f"a JPEG over the device's {max_device_pixels} pixels"
    return ""


class BatchDecode(Generic[ImageT]):
    """A batch of encoded images -> per image the device's image, the CPU path's pixels or its ServiceError; counted.

    `executor`: where the CPU path's decodes run (a thread pool of the replica's CPUs), overlapping the device call;
    None: in the calling thread. `totals`: the counts of every batch so far (for metrics).
    """

    def __init__(
        self,
        device: DeviceDecoder[ImageT],
        transform: Transform,
        max_pixels: int = DEFAULT_MAX_PIXELS,
        max_decode_bytes: int = DEFAULT_MAX_DECODE_BYTES,
        reduced: bool = True,
        executor: Executor | None = None,
    ) -> None:
        self.device = device
        self.transform = transform
        self.max_pixels = max_pixels
        self.max_decode_bytes = max_decode_bytes
        self.reduced = reduced
        self.executor = executor
        self.totals: Counter[str] = Counter(dict.fromkeys(COUNTS, 0))

    def __call__(self, images: Sequence[bytes]) -> BatchResult[ImageT]:
        counts: Counter[str] = Counter(dict.fromkeys(COUNTS, 0))
        out: list[Decoded[ImageT] | None] = [None] * len(images)
        target = self.transform.decode_target if self.reduced else None
        to_device: list[int] = []
        to_cpu: list[int] = []
        for i, data in enumerate(images):
            try:  # the limits, before any decoder: what the header check refuses never reaches the device
                info, _ = check_header(bytes(data), self.max_pixels, target, self.max_decode_bytes)
            except ServiceError as e:
                out[i] = Decoded("failed", error=e)
                continue
            (to_cpu if cpu_reason(info, self.device.max_pixels) else to_device).append(i)
        pending = self._start_cpu(images, to_cpu)  # overlaps the device call when there is an executor
        declined = self._on_device(images, to_device, out, counts)
        counts["fallback"] += len(declined)
        pending += self._start_cpu(images, declined)
        for i, result in pending:
            out[i] = result.result() if isinstance(result, Future) else result
        final = [d for d in out if d is not None]
        assert len(final) == len(images)
        counts.update(d.where for d in final)
        self.totals.update(counts)
        return BatchResult(final, dict(counts))

    def _on_device(
        self, images: Sequence[bytes], indices: list[int], out: list[Decoded[ImageT] | None], counts: Counter[str]
    ) -> list[int]:
        """One device call for `indices`; fills `out` with what it decoded. The indices the CPU path must take."""
        if not indices:
            return []
        try:
            answers = self.device.decode([bytes(images[i]) for i in indices])
            if len(answers) != len(indices):
                raise RuntimeError(f"{len(answers)} results for {len(indices)} images")
        except Exception:
            logger.warning("GPU decode of %d JPEG(s) failed; the CPU path decodes them", len(indices), exc_info=True)
            counts["device_errors"] += 1
            return indices
        declined = []
        for i, answer in zip(indices, answers, strict=True):
            if answer is None:
                declined.append(i)
            else:
                out[i] = Decoded(answer[1], device=answer[0])
        return declined

    def _start_cpu(
        self, images: Sequence[bytes], indices: Iterable[int]
    ) -> list[tuple[int, Decoded[ImageT] | Future[Decoded[ImageT]]]]:
        if self.executor is None:
            return [(i, self.cpu(images[i])) for i in indices]
        return [(i, self.executor.submit(self.cpu, images[i])) for i in indices]

    def cpu(self, data: bytes) -> Decoded[ImageT]:
        """The CPU path: `preprocess`, its pixels or its ServiceError (any other exception is a bug: it propagates)."""
        try:
            pixels = preprocess(data, self.transform, self.max_pixels, self.reduced, self.max_decode_bytes)
        except ServiceError as e:
            return Decoded("failed", error=e)
        return Decoded("cpu", pixels=pixels)


__all__ = ["COUNTS", "BatchDecode", "BatchResult", "Decoded", "DeviceBackend", "DeviceDecoder", "cpu_reason"]
