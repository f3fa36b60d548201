"""Which engine and which execution providers a replica would use: pure, no model loaded.

The rules (docs/engines.md):
- GPU replica, `auto`: TensorRT EP first (INT8 from the symmetric S8S8 QDQ artifact; FP16 only where
  configured), CUDA EP for whatever TensorRT does not take. An INT8 variant that would run on the CUDA
  EP without TensorRT is an error: ONNX Runtime's CUDA EP has no INT8 kernels for QDQ graphs, so
  every Conv runs in FP32 with Quantize/Dequantize work around it, slower than the FP32 variant
  (onnxruntime docs, performance/model-optimizations/quantization.md, "Quantization on GPU";
  onnxruntime issues #11201, #10267, #24807). `allow_slow_int8` overrides it.
- CPU replica, `auto`: OpenVINO and ONNX Runtime's CPU EP are both candidates; the replica measures
  both at warm-up and keeps the faster (`app.runtime.select`).
- `require_gpu`: the CPU EP is left out and `session.disable_cpu_ep_fallback` is set, so a graph
  that cannot run on the GPU fails the start instead of silently running on the host.

This module imports neither onnxruntime nor openvino: `python -m app.runtime plan` runs it on a
machine that has neither a GPU nor the model files.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

TENSORRT = "TensorrtExecutionProvider"
CUDA = "CUDAExecutionProvider"
CPU = "CPUExecutionProvider"
OPENVINO = "OpenVINO"  # not an ONNX Runtime EP: OpenVINO's own runtime (the `openvino` package)

ENGINES = ("auto", "tensorrt", "cuda", "openvino", "cpu")
PRECISIONS = ("fp32", "fp16", "int8")
GPU_ENGINES = ("tensorrt", "cuda")
ENGINE_OF_PROVIDER = {TENSORRT: "tensorrt", CUDA: "cuda", CPU: "cpu", OPENVINO: "openvino"}
# ONNX Runtime session config keys (onnxruntime_session_options_config_keys.h).
DISABLE_CPU_FALLBACK = "session.disable_cpu_ep_fallback"
RECORD_ASSIGNMENT = "session.record_ep_graph_assignment_info"
# U8U8 kernels instead of U8S8 on x86 without VNNI: correct for any int8 weights, without INT8's speed-up.
PRECISE_U8S8 = "session.x64quantprecision"


class PlanError(ValueError):
    """A variant cannot run as configured on a node offering these providers; the message says why.

    `needs_tensorrt`: the refusal is an INT8 build that only TensorRT runs faster than FP32, on a node without
    TensorRT: what a variant's declared `fallback` is for (`app.runtime.fallback`)."""

    def __init__(self, message: str, needs_tensorrt: bool = False) -> None:
        super().__init__(message)
        self.needs_tensorrt = needs_tensorrt


@dataclass(frozen=True)
class TensorRTOptions:
    """TensorRT EP build settings. Engines and timing caches are kept, so only a node's first start builds."""

    cache_dir: str = "/tmp/app-trt-cache"
    max_batch_size: int = 64  # the optimisation profile spans 1..this: warm-up never rebuilds an engine
    opt_batch_size: int | None = None  # the shape TensorRT tunes for; default: max_batch_size
    workspace_bytes: int = 2 << 30
    builder_optimization_level: int = 3  # TensorRT's default: 4-5 add build minutes for a few percent
    timing_cache: bool = True


@dataclass(frozen=True)
class GraphOptions:
    """CUDA graphs on a GPU engine (`app.runtime.graphs`): one captured graph per batch-size bucket, in a session of
    its own per batch slot, a batch padded up to its bucket. The small batches only: on an H200 a replay beat a plain
    run up to batch 8 and lost from 16 (benchmarks/results/2026-12-04-195603-vm-gpu)."""

    buckets: tuple[int, ...] = (1, 2, 4, 8)
    # The same buffers, threads, checks and decisions on the CPU EP, where nothing is captured: dry runs and tests
    # walk the GPU's code path there (never set by a config).
    on_cpu: bool = False


