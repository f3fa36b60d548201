"""`decode_in: gpu`'s device mode without a GPU: one engine batch of pixels in one buffer (app/runtime/device_batch.py),
written in place by the transform graph and read in place by ONNX Runtime, through ORT's real IOBinding API on the
"cpu" kind with the host stand-in decoder. Pure: no Ray. The "cuda" kind (CudaCopier, the transform's and the engine's
bindings on "cuda") is not run here: CudaCopier's calls are checked against a fake CUDA runtime."""

from __future__ import annotations

import ctypes
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from app.errors import ServiceError
from app.imaging.gpu_decode import BatchDecode, Decoded
from app.imaging.opencv import cv2
from app.imaging.standin_decoder import HostJpegDecoder
from app.imaging.transform import Transform
from app.runtime.cuda_transform import CudaImageTransform
from app.runtime.device_batch import (
    CUDA_MEMCPY_DEVICE_TO_DEVICE,
    CUDA_MEMCPY_HOST_TO_DEVICE,
    CudaCopier,
    DeviceBatch,
    DevicePool,
    HostCopier,
)
from app.runtime.gpu_pixels import DeviceRows, GpuPixels
from app.runtime.ort_engine import OrtEngine
from app.runtime.plan import GraphOptions, RuntimeOptions, cpu_choice
from app.runtime.transform_graph import GraphTransform
from app.serve.batch_decoder import BatchDecoder, Item, warm_jpegs
from app.serve.device_mode import DeviceModeOff, OnDevice, check_device_mode, engine_logits, open_device_batches
from app.served_model import ModelFiles
from app.toolchain.samples import sample_bytes
from tests.hostile import cv_encode, jpeg_with_size, pattern_image

