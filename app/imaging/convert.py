"""A decoded image as the model's transform takes it: any OpenCV decode result (grey, grey+alpha, BGR, BGRA; any
depth) to uint8 grey or BGR (`to_bgr_or_gray`), alpha composited onto white, and the EXIF orientation applied
(`apply_orientation`). Pure OpenCV and numpy; no Ray.

Conversion to uint8 (16-bit, float, alpha) goes a band of rows at a time into one uint8 result,
so it costs the output plus a few MiB, not several full-size float copies.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from app.errors import ImageInputError
from app.imaging.opencv import cv2

BACKGROUND_RGB = (255, 255, 255)  # transparent pixels are composited onto white
# Conversion works on bands of about this many samples: a float64 temporary of a band is 2 MiB.
_BAND_SAMPLES = 1 << 18


# --------------------------------------------------------------------------- conversion to uint8


def _to_uint8(img: np.ndarray) -> np.ndarray:
    """Any depth -> uint8, element by element (so a band of rows converts exactly as the whole would)."""
    if img.dtype == np.uint8:
        return img
    if img.dtype == np.uint16:
        return cv2.convertScaleAbs(img, alpha=1.0 / 257.0)  # round(v * 255 / 65535)
    if img.dtype == np.bool_:
        return img.astype(np.uint8) * np.uint8(255)
    if np.issubdtype(img.dtype, np.floating):  # float TIFF: 0..1 is black..white
        unit = np.clip(np.nan_to_num(img, nan=0.0, posinf=1.0, neginf=0.0), 0.0, 1.0)
        return np.rint(unit * 255.0).astype(np.uint8)
    info = np.iinfo(img.dtype)  # other integer TIFFs: the type's full range
    return ((img.astype(np.float64) - info.min) * (255.0 / (float(info.max) - info.min))).astype(np.uint8)


def _composite(bgra: np.ndarray, premultiplied: bool = False) -> np.ndarray:
    """uint8 BGRA -> BGR over BACKGROUND_RGB, in uint8 with OpenCV's SIMD ops, in place where it can.

    `premultiplied`: the colour is already colour x alpha (libtiff's RGBA reader, associated alpha).
    """
    alpha = cv2.extractChannel(bgra, 3)
    bgr = cv2.cvtColor(bgra, cv2.COLOR_BGRA2BGR)
    if cv2.minMaxLoc(alpha)[0] == 255:
        return bgr
    a3 = cv2.cvtColor(alpha, cv2.COLOR_GRAY2BGR)
    del alpha
    if not premultiplied:
        cv2.multiply(bgr, a3, dst=bgr, scale=1.0 / 255.0)  # colour x alpha
    cv2.bitwise_not(a3, dst=a3)  # 255 - alpha
    if BACKGROUND_RGB != (255, 255, 255):  # background x (1 - alpha); for white that is 255 - alpha itself
        a3 = cv2.multiply(a3, np.full_like(a3, BACKGROUND_RGB[::-1]), scale=1.0 / 255.0)
    cv2.add(bgr, a3, dst=bgr)
    return bgr


def _band_to_bgr_or_gray(band: np.ndarray, channels: int, premultiplied: bool) -> np.ndarray:
    """A band of rows of any OpenCV decode result (gray, gray+alpha, BGR, BGRA; any depth) -> uint8 gray or BGR."""
    band = _to_uint8(band)
    if channels == 1:
        return band.reshape(band.shape[:2])
    if channels == 2:  # gray + alpha
        gray, alpha = cv2.extractChannel(band, 0), cv2.extractChannel(band, 1)
        return _composite(cv2.merge([gray, gray, gray, alpha]), premultiplied)
    if channels == 3:
        return band
    return _composite(band, premultiplied)


def needs_conversion(channels: int, uint8: bool, inverted: bool) -> bool:
    """Whether a decode result (`channels` samples a pixel, uint8 or not, grey stored inverted) is not already
    uint8 grey or BGR."""
    return not (uint8 and channels in (1, 3) and not inverted)


def to_bgr_or_gray(img: np.ndarray, premultiplied: bool = False, inverted: bool = False) -> np.ndarray:
    """Any OpenCV decode result (gray, gray+alpha, BGR, BGRA; any depth) -> uint8 gray or BGR.

    uint8 gray and BGR come back as they are. Anything else is converted a band of rows at a time
    into one uint8 result, so the cost is that result plus a few MiB of band temporaries, never a
    full-size float copy (a 40 MP float32 RGBA image used to take 1.9 GB on top of its 640 MB).
    Every step is per pixel, so the result is the same as converting the whole image at once.
    `inverted`: grey stored as 0 = white (MinIsWhite), turned the right way round.
    """
    channels = 1 if img.ndim == 2 else img.shape[2]
    if channels not in (1, 2, 3, 4):
        raise ImageInputError("undecodable_image", f"unsupported channel count {channels}")
    if not needs_conversion(channels, img.dtype == np.uint8, inverted):
        return img.reshape(img.shape[:2]) if channels == 1 else img
    height, width = img.shape[:2]
    out = np.empty((height, width) if channels == 1 else (height, width, 3), np.uint8)
    rows = max(1, _BAND_SAMPLES // (width * channels))
    for y in range(0, height, rows):
        out[y : y + rows] = _band_to_bgr_or_gray(img[y : y + rows], channels, premultiplied)
    if inverted:
        cv2.bitwise_not(out, dst=out)
    return out


# --------------------------------------------------------------------------- orientation


# EXIF orientation -> the transform that shows the image upright (as OpenCV's own
# ApplyExifOrientation does it: transpose for the four 90-degree cases, then a flip).
_ORIENT: dict[int, Callable[[np.ndarray], np.ndarray]] = {
    2: lambda m: cv2.flip(m, 1),
    3: lambda m: cv2.flip(m, -1),
    4: lambda m: cv2.flip(m, 0),
    5: lambda m: cv2.transpose(m),
    6: lambda m: cv2.flip(cv2.transpose(m), 1),
    7: lambda m: cv2.flip(cv2.transpose(m), -1),
    8: lambda m: cv2.flip(cv2.transpose(m), 0),
}


def apply_orientation(img: np.ndarray, orientation: int) -> np.ndarray:
    """Turn an image stored with EXIF `orientation` (1..8) upright."""
    transform = _ORIENT.get(orientation)
    return transform(img) if transform else img
