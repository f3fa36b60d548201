"""OpenCV, loaded once with the service's settings in force: import cv2 from here, never directly, in app/.

OpenCV's own pixel guard is a second line behind the header probe (`app.imaging.probe`, applied by
`app.imaging.preprocess`). OpenCV reads it in a static initializer when its library loads, i.e. at the first
`import cv2` anywhere in the process, so it is set just before that import; `opencv_pixel_guard_active` checks
that it took (a warning at import if not). `OPENCV_MAX_PIXELS` and `OPENCV_MAX_SIDE` are the limits OpenCV
itself enforces, as the environment sets them.
"""

from __future__ import annotations

import logging
import os
import struct
import zlib
from functools import cache

import numpy as np

logger = logging.getLogger(__name__)

DEFAULT_MAX_PIXELS = 40_000_000
os.environ.setdefault("OPENCV_IO_MAX_IMAGE_PIXELS", str(DEFAULT_MAX_PIXELS))

import cv2  # noqa: E402

# Keep OpenCV from spawning its own thread pool inside a replica that owns a fraction of a core.
cv2.setNumThreads(1)

# OpenCV logs every undecodable input at ERROR level ("imdecode_(''): can't read header",
# TIFF_Error ...): one or more stderr lines per bad request. Only FATAL is left on, unless
# the operator chose a level with OPENCV_LOG_LEVEL (e.g. DEBUG, to look at a bad input).
# libjpeg's "Corrupt JPEG data: ..." and libpng's "libpng error: ..." are printed by
# those libraries straight to fd 2, past OpenCV's logger; no OpenCV setting reaches them.
if "OPENCV_LOG_LEVEL" not in os.environ:
    cv2.utils.logging.setLogLevel(cv2.utils.logging.LOG_LEVEL_FATAL)


def _env_size(name: str, default: int) -> int:
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        return default


# What OpenCV will refuse on its own (loadsave.cpp, validateInputImageSize).
OPENCV_MAX_PIXELS = _env_size("OPENCV_IO_MAX_IMAGE_PIXELS", 1 << 30)
OPENCV_MAX_SIDE = min(_env_size("OPENCV_IO_MAX_IMAGE_WIDTH", 1 << 20), _env_size("OPENCV_IO_MAX_IMAGE_HEIGHT", 1 << 20))


@cache
def opencv_pixel_guard_active() -> bool:
    """Whether OpenCV itself refuses, from the header, an image just over OPENCV_MAX_PIXELS.

    False when cv2 was imported before this module set OPENCV_IO_MAX_IMAGE_PIXELS.
    Costs one header parse (a crafted PNG whose IHDR is over the limit).
    """
    width = min(1_000_000, OPENCV_MAX_SIDE)  # libpng's own width limit is 1e6
    height = OPENCV_MAX_PIXELS // width + 1
    if height > width:
        return False  # a limit this large cannot be probed with a PNG header
    probe = _png_header_only(width, height)
    try:
        cv2.imdecode(np.frombuffer(probe, np.uint8), cv2.IMREAD_UNCHANGED)
    except cv2.error as e:
        return "CV_IO_MAX_IMAGE_PIXELS" in str(e)
    return False


def _png_header_only(width: int, height: int) -> bytes:
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b"")


if not opencv_pixel_guard_active():
    logger.warning(
        "OpenCV's OPENCV_IO_MAX_IMAGE_PIXELS guard is not in force (cv2 was imported before app.imaging.opencv); "
        "the header probe still refuses images over the pixel limit"
    )

__all__ = ["DEFAULT_MAX_PIXELS", "OPENCV_MAX_PIXELS", "OPENCV_MAX_SIDE", "cv2", "opencv_pixel_guard_active"]
