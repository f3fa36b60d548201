"""What a Classifier replica learns about its engine at start: its own speed, and the speed gate's verdict."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from app.config.speed_gate import SpeedGateVerdict
from app.runtime.measure import SpeedGate, Throughput, judge, measure_alternating
from app.runtime.plan import RuntimeOptions
from app.runtime.select import Engine, Opened, open_engine

logger = logging.getLogger("ray.serve")


@dataclass
class StartupReport:
    engine: str
    measured: dict[str, Throughput] = field(default_factory=dict)  # "batch_1", "batch_<max>"
    candidates: dict[str, Throughput] = field(default_factory=dict)  # auto: every engine tried, by name
    gate: SpeedGateVerdict | None = None

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"measured": {k: t.describe() for k, t in self.measured.items()}}
        if self.candidates:
            out["engine_candidates"] = {k: t.describe() for k, t in self.candidates.items()}
        if self.gate is not None:
            out["speed_gate"] = self.gate.describe()
        return out


def measure_engine(engine: Engine, max_batch: int, parallel: int) -> dict[str, Throughput]:
    """Batch 1 alone (latency) and the largest batch with the replica's parallel calls (throughput)."""
    one = measure_alternating({"x": engine.logits}, engine.dummy_batch(1), parallel=1)["x"]
    full = measure_alternating({"x": engine.logits}, engine.dummy_batch(max_batch), parallel=parallel)["x"]
    return {"batch_1": one, f"batch_{max_batch}": full}


def start_report(opened: Opened, max_batch: int, parallel: int) -> StartupReport:
    return StartupReport(opened.engine.name, measure_engine(opened.engine, max_batch, parallel), opened.candidates)


def run_speed_gate(
    variant: str,
    engine: Engine,
    gate: SpeedGate,
    baseline_path: str,
    baseline_opts: RuntimeOptions,
    batch: int,
    parallel: int,
) -> SpeedGateVerdict:
    """`variant` against the baseline variant's model, engine chosen by the same rules, on this node.

    Both run here, in alternating rounds, so the verdict is about this hardware and not about which
    replica happened to share its cores with a neighbour's warm-up.
    """
    baseline = open_engine(gate.baseline, baseline_path, baseline_opts, batch).engine
    try:
        x = engine.dummy_batch(batch)
        measured = measure_alternating({"variant": engine.logits, "baseline": baseline.logits}, x, parallel=parallel)
    finally:
        baseline.close()
    result = judge(variant, gate, measured["variant"], measured["baseline"])
    (logger.info if result.passed else logger.warning)("Classifier_%s %s", variant, result.message)
    return result
