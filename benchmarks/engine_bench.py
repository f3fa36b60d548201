"""The CPU engines side by side: OpenVINO against ONNX Runtime's CPU EP, on FP32 and both INT8 artifacts.

    python -m benchmarks.engine_bench

Each model runs on both engines as a local.yaml Classifier replica would (one thread per call, two calls at once,
OpenVINO with one stream per call) at batch 1 and 16, timed in alternating rounds (app.runtime.measure) so a noisy
neighbour slows both alike, beside each engine's top-1 on the sample photographs against FP32 on ONNX Runtime: a
faster engine that gives other answers is no use. Writes benchmarks/results/engine_bench-<date>-<host>.{json,md}.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.environment import RESULTS_DIR, host_name, print_environment, stamp
from benchmarks.report import markdown_table, write_report

ENGINES = ("cpu", "openvino")
BATCHES, THREADS, PARALLEL = (1, 16), 1, 2  # PARALLEL: local.yaml's max_concurrent_batches
HEADERS = ["model", "batch", "ORT CPU EP img/s", "OpenVINO img/s", "OpenVINO / ORT", "top-1 = FP32's: ORT / OpenVINO"]


def bench_model(path: Path) -> dict[str, Any]:
    from app.imaging.preprocess import preprocess
    from app.runtime import RuntimeOptions, measure_alternating
    from app.runtime.plan import EngineChoice, cpu_choice
    from app.runtime.select import build
    from app.served_model import builtin_transform
    from app.toolchain.samples import available_photos, sample_bytes

    names = sorted(available_photos())
    photos = np.stack([preprocess(sample_bytes(n), builtin_transform()) for n in names])
    opts = RuntimeOptions(threads=THREADS, streams=PARALLEL, prefer_gpu=False)
    # Each engine as it is, built directly: a replica's plan would move weights that can overflow U8S8 kernels
    # (the TensorRT artifact here) to ORT's U8U8 kernels and refuse OpenVINO, and this table shows why.
    choices = {"cpu": cpu_choice(), "openvino": EngineChoice("openvino")}
    engines = {e: build(str(path), opts, choices[e]) for e in ENGINES}
    out: dict[str, Any] = {"file": path.name, "engines": {}}
    for name, engine in engines.items():
        top1 = engine.logits(photos).argmax(1)
        out["engines"][name] = {"top1": dict(zip(names, map(int, top1), strict=True)), "batches": {}}
    for batch in BATCHES:
        x = engines["cpu"].dummy_batch(batch)
        measured = measure_alternating({n: e.logits for n, e in engines.items()}, x, parallel=PARALLEL, rounds=7)
        for name, t in measured.items():
            out["engines"][name]["batches"][str(batch)] = t.describe()
    for engine in engines.values():
        engine.close()
    return out


def rows(result: dict[str, Any]) -> list[list[Any]]:
    """Per model and batch: both engines' img/s, their ratio, and each one's top-1 agreement with FP32 on ORT."""
    reference, table = result["models"]["fp32"]["engines"]["cpu"]["top1"], []
    for model, r in result["models"].items():
        ort, ov = r["engines"]["cpu"], r["engines"]["openvino"]
        same = [f"{sum(e['top1'][k] == v for k, v in reference.items())}/{len(reference)}" for e in (ort, ov)]
        for batch in map(str, result["batches"]):
            a, b = ort["batches"][batch]["img_per_s"], ov["batches"][batch]["img_per_s"]
            table.append([model, int(batch), a, b, f"{b / a:.2f}x", " / ".join(same)])
    return table


def main(argv: list[str] | None = None) -> int:
    from app.served_model import default_files

    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args(argv)
    print_environment()
    files = default_files()
    if not files.fp32.is_file():
        print("no FP32 model (the reference): run `make models` first", file=sys.stderr)
        return 2
    models = {"fp32": files.fp32, "int8 (CPU, U8S8)": files.int8, "int8 (TensorRT, S8S8)": files.int8_trt}
    result: dict[str, Any] = {"batches": BATCHES, "threads": THREADS, "parallel": PARALLEL, "models": {}}
    for name, path in models.items():
        if path.is_file():
            print(f"{name}: {path.name}", file=sys.stderr, flush=True)
            result["models"][name] = bench_model(path)
    table = markdown_table(HEADERS, rows(result)) + "\n"
    print(table + write_report(RESULTS_DIR / f"engine_bench-{stamp()}-{host_name()}", result, table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
