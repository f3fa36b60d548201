"""A/B evidence, pure and mergeable: per-variant request counts and latency, and INT8-vs-FP32
agreement from shadow comparisons. Routers record locally and ship deltas to one ledger;
`merge` is associative so the ledger's totals equal what one Router would have counted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from app.pipeline.cascade_rule import MarginEvidence
from app.pipeline.inferstats import ModelStatsTable
from app.pipeline.intervals import wilson_interval

# Latency histogram: log-spaced bins from 0.1 ms to ~100 s, 8 per octave (each ~9% wide),
# so p50/p99 come from merged counts with under 5% error and constant memory.
_BINS_PER_OCTAVE = 8
_MIN_MS = 0.1
_NBINS = _BINS_PER_OCTAVE * 20


def _bin(ms: float) -> int:
    if ms <= _MIN_MS:
        return 0
    return min(int(math.log2(ms / _MIN_MS) * _BINS_PER_OCTAVE), _NBINS - 1)


def _bin_mid(i: int) -> float:
    return _MIN_MS * 2 ** ((i + 0.5) / _BINS_PER_OCTAVE)


@dataclass
class LatencyHistogram:
    counts: list[int] = field(default_factory=lambda: [0] * _NBINS)

    def add(self, ms: float) -> None:
        self.counts[_bin(ms)] += 1

    def merge(self, other: LatencyHistogram) -> None:
        self.counts = [a + b for a, b in zip(self.counts, other.counts, strict=True)]

    def quantile(self, q: float) -> float | None:
        total = sum(self.counts)
        if total == 0:
            return None
        rank = q * (total - 1)
        seen = 0
        for i, c in enumerate(self.counts):
            seen += c
            if seen > rank:
                return round(_bin_mid(i), 3)
        return round(_bin_mid(_NBINS - 1), 3)


@dataclass
class VariantStats:
    requests: int = 0
    errors: int = 0
    latency: LatencyHistogram = field(default_factory=LatencyHistogram)

    def merge(self, other: VariantStats) -> None:
        self.requests += other.requests
        self.errors += other.errors
        self.latency.merge(other.latency)


@dataclass
class PairStats:
    shadowed: int = 0
    top1_agree: int = 0
    top5_overlap_sum: float = 0.0
    abs_dp_sum: float = 0.0
    dropped: int = 0  # shadow runs skipped under load or failed: never counted as comparisons

    def merge(self, other: PairStats) -> None:
        self.shadowed += other.shadowed
        self.top1_agree += other.top1_agree
        self.top5_overlap_sum += other.top5_overlap_sum
        self.abs_dp_sum += other.abs_dp_sum
        self.dropped += other.dropped


def compare_top(primary: list[tuple[int, float]], shadow: list[tuple[int, float]]) -> tuple[bool, float, float]:
    """(top-1 agrees, top-5 overlap in [0, 1], |Δp| of each side's top-1 probability)."""
    top5_a = {c for c, _ in primary[:5]}
    top5_b = {c for c, _ in shadow[:5]}
    overlap = len(top5_a & top5_b) / max(1, min(5, len(primary), len(shadow)))
    return primary[0][0] == shadow[0][0], overlap, abs(primary[0][1] - shadow[0][1])


@dataclass
class ABStats:
    variants: dict[str, VariantStats] = field(default_factory=dict)
    pairs: dict[str, PairStats] = field(default_factory=dict)  # key "a|b", names sorted
    # Triton's per-model statistics ride along to the ledger (`ModelStatsTable`); not part of `summary`.
    models: ModelStatsTable = field(default_factory=ModelStatsTable)
    # A cascade's evidence (`MarginEvidence`): "first>then" -> first's margin against agreement with then.
    margins: dict[str, MarginEvidence] = field(default_factory=dict)

    def record_request(self, variant: str, latency_ms: float, ok: bool) -> None:
        v = self.variants.setdefault(variant, VariantStats())
        v.requests += 1
        v.errors += 0 if ok else 1
        if ok:
            v.latency.add(latency_ms)

    def record_shadow(self, a: str, b: str, top1_agree: bool, top5_overlap: float, abs_dp: float) -> None:
        p = self.pairs.setdefault("|".join(sorted((a, b))), PairStats())
        p.shadowed += 1
        p.top1_agree += int(top1_agree)
        p.top5_overlap_sum += top5_overlap
        p.abs_dp_sum += abs_dp

    def record_margin(self, first: str, then: str, margin: float, agreed: bool) -> None:
        self.margins.setdefault(f"{first}>{then}", MarginEvidence()).add(margin, agreed)

    def record_dropped_shadow(self, a: str, b: str) -> None:
        self.pairs.setdefault("|".join(sorted((a, b))), PairStats()).dropped += 1

    def merge(self, other: ABStats) -> None:
        for k, v in other.variants.items():
            self.variants.setdefault(k, VariantStats()).merge(v)
        for k, p in other.pairs.items():
            self.pairs.setdefault(k, PairStats()).merge(p)
        self.models.merge(other.models)
        for k, m in other.margins.items():
            self.margins.setdefault(k, MarginEvidence()).merge(m)

    def empty(self) -> bool:
        return not self.variants and not self.pairs and not self.margins and self.models.empty()

    def summary(self) -> dict[str, Any]:
        variants = {
            name: {
                "requests": v.requests,
                "errors": v.errors,
                "error_rate": round(v.errors / v.requests, 6) if v.requests else None,
                "latency_ms": {"p50": v.latency.quantile(0.5), "p99": v.latency.quantile(0.99)},
            }
            for name, v in sorted(self.variants.items())
        }
        pairs = {}
        for key, p in sorted(self.pairs.items()):
            ci = wilson_interval(p.top1_agree, p.shadowed)
            pairs[key] = {
                "shadowed": p.shadowed,
                "dropped": p.dropped,
                "top1_agreement": round(p.top1_agree / p.shadowed, 6) if p.shadowed else None,
                "top1_agreement_ci95": [round(ci[0], 6), round(ci[1], 6)] if ci else None,
                "mean_top5_overlap": round(p.top5_overlap_sum / p.shadowed, 6) if p.shadowed else None,
                "mean_abs_top1_prob_delta": round(p.abs_dp_sum / p.shadowed, 6) if p.shadowed else None,
            }
        return {"variants": variants, "pairs": pairs}
