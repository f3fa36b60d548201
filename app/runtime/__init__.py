"""Engines behind one small interface: the only serving package that imports onnxruntime or openvino.

plan.py             which engine and providers a replica would use (pure; `python -m app.runtime plan`, `app.ops`)
variants.py         the app config's variants as engine options, their fallbacks and speed gates
ort_engine.py       ONNX Runtime: TensorRT, CUDA and CPU execution providers, node placement
graphs.py           CUDA graphs per batch-size bucket on device-resident buffers, a session and thread per slot
capture_gate.py     the process-wide gate that keeps every GPU call out of a CUDA graph capture
fallback.py         a variant's declared fallback build, when its own needs TensorRT and TensorRT is not here
openvino_engine.py  OpenVINO's CPU runtime
select.py           plan -> built engine(s) -> checked -> the fastest kept
open_variant.py     a variant opened as a replica opens it (its fallback, the engine prepared) and its speed gate
measure.py          throughput at warm-up and the speed gate's verdict
startup.py          a replica's start: the engine opened, warmed up, measured, gated, reported
profiling.py        ONNX Runtime's profile of a run, summarised
spec.py             the model's I/O as an engine sees it
transform_graph.py  the model's declared transform as an ONNX graph (for images decoded on the GPU)
(softmax and top-k: `app.served_model.outputs`, re-exported here; TensorRT engines built ahead of a rollout:
`app.runtime.prebuild`, `python -m app.runtime build-engines`)
"""

from __future__ import annotations

import dataclasses
import math
import os

from app.runtime.fallback import Build, Serving
from app.runtime.measure import SpeedGate, Throughput, judge, measure_alternating
from app.runtime.ort_engine import OrtEngine, usable_providers
from app.runtime.plan import (
    CPU,
    CUDA,
    OPENVINO,
    TENSORRT,
    EngineChoice,
    GraphOptions,
    PlanError,
    RuntimeOptions,
    TensorRTOptions,
    plan_engines,
)
from app.runtime.profiling import summarize_profile
from app.runtime.select import Engine, Opened, open_engine
from app.runtime.spec import ModelLoadError, ModelSpec
from app.served_model.outputs import softmax, top_k

__all__ = [
    "CPU",
    "CUDA",
    "OPENVINO",
    "TENSORRT",
    "Build",
    "Engine",
    "EngineChoice",
    "GraphOptions",
    "ModelLoadError",
    "ModelSpec",
    "Opened",
    "OrtEngine",
    "PlanError",
    "RuntimeOptions",
    "Serving",
    "SpeedGate",
    "TensorRTOptions",
    "Throughput",
    "cpu_engine",
    "judge",
    "measure_alternating",
    "onnxruntime_engine",
    "open_engine",
    "softmax",
    "summarize_profile",
    "threads_for",
    "top_k",
    "usable_providers",
]


def threads_for(num_cpus: float) -> int:
    """Intra-op threads for a replica granted `num_cpus` (at least one)."""
    return max(1, math.floor(num_cpus + 1e-9))


def onnxruntime_engine(path: str | os.PathLike[str], opts: RuntimeOptions | None = None) -> OrtEngine:
    """ONNX Runtime alone, for the offline tools and the benchmark peers: the CUDA EP when `opts.prefer_gpu`
    and it loads here, else the CPU EP (no TensorRT, no OpenVINO, nothing measured)."""
    opts = opts or RuntimeOptions(prefer_gpu=False)
    usable = usable_providers()
    engine = "cuda" if opts.prefer_gpu and CUDA in usable else "cpu"
    try:
        plan = plan_engines("offline", dataclasses.replace(opts, engine=engine), usable, openvino=False)
    except PlanError as e:
        raise ModelLoadError(str(e)) from e
    return OrtEngine(path, opts, plan.candidates[0])


def cpu_engine(path: str | os.PathLike[str], opts: RuntimeOptions | None = None) -> OrtEngine:
    """ONNX Runtime's CPU EP on `path`: the reference engine of the offline tools (report, tests)."""
    return onnxruntime_engine(path, dataclasses.replace(opts or RuntimeOptions(), prefer_gpu=False, require_gpu=False))
