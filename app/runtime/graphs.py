"""CUDA graphs on ONNX Runtime's GPU providers: one captured graph per small batch-size bucket, replayed on
device-resident buffers, used for a batch size only where it measured faster than a plain run.

Why: EfficientNet-Lite0 at batch 1 is ~100 small kernels, and launching them costs more than running them. On an
H200 a replay served batch 1 in 0.53 ms against 1.78 ms for a plain run of the same session options, the copies in
and out included; from batch 16 up the plain run was as fast or faster (benchmarks/results/2026-12-04-195603-vm-gpu,
docs/engines.md "CUDA graphs"). So the buckets are the small batches, 1, 2, 4 and 8 by default.

What ONNX Runtime's sources say (core/providers/cuda/cuda_execution_provider.{h,cc}, cuda_graph.{h,cc},
session/inference_session.cc; the CUDA EP docs, "Using CUDA Graphs"), what the H200 showed, and what this module
does about each:
- The CUDA EP keeps its graphs in a per-thread context of the session: a graph captured on one thread is unknown to
  another, where the same run would capture again. So every slot (one batch in flight) is a thread of its own
  (`executor`, a pool whose threads are bound to the slots one to one) and every capture and replay of a slot's
  graphs runs on its thread. The Classifier runs its batches on that pool, so a replay costs no extra thread hop.
- A replay skips everything but the graph: it reads and writes the device addresses bound at capture. Each bucket
  has an input and an output OrtValue on the device, bound once; a batch is copied into its bucket's input, padded up
  to the bucket, and the bucket's output is read back and cut to the batch.
- One graph per session. Several graphs in one session (`gpu_graph_id`) ran FP32 on the H200 but crashed an FP16
  build's replay with CUDA error 700 (an illegal memory access, which leaves the CUDA context unusable); a session
  of its own per graph is the pattern that ran both FP32 and FP16 correctly there (probe2.log), and the only one
  the TensorRT EP has (`trt_cuda_graph_enable` keeps one graph per session and replays it whatever the input, so a
  graph session is only ever run at its bucket's shape).
- A capture runs in CUDA's global capture mode: any other GPU call of the process during it fails (capture_gate.py).
  Captures happen in `prepare` (the replica's start, before traffic), one at a time, under the process-wide gate.
- Batches no graph serves run on the engine's own plain session (passed in as `plain`), on whatever thread calls:
  ONNX Runtime's everyday path, shared by all slots.

Each graph is checked after its capture: a replay on a fresh input must give the logits the plain session gives. A
slot whose capture or check fails serves without graphs (said in describe() and the log); the replica never fails
for it. Then, per batch size n, the graph of n's bucket is used only if its replay (the copies in and out
included) measured faster than a plain run of n, so no batch size is slower with graphs than without (as far as a
median of five runs tells).
"""

from __future__ import annotations

import functools
import logging
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from app.runtime.capture_gate import GATE, CaptureGate
from app.runtime.spec import ModelLoadError

logger = logging.getLogger("ray.serve")

TIMED_RUNS = 5  # per bucket and per batch size timed when deciding graph or plain (medians)
MIN_RUNS = 3
# A replay's logits against a plain run's on the same input, relative to the largest logit. The plain run is padded to
# 8 rows and cuDNN may pick other algorithms for it (FP16 differs more than FP32 then); a replay that reads stale or
# foreign buffers is off by the logits' own size, far beyond this.
CHECK_RTOL = 1e-2
# What CUDA says when a kernel touched memory it must not: the context is unusable from then on (every later call of
# the process fails), so no fallback to plain runs can serve.
CONTEXT_BROKEN = ("CUDA failure 700", "illegal memory access")


def default_buckets(max_batch: int, candidates: Sequence[int]) -> tuple[int, ...]:
    """The buckets up to `max_batch`: a batch larger than the largest runs plain."""
    return tuple(sorted({b for b in candidates if 0 < b <= max_batch}))


