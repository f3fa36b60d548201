"""A rollout request (`RolloutSpec`) and the names of its states and decisions (`app.rollout.decide` has the rules)."""

from __future__ import annotations

from itertools import pairwise
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

State = Literal["running", "promoted", "rolled_back", "aborted", "idle"]
Decision = Literal["advance", "hold", "rollback"]


class RolloutSpec(BaseModel):
    """A rollout request: move `candidate` up `steps` (percent of traffic) against `baseline`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    candidate: str = Field(description="the variant being promoted")
    baseline: str = Field(description="the variant it is compared with, and returned to on rollback")
    steps: list[float] = Field(
        default_factory=lambda: [1.0, 5.0, 25.0, 50.0, 100.0],
        description="candidate weight in percent at each step; strictly increasing in (0, 100], ending at 100",
    )
    min_samples: int = Field(
        500, gt=0, description="shadow comparisons, and requests of each variant, a step needs before it advances"
    )
    min_agreement: float = Field(0.95, gt=0, lt=1, description="top-1 agreement the candidate must show")
    max_p99_ratio: float = Field(1.2, gt=0, description="candidate p99 latency / baseline p99 latency, at most")
    max_error_rate_delta: float = Field(0.001, ge=0, le=1, description="candidate error rate - baseline's, at most")
    step_min_s: float = Field(60, ge=0, description="the shortest time a step lasts")
    dry_run: bool = Field(False, description="decide and record, but never change the weights")

    @field_validator("candidate", "baseline")
    @classmethod
    def _name(cls, v: str) -> str:
        if not v or not v.isascii() or not v.replace("_", "").replace("-", "").replace(">", "").isalnum():
            raise ValueError(f"variant name {v!r} must be letters, digits, '-', '_' (and '>' for a cascade)")
        return v

    @field_validator("steps")
    @classmethod
    def _steps(cls, v: list[float]) -> list[float]:
        if not v or v[-1] != 100:
            raise ValueError(f"steps must end at 100, got {v}")
        if any(not 0 < w <= 100 for w in v) or any(b <= a for a, b in pairwise(v)):
            raise ValueError(f"steps must be strictly increasing in (0, 100], got {v}")
        return v

    @model_validator(mode="after")
    def _two_variants(self) -> RolloutSpec:
        if self.candidate == self.baseline:
            raise ValueError(f"candidate and baseline are both {self.candidate!r}")
        return self