@dataclass(frozen=True)
class RuntimeOptions:
    """How one replica runs one model file."""

    threads: int = 1  # intra-op threads of each call
    streams: int = 1  # calls run in parallel (the Classifier's max_concurrent_batches)
    engine: str = "auto"
    precision: str = "fp32"
    fp16: bool = False  # let TensorRT pick FP16 kernels too (TensorRT only)
    prefer_gpu: bool = True  # the replica was granted a GPU (or device: cuda)
    require_gpu: bool = False
    allow_slow_int8: bool = False
    device_id: int = 0
    gpu_mem_limit_bytes: int | None = None
    profile_prefix: str | None = None
    tensorrt: TensorRTOptions = field(default_factory=TensorRTOptions)
    # CUDA graphs on a GPU engine (`app.runtime.graphs`): the batch sizes captured, one graph each; None: off.
    cuda_graphs: GraphOptions | None = None


@dataclass(frozen=True)
class Provider:
    name: str
    options: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "options": dict(self.options)}


@dataclass(frozen=True)
class EngineChoice:
    """One way to run the model: an engine and, for ONNX Runtime, its providers in priority order."""

    engine: str
    providers: tuple[Provider, ...] = ()
    session_config: dict[str, str] = field(default_factory=dict)

    @property
    def provider_names(self) -> list[str]:
        return [p.name for p in self.providers] or [OPENVINO]

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"engine": self.engine, "providers": [p.describe() for p in self.providers]}
        if self.engine == "openvino":
            out["providers"] = [{"name": OPENVINO, "options": {}}]
        if self.session_config:
            out["session_config"] = dict(self.session_config)
        return out


@dataclass(frozen=True)
class EnginePlan:
    """The candidates in order; more than one means "measure each at warm-up, keep the fastest"."""

    candidates: tuple[EngineChoice, ...]
    gpu: bool
    note: str = ""

    def describe(self) -> dict[str, Any]:
        first = self.candidates[0]
        out = {**first.describe(), "gpu": self.gpu}
        if len(self.candidates) > 1:
            out["engine"] = "|".join(c.engine for c in self.candidates)
            out["chosen_by"] = "throughput measured at warm-up"
            out["candidates"] = [c.describe() for c in self.candidates]
        if self.note:
            out["note"] = self.note
        return out


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "-", text).strip("-") or "unknown"


def engine_cache_path(
    base: str, model_sha256: str, ort_version: str, trt_version: str, gpu_name: str, build: str = ""
) -> str:
    """The engine and timing cache directory of one model build on one kind of GPU, built one way.

    TensorRT engines are valid only for the TensorRT version and GPU they were built with, and ORT's own
    cache names do not carry the TensorRT version: keying the directory on all four means an upgrade or
    a different GPU model builds afresh instead of loading an engine that fails or misbehaves. `build`
    (`engine_build_key`): what the engine was built for beyond those, so a redeploy that changes the
    profile, a precision flag, the workspace or the builder level builds afresh too.
    """
    key = f"{model_sha256[:16]}-ort{_slug(ort_version)}-trt{_slug(trt_version)}-{_slug(gpu_name)}"
    return f"{base.rstrip('/')}/{key}" + (f"-{_slug(build)}" if build else "")


def engine_build_key(opts: RuntimeOptions) -> str:
    """The optimisation profile (min, opt, max batch), the precision flags, the workspace and the builder level
    an engine is built with. ORT names its engine files by the graph, not by these (onnxruntime#32254 is a
    sibling): without them in the directory, a changed `tensorrt.max_batch_size` would load an engine built
    for another profile."""
    trt = opts.tensorrt
    fp16 = opts.fp16 or opts.precision == "fp16"
    flags = [f for f, on in (("int8", opts.precision == "int8"), ("fp16", fp16)) if on] or ["fp32"]
    profile = f"b1.{trt.opt_batch_size or trt.max_batch_size}.{trt.max_batch_size}"
    return f"{profile}-{'.'.join(flags)}-ws{trt.workspace_bytes >> 20}m-l{trt.builder_optimization_level}"


def _shape(input_name: str, batch: int, sample_shape: Sequence[int]) -> str:
    return f"{input_name}:{'x'.join(str(d) for d in (batch, *sample_shape))}"


