"""`decode_in: gpu`: one engine batch of the model's pixels in ONE device buffer, written in place and read in place.

A Classifier replica that decodes on the GPU fills a `DeviceBatch` row by row: the declared transform writes a device
image's pixels straight into its row (`CudaImageTransform.into`, the output bound by pointer), an image the CPU path
decoded is copied up into its row (`upload`), and the engine binds the whole buffer as its input
(`OrtEngine.run_device`). The pixels never travel through host memory; only the logits come back.

The buffer is an ONNX Runtime OrtValue uint8 [capacity, h, w, C] on `kind` ("cuda" on a GPU node; "cpu" where the
stand-in decoder and tests run the very same code), capacity the engine's padded batch (`ort_engine.padded_rows`), so
the rows a GPU session is padded to lie inside the buffer. Copies go through an injected `Copier`:
  CudaCopier  cudaMemcpyAsync on the decoder's CUDA stream, then cudaStreamSynchronize(stream) before the engine reads
              (the CUDA runtime through ctypes, as cuda_transform.new_stream creates that stream);
  HostCopier  ctypes.memmove (the "cpu" kind).
NOT YET RUN ON A GPU: CudaCopier and the "cuda" kind are written from the CUDA runtime's and ONNX Runtime's
documentation and sources; CI runs the "cpu" kind through ORT's real API (tests/test_device_batch_unit.py) and checks
CudaCopier's calls against a fake CUDA runtime.

A `DevicePool` holds one buffer per batch that can run at once (taken and returned around a batch).
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import numpy as np
import onnxruntime as ort

CUDART = ("libcudart.so.13", "libcudart.so.12", "libcudart.so")
# cudaMemcpyKind (cuda_runtime_api.h / driver_types.h)
CUDA_MEMCPY_HOST_TO_DEVICE = 1
CUDA_MEMCPY_DEVICE_TO_DEVICE = 3


def load_cudart() -> Any:
    """The CUDA runtime ONNX Runtime's CUDA EP loads (its NVIDIA pip packages first, ONNX Runtime 1.21+)."""
    preload = getattr(ort, "preload_dlls", None)
    if preload is not None:
        preload(cuda=True, cudnn=False)
    errors = []
    for name in CUDART:
        try:
            return ctypes.CDLL(name)
        except OSError as e:
            errors.append(str(e))
    raise RuntimeError(f"decode_in: gpu needs the CUDA runtime library: {'; '.join(errors)}")


class Copier(Protocol):
    """Byte copies into a device buffer, ordered; `sync` returns when every copy so far has landed."""

    def h2d(self, dst: int, src: int, nbytes: int) -> None: ...

    def d2d(self, dst: int, src: int, nbytes: int) -> None: ...

    def sync(self) -> None: ...


class HostCopier:
    """The "cpu" kind: plain memory, copied at once."""

    def h2d(self, dst: int, src: int, nbytes: int) -> None:
        ctypes.memmove(dst, src, nbytes)

    def d2d(self, dst: int, src: int, nbytes: int) -> None:
        ctypes.memmove(dst, src, nbytes)

    def sync(self) -> None:
        return None


class CudaCopier:
    """cudaMemcpyAsync on `stream` (the decoder's and the transform's stream, so a copy is ordered after the transforms
    queued before it), cudaStreamSynchronize(stream) in `sync`. Every call's cudaError is checked: not 0 raises.

    Designed from the CUDA runtime API's documentation, NOT YET RUN ON A GPU (tests check the calls against a fake
    runtime). A pageable host source: cudaMemcpyAsync returns once the source is staged ("API synchronization behavior"
    in the CUDA runtime's documentation), and DeviceBatch keeps its sources alive until `sync` anyway."""

    def __init__(self, stream: int, cudart: Any = None) -> None:
        if not stream:
            raise ValueError("the copies must run on the decoder's own stream, not the legacy default one (0)")
        self.stream = stream
        self.cudart = cudart if cudart is not None else load_cudart()

    def h2d(self, dst: int, src: int, nbytes: int) -> None:
        self._copy(dst, src, nbytes, CUDA_MEMCPY_HOST_TO_DEVICE)

    def d2d(self, dst: int, src: int, nbytes: int) -> None:
        self._copy(dst, src, nbytes, CUDA_MEMCPY_DEVICE_TO_DEVICE)

    def _copy(self, dst: int, src: int, nbytes: int, kind: int) -> None:
        rc = self.cudart.cudaMemcpyAsync(
            ctypes.c_void_p(dst), ctypes.c_void_p(src), ctypes.c_size_t(nbytes), ctypes.c_int(kind),
            ctypes.c_void_p(self.stream),
        )  # fmt: skip
        _check(rc, "cudaMemcpyAsync")

    def sync(self) -> None:
        _check(self.cudart.cudaStreamSynchronize(ctypes.c_void_p(self.stream)), "cudaStreamSynchronize")


