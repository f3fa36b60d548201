"""What a request's images go through once they leave the Router's queue: the chosen variant (or a cascade's first)
under failover (each try an Attempt: `DecodeAndClassify`, `Classify`), a cascade's second stage, then the shadow; each
request of a coalesced group gets its share (`Outcome`).

`group` is the coalescer's one entry point (a group of requests for one variant); `pixels` the one of ready pixels,
which do not ride the coalescer. Both read the Router's config in force (`configure`, live).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from app.config import RouterConfig
from app.errors import ServiceError
from app.imaging.payloads import Pixels, Scores
from app.pipeline.cascade_rule import escalate
from app.pipeline.cascade_stage import Cascader, Cascades, CascadeState, Escalation
from app.pipeline.coalescer import Waiter
from app.pipeline.failover import Attempt, Failover
from app.pipeline.model_specs import ModelSpecs
from app.pipeline.ports import Backend, Call
from app.pipeline.routing import Choice, WeightedSplit
from app.pipeline.shadow import SHADOW_TOP_K, Shadow
from app.request.guards import wall_deadline
from app.tracing import spans

logger = logging.getLogger("ray.serve")
T = TypeVar("T")
Key = tuple[str, bool, bool]  # (variant, pinned, full): the requests one group may carry
Top = list[tuple[int, float]]  # (class_id, probability), best first


def ms(seconds: float) -> float:
    return round(seconds * 1000.0, 3)


@dataclass
class Outcome:
    """One request's answer: per image its top-k or its error, and where the time went."""

    variant: str  # the variant that answered
    routing: str  # why the request went where it did: weighted, sticky, override, model
    failed_over: bool
    top: dict[int, Top]  # by position in the request, for the images that succeeded
    errors: dict[int, ServiceError]  # by position, for those that did not
    preprocess_ms: float = 0.0
    queue_ms: float = 0.0
    inference_ms: float = 0.0
    batch_size: int = 0
    logits: np.ndarray | None = None  # [succeeded, classes] in position order, when asked for (`full`)
    cascade: Escalation | None = None  # answered by a cascade: what its second stage did for the group
    margins: dict[int, tuple[bool, float]] | None = None  # a cascade's: by position, (escalated, first's margin)

    def timings(self) -> dict[str, float]:
        out = {"preprocess": self.preprocess_ms, "queue": self.queue_ms, "inference": self.inference_ms}
        if self.cascade is not None:
            out["escalation"] = self.cascade.ms
        return out

    def cascade_reply(self, pos: int) -> dict[str, Any] | None:
        """The reply's `cascade` field for the image at `pos`: whether it went on to `then`, and why."""
        if self.cascade is None or self.margins is None or pos not in self.margins:
            return None
        escalated, m = self.margins[pos]
        c = self.cascade
        out: dict[str, Any] = {"escalated": escalated, "margin": round(m, 6), "threshold": c.threshold}
        out |= {"first": c.cascade.first, "then": c.cascade.then}
        if c.failed is not None and escalate(m, c.threshold):  # meant to go on, but `then` could not answer
            out["escalation_failed"] = c.failed
        return out


@dataclass(frozen=True)
class Ask:
    """What one request of a group asked for."""

    choice: Choice
    top_k: int
    received: float  # perf_counter when the body was in: the deadline runs from here
    full: bool


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


