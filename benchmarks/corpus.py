"""A fixed corpus of JPEGs at the sizes clients send, made from the bundled sample photographs.

Deterministic: the same photographs, crops, grain and JPEG settings give the same bytes on a given
OpenCV build, so two runs (or two servers) see the same requests. Built once per process and cached.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import cv2
import numpy as np

from app.models.samples import available_photos, sample_bytes

# (width, height): a thumbnail, VGA, the native size of skimage's `chelsea`, 720p and 1080p.
SIZES: tuple[tuple[int, int], ...] = ((320, 240), (640, 480), (451, 300), (1280, 720), (1920, 1080))
PHOTOS: tuple[str, ...] = ("grace_hopper", "chelsea", "coffee", "astronaut", "rocket")
JPEG_QUALITY = 90
# Upscaled photographs are smoother than camera output and compress several times better; a little
# fixed sensor-like grain brings the byte counts (and the decoder's entropy work) closer to real photos.
GRAIN_SIGMA = 3.0


@dataclass(frozen=True)
class CorpusImage:
    name: str
    width: int
    height: int
    data: bytes

    @property
    def content_type(self) -> str:
        return "image/jpeg"


def _cover(img: np.ndarray, width: int, height: int) -> np.ndarray:
    """Centre-crop to the target aspect ratio, then resize to exactly width x height."""
    h, w = img.shape[:2]
    scale = max(width / w, height / h)
    cw, ch = min(w, round(width / scale)), min(h, round(height / scale))
    x, y = (w - cw) // 2, (h - ch) // 2
    crop = img[y : y + ch, x : x + cw]
    interpolation = cv2.INTER_AREA if scale < 1 else cv2.INTER_CUBIC
    return cv2.resize(crop, (width, height), interpolation=interpolation)


def render(photo: str, width: int, height: int, seed: int = 0) -> bytes:
    """One corpus JPEG: `photo` cropped and resized to width x height, with fixed grain."""
    src = cv2.imdecode(np.frombuffer(sample_bytes(photo), np.uint8), cv2.IMREAD_COLOR)
    if src is None:
        raise ValueError(f"sample photograph {photo!r} could not be decoded")
    img = _cover(src, width, height).astype(np.float32)
    if GRAIN_SIGMA:
        rng = np.random.default_rng([seed, width, height, sum(photo.encode())])
        img += rng.normal(0.0, GRAIN_SIGMA, img.shape).astype(np.float32)
    out = np.clip(img, 0, 255).astype(np.uint8)
    ok, buf = cv2.imencode(".jpg", out, [cv2.IMWRITE_JPEG_QUALITY, JPEG_QUALITY])
    if not ok:
        raise RuntimeError("JPEG encoding failed")
    return buf.tobytes()


@lru_cache(maxsize=8)
def build_corpus(
    sizes: tuple[tuple[int, int], ...] = SIZES, photos: tuple[str, ...] = PHOTOS, seed: int = 0
) -> tuple[CorpusImage, ...]:
    """Every size of every available photo, photo by photo, so consecutive requests cycle through the sizes."""
    present = set(available_photos())
    use = [p for p in photos if p in present]
    if not use:
        raise FileNotFoundError(f"none of the sample photographs {photos} is installed (scikit-image, matplotlib)")
    return tuple(CorpusImage(f"{photo}-{w}x{h}", w, h, render(photo, w, h, seed)) for photo in use for (w, h) in sizes)


def parse_sizes(text: str) -> tuple[tuple[int, int], ...]:
    """'320x240,1920x1080' -> ((320, 240), (1920, 1080))."""
    sizes = []
    for part in text.split(","):
        w, _, h = part.strip().lower().partition("x")
        if not (w.isdigit() and h.isdigit()) or int(w) < 1 or int(h) < 1:
            raise ValueError(f"bad image size {part!r}: expected WIDTHxHEIGHT, e.g. 640x480")
        sizes.append((int(w), int(h)))
    return tuple(sizes)


def describe(corpus: tuple[CorpusImage, ...]) -> dict[str, object]:
    sizes = sorted({(im.width, im.height) for im in corpus})
    return {
        "images": len(corpus),
        "sizes": [f"{w}x{h}" for w, h in sizes],
        "photos": sorted({im.name.rsplit("-", 1)[0] for im in corpus}),
        "bytes_min": min(len(im.data) for im in corpus),
        "bytes_median": int(np.median([len(im.data) for im in corpus])),
        "bytes_max": max(len(im.data) for im in corpus),
        "jpeg_quality": JPEG_QUALITY,
    }
