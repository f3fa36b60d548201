"""Admission under overload without Ray: slots, the wait queue bounded by the measured rate, count and bytes."""

from __future__ import annotations

import asyncio
import types
from typing import Any

import pytest

from app.config import RouterConfig, validate_serve_config
from app.errors import ServiceError
from app.pipeline import admission
from app.pipeline.admission import QUEUE_FILL, Admission, CompletionRate, Limits
from app.served_model import ModelFiles
from tests.conftest import deployment, local_config
from tests.test_pipeline_unit import no_ray, run, until  # noqa: F401 (no_ray: an autouse fixture)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def finished(n: int, over_s: float) -> CompletionRate:
    """A rate that has seen `n` requests finish, `over_s` seconds ago (a window of `over_s`)."""
    clock = Clock()
    rate = CompletionRate(window_s=over_s, min_samples=1, clock=clock)
    for _ in range(n):
        rate.record()
    clock.now += over_s
    return rate


class Holder:
    """Requests that hold their slot until released, each recording when it got in."""

    def __init__(self, adm: Admission, limits: Limits) -> None:
        self.adm, self.limits = adm, limits
        self.gates: list[asyncio.Event] = []
        self.order: list[int] = []
        self.tasks: list[asyncio.Task[None]] = []

    def start(self, size: int = 0, user: str | None = None) -> asyncio.Task[None]:
        i, gate = len(self.gates), asyncio.Event()
        self.gates.append(gate)

        async def hold() -> None:
            async with self.adm.admitted(self.limits, size, user):
                self.order.append(i)
                await gate.wait()

        task = asyncio.ensure_future(hold())
        self.tasks.append(task)
        return task

    async def release_all(self) -> None:
        for gate in self.gates:
            gate.set()
        await asyncio.gather(*self.tasks)


