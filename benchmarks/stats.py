"""Latency and throughput summaries shared by the model and service benchmarks."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

PERCENTILES = (50, 90, 99)


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (linear interpolation, numpy's default); None for no values."""
    return float(np.percentile(np.asarray(values, dtype=np.float64), q)) if len(values) else None


def median(values: Sequence[float]) -> float | None:
    return percentile(values, 50)


def latency_summary(seconds: Sequence[float]) -> dict[str, Any]:
    """Milliseconds: p50/p90/p99/max/mean of latencies given in seconds (None when there are none)."""
    ms = [s * 1000.0 for s in seconds]
    out: dict[str, Any] = {f"p{q}_ms": percentile(ms, q) for q in PERCENTILES}
    return {**out, "max_ms": max(ms) if ms else None, "mean_ms": float(np.mean(ms)) if ms else None}


def knee(xs: Sequence[float], throughputs: Sequence[float], tolerance: float = 0.05) -> float | None:
    """The smallest x whose throughput is within `tolerance` (fraction) of the maximum throughput: beyond it a
    larger batch (or more concurrency) buys at most `tolerance` more throughput and costs latency in proportion."""
    if len(xs) != len(throughputs):
        raise ValueError(f"{len(xs)} x values but {len(throughputs)} throughputs")
    points = [(x, t) for x, t in zip(xs, throughputs, strict=True) if t is not None and math.isfinite(t)]
    if not points:
        return None
    best = max(t for _, t in points)
    return min(x for x, t in points if t >= (1.0 - tolerance) * best)
