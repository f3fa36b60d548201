"""One GPU node, four ways to run EfficientNet-Lite0: start-up cost, speed per batch, and where each node ran.

    python -m benchmarks.gpu_check                  # every target, batch 1,8,32,64
    python -m benchmarks.gpu_check --targets cuda-fp32,cuda-qdq-int8   # some of them
    python -m benchmarks.gpu_check --cpu-dry-run    # the same flow on the CPU EP (no GPU needed)

Targets (docs/engines.md): trt-int8 (TensorRT EP, the TensorRT INT8 artifact *-int8-trt.onnx), trt-fp16
(TensorRT EP, FP32 model, FP16 kernels allowed), cuda-fp32 (CUDA EP), cuda-qdq-int8 (CUDA EP on the CPU INT8
artifact: the slow path the server refuses, measured to show why), planned as the server plans them, CPU EP last.
Per target, one thread, each start in a fresh process: a cold start (empty engine cache: TensorRT builds) and a
cached start (a restarted replica loads the engine), session creation and first call timed; per batch size
p50/p90/p99 of one call (host<->device copies included), img/s = batch / p50; the nodes per execution provider.

A target whose execution provider cannot load here (a GPU node with ONNX Runtime's CUDA libraries but no
TensorRT) is skipped with its reason, and the others run. Writes benchmarks/results/<date>-<host>-gpu.json and
.md (a dry run: -gpu-dryrun.*). Exit status: 0 every target ran or was skipped, 1 some failed (their errors are
in the report: a model file missing, ...), 2 nothing could be measured (no target's provider loads here).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from app.runtime import RuntimeOptions
from app.runtime.plan import CPU, CUDA, TENSORRT, EngineChoice, TensorRTOptions, cpu_choice, plan_engines
from benchmarks.environment import RESULTS_DIR, format_environment, host_name, print_environment, stamp
from benchmarks.model_bench import in_fresh_process, measure_batch
from benchmarks.report import markdown_table, write_report

BATCHES = (1, 8, 32, 64)
MAX_BATCH = 64  # the TensorRT profile spans 1..64 as served (TensorRTOptions.max_batch_size)
REFERENCE = "cuda-fp32"  # the "vs" column of the table
OFF_SHOWN = 5  # node names shown per target in the Markdown table (the JSON has all)
TIMING = {"warmup": 3, "min_runs": 5, "max_runs": 300, "budget_s": 0.5}  # per batch size (model_bench.time_runs)


@dataclass(frozen=True)
class Target:
    name: str
    model: str  # which of Check.models it runs: fp32, int8 or trt_int8
    intended: str  # the provider that should run the nodes
    precision: str
    fp16: bool
    about: str

    def options(self, cache_dir: Path, max_batch: int) -> RuntimeOptions:
        return RuntimeOptions(
            engine="tensorrt" if self.intended == TENSORRT else "cuda",
            precision=self.precision,
            fp16=self.fp16,
            prefer_gpu=True,
            allow_slow_int8=True,  # cuda-qdq-int8 is the slow path on purpose
            tensorrt=TensorRTOptions(cache_dir=str(cache_dir), max_batch_size=max_batch),
        )

    def plan(self, path: str, opts: RuntimeOptions) -> EngineChoice:
        """The server's plan: TensorRT (its cache keyed as the server keys it) for a TensorRT target, CUDA, CPU."""
        from app.runtime.select import tensorrt_for

        trt = tensorrt_for(path, opts) if self.intended == TENSORRT else None
        return plan_engines(self.name, opts, (TENSORRT, CUDA, CPU), openvino=False, tensorrt=trt).candidates[0]


TARGETS = (
    Target("trt-int8", "trt_int8", TENSORRT, "int8", False, "TensorRT INT8 artifact"),
    Target("trt-fp16", "fp32", TENSORRT, "fp32", True, "FP32 model, FP16 allowed"),
    Target("cuda-fp32", "fp32", CUDA, "fp32", False, "FP32 model on the CUDA EP"),
    Target("cuda-qdq-int8", "int8", CUDA, "int8", False, "CPU INT8 (QDQ) on the CUDA EP"),
)


def default_models() -> dict[str, str]:
    from app.models import default_files

    files = default_files()
    return {"fp32": str(files.fp32), "int8": str(files.int8), "trt_int8": str(files.int8_trt)}


@dataclass
class Check:
    """One run: the command line sets dry_run, tests shorten the rest."""

    targets: Sequence[Target] = TARGETS
    batches: Sequence[int] = BATCHES
    dry_run: bool = False
    models: dict[str, str] = field(default_factory=default_models)
    timing: dict[str, Any] = field(default_factory=lambda: dict(TIMING))
    isolate: bool = True  # each start in a fresh process, CUDA initialised in it
    out_dir: Path = RESULTS_DIR


def cache_files(directory: Path) -> dict[str, int]:
    """Files (engines, timing caches) under a cache directory and their size; the build lock not counted."""
    files = [f for f in directory.rglob("*") if f.is_file() and f.name != ".build.lock"] if directory.is_dir() else []
    return {"files": len(files), "bytes": sum(f.stat().st_size for f in files)}


