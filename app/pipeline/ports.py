"""What the pipeline needs from the world outside it, as Protocols (Serve's handles satisfy them in
Serve's handles)."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any, Protocol

from app.imaging.payloads import Pixels, Scores
from app.imaging.transform import Transform


class Call(Awaitable[Any], Protocol):
    """A downstream call in flight (Serve's DeploymentResponse): awaitable, cancellable, passable on."""

    def cancel(self) -> Any: ...  # DeploymentResponse: None; an asyncio.Task (a local decode): bool


class ReplicaLost(RuntimeError):
    """The call's replica died or its deployment has none: worth one retry elsewhere (inference is idempotent)."""

    def __init__(self, message: str, unavailable: bool = False) -> None:
        super().__init__(message)
        self.unavailable = unavailable  # the deployment had no replica at all (vs. one died mid-call)


class Backend(Protocol):
    """The decode (a Preprocessor, or the Router's own), the Classifiers and the A/B ledger, as the pipeline sees
    them."""

    def preprocess(self, images: list[bytes], transform: Transform, wall_deadline: float) -> Call:
        """Decode, resize and crop as the model declares; the answer (Pixels) is passed on to `classify` without
        coming back here."""
        ...

    def classify(self, variant: str, pixels: Call | Pixels, top_k: int, full: bool, rows: list[int] | None) -> Call:
        """Top-k (and logits when `full`) of each image; `rows`: only those rows of `pixels`."""
        ...

    def describe(self, variant: str) -> Call: ...

    def labels(self, variant: str) -> Call:
        """The model's labels, one per class, as the variant's Classifier resolved them."""
        ...

    def ready(self, variant: str) -> Call: ...

    def ledger_add(self, delta: Any) -> Call: ...

    def ledger_summary(self) -> Call: ...

    def ledger_reset(self) -> Call: ...

    def ledger_margins(self) -> Call:
        """The cascades' merged evidence: "first>then" -> MarginEvidence.to_dict()."""
        ...

    def ledger_model_stats(self) -> Call: ...

    def ledger_poll(self, config_id: str, weights: dict[str, float]) -> Call:
        """This Router's config fingerprint and weights to the ledger; back: the rollout's override, or None."""
        ...

    def rollout(self, method: str, *args: Any) -> Call:
        """A call to the rollout controller: start(spec), get(), abort()."""
        ...

    async def result(self, call: Call) -> Any:
        """Await a call: the answer, or ReplicaLost / ServiceError (overloaded, ...) / the cancellation."""
        ...

    def routable(self, variant: str) -> int | None:
        """How many replicas the handle can route to right now (None: unknown). No I/O."""
        ...

    async def running(self) -> dict[str, int] | None:
        """RUNNING replicas per variant, from the controller (None: unknown)."""
        ...


class ShadowMetrics(Protocol):
    def shadow_outcome(self, pair: str, outcome: str, n: int = 1) -> None: ...

    def shadow_delta(self, pair: str, abs_dp: float) -> None: ...


class CascadeMetrics(Protocol):
    def cascade_images(self, cascade: str, outcome: str, n: int) -> None:
        """Images of a cascade by outcome: kept (first's answer), escalated, escalation_failed."""
        ...


class PipelineMetrics(ShadowMetrics, CascadeMetrics, Protocol): ...


__all__ = ["Backend", "Call", "CascadeMetrics", "PipelineMetrics", "ReplicaLost", "Scores", "ShadowMetrics"]
