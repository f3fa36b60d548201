"""ONNX Runtime as an engine: one InferenceSession, its providers, and where each node really runs."""

from __future__ import annotations

import collections
import contextlib
import ctypes
import os
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import onnxruntime as ort

from app.runtime.capture_gate import GATE
from app.runtime.graphs import GraphIO, GraphRunner
from app.runtime.plan import CPU, CUDA, DISABLE_CPU_FALLBACK, TENSORRT, EngineChoice, RuntimeOptions
from app.runtime.spec import ModelLoadError, ModelSpec, spec_from_io

if TYPE_CHECKING:
    from app.runtime.device_batch import DeviceBatch

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
PAD_STEP = 8  # GPU sessions see batches of 8, 16, ... rows (OrtEngine._plain_run)


def padded_rows(n: int, cap: int, step: int = PAD_STEP) -> int:
    """`n` rounded up to a multiple of `step`, at most `cap` (never below `n`)."""
    return max(n, min(-(-n // step) * step, cap))


# The provider option that turns CUDA graphs on, per provider (onnxruntime cuda_provider_options.h,
# tensorrt_provider_options.h).
GRAPH_OPTION = {CUDA: "enable_cuda_graph", TENSORRT: "trt_cuda_graph_enable"}


@dataclass(frozen=True)
class OrtDevice:
    """graphs.Device on ONNX Runtime: buffers as OrtValues on `kind` ("cuda", or "cpu" where tests run the same
    code on the CPU EP). A bucket's input is written with `OrtValue.update_inplace`: ONNX Runtime's CUDA provider copies
    it with cudaMemcpy and then synchronises the default stream (cuda_provider_factory.cc, cudaMemcpy_HostToDevice:
    a pageable copy may return before its DMA completes), so a replay that follows reads the whole batch."""

    kind: str
    device_id: int = 0

    def buffer(self, shape: tuple[int, ...], dtype: np.dtype[Any]) -> ort.OrtValue:
        return ort.OrtValue.ortvalue_from_shape_and_type(list(shape), dtype, self.kind, self.device_id)


def graph_io(session: ort.InferenceSession, spec: ModelSpec, dtype: np.dtype[Any]) -> GraphIO:
    """The buffers a bucket needs; ValueError when an output's shape beyond the batch is not fixed."""
    outputs = []
    for o in session.get_outputs():
        row = tuple(o.shape[1:])
        if not all(isinstance(d, int) for d in row) or o.type not in _ORT_TYPES:
            raise ValueError(f"output {o.name!r} is {o.type} {list(o.shape)}: a graph's buffers need a fixed shape")
        outputs.append((o.name, row, np.dtype(_ORT_TYPES[o.type])))
    return GraphIO(spec.input_name, tuple(spec.sample_shape()), dtype, tuple(outputs))


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
        self.on_gpu = bool(self.providers) and self.providers[0] in (TENSORRT, CUDA)
        self._runs_lock = threading.Lock()
        self._in_flight = 0
        self._closing = False
        self.graphs_off = ""  # why CUDA graphs were asked for and are not used ("" when not asked for, or used)
        self.graphs = self._graph_runner(requested)

    def _graph_runner(self, requested: list[tuple[str, dict[str, str]]]) -> GraphRunner | None:
        """CUDA graphs (graphs.py) on a GPU engine whose options ask for them: a session of their own per graph; batches
        no graph serves stay on this engine's session. Outputs of unknown shape leave the engine serving plain, saying
        why; a capture that fails does the same for its slot, later."""
        graphs, first = self.opts.cuda_graphs, self.providers[0] if self.providers else ""
        on_gpu = self.on_gpu and first in GRAPH_OPTION
        if graphs is None or not (on_gpu or (graphs.on_cpu and first == CPU)):
            return None
        assert self.session is not None

        def make_graph_session() -> ort.InferenceSession:
            providers = [(n, {**o, GRAPH_OPTION[n]: "1"} if on_gpu and n == first else o) for n, o in requested]
            so = session_options(self.opts, self.choice)
            return ort.InferenceSession(str(self.path), sess_options=so, providers=providers, enable_fallback=0)

        try:
            io = graph_io(self.session, self.spec, np.dtype(self._dtype))
        except ValueError as e:
            self.graphs_off = str(e)
            return None
        return GraphRunner(
            make_graph_session,
            self._plain_run,
            io,
            OrtDevice("cuda" if on_gpu else "cpu", self.opts.device_id),
            slots=self.opts.streams,
            buckets=graphs.buckets,
            label=f"{self.path.name} on {first}",
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
        return self.session is not None and not self._closing

    @contextlib.contextmanager
    def _running(self) -> Iterator[ort.InferenceSession]:
        """A run in flight: a close waits for it (the session is released when the last one ends)."""
        with self._runs_lock:
            if self.session is None:
                raise ModelLoadError(f"session for {self.path} is closed")
            self._in_flight += 1
            session = self.session
        try:
            yield session
        finally:
            with self._runs_lock:
                self._in_flight -= 1
                release = self._closing and not self._in_flight
            if release:
                self._release()

    def run(self, batch: np.ndarray, outputs: list[str] | None = None) -> list[np.ndarray]:
        with self._running():
            graphs, names = self.graphs, outputs or list(self.spec.output_names)
            if graphs is not None:
                return graphs.run(batch, names)
            # On a GPU every run of the process keeps out of a CUDA graph capture (capture_gate.py).
            with GATE.shared() if self.on_gpu else contextlib.nullcontext():
                return self._plain_run(batch, names)

    def device_input(self) -> tuple[str, int] | None:
        """Where `run_device` reads a DeviceBatch from: ("cuda" | "cpu", device id); None where the session's input is
        not the model's uint8 pixels."""
        if self.spec.input_dtype != "tensor(uint8)":
            return None
        return ("cuda", self.opts.device_id) if self.on_gpu else ("cpu", 0)

    def rows_for(self, n: int) -> int:
        """The rows a plain run of `n` images binds (GPU sessions: padded to a multiple of PAD_STEP)."""
        return padded_rows(n, self.opts.tensorrt.max_batch_size) if self.on_gpu else n

    def graph_bucket(self, n: int) -> int | None:
        """The CUDA graph bucket a batch of `n` replays (its padded rows), None where it runs plain."""
        graphs = self.graphs
        return graphs.table.get(n) if graphs is not None and graphs.active else None

    def run_device(self, batch: DeviceBatch, n: int, outputs: list[str] | None = None) -> list[np.ndarray]:
        """The outputs for rows 0..n-1 of `batch`, read in place (decode_in: gpu): a plain session binds the buffer by
        pointer, rows_for(n) rows (the padding rows are whatever the buffer holds; their outputs are dropped); a CUDA
        graph's bucket gets the rows by a device-to-device copy. Only the outputs come to the host.
        On "cuda": NOT YET RUN ON A GPU (designed from ORT's IOBinding API; CI runs the "cpu" kind)."""
        batch.sync()  # every row has landed before the session reads
        with self._running() as session:
            graphs, names = self.graphs, outputs or list(self.spec.output_names)

            def plain() -> list[np.ndarray]:
                return self._plain_device(session, batch, n, names)

            if graphs is not None:
                return graphs.run_device(n, batch.shape, lambda x: batch.copy_rows_to(x.data_ptr(), n), names, plain)
            with GATE.shared() if self.on_gpu else contextlib.nullcontext():
                return plain()

    def _plain_device(
        self, session: ort.InferenceSession, batch: DeviceBatch, n: int, outputs: list[str]
    ) -> list[np.ndarray]:
        rows = self.rows_for(n)
        if rows > batch.capacity or batch.shape != tuple(self.spec.sample_shape()):
            raise ValueError(
                f"{rows} rows of {self.spec.sample_shape()} from a device batch of {batch.capacity} x {batch.shape}"
            )
        binding = session.io_binding()
        binding.bind_input(
            self.spec.input_name, batch.kind, batch.device_id, np.uint8, [rows, *batch.shape], batch.row_ptr(0)
        )
        for name in outputs:
            binding.bind_output(name, "cpu")
        session.run_with_iobinding(binding)
        return [y[:n] for y in binding.copy_outputs_to_cpu()]

    def _plain_run(self, batch: np.ndarray, outputs: list[str]) -> list[np.ndarray]:
        """The session's own run. On a GPU a batch is padded up to a multiple of PAD_STEP rows: the session then meets a
        few shapes, not every batch size up to 64, and each new shape costs a first run (0.5 s for FP32 and several
        seconds for FP16 on an H200: cuDNN's plans and ORT's memory pattern are per shape) and a block of the arena
        that other shapes cannot always reuse (gpu_mem_limit ran out during a warm-up over 64 sizes there)."""
        session = self.session
        if session is None:
            raise ModelLoadError(f"session for {self.path} is closed")
        n = len(batch)
        rows = self.rows_for(n)
        if rows == n:
            return session.run(outputs, {self.spec.input_name: batch})
        x = np.zeros((rows, *batch.shape[1:]), dtype=batch.dtype)
        x[:n] = batch
        return [y[:n] for y in session.run(outputs, {self.spec.input_name: x})]

    @property
    def executor(self) -> ThreadPoolExecutor | None:
        """With CUDA graphs, the threads the slots' graphs live on: run batches there (no thread hop to a replay)."""
        return self.graphs.executor if self.graphs is not None else None

    def prepare(self, max_batch: int) -> None:
        """CUDA graphs captured, checked and timed for batch sizes up to `max_batch` (before traffic)."""
        if self.graphs is not None:
            self.graphs.prepare(max_batch)

    @property
    def fixed_parallel(self) -> bool:
        """The number of batches run at once is fixed at open (a session and thread per slot with CUDA graphs)."""
        return self.graphs is not None

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
            "cuda_graphs": self.graphs_state(),
        }

    def graphs_state(self) -> dict[str, Any] | None:
        """None where graphs were not asked for (a CPU engine, or cuda_graphs off)."""
        if self.graphs is not None:
            return self.graphs.describe()
        if self.graphs_off:
            return {"enabled": True, "active": False, "off": self.graphs_off}
        return None

    def close(self) -> None:
        """Released once the runs in flight are done (a live reopen closes the old engine while its batches finish):
        until then they keep their sessions, graphs and slot threads."""
        with self._runs_lock:
            self._closing = True
            release = not self._in_flight
        if release:
            self._release()

    def _release(self) -> None:
        self.session = None
        if self.graphs is not None:
            self.graphs.close()
        self.graphs = None
