"""Calibration and evaluation images: directory sampling and ONNX Runtime's CalibrationDataReader."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from onnxruntime.quantization import CalibrationDataReader

from app.imaging.preprocess import preprocess
from app.imaging.probe import IMAGE_SUFFIXES


@dataclass(frozen=True)
class LabelledImage:
    path: Path
    label: str | None  # the class sub-folder's name, None for a flat directory


def list_images(root: Path) -> dict[str | None, list[Path]]:
    """Images of a directory, grouped by class sub-folder (key None for images at the top)."""
    if not root.is_dir():
        raise FileNotFoundError(f"image directory not found: {root}")
    groups: dict[str | None, list[Path]] = {}
    for path in sorted(root.rglob("*")):
        if path.is_file() and path.suffix.lower() in IMAGE_SUFFIXES:
            rel = path.relative_to(root)
            label = rel.parts[0] if len(rel.parts) > 1 else None
            groups.setdefault(label, []).append(path)
    if not groups:
        raise FileNotFoundError(f"no images ({', '.join(sorted(IMAGE_SUFFIXES))}) under {root}")
    return groups


def sample_directory(root: Path, n: int, seed: int = 0) -> list[LabelledImage]:
    """Up to n images, taken round-robin from shuffled class sub-folders so classes are even."""
    rng = random.Random(seed)
    groups = list_images(root)
    queues = []
    for label in sorted(groups, key=lambda k: (k is None, k or "")):
        files = groups[label][:]
        rng.shuffle(files)
        queues.append([LabelledImage(p, label) for p in files])
    picked: list[LabelledImage] = []
    while len(picked) < n and any(queues):
        for q in queues:
            if q and len(picked) < n:
                picked.append(q.pop())
    return picked


class ImageCalibrationReader(CalibrationDataReader):
    """Feeds quantize_static the graph's own input in batches: `prepare` turns encoded images into it, as served
    (app.served_model.model_io.Preparation); by default the server's `preprocess`, squashed to `size`, uint8 NHWC."""

    def __init__(
        self,
        images: Sequence[bytes],
        input_name: str,
        size: int = 224,
        batch_size: int = 8,
        prepare: Callable[[Sequence[bytes]], np.ndarray] | None = None,
    ) -> None:
        self.images = images
        self.input_name = input_name
        self.prepare = prepare or (lambda chunk: np.stack([preprocess(b, size) for b in chunk]))
        self.batch_size = batch_size
        self._iter: Iterator[dict[str, np.ndarray]] | None = None

    def _batches(self) -> Iterator[dict[str, np.ndarray]]:
        for i in range(0, len(self.images), self.batch_size):
            yield {self.input_name: self.prepare(self.images[i : i + self.batch_size])}

    def get_next(self) -> dict[str, np.ndarray] | None:
        if self._iter is None:
            self._iter = self._batches()
        return next(self._iter, None)

    def rewind(self) -> None:
        self._iter = None

    def __len__(self) -> int:
        return len(self.images)
