"""One GPU node, four ways to run EfficientNet-Lite0: start-up cost, speed per batch, and where each node ran.

    python -m benchmarks.gpu_check                          # every target, batch 1,8,32,64
    python -m benchmarks.gpu_check --targets trt-int8,cuda-fp32 --batches 1,64
    python -m benchmarks.gpu_check --cpu-dry-run            # the same flow on the CPU EP (no GPU needed)

Targets (README "Engines"):

    trt-int8       TensorRT EP, INT8 (explicit quantization) from the TensorRT artifact *-int8-trt.onnx
    trt-fp16       TensorRT EP on the FP32 model with FP16 kernels allowed
    cuda-fp32      CUDA EP on the FP32 model
    cuda-qdq-int8  CUDA EP on the CPU INT8 artifact *-int8.onnx: the slow path the server refuses by default
                   (the CUDA EP has no INT8 kernels for QDQ graphs), measured here to show why

Each target's providers come from the project's own planner (app.runtime.plan.plan_engines with the engine
forced), so the options are the ones a replica would use; the CPU EP stays last, so a node neither GPU
provider takes is reported, not refused. Per target, in a fresh process each (--in-process: not):

- cold start: session creation with an empty TensorRT engine cache directory (engine build included), then
  the first call at the smallest batch;
- cached start: a second session with the same cache directory, in another fresh process (a restarted
  replica: it pays CUDA's initialisation again but loads the engine instead of building it);
- per batch size: dropped warm-up calls, then timed calls for --budget seconds (at least --min-runs);
  p50/p90/p99 of one call (host<->device copies included, as a server pays them); img/s = batch / p50;
- placement: which execution provider ONNX Runtime assigned each node, the count per provider and the names
  of the nodes not on the intended provider.

Writes benchmarks/results/<date>-<host>-gpu.json and .md (a dry run: -gpu-dryrun.*), prints the tables.
Exit status: 0 when every target ran, 1 when some failed (their errors are in the report), 2 when nothing
could be measured (GPU providers unusable here, a model file missing, a cache directory not empty).
"""

from __future__ import annotations

import argparse
import multiprocessing
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.runtime.plan import (
    CPU,
    CUDA,
    TENSORRT,
    EngineChoice,
    RuntimeOptions,
    TensorRTOptions,
    cpu_choice,
    plan_engines,
)
from benchmarks.environment import RESULTS_DIR, format_environment, host_name, print_environment, stamp
from benchmarks.model_bench import time_runs
from benchmarks.report import fmt, markdown_table, write_json
from benchmarks.stats import latency_summary

BATCHES = (1, 8, 32, 64)
GPU_PROVIDERS = (TENSORRT, CUDA, CPU)
MAX_BATCH = 64  # the TensorRT profile spans 1..64 as served (TensorRTOptions.max_batch_size)
REFERENCE = "cuda-fp32"  # the "vs" column of the table
OFF_SHOWN = 5  # node names shown per target in the Markdown table (the JSON has all)


# --------------------------------------------------------------------------- targets


def tensorrt_choice(name: str, path: str, opts: RuntimeOptions) -> EngineChoice:
    """TensorRT EP first (CUDA, then CPU, for what it does not take), its cache keyed as the server keys it."""
    from app.runtime.select import tensorrt_for

    return plan_engines(name, opts, GPU_PROVIDERS, openvino=False, tensorrt=tensorrt_for(path, opts)).candidates[0]


def cuda_choice(name: str, path: str, opts: RuntimeOptions) -> EngineChoice:
    """CUDA EP first, CPU for what it does not take; no TensorRT."""
    return plan_engines(name, opts, GPU_PROVIDERS, openvino=False).candidates[0]


@dataclass(frozen=True)
class Target:
    name: str
    model: str  # which --<model> path it runs: fp32, int8 or trt_int8
    intended: str  # the provider that should run the nodes
    engine: str
    precision: str
    fp16: bool
    factory: Callable[[str, str, RuntimeOptions], EngineChoice]
    about: str

    def options(self, threads: int, cache_dir: Path, max_batch: int, device_id: int) -> RuntimeOptions:
        return RuntimeOptions(
            threads=threads,
            engine=self.engine,
            precision=self.precision,
            fp16=self.fp16,
            prefer_gpu=True,
            allow_slow_int8=True,  # cuda-qdq-int8 is the slow path on purpose
            device_id=device_id,
            tensorrt=TensorRTOptions(cache_dir=str(cache_dir), max_batch_size=max_batch),
        )