def tensorrt_provider(opts: RuntimeOptions, cache_path: str, input_name: str, sample_shape: Sequence[int]) -> Provider:
    """TensorRT EP options (onnxruntime tensorrt_provider_options.h, ORT 1.31)."""
    trt = opts.tensorrt
    int8 = opts.precision == "int8"
    options: dict[str, Any] = {
        "device_id": opts.device_id,
        # Explicit quantization: a QDQ graph needs the builder's INT8 flag, and no calibration table
        # (onnxruntime#13381, onnxruntime PR #8969).
        "trt_int8_enable": int8,
        # An FP16 build's weights are FP16: the builder needs the flag to keep its layers in FP16.
        "trt_fp16_enable": opts.fp16 or opts.precision == "fp16",
        "trt_max_workspace_size": trt.workspace_bytes,
        "trt_builder_optimization_level": trt.builder_optimization_level,
        "trt_engine_cache_enable": True,
        "trt_engine_cache_path": cache_path,
        "trt_timing_cache_enable": trt.timing_cache,
        "trt_timing_cache_path": cache_path,
        # One profile for every batch size the Classifier sends, so neither warm-up nor traffic rebuilds.
        "trt_profile_min_shapes": _shape(input_name, 1, sample_shape),
        "trt_profile_opt_shapes": _shape(input_name, trt.opt_batch_size or trt.max_batch_size, sample_shape),
        "trt_profile_max_shapes": _shape(input_name, trt.max_batch_size, sample_shape),
    }
    return Provider(TENSORRT, options)


def cuda_provider(opts: RuntimeOptions) -> Provider:
    options: dict[str, Any] = {
        "device_id": opts.device_id,
        "arena_extend_strategy": "kSameAsRequested",
        # EXHAUSTIVE (the default) benchmarks every cuDNN algorithm again for each new input shape: a
        # warm-up over batch sizes 1..64 would pay it 64 times. HEURISTIC asks cuDNN's heuristics once.
        "cudnn_conv_algo_search": "HEURISTIC",
    }
    if opts.gpu_mem_limit_bytes:
        options["gpu_mem_limit"] = opts.gpu_mem_limit_bytes
    return Provider(CUDA, options)


def slow_int8_message(variant: str) -> str:
    return (
        f"variant {variant!r} is INT8 but would run on CUDAExecutionProvider without TensorRT: ONNX Runtime's "
        "CUDA EP has no INT8 kernels for QDQ models, so every Conv runs in FP32 with extra Quantize/Dequantize "
        "work and INT8 is slower than FP32. Make TensorrtExecutionProvider usable (TensorRT's libnvinfer and "
        "libnvonnxparser, see k8s/Dockerfile) and serve the TensorRT artifact, declare what the variant serves "
        "instead (`fallback: {precision: fp16, model_path: ...}`, docs/engines.md), or set allow_slow_int8: true"
    )


def _gpu_choice(
    variant: str, opts: RuntimeOptions, available: Sequence[str], trt: Provider | None
) -> EngineChoice | None:
    wants = opts.engine
    has_trt, has_cuda = TENSORRT in available and trt is not None, CUDA in available
    providers: list[Provider] = []
    if wants in ("auto", "tensorrt") and has_trt:
        assert trt is not None
        providers.append(trt)
    if wants == "tensorrt" and not has_trt:
        raise PlanError(
            f"variant {variant!r}: engine tensorrt, but TensorrtExecutionProvider is not usable here",
            needs_tensorrt=True,
        )
    if has_cuda:
        providers.append(cuda_provider(opts))  # TensorRT's fallback for nodes it does not take, or the engine
    elif wants == "cuda":
        raise PlanError(f"variant {variant!r}: engine cuda, but CUDAExecutionProvider is not usable here")
    if not providers:
        return None
    if providers[0].name == CUDA and opts.precision == "int8" and not opts.allow_slow_int8:
        # Only TensorRT's absence is what a declared fallback answers: `engine: cuda` on a node with TensorRT is
        # the config's own contradiction, refused as it is.
        raise PlanError(slow_int8_message(variant), needs_tensorrt=not has_trt)
    config = {RECORD_ASSIGNMENT: "1"}
    if opts.require_gpu:
        config[DISABLE_CPU_FALLBACK] = "1"
    else:
        providers.append(Provider(CPU))
    return EngineChoice(ENGINE_OF_PROVIDER[providers[0].name], tuple(providers), config)


