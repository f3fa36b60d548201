"""ONNX Runtime IO binding with one host input buffer per batch slot: the GPU path's copies, made once.

Without binding, `session.run` copies a batch of 64 uint8 224x224x3 images (9.6 MB) from pageable NumPy
memory to the device (CUDA stages pageable copies through a driver buffer) and returns outputs with a
synchronous copy back. Bound, each call writes its batch into a page-locked host buffer that belongs to
one slot (one batch in flight), binds the first `n` rows of it as the input, lets the execution provider
keep the output on the device and copies it to the host once (`IOBinding.copy_outputs_to_cpu`).

A slot (its IOBinding and its buffer) serves one call at a time: a call takes a free slot, so two
concurrent batches never write into the same buffer. The Classifier runs at most
`max_concurrent_batches` batches at once (RuntimeOptions.streams): that many slots are made up front,
and no more ever (each pins 9.6 MB of host memory for the life of the session). A call that finds
every slot busy (a live raise of that setting, until the engine is opened again) runs through plain
`session.run` instead: correct, only without the pinned buffer.

Page-locked memory comes from the CUDA runtime (`cudaHostAlloc` in libcudart, a library the CUDA and
TensorRT execution providers load anyway): ONNX Runtime 1.31's Python API names no pinned device type
("cuda_pinned" is not among OrtDevice.make's types), and its HOST_ACCESSIBLE allocator is reached only
through a plugin EP's OrtEpDevice. ONNX Runtime sees the buffer as CPU memory and copies it to the
device as it would any host input; CUDA copies page-locked memory by DMA, without the staging copy. On
the CPU EP the same code runs with plain host buffers and outputs bound to the CPU, so tests run it.
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnxruntime as ort

HostAlloc = Callable[[tuple[int, ...], np.dtype[Any], int], np.ndarray]  # (shape, dtype, device_id)
CUDA_RUNTIME = "libcudart.so.13"  # as PROVIDER_LIBRARIES in ort_engine.py: onnxruntime-gpu 1.31 is built on CUDA 13
_CUDA_HOST_ALLOC_PORTABLE = 1  # cudaHostAllocPortable: pinned for every CUDA context of the process


def plain_host_array(shape: tuple[int, ...], dtype: np.dtype[Any], device_id: int = 0) -> np.ndarray:
    return np.empty(shape, dtype=dtype)


def _cuda_runtime() -> Any:
    """libcudart with the three functions used here declared (cudaError_t is an int), so ctypes passes a
    size_t and an unsigned int as such, not as C ints."""
    cudart = ctypes.CDLL(CUDA_RUNTIME)
    cudart.cudaSetDevice.argtypes = [ctypes.c_int]
    cudart.cudaSetDevice.restype = ctypes.c_int
    cudart.cudaHostAlloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t, ctypes.c_uint]
    cudart.cudaHostAlloc.restype = ctypes.c_int
    cudart.cudaFreeHost.argtypes = [ctypes.c_void_p]
    cudart.cudaFreeHost.restype = ctypes.c_int
    return cudart


def pinned_host_array(shape: tuple[int, ...], dtype: np.dtype[Any], device_id: int = 0) -> np.ndarray:
    """A C-ordered array in page-locked host memory (cudaHostAlloc), freed (cudaFreeHost) with the array.

    `device_id` is made the calling thread's current device first: cudaHostAlloc on a thread whose current
    device is 0 would otherwise create a CUDA context (hundreds of MB) on GPU 0 for a session on another GPU."""
    cudart = _cuda_runtime()
    status = cudart.cudaSetDevice(device_id)
    if status != 0:
        raise RuntimeError(f"cudaSetDevice({device_id}) failed (cudaError {status})")
    nbytes = int(np.prod(shape)) * dtype.itemsize
    ptr = ctypes.c_void_p()
    status = cudart.cudaHostAlloc(ctypes.byref(ptr), ctypes.c_size_t(nbytes), _CUDA_HOST_ALLOC_PORTABLE)
    if status != 0 or not ptr.value:
        raise MemoryError(f"cudaHostAlloc of {nbytes} bytes failed (cudaError {status})")
    raw = (ctypes.c_uint8 * nbytes).from_address(ptr.value)
    array = np.frombuffer(memoryview(raw), dtype=dtype).reshape(shape)
    weakref.finalize(raw, cudart.cudaFreeHost, ptr)  # when the last view of the buffer goes
    return array


@dataclass
class _Slot:
    binding: ort.IOBinding
    host: np.ndarray  # [capacity, *sample]: a batch's rows are written to the front


class BoundRunner:
    """`run(batch, outputs)` through IO binding, one slot per batch in flight (at most `slots`); `session.run`
    past the capacity or with every slot busy."""

    def __init__(
        self,
        session: ort.InferenceSession,
        input_name: str,
        sample_shape: Sequence[int],
        dtype: np.dtype[Any],
        capacity: int,
        slots: int,
        output_device: str = "cpu",
        device_id: int = 0,
        host_alloc: HostAlloc = plain_host_array,
    ) -> None:
        self.session = session
        self.input_name = input_name
        self.sample_shape = tuple(int(d) for d in sample_shape)
        self.dtype = np.dtype(dtype)
        self.capacity = capacity
        self.output_device = output_device
        self.device_id = device_id
        self._host_alloc = host_alloc
        self._lock = threading.Lock()
        self.slots = max(1, slots)
        self._free: list[_Slot] = [self._new_slot() for _ in range(self.slots)]
        self.slots_made = self.slots
        self.unbound_calls = 0  # calls that found every slot busy and ran through session.run

    def _new_slot(self) -> _Slot:
        host = self._host_alloc((self.capacity, *self.sample_shape), self.dtype, self.device_id)
        return _Slot(self.session.io_binding(), host)

    @contextlib.contextmanager
    def _slot(self) -> Iterator[_Slot | None]:
        """A free slot, taken under the lock (nothing is allocated while holding it); None when all are busy."""
        with self._lock:
            slot = self._free.pop() if self._free else None
            if slot is None:
                self.unbound_calls += 1
        if slot is None:
            yield None
            return
        try:
            yield slot
        finally:
            with self._lock:
                self._free.append(slot)

    def run(self, batch: np.ndarray, outputs: Sequence[str]) -> list[np.ndarray]:
        n = len(batch)
        if n > self.capacity or batch.shape[1:] != self.sample_shape or batch.dtype != self.dtype:
            # Past the TensorRT profile's largest batch, or not the model's input: ONNX Runtime's own checks.
            return self.session.run(list(outputs), {self.input_name: batch})
        with self._slot() as slot:
            if slot is None:  # every slot busy: more batches in flight than slots (a live raise of streams)
                return self.session.run(list(outputs), {self.input_name: batch})
            rows = slot.host[:n]
            np.copyto(rows, batch)
            b = slot.binding
            b.bind_input(self.input_name, "cpu", 0, self.dtype, rows.shape, rows.ctypes.data)
            for name in outputs:
                b.bind_output(name, self.output_device, self.device_id)
            self.session.run_with_iobinding(b)
            result: list[np.ndarray] = b.copy_outputs_to_cpu()
            b.clear_binding_outputs()
            b.clear_binding_inputs()
            return result


def io_binding_wanted(setting: bool | None, on_gpu: bool) -> bool:
    """Bound where it pays: `setting` if given, else on a GPU engine only (docs/engines.md "IO binding")."""
    return on_gpu if setting is None else setting
