"""Image bytes -> uint8 RGB [size, size, 3]. Pure OpenCV and numpy; no Ray.

The server's Preprocessor and the INT8 calibration reader both call
`preprocess`, so the model is calibrated on exactly what it will be served.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass

# OpenCV's own pixel guard, a second line behind `probe_dimensions`. It is read
# when the decoder first runs, so it has to be in the environment before that.
DEFAULT_MAX_PIXELS = 40_000_000
os.environ.setdefault("OPENCV_IO_MAX_IMAGE_PIXELS", str(DEFAULT_MAX_PIXELS))

import cv2  # noqa: E402
import numpy as np  # noqa: E402

from app.errors import ImageInputError  # noqa: E402

# Keep OpenCV from spawning its own thread pool inside a replica that owns a fraction of a core.
cv2.setNumThreads(1)

BACKGROUND_RGB = (255, 255, 255)  # transparent pixels are composited onto white


@dataclass(frozen=True)
class ImageInfo:
    format: str
    width: int
    height: int


def probe_dimensions(data: bytes) -> ImageInfo | None:
    """Read the format and size from the header alone, without decoding. None if unknown."""
    if data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) >= 24:
        w, h = struct.unpack(">II", data[16:24])
        return ImageInfo("png", w, h)
    if data[:6] in (b"GIF87a", b"GIF89a") and len(data) >= 10:
        w, h = struct.unpack("<HH", data[6:10])
        return ImageInfo("gif", w, h)
    if data[:2] == b"BM" and len(data) >= 26:
        w, h = struct.unpack("<ii", data[18:26])
        return ImageInfo("bmp", abs(w), abs(h))
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return _probe_webp(data)
    if data[:3] == b"\xff\xd8\xff":
        return _probe_jpeg(data)
    if data[:4] in (b"II*\x00", b"MM\x00*"):
        return ImageInfo("tiff", 0, 0)  # sizes live in IFDs; OpenCV's own guard covers TIFF
    return None


def _probe_webp(data: bytes) -> ImageInfo | None:
    chunk = data[12:16]
    if chunk == b"VP8 " and len(data) >= 30:
        w, h = struct.unpack("<HH", data[26:30])
        return ImageInfo("webp", w & 0x3FFF, h & 0x3FFF)
    if chunk == b"VP8L" and len(data) >= 25:
        b = data[21:25]
        w = 1 + (((b[1] & 0x3F) << 8) | b[0])
        h = 1 + (((b[3] & 0xF) << 10) | (b[2] << 2) | ((b[1] & 0xC0) >> 6))
        return ImageInfo("webp", w, h)
    if chunk == b"VP8X" and len(data) >= 30:
        w = 1 + int.from_bytes(data[24:27], "little")
        h = 1 + int.from_bytes(data[27:30], "little")
        return ImageInfo("webp", w, h)
    return ImageInfo("webp", 0, 0)


_JPEG_SOF = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}


def _probe_jpeg(data: bytes) -> ImageInfo | None:
    i, n = 2, len(data)
    while i + 4 <= n:
        if data[i] != 0xFF:
            return None
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:
            i += 2
            continue
        (length,) = struct.unpack(">H", data[i + 2 : i + 4])
        if marker in _JPEG_SOF and i + 9 <= n:
            h, w = struct.unpack(">HH", data[i + 5 : i + 9])
            return ImageInfo("jpeg", w, h)
        if length < 2:
            return None
        i += 2 + length
    return None


_REDUCED_FLAGS = ((8, cv2.IMREAD_REDUCED_COLOR_8), (4, cv2.IMREAD_REDUCED_COLOR_4), (2, cv2.IMREAD_REDUCED_COLOR_2))


def reduced_decode_flag(width: int, height: int, target: int) -> int:
    """The JPEG decoder's DCT-domain downscale (1/2, 1/4, 1/8) that still leaves >= target pixels."""
    for factor, flag in _REDUCED_FLAGS:
        if min(width, height) >= target * factor:
            return flag
    return cv2.IMREAD_COLOR


