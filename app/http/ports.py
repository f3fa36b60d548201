"""What the HTTP layer needs from the world outside it, as Protocols: the Router's metrics, which the deployment
makes (RouterMetrics satisfies it) and hands to the Router's assembly. The pipeline's own
ports are its `ports` module's."""

from __future__ import annotations

from typing import Protocol

from app.pipeline.ports import PipelineMetrics


class Metrics(PipelineMetrics, Protocol):
    """The Router's metrics as the handlers use them: every reply counted once (`Replies`)."""

    def error(self, endpoint: str, code: str, status: int, variant: str = "none") -> None: ...

    def success(self, endpoint: str, variant: str, timings: dict[str, float]) -> None: ...

    def entry_error(self, endpoint: str, code: str) -> None:
        """One failed entry of a batch request (the request itself is counted by its reply)."""
        ...

    def request_cancelled(self) -> None:
        """A client went away before its answer."""
        ...

    def body_received(self, size: int) -> None:
        """An image's bytes, as received."""
        ...

    def observe_pixels(self, pixels: list[int]) -> None: ...

    def admission_front(self, active: dict[str, bool], without: int) -> None: ...

    def cascade_thresholds(self, thresholds: dict[str, float]) -> None: ...
