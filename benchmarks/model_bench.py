"""ONNX Runtime alone, FP32 vs INT8, over batch sizes: latency, throughput, memory, and the knee.

    python -m benchmarks.model_bench                     # batch 1..64, --device auto
    python -m benchmarks.model_bench --quick             # a few seconds
    python -m benchmarks.model_bench --device cuda       # fails unless CUDA really runs the model

Each variant runs in a fresh process on every usable core, so one model's allocations do not blur the other's
memory figure. Per batch size: dropped warm-up calls, then timed calls for 1.5 s (on CUDA including the
host<->device copies a server pays); img/s = batch / p50. Peak memory: the peak RSS (VmHWM, reset before
loading) minus the RSS before loading; on CUDA also how far the device's memory in use rose (nvidia-smi). The
knee: the smallest batch within 5% of the best img/s. Writes benchmarks/results/model_bench-<date>-<host>.json, .md.
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.environment import RESULTS_DIR, host_name, print_environment, stamp, usable_cores
from benchmarks.report import markdown_table, write_report
from benchmarks.stats import knee, latency_summary

BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64)
KNEE_TOLERANCE = 0.05
TIMING = {"warmup": 3, "min_runs": 5, "max_runs": 500, "budget_s": 1.5}  # time_runs' arguments
QUICK = {"warmup": 1, "min_runs": 3, "max_runs": 500, "budget_s": 0.3}  # --quick, at batch 1, 8 and 32


def time_runs(fn: Callable[[], Any], warmup: int, min_runs: int, max_runs: int, budget_s: float) -> list[float]:
    """Seconds per call: `warmup` calls dropped, then at least min_runs, more while the budget lasts."""
    for _ in range(warmup):
        fn()
    times: list[float] = []
    deadline = time.perf_counter() + budget_s
    while len(times) < min_runs or (len(times) < max_runs and time.perf_counter() < deadline):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def measure_batch(fn: Callable[[np.ndarray], Any], x: np.ndarray, timing: dict[str, Any]) -> dict[str, Any]:
    """One batch size: `timing` holds time_runs' arguments; latency in ms, img/s = batch / p50."""
    times = time_runs(lambda: fn(x), **timing)
    lat, n = latency_summary(times), len(x)
    per_s = n / (lat["p50_ms"] / 1000)
    return {"batch": n, "runs": len(times), **lat, "ms_per_image": lat["p50_ms"] / n, "images_per_s": per_s}


def in_fresh_process(fn: Callable[..., Any], *args: Any, isolate: bool = True) -> Any:
    """fn(*args), in a spawned process when `isolate` (its memory and CUDA state are its own)."""
    if not isolate:
        return fn(*args)
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(fn, *args).result()


def bench_variant(
    variant: str, path: str, device: str, threads: int, batch_sizes: Sequence[int], timing: dict[str, Any]
) -> dict[str, Any]:
    """Load one model and time it at every batch size. Meant to run in a fresh process."""
    from app.imaging.preprocess import preprocess
    from app.runtime import onnxruntime_engine
    from app.served_model import builtin_transform
    from benchmarks.corpus import build_corpus
    from benchmarks.device import gpu_used_mib, runtime_options
    from benchmarks.procs import peak_rss_mib, reset_peak_rss, rss_mib

    # Real photographs, preprocessed as the server does, tiled up to each batch size; made before loading, so
    # the model's memory figure leaves them out.
    images = [preprocess(im.data, builtin_transform()) for im in build_corpus(((640, 480),))]
    inputs = {n: np.stack([images[i % len(images)] for i in range(n)]) for n in batch_sizes}
    opts = runtime_options(device, threads)
    device_before = gpu_used_mib(opts.device_id) if opts.prefer_gpu else None
    rss_before, peak_reset = rss_mib(), reset_peak_rss()
    t0 = time.perf_counter()
    runner = onnxruntime_engine(path, opts)
    load_s = time.perf_counter() - t0
    rss_loaded = rss_mib()
    rows, device_rise = [], []
    for n in batch_sizes:
        rows.append(measure_batch(runner.logits, inputs[n], timing))
        if device_before is not None and (used := gpu_used_mib(opts.device_id)) is not None:
            device_rise.append(used - device_before)
    peak = peak_rss_mib() if peak_reset else None
    return {
        "variant": variant,
        "model": path,
        "provider": runner.active_provider,
        "threads": runner.opts.threads,
        "load_s": load_s,
        "rss_before_load_mib": rss_before,
        "rss_after_load_delta_mib": rss_loaded - rss_before,
        "peak_rss_delta_mib": None if peak is None else peak - rss_before,
        "device_memory_mib": max(device_rise, default=None),  # the whole device's, risen since before loading
        "batches": rows,
        "knee_batch": knee([r["batch"] for r in rows], [r["images_per_s"] for r in rows], KNEE_TOLERANCE),
        "max_images_per_s": max(r["images_per_s"] for r in rows),
    }


