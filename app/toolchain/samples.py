"""The sample photographs that ship inside installed packages (no downloads).

scikit-image bundles a handful of photographs in its data directory and
matplotlib bundles grace_hopper.jpg. They are the default calibration and
evaluation set: a demo set, not a substitute for real traffic.
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np

from app.imaging.opencv import cv2  # the service's OpenCV settings (its pixel guard) before the library loads

# The five photographs whose classes are known (ImageNet ids of the expected top-1).
EVAL_PHOTOS = {"chelsea": 285, "coffee": 967, "astronaut": None, "rocket": None, "grace_hopper": 652}

_SKIMAGE_PHOTOS = {
    "chelsea": "chelsea.png",
    "coffee": "coffee.png",
    "astronaut": "astronaut.png",
    "rocket": "rocket.jpg",
    "hubble_deep_field": "hubble_deep_field.jpg",
    "immunohistochemistry": "ihc.png",
    "motorcycle_left": "motorcycle_left.png",
    "retina": "retina.jpg",
    "color": "color.png",
}


def _skimage_dir() -> Path:
    import skimage.data

    return Path(skimage.data.__file__).parent


def sample_path(name: str) -> Path:
    if name == "grace_hopper":
        import matplotlib.cbook

        return Path(matplotlib.cbook.get_sample_data("grace_hopper.jpg", asfileobj=False))
    return _skimage_dir() / _SKIMAGE_PHOTOS[name]


def sample_bytes(name: str) -> bytes:
    return sample_path(name).read_bytes()


def available_photos() -> list[str]:
    """Names of the sample photographs present on this machine."""
    names = []
    for name in [*_SKIMAGE_PHOTOS, "grace_hopper"]:
        try:
            if sample_path(name).is_file():
                names.append(name)
        except (ImportError, FileNotFoundError):
            continue
    return names


def _decode(data: bytes) -> np.ndarray:
    img = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
    if img is None:
        raise ValueError("a bundled sample photograph could not be decoded")
    return img


def augmented_samples(n: int, seed: int = 0) -> list[bytes]:
    """n random crops (50-100% of each side) with random horizontal flips, PNG-encoded."""
    rng = random.Random(seed)
    names = available_photos()
    if not names:
        raise FileNotFoundError("no sample photographs found: is scikit-image installed?")
    decoded = {name: _decode(sample_bytes(name)) for name in names}
    out = []
    for i in range(n):
        img = decoded[names[i % len(names)]]
        h, w = img.shape[:2]
        ch, cw = int(h * rng.uniform(0.5, 1.0)), int(w * rng.uniform(0.5, 1.0))
        y, x = rng.randint(0, h - ch), rng.randint(0, w - cw)
        crop = img[y : y + ch, x : x + cw]
        if rng.random() < 0.5:
            crop = crop[:, ::-1]
        ok, buf = cv2.imencode(".png", np.ascontiguousarray(crop))
        assert ok
        out.append(buf.tobytes())
    return out
