"""ONNX Runtime alone, FP32 vs INT8, over batch sizes: latency, throughput, memory, and the knee.

    python -m benchmarks.model_bench                     # batch 1..64, --device auto
    python -m benchmarks.model_bench --quick             # a few seconds
    python -m benchmarks.model_bench --device cuda       # fails unless CUDA really runs the model

Each variant runs in a fresh process (so one model's allocations do not blur the other's memory figure)
through app.runtime.onnxruntime_engine (ONNX Runtime, CUDA or CPU EP). Per batch size: warm-up runs (dropped), then
timed runs for a time budget; p50/p99 of `session.run` wall time (on CUDA that includes the host<->device
copies a server pays too); throughput = batch / median. Peak memory is the rise of the process's peak RSS
(VmHWM, reset before the model loads) over its RSS just before loading; on CUDA the device memory the
process holds (nvidia-smi), else "n/a". The knee is the smallest batch whose throughput is within 5% of
the best. Writes benchmarks/results/model_bench-<date>-<host>.json and .png.
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.environment import RESULTS_DIR, host_name, print_environment, stamp, usable_cores
from benchmarks.report import markdown_table, pyplot, write_json
from benchmarks.stats import knee, percentile

BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64)
KNEE_TOLERANCE = 0.05


def _inputs(batch_sizes: Sequence[int], size: int) -> dict[int, np.ndarray]:
    """Real photographs, preprocessed as the server does, tiled up to each batch size."""
    from app.preprocess import preprocess
    from benchmarks.corpus import build_corpus

    images = [preprocess(im.data, size) for im in build_corpus(((640, 480),))]
    return {n: np.stack([images[i % len(images)] for i in range(n)]) for n in batch_sizes}


def time_runs(fn: Any, warmup: int, min_runs: int, max_runs: int, budget_s: float) -> list[float]:
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


def bench_variant(
    variant: str,
    path: str,
    device: str,
    threads: int,
    batch_sizes: Sequence[int],
    budget_s: float,
    warmup: int,
    min_runs: int,
    max_runs: int,
) -> dict[str, Any]:
    """Load one model and time it at every batch size. Meant to run in a fresh process."""
    from app.runtime import onnxruntime_engine
    from benchmarks.device import gpu_memory_mib, gpu_used_mib, proc_status_kib, reset_peak_rss, runtime_options

    inputs = _inputs(batch_sizes, 224)
    opts = runtime_options(device, threads)
    device_before = gpu_used_mib(opts.device_id) if opts.prefer_gpu else None
    rss_before = proc_status_kib("VmRSS") or 0
    peak_reset = reset_peak_rss()
    t0 = time.perf_counter()
    runner = onnxruntime_engine(path, opts)
    load_s = time.perf_counter() - t0
    if runner.spec.height != 224:  # the corpus was prepared for 224; a custom model gets its own size
        inputs = _inputs(batch_sizes, runner.spec.height)
    rss_loaded = proc_status_kib("VmRSS") or 0
    gpu_mib: list[float] = []
    device_delta: list[float] = []
    rows = []
    for n in batch_sizes:
        x = inputs[n]
        times = time_runs(lambda x=x: runner.logits(x), warmup, min_runs, max_runs, budget_s)
        ms = [t * 1000 for t in times]
        p50 = percentile(ms, 50) or float("nan")
        rows.append(
            {
                "batch": n,
                "runs": len(ms),
                "warmup_runs_dropped": warmup,
                "p50_ms": p50,
                "p99_ms": percentile(ms, 99),
                "min_ms": min(ms),
                "mean_ms": float(np.mean(ms)),
                "ms_per_image": p50 / n,
                "images_per_s": n / (p50 / 1000),
            }
        )
        if runner.active_provider == "CUDAExecutionProvider":
            if (mib := gpu_memory_mib()) is not None:
                gpu_mib.append(mib)
            elif device_before is not None and (used := gpu_used_mib(opts.device_id)) is not None:
                device_delta.append(used - device_before)
    peak = proc_status_kib("VmHWM") or 0
    return {
        "variant": variant,
        "model": path,
        "model_bytes": Path(path).stat().st_size,
        "provider": runner.active_provider,
        "providers": runner.providers,
        "requested_providers": runner.requested_providers,
        "threads": runner.opts.threads,
        "load_s": load_s,
        "rss_before_load_mib": rss_before / 1024,
        "rss_after_load_delta_mib": (rss_loaded - rss_before) / 1024,
        "peak_rss_delta_mib": (peak - rss_before) / 1024 if peak_reset else None,
        "peak_rss_note": "VmHWM after all batches minus VmRSS before loading" if peak_reset else "VmHWM reset refused",
        "device_memory_mib": max(gpu_mib) if gpu_mib else max(device_delta) if device_delta else "n/a",
        "device_memory_note": "this process (nvidia-smi)"
        if gpu_mib
        else "whole-device rise since load (nvidia-smi cannot see this pid)"
        if device_delta
        else "no CUDA provider active",
        "batches": rows,
        "knee_batch": knee([r["batch"] for r in rows], [r["images_per_s"] for r in rows], KNEE_TOLERANCE),
        "max_images_per_s": max(r["images_per_s"] for r in rows),
    }


def run_all(variants: dict[str, str], in_process: bool, **kwargs: Any) -> dict[str, dict[str, Any]]:
    out = {}
    for name, path in variants.items():
        print(f"{name}: {path}", file=sys.stderr, flush=True)
        if in_process:
            out[name] = bench_variant(name, path, **kwargs)
        else:
            with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
                out[name] = pool.submit(bench_variant, name, path, **kwargs).result()
        r = out[name]
        print(
            f"  {r['provider']}, {r['threads']} threads, knee at batch {r['knee_batch']}, "
            f"best {r['max_images_per_s']:.0f} img/s, peak RSS +{r['peak_rss_delta_mib'] or float('nan'):.0f} MiB",
            file=sys.stderr,
            flush=True,
        )
    return out


def to_markdown(result: dict[str, Any]) -> str:
    variants = result["variants"]
    names = list(variants)
    headers = ["batch"]
    for v in names:
        headers += [f"{v} p50 ms", f"{v} p99 ms", f"{v} img/s"]
    if {"fp32", "int8"} <= set(names):
        headers.append("int8 speed-up")
    rows = []
    for i, n in enumerate(result["batch_sizes"]):
        row: list[Any] = [n]
        for v in names:
            b = variants[v]["batches"][i]
            row += [b["p50_ms"], b["p99_ms"], b["images_per_s"]]
        if {"fp32", "int8"} <= set(names):
            row.append(f"{result['int8_speedup_by_batch'][str(n)]:.2f}x")
        rows.append(row)
    facts = markdown_table(
        ["variant", "provider", "threads", "knee batch", "best img/s", "peak RSS Δ MiB", "device MiB", "load s"],
        [
            [
                v,
                r["provider"],
                r["threads"],
                r["knee_batch"],
                r["max_images_per_s"],
                r["peak_rss_delta_mib"],
                r["device_memory_mib"],
                r["load_s"],
            ]
            for v, r in variants.items()
        ],
    )
    return markdown_table(headers, rows) + "\n" + facts


def plot(result: dict[str, Any], path: Path) -> Path:
    plt = pyplot()
    fig, (ax_t, ax_l) = plt.subplots(1, 2, figsize=(11, 4.5))
    for name, r in result["variants"].items():
        xs = [b["batch"] for b in r["batches"]]
        line = ax_t.plot(xs, [b["images_per_s"] for b in r["batches"]], marker="o", label=f"{name} ({r['provider']})")
        colour = line[0].get_color()
        k = r["knee_batch"]
        if k is not None:
            ky = next(b["images_per_s"] for b in r["batches"] if b["batch"] == k)
            ax_t.axvline(k, color=colour, linestyle=":", alpha=0.7)
            ax_t.annotate(
                f"knee {name}: batch {k}",
                (k, ky),
                textcoords="offset points",
                xytext=(6, -14),
                fontsize=8,
                color=colour,
            )
            ax_t.plot([k], [ky], marker="*", markersize=14, color=colour)
        ax_l.plot(xs, [b["p50_ms"] for b in r["batches"]], marker="o", color=colour, label=f"{name} p50")
        ax_l.plot(xs, [b["p99_ms"] for b in r["batches"]], linestyle="--", color=colour, label=f"{name} p99")
    for ax in (ax_t, ax_l):
        ax.set_xscale("log", base=2)
        ax.set_xticks(result["batch_sizes"], [str(n) for n in result["batch_sizes"]])
        ax.set_xlabel("batch size")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    ax_t.set_ylabel("images/s")
    ax_t.set_title(f"throughput (knee: within {KNEE_TOLERANCE:.0%} of the best)", fontsize=9)
    ax_l.set_yscale("log")
    ax_l.set_ylabel("ms per batch")
    ax_l.set_title("latency per session.run", fontsize=9)
    env = result["environment"]
    fig.suptitle(
        f"EfficientNet-Lite0 ONNX Runtime on {env['cpu_model']} ({env['usable_cpus']} cores), "
        f"{result['threads']} threads",
        fontsize=10,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def main(argv: list[str] | None = None) -> int:
    from app.models import default_files

    files = default_files()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cpu", "cuda", "auto"], default="auto")
    parser.add_argument("--threads", type=int, default=None, help="intra-op threads (default: usable cores)")
    parser.add_argument("--batch-sizes", type=_ints, default=list(BATCH_SIZES))
    parser.add_argument("--budget", type=float, default=1.5, help="seconds of timed runs per batch size")
    parser.add_argument("--warmup", type=int, default=3, help="dropped runs per batch size")
    parser.add_argument("--min-runs", type=int, default=5)
    parser.add_argument("--max-runs", type=int, default=500)
    parser.add_argument("--fp32", default=str(files.fp32))
    parser.add_argument("--int8", default=str(files.int8))
    parser.add_argument("--variants", default="fp32,int8", help="which of fp32,int8 to run")
    parser.add_argument("--in-process", action="store_true", help="no fresh process per variant (memory blurs)")
    parser.add_argument("--quick", action="store_true", help="batch 1,8,32, 0.3 s each: a smoke run")
    parser.add_argument("--out-dir", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    if args.quick:
        args.batch_sizes, args.budget, args.warmup, args.min_runs = [1, 8, 32], 0.3, 1, 3
    paths = {"fp32": args.fp32, "int8": args.int8}
    variants = {v: paths[v] for v in args.variants.split(",") if v}
    for name, path in variants.items():
        if not Path(path).is_file():
            parser.exit(2, f"error: {name} model not found: {path} (python -m app.models build / quantize)\n")
    env = print_environment()
    threads = args.threads or usable_cores()
    from app.runtime import ModelLoadError

    try:
        measured = run_all(
            variants,
            args.in_process,
            device=args.device,
            threads=threads,
            batch_sizes=args.batch_sizes,
            budget_s=args.budget,
            warmup=args.warmup,
            min_runs=args.min_runs,
            max_runs=args.max_runs,
        )
    except ModelLoadError as e:  # --device cuda without a usable GPU, a corrupt model, ...
        print(f"error: {e}", file=sys.stderr)
        return 2
    result: dict[str, Any] = {
        "environment": env,
        "device": args.device,
        "threads": threads,
        "batch_sizes": args.batch_sizes,
        "budget_s_per_batch": args.budget,
        "knee_tolerance": KNEE_TOLERANCE,
        "variants": measured,
    }
    if {"fp32", "int8"} <= set(measured):
        result["int8_speedup_by_batch"] = {
            str(a["batch"]): a["p50_ms"] / b["p50_ms"]
            for a, b in zip(measured["fp32"]["batches"], measured["int8"]["batches"], strict=True)
        }
    stem = args.out_dir / f"model_bench-{stamp()}-{host_name()}"
    write_json(stem.with_suffix(".json"), result)
    plot(result, stem.with_suffix(".png"))
    print(to_markdown(result))
    print(f"wrote {stem}.json and {stem}.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
