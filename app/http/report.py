"""What this Router replica says of itself in /v1/models: its admission, decode, cascades, bodies and parsers."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from app.config import AppArgs
from app.http.body_reader import BodyReader
from app.pipeline.capture import CaptureStore
from app.pipeline.service import Pipeline
from app.protocol.v2.parse_pool import ParsePool


class RouterReport:
    def __init__(
        self,
        replica: str,
        args: AppArgs,
        pipeline: Pipeline,
        bodies: BodyReader,
        parsers: ParsePool,
        capture: CaptureStore | None,
        decoder_state: Callable[[], dict[str, Any]] | None,
    ) -> None:
        """decoder_state: the Router's own decoder's describe() (decode_in: router), else None."""
        self.replica = replica
        self.decode_in = args.decode_in
        self.pipeline = pipeline
        self.bodies = bodies
        self.parsers = parsers
        self.capture = capture
        self.decoder_state = decoder_state

    def summary(self) -> dict[str, Any]:
        """This Router's own counters, for /v1/models."""
        return {
            "router_replica_id": self.replica,
            "cancelled_requests": self.pipeline.admission.cancelled,
            "admission": self.pipeline.admission.describe(),
            "decode": {"where": self.decode_in, **(self.decoder_state() if self.decoder_state else {})},
            "cascades": self.cascades(),
            "bodies": self.bodies.describe(),
            "json_parsers": {"started": self.parsers.started, "parsed": self.parsers.parsed},
        }

    def cascades(self) -> dict[str, Any]:
        """Each cascade's threshold and fit, with its capture's state when it keeps images."""
        out = self.pipeline.cascades.describe()
        for name, shelf in (self.capture.describe() if self.capture is not None else {}).items():
            out[name]["capture"] = shelf
        return out