def start(
    path: str, opts: RuntimeOptions, choice: EngineChoice, batches: Sequence[int], timing: dict[str, Any] | None
) -> dict[str, Any]:
    """Create a session and call it once at the smallest batch (both timed); with `timing`, time every batch."""
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
        out: dict[str, Any] = {"session_s": session_s, "first_call_ms": (time.perf_counter() - t0) * 1000}
        out["first_call_batch"] = len(x)
        out |= {"engine_cache": cache_files(Path(opts.tensorrt.cache_dir)), **engine.describe()}
        out["placement"] = engine.placement  # provider -> the nodes it ran
        if timing is not None:
            out["batches"] = [measure_batch(engine.logits, engine.dummy_batch(n), timing) for n in batches]
        return out
    finally:
        engine.close()


def run_target(target: Target, path: str, opts: RuntimeOptions, check: Check) -> dict[str, Any]:
    """Plan, then a cold start that also times every batch size, then a cached start."""
    out: dict[str, Any] = {"target": target.name, "about": target.about, "model": path}
    out |= {"intended_provider": target.intended, "cache_dir": opts.tensorrt.cache_dir}
    try:
        planned = target.plan(path, opts)
    except Exception as e:  # PlanError, an unreadable model (TensorRT's options read its input)
        return {**out, "error": f"planning: {type(e).__name__}: {e}"}
    choice = cpu_choice() if check.dry_run else planned
    print(f"{target.name}: {path} on {choice.provider_names}", file=sys.stderr, flush=True)
    intended = out["intended_provider"] = choice.providers[0].name
    out |= {"planned": planned.describe(), "ran": choice.describe()}
    for phase, timing in (("cold_start", check.timing), ("cached_start", None)):
        try:  # a crashed measuring process (BrokenProcessPool), ModelLoadError, an ORT failure while running
            out[phase] = in_fresh_process(start, path, opts, choice, check.batches, timing, isolate=check.isolate)
        except Exception as e:
            return {**out, "error": f"{phase.replace('_', ' ')}: {type(e).__name__}: {e}"}
    cold, cached = out["cold_start"], out["cached_start"]
    batches, placement = cold.pop("batches"), cold["placement"]
    return {
        **out,
        "nodes_per_provider": cold["nodes_per_provider"],
        "not_on_intended": [f"{ep}: {node}" for ep, nodes in placement.items() if ep != intended for node in nodes],
        "cached_placement_same": placement == cached["placement"],
        # TensorRT: a cached start that wrote engine files again rebuilt instead of loading the cold start's engine
        "cached_start_rebuilt": cached["engine_cache"]["files"] > cold["engine_cache"]["files"],
        "batches": batches,
        "max_images_per_s": max(b["images_per_s"] for b in batches),
    }


# --------------------------------------------------------------------------- report


def _table(rows: list[dict[str, Any]], digits: int) -> str:
    return markdown_table(list(rows[0]) if rows else [], [list(r.values()) for r in rows], digits)


def _not_run(r: dict[str, Any], width: int | None = None) -> str:
    """A target that did not run: skipped here (its provider cannot load) or failed."""
    text = f"skipped: {r['skipped']}" if "skipped" in r else f"failed: {r['error']}"
    return text if width is None else text[:width]


def batch_table(result: dict[str, Any]) -> str:
    """One row per target and batch size (a failed target: one row per batch saying so)."""
    measured = {name: {b["batch"]: b for b in r.get("batches", [])} for name, r in result["targets"].items()}
    reference, rows = measured.get(REFERENCE, {}), []
    for name, r in result["targets"].items():
        for n in result["batches"]:
            b = measured[name].get(n, {})
            vs = f"{b['images_per_s'] / reference[n]['images_per_s']:.2f}x" if b and n in reference else "n/a"
            rows.append(
                {
                    "target": name,
                    "batch": n,
                    "p50 ms": b.get("p50_ms"),
                    "p90 ms": b.get("p90_ms"),
                    "ms/img": b.get("ms_per_image"),
                    "img/s": b.get("images_per_s"),
                    f"vs {REFERENCE}": vs,
                    "intended EP": r["intended_provider"] if b else _not_run(r, 80),
                }
            )
    return _table(rows, digits=2)


def start_table(result: dict[str, Any]) -> str:
    """One row per target: cold and cached start, the engine cache, where the nodes ran."""
    rows = []
    for name, r in result["targets"].items():
        cold, cached, off = r.get("cold_start", {}), r.get("cached_start", {}), r.get("not_on_intended", [])
        cache = cold.get("engine_cache")
        off_cell = "; ".join(off[:OFF_SHOWN]) + (f" and {len(off) - OFF_SHOWN} more" if len(off) > OFF_SHOWN else "")
        rows.append(
            {
                "target": name,
                "model": Path(r["model"]).name,
                "intended EP": r["intended_provider"],
                "cold start s": cold.get("session_s"),
                "cold 1st call ms": cold.get("first_call_ms"),
                "cached start s": cached.get("session_s"),
                "cached 1st call ms": cached.get("first_call_ms"),
                "engine cache after cold": cache and f"{cache['files']} files, {cache['bytes'] / 2**20:.1f} MiB",
                "nodes per EP": r.get("nodes_per_provider"),
                "nodes not on intended EP": _not_run(r) if "error" in r or "skipped" in r else off_cell or "-",
            }
        )
    return _table(rows, digits=3)


