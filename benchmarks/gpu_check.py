"""One GPU node, six ways to run EfficientNet-Lite0: start-up cost, speed per batch, where each node ran, and
whether each way computes the same network.

    python -m benchmarks.gpu_check                  # every target, batch 1,8,32,64
    python -m benchmarks.gpu_check --targets trt-int8,trt-fp16,cuda-fp32,torch-fp16   # some of them
    python -m benchmarks.gpu_check --cpu-dry-run    # the same flow on the CPU EP and torch's CPU (no GPU needed)
    python -m benchmarks.gpu_check --carry          # the wheels and LD_LIBRARY_PATH a node without network needs

Targets (docs/engines.md): trt-int8 (TensorRT EP, the TensorRT INT8 artifact *-int8-trt.onnx), trt-fp16
(TensorRT EP, FP32 model, FP16 kernels allowed), cuda-fp32 (CUDA EP), cuda-int8-qdq (CUDA EP on the CPU INT8
artifact: the slow path the server refuses, measured to show why; cuda-qdq-int8 is accepted too), planned as the
server plans them, CPU EP last; torch-fp32 and torch-fp16 (the same ONNX graph run by PyTorch on its CUDA device,
benchmarks/onnx_torch.py; FP16: .half() and channels_last): what the GPU does with this network outside ONNX
Runtime, a reference point, when torch is installed (the gpu-check extra, in its own venv).
Per target, one thread, each start in a fresh process: a cold start (empty engine cache: TensorRT builds) and a
cached start (a restarted replica loads the engine), session creation and first call timed; per batch size
p50/p90/p99 of one call (host<->device copies included), img/s = batch / p50; the nodes per execution provider;
agreement with ONNX Runtime's CPU EP on the FP32 model over real photographs (top-1 and the largest logit gap).

A target whose execution provider cannot load here (a GPU node with ONNX Runtime's CUDA libraries but no
TensorRT) is skipped with its reason, and the others run. Writes benchmarks/results/<date>-<host>-gpu.json and
.md (a dry run: -gpu-dryrun.*). Exit status: 0 every target ran or was skipped, 1 some failed (their errors are
in the report: a model file missing, ...), 2 nothing could be measured (no target's provider loads here).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from app.runtime import RuntimeOptions
from app.runtime.plan import CPU, CUDA, TENSORRT, EngineChoice, GraphOptions, TensorRTOptions, cpu_choice, plan_engines
from benchmarks.environment import RESULTS_DIR, format_environment, host_name, print_environment, stamp
from benchmarks.model_bench import in_fresh_process, measure_batch
from benchmarks.report import markdown_table, write_report

BATCHES = (1, 8, 32, 64)
MAX_BATCH = 64  # the TensorRT profile spans 1..64 as served (TensorRTOptions.max_batch_size)
REFERENCE = "cuda-fp32"  # the "vs" column of the table
OFF_SHOWN = 5  # node names shown per target in the Markdown table (the JSON has all)
TIMING = {"warmup": 3, "min_runs": 5, "max_runs": 300, "budget_s": 0.5}  # per batch size (model_bench.time_runs)
TORCH = "torch"  # the framework of the torch targets; their "provider" is torch:<device>
AGREEMENT_IMAGES = 16  # real photographs each target classifies beside the reference
AGREEMENT_REFERENCE = "onnxruntime CPUExecutionProvider, FP32 model"


@dataclass(frozen=True)
class Target:
    name: str
    model: str  # which of Check.models it runs: fp32, fp16, int8 or trt_int8
    intended: str  # the provider that should run the nodes
    precision: str
    fp16: bool
    about: str
    framework: str = "onnxruntime"  # or TORCH
    graphs: bool = False  # CUDA graphs as a replica runs them (app/runtime/graphs.py), captured before timing

    def options(self, cache_dir: Path, max_batch: int) -> RuntimeOptions:
        return RuntimeOptions(
            engine="tensorrt" if self.intended == TENSORRT else "cuda",
            precision=self.precision,
            fp16=self.fp16,
            prefer_gpu=True,
            allow_slow_int8=True,  # cuda-qdq-int8 is the slow path on purpose
            tensorrt=TensorRTOptions(cache_dir=str(cache_dir), max_batch_size=max_batch),
            cuda_graphs=GraphOptions() if self.graphs else None,
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
    Target("cuda-int8-qdq", "int8", CUDA, "int8", False, "CPU INT8 (QDQ) on the CUDA EP"),
    Target("cuda-fp32-graphs", "fp32", CUDA, "fp32", False, "FP32 on the CUDA EP, CUDA graphs", graphs=True),
    Target("cuda-fp16", "fp16", CUDA, "fp16", False, "FP16 build on the CUDA EP (the INT8 fallback)"),
    Target("cuda-fp16-graphs", "fp16", CUDA, "fp16", False, "FP16 build, CUDA graphs", graphs=True),
    Target("trt-int8-graphs", "trt_int8", TENSORRT, "int8", False, "TensorRT INT8, CUDA graphs", graphs=True),
    Target("torch-fp32", "fp32", TORCH, "fp32", False, "FP32 graph in PyTorch (reference)", TORCH),
    Target("torch-fp16", "fp32", TORCH, "fp16", True, "PyTorch .half(), channels_last", TORCH),
)
ALIASES = {"cuda-qdq-int8": "cuda-int8-qdq"}  # the name this check had before issue 35 spelled it


def default_models() -> dict[str, str]:
    from app.served_model import default_files

    files = default_files()
    return {"fp32": str(files.fp32), "fp16": str(files.fp16), "int8": str(files.int8), "trt_int8": str(files.int8_trt)}


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
    agreement_images: int = AGREEMENT_IMAGES


def cache_files(directory: Path) -> dict[str, int]:
    """Files (engines, timing caches) under a cache directory and their size; the build lock not counted."""
    files = [f for f in directory.rglob("*") if f.is_file() and f.name != ".build.lock"] if directory.is_dir() else []
    return {"files": len(files), "bytes": sum(f.stat().st_size for f in files)}


def agreement_inputs(n: int) -> np.ndarray:
    """n real photographs (the bundled samples, randomly cropped), prepared as the server prepares them."""
    from app.imaging.preprocess import preprocess
    from app.served_model import builtin_transform
    from app.toolchain.samples import augmented_samples

    transform = builtin_transform()
    return np.stack([preprocess(data, transform) for data in augmented_samples(n, seed=35)])


def reference_logits(path: str, images: np.ndarray) -> np.ndarray:
    """The reference every target is compared with: ONNX Runtime's CPU EP on the FP32 model."""
    from app.runtime.ort_engine import OrtEngine

    engine = OrtEngine(path, RuntimeOptions(), cpu_choice())
    try:
        return engine.logits(images)
    finally:
        engine.close()


