"""ONNX Runtime as an engine: one InferenceSession, its providers, and where each node really runs."""

from __future__ import annotations

import collections
import ctypes
import os
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from app.runtime.binding import BoundRunner, io_binding_wanted, pinned_host_array, plain_host_array
from app.runtime.plan import CPU, CUDA, DISABLE_CPU_FALLBACK, TENSORRT, EngineChoice, RuntimeOptions
from app.runtime.spec import ModelLoadError, ModelSpec, spec_from_io

# The shared libraries each GPU provider of the onnxruntime-gpu 1.31 wheel NEEDS beyond glibc
# (`readelf -d libonnxruntime_providers_{cuda,tensorrt}.so`; tests/test_runtime.py re-reads them).
# ONNX Runtime lists both providers as "available" whenever the wheel has them built in, even on a
# machine without CUDA or TensorRT; only these libraries tell whether a provider can really load.
PROVIDER_LIBRARIES = {
    CUDA: ("libcudart.so.13", "libcublas.so.13", "libcublasLt.so.13", "libcurand.so.10", "libcudnn.so.9"),
    TENSORRT: ("libcudart.so.13", "libcublas.so.13", "libcudnn.so.9", "libnvinfer.so.10", "libnvonnxparser.so.10"),
}


def missing_libraries(provider: str) -> list[str]:
    """The libraries of `provider` the dynamic loader cannot find here (empty: it can load)."""
    missing = []
    for name in PROVIDER_LIBRARIES.get(provider, ()):
        try:
            ctypes.CDLL(name)
        except OSError:
            missing.append(name)
    return missing


def usable_providers() -> list[str]:
    """ONNX Runtime's available providers whose libraries load on this machine, in ORT's order."""
    return [p for p in ort.get_available_providers() if not missing_libraries(p)]


def ort_version() -> str:
    return str(ort.__version__)


def tensorrt_version() -> str:
    """TensorRT's own version (getInferLibVersion, e.g. 101601 -> 10.16.1), or "none"."""
    try:
        v = int(ctypes.CDLL("libnvinfer.so.10").getInferLibVersion())
    except (OSError, AttributeError):
        return "none"
    return f"{v // 10000}.{v // 100 % 100}.{v % 100}"


_ORT_TYPES = {"tensor(uint8)": np.uint8, "tensor(float)": np.float32, "tensor(float16)": np.float16}


def session_options(opts: RuntimeOptions, choice: EngineChoice, cpu_fallback: bool = False) -> ort.SessionOptions:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.intra_op_num_threads = opts.threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    # Spinning threads burn the core the Preprocessor and the proxy need between batches.
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    for key, value in choice.session_config.items():
        if not (cpu_fallback and key == DISABLE_CPU_FALLBACK):
            so.add_session_config_entry(key, value)
    so.log_severity_level = 3
    if opts.profile_prefix:
        so.enable_profiling = True
        so.profile_file_prefix = opts.profile_prefix
    return so


def node_placement(session: ort.InferenceSession) -> dict[str, list[str]]:
    """Execution provider -> the nodes ("OpType name") it really runs, as ONNX Runtime assigned them."""
    placed: dict[str, list[str]] = collections.defaultdict(list)
    try:
        subgraphs = session.get_provider_graph_assignment_info()
    except Exception:  # recording not enabled for this session
        return {}
    for sub in subgraphs:
        placed[sub.ep_name].extend(f"{n.op_type} {n.name}" for n in sub.get_nodes())
    return dict(placed)