class Schedule:
    """The admission module's clock and its asyncio.sleep, stood in for: time stands still at `now`, and a paced
    refusal's wait for its turn is recorded by its length and returns at once. The tests check when each refusal
    was scheduled to go (the pacing's decision), not how long a shared machine took to get there."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.now = 100.0
        self.sleeps: list[float] = []
        schedule = self

        class Asyncio:  # the module's asyncio but for sleep
            def __getattr__(self, name: str) -> Any:
                return getattr(asyncio, name)

            @staticmethod
            async def sleep(delay: float) -> None:
                schedule.sleeps.append(delay)
                await asyncio.sleep(0)

        monkeypatch.setattr(admission, "asyncio", Asyncio())
        monkeypatch.setattr(admission, "time", types.SimpleNamespace(monotonic=lambda: self.now))


async def refused(adm: Admission, limits: Limits, size: int = 0, user: str | None = None) -> ServiceError:
    with pytest.raises(ServiceError) as e:
        async with adm.admitted(limits, size, user):
            pass
    assert e.value.code == "overloaded" and e.value.status == 503 and e.value.headers()["Retry-After"]
    return e.value


def test_beyond_the_limit_requests_wait_in_order_and_take_the_slots_that_free() -> None:
    async def go() -> None:
        adm = Admission()
        h = Holder(adm, Limits(in_flight=2, queue_wait_s=5, queued=10, queued_bytes=1 << 20))
        for _ in range(5):
            h.start()
        await until(lambda: adm.in_flight == 2 and adm.queued == 3)
        assert h.order == [0, 1]
        h.gates[1].set()
        await until(lambda: h.order == [0, 1, 2])
        assert adm.in_flight == 2 and adm.queued == 2  # the slot changed hands
        await h.release_all()
        assert h.order == [0, 1, 2, 3, 4] and adm.in_flight == 0 and adm.queued == 0 and adm.refused == 0

    run(go())


def test_with_no_queue_beyond_the_limit_is_refused_at_once() -> None:
    async def go() -> None:
        adm = Admission()
        h = Holder(adm, Limits(in_flight=1))
        h.start()
        await until(lambda: adm.in_flight == 1)
        await refused(adm, Limits(in_flight=1))
        assert adm.refused == 1 and adm.queued == 0
        await h.release_all()

    run(go())


def test_a_wait_longer_than_the_budget_at_the_measured_rate_is_refused_at_once() -> None:
    async def go() -> None:
        adm = Admission(rate=finished(8, over_s=2.0))  # 8 requests finished in the last 2 s: 4/s
        assert adm.rate.per_s() == pytest.approx(4.0)
        limits = Limits(in_flight=1, queue_wait_s=1.0 / QUEUE_FILL, queued=100, queued_bytes=1 << 20)
        h = Holder(adm, limits)
        for _ in range(5):  # 1 in flight; places 1..4 expect 0.25 .. 1.0 s, within QUEUE_FILL of the budget
            h.start()
        await until(lambda: adm.queued == 4)
        err = await refused(adm, limits)  # the 5th place would wait 1.25 s
        assert "4/s" in err.message and adm.queued == 4
        await h.release_all()

    run(go())


def test_the_queue_is_bounded_in_count_and_in_body_bytes() -> None:
    async def go() -> None:
        adm = Admission()
        limits = Limits(in_flight=1, queue_wait_s=5, queued=2, queued_bytes=1000)
        h = Holder(adm, limits)
        h.start()
        h.start(size=600)
        await until(lambda: adm.queued == 1)
        await refused(adm, limits, size=600)  # 1200 bytes would wait
        h.start(size=400)
        await until(lambda: adm.queued == 2)
        await refused(adm, limits, size=0)  # two waiting already
        await h.release_all()
        assert adm.refused == 2 and adm.in_flight == 0

    run(go())


def test_a_waiter_whose_slot_never_comes_is_refused_when_its_wait_runs_out() -> None:
    async def go() -> None:
        adm = Admission()
        limits = Limits(in_flight=1, queue_wait_s=0.05, queued=5, queued_bytes=1 << 20)
        h = Holder(adm, limits)
        h.start()
        await until(lambda: adm.in_flight == 1)
        err = await refused(adm, limits)
        assert "within 0.05 s" in err.message and adm.queued == 0 and adm.in_flight == 1
        await h.release_all()
        assert adm.in_flight == 0

    run(go())


def test_a_waiter_whose_client_leaves_gives_up_its_place_and_no_slot_is_lost() -> None:
    async def go() -> None:
        adm = Admission()
        limits = Limits(in_flight=1, queue_wait_s=5, queued=5, queued_bytes=1 << 20)
        h = Holder(adm, limits)
        for _ in range(3):
            h.start(size=10)
        await until(lambda: adm.queued == 2)
        h.tasks[1].cancel()
        await until(lambda: adm.queued == 1)
        assert adm.cancelled == 1
        h.gates[0].set()
        await until(lambda: h.order == [0, 2])
        h.gates[2].set()
        await h.tasks[2]
        assert adm.in_flight == 0 and adm.queued == 0

    run(go())


def test_completion_rate_needs_samples_and_forgets_the_old_ones() -> None:
    clock = Clock()
    rate = CompletionRate(window_s=1.0, min_samples=3, clock=clock)
    rate.record()
    rate.record()
    clock.now += 1.0
    assert rate.per_s() is None  # two samples: not enough to judge
    rate.record()
    assert rate.per_s() == pytest.approx(3.0)  # 3 in the last second
    clock.now += 5
    assert rate.per_s() is None  # all older than the window


def test_the_queue_wait_must_leave_time_for_the_work_and_serve_must_have_room_for_it(tmp_path: Any) -> None:
    with pytest.raises(ValueError, match="below inference_timeout_s"):
        RouterConfig(weights={"fp32": 1}, inference_timeout_s=5, max_queue_wait_s=5)
    assert RouterConfig(weights={"fp32": 1}, inference_timeout_s=3).queue_wait_s == 1.5  # default: half of it
    assert RouterConfig(weights={"fp32": 1}).queued_per_user == 128  # default: a quarter of max_queued
    assert RouterConfig(weights={"fp32": 1}).max_ongoing_needed() == 192 + 2 * 512 + 32  # waiting + pacing
    assert RouterConfig(weights={"fp32": 1}, max_refusals_per_s=0).max_ongoing_needed() == 192 + 512 + 32
    assert RouterConfig(weights={"fp32": 1}, max_queue_wait_s=0).max_ongoing_needed() == 192 + 32
    cfg = local_config(ModelFiles(tmp_path))
    deployment(cfg, "Router")["max_ongoing_requests"] = 256
    with pytest.raises(ValueError, match="max_in_flight \\+ max_queued"):
        validate_serve_config(cfg)


def test_refusals_beyond_the_pace_wait_their_turn_and_those_within_it_go_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    schedule = Schedule(monkeypatch)

    async def go() -> None:
        adm = Admission(rate=finished(10, over_s=10))  # 1/s: the next in the queue would wait 1 s, over queue_wait_s
        limits = Limits(1, queue_wait_s=0.5, queued=10, queued_bytes=1 << 20, refusals_per_s=20, pace_wait_s=5)
        h = Holder(adm, limits)
        h.start()
        await until(lambda: adm.in_flight == 1)
        await asyncio.gather(*(refused(adm, limits) for _ in range(5)))
        # The first goes at once (no wait scheduled); the rest one every 1/20 s after it, in turn: a client
        # resending at once is slowed to the pace.
        assert schedule.sleeps == pytest.approx([0.05, 0.10, 0.15, 0.20]), schedule.sleeps
        assert adm.pacing == 0 and adm.refused == 5
        await h.release_all()

    run(go())


def test_a_refusal_whose_turn_is_beyond_the_wait_budget_goes_at_the_end_of_it(monkeypatch: pytest.MonkeyPatch) -> None:
    schedule = Schedule(monkeypatch)

    async def go() -> None:
        adm = Admission()
        limits = Limits(1, queue_wait_s=0, queued=1, queued_bytes=0, refusals_per_s=10, pace_wait_s=0.1)
        h = Holder(adm, limits)
        h.start()
        await until(lambda: adm.in_flight == 1)
        adm._next_refusal_at = schedule.now + 10  # the pace is booked 10 s ahead
        await refused(adm, limits)  # no queue, so refused; its turn is 10 s away
        assert schedule.sleeps == pytest.approx([0.1]) and adm.pacing == 0  # sent at pace_wait_s (0.1 s)
        await refused(adm, limits, size=1)  # 1 byte over queued_bytes: no room to hold it, sent at once
        assert schedule.sleeps == pytest.approx([0.1])  # no wait scheduled for it
        await h.release_all()

    run(go())


def test_one_user_cannot_take_the_whole_queue() -> None:
    async def go() -> None:
        adm = Admission()
        limits = Limits(1, queue_wait_s=5, queued=10, queued_bytes=1 << 20, queued_per_user=2)
        h = Holder(adm, limits)
        h.start(user="greedy")  # in flight
        for _ in range(2):
            h.start(user="greedy")
        await until(lambda: adm.queued == 2)
        err = await refused(adm, limits, user="greedy")
        assert "this user has 2 requests waiting" in err.message
        h.start(user="other")  # another user still gets a place, and so does one with no X-User-Id
        h.start()
        await until(lambda: adm.queued == 4)
        await h.release_all()
        assert h.order == [0, 1, 2, 3, 4] and adm.in_flight == 0 and not adm._by_user
        h.start(user="greedy")  # the count is given back: greedy may wait again
        h.gates[-1].set()
        await h.tasks[-1]

    run(go())