TARGETS = (
    Target("trt-int8", "trt_int8", TENSORRT, "tensorrt", "int8", False, tensorrt_choice, "TensorRT INT8 artifact"),
    Target("trt-fp16", "fp32", TENSORRT, "tensorrt", "fp32", True, tensorrt_choice, "FP32 model, FP16 allowed"),
    Target("cuda-fp32", "fp32", CUDA, "cuda", "fp32", False, cuda_choice, "FP32 model on the CUDA EP"),
    Target("cuda-qdq-int8", "int8", CUDA, "cuda", "int8", False, cuda_choice, "CPU INT8 (QDQ) on the CUDA EP"),
)
TARGET_NAMES = tuple(t.name for t in TARGETS)


def needed_providers(targets: Sequence[Target]) -> list[str]:
    """The GPU providers the targets need (TensorRT's targets also fall back to CUDA), in ORT's order."""
    needed = {t.intended for t in targets} | ({CUDA} if any(t.intended == TENSORRT for t in targets) else set())
    return [p for p in (TENSORRT, CUDA) if p in needed]


def unusable_gpu_providers(providers: Sequence[str]) -> dict[str, list[str]]:
    """Provider -> the libraries it cannot load here ([] when it is not built into this ONNX Runtime)."""
    from app.runtime.ort_engine import missing_libraries, usable_providers

    usable = usable_providers()
    return {p: missing_libraries(p) for p in providers if p not in usable}


def unusable_message(unusable: dict[str, list[str]]) -> str:
    parts = [
        f"{p} cannot load {', '.join(libs)}" if libs else f"{p} is not built into this onnxruntime (onnxruntime-gpu)"
        for p, libs in unusable.items()
    ]
    return (
        "the GPU execution providers are not usable here: "
        + "; ".join(parts)
        + ". Install the CUDA 13, cuDNN 9 and TensorRT 10 libraries (k8s/Dockerfile installs them), "
        "or pass --cpu-dry-run to run the same flow on the CPU EP"
    )


# --------------------------------------------------------------------------- one target (in its own process)


def cache_files(directory: str) -> dict[str, int]:
    """Files (engines, timing caches) under a target's cache directory and their size; the build lock not counted."""
    root = Path(directory)
    files = [f for f in root.rglob("*") if f.is_file() and f.name != ".build.lock"] if root.is_dir() else []
    return {"files": len(files), "bytes": sum(f.stat().st_size for f in files)}


def placement_report(placement: dict[str, list[str]], intended: str) -> dict[str, Any]:
    counts = {ep: len(nodes) for ep, nodes in sorted(placement.items())}
    off = [f"{ep}: {node}" for ep, nodes in sorted(placement.items()) if ep != intended for node in nodes]
    return {
        "intended_provider": intended,
        "nodes_per_provider": counts,
        "nodes": sum(counts.values()),
        "on_intended": counts.get(intended, 0),
        "not_on_intended": off,
    }


def start_phase(
    path: str,
    opts: RuntimeOptions,
    choice: EngineChoice,
    intended: str,
    cache_dir: str,
    batches: Sequence[int],
    timing: dict[str, Any] | None,
) -> dict[str, Any]:
    """Create a session (timed), call it once at the smallest batch (timed), report placement and the
    cache; with `timing`, also time every batch size. Meant to run in a fresh process."""
    from app.runtime.ort_engine import OrtEngine
    from app.runtime.select import build

    t0 = time.perf_counter()
    engine = build(path, opts, choice)  # the server's way: TensorRT builds under the cache's lock
    session_s = time.perf_counter() - t0
    assert isinstance(engine, OrtEngine)  # every target is an ONNX Runtime choice
    try:
        x = engine.dummy_batch(min(batches))
        t0 = time.perf_counter()
        engine.logits(x)
        first_call_ms = (time.perf_counter() - t0) * 1000
        out: dict[str, Any] = {
            "session_s": session_s,
            "first_call_ms": first_call_ms,
            "first_call_batch": len(x),
            "engine_cache": cache_files(cache_dir),
            "requested_providers": engine.requested_providers,
            "session_providers": engine.providers,
            "placement": placement_report(engine.placement, intended),
        }
        if timing is not None:
            out["batches"] = [measure_batch(engine, n, **timing) for n in batches]
        return out
    finally:
        engine.close()


