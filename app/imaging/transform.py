"""A decoded image -> the model's pixels: resize (squash, or shorter side then centre crop), channel order, uint8.

The geometry of a model's evaluation transform (`model.preprocess` in the config, the model's declaration) with the
graph's input size; the arithmetic (scale, mean, std), layout and dtype are folded into the graph instead
(`app.served_model.prologue`), so what travels from the Preprocessor to the Classifier stays uint8 [N, H, W, C].

Shorter side, then centre crop, computes what torchvision's `Resize(s)` then `CenterCrop((h, w))` compute: the
longer side becomes int(s * long / short), the crop starts at int(round((side - crop) / 2)). An image whose
shorter side already is `resize_shorter` is not resampled at all, only cropped.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from app.imaging.opencv import cv2

INTERPOLATIONS = {"area": cv2.INTER_AREA, "linear": cv2.INTER_LINEAR, "cubic": cv2.INTER_CUBIC}
COLORS = ("RGB", "BGR", "GRAY")
# Beyond this ratio of its sides an image is not a photograph; only the middle of its long side (this many times
# the short side) is resized, so a 1 x 1,000,000 image cannot make a 256 x 256,000,000 intermediate. The centre
# crop lies well inside it (it spans the long side's middle max(h, w) / resize_shorter <= 1 short sides).
MAX_ASPECT = 4


@dataclass(frozen=True)
class Transform:
    height: int
    width: int
    channels: int = 3  # 3: RGB or BGR; 1: grey
    resize_shorter: int | None = None  # None: squash the whole image to height x width
    interpolation: str = "area"
    color: str = "RGB"

    def __post_init__(self) -> None:
        if self.height <= 0 or self.width <= 0:
            raise ValueError(f"the input size must be positive, got {self.height}x{self.width}")
        if self.interpolation not in INTERPOLATIONS:
            raise ValueError(f"interpolation must be one of {sorted(INTERPOLATIONS)}, got {self.interpolation!r}")
        if self.color not in COLORS or (self.channels == 1) != (self.color == "GRAY") or self.channels not in (1, 3):
            raise ValueError(f"{self.channels} channel(s) in {self.color!r} order")
        if self.resize_shorter is not None and self.resize_shorter < max(self.height, self.width):
            raise ValueError(f"resize_shorter {self.resize_shorter} cannot be cropped to {self.height}x{self.width}")

    @classmethod
    def square(cls, size: int) -> Transform:
        """Squash to size x size RGB with area interpolation."""
        return cls(size, size)

    @property
    def shape(self) -> tuple[int, int, int]:
        """One image's pixels: [H, W, C]."""
        return (self.height, self.width, self.channels)

    @property
    def decode_target(self) -> int:
        """The shorter side a decode must keep (a JPEG far larger is decoded reduced, down to no less than this)."""
        return self.resize_shorter or max(self.height, self.width)

    def apply(self, img: np.ndarray) -> np.ndarray:
        """uint8 grey [h, w] or BGR [h, w, 3], any size -> uint8 [H, W, C] in this transform's channel order."""
        if self.resize_shorter is None:
            small = _resize(img, self.width, self.height, self.interpolation)
        else:
            small = self._shorter_then_crop(img)
        if self.color == "GRAY":
            grey = small if small.ndim == 2 else cv2.cvtColor(small, cv2.COLOR_BGR2GRAY)
            return grey.reshape(self.height, self.width, 1)
        if small.ndim == 2:
            return cv2.cvtColor(small, cv2.COLOR_GRAY2RGB)  # grey is the same in either order
        return cv2.cvtColor(small, cv2.COLOR_BGR2RGB) if self.color == "RGB" else np.ascontiguousarray(small)

    def _shorter_then_crop(self, img: np.ndarray) -> np.ndarray:
        assert self.resize_shorter is not None
        s = self.resize_shorter
        h, w = img.shape[:2]
        if max(h, w) > MAX_ASPECT * min(h, w):  # keep the middle of the long side only (see MAX_ASPECT)
            keep = MAX_ASPECT * min(h, w)
            img = (
                img[(h - keep) // 2 : (h - keep) // 2 + keep]
                if h > w
                else img[:, (w - keep) // 2 : (w - keep) // 2 + keep]
            )
            h, w = img.shape[:2]
        new_w, new_h = (s, int(s * h / w)) if w <= h else (int(s * w / h), s)
        resized = _resize(img, new_w, new_h, self.interpolation)
        top = round((new_h - self.height) / 2.0)
        left = round((new_w - self.width) / 2.0)
        return resized[top : top + self.height, left : left + self.width]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Transform:
        return cls(**d)


def _resize(img: np.ndarray, width: int, height: int, interpolation: str) -> np.ndarray:
    """cv2.resize to width x height, or the image itself at that size already. Area interpolation averages when
    shrinking; enlarging with it would repeat pixels (OpenCV's INTER_AREA is then nearest-like), so it is bilinear."""
    if img.shape[0] == height and img.shape[1] == width:
        return np.ascontiguousarray(img)
    flag = INTERPOLATIONS[interpolation]
    if interpolation == "area" and (width > img.shape[1] or height > img.shape[0]):
        flag = cv2.INTER_LINEAR
    return cv2.resize(img, (width, height), interpolation=flag)