def to_markdown(result: dict[str, Any]) -> str:
    mode = "CPU dry run (every target on CPUExecutionProvider)" if result["dry_run"] else "GPU"
    rt, isolation = result["runtime"], "process" if result["isolate"] else "none"
    return (
        f"# GPU check: {mode}\n\nonnxruntime {rt['onnxruntime']}, TensorRT {rt['tensorrt']}, GPU {rt['gpu']}, "
        f"usable providers {', '.join(rt['usable_providers'])}; {result['timing']['budget_s']} s per batch, "
        f"isolation: {isolation}\n\n{batch_table(result)}\n{start_table(result)}"
    )


# --------------------------------------------------------------------------- running it


def skip_reason(target: Target, check: Check) -> str | None:
    """Why `target` cannot run on this machine (its provider's libraries do not load), or None: a machine with
    ONNX Runtime's CUDA libraries but no TensorRT still runs the CUDA targets. A dry run skips nothing."""
    from app.runtime.ort_engine import missing_libraries, usable_providers

    if check.dry_run or target.intended in usable_providers():
        return None
    needed = (TENSORRT, CUDA) if target.intended == TENSORRT else (target.intended,)  # TensorRT needs CUDA's too
    libs = [lib for p in needed for lib in missing_libraries(p)]
    return f"{target.intended} cannot load {', '.join(libs) or '(not built in)'}"


def refusal(skipped: dict[str, str]) -> str:
    """Why nothing could be measured (exit 2): every target skipped."""
    why = "; ".join(f"{name}: {reason}" for name, reason in skipped.items())
    return (
        f"no target can run here ({why}). Install the CUDA 13 and cuDNN 9 libraries for the CUDA targets, and "
        "TensorRT 10 for the TensorRT ones (k8s/Dockerfile installs them), or pass --cpu-dry-run to run the flow "
        "on the CPU EP"
    )


def run(check: Check) -> int:
    """Every target of `check`, each with its own engine cache in a temporary directory; the report written."""
    from app.runtime.ort_engine import missing_libraries, ort_version, tensorrt_version, usable_providers
    from app.runtime.select import gpu_name

    skipped = {t.name: why for t in check.targets if (why := skip_reason(t, check)) is not None}
    if len(skipped) == len(check.targets):
        print(f"error: {refusal(skipped)}", file=sys.stderr)
        return 2
    env, max_batch, results = print_environment(), max(MAX_BATCH, *check.batches), {}
    with tempfile.TemporaryDirectory(prefix="gpu-check-cache-") as cache_root:
        for t in check.targets:
            path = str(Path(check.models[t.model]).absolute())
            if t.name in skipped:
                print(f"{t.name}: skipped: {skipped[t.name]}", file=sys.stderr, flush=True)
                results[t.name] = {"target": t.name, "about": t.about, "model": path, "intended_provider": t.intended}
                results[t.name]["skipped"] = skipped[t.name]
                continue
            opts = t.options(Path(cache_root) / t.name, max_batch)
            r = results[t.name] = run_target(t, path, opts, check)
            if "error" in r:
                print(f"  failed: {r['error']}", file=sys.stderr, flush=True)
    runtime: dict[str, Any] = {"onnxruntime": ort_version(), "tensorrt": tensorrt_version(), "gpu": gpu_name(0)}
    runtime |= {
        "usable_providers": usable_providers(),
        "missing_libraries": {p: missing_libraries(p) for p in (CUDA, TENSORRT)},
    }
    result = {**asdict(check), "environment": env, "runtime": runtime, "tensorrt_max_batch_size": max_batch}
    result |= {"reference": REFERENCE, "targets": results}
    stem = check.out_dir / f"{stamp()}-{host_name()}-gpu{'-dryrun' if check.dry_run else ''}"
    markdown = to_markdown(result)
    wrote = write_report(stem, result, f"{markdown}\n## Environment\n\n```\n{format_environment(env)}\n```\n")
    print(f"{markdown}\n{wrote}")
    return 1 if any("error" in r for r in results.values()) else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.gpu_check", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--cpu-dry-run", action="store_true", help="every target on the CPU EP: the flow, not a GPU")
    names = [t.name for t in TARGETS]
    p.add_argument(
        "--targets",
        type=lambda s: [n.strip() for n in s.split(",") if n.strip()],
        default=names,
        help=f"comma-separated, of {', '.join(names)} (default: all); a target whose provider cannot load here "
        "is skipped with its reason, the others run",
    )
    a = p.parse_args(argv)
    unknown = sorted(set(a.targets) - set(names))
    if unknown or not a.targets:
        p.error(f"--targets: unknown {unknown}; choose from {names}")
    return run(Check(targets=[t for t in TARGETS if t.name in a.targets], dry_run=a.cpu_dry_run))


if __name__ == "__main__":
    sys.exit(main())