def measure_batch(engine: Any, n: int, warmup: int, min_runs: int, max_runs: int, budget_s: float) -> dict[str, Any]:
    x = engine.dummy_batch(n)
    times = time_runs(lambda: engine.logits(x), warmup, min_runs, max_runs, budget_s)
    lat = latency_summary(times)
    return {
        "batch": n,
        "runs": len(times),
        "warmup_runs_dropped": warmup,
        **lat,
        "ms_per_image": lat["p50_ms"] / n,
        "images_per_s": n / (lat["p50_ms"] / 1000),
    }


def _phase(isolate: bool, *args: Any) -> dict[str, Any]:
    """start_phase, in a fresh process when `isolate`; a failure comes back as {"error": ...}."""
    try:
        if not isolate:
            return start_phase(*args)
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
            return pool.submit(start_phase, *args).result()
    except BrokenProcessPool as e:
        return {"error": f"the measuring process died (a crash in the provider?): {e}"}
    except Exception as e:  # ModelLoadError, an ORT failure while running
        return {"error": f"{type(e).__name__}: {e}"}


def run_target(
    target: Target,
    path: str,
    choice: EngineChoice,
    planned: EngineChoice,
    opts: RuntimeOptions,
    cache_dir: Path,
    batches: Sequence[int],
    timing: dict[str, Any],
    isolate: bool,
) -> dict[str, Any]:
    intended = choice.providers[0].name
    out: dict[str, Any] = {
        "target": target.name,
        "about": target.about,
        "model": path,
        "model_bytes": Path(path).stat().st_size,
        "intended_provider": intended,
        "planned": planned.describe(),  # what the GPU run uses (also recorded in a dry run)
        "ran": choice.describe(),
        "cache_dir": str(cache_dir),
        "isolation": "process" if isolate else "none",
    }
    before = cache_files(str(cache_dir))
    if before["files"]:
        return {**out, "error": f"engine cache {cache_dir} is not empty: the cold start would not be cold"}
    cold = _phase(isolate, path, opts, choice, intended, str(cache_dir), batches, timing)
    out["cold_start"] = {k: v for k, v in cold.items() if k != "batches"}
    if "error" in cold:
        return {**out, "error": f"cold start: {cold['error']}"}
    out["cached_start"] = _phase(isolate, path, opts, choice, intended, str(cache_dir), batches, None)
    if "error" in out["cached_start"]:
        return {**out, "error": f"cached start: {out['cached_start']['error']}"}
    out["placement"] = cold["placement"]
    out["cached_placement_same"] = cold["placement"] == out["cached_start"]["placement"]
    # TensorRT: a cached start that wrote engine files again rebuilt instead of loading the cold start's engine.
    out["cached_start_rebuilt"] = out["cached_start"]["engine_cache"]["files"] > cold["engine_cache"]["files"]
    out["batches"] = cold["batches"]
    out["max_images_per_s"] = max(b["images_per_s"] for b in cold["batches"])
    return out


# --------------------------------------------------------------------------- report


def speedups(targets: dict[str, dict[str, Any]], reference: str = REFERENCE) -> dict[str, dict[str, float]]:
    """target -> {batch: img/s / the reference's img/s}; {} when the reference did not run."""
    ref = targets.get(reference, {})
    if "batches" not in ref:
        return {}
    base = {b["batch"]: b["images_per_s"] for b in ref["batches"]}
    return {
        name: {str(b["batch"]): b["images_per_s"] / base[b["batch"]] for b in r["batches"] if base.get(b["batch"])}
        for name, r in targets.items()
        if "batches" in r
    }


def batch_table(result: dict[str, Any]) -> str:
    """One row per target and batch size (a failed target: one row per batch saying so)."""
    ratio = result.get("speedup_vs_reference", {})
    rows = []
    for name, r in result["targets"].items():
        measured = {b["batch"]: b for b in r.get("batches", [])}
        for n in result["batches"]:
            b = measured.get(n)
            if b is None:
                rows.append([name, n, "n/a", "n/a", "n/a", "n/a", "n/a", f"failed: {r.get('error', '?')[:80]}"])
                continue
            vs = ratio.get(name, {}).get(str(n))
            rows.append(
                [
                    name,
                    n,
                    b["p50_ms"],
                    b["p90_ms"],
                    b["ms_per_image"],
                    b["images_per_s"],
                    f"{vs:.2f}x" if vs is not None else "n/a",
                    r["placement"]["intended_provider"],
                ]
            )
    headers = ["target", "batch", "p50 ms", "p90 ms", "ms/img", "img/s", f"vs {result['reference']}", "intended EP"]
    return markdown_table(headers, rows, digits=2)


