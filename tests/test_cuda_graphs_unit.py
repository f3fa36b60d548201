"""CUDA graphs per batch-size bucket (app/runtime/graphs.py) and the gate that keeps captures alone on the GPU
(app/runtime/capture_gate.py). No Ray.

Two kinds of session run the same GraphRunner here:
- ONNX Runtime's real CPU EP, through the real binding API (OrtValue buffers, IOBinding, RunOptions with
  gpu_graph_id): the copies in and out, the padding up to a bucket, the slicing back, the slot threads;
- a stand-in for what cannot exist here, a CUDA device with ONNX Runtime's graph semantics as its sources give them
  (onnxruntime core/providers/cuda/cuda_execution_provider.cc, cuda_graph.cc, session/inference_session.cc): graphs
  kept per thread, two regular runs of a thread before its first capture, `gpu_graph_id` -1 for a plain run, a
  replay that reads and writes the buffers bound at capture, CUDA's global capture mode (another thread's GPU call
  during a capture fails both with error 900), and the TensorRT EP's one graph per session replayed whatever the
  input. A runner that broke any of those rules would fail these tests the way a GPU would fail it.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest

from app.runtime import graphs
from app.runtime.capture_gate import CaptureGate
from app.runtime.graphs import GraphIO, GraphRunner, bucket_for, default_buckets, ranges
from app.runtime.ort_engine import OrtDevice, OrtEngine, graph_io, padded_rows
from app.runtime.plan import GraphOptions, RuntimeOptions, cpu_choice
from app.runtime.spec import ModelLoadError, spec_from_io
from app.served_model import ModelFiles
from tests.conftest import wait_until

CLASSES = 6
SAMPLE = (2, 2, 3)
IO = GraphIO("image", SAMPLE, np.dtype(np.uint8), (("logits", (CLASSES,), np.dtype(np.float32)),))


def model_of(x: np.ndarray) -> np.ndarray:
    """What the stand-in "network" computes: one row of logits per image, different for every image."""
    flat = x.reshape(len(x), -1).astype(np.float32)
    return np.stack([flat.mean(1) + k * flat.std(1) for k in range(CLASSES)], axis=1).astype(np.float32)


# --------------------------------------------------------------------------- the stand-in CUDA device


class Cuda900(RuntimeError):
    def __init__(self) -> None:
        super().__init__("CUDA failure 900: operation not permitted when stream is capturing")


class FakeGpu:
    """One process's CUDA context: which threads are inside a GPU call, and who is capturing (global mode)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.in_call: set[int] = set()
        self.capturing: int | None = None
        self.captures: list[tuple[int, int]] = []  # (session id, thread)
        self.replays: list[tuple[int, int]] = []
        self.errors: list[str] = []
        self.hold: threading.Event | None = None  # set: a call waits on it inside the GPU (a long batch)
        self.held = threading.Event()

    @contextmanager
    def call(self) -> Iterator[None]:
        me = threading.get_ident()
        with self.lock:
            if self.capturing is not None and self.capturing != me:
                self.errors.append("call during another thread's capture")
                raise Cuda900()
            self.in_call.add(me)
        try:
            hold = self.hold
            if hold is not None:
                self.held.set()
                hold.wait(30)
            yield
        finally:
            with self.lock:
                self.in_call.discard(me)

    @contextmanager
    def capture(self) -> Iterator[None]:
        me = threading.get_ident()
        with self.lock:
            if self.in_call - {me} or self.capturing is not None:
                self.errors.append("capture while another thread was inside a GPU call")
                raise Cuda900()
            self.capturing = me
        try:
            yield
        finally:
            with self.lock:
                self.capturing = None

    def plain(self, batch: np.ndarray, outputs: list[str]) -> list[np.ndarray]:
        """The engine's plain session on this device."""
        with self.call():
            return [model_of(batch)]


@dataclass
class FakeValue:
    """An OrtValue on the stand-in device."""

    data: np.ndarray

    def update_inplace(self, array: np.ndarray) -> None:
        assert array.shape == self.data.shape and array.dtype == self.data.dtype, "update_inplace needs the same shape"
        self.data[...] = array

    def numpy(self) -> np.ndarray:
        return self.data.copy()


@dataclass
class FakeBinding:
    inputs: dict[str, FakeValue] = field(default_factory=dict)
    outputs: dict[str, FakeValue] = field(default_factory=dict)

    def bind_ortvalue_input(self, name: str, value: FakeValue) -> None:
        self.inputs[name] = value

    def bind_ortvalue_output(self, name: str, value: FakeValue) -> None:
        self.outputs[name] = value


