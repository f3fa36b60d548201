"""A rollout's evidence: each variant's counts and latency histogram, the ledger's cumulative numbers for a pair,
and one step's share of them (the Rollout subtracts what it saw when the step began)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import zip_longest
from typing import Any

from app.pipeline.abstats import ABStats, LatencyHistogram
from app.rollout.bounds import quantile_lower_rank

P99 = 0.99


def _trim(counts: Iterable[int]) -> tuple[int, ...]:
    """Histogram counts without trailing empty bins: shorter to subtract, persist and send."""
    out = list(counts)
    while out and out[-1] == 0:
        out.pop()
    return tuple(out)


@dataclass(frozen=True)
class VariantCounts:
    """One variant's request and error counts and its latency histogram (`app.pipeline.abstats`'s bins, of successful
    requests only; trailing empty bins may be left out)."""

    requests: int = 0
    errors: int = 0
    latency: tuple[int, ...] = ()

    @classmethod
    def of(cls, latencies_ms: list[float], errors: int = 0) -> VariantCounts:
        """From raw latencies of successful requests, plus `errors` failed ones (tests, simulations)."""
        h = LatencyHistogram()
        for ms in latencies_ms:
            h.add(ms)
        return cls(len(latencies_ms) + errors, errors, _trim(h.counts))

    def minus(self, start: VariantCounts) -> VariantCounts | None:
        """The counts since `start`; None if any went backwards (the ledger was reset)."""
        lat = [a - b for a, b in zip_longest(self.latency, start.latency, fillvalue=0)]
        if self.requests < start.requests or self.errors < start.errors or min(lat, default=0) < 0:
            return None
        return VariantCounts(self.requests - start.requests, self.errors - start.errors, _trim(lat))

    @property
    def timed(self) -> int:
        return sum(self.latency)

    def error_rate(self) -> float | None:
        return self.errors / self.requests if self.requests else None

    def p99(self) -> float | None:
        return LatencyHistogram(list(self.latency)).quantile(P99)

    def p99_lower(self, alpha: float) -> float | None:
        """An anytime-valid lower bound on the true p99, to the histogram's resolution: it is the middle of the bin
        the bound falls in, as the p99 itself is. Bins are 2^(1/8) apart, so with max_p99_ratio 1.2 (2^(2.1/8)) a
        breach means bins three apart: a true ratio above 2^(2/8) ~ 1.19."""
        n = self.timed
        j = quantile_lower_rank(P99, n, alpha)
        if j == 0:
            return None
        # LatencyHistogram.quantile(q) reports the bin of the sample of 0-based rank q (n - 1): the j-th sample's
        # bin is at rank j - 0.5, which no rounding can move to a neighbour.
        return LatencyHistogram(list(self.latency)).quantile((j - 0.5) / max(n - 1, 1))

    def to_dict(self) -> dict[str, Any]:
        return {"requests": self.requests, "errors": self.errors, "latency": list(self.latency)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> VariantCounts:
        return cls(int(d["requests"]), int(d["errors"]), _trim(int(c) for c in d["latency"]))


@dataclass(frozen=True)
class LedgerCounts:
    """The ABLedger's cumulative numbers for one candidate/baseline pair; `since` is the ledger's epoch, which
    changes when it is reset."""

    shadowed: int = 0
    agree: int = 0
    candidate: VariantCounts = field(default_factory=VariantCounts)
    baseline: VariantCounts = field(default_factory=VariantCounts)
    since: float = 0.0

    @classmethod
    def from_abstats(cls, stats: ABStats, candidate: str, baseline: str, since: float = 0.0) -> LedgerCounts:
        pair = stats.pairs.get("|".join(sorted((candidate, baseline))))

        def variant(name: str) -> VariantCounts:
            v = stats.variants.get(name)
            return VariantCounts(v.requests, v.errors, _trim(v.latency.counts)) if v else VariantCounts()

        return cls(
            pair.shadowed if pair else 0, pair.top1_agree if pair else 0, variant(candidate), variant(baseline), since
        )

    def minus(self, start: LedgerCounts) -> StepEvidence | None:
        """The evidence since `start`; None if the ledger was reset in between (new epoch or counts went back)."""
        cand, base = self.candidate.minus(start.candidate), self.baseline.minus(start.baseline)
        n, k = self.shadowed - start.shadowed, self.agree - start.agree
        if self.since != start.since or cand is None or base is None or n < 0 or not 0 <= k <= n:
            return None
        return StepEvidence(n, k, cand, base)

    def to_dict(self) -> dict[str, Any]:
        return {
            "shadowed": self.shadowed,
            "agree": self.agree,
            "candidate": self.candidate.to_dict(),
            "baseline": self.baseline.to_dict(),
            "since": self.since,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LedgerCounts:
        return cls(
            int(d["shadowed"]),
            int(d["agree"]),
            VariantCounts.from_dict(d["candidate"]),
            VariantCounts.from_dict(d["baseline"]),
            float(d["since"]),
        )


@dataclass(frozen=True)
class StepEvidence:
    """One step's evidence: shadow comparisons of the pair, and each variant's requests."""

    comparisons: int = 0
    agreements: int = 0
    candidate: VariantCounts = field(default_factory=VariantCounts)
    baseline: VariantCounts = field(default_factory=VariantCounts)