def bucket_for(n: int, buckets: Sequence[int]) -> int | None:
    """The smallest bucket that holds `n` images (None: larger than every bucket)."""
    return next((b for b in sorted(buckets) if b >= n), None)


def ranges(sizes: Sequence[int]) -> str:
    """[1, 2, 3, 5, 8, 9] -> "1-3, 5, 8-9" (for logs and describe())."""
    out: list[str] = []
    for n in sorted(sizes):
        if out and int(out[-1].split("-")[-1]) == n - 1:
            out[-1] = f"{out[-1].split('-')[0]}-{n}"
        else:
            out.append(str(n))
    return ", ".join(out) or "none"


class Session(Protocol):
    """What is used of a graph session (onnxruntime.InferenceSession; tests stand in for a CUDA device with it)."""

    def io_binding(self) -> Any: ...

    def run_with_iobinding(self, binding: Any, run_options: Any = None) -> None: ...


@dataclass(frozen=True)
class GraphIO:
    """The model's one input and its outputs, as a bucket's buffers need them."""

    input_name: str
    sample_shape: tuple[int, ...]
    dtype: np.dtype[Any]
    outputs: tuple[tuple[str, tuple[int, ...], np.dtype[Any]], ...]  # name, one row's shape, dtype


class Device(Protocol):
    """Where a bucket's buffers live: onnxruntime's OrtValue on the GPU (or the CPU, where tests run)."""

    def buffer(self, shape: tuple[int, ...], dtype: np.dtype[Any]) -> Any: ...


Plain = Callable[[np.ndarray, list[str]], list[np.ndarray]]  # the engine's plain session run, no gate taken


@dataclass
class _Bucket:
    size: int
    session: Session
    binding: Any
    x: Any  # device buffer [size, *sample]
    ys: list[Any]  # device buffers [size, *row], one per output
    host: np.ndarray  # staging for the input: rows written to the front, the rest left as they were
    replay_ms: float | None = None


@dataclass
class _Slot:
    index: int
    buckets: dict[int, _Bucket] = field(default_factory=dict)
    off: str = ""  # why this slot serves without graphs ("" while it has them)


class SlotPool(ThreadPoolExecutor):
    """A thread pool whose threads are bound one to one to the runner's slots (a slot is known by the thread it runs
    on: `GraphRunner.slot_here`). Submitting never blocks: a batch waits in the pool's queue for a free thread."""

    def __init__(self, local: threading.local, slots: list[_Slot]) -> None:
        self._unbound = list(reversed(slots))
        self._bind_lock = threading.Lock()
        self._local = local
        super().__init__(len(slots), thread_name_prefix="graph-slot", initializer=self._bind)

    def _bind(self) -> None:
        with self._bind_lock:
            self._local.slot = self._unbound.pop()