def agreement(logits: np.ndarray, reference: np.ndarray | str) -> dict[str, Any]:
    """Top-1 agreement and the largest logit gap of a target's logits against the reference's, image by image
    (a str reference: why there is none)."""
    if isinstance(reference, str):
        return {"reference": AGREEMENT_REFERENCE, "error": reference}
    logits = np.asarray(logits, dtype=np.float32)
    return {
        "reference": AGREEMENT_REFERENCE,
        "images": len(reference),
        "top1_agree": float((logits.argmax(1) == reference.argmax(1)).mean()),
        "max_abs_logit_diff": float(np.abs(logits - reference).max()),
    }


def start(
    path: str,
    opts: RuntimeOptions,
    choice: EngineChoice,
    batches: Sequence[int],
    timing: dict[str, Any] | None,
    agree: np.ndarray | None = None,
) -> dict[str, Any]:
    """Create a session and call it once at the smallest batch (both timed); with `timing`, time every batch;
    with `agree`, the logits of those images too."""
    from app.runtime.ort_engine import OrtEngine
    from app.runtime.select import build, engine_files_state

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
        if timing is not None:  # CUDA graphs: captured, checked and timed as a replica's start does
            t0 = time.perf_counter()
            engine.prepare(max(batches))
            out["prepare_s"] = time.perf_counter() - t0
            out["cuda_graphs"] = engine.graphs_state()
        out |= {"engine_cache": cache_files(Path(opts.tensorrt.cache_dir)), **engine.describe()}
        out["engine_files_state"] = engine_files_state(Path(opts.tensorrt.cache_dir))
        out["placement"] = engine.placement  # provider -> the nodes it ran
        if timing is not None:
            out["batches"] = [measure_batch(engine.logits, engine.dummy_batch(n), timing) for n in batches]
        if agree is not None:
            out["agreement_logits"] = engine.logits(agree)
        return out
    finally:
        engine.close()


