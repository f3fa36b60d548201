"""IO binding against plain `session.run` on ONNX Runtime's CPU EP: does binding pay where no device copy exists?

    python -m benchmarks.io_binding [--repeats 5]

The FP32 model on the CPU EP as a local.yaml Classifier replica runs it (one thread a call, two calls at once),
bound (app/runtime/binding.py, one host buffer per batch slot) and unbound, at batch 1, 8 and 64, timed in
alternating rounds (app.runtime.measure) so a noisy neighbour slows both alike; `--repeats` such measurements,
the median img/s of each side reported, and the median of the paired ratios (bound / unbound within one
measurement: both sides saw the same neighbours), which is the figure to read on a busy machine.
Writes benchmarks/results/io_binding-<date>-<host>.{json,md}.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
from typing import Any

from benchmarks.environment import RESULTS_DIR, host_name, print_environment, stamp
from benchmarks.report import markdown_table, write_report

BATCHES, THREADS, PARALLEL = (1, 8, 64), 1, 2  # PARALLEL: local.yaml's max_concurrent_batches
HEADERS = ["batch", "unbound img/s", "bound img/s", "bound / unbound, paired: median (range)"]


def measure(repeats: int) -> dict[str, Any]:
    from app.models import default_files
    from app.runtime import RuntimeOptions, cpu_engine, measure_alternating

    opts = RuntimeOptions(threads=THREADS, streams=PARALLEL, prefer_gpu=False)
    engines = {
        name: cpu_engine(default_files().fp32, dataclasses.replace(opts, io_binding=bound))
        for name, bound in (("unbound", False), ("bound", True))
    }
    out: dict[str, Any] = {"threads": THREADS, "parallel": PARALLEL, "repeats": repeats, "batches": {}}
    for batch in BATCHES:
        x = engines["unbound"].dummy_batch(batch)
        runs: dict[str, list[float]] = {name: [] for name in engines}
        for _ in range(repeats):
            measured = measure_alternating({n: e.logits for n, e in engines.items()}, x, parallel=PARALLEL, rounds=5)
            for name, t in measured.items():
                runs[name].append(t.img_per_s)
        out["batches"][str(batch)] = {
            name: {"img_per_s": v, "median": statistics.median(v)} for name, v in runs.items()
        }
        out["batches"][str(batch)]["paired_ratios"] = [
            round(b / a, 3) for a, b in zip(runs["unbound"], runs["bound"], strict=True)
        ]
    return out


def rows(result: dict[str, Any]) -> list[list[Any]]:
    table = []
    for batch, r in result["batches"].items():
        a, b, ratios = r["unbound"]["median"], r["bound"]["median"], r["paired_ratios"]
        spread = f"{statistics.median(ratios):.3f}x ({min(ratios):.2f}-{max(ratios):.2f})"
        table.append([int(batch), a, b, spread])
    return table


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=5, help="measurements per batch size; the median is reported")
    ns = p.parse_args(argv)
    print_environment()
    result = measure(ns.repeats)
    table = markdown_table(HEADERS, rows(result)) + "\n"
    print(table + write_report(RESULTS_DIR / f"io_binding-{stamp()}-{host_name()}", result, table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
