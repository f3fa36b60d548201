"""OpenCV, loaded once with the service's settings in force: import cv2 from here, never directly, in app/.

OpenCV's own pixel guard is a second line behind the header probe (app/imaging/preprocess.py). OpenCV reads it in a
static initializer when its library loads, i.e. at the first `import cv2` anywhere in the process, so it is
set just before that import; `app.imaging.preprocess.opencv_pixel_guard_active` checks that it took.
"""

from __future__ import annotations

import os

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

__all__ = ["DEFAULT_MAX_PIXELS", "cv2"]
