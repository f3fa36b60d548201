"""A traced decode call's facts about its images, for its one span (`Decoder.many`).

A call of one image is a `decode` span with that image's format, pixels, bytes and ms (and `error.type` where it was
refused); a call of several is a `preprocess` span with the same keys holding arrays in the images' order, and each
image's error code ("" where it decoded). Not a span per image: exporting a span costs more CPU than most images take
to decode (docs/performance.md "Tracing").
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any


@dataclass
class ImageFacts:
    formats: list[str] = field(default_factory=list)
    pixels: list[int] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    ms: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    _header: tuple[str, int] = ("", 0)  # the current image's, once its header was read

    def header(self, image_format: str, pixels: int) -> None:
        self._header = (image_format, pixels)

    def done(self, size: int, started: float, error: str = "") -> None:
        """One image finished (decoded, or refused with `error`), `started` at that perf_counter reading."""
        image_format, pixels = self._header
        self.formats.append(image_format)
        self.pixels.append(pixels)
        self.sizes.append(size)
        self.ms.append(round((time.perf_counter() - started) * 1000.0, 3))
        self.errors.append(error)
        self._header = ("", 0)

    def attributes(self) -> dict[str, Any]:
        if not self.sizes:
            return {}
        one = len(self.sizes) == 1

        def value(xs: list[Any]) -> Any:
            return xs[0] if one else xs

        out = {
            "app.image.format": value(self.formats),
            "app.image.pixels": value(self.pixels),
            "app.image.bytes": value(self.sizes),
            "app.image.decode_ms": value(self.ms),
        }
        if any(self.errors):
            out["error.type" if one else "app.image.error"] = value(self.errors)
        return out
