"""The speed gate's verdict on one variant: the one record of it, judged by `app.runtime.measure` (`judge`),
reported in GET /v1/models (`speed_gate`) and typed there by `app.protocol.v1`, whose schema it is as it stands.

It lives here, beside the gate's settings (`SpeedGateArgs`), because this is the lowest package both the engines and
the protocol import: app.protocol importing app.runtime would load ONNX Runtime into the Router.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict


class SpeedGateVerdict(BaseModel):
    # No docstring: it would be the schema's description in /openapi.json.
    model_config = ConfigDict(extra="forbid", frozen=True)

    variant: str
    baseline: str
    batch: int
    variant_img_per_s: float
    baseline_img_per_s: float
    speedup: float
    min_speedup: float
    action: Literal["warn", "fail"]
    passed: bool
    message: str  # the verdict in a sentence (the replica's log line, a failed start's error)

    def describe(self) -> dict[str, Any]:
        """As GET /v1/models reports it."""
        return self.model_dump()