def _off(names: Sequence[str]) -> str:
    if not names:
        return "-"
    shown = "; ".join(names[:OFF_SHOWN])
    return shown + (f" and {len(names) - OFF_SHOWN} more" if len(names) > OFF_SHOWN else "")


def start_table(result: dict[str, Any]) -> str:
    """One row per target: cold and cached start, the engine cache, where the nodes ran."""
    rows = []
    for name, r in result["targets"].items():
        cold, cached = r.get("cold_start", {}), r.get("cached_start", {})
        placement = r.get("placement", {})
        rows.append(
            [
                name,
                Path(r["model"]).name,
                r["intended_provider"],
                cold.get("session_s"),
                cold.get("first_call_ms"),
                cached.get("session_s"),
                cached.get("first_call_ms"),
                f"{cold['engine_cache']['files']} files, {cold['engine_cache']['bytes'] / 2**20:.1f} MiB"
                if "engine_cache" in cold
                else "n/a",
                placement.get("nodes_per_provider"),
                _off(placement["not_on_intended"]) if placement else f"failed: {r.get('error', '?')}",
            ]
        )
    headers = [
        "target",
        "model",
        "intended EP",
        "cold start s",
        "cold 1st call ms",
        "cached start s",
        "cached 1st call ms",
        "engine cache after cold",
        "nodes per EP",
        "nodes not on intended EP",
    ]
    return markdown_table(headers, rows, digits=3)


def to_markdown(result: dict[str, Any]) -> str:
    mode = "CPU dry run (every target on CPUExecutionProvider)" if result["dry_run"] else "GPU"
    rt = result["runtime"]
    return (
        f"# GPU check: {mode}\n\n"
        f"onnxruntime {rt['onnxruntime']}, TensorRT {rt['tensorrt']}, GPU {rt['gpu']}, "
        f"usable providers {', '.join(rt['usable_providers'])}; threads {result['threads']}, "
        f"{result['budget_s_per_batch']} s per batch, isolation: {result['isolation']}\n\n"
        + batch_table(result)
        + "\n"
        + start_table(result)
    )


# --------------------------------------------------------------------------- command line


def _ints(text: str) -> list[int]:
    values = [int(x) for x in text.split(",") if x.strip()]
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"need positive batch sizes, got {text!r}")
    return values


def _targets(text: str) -> list[Target]:
    names = [x.strip() for x in text.split(",") if x.strip()]
    unknown = [n for n in names if n not in TARGET_NAMES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown targets {unknown}; choose from {', '.join(TARGET_NAMES)}")
    return [t for t in TARGETS if t.name in names]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    from app.models import default_files

    files = default_files()
    trt_int8 = getattr(files, "int8_trt", files.root / "efficientnet_lite0-int8-trt.onnx")
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.gpu_check", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--targets", type=_targets, default=list(TARGETS), help=f"comma list of {','.join(TARGET_NAMES)}")
    p.add_argument("--batches", type=_ints, default=list(BATCHES), help="batch sizes (default 1,8,32,64)")
    p.add_argument("--cpu-dry-run", action="store_true", help="every target on the CPU EP: checks the flow, not a GPU")
    p.add_argument("--budget", type=float, default=0.5, help="seconds of timed calls per batch size")
    p.add_argument("--warmup", type=int, default=3, help="dropped calls per batch size")
    p.add_argument("--min-runs", type=int, default=5)
    p.add_argument("--max-runs", type=int, default=300)
    p.add_argument("--threads", type=int, default=1, help="intra-op threads (host-side nodes only on a GPU)")
    p.add_argument("--device-id", type=int, default=0)
    p.add_argument("--fp32", default=str(files.fp32))
    p.add_argument("--int8", default=str(files.int8), help="the CPU (QDQ) INT8 artifact")
    p.add_argument("--trt-int8", default=str(trt_int8), help="the TensorRT INT8 artifact")
    p.add_argument(
        "--cache-dir",
        type=Path,
        default=None,
        help="engine caches go to DIR/<target> (must be empty or absent) and are kept; "
        "default: a temporary directory, removed afterwards",
    )
    p.add_argument("--in-process", action="store_true", help="no fresh process per start (CUDA init then not in it)")
    p.add_argument("--out-dir", type=Path, default=RESULTS_DIR)
    return p.parse_args(argv)


