"""The confidence cascade's rule and the fitting of its threshold, pure (no Ray, no engines).

A cascade `first>then` answers each image with `first` and re-runs on `then` the images whose top-1 margin
(top-1 minus top-2 probability, by `first`) is below a threshold. What the threshold buys is read from
comparisons of `first` against `then` on the same images (the A/B shadows): `MarginEvidence` counts them by
`first`'s margin, `curve` says for every threshold how often the cascade would agree with `then` and how many
images it would escalate, and `fit_threshold` picks the smallest threshold whose agreement reaches the
target. An escalated image is answered by `then` itself, so it agrees with `then` by construction; only the
images kept on `first` can disagree."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from app.pipeline.intervals import wilson_interval

BUCKETS = 100  # the margin's resolution: thresholds are multiples of 0.01
Top = Sequence[tuple[int, float]]  # (class id, probability), best first


def margin(top: Top) -> float:
    """Top-1 minus top-2 probability: 1.0 for a sure answer, 0.0 for a tie (top needs at least 2 entries)."""
    if not top:
        return 0.0
    second = top[1][1] if len(top) > 1 else 0.0
    return max(0.0, min(1.0, top[0][1] - second))


def bucket(m: float) -> int:
    """The bucket of margin m: [0.00, 0.01) is 0, ..., [0.99, 1.00] is 99, with the bounds compared as
    `escalate` compares them (m < i / 100), so the curve at threshold i / 100 and the rule always agree."""
    i = min(BUCKETS - 1, max(0, int(m * BUCKETS)))
    while i > 0 and m < i / BUCKETS:  # m * 100 rounded up past a bound (0.29 * 100 = 28.999...)
        i -= 1
    while i < BUCKETS - 1 and m >= (i + 1) / BUCKETS:
        i += 1
    return i


def escalate(m: float, threshold: float) -> bool:
    """Whether an image of margin m goes on to `then` (threshold 0: none; 1: every image, a tie at 1.0 too)."""
    return threshold >= 1.0 or m < threshold


@dataclass
class MarginEvidence:
    """Comparisons of `first` with `then` on the same images, counted by `first`'s margin bucket."""

    agree: list[int] = field(default_factory=lambda: [0] * BUCKETS)
    disagree: list[int] = field(default_factory=lambda: [0] * BUCKETS)

    def add(self, m: float, agreed: bool, n: int = 1) -> None:
        (self.agree if agreed else self.disagree)[bucket(m)] += n

    def merge(self, other: MarginEvidence) -> None:
        for i in range(BUCKETS):
            self.agree[i] += other.agree[i]
            self.disagree[i] += other.disagree[i]

    @property
    def n(self) -> int:
        return sum(self.agree) + sum(self.disagree)

    def to_dict(self) -> dict[str, list[int]]:
        return {"agree": list(self.agree), "disagree": list(self.disagree)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> MarginEvidence:
        agree, disagree = [int(x) for x in d["agree"]], [int(x) for x in d["disagree"]]
        if len(agree) != BUCKETS or len(disagree) != BUCKETS:
            raise ValueError(f"margin evidence needs {BUCKETS} buckets per side")
        return cls(agree, disagree)

    @classmethod
    def of(cls, pairs: Iterable[tuple[float, bool]]) -> MarginEvidence:
        ev = cls()
        for m, agreed in pairs:
            ev.add(m, agreed)
        return ev


@dataclass(frozen=True)
class CurvePoint:
    threshold: float
    agreement: float  # with `then`, over all images: the escalated ones agree by construction
    agreement_low: float  # a lower bound: the kept images' disagreement rate at the upper end of its 95% Wilson
    # interval (two-sided, so a one-sided 97.5% bound)
    escalation: float  # the share of images re-run on `then`

    def to_dict(self) -> dict[str, float]:
        return {k: round(v, 6) for k, v in self.__dict__.items()}


def curve(ev: MarginEvidence) -> list[CurvePoint]:
    """For thresholds 0.00, 0.01, ..., 1.00: agreement with `then` and escalation rate, from the evidence."""
    n = ev.n
    if n == 0:
        return []
    points, escalated, disagreeing = [], 0, sum(ev.disagree)
    for i in range(BUCKETS + 1):  # threshold i/100 escalates buckets 0..i-1
        if i:
            escalated += ev.agree[i - 1] + ev.disagree[i - 1]
            disagreeing -= ev.disagree[i - 1]
        kept = n - escalated
        # Only kept images can disagree: the bound is on their disagreement rate, scaled by their share.
        _, worst = wilson_interval(disagreeing, kept) or (0.0, 0.0)
        points.append(CurvePoint(i / BUCKETS, 1 - disagreeing / n, 1 - worst * kept / n, escalated / n))
    return points


@dataclass(frozen=True)
class Fit:
    threshold: float
    fitted: bool  # False: too little evidence, `default` stands
    samples: int
    expected: CurvePoint | None  # what the evidence says of the chosen threshold
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "threshold": self.threshold,
            "fitted": self.fitted,
            "samples": self.samples,
            "expected": self.expected.to_dict() if self.expected else None,
            "reason": self.reason,
        }


def fit_threshold(ev: MarginEvidence, target: float, min_samples: int, default: float) -> Fit:
    """The smallest threshold whose agreement with `then`, as measured, is at least `target`.

    The measured agreement, not its lower bound: certifying 0.995 at 95% takes ~800 comparisons even with no
    disagreement at all, and until then the bound would send every image on. `min_samples` is what guards
    against a fit on too little (the curve's `agreement_low` says how sure each point is). With fewer
    comparisons, `default` (a conservative threshold: it escalates every image `first` is unsure of). When no
    threshold below 1 reaches the target, 1.0: everything goes to `then`.
    """
    n = ev.n
    if n < min_samples:
        return Fit(default, False, n, None, f"{n} comparisons of {min_samples} needed: the default stands")
    points = curve(ev)
    for p in points[:-1]:  # the last, 1.0, agrees by construction: it is the answer when nothing else does
        if p.agreement >= target:
            return Fit(p.threshold, True, n, p, f"the smallest threshold with agreement >= {target}")
    return Fit(1.0, True, n, points[-1], f"no threshold below 1 reaches {target}: every image goes on")
