"""Speed truth at start-up: throughput measured on the replica's own engine, and the speed gate.

A replica measures what it will serve with (its engine, its batch sizes, its parallel calls), so
`GET /v1/models` reports this node's figures rather than a benchmark from somewhere else. Two
engines are compared in alternating rounds, so a noisy neighbour slows both rather than one.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any, Literal

import numpy as np

from app.config.speed_gate import SpeedGateVerdict

Run = Callable[[np.ndarray], Any]


@dataclass(frozen=True)
class Throughput:
    batch: int
    parallel: int  # calls in flight at once
    ms: float  # median wall time of one round (`parallel` calls of `batch` images)
    img_per_s: float

    def describe(self) -> dict[str, Any]:
        return asdict(self)


def _round(run: Run, x: np.ndarray, parallel: int, pool: ThreadPoolExecutor | None) -> float:
    t0 = time.perf_counter()
    if pool is None or parallel == 1:
        run(x)
    else:
        list(pool.map(run, [x] * parallel))
    return time.perf_counter() - t0


def measure_alternating(
    runs: dict[str, Run], x: np.ndarray, parallel: int = 1, rounds: int = 3, min_s: float = 0.1, max_rounds: int = 50
) -> dict[str, Throughput]:
    """Each of `runs` timed on `x`, round by round in turn; the median round per name.

    Each name runs at least `rounds` rounds and, per name, at least `min_s` seconds in all (at most
    `max_rounds`), after one untimed round (first-call allocation).
    """
    batch = len(x)
    times: dict[str, list[float]] = {name: [] for name in runs}
    with ThreadPoolExecutor(parallel) if parallel > 1 else contextlib.nullcontext() as pool:
        for run in runs.values():
            _round(run, x, parallel, pool)
        while any(len(t) < rounds or (sum(t) < min_s and len(t) < max_rounds) for t in times.values()):
            for name, run in runs.items():
                times[name].append(_round(run, x, parallel, pool))
    out = {}
    for name, t in times.items():
        median = statistics.median(t)
        out[name] = Throughput(batch, parallel, round(median * 1000, 3), round(batch * parallel / median, 1))
    return out


MAX_SPEEDUP = 1e6  # what a speed-up reads when the baseline measured (next to) nothing


@dataclass(frozen=True)
class SpeedGate:
    baseline: str
    min_speedup: float
    action: Literal["warn", "fail"]


def judge(variant: str, gate: SpeedGate, mine: Throughput, baseline: Throughput) -> SpeedGateVerdict:
    # From the times (img_per_s is rounded to 0.1 img/s: a slow baseline would read 0), capped so the figure stays
    # finite: it goes out as JSON (/v1/models) and as a gauge, where infinity is no number. A side whose time
    # reads 0 was not measured: no speed-up is claimed.
    def rate(t: Throughput) -> float:
        return t.batch * t.parallel / t.ms

    measured = mine.ms > 0 and baseline.ms > 0
    speedup = min(MAX_SPEEDUP, rate(mine) / rate(baseline)) if measured else 0.0
    passed, shown = speedup >= gate.min_speedup, round(speedup, 3)
    message = (
        f"speed gate: {variant} does {mine.img_per_s} img/s at batch {mine.batch}, {gate.baseline} does "
        f"{baseline.img_per_s} img/s on the same node: speedup {shown:.2f}x {'meets' if passed else 'is below'} "
        f"min_speedup {gate.min_speedup}x"
    )
    return SpeedGateVerdict(
        variant=variant,
        baseline=gate.baseline,
        batch=mine.batch,
        variant_img_per_s=mine.img_per_s,
        baseline_img_per_s=baseline.img_per_s,
        speedup=shown,
        min_speedup=gate.min_speedup,
        action=gate.action,
        passed=passed,
        message=message,
    )