class GraphRunner:
    """`run(batch, outputs)`: a replay where `prepare` found one pays, else the plain session."""

    def __init__(
        self,
        make_graph_session: Callable[[], Session],
        plain: Plain,
        io: GraphIO,
        device: Device,
        slots: int,
        buckets: Sequence[int],
        gate: CaptureGate = GATE,
        label: str = "",
    ) -> None:
        self.make_graph_session, self.plain, self.io, self.device, self.gate = (
            make_graph_session,
            plain,
            io,
            device,
            gate,
        )
        self.candidates = tuple(sorted(set(buckets)))
        self.label = label
        self.table: dict[int, int] = {}  # batch size -> bucket (prepare decides)
        self.plain_ms: dict[int, float] = {}
        self.prepared = False
        self.prepare_s = 0.0
        self.local = threading.local()
        self._slots = [_Slot(i) for i in range(max(1, slots))]
        self.executor = SlotPool(self.local, self._slots)

    # -- serving --------------------------------------------------------------------------------

    def slot_here(self) -> _Slot | None:
        """The slot whose thread this is (None: not one of this runner's slot threads)."""
        return getattr(self.local, "slot", None)

    def run(self, batch: np.ndarray, outputs: Sequence[str]) -> list[np.ndarray]:
        """The outputs for `batch`. A replay runs on a slot's own thread: inline on one of them (the Classifier runs its
        batches on `executor`), else handed to the pool and waited for."""
        fits = batch.shape[1:] == self.io.sample_shape and batch.dtype == self.io.dtype
        plain = functools.partial(self.plain, batch, list(outputs))
        return self._dispatch(len(batch), fits, lambda b: fill_from_host(b, batch), outputs, plain)

    def run_device(
        self,
        n: int,
        sample_shape: tuple[int, ...],
        fill: Callable[[Any], None],
        outputs: Sequence[str],
        plain: Callable[[], list[np.ndarray]],
    ) -> list[np.ndarray]:
        """`run` for a batch already on the device (decode_in: gpu, `app.runtime.device_batch`): `fill(x)` copies its
        n rows into a bucket's input buffer x (device to device, landed when it returns) instead of update_inplace;
        `plain()` runs it on the plain session."""
        fits = sample_shape == self.io.sample_shape and self.io.dtype == np.uint8
        return self._dispatch(n, fits, lambda b: fill(b.x), outputs, plain)

    def _dispatch(
        self,
        n: int,
        fits: bool,
        fill: Callable[[_Bucket], None],
        outputs: Sequence[str],
        plain: Callable[[], list[np.ndarray]],
    ) -> list[np.ndarray]:
        """A bucket's graph on this slot's thread (`fill` puts the n rows in its input), or the plain session."""
        bucket = self.table.get(n) if fits else None
        if bucket is None:
            with self.gate.shared():
                return plain()
        slot = self.slot_here()
        if slot is None:
            return self.executor.submit(self._dispatch, n, fits, fill, outputs, plain).result()
        with self.gate.shared():
            if slot.off or bucket not in slot.buckets:
                return plain()
            chosen = slot.buckets[bucket]
            fill(chosen)
            return self._run_bucket(chosen, n, outputs)

    def _replay(self, bucket: _Bucket, batch: np.ndarray, outputs: Sequence[str]) -> list[np.ndarray]:
        fill_from_host(bucket, batch)
        return self._run_bucket(bucket, len(batch), outputs)

    def _run_bucket(self, bucket: _Bucket, n: int, outputs: Sequence[str]) -> list[np.ndarray]:
        bucket.session.run_with_iobinding(bucket.binding)
        names = [name for name, _, _ in self.io.outputs]
        # A copy: the bucket's buffer is written again by the slot's next batch while the caller still reads this.
        return [np.array(bucket.ys[names.index(o)].numpy()[:n]) for o in outputs]

    # -- start ----------------------------------------------------------------------------------

    def prepare(self, max_batch: int) -> None:
        """Once, before traffic: every bucket up to `max_batch` captured and checked on every slot's thread, one capture
        at a time and alone on the GPU of this process (the gate, held alone for the capturing run only, so a live
        reopen holds the old engine's batches back for milliseconds, not for the whole start); then timed and decided
        per batch size. A capture that breaks the CUDA context (error 700) fails the start: nothing serves after it."""
        if self.prepared:
            return
        t0 = time.perf_counter()
        buckets = default_buckets(max_batch, self.candidates)
        # One task per slot thread: the barrier keeps each task on a thread of its own, so every slot's thread runs
        # exactly one, and the lock keeps the slots' captures one after another.
        barrier, lock = threading.Barrier(len(self._slots)), threading.Lock()

        def capture_here() -> None:
            barrier.wait(60)
            with lock:
                slot = self.slot_here()
                assert slot is not None
                self._capture_slot(slot, buckets)

        for f in [self.executor.submit(capture_here) for _ in self._slots]:
            f.result()
        timed = next((s for s in self._slots if not s.off and s.buckets), None)
        if timed is not None:
            try:
                with self.gate.shared():
                    self.table, self.plain_ms = self._on(timed, self._time, timed, max_batch)
            except Exception as e:  # a replay failing after its check: no graphs, said so
                self.table = {}
                for slot in self._slots:
                    turn_off(self.label, slot, f"timing failed: {_first_line(e)}")
                _fail_if_context_broken(e)
        self.prepared = True
        self.prepare_s = time.perf_counter() - t0
        logger.info("%sCUDA graphs: %s", f"{self.label}: " if self.label else "", self.summary())

    def _on(self, slot: _Slot, fn: Callable[..., Any], *args: Any) -> Any:
        """`fn(*args)` on `slot`'s own thread (prepare runs before traffic: no other task is on the pool)."""
        barrier = threading.Barrier(len(self._slots))
        result: dict[str, Any] = {}

        def task() -> None:
            barrier.wait(60)
            if self.slot_here() is slot:
                result["value"] = fn(*args)

        for f in [self.executor.submit(task) for _ in self._slots]:
            f.result()
        return result["value"]

    def _capture_slot(self, slot: _Slot, buckets: Sequence[int]) -> None:
        """On the slot's thread: each bucket captured and checked; any failure turns the slot's graphs off (and one
        that broke the CUDA context fails the start)."""
        try:
            for size in buckets:
                slot.buckets[size] = self._capture(size)
        except Exception as e:  # ORT's Fail/RuntimeError from CUDA, a failed check: serve plain, say why
            turn_off(self.label, slot, f"capture failed: {_first_line(e)}")
            _fail_if_context_broken(e)

    def _capture(self, size: int) -> _Bucket:
        session = self.make_graph_session()
        x = self.device.buffer((size, *self.io.sample_shape), self.io.dtype)
        ys = [self.device.buffer((size, *row), dtype) for _, row, dtype in self.io.outputs]
        binding = session.io_binding()
        binding.bind_ortvalue_input(self.io.input_name, x)
        for (name, _, _), y in zip(self.io.outputs, ys, strict=True):
            binding.bind_ortvalue_output(name, y)
        bucket = _Bucket(size, session, binding, x, ys, random_batch(self.io, size))
        with self.gate.shared():
            x.update_inplace(bucket.host)
        # ORT runs regularly (the arena grows to this shape) until the graph may be captured, captures it and replays
        # it once, all in this call (InferenceSession::Run, "Start another run for ... graph capture"): alone.
        with self.gate.exclusive():
            session.run_with_iobinding(binding)
        with self.gate.shared():
            self._check(bucket)
        return bucket

    def _check(self, bucket: _Bucket) -> None:
        """A replay on a fresh input gives what the plain session gives, or the capture did not take."""
        fresh = random_batch(self.io, bucket.size, seed=bucket.size + 7)
        name = self.io.outputs[0][0]
        got = self._replay(bucket, fresh, [name])[0]
        want = self.plain(fresh, [name])[0]
        gap = float(np.max(np.abs(got.astype(np.float64) - want)))
        if not np.isfinite(gap) or gap > CHECK_RTOL * max(1.0, float(np.max(np.abs(want)))):
            raise RuntimeError(f"the graph of bucket {bucket.size} replays wrong logits (max gap {gap:.3g})")

    def _time(self, slot: _Slot, max_batch: int) -> tuple[dict[int, int], dict[int, float]]:
        """On the slot's thread: batch size -> bucket for the sizes whose bucket's replay measured faster than a plain
        run of them, and the plain runs' median ms. A plain run costs more the more images it has, so within a
        bucket's range the graph wins from some size up: found by bisection (a few timings per bucket, not one
        per size; on a CPU dry run every timing costs a fraction of a second)."""
        name = self.io.outputs[0][0]
        table: dict[int, int] = {}
        plain_ms: dict[int, float] = {}

        def plain(n: int) -> float:
            if n not in plain_ms:
                plain_ms[n] = _median_ms(functools.partial(self.plain, random_batch(self.io, n), [name]))
            return plain_ms[n]

        lower = 1
        for size, bucket in sorted(slot.buckets.items()):
            replay = functools.partial(self._replay, bucket, random_batch(self.io, size), [name])
            bucket.replay_ms = graph = _median_ms(replay)
            lo, hi = lower, min(size, max_batch)  # the sizes this bucket serves: is the graph faster from lo? ...
            first = hi + 1  # the smallest size it wins at (hi + 1: none)
            while lo <= hi:
                mid = (lo + hi) // 2
                if graph < plain(mid):
                    first, hi = mid, mid - 1
                else:
                    lo = mid + 1
            table |= {n: size for n in range(first, min(size, max_batch) + 1)}
            lower = size + 1
        return table, plain_ms

    # -- reporting ------------------------------------------------------------------------------

    @property
    def active(self) -> bool:
        return any(not s.off and s.buckets for s in self._slots) and bool(self.table)

    def summary(self) -> str:
        off = [f"slot {s.index}: {s.off}" for s in self._slots if s.off]
        if not self.active:
            return "none in use" + (f" ({'; '.join(off)})" if off else "")
        served = ranges(list(self.table))
        return f"batch sizes {served} replay graphs of buckets {sorted(set(self.table.values()))}" + (
            f"; {'; '.join(off)}" if off else ""
        )

    def describe(self) -> dict[str, Any]:
        buckets = sorted({b for s in self._slots for b in s.buckets})
        first = next((s for s in self._slots if s.buckets), None)
        return {
            "enabled": True,
            "active": self.active,
            "slots": len(self._slots),
            "buckets_captured": buckets,
            "graph_batch_sizes": ranges(list(self.table)),
            "replay_ms": {str(b): round(first.buckets[b].replay_ms or 0.0, 3) for b in buckets} if first else {},
            "plain_ms": {str(n): round(ms, 3) for n, ms in sorted(self.plain_ms.items())},
            "slots_without_graphs": {str(s.index): s.off for s in self._slots if s.off},
            "prepared": self.prepared,
            "prepare_s": round(self.prepare_s, 2),
        }

    def close(self) -> None:
        self.executor.shutdown(wait=False)
        for slot in self._slots:
            slot.buckets = {}