FACTS = {  # the second table: header -> bench_variant's key
    "provider": "provider",
    "threads": "threads",
    "knee batch": "knee_batch",
    "best img/s": "max_images_per_s",
    "peak RSS Δ MiB": "peak_rss_delta_mib",
    "device MiB": "device_memory_mib",
    "load s": "load_s",
}


def to_markdown(result: dict[str, Any]) -> str:
    variants, speedup = result["variants"], result["int8_speedup_by_batch"]
    cols = {"p50 ms": "p50_ms", "p99 ms": "p99_ms", "img/s": "images_per_s"}
    headers = ["batch", *(f"{v} {c}" for v in variants for c in cols), "int8 speed-up"]
    rows = [
        [n, *(r["batches"][i][k] for r in variants.values() for k in cols.values()), f"{speedup[str(n)]:.2f}x"]
        for i, n in enumerate(result["batch_sizes"])
    ]
    facts = [[v, *(r[k] for k in FACTS.values())] for v, r in variants.items()]
    return markdown_table(headers, rows) + "\n" + markdown_table(["variant", *FACTS], facts)


def main(argv: list[str] | None = None) -> int:
    from app.runtime import ModelLoadError
    from app.served_model import default_files

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cpu", "cuda", "auto"], default="auto")
    parser.add_argument("--quick", action="store_true", help="batch 1,8,32, 0.3 s each: a smoke run")
    args = parser.parse_args(argv)
    files = default_files()
    variants = {"fp32": str(files.fp32), "int8": str(files.int8)}
    if missing := [path for path in variants.values() if not Path(path).is_file()]:
        parser.exit(2, f"error: models not found: {missing} (python -m app.models build / quantize)\n")
    env = print_environment()
    batch_sizes, timing = ([1, 8, 32], QUICK) if args.quick else (list(BATCH_SIZES), TIMING)
    threads, measured = usable_cores(), {}
    try:
        for name, path in variants.items():
            print(f"{name}: {path}", file=sys.stderr, flush=True)
            r = measured[name] = in_fresh_process(bench_variant, name, path, args.device, threads, batch_sizes, timing)
            summary = f"knee at batch {r['knee_batch']}, best {r['max_images_per_s']:.0f} img/s"
            print(f"  {r['provider']}, {r['threads']} threads, {summary}", file=sys.stderr, flush=True)
    except ModelLoadError as e:  # --device cuda without a usable GPU, a corrupt model, ...
        print(f"error: {e}", file=sys.stderr)
        return 2
    pairs = zip(measured["fp32"]["batches"], measured["int8"]["batches"], strict=True)
    result: dict[str, Any] = {
        "environment": env,
        "device": args.device,
        "threads": threads,
        "batch_sizes": batch_sizes,
        "timing": timing,
        "knee_tolerance": KNEE_TOLERANCE,
        "variants": measured,
        "int8_speedup_by_batch": {str(a["batch"]): a["p50_ms"] / b["p50_ms"] for a, b in pairs},
    }
    markdown = to_markdown(result)
    print(markdown + write_report(RESULTS_DIR / f"model_bench-{stamp()}-{host_name()}", result, markdown))
    return 0


if __name__ == "__main__":
    sys.exit(main())
