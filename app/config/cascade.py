"""`CascadeArgs` (`args.cascades`): a routable variant made of two, and `CaptureArgs`, the images it keeps."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator

from app.config.base import _Strict


class CaptureArgs(_Strict):
    """Opt-in: keep the images on which a cascade's two variants disagree, as a calibration set for the next build.

    The encoded images as received (no V2 pixel tensors), one file each under `dir`/<cascade>, with a .json
    beside it (both answers, the margin); `python -m app.models quantize --calibration-dir` reads the
    directory as it is. Bounded in count, bytes and age; the oldest go first. They are user data:
    docs/ab-rollout-cascade.md ("Cascade") says what that means."""

    enabled: bool = Field(False, description="keep the disagreements (off unless asked for)")
    dir: str = Field("captures", description="where; a relative path is relative to the working directory")
    max_images: int = Field(1000, gt=0, le=1_000_000, description="images kept per cascade and Router; oldest go")
    max_bytes: int = Field(256 * 1024 * 1024, gt=0, description="their bytes per cascade and Router; oldest go")
    retention_s: float = Field(7 * 86400, gt=0, description="an image older than this is deleted")


class CascadeArgs(_Strict):
    """A routable variant made of two: every image on `first`, the uncertain ones again on `then`."""

    first: str = Field(description="the variant every image runs on (e.g. int8)")
    then: str = Field(description="the variant an image goes on to when first's top-1 margin is below the threshold")
    margin: float | Literal["auto"] = Field(
        "auto",
        description="the threshold on first's top-1 minus top-2 probability, in [0, 1] (0: never escalate, 1: "
        "always); auto: fitted from the A/B shadows' comparisons of first with then, to reach target_agreement "
        "with the fewest escalations",
    )
    target_agreement: float = Field(0.995, gt=0, le=1, description="auto: top-1 agreement with `then` to reach")
    min_samples: int = Field(
        1000, gt=0, description="auto: comparisons needed before a fit; until then default_margin stands"
    )
    default_margin: float = Field(
        0.5, ge=0, le=1, description="auto: the threshold until min_samples comparisons (conservative: escalates more)"
    )
    description: str = Field("", description="shown in GET /v1/models")
    capture: CaptureArgs = Field(default_factory=CaptureArgs)

    @field_validator("margin")
    @classmethod
    def _margin_in_range(cls, v: float | str) -> float | str:
        if not isinstance(v, str) and not 0.0 <= v <= 1.0:
            raise ValueError(f"margin must be in [0, 1] or auto, got {v}")
        return v


CASCADE_NAME = re.compile(r"^[A-Za-z0-9_-]+>[A-Za-z0-9_-]+$")  # int8>fp32; two of one pair: int8>fp32-all
