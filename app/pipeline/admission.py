"""Admission: a request is counted in flight, waits (bounded by the measured service rate) for a slot, or is
refused at once with a 503.

Under a retry storm an immediate refusal is the expensive answer: it comes straight back, and refusing costs the
Router as much CPU as a small request (the reliability page has the figures). A request that waits costs nothing
while it waits, and its client sends nothing meanwhile. So beyond `max_in_flight` a request waits in a FIFO queue when
the wait it can expect, (its place in the queue) / (the rate at which admitted requests are finishing, measured over
the last seconds), fits in `max_queue_wait_s` with a margin (QUEUE_FILL), and the queue holds fewer than
`max_queued` requests and `max_queued_bytes` of bodies; otherwise it is refused at once. The wait counts toward the
request's own deadline, so the queue never admits work that cannot finish in time.

Refusals are paced: beyond `refusals_per_s` a refusal is sent later, in turn, or at the end of `pace_wait_s` (the
request's deadline) when its turn would come later still; a storm costs the Router about `refusals_per_s` requests'
CPU a second plus one refusal per connection per deadline. Below the pace a refusal goes at once.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from app.errors import ServiceError
from app.tracing import spans

# A request joins the queue when its expected wait is within this share of the queue's time budget. The measured
# rate moves (batches finish in bursts, a window is 3 s): filled to the very edge, the tail of the queue would
# often outwait the budget and be refused late, after holding a place for nothing. Measured on the multi-node
# test at 4x capacity with the edge at 100%: 78 of 2,001 refusals (4%) came from the queue at ~2.6 s.
QUEUE_FILL = 0.8


class CompletionRate:
    """Admitted requests finishing per second, over a sliding window (None until the window has seen some)."""

    def __init__(self, window_s: float = 3.0, min_samples: int = 8, clock: Callable[[], float] = time.monotonic):
        self.window_s, self.min_samples, self._clock = window_s, min_samples, clock
        self._done: collections.deque[float] = collections.deque()
        self._since = clock()

    def record(self) -> None:
        self._done.append(self._clock())

    def per_s(self) -> float | None:
        now = self._clock()
        while self._done and self._done[0] < now - self.window_s:
            self._done.popleft()
        if len(self._done) < self.min_samples:
            return None
        span = min(self.window_s, now - self._since)
        return len(self._done) / span if span > 0 else None


@dataclass(frozen=True)
class Limits:
    """What one Router admits: `in_flight` at once, and behind them a queue bounded in time, count and bytes."""

    in_flight: int
    queue_wait_s: float = 0.0  # 0: no queue, refuse at once beyond in_flight
    queued: int = 0
    queued_bytes: int = 0
    refusals_per_s: float = 0.0  # beyond this rate refusals are paced (sent later, in turn); 0: never paced
    pace_wait_s: float = 0.0  # the longest a paced refusal waits for its turn (beyond, it goes at once)
    queued_per_user: int = 0  # waiting requests one user (X-User-Id) may hold; 0: no cap


class Admission:
    """The in-flight count of one Router, its wait queue, and the requests whose client went away."""

    def __init__(self, on_cancel: Callable[[], None] = lambda: None, rate: CompletionRate | None = None) -> None:
        self.in_flight = 0
        self.cancelled = 0
        self.refused = 0
        self.rate = rate or CompletionRate()
        self._queue: collections.deque[tuple[asyncio.Future[None], int]] = collections.deque()
        self._queued_bytes = 0
        self._by_user: collections.Counter[str] = collections.Counter()
        self._on_cancel = on_cancel
        self.pacing = 0  # refusals waiting for their turn
        self._pacing_bytes = 0
        self._next_refusal_at = 0.0

    @property
    def queued(self) -> int:
        return len(self._queue)

    def describe(self) -> dict[str, Any]:
        rate = self.rate.per_s()
        return {
            "in_flight": self.in_flight,
            "waiting": len(self._queue),
            "refused": self.refused,
            "refusals_pacing": self.pacing,
            "finishing_per_s": None if rate is None else round(rate, 1),
        }

    def client_gone(self) -> None:
        self.cancelled += 1
        self._on_cancel()

    def _refuse(self, why: str) -> ServiceError:
        self.refused += 1
        return ServiceError("overloaded", f"{why}; retry shortly")

    async def _paced(self, limits: Limits, refusal: ServiceError, size: int, waited_s: float) -> ServiceError:
        """The refusal, sent when the pace allows: at most `refusals_per_s`, the rest later, in turn.

        A client that resends the moment it is refused turns every refusal into another request: paced, a
        refusal storm costs at most `refusals_per_s` requests' CPU, and the replicas keep the rest. A refusal
        whose turn comes after `pace_wait_s` from its arrival (`waited_s` ago) is sent then, out of turn: so a
        connection that resends at once costs one refusal per `pace_wait_s` at most, however many there are.
        With `queued` refusals or `queued_bytes` of bodies (waiting ones' and paced ones' together) held
        already, a refusal is sent at once.
        """
        if limits.refusals_per_s <= 0:
            return refusal
        now = time.monotonic()
        full = self.pacing >= limits.queued or self._queued_bytes + self._pacing_bytes + size > limits.queued_bytes
        if full:
            return refusal
        at = max(now, self._next_refusal_at)
        if at - now <= limits.pace_wait_s - waited_s:
            self._next_refusal_at = at + 1.0 / limits.refusals_per_s  # its turn
        else:
            at = now + max(0.0, limits.pace_wait_s - waited_s)  # out of turn, at the end of its wait
        if at > now:
            self.pacing += 1
            self._pacing_bytes += size
            try:
                await asyncio.sleep(at - now)  # the refusal's turn: a schedule, not a wait for an event
            finally:
                self.pacing -= 1
                self._pacing_bytes -= size
        return refusal

    def _may_wait(self, limits: Limits, size: int, user: str | None) -> None:
        """Raise 503 overloaded unless this request may join the queue."""
        if limits.queue_wait_s <= 0 or limits.queued <= 0:
            raise self._refuse(f"{self.in_flight} requests in flight on this Router")
        if user is not None and limits.queued_per_user > 0 and self._by_user[user] >= limits.queued_per_user:
            raise self._refuse(f"this user has {self._by_user[user]} requests waiting, the most one user may")
        if len(self._queue) >= limits.queued or self._queued_bytes + size > limits.queued_bytes:
            raise self._refuse(f"{self.in_flight} requests in flight and {len(self._queue)} waiting on this Router")
        rate = self.rate.per_s()  # None until measured: then the count and byte bounds alone decide
        expected = None if rate is None else (len(self._queue) + 1) / rate  # this request's place / the rate
        if expected is not None and expected > QUEUE_FILL * limits.queue_wait_s:
            raise self._refuse(
                f"{len(self._queue)} requests waiting, about {expected:.1f} s at the rate requests finish "
                f"({rate:.0f}/s), too close to the {limits.queue_wait_s:g} s this Router lets one wait"
            )

    async def _wait_for_slot(self, limits: Limits, size: int, user: str | None) -> None:
        """Queue for a slot (handed over by a finishing request), or 503 when the wait runs out."""
        slot: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (slot, size)
        self._queue.append(entry)
        self._queued_bytes += size
        if user is not None:
            self._by_user[user] += 1
        try:
            await asyncio.wait_for(asyncio.shield(slot), limits.queue_wait_s)
        except asyncio.TimeoutError:
            if not slot.done():
                raise self._refuse(f"no slot freed within {limits.queue_wait_s:g} s") from None
        except asyncio.CancelledError:
            self.client_gone()
            if slot.done() and not slot.cancelled():  # handed a slot just as the client left: pass it on
                self._release()
            raise
        finally:
            if user is not None:
                self._by_user[user] -= 1
                if not self._by_user[user]:
                    del self._by_user[user]
            if not slot.done():
                slot.cancel()
            with contextlib.suppress(ValueError):
                self._queue.remove(entry)
                self._queued_bytes -= size

    def _release(self) -> None:
        """A slot frees: hand it to the oldest waiter still waiting, else count it free."""
        while self._queue:
            slot, size = self._queue.popleft()
            self._queued_bytes -= size
            if not slot.done():
                slot.set_result(None)  # in_flight stays: the slot changes hands
                return
        self.in_flight -= 1

    @contextlib.asynccontextmanager
    async def admitted(self, limits: Limits, size: int = 0, user: str | None = None) -> AsyncIterator[None]:
        """Hold a slot for the body of the `async with` (waiting for one if the queue allows), or raise 503.

        `size`: the request's body bytes, held while it waits (bounded by `limits.queued_bytes`). `user`: who sent
        it (X-User-Id), so that one user cannot take the whole queue (`limits.queued_per_user`); None: unknown.
        """
        if self.in_flight < limits.in_flight and not self._queue:
            self.in_flight += 1
        else:
            arrived = time.monotonic()
            queued = time.perf_counter() if spans.ENABLED else 0.0
            try:
                self._may_wait(limits, size, user)
                await self._wait_for_slot(limits, size, user)
            except ServiceError as refusal:
                raise await self._paced(limits, refusal, size, time.monotonic() - arrived) from None
            finally:  # traced: the wait for a slot (a request that found one free waited for nothing: no span)
                if spans.ENABLED:
                    spans.record("admission wait", queued, time.perf_counter(), {"app.queued_bytes": size})
        try:
            yield
        except asyncio.CancelledError:
            # The client went away: Serve cancels the handler; a request still waiting for its
            # group is dropped before it is sent, and a sent one's downstream calls are cancelled.
            self.client_gone()
            raise
        finally:
            self.rate.record()
            self._release()
