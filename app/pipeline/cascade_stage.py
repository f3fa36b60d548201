"""Serving a cascade (`first>then`): every image on `first`, the uncertain ones again on `then`, as one group.

A cascade is routable like a variant (weights, the override header, shadows, rollouts) but has no
deployment: the pipeline runs its group on `first` (failover included), reads each image's top-1
margin, and sends the rows below the threshold to `then` in one call on the pixels already decoded.
`then`'s answers replace `first`'s for those rows. If `then` cannot answer (down, overloaded, lost
mid-call), the images keep `first`'s answers and the reply says the escalation failed: a cascade
never turns a servable request into an error.

The threshold is fixed, or (`margin: auto`) fitted by the cascade's rule (`fit_threshold`) from the A/B shadows'
comparisons of `first` with `then`, which every Router ships to the ledger; each Router refits from
the ledger's merged evidence about once a second (`Cascades.refit`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from app.config import CascadeArgs
from app.errors import ServiceError, find_service_error
from app.imaging.payloads import Scores
from app.pipeline.cascade_rule import Fit, MarginEvidence, curve, escalate, fit_threshold, margin
from app.pipeline.failover import Failover
from app.pipeline.ports import Backend, Call, CascadeMetrics, ReplicaLost

logger = logging.getLogger("ray.serve")
# `then` must answer this long before the group's earliest deadline, or first's answers are returned as they are:
# a slow `then` costs the escalation, never the request.
THEN_SLACK_S = 0.1
Top = list[tuple[int, float]]
Source = Callable[[int], "bytes | None"]  # a row of the group -> its encoded image, if the Router has it


class Capture(Protocol):
    def add(self, cascade: str, image: bytes, meta: dict[str, Any]) -> None: ...


@dataclass
class CascadeState:
    name: str
    args: CascadeArgs
    threshold: float
    fit: Fit | None = None  # margin auto: the last fit
    evidence: MarginEvidence = field(default_factory=MarginEvidence)  # auto: what it was fitted on
    checked: bool = False  # the input sizes of first and then compared (Pipeline._check)
    problem: str | None = None  # why it cannot escalate (then takes other pixels): first's answers stand

    @property
    def first(self) -> str:
        return self.args.first

    @property
    def then(self) -> str:
        return self.args.then

    @property
    def auto(self) -> bool:
        return self.args.margin == "auto"

    def describe(self, with_curve: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {
            "first": self.first,
            "then": self.then,
            "margin": self.args.margin,
            "threshold": self.threshold,
        }
        if self.problem is not None:
            out["problem"] = self.problem
        if self.auto:
            out |= {
                "target_agreement": self.args.target_agreement,
                "min_samples": self.args.min_samples,
                "default_margin": self.args.default_margin,
                "fit": self.fit.to_dict() if self.fit else None,
            }
        if with_curve:
            out["evidence"] = {"comparisons": self.evidence.n, "disagreements": sum(self.evidence.disagree)}
            out["curve"] = [p.to_dict() for p in curve(self.evidence)]
        return out


class Cascades:
    """The declared cascades and their thresholds (fixed, or fitted from the ledger's evidence)."""

    def __init__(self, args: dict[str, CascadeArgs]) -> None:
        self.states = {
            name: CascadeState(name, a, a.default_margin if a.margin == "auto" else float(a.margin))
            for name, a in args.items()
        }
        for s in self.states.values():
            if s.auto:
                s.fit = fit_threshold(MarginEvidence(), s.args.target_agreement, s.args.min_samples, s.threshold)

    def get(self, name: str) -> CascadeState | None:
        return self.states.get(name)

    def pairs(self) -> set[tuple[str, str]]:
        """(first, then) of every cascade: the comparisons worth counting by margin."""
        return {(s.first, s.then) for s in self.states.values()}

    def any_auto(self) -> bool:
        return any(s.auto for s in self.states.values())

    def refit(self, margins: dict[str, MarginEvidence]) -> bool:
        """The auto thresholds from the merged evidence ("first>then" -> counts); True if a threshold moved."""
        moved = False
        for s in self.states.values():
            if not s.auto:
                continue
            s.evidence = margins.get(f"{s.first}>{s.then}") or MarginEvidence()
            fit = fit_threshold(s.evidence, s.args.target_agreement, s.args.min_samples, s.args.default_margin)
            if fit.threshold != s.threshold:
                logger.info("cascade %s: threshold %.2f -> %.2f (%s)", s.name, s.threshold, fit.threshold, fit.reason)
                moved = True
            s.threshold, s.fit = fit.threshold, fit
        return moved

    def thresholds(self) -> dict[str, float]:
        return {name: s.threshold for name, s in self.states.items()}

    def describe(self, with_curve: bool = False) -> dict[str, Any]:
        return {name: s.describe(with_curve) for name, s in sorted(self.states.items())}


@dataclass
class Escalation:
    """What the second stage did for one group: per row of `first`'s answer, its margin and whether it went on."""

    cascade: CascadeState
    threshold: float
    margins: list[float]
    first_top: dict[int, Top]  # the rows re-run on `then` (or meant to be, when `failed`), in order: first's
    # answer of each, which with then's is a comparison (evidence, capture)
    failed: str | None = None  # the error code that kept `then` from answering, if it did not
    ms: float = 0.0  # the second stage's wall time

    @property
    def rows(self) -> list[int]:
        return list(self.first_top)

    def escalated(self, row: int) -> bool:
        return self.failed is None and row in self.first_top


class Cascader:
    """The second stage of a cascade's group."""

    def __init__(
        self, backend: Backend, failover: Failover, metrics: CascadeMetrics, capture: Capture | None = None
    ) -> None:
        """capture: where a cascade keeps the images its two stages disagree on, when one is configured."""
        self.backend = backend
        self.failover = failover
        self.metrics = metrics
        self.capture = capture

    async def run(
        self,
        state: CascadeState,
        first: Scores,
        pixels: Call | Any,
        top_k: int,
        full: bool,
        deadline: float,
        source: Source | None = None,
    ) -> tuple[Scores, Escalation]:
        """`first`'s answer with the uncertain rows answered by `then`; the Scores' variant is the cascade's.

        deadline: the group's earliest request's (perf_counter); `then` gets until THEN_SLACK_S before it."""
        threshold = state.threshold
        margins = [margin(t) for t in first.top]
        rows = [r for r, m in enumerate(margins) if escalate(m, threshold)]
        esc = Escalation(state, threshold, margins, {r: first.top[r] for r in rows})
        answer = _renamed(first, state.name)
        if rows and state.problem is not None:
            esc.failed = "variant_unavailable"
        elif rows:
            started = time.perf_counter()
            try:
                then = await self._then(state.then, pixels, top_k, full, rows, deadline - THEN_SLACK_S)
            except Exception as e:  # not a cancellation (a BaseException): that goes up, with the call cancelled
                found = find_service_error(e)
                esc.failed = found.code if found is not None else "replica_failed"
                if found is None:
                    logger.warning("cascade %s: %s failed (%s); first's answers stand", state.name, state.then, e)
            else:
                answer = _merged(answer, rows, then)
            esc.ms = round((time.perf_counter() - started) * 1000, 3)
        self._account(esc, len(margins), answer, source)
        return answer, esc

    async def _then(
        self, variant: str, pixels: Any, top_k: int, full: bool, rows: list[int], deadline: float
    ) -> Scores:
        if not self.failover.health.available(variant, time.monotonic()):
            raise ServiceError("variant_unavailable", f"variant {variant} is down", variant)
        left = deadline - time.perf_counter()
        if left <= 0:
            raise ServiceError("inference_timeout", "no time left before the deadline", variant)
        call = self.backend.classify(variant, pixels, top_k, full, rows)
        abort = self.failover.abort_event(variant)  # a replica of `then` lost meanwhile: give up at once
        try:
            scores: Scores = await self.failover.call(call, left, abort=abort, variant=variant)
        except ReplicaLost as e:
            self.failover.mark_failed(variant)
            raise ServiceError("variant_unavailable" if e.unavailable else "replica_failed", str(e), variant) from None
        return scores

    def _account(self, esc: Escalation, n: int, answer: Scores, source: Source | None) -> None:
        name = esc.cascade.name
        gone_on = len(esc.rows)
        outcome = "escalated" if esc.failed is None else "escalation_failed"
        if gone_on:
            self.metrics.cascade_images(name, outcome, gone_on)
        if n - gone_on:
            self.metrics.cascade_images(name, "kept", n - gone_on)
        if esc.failed is None and self.capture is not None and source is not None:
            for r in esc.rows:  # both answers are known for every escalated row: keep the disagreements
                self.keep_disagreement(esc.cascade, source(r), esc.first_top[r], answer.top[r])

    def keep_disagreement(self, state: CascadeState, image: bytes | None, first: Top, then: Top) -> None:
        if self.capture is None or image is None or not first or not then or first[0][0] == then[0][0]:
            return
        meta = {"first": state.first, "then": state.then, "margin": round(margin(first), 6)}
        meta |= {"first_top1": [first[0][0], round(first[0][1], 6)], "then_top1": [then[0][0], round(then[0][1], 6)]}
        try:
            self.capture.add(state.name, image, meta)
        except Exception:  # keeping a calibration image must never fail an answer
            logger.exception("cascade %s: capture failed", state.name)


def _renamed(scores: Scores, variant: str) -> Scores:
    return Scores(
        list(scores.top),
        scores.preprocess_ms,
        scores.queue_ms,
        scores.inference_ms,
        scores.batch_size,
        variant,
        scores.provider,
        scores.errors,
        scores.positions,
        scores.logits,
    )


def _merged(answer: Scores, rows: list[int], then: Scores) -> Scores:
    """`then`'s rows (in `rows` order) over `answer`'s."""
    for r, top in zip(rows, then.top, strict=True):
        answer.top[r] = top
    if answer.logits is not None and then.logits is not None:
        logits = np.array(answer.logits, copy=True)
        logits[rows] = then.logits
        answer.logits = logits
    return answer