def turn_off(label: str, slot: _Slot, why: str) -> None:
    """The slot serves without graphs from here on, on the plain session; its graph sessions go (after a failed
    capture their stream and per-thread state are not to be trusted)."""
    slot.off, slot.buckets = why, {}
    logger.warning("%sCUDA graphs off on slot %d: %s", f"{label}: " if label else "", slot.index, why)


def fill_from_host(bucket: _Bucket, batch: np.ndarray) -> None:
    """A host batch into a bucket's device input (update_inplace: copied, then the default stream synchronised)."""
    bucket.host[: len(batch)] = batch
    bucket.x.update_inplace(bucket.host)


def random_batch(io: GraphIO, n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed + n)
    shape = (n, *io.sample_shape)
    if np.issubdtype(io.dtype, np.integer):
        return rng.integers(0, 256, shape).astype(io.dtype)
    return rng.standard_normal(shape).astype(io.dtype)


def _first_line(e: Exception) -> str:
    return f"{type(e).__name__}: {str(e).strip().splitlines()[0][:300] if str(e).strip() else ''}"


def context_broken(e: BaseException) -> bool:
    """Whether `e` says this process's CUDA context is broken (nothing on the GPU can run in it any more)."""
    return any(sign in str(e) for sign in CONTEXT_BROKEN)


def _fail_if_context_broken(e: Exception) -> None:
    if context_broken(e):
        raise ModelLoadError(
            f"CUDA graphs: a capture or replay broke this process's CUDA context ({_first_line(e)}); nothing can serve "
            "on it: set args.cuda_graphs.enabled: false and report it (docs/engines.md, CUDA graphs)"
        ) from e


def _median_ms(call: Callable[[], object], runs: int = TIMED_RUNS, budget_s: float = 0.3) -> float:
    """The median of `runs` timed calls after an untimed one (the first after a capture or a new shape allocates);
    fewer, at least MIN_RUNS, when they take longer than `budget_s` together (a CPU dry run)."""
    call()
    times: list[float] = []
    while len(times) < MIN_RUNS or (len(times) < runs and sum(times) < budget_s):
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1000
