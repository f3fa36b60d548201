"""Latency and throughput summaries shared by the model and service benchmarks."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

PERCENTILES = (50, 90, 99)


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (linear interpolation, numpy's default); None for no values."""
    if not len(values):
        return None
    return float(np.percentile(np.asarray(values, dtype=np.float64), q))


def median(values: Sequence[float]) -> float | None:
    return percentile(values, 50)


def latency_summary(seconds: Sequence[float], percentiles: Sequence[int] = PERCENTILES) -> dict[str, Any]:
    """Milliseconds: p50/p90/p99/max/mean of latencies given in seconds (None when there are none)."""
    ms = [s * 1000.0 for s in seconds]
    out: dict[str, Any] = {f"p{q}_ms": percentile(ms, q) for q in percentiles}
    out["max_ms"] = max(ms) if ms else None
    out["mean_ms"] = float(np.mean(ms)) if ms else None
    return out


def knee(xs: Sequence[float], throughputs: Sequence[float], tolerance: float = 0.05) -> float | None:
    """The smallest x whose throughput is within `tolerance` (fraction) of the maximum throughput.

    Beyond the knee a larger batch (or more concurrency) buys at most `tolerance` more throughput
    and costs latency in proportion, so it is the natural operating point.
    """
    if len(xs) != len(throughputs):
        raise ValueError(f"{len(xs)} x values but {len(throughputs)} throughputs")
    points = [(x, t) for x, t in zip(xs, throughputs, strict=True) if t is not None and math.isfinite(t)]
    if not points:
        return None
    best = max(t for _, t in points)
    return min(x for x, t in points if t >= (1.0 - tolerance) * best)


def relative_spread(values: Sequence[float]) -> float | None:
    """(max - min) / median: how far apart repeated measurements of one quantity are."""
    vals = [v for v in values if v is not None]
    if len(vals) < 2:
        return None
    mid = float(np.median(vals))
    return (max(vals) - min(vals)) / mid if mid else None