T = Transform(224, 224, resize_shorter=256)
SENTINEL = 0xA5
PHOTO = sample_bytes("coffee")  # a PNG: the CPU path's
JPEG = cv_encode(".jpg", pattern_image(300, 400), [cv2.IMWRITE_JPEG_QUALITY, 95])
JPEG_B = cv_encode(".jpg", pattern_image(480, 640, seed=1), [cv2.IMWRITE_JPEG_QUALITY, 95])  # its transform fails
JPEG_C = cv_encode(".jpg", pattern_image(320, 200, seed=2), [cv2.IMWRITE_JPEG_QUALITY, 95])  # and then its CPU decode
BROKEN = JPEG[: len(JPEG) // 2]
BOMB = jpeg_with_size(60_000, 60_000)


def cpu_batch(capacity: int) -> DeviceBatch:
    batch = DeviceBatch(capacity, T.shape, "cpu", 0, HostCopier())
    batch.value.numpy()[:] = SENTINEL  # a "cpu" OrtValue's numpy() is a view of its buffer
    return batch


def rgb(height: int, width: int, seed: int) -> np.ndarray:
    return np.ascontiguousarray(pattern_image(height, width, seed)[..., ::-1])


# -------------------------------------------------------------------------------- the transform writes in place


def test_the_transform_graph_writes_each_row_in_place_as_it_returns_pixels_today() -> None:
    graph = GraphTransform(T)
    images = [rgb(300, 400, 0), rgb(480, 640, 1), rgb(224, 224, 2)]
    batch = cpu_batch(5)
    for i, image in enumerate(images, start=1):
        graph.into(image, batch.row_ptr(i))
    rows = batch.host(5)
    for i, image in enumerate(images, start=1):
        np.testing.assert_array_equal(rows[i], graph(image)[0])
    assert (rows[0] == SENTINEL).all() and (rows[4] == SENTINEL).all()  # the rows either side are untouched


def test_a_row_written_alone_leaves_its_neighbours_untouched() -> None:
    graph = GraphTransform(T)
    batch = cpu_batch(4)
    graph.into(rgb(300, 400, 0), batch.row_ptr(2))
    rows = batch.host(4)
    assert (rows[1] == SENTINEL).all() and (rows[3] == SENTINEL).all() and (rows[0] == SENTINEL).all()
    np.testing.assert_array_equal(rows[2], graph(rgb(300, 400, 0))[0])
    with pytest.raises(IndexError):
        batch.row_ptr(4)


def test_an_upload_lands_in_its_row_only() -> None:
    batch = cpu_batch(3)
    pixels = np.random.default_rng(0).integers(0, 256, T.shape).astype(np.uint8)
    batch.upload(1, pixels)
    rows = batch.host(3)
    np.testing.assert_array_equal(rows[1], pixels)
    assert (rows[0] == SENTINEL).all() and (rows[2] == SENTINEL).all()
    with pytest.raises(ValueError, match="uint8"):
        batch.upload(0, pixels.astype(np.float32))


# -------------------------------------------------------------------------------- GpuPixels: device mode = host mode


class FlakyTransform:
    """The transform graph, except for images 480 or 320 rows high (JPEG_B, JPEG_C): a failing GPU transform."""

    def __init__(self) -> None:
        self.graph = GraphTransform(T)

    def _check(self, image: np.ndarray) -> None:
        if image.shape[0] in (480, 320):
            raise RuntimeError("CUDA failure 2: out of memory")

    def __call__(self, image: np.ndarray, /) -> np.ndarray:
        self._check(image)
        return self.graph(image)

    def into(self, image: np.ndarray, ptr: int, /) -> None:
        self._check(image)
        self.graph.into(image, ptr)


class CpuFailsOnC(BatchDecode[Any]):
    """The CPU path fails JPEG_C (as a JPEG the device decoded but the CPU path refuses would)."""

    def cpu(self, data: bytes) -> Decoded[Any]:
        if data == JPEG_C:
            return Decoded("failed", error=ServiceError("undecodable_image", "stand-in: the CPU path failed"))
        return super().cpu(data)


def gpu_pixels() -> GpuPixels:
    return GpuPixels(CpuFailsOnC(HostJpegDecoder(), T, executor=ThreadPoolExecutor(2)), FlakyTransform())


REQUESTS = [[JPEG, BROKEN, PHOTO], [BOMB], [JPEG_B, JPEG_C, JPEG]]


@pytest.fixture(scope="module")
def engine(model_files: ModelFiles) -> OrtEngine:
    return OrtEngine(str(model_files.fp32), RuntimeOptions(prefer_gpu=False), cpu_choice())


def test_a_mixed_batch_through_the_device_mode_gives_the_host_modes_rows_errors_and_logits(engine: OrtEngine) -> None:
    host, host_counts = gpu_pixels()(REQUESTS)
    batch = cpu_batch(8)
    device, device_counts = gpu_pixels().into(REQUESTS, batch)

    assert device_counts == host_counts
    assert host_counts["transform_fallback"] == 2 and host_counts["failed"] == 3  # BROKEN, BOMB, JPEG_C
    # rows in batch order for every image the decode did not refuse; JPEG_C's is a hole (its CPU decode failed)
    assert [d.rows for d in device] == [[0, 1], [], [2, 4]] and batch.used == 5  # row 3: JPEG_C
    pixels = batch.host(batch.used)
    for h, d in zip(host, device, strict=True):
        assert isinstance(d, DeviceRows)
        assert d.positions == h.positions and d.preprocess_ms > 0
        assert {i: (e.code, e.status) for i, e in d.errors.items()} == {
            i: (e.code, e.status) for i, e in h.errors.items()
        }
        np.testing.assert_array_equal(pixels[d.rows], h.array)
    assert set(device[2].errors) == {1} and device[2].positions == [0, 2]

    want = engine.logits(np.concatenate([h.array for h in host]))
    got = engine.run_device(batch, batch.used)[0]
    assert got.shape == (5, want.shape[1])
    rows = [r for d in device for r in d.rows]
    np.testing.assert_allclose(got[rows], want, rtol=1e-5, atol=1e-4)


def test_the_engines_cuda_graph_path_reads_a_device_batch(model_files: ModelFiles, engine: OrtEngine) -> None:
    """Graphs on the CPU EP (a dry run's): the bucket's input filled from the device batch, not by update_inplace."""
    opts = RuntimeOptions(prefer_gpu=False, streams=1, cuda_graphs=GraphOptions(buckets=(2,), on_cpu=True))
    graphed = OrtEngine(str(model_files.fp32), opts, cpu_choice())
    try:
        graphed.prepare(2)
        assert graphed.graphs is not None
        described = graphed.describe()["cuda_graphs"]
        assert described["buckets_captured"] == [2] and not described["slots_without_graphs"], described
        graphed.graphs.table = {1: 2, 2: 2}  # whatever the timing chose: replay both sizes
        batch = cpu_batch(4)
        for i in range(3):
            batch.upload(i, np.random.default_rng(i).integers(0, 256, T.shape).astype(np.uint8))
        for n in (1, 2, 3):  # 3: no bucket, the plain session by pointer
            assert graphed.executor is not None
            got = graphed.executor.submit(graphed.run_device, batch, n).result()[0]
            np.testing.assert_allclose(got, engine.logits(batch.host(n)), rtol=1e-5, atol=1e-4)
    finally:
        graphed.close()


# -------------------------------------------------------------------------------- the pool


def test_two_batches_at_once_take_different_buffers_and_an_exception_gives_one_back() -> None:
    pool = DevicePool(lambda rows: DeviceBatch(rows, (2, 2, 3), "cpu", 0, HostCopier()), lambda n: n, 4)
    with pool.take(3) as a, pool.take(4) as b:
        assert a is not b and a.capacity == b.capacity == 4
    assert pool.free() == 2 and pool.made == 2
    with pytest.raises(RuntimeError, match="boom"), pool.take(2) as c:
        c.claim()
        raise RuntimeError("boom")
    assert pool.free() == 2 and pool.made == 2
    with pool.take(1) as again:
        assert again.used == 0 and again in (a, b)  # reused, its rows free again
    with pool.take(9) as big:  # a batch larger than the buffers (max_batch_size grew live): a larger one
        assert big.capacity == 9
    assert pool.free() == 1 and pool.made == 3


def test_a_pool_sized_by_the_engines_padding_fits_its_padded_rows() -> None:
    from app.runtime.ort_engine import padded_rows

    pool = DevicePool(
        lambda rows: DeviceBatch(rows, (1, 1, 3), "cpu", 0, HostCopier()), lambda n: padded_rows(n, 64), 5
    )
    with pool.take(2) as batch:
        assert batch.capacity == 8  # 5 images padded to 8 on a GPU session
    ran: list[str] = []

    def take_and_hold() -> None:
        with pool.take(1):
            ran.append(threading.current_thread().name)

    workers = [threading.Thread(target=take_and_hold) for _ in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert len(ran) == 4 and pool.made <= 5


# -------------------------------------------------------------------------------- CudaCopier against a fake runtime


class FakeCudart:
    """The two functions CudaCopier calls, recording their arguments; `rc` is what they return."""

    def __init__(self, rc: int = 0) -> None:
        self.rc = rc
        self.calls: list[tuple[str, tuple[Any, ...]]] = []

    def cudaMemcpyAsync(self, *args: Any) -> int:
        self.calls.append(("cudaMemcpyAsync", args))
        return self.rc

    def cudaStreamSynchronize(self, *args: Any) -> int:
        self.calls.append(("cudaStreamSynchronize", args))
        return self.rc


def test_the_cuda_copier_calls_the_runtime_with_its_argument_order_and_kinds() -> None:
    """cudaMemcpyAsync(dst, src, count, kind, stream), cudaStreamSynchronize(stream) (cuda_runtime_api.h)."""
    fake = FakeCudart()
    copier = CudaCopier(0x7F00, cudart=fake)
    copier.h2d(0x1000, 0x2000, 150528)
    copier.d2d(0x3000, 0x1000, 64)
    copier.sync()
    (n1, a1), (n2, a2), (n3, a3) = fake.calls
    assert n1 == n2 == "cudaMemcpyAsync" and n3 == "cudaStreamSynchronize"
    assert [type(a) for a in a1] == [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
    assert [a.value for a in a1] == [0x1000, 0x2000, 150528, CUDA_MEMCPY_HOST_TO_DEVICE, 0x7F00]
    assert [a.value for a in a2] == [0x3000, 0x1000, 64, CUDA_MEMCPY_DEVICE_TO_DEVICE, 0x7F00]
    assert CUDA_MEMCPY_HOST_TO_DEVICE == 1 and CUDA_MEMCPY_DEVICE_TO_DEVICE == 3
    assert [type(a) for a in a3] == [ctypes.c_void_p] and a3[0].value == 0x7F00


def test_a_cuda_error_raises_with_its_code() -> None:
    copier = CudaCopier(0x7F00, cudart=FakeCudart(rc=700))
    with pytest.raises(RuntimeError, match=r"cudaMemcpyAsync failed \(cudaError 700\)"):
        copier.h2d(1, 2, 3)
    with pytest.raises(RuntimeError, match=r"cudaStreamSynchronize failed \(cudaError 700\)"):
        copier.sync()
    with pytest.raises(ValueError, match="own stream"):
        CudaCopier(0, cudart=FakeCudart())


# -------------------------------------------------------------------------------- the replica's choice and check


def standin_pixels() -> GpuPixels:
    return GpuPixels(BatchDecode(HostJpegDecoder(), T), GraphTransform(T))


def test_the_device_mode_is_chosen_for_an_ort_engine_where_the_transform_writes(engine: OrtEngine) -> None:
    pool = open_device_batches(engine, standin_pixels(), "standin", 4)
    check_device_mode(standin_pixels(), engine, pool, warm_jpegs(T, 4))
    with pool.take(1) as batch:
        assert batch.kind == "cpu" and batch.capacity == 4

    host_only_engine = SimpleNamespace(name="openvino", spec=engine.spec, device_input=lambda: None)
    with pytest.raises(DeviceModeOff, match=r"\(openvino\) reads host arrays only"):
        open_device_batches(host_only_engine, standin_pixels(), "standin", 4)  # type: ignore[arg-type]
    on_gpu = SimpleNamespace(device_input=lambda: ("cuda", 0), spec=engine.spec, name="onnxruntime")
    with pytest.raises(DeviceModeOff, match="writes host memory"):
        open_device_batches(on_gpu, standin_pixels(), "standin", 4)  # type: ignore[arg-type]
    with pytest.raises(DeviceModeOff, match="engine reads cpu:0"):
        open_device_batches(engine, standin_pixels(), "nvimgcodec", 4)
    host_only = GpuPixels(BatchDecode(HostJpegDecoder(), T), lambda image: GraphTransform(T)(image))
    with pytest.raises(DeviceModeOff, match="cannot write"):
        open_device_batches(engine, host_only, "standin", 4)


def test_the_start_up_check_catches_rows_read_from_the_wrong_place(engine: OrtEngine) -> None:
    class Shifted:
        """An engine that reads the device batch one row off."""

        spec = engine.spec
        logits = staticmethod(engine.logits)
        device_input = staticmethod(engine.device_input)

        def run_device(self, batch: DeviceBatch, n: int, outputs: list[str]) -> list[np.ndarray]:
            return [np.roll(engine.run_device(batch, n, outputs)[0], 1, axis=0)]

    pool = open_device_batches(engine, standin_pixels(), "standin", 4)
    with pytest.raises(DeviceModeOff, match="differ from the host mode"):
        check_device_mode(standin_pixels(), Shifted(), pool, warm_jpegs(T, 3))
    assert pool.free() == 1  # given back


# -------------------------------------------------------------------------------- the Classifier's batch


def replica_decoder(engine: OrtEngine, decoded: Counter[str]) -> BatchDecoder:
    """A Classifier replica's batch decoder (decode_in: gpu, the stand-in decoder) in the device mode, without Ray."""
    metrics = SimpleNamespace(record_decode=lambda variant, counts: decoded.update(counts))
    decoder = BatchDecoder("fp32", metrics, "standin")  # type: ignore[arg-type]
    decoder.gpu_pixels = gpu_pixels()
    decoder.device_pool = open_device_batches(engine, decoder.gpu_pixels, "standin", 8)
    decoder.device_off = ""
    return decoder


def test_a_classifier_batch_in_the_device_mode_answers_as_in_the_host_mode(engine: OrtEngine) -> None:
    replica = replica_decoder(engine, Counter())
    io = SimpleNamespace(transform=T, checked=lambda array: array)
    pixels = np.random.default_rng(3).integers(0, 256, (2, *T.shape)).astype(np.uint8)

    def items() -> list[Item]:
        return [Item(None, 0.0, [JPEG, BROKEN, PHOTO]), Item(pixels, 0.0), Item(None, 0.0, [JPEG_B, JPEG_C, JPEG])]

    def answers(device: bool) -> list[np.ndarray]:
        pool, replica.device_pool = replica.device_pool, replica.device_pool if device else None
        try:
            its = items()
            with replica.device_batch(its) as batch:
                assert (batch is not None) == device
                decoded = replica.decode_now(its, io, batch)  # type: ignore[arg-type]
                x, picks = replica.engine_input(its, decoded, batch, T.shape)
                assert isinstance(x, OnDevice) == device
                logits = engine_logits(engine, x)
            return [logits[p] for p in picks]
        finally:
            replica.device_pool = pool

    host, device = answers(False), answers(True)
    assert [len(a) for a in device] == [len(a) for a in host] == [2, 2, 2]
    for h, d in zip(host, device, strict=True):
        np.testing.assert_allclose(d, h, rtol=1e-5, atol=1e-4)
    assert replica.device_pool is not None and replica.device_pool.free() == 1
    assert replica.describe()["device_batch"] == {"active": True}  # type: ignore[index]
    replica.device_pool, replica.device_off = None, "the engine (openvino) reads host arrays only"
    assert replica.describe()["device_batch"] == {  # type: ignore[index]
        "active": False,
        "off": "the engine (openvino) reads host arrays only",
    }


def test_the_cuda_transform_binds_its_output_at_the_rows_device_pointer() -> None:
    """CudaImageTransform.into, its ONNX Runtime session stood in for (the CUDA EP cannot load here): the image's
    device pointer in, the row's device pointer out, [1, h, w, C] uint8 on "cuda", nothing copied to the host."""
    calls: list[tuple[Any, ...]] = []

    class Binding:
        def bind_input(self, *args: Any) -> None:
            calls.append(("in", *args))

        def bind_output(self, *args: Any) -> None:
            calls.append(("out", *args))

        def copy_outputs_to_cpu(self) -> None:
            raise AssertionError("the device mode copies nothing to the host")

    class Session:
        def io_binding(self) -> Binding:
            return Binding()

        def run_with_iobinding(self, binding: Binding) -> None:
            calls.append(("run",))

    class Image:
        __cuda_array_interface__ = {"shape": (480, 640, 3), "typestr": "|u1", "data": (0xD000, False)}

    transform = object.__new__(CudaImageTransform)
    transform.device_id = 0
    transform.graph = SimpleNamespace(session=Session(), transform=T)  # type: ignore[assignment]
    transform.into(Image(), 0xE000)
    assert calls == [
        ("in", "image", "cuda", 0, np.uint8, [480, 640, 3], 0xD000),
        ("out", "pixels", "cuda", 0, np.uint8, [1, 224, 224, 3], 0xE000),
        ("run",),
    ]