@dataclass
class Graph:
    thread: int
    x: FakeValue
    ys: dict[str, FakeValue]


class FakeDevice:
    def buffer(self, shape: tuple[int, ...], dtype: np.dtype[Any]) -> FakeValue:
        return FakeValue(np.zeros(shape, dtype))


class FakeGraphSession:
    """A session with CUDA graphs on the stand-in device, by ONNX Runtime's rules: the CUDA EP keeps its graph per
    thread (another thread's run captures again) after two regular runs of that thread, and a replay reads and writes
    the buffers bound at capture whatever is bound now; `tensorrt`: the TensorRT EP's one graph per session, after
    one regular run."""

    ids = iter(range(1, 10_000))

    def __init__(self, gpu: FakeGpu, tensorrt: bool = False, fail_bucket: int | None = None) -> None:
        self.gpu, self.tensorrt, self.fail_bucket = gpu, tensorrt, fail_bucket
        self.id = next(self.ids)
        self.regular: dict[int, int] = {}  # thread -> regular runs
        self.graphs: dict[int, Graph] = {}  # thread (TensorRT: 0) -> its graph
        self.shapes: set[tuple[int, ...]] = set()

    def io_binding(self) -> FakeBinding:
        return FakeBinding()

    def run_with_iobinding(self, binding: FakeBinding, options: Any = None) -> None:
        me = threading.get_ident()
        key = 0 if self.tensorrt else me
        x = binding.inputs["image"]
        self.shapes.add(x.data.shape)
        if key in self.graphs:
            self._replay(self.graphs[key], me)
            return
        if self.regular.get(me, 0) < (1 if self.tensorrt else 2):  # ORT runs regularly until capture is allowed
            with self.gpu.call():
                self.regular[me] = self.regular.get(me, 0) + 1
                binding.outputs["logits"].data[...] = model_of(x.data)
            self.run_with_iobinding(binding, options)
            return
        with self.gpu.capture():
            if self.fail_bucket == len(x.data):
                raise RuntimeError("CUDA failure 901: operation failed due to a previous error during capture")
            self.graphs[key] = Graph(me, x, dict(binding.outputs))
            self.gpu.captures.append((self.id, me))
        self._replay(self.graphs[key], me)

    def _replay(self, g: Graph, me: int) -> None:
        assert self.tensorrt or g.thread == me, "a CUDA EP graph replays only on the thread that captured it"
        with self.gpu.call():
            self.gpu.replays.append((self.id, me))
            g.ys["logits"].data[...] = model_of(g.x.data)  # the buffers bound at capture, whatever is bound now


def fake_runner(
    gpu: FakeGpu, slots: int = 2, buckets: tuple[int, ...] = (1, 2, 4, 8), gate: CaptureGate | None = None, **kw: Any
) -> tuple[GraphRunner, list[FakeGraphSession]]:
    made: list[FakeGraphSession] = []

    def make() -> FakeGraphSession:
        made.append(FakeGraphSession(gpu, **kw))
        return made[-1]

    return GraphRunner(make, gpu.plain, IO, FakeDevice(), slots, buckets, gate=gate or CaptureGate()), made


def images(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (n, *SAMPLE)).astype(np.uint8)


# --------------------------------------------------------------------------- pure parts


def test_buckets_and_ranges() -> None:
    assert default_buckets(6, (1, 2, 4, 8)) == (1, 2, 4)
    assert bucket_for(5, (1, 2, 4, 8)) == 8 and bucket_for(1, (1, 2, 4, 8)) == 1 and bucket_for(9, (1, 8)) is None
    assert ranges([1, 2, 3, 5, 8, 9]) == "1-3, 5, 8-9" and ranges([]) == "none"
    assert [padded_rows(n, 64) for n in (1, 8, 9, 33, 63, 64, 70)] == [8, 8, 16, 40, 64, 64, 70]


def test_the_graph_serves_a_batch_size_only_where_it_measured_faster(monkeypatch: pytest.MonkeyPatch) -> None:
    """Bisection per bucket against a plain cost that grows with the batch: the same table as timing every size."""

    def replay_ms(b: int) -> float:
        return 1.0 + 0.12 * b  # the graph pays for its whole bucket (padding)

    def plain_ms(n: int) -> float:
        return 1.8 + 0.1 * n  # launch overhead, then per image

    def fake_median(call: functools.partial[Any], **_: Any) -> float:
        if getattr(call.func, "__name__", "") == "_replay":
            return replay_ms(call.args[0].size)
        return plain_ms(len(call.args[0]))

    monkeypatch.setattr(graphs, "_median_ms", fake_median)
    buckets = (1, 2, 4, 8, 16, 32, 64)
    runner, _ = fake_runner(FakeGpu(), slots=1, buckets=buckets)
    runner.prepare(64)
    expected = {}
    for n in range(1, 65):
        b = bucket_for(n, buckets)
        if b is not None and replay_ms(b) < plain_ms(n):
            expected[n] = b
    assert runner.table == expected
    assert 1 in runner.table and 33 not in runner.table  # small batches gain, a half-empty 64 loses
    assert len(runner.plain_ms) < 40  # a few timings per bucket, not one per size
    runner.close()


