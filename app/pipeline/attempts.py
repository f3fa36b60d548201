"""What one try of a request on a variant calls downstream: the Attempts that `Failover.run` makes."""

from __future__ import annotations

import asyncio
import time

from app.imaging.payloads import Pixels, Scores
from app.pipeline.failover import Failover
from app.pipeline.model_specs import ModelSpecs
from app.pipeline.ports import Backend, Call
from app.request.guards import wall_deadline


class DecodeAndClassify:
    """A coalesced group's encoded images decoded for the variant's model (a Preprocessor call, or the Router's own
    decode), and the decode's answer handed to the variant's Classifier as it is: (its Scores, the decode's call)."""

    def __init__(
        self,
        backend: Backend,
        failover: Failover,
        specs: ModelSpecs,
        images: list[bytes],
        top_k: int,
        full: bool,
    ) -> None:
        self.backend, self.failover, self.specs = backend, failover, specs
        self.images, self.top_k, self.full = images, top_k, full

    async def on(self, variant: str, deadline: float, abort: asyncio.Event | None) -> tuple[Scores, Call]:
        transform = await self.specs.transform(variant)
        # The deadline goes as wall-clock time: perf_counter means nothing in another process.
        pixels = self.backend.preprocess(self.images, transform, wall_deadline(deadline))
        call = self.backend.classify(variant, pixels, self.top_k, self.full, None)
        left = deadline - time.perf_counter()
        return await self.failover.call(call, left, pixels, abort=abort, variant=variant), pixels


class Classify:
    """Ready pixels (a V2 tensor) on the variant's Classifier."""

    def __init__(self, backend: Backend, failover: Failover, pixels: Pixels, top_k: int, full: bool) -> None:
        self.backend, self.failover = backend, failover
        self.pixels, self.top_k, self.full = pixels, top_k, full

    async def on(self, variant: str, deadline: float, abort: asyncio.Event | None) -> Scores:
        call = self.backend.classify(variant, self.pixels, self.top_k, self.full, None)
        return await self.failover.call(call, deadline - time.perf_counter(), abort=abort, variant=variant)
