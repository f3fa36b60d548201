"""One request's answer from the pipeline: per image its top-k or its error, and where the time went."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from app.errors import ServiceError
from app.imaging.payloads import Scores
from app.pipeline.cascade_rule import escalate
from app.pipeline.cascade_stage import Escalation
from app.pipeline.routing import Choice

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
