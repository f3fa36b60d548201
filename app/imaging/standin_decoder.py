"""A host stand-in for the GPU's JPEG decoder: `decode_in: gpu`'s whole path on a machine without a CUDA device.

nvImageCodec cannot decode anything without one (`app.imaging.nvimgcodec_decoder`), so CI and a laptop run the
Classifier's GPU decode path (`app.runtime.gpu_pixels`: the batch, the per-image CPU fallback, the counts, the
transform graph) with this `DeviceDecoder` instead: OpenCV decodes each JPEG at full size into RGB host memory, as
nvImageCodec decodes into device memory, and every image it decodes is counted as the hardware decoder's. Chosen only
by the environment variable APP_GPU_DECODER=standin in the Classifier's process (`app.runtime.cuda_transform`), never
by a config key: it is a test seam, not a way to serve.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from app.imaging.gpu_decode import DeviceBackend
from app.imaging.opencv import cv2


class HostJpegDecoder:
    """A DeviceDecoder whose "device" is host memory: uint8 RGB [H, W, 3] numpy arrays, EXIF orientation applied."""

    def __init__(self, max_pixels: int = 4096 * 4096) -> None:
        self._max_pixels = max_pixels

    @property
    def max_pixels(self) -> int:
        return self._max_pixels

    def decode(self, images: Sequence[bytes]) -> list[tuple[np.ndarray, DeviceBackend] | None]:
        out: list[tuple[np.ndarray, DeviceBackend] | None] = []
        for data in images:
            bgr = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
            out.append(None if bgr is None else (np.ascontiguousarray(bgr[..., ::-1]), "hardware"))
        return out


__all__ = ["HostJpegDecoder"]
