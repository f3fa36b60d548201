"""IO binding (app/runtime/binding.py) on ONNX Runtime's CPU EP, with the real FP32 model; no Ray.

The GPU path is the same code with page-locked host buffers and outputs bound to the device; a CUDA device
cannot exist here, so only the CUDA runtime is stood in for (the pinned-buffer tests). Everything else is
the real session, bound, against the same model run through plain `session.run`.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import gc
import threading
import types
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from app.runtime import RuntimeOptions, TensorRTOptions, binding, cpu_engine
from app.runtime.binding import BoundRunner, io_binding_wanted
from app.runtime.ort_engine import OrtEngine

CAPACITY = 16  # the slot's rows (the TensorRT profile's largest batch): small, so a batch past it is cheap


def _engine(model_files: Any, io_binding: bool | None, streams: int = 2) -> OrtEngine:
    opts = RuntimeOptions(threads=1, streams=streams, io_binding=io_binding)
    return cpu_engine(model_files.fp32, dataclasses.replace(opts, tensorrt=TensorRTOptions(max_batch_size=CAPACITY)))


@pytest.fixture(scope="module")
def engines(model_files: Any) -> tuple[OrtEngine, OrtEngine]:
    return _engine(model_files, io_binding=False), _engine(model_files, io_binding=True)


def _batch(engine: OrtEngine, n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, engine.spec.batch_shape(n), dtype=np.uint8)


@pytest.mark.parametrize("n", [1, 5, CAPACITY, CAPACITY + 3])
def test_bound_logits_are_plain_session_runs_logits(engines: tuple[OrtEngine, OrtEngine], n: int) -> None:
    plain, bound = engines
    assert plain.bound is None and bound.bound is not None
    x = _batch(plain, n, seed=n)
    expected = plain.session.run([plain.spec.output_names[0]], {plain.spec.input_name: x})[0]  # type: ignore[union-attr]
    got = bound.logits(x)
    assert got.shape == (n, expected.shape[1])
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-5)
    assert bound.run(x)[0].shape == got.shape  # every output, when none is named


def test_a_smaller_batch_after_a_larger_one_reads_only_its_own_rows(engines: tuple[OrtEngine, OrtEngine]) -> None:
    plain, bound = engines
    bound.logits(_batch(bound, CAPACITY, seed=1))  # fills every row of a slot
    x = _batch(bound, 2, seed=2)
    np.testing.assert_allclose(bound.logits(x), plain.logits(x), rtol=0, atol=1e-5)


def test_a_busy_slot_is_never_lent_to_a_second_call(engines: tuple[OrtEngine, OrtEngine]) -> None:
    plain, bound = engines
    runner = bound.bound
    assert runner is not None and runner.slots_made == 2  # one per concurrent batch (streams), made up front
    x = _batch(bound, 3, seed=3)
    unbound = runner.unbound_calls
    with runner._slot() as first, runner._slot() as second:  # both slots taken, as two batches in flight
        assert first is not None and second is not None and first is not second
        first.host[:] = 7
        second.host[:] = 9
        got: list[np.ndarray] = []
        t = threading.Thread(target=lambda: got.append(bound.logits(x)))
        t.start()
        t.join()
        # the third call neither waited, nor shared a slot, nor pinned a new buffer: it ran through session.run
        assert runner.slots_made == 2 and runner.unbound_calls == unbound + 1
        assert (first.host == 7).all() and (second.host == 9).all()
    np.testing.assert_allclose(got[0], plain.logits(x), rtol=0, atol=1e-5)


def test_concurrent_calls_past_the_slots_each_get_their_own_logits(
    engines: tuple[OrtEngine, OrtEngine], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Four threads on two slots: every call's logits are its own, no slot is lent twice at once, and no slot
    is made past the two (the others run through session.run)."""
    plain, bound = engines
    runner = bound.bound
    assert runner is not None
    in_use: set[int] = set()
    shared: list[int] = []
    guard = threading.Lock()
    take = runner._slot

    @contextlib.contextmanager
    def watched() -> Iterator[Any]:
        with take() as slot:
            if slot is not None:
                with guard:
                    if id(slot) in in_use:
                        shared.append(id(slot))
                    in_use.add(id(slot))
            try:
                yield slot
            finally:
                if slot is not None:
                    with guard:
                        in_use.discard(id(slot))

    monkeypatch.setattr(runner, "_slot", watched)
    threads, rounds = 4, 3
    batches = [_batch(bound, 1 + 3 * i, seed=10 + i) for i in range(threads)]
    expected = [plain.logits(x) for x in batches]
    start = threading.Barrier(threads)
    results: dict[int, list[np.ndarray]] = {i: [] for i in range(threads)}

    def call(i: int) -> None:
        for _ in range(rounds):
            start.wait()  # every thread's call in flight together, round after round
            results[i].append(bound.logits(batches[i]))

    pool = [threading.Thread(target=call, args=(i,)) for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    for i in range(threads):
        assert len(results[i]) == rounds
        for got in results[i]:
            np.testing.assert_allclose(got, expected[i], rtol=0, atol=1e-5)
    assert shared == [] and runner.slots_made == 2


def test_each_slot_is_allocated_for_the_sessions_device(engines: tuple[OrtEngine, OrtEngine]) -> None:
    _, bound = engines
    asked: list[tuple[tuple[int, ...], int]] = []

    def recording(shape: tuple[int, ...], dtype: np.dtype[Any], device_id: int) -> np.ndarray:
        asked.append((shape, device_id))
        return binding.plain_host_array(shape, dtype)

    assert bound.session is not None
    runner = BoundRunner(
        bound.session, bound.spec.input_name, (224, 224, 3), np.dtype(np.uint8), 4, 3, device_id=1,
        host_alloc=recording,
    )  # fmt: skip
    assert asked == [((4, 224, 224, 3), 1)] * 3 and runner.slots_made == 3


def test_binding_is_on_by_default_on_a_gpu_engine_only(model_files: Any) -> None:
    assert io_binding_wanted(None, on_gpu=True) and not io_binding_wanted(None, on_gpu=False)
    assert io_binding_wanted(True, on_gpu=False) and not io_binding_wanted(False, on_gpu=True)
    assert _engine(model_files, io_binding=None).bound is None  # the CPU EP: no faster bound (docs/engines.md)


def test_a_pinned_buffer_is_page_locked_memory_on_its_device_freed_with_the_array(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The CUDA runtime cannot load here: a stand-in libcudart hands out ctypes memory and records the calls."""
    blocks: dict[int, Any] = {}
    calls: list[tuple[str, int]] = []

    class CudaRuntimeStandIn:
        def cudaSetDevice(self, device: int) -> int:
            calls.append(("set_device", device))
            return 0

        def cudaHostAlloc(self, out: Any, size: ctypes.c_size_t, flags: int) -> int:
            block = ctypes.create_string_buffer(size.value)
            blocks[ctypes.addressof(block)] = block
            ctypes.cast(out, ctypes.POINTER(ctypes.c_void_p))[0] = ctypes.addressof(block)
            assert flags == 1  # cudaHostAllocPortable
            calls.append(("alloc", size.value))
            return 0

        def cudaFreeHost(self, ptr: ctypes.c_void_p) -> int:
            calls.append(("free", int(ptr.value or 0)))
            return 0

    monkeypatch.setattr(binding, "_cuda_runtime", CudaRuntimeStandIn)
    array = binding.pinned_host_array((4, 2, 3), np.dtype(np.uint8), device_id=1)
    address = array.ctypes.data
    assert calls == [("set_device", 1), ("alloc", 24)]  # on the session's GPU, not the thread's GPU 0
    assert array.shape == (4, 2, 3) and array.dtype == np.uint8 and address in blocks
    array[:] = 5
    assert ctypes.string_at(address, 24) == b"\x05" * 24  # the array is that memory, not a copy
    rows = array[:2]
    del array
    gc.collect()
    assert calls[2:] == []  # a view still holds it
    del rows
    gc.collect()
    assert calls[2:] == [("free", address)]


def test_the_cuda_runtimes_functions_are_declared(monkeypatch: pytest.MonkeyPatch) -> None:
    """ctypes would pass the size as a C int without argtypes; each function's types are set on the library."""
    library = types.SimpleNamespace(
        cudaSetDevice=types.SimpleNamespace(),
        cudaHostAlloc=types.SimpleNamespace(),
        cudaFreeHost=types.SimpleNamespace(),
    )
    monkeypatch.setattr(binding.ctypes, "CDLL", lambda name: library)
    cudart = binding._cuda_runtime()
    assert cudart.cudaSetDevice.argtypes == [ctypes.c_int]
    assert cudart.cudaHostAlloc.argtypes == [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t, ctypes.c_uint]
    assert cudart.cudaFreeHost.argtypes == [ctypes.c_void_p]
    assert {f.restype for f in vars(library).values()} == {ctypes.c_int}


def test_a_failed_pinned_allocation_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    class OutOfMemory:
        def cudaSetDevice(self, device: int) -> int:
            return 0

        def cudaHostAlloc(self, out: Any, size: ctypes.c_size_t, flags: int) -> int:
            return 2  # cudaErrorMemoryAllocation

    monkeypatch.setattr(binding, "_cuda_runtime", OutOfMemory)
    with pytest.raises(MemoryError, match="cudaHostAlloc of 6 bytes failed"):
        binding.pinned_host_array((2, 3), np.dtype(np.uint8))


def test_a_device_that_cannot_be_set_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    class NoSuchDevice:
        def cudaSetDevice(self, device: int) -> int:
            return 101  # cudaErrorInvalidDevice

    monkeypatch.setattr(binding, "_cuda_runtime", NoSuchDevice)
    with pytest.raises(RuntimeError, match=r"cudaSetDevice\(3\) failed \(cudaError 101\)"):
        binding.pinned_host_array((2, 3), np.dtype(np.uint8), device_id=3)


def test_the_runner_refuses_nothing_it_cannot_bind(engines: tuple[OrtEngine, OrtEngine]) -> None:
    """A batch of another dtype goes to session.run, whose own check names the problem."""
    _, bound = engines
    assert isinstance(bound.bound, BoundRunner)
    with pytest.raises(Exception, match=r"(?i)type"):
        bound.logits(np.zeros(bound.spec.batch_shape(1), dtype=np.float32))
