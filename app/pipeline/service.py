"""The request pipeline put together: `classify(...) -> Outcome` for encoded images or ready pixels.

Encoded images of every protocol (v1 single and batch, V2) ride the coalescer: at low load a
request leaves at once; under load the requests waiting for a variant leave together, one decode
and one Classifier call for the lot. The decode's answer (a Preprocessor call, or the Router's own
decode: `Backend.preprocess`) is handed to the Classifier call as it is; the pipeline never reads it.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from app.config import CascadeArgs, RouterConfig
from app.errors import ServiceError
from app.imaging.payloads import Pixels, Scores
from app.imaging.transform import Transform
from app.pipeline.admission import Admission, Limits
from app.pipeline.cascade import escalate
from app.pipeline.cascading import Capture, Cascader, Cascades, CascadeState, Escalation
from app.pipeline.coalescer import Coalescer, Waiter
from app.pipeline.failover import Failover
from app.pipeline.ports import Backend, Call, PipelineMetrics, ReplicaLost
from app.pipeline.routing import Choice, WeightedSplit
from app.pipeline.shadow import SHADOW_TOP_K, Evidence, Shadow
from app.request.guards import deadline_message, wall_deadline

logger = logging.getLogger("ray.serve")
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
class _Ask:
    choice: Choice
    top_k: int
    received: float  # perf_counter when the body was in: the deadline runs from here
    full: bool


class Pipeline:
    def __init__(
        self,
        backend: Backend,
        variants: list[str],
        metrics: PipelineMetrics,
        on_cancel: Callable[[], None] = lambda: None,
        rng: random.Random | None = None,
        cascades: dict[str, CascadeArgs] | None = None,
        capture: Capture | None = None,
        after_flush: Callable[[], Awaitable[None]] | None = None,
        transform: Transform | None = None,
    ) -> None:
        """Every part assembled here, once. capture: the cascades' calibration capture (app/pipeline/capture.py);
        after_flush: run about once a second after the A/B evidence goes to the ledger (the Router's rollout poll);
        transform: the model's, known at construction (every variant's: they take the same input), else None: asked of
        the first Classifier that serves a request (`transform`)."""
        self.backend = backend
        self.variants = variants
        self._transform = transform
        self.admission = Admission(on_cancel)
        self.evidence = Evidence(backend, after_flush)
        self.failover = Failover(backend, variants)
        self.cascades = Cascades(cascades or {})
        self.cascader = Cascader(backend, self.failover, metrics, capture)
        self.shadow = Shadow(
            backend,
            variants,
            self.evidence,
            metrics,
            rng,
            self.cascades,
            self.cascader,
            lambda v: self.failover.health.available(v, time.monotonic()),
        )
        self.coalescer: Coalescer[tuple[str, bool, bool]] = Coalescer(self._run_group, self._group_limits)
        self.settings: RouterConfig | None = None
        self._limits: Limits | None = None
        self.split: WeightedSplit | None = None
        self._specs: dict[str, dict[str, Any]] = {}
        self._labels: list[str] | None = None

    def configure(self, settings: RouterConfig, split: WeightedSplit, pair: tuple[str, str] | None = None) -> None:
        """The Router's config in force, its A/B split, and a running rollout's pair (shadowed on each other)."""
        self.settings, self.split = settings, split
        self.shadow.pair = pair
        s = settings
        self._limits = Limits(
            s.max_in_flight,
            s.queue_wait_s,
            s.max_queued,
            int(s.max_queued_mib * 2**20),
            s.max_refusals_per_s,
            s.inference_timeout_s,
            s.queued_per_user,
        )

    def _group_limits(self) -> tuple[int, int]:
        assert self.settings is not None
        return self.settings.max_groups_in_flight, self.settings.coalesce_max

    def admitted(self, size: int = 0, user: str | None = None) -> Any:
        """`async with pipeline.admitted(len(body), user):` one in-flight slot, after a bounded wait for it, or 503."""
        assert self._limits is not None, "configure() first"
        self.evidence.ensure_flusher()
        return self.admission.admitted(self._limits, size, user)

    # -- classification --------------------------------------------------------------

    async def classify(
        self, choice: Choice, images: list[bytes], top_k: int, received: float, full: bool = False
    ) -> Outcome:
        """Encoded images through the coalescer, Preprocessor and Classifier (with failover and shadowing)."""
        assert self.settings is not None
        key = (choice.variant, choice.reason in ("override", "model"), full)
        left = received + self.settings.inference_timeout_s - time.perf_counter()
        try:  # each request keeps its own deadline, whatever group it rides in
            outcome: Outcome = await asyncio.wait_for(
                self.coalescer.submit(key, images, _Ask(choice, top_k, received, full)), max(left, 0.001)
            )
        except asyncio.TimeoutError:
            raise ServiceError("inference_timeout", deadline_message(left), choice.variant) from None
        return outcome

    async def classify_pixels(
        self, choice: Choice, pixels: Pixels, top_k: int, received: float, full: bool = False
    ) -> Outcome:
        """Ready pixels (a V2 tensor) straight to the Classifier."""

        k = max(top_k, SHADOW_TOP_K)

        async def attempt(variant: str, deadline: float, abort: asyncio.Event | None) -> Scores:
            call = self.backend.classify(variant, pixels, k, full, None)
            return await self.failover.call(call, deadline - time.perf_counter(), abort=abort, variant=variant)

        cascade = self.cascades.get(choice.variant)
        stage1 = Choice(cascade.first, choice.reason) if cascade else choice
        scores, variant = await self._stage1(cascade, stage1, received, attempt)
        escalation = None
        if cascade is not None and variant == cascade.first:
            await self._check(cascade)
            assert self.settings is not None
            deadline = received + self.settings.inference_timeout_s
            scores, escalation = await self.cascader.run(cascade, scores, pixels, k, full, deadline)
            variant = cascade.name
        return _outcome(scores, choice, variant, range(len(pixels.array)), 0, escalation)

    async def _stage1(self, cascade: CascadeState | None, choice: Choice, received: float, attempt: Any) -> Any:
        """The group on its variant, or a cascade's on its `first`; a cascade's failure is the cascade's (A/B)."""
        try:
            return await self._failover(choice, received, attempt)
        except ServiceError as e:
            if cascade is not None:
                e.variant = cascade.name
            raise

    async def _check(self, cascade: CascadeState) -> None:
        """Once per cascade: `then` takes the pixels decoded for `first` (the same input size), else no escalation."""
        if cascade.checked:
            return
        first, then = await self.transform(cascade.first), await self.transform(cascade.then)
        if first != then:
            cascade.problem = f"{cascade.first} takes {first.shape} pixels and {cascade.then} {then.shape}"
            logger.error("cascade %s cannot escalate: %s", cascade.name, cascade.problem)
        cascade.checked = True

    async def _failover(self, choice: Choice, received: float, attempt: Any) -> tuple[Any, str]:
        assert self.settings is not None and self.split is not None
        deadline = received + self.settings.inference_timeout_s
        return await self.failover.run(choice, self.split, self.settings.failover, deadline, attempt)

    async def _run_group(self, key: tuple[str, bool, bool], group: list[Waiter]) -> list[Outcome]:
        started = time.perf_counter()
        asks: list[_Ask] = [w.extra for w in group]
        images = [img for w in group for img in w.images]
        top_k = max(SHADOW_TOP_K, *(a.top_k for a in asks))
        full = key[2]

        async def attempt(variant: str, deadline: float, abort: asyncio.Event | None) -> tuple[Scores, Call]:
            transform = await self.transform(variant)
            # The deadline goes as wall-clock time: perf_counter means nothing in another process.
            pixels = self.backend.preprocess(images, transform, wall_deadline(deadline))
            call = self.backend.classify(variant, pixels, top_k, full, None)
            left = deadline - time.perf_counter()
            return await self.failover.call(call, left, pixels, abort=abort, variant=variant), pixels

        # The group's calls run until its newest request's deadline; an older one leaves at its own (classify).
        newest = max(a.received for a in asks)
        cascade = self.cascades.get(key[0])  # a cascade's group runs on its `first`, then the uncertain rows on
        stage1 = Choice(cascade.first, asks[0].choice.reason) if cascade else asks[0].choice  # its `then`
        (scores, pixels), variant = await self._stage1(cascade, stage1, newest, attempt)
        assert self.settings is not None
        escalation = None

        def source(row: int) -> bytes:  # a row's encoded image (the capture keeps disagreements)
            return images[scores.positions[row]]

        if cascade is not None and variant == cascade.first:
            await self._check(cascade)
            deadline = min(a.received for a in asks) + self.settings.inference_timeout_s  # the earliest request's
            scores, escalation = await self.cascader.run(cascade, scores, pixels, top_k, full, deadline, source)
            variant = cascade.name
        out, start = [], 0
        for w, ask in zip(group, asks, strict=True):
            n = len(w.images)
            waited = ms(started - w.enqueued)
            out.append(_outcome(scores, ask.choice, variant, range(start, start + n), waited, escalation))
            start += n
        if scores.positions:
            try:  # the answers are ready: a shadow that cannot start must not fail them
                s = self.settings
                self.shadow.maybe(scores, pixels, s.shadow_fraction, s.max_shadow_in_flight, escalation, source)
            except Exception:
                logger.exception("shadow run not started")
        return out

    # -- what the Classifiers say about themselves ----------------------------------

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


def _outcome(
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