# --------------------------------------------------------------------------- ONNX Runtime's own API, on the CPU EP


@pytest.fixture(scope="module")
def cpu_model(model_files: ModelFiles) -> tuple[Any, Any, GraphIO]:
    def make() -> ort.InferenceSession:
        so = ort.SessionOptions()
        so.intra_op_num_threads = 1
        return ort.InferenceSession(str(model_files.fp32), so, providers=["CPUExecutionProvider"])

    plain_session = make()
    spec = spec_from_io(
        [(i.name, tuple(i.shape), i.type) for i in plain_session.get_inputs()],
        [o.name for o in plain_session.get_outputs()],
    )

    def plain(batch: np.ndarray, outputs: list[str]) -> list[np.ndarray]:
        return plain_session.run(outputs, {"image": batch})

    return make, plain, graph_io(plain_session, spec, np.dtype(np.uint8))


def test_the_real_binding_api_pads_to_the_bucket_and_cuts_back(cpu_model: tuple[Any, Any, GraphIO]) -> None:
    make, plain, io = cpu_model
    runner = GraphRunner(make, plain, io, OrtDevice("cpu"), slots=2, buckets=(1, 2, 4), gate=CaptureGate())
    runner.prepare(4)
    assert runner.describe()["buckets_captured"] == [1, 2, 4] and runner.prepared
    runner.table = {n: b for n in range(1, 5) if (b := bucket_for(n, (1, 2, 4))) is not None}  # every size replayed
    for n in (1, 3, 4, 2, 5):  # 3 padded into 4; 5 is past every bucket: plain
        x = np.random.default_rng(n).integers(0, 256, (n, 224, 224, 3)).astype(np.uint8)
        got = runner.run(x, ["logits"])[0]
        assert got.shape == (n, 1000)
        np.testing.assert_allclose(got, plain(x, ["logits"])[0], rtol=1e-5, atol=1e-4)
    runner.close()


def test_an_ort_engine_asked_for_graphs_serves_through_them(model_files: ModelFiles) -> None:
    """The engine the Classifier opens: graphs on the CPU EP (what a dry run walks), the same logits as plain, and the
    pool the Classifier runs its batches on."""
    opts = RuntimeOptions(prefer_gpu=False, streams=2, cuda_graphs=GraphOptions(buckets=(1, 2), on_cpu=True))
    engine = OrtEngine(str(model_files.fp32), opts, cpu_choice())
    plain = OrtEngine(str(model_files.fp32), RuntimeOptions(prefer_gpu=False), cpu_choice())
    try:
        assert engine.fixed_parallel and not plain.fixed_parallel and plain.executor is None
        engine.prepare(2)
        described = engine.describe()["cuda_graphs"]
        assert described["slots"] == 2 and described["buckets_captured"] == [1, 2] and described["prepared"]
        assert plain.describe()["cuda_graphs"] is None
        for n in (1, 2, 3):
            x = engine.dummy_batch(n)
            np.testing.assert_allclose(engine.logits(x), plain.logits(x), rtol=1e-5, atol=1e-4)
            assert engine.executor is not None
            on_a_slot = engine.executor.submit(engine.logits, x).result()  # as the Classifier runs a batch
            np.testing.assert_allclose(on_a_slot, plain.logits(x), rtol=1e-5, atol=1e-4)
    finally:
        engine.close()
        plain.close()