def cpu_choice(session_config: dict[str, str] | None = None) -> EngineChoice:
    """ONNX Runtime's CPU EP alone, node placement recorded; `session_config` adds ORT config entries."""
    return EngineChoice("cpu", (Provider(CPU),), {RECORD_ASSIGNMENT: "1", **(session_config or {})})


def u8s8_overflow_note(variant: str) -> str:
    return (
        f"variant {variant!r}: its INT8 weights can overflow the U8S8 kernels of ONNX Runtime and OpenVINO on "
        "this CPU (x86 without VNNI: wrong answers, docs/model.md 'INT8 on x86 CPUs without VNNI'), so it runs on "
        f"ORT's U8U8 kernels where a layer needs them ({PRECISE_U8S8}): right, but without most of INT8's speed-up. "
        "Requantize with `python -m app.models quantize` (it limits the weight pairs) to have both"
    )


def _cpu_choices(variant: str, opts: RuntimeOptions, openvino: bool) -> list[EngineChoice]:
    cpu = cpu_choice()
    if opts.engine == "openvino":
        if not openvino:
            raise PlanError(f"variant {variant!r}: engine openvino, but the openvino package is not installed")
        return [EngineChoice("openvino")]
    if opts.engine == "cpu" or not openvino:
        return [cpu]
    return [EngineChoice("openvino"), cpu]


def plan_engines(
    variant: str,
    opts: RuntimeOptions,
    available: Sequence[str],
    openvino: bool,
    tensorrt: Provider | None = None,
    u8s8_overflow: bool = False,
) -> EnginePlan:
    """The engines `variant` would run on, given the ORT providers usable on the node and OpenVINO.

    `tensorrt` carries the TensorRT options (they need the model's input name and a cache path the
    caller knows); without it the TensorRT EP is not considered. `u8s8_overflow`: this CPU lacks VNNI and
    the model's int8 weights (whatever its declared precision) can overflow its U8S8 kernels (app.served_model.u8s8);
    a CPU plan then takes ORT's U8U8 kernels alone, and says so in its note. A GPU plan ignores it.
    """
    if opts.engine not in ENGINES:
        raise PlanError(f"variant {variant!r}: engine {opts.engine!r} is not one of {ENGINES}")
    if opts.precision not in PRECISIONS:
        raise PlanError(f"variant {variant!r}: precision {opts.precision!r} is not one of {PRECISIONS}")
    if opts.prefer_gpu and opts.engine not in ("openvino", "cpu"):
        choice = _gpu_choice(variant, opts, available, tensorrt)
        if choice is not None:
            return EnginePlan((choice,), gpu=True)
        if opts.require_gpu or opts.engine in GPU_ENGINES:
            raise PlanError(
                f"variant {variant!r} needs a GPU engine ({opts.engine}, require_gpu={opts.require_gpu}) but neither "
                f"TensorrtExecutionProvider nor CUDAExecutionProvider is usable here (usable: {list(available)})"
            )
        note = f"granted a GPU, but no GPU execution provider is usable here (usable: {list(available)})"
        return _cpu_plan(variant, opts, openvino, u8s8_overflow, note)
    if opts.require_gpu:
        raise PlanError(f"variant {variant!r}: require_gpu is set but the replica has no GPU")
    if opts.engine in GPU_ENGINES:
        raise PlanError(f"variant {variant!r}: engine {opts.engine} needs a GPU; this replica has none")
    return _cpu_plan(variant, opts, openvino, u8s8_overflow)


def _cpu_plan(variant: str, opts: RuntimeOptions, openvino: bool, u8s8_overflow: bool, note: str = "") -> EnginePlan:
    if not u8s8_overflow:
        return EnginePlan(tuple(_cpu_choices(variant, opts, openvino)), gpu=False, note=note)
    if opts.engine == "openvino":
        raise PlanError(f"{u8s8_overflow_note(variant)}; engine openvino has no such switch")
    note = "; ".join(n for n in (note, u8s8_overflow_note(variant)) if n)
    return EnginePlan((cpu_choice({PRECISE_U8S8: "1"}),), gpu=False, note=note)