def _check(rc: Any, call: str) -> None:
    if int(rc) != 0:
        raise RuntimeError(f"{call} failed (cudaError {int(rc)})")


class DeviceBatch:
    """One engine batch: uint8 [capacity, *shape] on `kind`, its rows claimed in order (`claim`) by the images of the
    batch. `row_ptr(i)`: where row i starts (the transform's output is bound there)."""

    def __init__(self, capacity: int, shape: tuple[int, ...], kind: str, device_id: int, copier: Copier) -> None:
        self.capacity, self.shape, self.kind, self.device_id, self.copier = (
            capacity,
            tuple(shape),
            kind,
            device_id,
            copier,
        )
        self.value = ort.OrtValue.ortvalue_from_shape_and_type([capacity, *self.shape], np.uint8, kind, device_id)
        self.row_bytes = int(np.prod(self.shape))
        self.used = 0  # rows claimed so far in this batch
        self._sources: list[np.ndarray] = []  # host rows being copied up: alive until sync()

    def reset(self) -> None:
        self.used = 0
        self._sources = []

    def claim(self) -> int:
        """The next free row."""
        if self.used >= self.capacity:
            raise RuntimeError(f"a device batch of {self.capacity} rows is full")
        self.used += 1
        return self.used - 1

    def row_ptr(self, i: int) -> int:
        if not 0 <= i < self.capacity:
            raise IndexError(f"row {i} of a device batch of {self.capacity}")
        return int(self.value.data_ptr()) + i * self.row_bytes

    def upload(self, i: int, row: np.ndarray) -> None:
        """A host image's pixels (uint8 [*shape]) into row i."""
        if row.dtype != np.uint8 or tuple(row.shape) != self.shape:
            raise ValueError(f"a row is uint8 {self.shape}, got {row.dtype} {row.shape}")
        row = np.ascontiguousarray(row)
        self._sources.append(row)
        self.copier.h2d(self.row_ptr(i), row.ctypes.data, self.row_bytes)

    def copy_rows_to(self, dst: int, n: int) -> None:
        """Rows 0..n-1 to device memory at `dst` (a CUDA graph's bucket input), landed when this returns."""
        if n:
            self.copier.d2d(dst, self.row_ptr(0), n * self.row_bytes)
        self.sync()

    def sync(self) -> None:
        """Every copy into the buffer has landed (before the engine reads it)."""
        self.copier.sync()
        self._sources = []

    def host(self, n: int) -> np.ndarray:
        """A host copy of rows 0..n-1 (for the rare path that needs numpy: the profiling twin, a non-ORT engine)."""
        self.sync()
        return np.array(self.value.numpy()[:n])


class DevicePool:
    """Device batches for the batches running at once: `take(rows)` lends one of at least `rows` rows (made when none
    is free, so never more than the batches that really ran together) and takes it back when the block ends, an
    exception included."""

    def __init__(self, make: Callable[[int], DeviceBatch], rows_for: Callable[[int], int], min_rows: int) -> None:
        self.make, self.rows_for, self.min_rows = make, rows_for, min_rows
        self._free: list[DeviceBatch] = []
        self._lock = threading.Lock()
        self.made = 0

    @contextlib.contextmanager
    def take(self, rows: int) -> Iterator[DeviceBatch]:
        need = self.rows_for(max(rows, self.min_rows))
        with self._lock:
            fits = [b for b in self._free if b.capacity >= need]
            batch = fits[0] if fits else None
            if batch is not None:
                self._free.remove(batch)
        if batch is None:
            with self._lock:  # a buffer too small for today's batches (max_batch_size grew) is let go
                self._free = [b for b in self._free if b.capacity >= need]
            batch = self.make(need)
            with self._lock:
                self.made += 1
        batch.reset()
        try:
            yield batch
        finally:
            with self._lock:
                self._free.append(batch)

    def free(self) -> int:
        with self._lock:
            return len(self._free)


__all__ = [
    "CUDA_MEMCPY_DEVICE_TO_DEVICE",
    "CUDA_MEMCPY_HOST_TO_DEVICE",
    "Copier",
    "CudaCopier",
    "DeviceBatch",
    "DevicePool",
    "HostCopier",
    "load_cudart",
]
