"""How much decoding a replica does at once: bounded by its CPUs and by the memory the decodes take.

Pure asyncio, no Ray. A `DecodeBudget` hands out reservations of an image's estimated decode
cost (`app.imaging.decode_cost.estimate_decode_bytes`): at most `max_concurrent` at a time, whose bytes
never sum past `max_bytes`. A reservation that does not fit waits, first come first served (a
large one at the head is not starved by small ones behind it); one larger than `max_bytes` could
never fit and is refused at once (413 decode_budget_exceeded).

All bookkeeping runs on the event loop's thread; releasing never awaits, so a cancellation cannot
lose a release. `run` keeps a decode's reservation until its worker thread has finished, even when
the request that started it is cancelled or times out: the thread cannot be stopped, and its memory
stays in use until it returns.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections import deque
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Executor
from typing import Any, TypeVar

from app.errors import ServiceError

T = TypeVar("T")


def slots_for(num_cpus: float) -> int:
    """Decodes at once for a replica granted `num_cpus`: its whole CPUs, at least one."""
    return max(1, math.floor(num_cpus + 1e-9))


class DecodeBudget:
    """At most `max_concurrent` reservations at once, their bytes summing to at most `max_bytes`."""

    def __init__(self, max_bytes: int, max_concurrent: int) -> None:
        if max_bytes <= 0 or max_concurrent <= 0:
            raise ValueError(f"max_bytes ({max_bytes}) and max_concurrent ({max_concurrent}) must be positive")
        self.max_bytes = max_bytes
        self.max_concurrent = max_concurrent
        self._bytes = 0
        self._count = 0
        self._waiters: deque[tuple[int, asyncio.Future[None]]] = deque()
        self.peak_bytes = 0  # the most ever held at once (for tests and metrics)
        self.peak_count = 0

    @property
    def in_flight_bytes(self) -> int:
        return self._bytes

    @property
    def in_flight(self) -> int:
        return self._count

    @property
    def waiting(self) -> int:
        return sum(not fut.done() for _, fut in self._waiters)

    def _fits(self, nbytes: int) -> bool:
        return self._count < self.max_concurrent and self._bytes + nbytes <= self.max_bytes

    def _take(self, nbytes: int) -> None:
        self._count += 1
        self._bytes += nbytes
        self.peak_bytes = max(self.peak_bytes, self._bytes)
        self.peak_count = max(self.peak_count, self._count)

    def _wake(self) -> None:
        """Grant waiting reservations in arrival order while the one at the head fits."""
        while self._waiters:
            nbytes, fut = self._waiters[0]
            if fut.done():  # given up (cancelled, timed out)
                self._waiters.popleft()
                continue
            if not self._fits(nbytes):
                return
            self._waiters.popleft()
            self._take(nbytes)
            fut.set_result(None)

    async def acquire(self, nbytes: int, timeout: float | None = None) -> int:
        """Wait until `nbytes` fits (at most `timeout` seconds: TimeoutError), hold it; the bytes held.

        Refuses at once, holding nothing, what could never fit. Cancelled or timed out, it holds nothing.
        """
        if nbytes > self.max_bytes:
            raise ServiceError(
                "decode_budget_exceeded",
                f"decoding this image would take about {nbytes >> 20} MiB; a decoding replica (the Preprocessor, "
                f"or the Router with decode_in: router) decodes at most {self.max_bytes >> 20} MiB at once",
            )
        nbytes = max(0, nbytes)
        if not self._waiters and self._fits(nbytes):
            self._take(nbytes)
            return nbytes
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((nbytes, fut))
        try:
            if timeout is None:
                await fut
            else:
                await asyncio.wait_for(fut, max(0.0, timeout))
        except BaseException:
            if fut.done() and not fut.cancelled():  # granted just as the caller gave up: hand it back
                self.release(nbytes)
            else:
                fut.cancel()
                self._wake()  # the reservation behind this one may fit now
            raise
        return nbytes

    def release(self, nbytes: int) -> None:
        """Hand back what `acquire` returned."""
        self._count -= 1
        self._bytes -= nbytes
        self._wake()

    @contextlib.asynccontextmanager
    async def reserve(self, nbytes: int, timeout: float | None = None) -> AsyncIterator[None]:
        """`acquire` for the body of an `async with`; released however it ends (exception, cancellation)."""
        held = await self.acquire(nbytes, timeout)
        try:
            yield
        finally:
            self.release(held)

    async def run(
        self,
        nbytes: int,
        fn: Callable[..., T],
        *args: Any,
        timeout: float | None = None,
        executor: Executor | None = None,
    ) -> T:
        """fn(*args) on `executor`'s threads under a reservation of `nbytes`, held until the thread is done.

        `timeout` bounds only the wait for room. Cancelling the caller abandons the result, not the
        reservation: that is released when the thread finishes.
        """
        held = await self.acquire(nbytes, timeout)
        try:
            work = asyncio.get_running_loop().run_in_executor(executor, fn, *args)
        except BaseException:
            self.release(held)
            raise

        def finished(f: asyncio.Future[T]) -> None:
            if not f.cancelled():
                f.exception()  # retrieved here, so an abandoned failure logs no "never retrieved" warning
            self.release(held)

        work.add_done_callback(finished)
        return await asyncio.shield(work)