def _to_uint8(img: np.ndarray) -> np.ndarray:
    if img.dtype == np.uint8:
        return img
    if img.dtype == np.uint16:
        return (img >> 8).astype(np.uint8)
    if np.issubdtype(img.dtype, np.floating):
        return np.clip(np.nan_to_num(img) * 255.0, 0, 255).astype(np.uint8)
    info = np.iinfo(img.dtype)
    return ((img.astype(np.float64) - info.min) * 255.0 / (info.max - info.min)).astype(np.uint8)


def _to_rgb(img: np.ndarray) -> np.ndarray:
    """Any OpenCV decode result (gray, BGR, BGRA, any depth) -> uint8 RGB."""
    if img.ndim == 3 and img.shape[2] == 4:
        bgr = img[..., :3].astype(np.float32)
        alpha = img[..., 3:].astype(np.float32) / (65535.0 if img.dtype == np.uint16 else 255.0)
        scale = 65535.0 if img.dtype == np.uint16 else 255.0
        bg = np.array(BACKGROUND_RGB[::-1], np.float32) * (scale / 255.0)
        img = (bgr * alpha + bg * (1.0 - alpha)).astype(img.dtype)
    img = _to_uint8(img)
    if img.ndim == 2 or img.shape[2] == 1:
        return cv2.cvtColor(img, cv2.COLOR_GRAY2RGB)
    return cv2.cvtColor(img, cv2.COLOR_BGR2RGB)


def decode_image(data: bytes, max_pixels: int = DEFAULT_MAX_PIXELS, target: int | None = None) -> np.ndarray:
    """Decode to uint8 RGB HxWx3, refusing bombs before the decoder allocates.

    JPEGs are decoded with EXIF orientation applied, reduced in the DCT domain
    when far larger than `target`; formats that carry alpha keep it for
    compositing onto a white background.
    """
    if not data:
        raise ImageInputError("empty_body", "the request carried no image bytes")
    info = probe_dimensions(data)
    if info is None:
        raise ImageInputError("undecodable_image", "not a recognised image format (JPEG, PNG, GIF, BMP, WebP, TIFF)")
    if info.width * info.height > max_pixels:
        raise ImageInputError(
            "too_many_pixels",
            f"image is {info.width}x{info.height} = {info.width * info.height} pixels; the limit is {max_pixels}",
        )
    if info.width == 0 and info.format not in ("tiff", "webp"):
        raise ImageInputError("undecodable_image", f"{info.format} header declares a zero-sized image")
    buf = np.frombuffer(data, np.uint8)
    if info.format == "jpeg":
        flag = reduced_decode_flag(info.width, info.height, target) if target else cv2.IMREAD_COLOR
        img = cv2.imdecode(buf, flag)
    else:
        img = cv2.imdecode(buf, cv2.IMREAD_UNCHANGED)
    if img is None or img.size == 0:
        raise ImageInputError("undecodable_image", f"the {info.format} data could not be decoded")
    if img.shape[0] * img.shape[1] > max_pixels:
        raise ImageInputError("too_many_pixels", f"decoded image exceeds the {max_pixels}-pixel limit")
    if img.ndim == 3 and img.shape[2] not in (1, 3, 4):
        raise ImageInputError("undecodable_image", f"unsupported channel count {img.shape[2]}")
    return _to_rgb(img)


def resize(img: np.ndarray, size: int) -> np.ndarray:
    """Squash to size x size with area interpolation (what the model was checked against)."""
    if img.shape[0] == size and img.shape[1] == size:
        return np.ascontiguousarray(img)
    interpolation = cv2.INTER_AREA if min(img.shape[:2]) >= size else cv2.INTER_LINEAR
    return cv2.resize(img, (size, size), interpolation=interpolation)


def preprocess(data: bytes, size: int = 224, max_pixels: int = DEFAULT_MAX_PIXELS, reduced: bool = True) -> np.ndarray:
    """Encoded image bytes -> uint8 RGB [size, size, 3], the model's input for one image."""
    img = decode_image(data, max_pixels=max_pixels, target=size if reduced else None)
    return resize(img, size)