def torch_start(
    path: str,
    fp16: bool,
    device: str,
    threads: int,
    batches: Sequence[int],
    timing: dict[str, Any] | None,
    agree: np.ndarray | None = None,
) -> dict[str, Any]:
    """start() for PyTorch: the ONNX graph as a torch module (benchmarks/onnx_torch.py) on `device`, FP16 with
    .half() and channels_last; "session" is building the module and moving it to the device."""
    import torch

    from benchmarks.onnx_torch import load

    torch.set_num_threads(threads)
    torch.backends.cudnn.benchmark = device.startswith("cuda")  # cuDNN picks its fastest kernels per shape
    t0 = time.perf_counter()
    module = load(path).to(device)
    if fp16:
        module = module.half().to(memory_format=torch.channels_last)
    session_s = time.perf_counter() - t0

    def logits(x: np.ndarray) -> np.ndarray:  # host->device and back included, as ONNX Runtime's calls
        with torch.inference_mode():
            return module(torch.from_numpy(x).to(device)).float().cpu().numpy()

    x = module.dummy_batch(min(batches))
    t0 = time.perf_counter()
    logits(x)
    name = f"{TORCH}:{device}"
    out: dict[str, Any] = {"session_s": session_s, "first_call_ms": (time.perf_counter() - t0) * 1000}
    out |= {"first_call_batch": len(x), "engine_cache": {"files": 0, "bytes": 0}, "engine": TORCH}
    out |= {"execution_provider": name, "providers": [name], "requested_providers": [name]}
    out |= {"nodes_per_provider": {name: len(module.nodes)}, "placement": {name: module.nodes}}
    out |= {"torch": str(torch.__version__), "dtype": str(module.float_dtype).removeprefix("torch.")}
    out["memory_format"] = "channels_last" if fp16 else "contiguous"
    if timing is not None:
        out["batches"] = [measure_batch(logits, module.dummy_batch(n), timing) for n in batches]
    if agree is not None:
        out["agreement_logits"] = logits(agree)
    return out


def _measure(
    out: dict[str, Any], starter: Any, args: tuple[Any, ...], check: Check, images: np.ndarray, ref: np.ndarray | str
) -> dict[str, Any]:
    """A cold start that also times every batch size and classifies the agreement images, then a cached start."""
    intended = out["intended_provider"]
    for phase, timing in (("cold_start", check.timing), ("cached_start", None)):
        agree = images if timing is not None else None
        try:  # a crashed measuring process (BrokenProcessPool), ModelLoadError, an ORT failure while running
            out[phase] = in_fresh_process(starter, *args, check.batches, timing, agree, isolate=check.isolate)
        except Exception as e:
            return {**out, "error": f"{phase.replace('_', ' ')}: {type(e).__name__}: {e}"}
    cold, cached = out["cold_start"], out["cached_start"]
    batches, placement = cold.pop("batches"), cold["placement"]
    agreed = agreement(cold.pop("agreement_logits"), ref)
    return {
        **out,
        "agreement": agreed,
        "nodes_per_provider": cold["nodes_per_provider"],
        "not_on_intended": [f"{ep}: {node}" for ep, nodes in placement.items() if ep != intended for node in nodes],
        "cached_placement_same": placement == cached["placement"],
        # TensorRT: a cached start that added or rewrote an engine file (ORT rewrites a rebuilt engine under the
        # same name: size, mtime or inode differ) rebuilt instead of loading the cold start's engine
        "cached_start_rebuilt": cached.pop("engine_files_state", {}) != cold.pop("engine_files_state", {}),
        "batches": batches,
        "max_images_per_s": max(b["images_per_s"] for b in batches),
    }


