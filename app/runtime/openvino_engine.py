"""OpenVINO's CPU runtime as an engine: the same ONNX file, read by OpenVINO's ONNX front end.

On Intel and AMD CPUs OpenVINO often runs these graphs faster than ONNX Runtime's CPU EP (its
fused depthwise/pointwise kernels); `auto` measures both at warm-up and keeps the faster, so it is
never assumed (`app.runtime.select`).
"""

from __future__ import annotations

import os
import queue
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from app.runtime.plan import OPENVINO, RuntimeOptions
from app.runtime.spec import ModelLoadError, ModelSpec, spec_from_io

if TYPE_CHECKING:
    from app.runtime.device_batch import DeviceBatch

# OpenVINO element type names -> ONNX Runtime's spelling, so /v1/models and the V2 metadata read alike.
_TYPES = {
    "u8": ("tensor(uint8)", np.uint8),
    "f32": ("tensor(float)", np.float32),
    "f16": ("tensor(float16)", np.float16),
}


def openvino_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("openvino") is not None


def compile_config(opts: RuntimeOptions) -> dict[str, Any]:
    """One stream per call the replica runs in parallel, each with the threads one call gets."""
    return {
        "NUM_STREAMS": opts.streams,
        "INFERENCE_NUM_THREADS": opts.threads * opts.streams,
        # Ray packs several replicas onto the same cores: pinning threads would make them fight.
        "ENABLE_CPU_PINNING": False,
        # On CPUs with BF16/AMX OpenVINO would otherwise compute an FP32 model in bf16: faster, but not
        # the answers the FP32 variant promises. INT8 graphs keep their INT8 kernels either way.
        "INFERENCE_PRECISION_HINT": "f32",
    }


class OpenVinoEngine:
    """One compiled OpenVINO model and an infer request per parallel call."""

    name = "openvino"

    def __init__(self, path: str | os.PathLike[str], opts: RuntimeOptions) -> None:
        import openvino as ov

        self.path = Path(path)
        self.opts = opts
        if not self.path.is_file():
            raise ModelLoadError(f"model file not found: {self.path}")
        try:
            core = ov.Core()
            model = core.read_model(str(self.path))
            self.compiled: Any = core.compile_model(model, "CPU", compile_config(opts))
        except Exception as e:  # OpenVINO raises RuntimeError subclasses of its own
            raise ModelLoadError(f"cannot load model {self.path} with OpenVINO: {str(e).splitlines()[0]}") from e
        inputs = []
        for port in model.inputs:
            dims = tuple(d.get_length() if d.is_static else None for d in port.get_partial_shape())
            ort_type = _TYPES.get(port.get_element_type().get_type_name(), ("tensor(float)", np.float32))[0]
            inputs.append((port.get_any_name(), dims, ort_type))
        self.spec: ModelSpec = spec_from_io(inputs, [o.get_any_name() for o in model.outputs])
        self._dtype = next(t for s, t in _TYPES.values() if s == self.spec.input_dtype)
        # An infer request serves one call at a time; a pool of `streams` lets that many run at once.
        self._requests: queue.Queue[Any] = queue.Queue()
        for _ in range(max(1, opts.streams)):
            self._requests.put(self.compiled.create_infer_request())
        self.providers = [OPENVINO]
        self.requested_providers = [OPENVINO]
        self.active_provider = OPENVINO
        self.version = ov.__version__
        self._alive = True
        # The first inference initialises pybind11's numpy bindings under a call-once that deadlocks when two
        # threads race into it (seen here: two parallel first calls hung a replica), so it is made from here.
        self.logits(self.dummy_batch(1))

    @property
    def alive(self) -> bool:
        return self._alive

    def logits(self, batch: np.ndarray) -> np.ndarray:
        if not self._alive:
            raise ModelLoadError(f"OpenVINO model {self.path} is closed")
        request = self._requests.get()
        try:
            request.infer({0: batch})
            # The output buffer belongs to the request and is overwritten by its next call: copy it out.
            return np.array(request.get_output_tensor(0).data, copy=True)
        finally:
            self._requests.put(request)

    def dummy_batch(self, n: int) -> np.ndarray:
        return np.full(self.spec.batch_shape(n), 127, dtype=self._dtype)

    def end_profiling(self) -> str | None:
        return None

    def placement_counts(self) -> dict[str, int]:
        return {}

    def describe(self) -> dict[str, Any]:
        return {
            "engine": self.name,
            "execution_provider": OPENVINO,
            "providers": self.providers,
            "requested_providers": self.requested_providers,
            "openvino": {"version": self.version, "streams": self.opts.streams, "threads": self.opts.threads},
        }

    def prepare(self, max_batch: int) -> None:
        """Nothing to capture: OpenVINO compiled for its streams at open."""

    @property
    def fixed_parallel(self) -> bool:
        """Compiled for a number of parallel calls (its streams): another number needs a new compile."""
        return True

    @property
    def executor(self) -> None:
        """Any thread: its infer requests are not bound to one."""
        return None

    def device_input(self) -> None:
        """Host arrays only: OpenVINO's CPU plugin reads no DeviceBatch."""
        return None

    def rows_for(self, n: int) -> int:
        return n

    def graph_bucket(self, n: int) -> None:
        """No CUDA graphs on OpenVINO's CPU plugin."""
        return None

    def run_device(self, batch: DeviceBatch, n: int, outputs: list[str] | None = None) -> list[np.ndarray]:
        raise NotImplementedError("OpenVINO reads host arrays only (device_input() is None)")

    def close(self) -> None:
        self._alive = False
