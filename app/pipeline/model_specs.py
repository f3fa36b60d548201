"""What the Router knows of the variants' models, asked of their Classifiers once: the input spec, the transform a
decode must apply, the labels. Every control call here has a deadline, and a lost replica is a 503."""

from __future__ import annotations

import asyncio
from typing import Any

from app.errors import ServiceError
from app.imaging.transform import Transform
from app.pipeline.cascade_stage import Cascades
from app.pipeline.failover import Failover
from app.pipeline.ports import Backend, Call, ReplicaLost


class ModelSpecs:
    def __init__(
        self,
        backend: Backend,
        failover: Failover,
        variants: list[str],
        cascades: Cascades,
        transform: Transform | None = None,
    ) -> None:
        """transform: the model's, known at construction (every variant's: they take the same input), else None:
        asked of the first Classifier that serves a request."""
        self.backend, self.failover, self.variants, self.cascades = backend, failover, variants, cascades
        self._transform = transform
        self._specs: dict[str, dict[str, Any]] = {}
        self._labels: list[str] | None = None

    async def ask(self, call: Call, timeout_s: float) -> Any:
        """A control call (describe, ready, the ledger) with a deadline; a lost replica is a 503 here too."""
        try:
            return await self.failover.call(call, timeout_s)
        except ReplicaLost as e:
            raise ServiceError("variant_unavailable" if e.unavailable else "replica_failed", str(e)) from None

    def classifier_of(self, variant: str) -> str:
        """The Classifier a request for `variant` starts on: itself, or a cascade's `first`."""
        cascade = self.cascades.get(variant)
        return cascade.first if cascade is not None else variant

    async def spec(self, variant: str) -> dict[str, Any]:
        """The model's input spec, read from the Classifier's session once, never assumed (a cascade's: its first's)."""
        variant = self.classifier_of(variant)
        if variant not in self._specs:
            info = await self.ask(self.backend.describe(variant), 10.0)
            self._specs[variant] = info["input"]
        return self._specs[variant]

    async def transform(self, variant: str) -> Transform:
        """How the variant's model wants its images: input size, resize, crop, channel order (as constructed, else its
        Classifier's)."""
        if self._transform is not None:
            return self._transform
        return Transform.from_dict((await self.spec(variant))["transform"])

    def known_target(self, variant: str) -> int | None:
        """The side a decode keeps for this variant, if known already (no call: a header check must not wait)."""
        if self._transform is not None:
            return self._transform.decode_target
        spec = self._specs.get(self.classifier_of(variant))
        return Transform.from_dict(spec["transform"]).decode_target if spec else None

    async def labels(self) -> list[str]:
        """The model's labels, one per class, from the first Classifier that answers (every variant shares them)."""
        if self._labels is None:
            errors = []
            for variant in self.variants:
                try:
                    self._labels = list(await self.ask(self.backend.labels(variant), 10.0))
                    break
                except ServiceError as e:
                    errors.append(e)
            else:
                raise errors[0]
        return self._labels

    async def ready(self, variants: list[str]) -> dict[str, bool]:
        states = await asyncio.gather(*(self.ask(self.backend.ready(v), 2.0) for v in variants), return_exceptions=True)
        return {v: s is True for v, s in zip(variants, states, strict=True)}