def run_target(
    target: Target, path: str, opts: RuntimeOptions, check: Check, images: np.ndarray, ref: np.ndarray | str
) -> dict[str, Any]:
    """Plan, then the starts (_measure) with ONNX Runtime."""
    out: dict[str, Any] = {"target": target.name, "about": target.about, "model": path}
    out |= {"intended_provider": target.intended, "cache_dir": opts.tensorrt.cache_dir}
    try:
        planned = target.plan(path, opts)
    except Exception as e:  # PlanError, an unreadable model (TensorRT's options read its input)
        return {**out, "error": f"planning: {type(e).__name__}: {e}"}
    choice = cpu_choice() if check.dry_run else planned
    if check.dry_run and opts.cuda_graphs is not None:
        # The graphs' buffers, threads, checks and decisions on the CPU EP (nothing is captured there).
        opts = dataclasses.replace(opts, cuda_graphs=dataclasses.replace(opts.cuda_graphs, on_cpu=True))
    print(f"{target.name}: {path} on {choice.provider_names}", file=sys.stderr, flush=True)
    out["intended_provider"] = choice.providers[0].name
    out |= {"planned": planned.describe(), "ran": choice.describe()}
    return _measure(out, start, (path, opts, choice), check, images, ref)


def run_torch_target(
    target: Target, path: str, check: Check, images: np.ndarray, ref: np.ndarray | str
) -> dict[str, Any]:
    """The starts (_measure) with PyTorch: on its CUDA device, or its CPU in a dry run."""
    device = "cpu" if check.dry_run else "cuda"
    plan = {"framework": TORCH, "dtype": "float16" if target.fp16 else "float32"}
    plan["memory_format"] = "channels_last" if target.fp16 else "contiguous"
    out: dict[str, Any] = {"target": target.name, "about": target.about, "model": path}
    out |= {"intended_provider": f"{TORCH}:{device}", "cache_dir": None}
    out |= {"planned": {**plan, "device": "cuda"}, "ran": {**plan, "device": device}}
    print(f"{target.name}: {path} on torch:{device}", file=sys.stderr, flush=True)
    threads = RuntimeOptions().threads  # as the ONNX Runtime targets' sessions
    return _measure(out, torch_start, (path, target.fp16, device, threads), check, images, ref)


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


def _agree(r: dict[str, Any], key: str) -> Any:
    """One agreement figure of a target (None: it did not run; the reference's failure when there was none)."""
    agreed = r.get("agreement", {})
    if "error" in agreed:
        return f"no reference: {agreed['error']}"[:60]
    value = agreed.get(key)
    return f"{value:.1e}" if key == "max_abs_logit_diff" and value is not None else value


def _graphs(cold: dict[str, Any]) -> str:
    """Which batch sizes replay a graph after the cold start's capture (and how long capturing took), or why none."""
    state = cold.get("cuda_graphs")
    if not state:
        return "-"
    if not state.get("active"):
        return f"none: {state.get('off') or state.get('slots_without_graphs')}"[:80]
    return f"{state['graph_batch_sizes']} (buckets {state['buckets_captured']}, {cold.get('prepare_s', 0):.1f} s)"


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
                "CUDA graphs for batch sizes": _graphs(cold),
                "top-1 agree": _agree(r, "top1_agree"),
                "max logit gap": _agree(r, "max_abs_logit_diff"),
                "nodes not on intended EP": _not_run(r) if "error" in r or "skipped" in r else off_cell or "-",
            }
        )
    return _table(rows, digits=3)


def to_markdown(result: dict[str, Any]) -> str:
    mode = "CPU dry run (ONNX Runtime on CPUExecutionProvider, torch on its CPU)" if result["dry_run"] else "GPU"
    rt, isolation = result["runtime"], "process" if result["isolate"] else "none"
    return (
        f"# GPU check: {mode}\n\nonnxruntime {rt['onnxruntime']}, TensorRT {rt['tensorrt']}, torch {rt['torch']}, "
        f"GPU {rt['gpu']}, usable providers {', '.join(rt['usable_providers'])}; {result['timing']['budget_s']} s "
        f"per batch, isolation: {isolation}; agreement: {result['agreement_images']} photographs against "
        f"{AGREEMENT_REFERENCE}\n\n{batch_table(result)}\n{start_table(result)}"
    )


# --------------------------------------------------------------------------- running it


