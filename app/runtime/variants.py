"""What the app config's variants become in a replica: `runtime_options` (how a variant runs, on a node that was or
was not granted a GPU), `fallback_options` (its declared fallback's file and options) and `speed_gate_for` (the
gate it must pass and how to run the baseline). The settings are `app.config.args`'s; the engines read only
`RuntimeOptions` (plan.py)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from app.config import AppArgs
from app.runtime.measure import SpeedGate
from app.runtime.plan import GraphOptions, RuntimeOptions, TensorRTOptions


def runtime_options(args: AppArgs, variant: str, gpu: bool, threads: int, streams: int) -> RuntimeOptions:
    """How `variant` runs in a replica that was (`gpu`) or was not granted a GPU."""
    v = args.variants[variant]
    return _options(args, v.precision, v.engine, v.fp16, v.allow_slow_int8, gpu, threads, streams)


def fallback_options(
    args: AppArgs, variant: str, gpu: bool, threads: int, streams: int
) -> tuple[Path, RuntimeOptions] | None:
    """The file and options of `variant`'s declared fallback (None: it declares none)."""
    fb = args.variants[variant].fallback
    if fb is None:
        return None
    opts = _options(args, fb.precision, fb.engine, False, False, gpu, threads, streams)
    return args.resolved_path(fb.model_path), opts


def speed_gate_for(
    args: AppArgs, variant: str, gpu: bool, threads: int, streams: int, chosen_engine: str
) -> tuple[SpeedGate, str, RuntimeOptions] | None:
    """The gate `variant` must pass, the baseline's model file and how to run it; None if not gated.

    The baseline runs on the engine family `variant` chose on this node (its own `engine` where that
    is not auto), so the comparison is of the models, and the start pays for one measurement only.
    """
    gate = args.speed_gate
    if gate is None or gate.baseline == variant:
        return None
    # No CUDA graphs for the baseline: it is timed at max_batch_size, where they do not apply.
    opts = replace(runtime_options(args, gate.baseline, gpu, threads, streams), cuda_graphs=None)
    if opts.engine == "auto":
        opts = replace(opts, engine=chosen_engine)
    path = str(args.resolved_path(args.variants[gate.baseline].model_path))
    return SpeedGate(gate.baseline, gate.min_speedup, gate.action), path, opts


def _options(
    args: AppArgs, precision: str, engine: str, fp16: bool, slow_int8: bool, gpu: bool, threads: int, streams: int
) -> RuntimeOptions:
    trt, graphs = args.tensorrt, args.cuda_graphs
    return RuntimeOptions(
        threads=threads,
        streams=streams,
        engine=engine,
        precision=precision,
        fp16=fp16,
        prefer_gpu=args.device == "cuda" or (args.device == "auto" and gpu),
        require_gpu=args.require_gpu,
        allow_slow_int8=slow_int8,
        gpu_mem_limit_bytes=args.gpu_mem_limit_bytes,
        tensorrt=TensorRTOptions(
            cache_dir=trt.resolved_cache_dir(),
            max_batch_size=trt.max_batch_size,
            workspace_bytes=trt.workspace_bytes,
            builder_optimization_level=trt.builder_optimization_level,
            timing_cache=trt.timing_cache,
        ),
        cuda_graphs=GraphOptions(tuple(graphs.buckets)) if graphs.enabled else None,
    )
