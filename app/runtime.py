"""ONNX Runtime behind one small interface. The only serving module that imports onnxruntime.

`ModelRunner` owns one InferenceSession: provider choice (CUDA -> CPU),
thread counts bound to the replica's CPU share, the model's I/O spec read
from the session, and the provider that is really active after loading.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

CUDA = "CUDAExecutionProvider"
CPU = "CPUExecutionProvider"

_ORT_TYPES = {
    "tensor(uint8)": np.uint8,
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(int8)": np.int8,
}


class ModelLoadError(RuntimeError):
    """A model file is missing, corrupt, or could not be placed where it must run."""


@dataclass(frozen=True)
class ModelSpec:
    """What the served graph expects and returns, read from the session, never assumed."""

    input_name: str
    input_shape: tuple[int | str | None, ...]
    input_dtype: str
    output_names: tuple[str, ...]
    height: int
    width: int
    layout: str  # "NHWC" or "NCHW"

    def describe(self) -> dict[str, Any]:
        return {
            "input": {"name": self.input_name, "shape": list(self.input_shape), "dtype": self.input_dtype},
            "outputs": list(self.output_names),
            "layout": self.layout,
            "size": [self.height, self.width],
        }


@dataclass(frozen=True)
class RuntimeOptions:
    threads: int = 1
    prefer_gpu: bool = True
    require_gpu: bool = False
    device_id: int = 0
    gpu_mem_limit_bytes: int | None = None
    profile_prefix: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def threads_for(num_cpus: float) -> int:
    """ONNX Runtime intra-op threads for a replica granted `num_cpus` (at least one)."""
    return max(1, math.floor(num_cpus + 1e-9))


def choose_providers(available: list[str], opts: RuntimeOptions) -> list[tuple[str, dict[str, Any]]]:
    """CUDA first when it is built in and wanted, CPU always last as the fallback."""
    providers: list[tuple[str, dict[str, Any]]] = []
    if opts.prefer_gpu and CUDA in available:
        cuda: dict[str, Any] = {"device_id": opts.device_id, "arena_extend_strategy": "kSameAsRequested"}
        if opts.gpu_mem_limit_bytes:
            cuda["gpu_mem_limit"] = opts.gpu_mem_limit_bytes
        providers.append((CUDA, cuda))
    providers.append((CPU, {}))
    return providers


def session_options(opts: RuntimeOptions) -> ort.SessionOptions:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.intra_op_num_threads = opts.threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    # Spinning threads burn the core the Preprocessor and the proxy need between batches.
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    so.log_severity_level = 3
    if opts.profile_prefix:
        so.enable_profiling = True
        so.profile_file_prefix = opts.profile_prefix
    return so


def read_spec(session: ort.InferenceSession) -> ModelSpec:
    inputs = session.get_inputs()
    if len(inputs) != 1:
        raise ModelLoadError(f"expected a model with one image input, found {[i.name for i in inputs]}")
    inp = inputs[0]
    shape = tuple(d if isinstance(d, int) else None for d in inp.shape)
    if len(shape) != 4:
        raise ModelLoadError(f"input {inp.name!r} has shape {inp.shape}; an image batch needs 4 dimensions")
    layout = "NHWC" if shape[3] in (1, 3) else "NCHW"
    h, w = (shape[1], shape[2]) if layout == "NHWC" else (shape[2], shape[3])
    if not isinstance(h, int) or not isinstance(w, int):
        raise ModelLoadError(f"input {inp.name!r} needs a fixed spatial size, has {inp.shape}")
    return ModelSpec(
        input_name=inp.name,
        input_shape=tuple(inp.shape),
        input_dtype=inp.type,
        output_names=tuple(o.name for o in session.get_outputs()),
        height=h,
        width=w,
        layout=layout,
    )


class ModelRunner:
    """One ONNX Runtime session and the facts a server must report about it."""

    def __init__(self, path: str | os.PathLike[str], opts: RuntimeOptions | None = None) -> None:
        self.path = Path(path)
        self.opts = opts or RuntimeOptions()
        if not self.path.is_file():
            raise ModelLoadError(f"model file not found: {self.path}")
        requested = choose_providers(ort.get_available_providers(), self.opts)
        try:
            self.session: ort.InferenceSession | None = ort.InferenceSession(
                str(self.path), sess_options=session_options(self.opts), providers=requested
            )
        except Exception as e:  # ORT raises its own Fail/InvalidGraph/... types
            raise ModelLoadError(f"cannot load model {self.path}: {e}") from e
        self.requested_providers = [name for name, _ in requested]
        self.providers = self.session.get_providers()
        self.spec = read_spec(self.session)
        self._dtype = _ORT_TYPES.get(self.spec.input_dtype, np.float32)
        if self.opts.require_gpu and self.active_provider != CUDA:
            raise ModelLoadError(
                f"require_gpu is set but {self.path.name} runs on {self.active_provider} "
                f"(requested {self.requested_providers}, available {ort.get_available_providers()}): "
                "no usable CUDA device or CUDA/cuDNN libraries in this replica"
            )

    @property
    def active_provider(self) -> str:
        return self.providers[0] if self.providers else "none"

    @property
    def alive(self) -> bool:
        return self.session is not None

    def run(self, batch: np.ndarray, outputs: list[str] | None = None) -> list[np.ndarray]:
        if self.session is None:
            raise ModelLoadError(f"session for {self.path} is closed")
        return self.session.run(outputs, {self.spec.input_name: batch})

    def logits(self, batch: np.ndarray) -> np.ndarray:
        return self.run(batch, [self.spec.output_names[0]])[0]

    def dummy_batch(self, n: int) -> np.ndarray:
        if self.spec.layout == "NHWC":
            shape: tuple[int, ...] = (n, self.spec.height, self.spec.width, 3)
        else:
            shape = (n, 3, self.spec.height, self.spec.width)
        return np.full(shape, 127, dtype=self._dtype)

    def end_profiling(self) -> str | None:
        return self.session.end_profiling() if self.session is not None and self.opts.profile_prefix else None

    def close(self) -> None:
        self.session = None


def softmax(logits: np.ndarray) -> np.ndarray:
    z = logits - logits.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


def summarize_profile(trace_path: str, top: int = 10) -> dict[str, list[dict[str, Any]]]:
    """ONNX Runtime's Chrome-trace JSON -> the `top` most expensive and most frequent operators."""
    import json
    from collections import defaultdict

    with open(trace_path) as f:
        events = json.load(f)
    total_us: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    for ev in events:
        if ev.get("cat") != "Node" or not str(ev.get("name", "")).endswith("_kernel_time"):
            continue
        op = ev.get("args", {}).get("op_name", "?")
        total_us[op] += float(ev.get("dur", 0))
        calls[op] += 1
    expensive = sorted(total_us, key=lambda op: -total_us[op])[:top]
    frequent = sorted(calls, key=lambda op: -calls[op])[:top]
    return {
        "most_expensive": [
            {"op": op, "total_ms": round(total_us[op] / 1000, 3), "calls": calls[op]} for op in expensive
        ],
        "most_frequent": [{"op": op, "calls": calls[op], "total_ms": round(total_us[op] / 1000, 3)} for op in frequent],
    }