def torch_version() -> str:
    """The installed torch's version, read without importing it, or "not installed"."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("torch")
    except PackageNotFoundError:
        return "not installed"


def torch_skip_reason(target: Target, dry_run: bool) -> str | None:
    """Why a torch target cannot run here: torch missing, no CUDA device, or FP16 on torch's CPU (emulated there:
    seconds an image, nothing a GPU would show)."""
    if torch_version() == "not installed":
        return "torch not installed (pip install -e '.[gpu-check]' in a venv of its own: docs/engines.md)"
    import torch

    if dry_run:
        return (
            "FP16 on torch's CPU device is emulated (seconds an image): measured on a GPU only" if target.fp16 else None
        )
    if not torch.cuda.is_available():
        return f"torch {torch.__version__} sees no CUDA device"
    return None


def skip_reason(target: Target, check: Check) -> str | None:
    """Why `target` cannot run on this machine (its provider's libraries do not load, torch is missing), or None:
    a machine with ONNX Runtime's CUDA libraries but no TensorRT still runs the CUDA targets. A dry run skips
    no ONNX Runtime target."""
    from app.runtime.ort_engine import missing_libraries, usable_providers

    if target.framework == TORCH:
        return torch_skip_reason(target, check.dry_run)
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
    images = agreement_inputs(check.agreement_images)
    ref: np.ndarray | str
    try:
        ref = reference_logits(str(Path(check.models["fp32"]).absolute()), images)
    except Exception as e:  # the FP32 model missing or broken: the targets still run, without agreement
        ref = f"{type(e).__name__}: {e}"
    with tempfile.TemporaryDirectory(prefix="gpu-check-cache-") as cache_root:
        for t in check.targets:
            path = str(Path(check.models[t.model]).absolute())
            if t.name in skipped:
                print(f"{t.name}: skipped: {skipped[t.name]}", file=sys.stderr, flush=True)
                results[t.name] = {"target": t.name, "about": t.about, "model": path, "intended_provider": t.intended}
                results[t.name]["skipped"] = skipped[t.name]
                continue
            if t.framework == TORCH:
                r = results[t.name] = run_torch_target(t, path, check, images, ref)
            else:
                r = results[t.name] = run_target(
                    t, path, t.options(Path(cache_root) / t.name, max_batch), check, images, ref
                )
            if "error" in r:
                print(f"  failed: {r['error']}", file=sys.stderr, flush=True)
    runtime: dict[str, Any] = {"onnxruntime": ort_version(), "tensorrt": tensorrt_version(), "gpu": gpu_name(0)}
    runtime["torch"] = torch_version()
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
    p.add_argument(
        "--cpu-dry-run", action="store_true", help="ONNX Runtime on the CPU EP, torch on its CPU: the flow, not a GPU"
    )
    p.add_argument(
        "--carry",
        action="store_true",
        help="print the wheels (cp311, cp312), the pip download commands and the LD_LIBRARY_PATH a node without "
        "network needs for the GPU targets, and write them beside the results; measure nothing",
    )
    names = [t.name for t in TARGETS]
    p.add_argument(
        "--targets",
        type=lambda s: [ALIASES.get(n.strip(), n.strip()) for n in s.split(",") if n.strip()],
        default=names,
        help=f"comma-separated, of {', '.join(names)} (default: all; cuda-qdq-int8 is cuda-int8-qdq); a target "
        "whose provider (or torch) cannot load here is skipped with its reason, the others run",
    )
    p.add_argument("--out", type=Path, default=RESULTS_DIR, help="where the report goes (default benchmarks/results)")
    a = p.parse_args(argv)
    if a.carry:
        return print_carry(a.out)
    unknown = sorted(set(a.targets) - set(names))
    if unknown or not a.targets:
        p.error(f"--targets: unknown {unknown}; choose from {names}")
    return run(Check(targets=[t for t in TARGETS if t.name in a.targets], dry_run=a.cpu_dry_run, out_dir=a.out))


def print_carry(out_dir: Path | None = None) -> int:
    """--carry: the report of benchmarks/gpu_carry.py, printed (Markdown, then JSON) and written beside results."""
    from benchmarks.gpu_carry import carry
    from benchmarks.gpu_carry import to_markdown as carry_markdown

    report = carry()
    markdown = carry_markdown(report)
    wrote = write_report((out_dir or RESULTS_DIR) / f"{stamp()}-{host_name()}-gpu-carry", report, markdown)
    print(f"{markdown}\n```json\n{json.dumps(report, indent=2)}\n```\n{wrote}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
