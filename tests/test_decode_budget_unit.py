"""app.imaging.decode_budget.DecodeBudget, and the Preprocessor's use of it: pure asyncio, no Ray, no sleeps.

Ordering is forced with asyncio events and queues (threading events for worker threads); the only
clock is in the deadline tests, whose subject is a deadline."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
import pytest

import app.serve.preprocessor as preprocessor_module
from app.config import Limits
from app.errors import ServiceError
from app.imaging.decode_budget import DecodeBudget, slots_for
from app.imaging.decode_cost import estimate_decode_bytes
from tests.conftest import BlockingDecode
from tests.hostile import cv_encode, pattern_image, png_16bit_rgba_bomb, tiff_from_array


def run(main: Callable[[], Awaitable[Any]]) -> Any:
    return asyncio.run(main())  # type: ignore[arg-type]


async def _holder(
    budget: DecodeBudget, nbytes: int, started: asyncio.Event, held: asyncio.Event, go: asyncio.Event
) -> None:
    started.set()
    async with budget.reserve(nbytes):
        held.set()
        await go.wait()


def test_slots_follow_the_cpus() -> None:
    assert [slots_for(c) for c in (0.05, 0.25, 1.0, 1.5, 2.0, 3.999999999999, 8)] == [1, 1, 1, 1, 2, 4, 8]
    with pytest.raises(ValueError):
        DecodeBudget(0, 1)
    with pytest.raises(ValueError):
        DecodeBudget(100, 0)


def test_refuses_a_reservation_larger_than_the_ceiling_at_once() -> None:
    async def main() -> None:
        budget = DecodeBudget(100, 2)
        with pytest.raises(ServiceError) as info:
            async with budget.reserve(101):
                raise AssertionError("must not be entered")
        assert info.value.code == "decode_budget_exceeded" and info.value.status == 413
        assert (budget.in_flight, budget.in_flight_bytes, budget.waiting) == (0, 0, 0)
        async with budget.reserve(100):  # the whole ceiling is fine
            assert budget.in_flight_bytes == 100

    run(main)


def test_waits_while_the_bytes_would_exceed_the_ceiling() -> None:
    async def main() -> None:
        budget = DecodeBudget(100, 8)
        a_started, a_held, a_go = asyncio.Event(), asyncio.Event(), asyncio.Event()
        b_started, b_held, b_go = asyncio.Event(), asyncio.Event(), asyncio.Event()
        a = asyncio.create_task(_holder(budget, 60, a_started, a_held, a_go))
        await a_held.wait()
        b = asyncio.create_task(_holder(budget, 50, b_started, b_held, b_go))
        await b_started.wait()  # b ran up to its wait: it is queued behind a's 60 bytes
        assert budget.waiting == 1 and not b_held.is_set() and budget.in_flight_bytes == 60
        a_go.set()
        await b_held.wait()
        assert budget.in_flight_bytes == 50 and budget.waiting == 0
        b_go.set()
        await asyncio.gather(a, b)
        assert (budget.in_flight, budget.in_flight_bytes) == (0, 0)

    run(main)


def test_waits_for_a_free_slot() -> None:
    async def main() -> None:
        budget = DecodeBudget(1000, 2)
        events = [(asyncio.Event(), asyncio.Event(), asyncio.Event()) for _ in range(3)]
        tasks = [asyncio.create_task(_holder(budget, 1, *e)) for e in events[:2]]
        await events[0][1].wait()
        await events[1][1].wait()
        tasks.append(asyncio.create_task(_holder(budget, 1, *events[2])))
        await events[2][0].wait()
        assert budget.in_flight == 2 and budget.waiting == 1 and not events[2][1].is_set()
        events[1][2].set()  # the second finishes: the third gets its slot
        await events[2][1].wait()
        events[0][2].set()
        events[2][2].set()
        await asyncio.gather(*tasks)
        assert budget.peak_count == 2

    run(main)


def test_first_come_first_served() -> None:
    """A large reservation at the head of the queue is not overtaken by small ones arriving later."""

    async def main() -> None:
        budget = DecodeBudget(100, 8)
        first = [asyncio.Event(), asyncio.Event(), asyncio.Event()]
        big = [asyncio.Event(), asyncio.Event(), asyncio.Event()]
        small = [asyncio.Event(), asyncio.Event(), asyncio.Event()]
        t1 = asyncio.create_task(_holder(budget, 30, *first))
        await first[1].wait()
        t2 = asyncio.create_task(_holder(budget, 90, *big))
        await big[0].wait()
        t3 = asyncio.create_task(_holder(budget, 10, *small))  # would fit now, but arrived after the big one
        await small[0].wait()
        assert budget.waiting == 2 and not small[1].is_set()
        first[2].set()
        await big[1].wait()
        await small[1].wait()  # 90 + 10 = 100: both hold now
        big[2].set()
        small[2].set()
        await asyncio.gather(t1, t2, t3)

    run(main)


def test_released_on_exception() -> None:
    async def main() -> None:
        budget = DecodeBudget(100, 1)
        with pytest.raises(RuntimeError):
            async with budget.reserve(70):
                raise RuntimeError("decode failed")
        assert (budget.in_flight, budget.in_flight_bytes) == (0, 0)
        async with budget.reserve(100):
            pass

    run(main)


def test_released_when_the_holder_is_cancelled() -> None:
    async def main() -> None:
        budget = DecodeBudget(100, 1)
        started, held, go = asyncio.Event(), asyncio.Event(), asyncio.Event()
        task = asyncio.create_task(_holder(budget, 80, started, held, go))
        await held.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert (budget.in_flight, budget.in_flight_bytes) == (0, 0)

    run(main)


def test_a_cancelled_waiter_holds_nothing_and_unblocks_those_behind_it() -> None:
    async def main() -> None:
        budget = DecodeBudget(100, 4)
        a = [asyncio.Event(), asyncio.Event(), asyncio.Event()]
        big = [asyncio.Event(), asyncio.Event(), asyncio.Event()]
        small = [asyncio.Event(), asyncio.Event(), asyncio.Event()]
        ta = asyncio.create_task(_holder(budget, 50, *a))
        await a[1].wait()
        tbig = asyncio.create_task(_holder(budget, 80, *big))  # waits: 50 + 80 > 100
        await big[0].wait()
        tsmall = asyncio.create_task(_holder(budget, 20, *small))  # waits behind the big one
        await small[0].wait()
        assert budget.waiting == 2
        tbig.cancel()  # the head of the queue gives up: the small one behind it fits now
        with pytest.raises(asyncio.CancelledError):
            await tbig
        await small[1].wait()
        assert budget.in_flight_bytes == 70 and budget.waiting == 0
        a[2].set()
        small[2].set()
        await asyncio.gather(ta, tsmall)
        assert (budget.in_flight, budget.in_flight_bytes) == (0, 0)

    run(main)


def test_a_wait_with_a_timeout_gives_up_holding_nothing() -> None:
    async def main() -> None:
        budget = DecodeBudget(100, 1)
        held = await budget.acquire(10)
        with pytest.raises(TimeoutError):
            await budget.acquire(10, timeout=0)
        assert budget.in_flight == 1 and budget.waiting == 0
        budget.release(held)
        assert await budget.acquire(100, timeout=0) == 100
        budget.release(100)
        assert (budget.in_flight, budget.in_flight_bytes) == (0, 0)

    run(main)


def test_never_exceeds_the_ceiling_with_many_concurrent_reservers() -> None:
    """300 reservers of random sizes, released in random order, a tenth of them cancelled while waiting
    or holding: the bytes held never pass the ceiling, nor the holders the slot count, and all is returned."""
    ceiling, slots, n = 100, 4, 300
    rng = random.Random(7)

    async def main() -> None:
        budget = DecodeBudget(ceiling, slots)
        announced: asyncio.Queue[tuple[int, asyncio.Event]] = asyncio.Queue()
        violations: list[tuple[int, int]] = []

        async def reserver(i: int, nbytes: int) -> None:
            go = asyncio.Event()
            async with budget.reserve(nbytes):
                if budget.in_flight_bytes > ceiling or budget.in_flight > slots:
                    violations.append((budget.in_flight_bytes, budget.in_flight))
                announced.put_nowait((i, go))
                await go.wait()

        tasks = [asyncio.create_task(reserver(i, rng.randint(0, ceiling))) for i in range(n)]
        doomed = set(rng.sample(range(n), n // 10))
        holding: dict[int, asyncio.Event] = {}
        finished = 0
        while finished < n:
            for i in [i for i in doomed if not tasks[i].done()][:3]:  # cancel a few, waiting or holding
                tasks[i].cancel()
                doomed.discard(i)
                holding.pop(i, None)
            if not holding:
                pending = [t for t in tasks if not t.done()]
                if not pending:
                    break
                getter = asyncio.ensure_future(announced.get())
                await asyncio.wait([getter, *pending], return_when=asyncio.FIRST_COMPLETED)
                if not getter.done():
                    getter.cancel()
                else:
                    i, go = getter.result()
                    holding[i] = go
            while not announced.empty():
                i, go = announced.get_nowait()
                holding[i] = go
            holding = {i: go for i, go in holding.items() if not tasks[i].done()}
            if holding:
                i = rng.choice(sorted(holding))
                holding.pop(i).set()
            finished = sum(t.done() for t in tasks)
        results = await asyncio.gather(*tasks, return_exceptions=True)
        assert not violations
        assert budget.peak_bytes <= ceiling and budget.peak_count <= slots
        assert budget.peak_count == slots  # the test did exercise concurrency
        assert (budget.in_flight, budget.in_flight_bytes, budget.waiting) == (0, 0, 0)
        assert sum(isinstance(r, asyncio.CancelledError) for r in results) >= 1

    run(main)


def test_run_holds_the_reservation_until_the_thread_finishes_even_if_cancelled() -> None:
    """Cancelling the request does not stop its decoding thread: its memory stays reserved until the thread ends."""

    async def main() -> None:
        budget = DecodeBudget(100, 2)
        in_thread, release = threading.Event(), threading.Event()

        def decode() -> str:
            in_thread.set()
            release.wait(30)
            return "pixels"

        task = asyncio.create_task(budget.run(70, decode))
        await asyncio.get_running_loop().run_in_executor(None, in_thread.wait, 30)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert budget.in_flight_bytes == 70  # the thread still runs
        with pytest.raises(TimeoutError):
            await budget.acquire(100, timeout=0)
        release.set()
        held = await budget.acquire(100)  # granted only once the thread has finished and released its 70
        budget.release(held)
        assert await budget.run(100, lambda: "done") == "done"
        assert (budget.in_flight, budget.in_flight_bytes) == (0, 0)

    run(main)


def test_run_releases_when_the_work_fails() -> None:
    async def main() -> None:
        budget = DecodeBudget(100, 1)

        def fails() -> None:
            raise ValueError("bad bytes")

        with pytest.raises(ValueError):
            await budget.run(100, fails)
        assert (budget.in_flight, budget.in_flight_bytes) == (0, 0)

    run(main)


# --------------------------------------------------------------------------- the Preprocessor's use of it

Preprocessor = preprocessor_module.Preprocessor.func_or_class  # the class behind the Serve deployment


def _jpeg() -> bytes:
    return cv_encode(".jpg", pattern_image(64, 96))


def test_preprocessor_takes_the_limits() -> None:
    p = Preprocessor(Limits(max_decode_bytes=1 << 20, preprocessor_memory_bytes=3 << 20).model_dump())
    assert (p.max_decode_bytes, p.budget.max_bytes, p.slots, p.budget.max_concurrent) == (1 << 20, 3 << 20, 1, 1)


def test_many_with_the_old_two_arguments() -> None:
    p = Preprocessor(Limits().model_dump())
    planar = tiff_from_array(pattern_image(20, 30).astype(np.uint16), planar=2)
    images = [_jpeg(), png_16bit_rgba_bomb(), b"", planar, _jpeg()]
    pixels = run(lambda: p.many(images, 32))
    assert pixels.array.shape == (2, 32, 32, 3) and pixels.positions == [0, 4]
    assert {i: e.code for i, e in pixels.errors.items()} == {
        1: "decode_budget_exceeded",
        2: "empty_body",
        3: "unsupported_image",
    }
    assert p.budget.peak_bytes <= estimate_decode_bytes(_jpeg(), 32)  # refusals reserved nothing
    assert (p.budget.in_flight, p.budget.in_flight_bytes) == (0, 0)


def test_work_past_its_deadline_is_not_started(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_decoding(*args: object) -> None:
        raise AssertionError("must not be started")

    monkeypatch.setattr(preprocessor_module, "preprocess", no_decoding)
    p = Preprocessor(Limits().model_dump())
    with pytest.raises(ServiceError) as info:
        run(lambda: p.many([_jpeg()], 32, deadline_s=time.time() - 0.001))
    assert info.value.code == "inference_timeout" and info.value.status == 503


def test_a_deadline_reached_while_waiting_for_a_slot(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_decoding(*args: object) -> None:
        raise AssertionError("must not be started")

    monkeypatch.setattr(preprocessor_module, "preprocess", no_decoding)
    p = Preprocessor(Limits().model_dump())

    async def main() -> None:
        held = await p.budget.acquire(0)  # the replica's only slot is busy
        try:
            with pytest.raises(ServiceError) as info:
                await p.many([_jpeg()], 32, deadline_s=time.time() + 0.05)
            assert info.value.code == "inference_timeout"
            assert p.budget.waiting == 0
        finally:
            p.budget.release(held)

    run(main)


def test_a_cancelled_request_stops_at_the_next_image(monkeypatch: pytest.MonkeyPatch) -> None:
    slow = BlockingDecode()
    monkeypatch.setattr(preprocessor_module, "preprocess", slow)
    p = Preprocessor(Limits().model_dump())

    async def main() -> None:
        task = asyncio.create_task(p.many([_jpeg(), _jpeg(), _jpeg()], 32))
        await asyncio.get_running_loop().run_in_executor(None, slow.started.wait, 30)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert p.budget.in_flight == 1  # the first image's thread is still decoding
        slow.release.set()
        held = await p.budget.acquire(p.budget.max_bytes)  # only once that thread has finished
        p.budget.release(held)

    run(main)
    assert len(slow.calls) == 1  # the second and third images were never started


def test_the_preprocessor_reads_each_header_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The header checked before the decode's cost is reserved is the one the decode uses: one probe an image."""
    import app.imaging.preprocess as preprocess_module

    probed: list[int] = []
    real = preprocess_module.probe_dimensions

    def counting(data: bytes) -> Any:
        probed.append(len(data))
        return real(data)

    monkeypatch.setattr(preprocess_module, "probe_dimensions", counting)
    p = Preprocessor(Limits().model_dump())
    out = asyncio.run(p.many([_jpeg(), b"not an image", _jpeg()], 32))
    assert out.positions == [0, 2] and list(out.errors) == [1]
    assert len(probed) == 3  # each image once: the refused one, and the two decoded