class GroupRun:
    def __init__(
        self,
        backend: Backend,
        failover: Failover,
        specs: ModelSpecs,
        cascades: Cascades,
        cascader: Cascader,
        shadow: Shadow,
    ) -> None:
        self.backend, self.failover, self.specs = backend, failover, specs
        self.cascades, self.cascader, self.shadow = cascades, cascader, shadow
        self.settings: RouterConfig | None = None
        self.split: WeightedSplit | None = None

    def configure(self, settings: RouterConfig, split: WeightedSplit) -> None:
        self.settings, self.split = settings, split

    def limits(self) -> tuple[int, int]:
        """(groups in flight per variant, images per group): the coalescer reads them at each send."""
        assert self.settings is not None
        return self.settings.max_groups_in_flight, self.settings.coalesce_max

    async def group(self, key: Key, group: list[Waiter]) -> list[Outcome]:
        """A coalesced group: its images decoded and classified in one trip, each request's share of the answer."""
        if spans.ENABLED:
            return await self._traced(key, group)
        return await self._group(key, group)

    async def _traced(self, key: Key, group: list[Waiter]) -> list[Outcome]:
        """A group of several requests as one span: a child of its first recorded request's span, linked to every
        request's; its Preprocessor and Classifier calls are its children. Every other request's wait in the Router's
        queue is a span of its own trace, linked to the group's: a request that rode in another's group finds the
        group's calls by it (the first request's trace has the group itself, its wait the gap before it). A group of
        one request is no span of its own: its calls are that request's children."""
        started = time.perf_counter()
        contexts = [w.trace for w in group]
        parent = spans.first_sampled(contexts)
        if parent is None:  # no request of the group is recorded: nor is the group
            return await self._group(key, group)
        if len(group) == 1:
            with spans.within(parent):
                return await self._group(key, group)
        images = sum(len(w.images) for w in group)
        attributes = {"app.variant": key[0], "app.group.requests": len(group), "app.group.images": images}
        with spans.span("coalesced group", attributes, parent=parent, links=contexts) as span:
            try:
                return await self._group(key, group)
            finally:
                spans.waits("router queue", ((w.trace, w.enqueued, None) for w in group), started, parent, span)

    async def _group(self, key: Key, group: list[Waiter]) -> list[Outcome]:
        assert self.settings is not None
        started = time.perf_counter()
        asks: list[Ask] = [w.extra for w in group]
        images = [img for w in group for img in w.images]
        top_k = max(SHADOW_TOP_K, *(a.top_k for a in asks))
        full = key[2]
        # The group's calls run until its newest request's deadline; an older one leaves at its own (classify).
        newest = max(a.received for a in asks)
        cascade = self.cascades.get(key[0])  # a cascade's group runs on its `first`, then the uncertain rows on
        stage1 = Choice(cascade.first, asks[0].choice.reason) if cascade else asks[0].choice  # its `then`
        attempt = DecodeAndClassify(self.backend, self.failover, self.specs, images, top_k, full)
        (scores, pixels), variant = await self._first(cascade, stage1, newest, attempt)
        escalation = None

        def source(row: int) -> bytes:  # a row's encoded image (the capture keeps disagreements)
            return images[scores.positions[row]]

        if cascade is not None and variant == cascade.first:
            earliest = min(a.received for a in asks)  # the cascade's second stage runs to the earliest deadline
            scores, escalation = await self._second(cascade, scores, pixels, top_k, full, earliest, source)
            variant = cascade.name
        out, start = [], 0
        for w, ask in zip(group, asks, strict=True):
            n = len(w.images)
            waited = ms(started - w.enqueued)
            out.append(share_of(scores, ask.choice, variant, range(start, start + n), waited, escalation))
            start += n
        if scores.positions:
            try:  # the answers are ready: a shadow that cannot start must not fail them
                s = self.settings
                self.shadow.maybe(scores, pixels, s.shadow_fraction, s.max_shadow_in_flight, escalation, source)
            except Exception:
                logger.exception("shadow run not started")
        return out

    async def pixels(self, choice: Choice, pixels: Pixels, top_k: int, received: float, full: bool) -> Outcome:
        """Ready pixels (a V2 tensor) straight to the Classifier, with failover and a cascade's second stage."""
        k = max(top_k, SHADOW_TOP_K)
        cascade = self.cascades.get(choice.variant)
        stage1 = Choice(cascade.first, choice.reason) if cascade else choice
        attempt = Classify(self.backend, self.failover, pixels, k, full)
        scores, variant = await self._first(cascade, stage1, received, attempt)
        escalation = None
        if cascade is not None and variant == cascade.first:
            scores, escalation = await self._second(cascade, scores, pixels, k, full, received)
            variant = cascade.name
        return share_of(scores, choice, variant, range(len(pixels.array)), 0, escalation)

    async def _first(
        self, cascade: CascadeState | None, choice: Choice, received: float, attempt: Attempt[T]
    ) -> tuple[T, str]:
        """The request on its variant, or a cascade's on its `first`, under failover; a cascade's failure is the
        cascade's (A/B)."""
        assert self.settings is not None and self.split is not None
        deadline = received + self.settings.inference_timeout_s
        try:
            return await self.failover.run(choice, self.split, self.settings.failover, deadline, attempt)
        except ServiceError as e:
            if cascade is not None:
                e.variant = cascade.name
            raise

    async def _second(
        self,
        cascade: CascadeState,
        scores: Scores,
        pixels: Any,
        top_k: int,
        full: bool,
        received: float,
        source: Any = None,
    ) -> tuple[Scores, Escalation]:
        """A cascade's uncertain rows on its `then`, by the deadline of the request received at `received`."""
        assert self.settings is not None
        await self._check(cascade)
        deadline = received + self.settings.inference_timeout_s
        if not spans.ENABLED:
            return await self.cascader.run(cascade, scores, pixels, top_k, full, deadline, source)
        attributes = {"app.cascade": cascade.name, "app.cascade.first": cascade.first, "app.cascade.then": cascade.then}
        with spans.span("cascade second stage", attributes) as span:
            answer, escalation = await self.cascader.run(cascade, scores, pixels, top_k, full, deadline, source)
            done = {"app.cascade.escalated": len(escalation.rows), "app.cascade.failed": escalation.failed}
            spans.annotate(done, span)
            return answer, escalation

    async def _check(self, cascade: CascadeState) -> None:
        """Once per cascade: `then` takes the pixels decoded for `first` (the same input size), else no escalation."""
        if cascade.checked:
            return
        first, then = await self.specs.transform(cascade.first), await self.specs.transform(cascade.then)
        if first != then:
            cascade.problem = f"{cascade.first} takes {first.shape} pixels and {cascade.then} {then.shape}"
            logger.error("cascade %s cannot escalate: %s", cascade.name, cascade.problem)
        cascade.checked = True


def share_of(
    scores: Scores,
    choice: Choice,
    variant: str,
    positions: range,
    waited_ms: float,
    escalation: Escalation | None = None,
) -> Outcome:
    """The part of a group's Scores that belongs to the request whose images sit at `positions`."""
    rows = {pos: row for row, pos in enumerate(scores.positions)}
    mine = [p for p in positions if p in rows]
    logits = scores.logits[[rows[p] for p in mine]] if scores.logits is not None else None
    margins = None
    if escalation is not None:
        margins = {p - positions.start: (escalation.escalated(rows[p]), escalation.margins[rows[p]]) for p in mine}
    return Outcome(
        variant=variant,
        routing=choice.reason,
        failed_over=variant != choice.variant,
        top={p - positions.start: scores.top[rows[p]] for p in mine},
        errors={p - positions.start: e for p, e in scores.errors.items() if p in positions},
        preprocess_ms=scores.preprocess_ms,
        queue_ms=round(scores.queue_ms + waited_ms, 3),  # waiting to be sent counts as queueing
        inference_ms=scores.inference_ms,
        batch_size=scores.batch_size,
        logits=logits,
        cascade=escalation,
        margins=margins,
    )