def runtime_facts() -> dict[str, Any]:
    from app.runtime.ort_engine import missing_libraries, ort_version, tensorrt_version, usable_providers
    from app.runtime.select import gpu_name

    return {
        "onnxruntime": ort_version(),
        "tensorrt": tensorrt_version(),
        "gpu": gpu_name(0),
        "usable_providers": usable_providers(),
        "missing_libraries": {p: missing_libraries(p) for p in (TENSORRT, CUDA)},
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    targets: list[Target] = args.targets
    if not args.cpu_dry_run and (unusable := unusable_gpu_providers(needed_providers(targets))):
        print(f"error: {unusable_message(unusable)}", file=sys.stderr)
        return 2
    given = {"fp32": args.fp32, "int8": args.int8, "trt_int8": args.trt_int8}
    paths = {k: str(Path(v).absolute()) for k, v in given.items()}
    missing = [f"{t.name}: {paths[t.model]}" for t in targets if not Path(paths[t.model]).is_file()]
    if missing:
        print(
            f"error: model files not found ({'; '.join(missing)}): python -m app.models build, quantize, and "
            "quantize --target tensorrt build them; --targets leaves a target out",
            file=sys.stderr,
        )
        return 2
    cache_root = args.cache_dir or Path(tempfile.mkdtemp(prefix="gpu-check-cache-"))
    busy = [str(cache_root / t.name) for t in targets if cache_files(str(cache_root / t.name))["files"]]
    if busy:
        print(f"error: engine cache directories not empty, the cold start would not be cold: {busy}", file=sys.stderr)
        return 2

    env = print_environment()
    env_runtime = runtime_facts()
    timing = {"warmup": args.warmup, "min_runs": args.min_runs, "max_runs": args.max_runs, "budget_s": args.budget}
    max_batch = max(MAX_BATCH, *args.batches)
    results: dict[str, dict[str, Any]] = {}
    try:
        for target in targets:
            path, cache_dir = paths[target.model], cache_root / target.name
            opts = target.options(args.threads, cache_dir, max_batch, args.device_id)
            try:
                planned = target.factory(target.name, path, opts)
            except Exception as e:  # PlanError, an unreadable model (TensorRT's options read its input)
                failed = {"target": target.name, "model": path, "intended_provider": target.intended}
                results[target.name] = {**failed, "error": f"planning: {type(e).__name__}: {e}"}
                print(f"{target.name}: {results[target.name]['error']}", file=sys.stderr, flush=True)
                continue
            choice = cpu_choice() if args.cpu_dry_run else planned
            print(f"{target.name}: {path} on {choice.provider_names}", file=sys.stderr, flush=True)
            r = run_target(target, path, choice, planned, opts, cache_dir, args.batches, timing, not args.in_process)
            results[target.name] = r
            if "error" in r:
                print(f"  failed: {r['error']}", file=sys.stderr, flush=True)
            else:
                print(
                    f"  cold start {r['cold_start']['session_s']:.2f} s, "
                    f"cached {r['cached_start']['session_s']:.2f} s, "
                    f"best {r['max_images_per_s']:.0f} img/s, nodes {fmt(r['placement']['nodes_per_provider'])}",
                    file=sys.stderr,
                    flush=True,
                )
    finally:
        if args.cache_dir is None:
            shutil.rmtree(cache_root, ignore_errors=True)

    result: dict[str, Any] = {
        "environment": env,
        "runtime": env_runtime,
        "dry_run": args.cpu_dry_run,
        "batches": args.batches,
        "threads": args.threads,
        "budget_s_per_batch": args.budget,
        "timing": timing,
        "isolation": "none" if args.in_process else "process",
        "tensorrt_max_batch_size": max_batch,
        "reference": REFERENCE,
        "targets": results,
    }
    result["speedup_vs_reference"] = speedups(results)
    stem = args.out_dir / f"{stamp()}-{host_name()}-gpu{'-dryrun' if args.cpu_dry_run else ''}"
    markdown = to_markdown(result)
    json_path, md_path = stem.parent / f"{stem.name}.json", stem.parent / f"{stem.name}.md"
    write_json(json_path, result)
    md_path.write_text(markdown + "\n## Environment\n\n```\n" + format_environment(env) + "\n```\n")
    print(markdown)
    print(f"wrote {json_path} and {md_path}")
    return 1 if any("error" in r for r in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
