"""A fixed corpus of JPEGs at the sizes clients send, made from the bundled sample photographs.

Deterministic: the same photographs, crops, grain and JPEG settings give the same bytes on a given OpenCV
build, so two runs (or two servers) see the same requests. Built once per process and cached.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from app.imaging.opencv import cv2  # the service's OpenCV settings (its pixel guard) before the library loads
from app.toolchain.samples import available_photos, sample_bytes

# (width, height): a thumbnail, VGA, the native size of skimage's `chelsea`, 720p and 1080p.
SIZES: tuple[tuple[int, int], ...] = ((320, 240), (640, 480), (451, 300), (1280, 720), (1920, 1080))
PHOTOS: tuple[str, ...] = ("grace_hopper", "chelsea", "coffee", "astronaut", "rocket")
JPEG_QUALITY = 90
# Upscaled photographs are smoother than camera output and compress several times better; a little fixed
# sensor-like grain brings the byte counts (and the decoder's entropy work) closer to real photographs.
GRAIN_SIGMA = 3.0


@dataclass(frozen=True)
class CorpusImage:
    name: str
    width: int
    height: int
    data: bytes
    content_type: str = "image/jpeg"


def render(photo: str, width: int, height: int, seed: int = 0) -> bytes:
    """One corpus JPEG: `photo` centre-cropped to the aspect ratio, resized to width x height, with fixed grain."""
    src: Any = cv2.imdecode(np.frombuffer(sample_bytes(photo), np.uint8), cv2.IMREAD_COLOR)
    h, w = src.shape[:2]
    scale = max(width / w, height / h)
    cw, ch = min(w, round(width / scale)), min(h, round(height / scale))
    crop = src[(h - ch) // 2 : (h - ch) // 2 + ch, (w - cw) // 2 : (w - cw) // 2 + cw]
    img: np.ndarray = cv2.resize(crop, (width, height), interpolation=cv2.INTER_AREA if scale < 1 else cv2.INTER_CUBIC)
    rng = np.random.default_rng([seed, width, height, sum(photo.encode())])
    grainy = img.astype(np.float32) + rng.normal(0.0, GRAIN_SIGMA, img.shape).astype(np.float32)
    ok, buf = cv2.imencode(".jpg", np.clip(grainy, 0, 255).astype(np.uint8), [cv2.IMWRITE_JPEG_QUALITY, JPEG_QUALITY])
    assert ok, "JPEG encoding failed"
    return buf.tobytes()


@lru_cache(maxsize=8)
def build_corpus(sizes: tuple[tuple[int, int], ...] = SIZES) -> tuple[CorpusImage, ...]:
    """Every size of every available photo, photo by photo, so consecutive requests cycle through the sizes."""
    use = [p for p in PHOTOS if p in set(available_photos())]
    if not use:
        raise FileNotFoundError(f"none of the sample photographs {PHOTOS} is installed (scikit-image, matplotlib)")
    return tuple(CorpusImage(f"{photo}-{w}x{h}", w, h, render(photo, w, h)) for photo in use for (w, h) in sizes)


def describe(corpus: tuple[CorpusImage, ...]) -> str:
    """E.g. '25 JPEGs, sizes 320x240, 451x300, 640x480 (12-345 kB)'."""
    kb = sorted(len(im.data) // 1000 for im in corpus)
    sizes = ", ".join(f"{w}x{h}" for w, h in sorted({(im.width, im.height) for im in corpus}))
    return f"{len(corpus)} JPEGs, sizes {sizes} ({kb[0]}-{kb[-1]} kB)"