class OrtEngine:
    """One ONNX Runtime session and the facts a server must report about it."""

    def __init__(self, path: str | os.PathLike[str], opts: RuntimeOptions, choice: EngineChoice) -> None:
        self.path = Path(path)
        self.opts = opts
        self.choice = choice
        self.name = choice.engine
        if not self.path.is_file():
            raise ModelLoadError(f"model file not found: {self.path}")
        requested = [(p.name, {k: str(v) for k, v in p.options.items()}) for p in choice.providers]
        self.requested_providers = [name for name, _ in requested]
        try:
            # enable_fallback=0: ORT's Python layer would otherwise retry silently on the CPU EP alone.
            self.session: ort.InferenceSession | None = ort.InferenceSession(
                str(self.path), sess_options=session_options(opts, choice), providers=requested, enable_fallback=0
            )
        except Exception as e:  # ORT raises its own Fail/InvalidGraph/EPFail types
            raise ModelLoadError(self._load_error(e, requested)) from e
        self.providers = list(self.session.get_providers())
        self.placement = node_placement(self.session)
        inp = self.session.get_inputs()
        self.spec: ModelSpec = spec_from_io(
            [(i.name, tuple(i.shape), i.type) for i in inp], [o.name for o in self.session.get_outputs()]
        )
        self._dtype = _ORT_TYPES.get(self.spec.input_dtype, np.float32)
        self.bound = self._bound_runner()

    def _bound_runner(self) -> BoundRunner | None:
        """IO binding (binding.py) where `opts.io_binding` asks for it: by default on a GPU engine only."""
        assert self.session is not None
        on_gpu = bool(self.providers) and self.providers[0] in (TENSORRT, CUDA)
        if not io_binding_wanted(self.opts.io_binding, on_gpu):
            return None
        return BoundRunner(
            self.session,
            self.spec.input_name,
            self.spec.sample_shape(),
            np.dtype(self._dtype),
            capacity=self.opts.tensorrt.max_batch_size,
            slots=self.opts.streams,
            output_device="cuda" if on_gpu else "cpu",
            device_id=self.opts.device_id,
            host_alloc=pinned_host_array if on_gpu else plain_host_array,
        )

    def _load_error(self, e: Exception, requested: list[tuple[str, dict[str, str]]]) -> str:
        """The load failure; when CPU fallback was disabled, the nodes that would have needed the host."""
        message = f"cannot load model {self.path} on {self.requested_providers}: {str(e).splitlines()[0]}"
        if self.choice.session_config.get(DISABLE_CPU_FALLBACK) != "1":
            return message
        try:  # again with fallback allowed, only to read which nodes ORT would put on the CPU EP
            probe = ort.InferenceSession(
                str(self.path),
                sess_options=session_options(self.opts, self.choice, cpu_fallback=True),
                providers=requested,
                enable_fallback=0,
            )
        except Exception:
            return message
        on_cpu = node_placement(probe).get(CPU, [])
        if on_cpu:
            shown = ", ".join(on_cpu[:10]) + (f" and {len(on_cpu) - 10} more" if len(on_cpu) > 10 else "")
            message += f"; require_gpu: {len(on_cpu)} nodes can only run on the CPU: {shown}"
        return message

    @property
    def active_provider(self) -> str:
        """The provider that runs the most nodes (the first registered one when placement is unknown)."""
        if self.placement:
            return max(self.placement, key=lambda p: (len(self.placement[p]), -self.providers.index(p)))
        return self.providers[0] if self.providers else "none"

    def placement_counts(self) -> dict[str, int]:
        return {ep: len(nodes) for ep, nodes in sorted(self.placement.items())}

    @property
    def alive(self) -> bool:
        return self.session is not None

    def run(self, batch: np.ndarray, outputs: list[str] | None = None) -> list[np.ndarray]:
        if self.session is None:
            raise ModelLoadError(f"session for {self.path} is closed")
        if self.bound is not None:
            return self.bound.run(batch, outputs or list(self.spec.output_names))
        return self.session.run(outputs, {self.spec.input_name: batch})

    def logits(self, batch: np.ndarray) -> np.ndarray:
        return self.run(batch, [self.spec.output_names[0]])[0]

    def dummy_batch(self, n: int) -> np.ndarray:
        return np.full(self.spec.batch_shape(n), 127, dtype=self._dtype)

    def end_profiling(self) -> str | None:
        return self.session.end_profiling() if self.session is not None and self.opts.profile_prefix else None

    def describe(self) -> dict[str, Any]:
        return {
            "engine": self.name,
            "execution_provider": self.active_provider,
            "providers": self.providers,
            "requested_providers": self.requested_providers,
            "nodes_per_provider": self.placement_counts(),
        }

    def close(self) -> None:
        self.session = None
        self.bound = None