def test_a_gpu_session_meets_batches_padded_to_a_few_shapes(model_files: ModelFiles) -> None:
    """On a GPU a plain batch is padded to a multiple of 8 rows, and the answer cut back (the GPU itself stood in for
    by the CPU EP: `on_gpu` set by hand)."""
    engine = OrtEngine(str(model_files.fp32), RuntimeOptions(prefer_gpu=False), cpu_choice())
    seen: list[int] = []
    session = engine.session
    assert session is not None

    class Recording:
        def run(self, outputs: Any, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
            seen.append(len(feed["image"]))
            return session.run(outputs, feed)

    x = engine.dummy_batch(3)
    want = engine.logits(x)
    engine.on_gpu, engine.session = True, Recording()  # type: ignore[assignment]
    got = engine.logits(x)
    assert seen == [8] and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
    engine.logits(engine.dummy_batch(64))
    assert seen == [8, 64]


# --------------------------------------------------------------------------- a CUDA device's rules, stood in


def test_each_slot_captures_once_on_its_own_thread_and_replays_there() -> None:
    gpu = FakeGpu()
    runner, made = fake_runner(gpu, slots=2, buckets=(1, 2, 4, 8))
    runner.prepare(8)
    assert len(made) == 2 * 4 and len(gpu.captures) == 2 * 4 and not gpu.errors  # a session per slot and bucket
    assert all(len(s.shapes) == 1 for s in made)  # each graph session sees its bucket's shape only
    runner.table = {n: b for n in range(1, 9) if (b := bucket_for(n, (1, 2, 4, 8))) is not None}
    captured, failures = len(gpu.captures), []

    def client(seed: int) -> None:
        rng = np.random.default_rng(seed)
        for i in range(25):
            x = images(int(rng.integers(1, 11)), int(rng.integers(1 << 30)))
            # half as the Classifier runs batches (on the pool), half from a thread of the caller's own
            got = runner.executor.submit(runner.run, x, ["logits"]).result() if i % 2 else runner.run(x, ["logits"])[0]
            got = got[0] if isinstance(got, list) else got
            if not np.array_equal(got, model_of(x)):
                failures.append(len(x))

    threads = [threading.Thread(target=client, args=(s,)) for s in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not failures and not gpu.errors
    assert len(gpu.captures) == captured  # no run captured again: every replay on its slot's own thread
    assert {thread for _, thread in gpu.replays} == {thread for _, thread in gpu.captures}  # the two slot threads
    runner.close()


def test_a_capture_waits_for_the_runs_in_flight_and_holds_new_ones_back() -> None:
    """One gate per process: a replica's live reopen captures while the old engine still serves."""
    gpu, gate = FakeGpu(), CaptureGate()
    old, _ = fake_runner(gpu, slots=1, buckets=(1,), gate=gate)
    new, _ = fake_runner(gpu, slots=1, buckets=(1, 2), gate=gate)
    gpu.hold = threading.Event()
    serving = threading.Thread(target=old.run, args=(images(3), ["logits"]))
    serving.start()
    assert gpu.held.wait(10)  # a batch of the old engine is inside the GPU
    preparing = threading.Thread(target=new.prepare, args=(2,))
    preparing.start()
    wait_until(lambda: gate.state()["waiting_captures"] == 1, 10, what="the capture waiting at the gate")
    assert gpu.captures == []  # nothing captured while the batch runs
    hold, gpu.hold = gpu.hold, None
    hold.set()
    preparing.join(30)
    serving.join(30)
    assert len(gpu.captures) == 2 and not gpu.errors and new.prepared and not new.describe()["slots_without_graphs"]


def test_without_the_shared_gate_the_same_capture_fails_and_the_slot_serves_plain() -> None:
    """The control: runners on separate gates (as two gates in one process would be) capture into a running batch."""
    gpu = FakeGpu()
    old, _ = fake_runner(gpu, slots=1, buckets=(1,), gate=CaptureGate())
    new, _ = fake_runner(gpu, slots=1, buckets=(1, 2), gate=CaptureGate())
    gpu.hold = threading.Event()
    serving = threading.Thread(target=old.run, args=(images(3), ["logits"]))
    serving.start()
    assert gpu.held.wait(10)
    hold, gpu.hold = gpu.hold, None
    new.prepare(2)
    hold.set()
    serving.join(30)
    assert gpu.errors and not new.active
    assert "900" in new.describe()["slots_without_graphs"]["0"]
    np.testing.assert_array_equal(new.run(images(2), ["logits"])[0], model_of(images(2)))  # still serves, plain


def test_a_failed_capture_leaves_the_slot_serving_plain_and_says_why(caplog: pytest.LogCaptureFixture) -> None:
    gpu = FakeGpu()
    runner, _ = fake_runner(gpu, slots=2, buckets=(1, 2, 4, 8), fail_bucket=4)
    runner.prepare(8)
    described = runner.describe()
    assert not runner.active and set(described["slots_without_graphs"]) == {"0", "1"}
    assert "901" in described["slots_without_graphs"]["0"] and "CUDA graphs off on slot 0" in caplog.text
    replays = len(gpu.replays)
    for n in (1, 4, 9):
        np.testing.assert_array_equal(runner.run(images(n, n), ["logits"])[0], model_of(images(n, n)))
    assert len(gpu.replays) == replays  # the plain session serves: no graph of a failed slot is run again
    runner.close()


def test_a_graph_that_replays_wrong_logits_is_not_served(monkeypatch: pytest.MonkeyPatch) -> None:
    """A replay that reads another buffer than the one the batch was copied into (a capture that did not take)."""

    def stale_replay(self: FakeGraphSession, g: Graph, me: int) -> None:
        with self.gpu.call():
            g.ys["logits"].data[...] = model_of(np.zeros_like(g.x.data))

    monkeypatch.setattr(FakeGraphSession, "_replay", stale_replay)
    runner, _ = fake_runner(FakeGpu(), slots=1, buckets=(1, 2))
    runner.prepare(2)
    assert not runner.active and "replays wrong logits" in runner.describe()["slots_without_graphs"]["0"]
    np.testing.assert_array_equal(runner.run(images(2), ["logits"])[0], model_of(images(2)))
    runner.close()


def test_tensorrt_graphs_replay_whatever_is_bound_so_each_stays_at_its_shape() -> None:
    gpu = FakeGpu()
    runner, made = fake_runner(gpu, slots=2, buckets=(1, 2, 4), tensorrt=True)
    runner.prepare(4)
    assert len(made) == 2 * 3 and len(gpu.captures) == 6 and not gpu.errors  # a session per slot and bucket
    runner.table = {1: 1, 2: 2, 3: 4, 4: 4}
    for n in (1, 2, 3, 4, 5, 7):
        np.testing.assert_array_equal(runner.run(images(n, n), ["logits"])[0], model_of(images(n, n)))
    assert all(len(s.shapes) == 1 for s in made)  # each graph session saw one batch shape only: its bucket's
    runner.close()


# --------------------------------------------------------------------------- the gate


def test_the_gate_lets_runs_share_and_a_waiting_capture_go_first() -> None:
    gate = CaptureGate()
    order: list[str] = []
    inside = threading.Event()
    release = threading.Event()

    def run(name: str) -> None:
        with gate.shared():
            order.append(name)
            inside.set()
            release.wait(10)

    def capture() -> None:
        with gate.exclusive():
            order.append("capture")

    first = threading.Thread(target=run, args=("run1",))
    first.start()
    assert inside.wait(10)
    with gate.shared():  # runs share the gate
        pass
    cap = threading.Thread(target=capture)
    cap.start()
    wait_until(lambda: gate.state()["waiting_captures"] == 1, 10, what="capture waiting")
    second = threading.Thread(target=run, args=("run2",))
    second.start()  # arrives after the capture asked: waits behind it
    wait_until(lambda: second.is_alive(), 5)
    release.set()
    for t in (first, cap, second):
        t.join(10)
    assert order == ["run1", "capture", "run2"]


def test_a_capture_that_breaks_the_cuda_context_fails_the_start() -> None:
    """CUDA error 700 (seen with FP16 graphs sharing a session on an H200) leaves every later call of the process
    failing: no plain fallback can serve, so the start fails and says what to set."""

    class Broken(FakeGraphSession):
        def run_with_iobinding(self, binding: FakeBinding, options: Any = None) -> None:
            raise RuntimeError("Error in execution: CUDA failure 700: an illegal memory access was encountered")

    gpu = FakeGpu()
    runner = GraphRunner(lambda: Broken(gpu), gpu.plain, IO, FakeDevice(), 1, (1, 2), gate=CaptureGate())
    with pytest.raises(ModelLoadError, match=r"cuda_graphs\.enabled: false"):
        runner.prepare(2)
    runner.close()


def test_a_closed_engine_lets_its_batches_in_flight_finish(model_files: ModelFiles) -> None:
    """A live reopen closes the old engine while its batches run: they finish on it, then it is released."""
    engine = OrtEngine(str(model_files.fp32), RuntimeOptions(prefer_gpu=False), cpu_choice())
    inside, release = threading.Event(), threading.Event()
    plain = engine._plain_run

    def slow(batch: np.ndarray, outputs: list[str]) -> list[np.ndarray]:
        inside.set()
        release.wait(30)
        return plain(batch, outputs)

    engine._plain_run = slow  # type: ignore[method-assign]
    result: list[np.ndarray] = []
    running = threading.Thread(target=lambda: result.append(engine.logits(engine.dummy_batch(2))))
    running.start()
    assert inside.wait(30)
    engine.close()
    assert engine.session is not None and not engine.alive  # closing, not yet released
    release.set()
    running.join(30)
    assert result and result[0].shape == (2, 1000) and engine.session is None
    with pytest.raises(ModelLoadError, match="closed"):
        engine.logits(engine.dummy_batch(1))
