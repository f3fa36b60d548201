"""Coalescing: concurrent requests for the same variant share one trip down the chain.

While a key (a variant) has `max_groups` groups in flight, arrivals wait and leave together as
the next group, up to `max_images` images (a request is never split; one larger than that goes
alone). At low load a request leaves at once, alone, so nothing waits for company.
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import functools
import time
from collections.abc import Awaitable, Callable, Coroutine, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from app.errors import ServiceError
from app.tracing import spans

K = TypeVar("K", bound=Hashable)
T = TypeVar("T")


@dataclass
class Waiter:
    """One request waiting for its group: its images and whatever the group runner needs of it."""

    images: Sequence[Any]
    extra: Any
    future: asyncio.Future[Any]
    enqueued: float = field(default_factory=time.perf_counter)
    group: Group | None = None  # once sent
    trace: Any = None  # traced: the request's context (its span), which the group's span links to

    @property
    def gone(self) -> bool:
        """Its caller stopped waiting (cancelled), or it has its answer."""
        return self.future.done()


@dataclass
class Group:
    waiters: list[Waiter]
    task: asyncio.Task[None] | None = None


# (key, live waiters) -> per waiter, in order: its result or the exception it gets.
GroupRunner = Callable[[Any, list[Waiter]], Awaitable[list[Any]]]


def detached_task(coro: Coroutine[Any, Any, T], trace: Any = None) -> asyncio.Task[T]:
    """A task that belongs to no request: it starts from an empty context, so Serve does not file its
    downstream calls under the request that happened to start it (nor cancel them with that request).
    `trace`: a span's context (`spans.current()`) the task's spans and calls are traced under, that alone carried."""
    ctx = contextvars.Context()
    if trace is not None:
        ctx.run(spans.attach, trace)
    return ctx.run(asyncio.get_running_loop().create_task, coro)


class Coalescer(Generic[K]):
    def __init__(self, run: GroupRunner, limits: Callable[[], tuple[int, int]]) -> None:
        """`limits()` -> (max_groups in flight per key, max_images per group), read at each send (live config)."""
        self._run = run
        self._limits = limits
        self._pending: dict[K, list[Waiter]] = collections.defaultdict(list)
        self.in_flight: dict[K, int] = collections.defaultdict(int)

    async def submit(self, key: K, images: Sequence[Any], extra: Any = None) -> Any:
        """Queue one request and wait for its own answer from the group it rides in.

        Cancelled (its client went away): it is not sent, or if its group is out and every request
        in it has gone, the group is cancelled with its downstream calls.
        """
        waiter = Waiter(images, extra, asyncio.get_running_loop().create_future(), trace=spans.current())
        self._pending[key].append(waiter)
        self._send(key)
        try:
            return await waiter.future
        except asyncio.CancelledError:
            group = waiter.group
            if group is not None and group.task is not None and all(w.gone for w in group.waiters):
                group.task.cancel()
            raise

    def waiting(self, key: K) -> int:
        return len(self._pending[key])

    def _send(self, key: K) -> None:
        max_groups, max_images = self._limits()
        pending = self._pending[key]
        pending[:] = [w for w in pending if not w.gone]  # a client that went away takes no room
        while pending and self.in_flight[key] < max_groups:
            n, images = 0, 0
            while n < len(pending) and (n == 0 or images + len(pending[n].images) <= max_images):
                images += len(pending[n].images)
                n += 1
            group = Group(pending[:n])
            pending[:] = pending[n:]
            for w in group.waiters:
                w.group = group
            self.in_flight[key] += 1
            group.task = detached_task(self._run_group(key, group.waiters))
            group.task.add_done_callback(functools.partial(self._done, key))

    def _done(self, key: K, _task: asyncio.Task[None]) -> None:
        self.in_flight[key] -= 1
        self._send(key)

    async def _run_group(self, key: K, group: list[Waiter]) -> None:
        live = [w for w in group if not w.gone]  # a client that went away is not sent
        if not live:
            return
        try:
            answers = await self._run(key, live)
            for w, answer in zip(live, answers, strict=False):
                if w.gone:
                    continue
                if isinstance(answer, BaseException):
                    w.future.set_exception(answer)
                else:
                    w.future.set_result(answer)
        except Exception as e:  # the group failed as a whole: each waiter gets the error
            for w in live:
                if not w.gone:
                    w.future.set_exception(e)
        finally:  # never leave a waiter hanging (a short answer list, or this task cancelled)
            for w in live:
                if not w.gone:
                    w.future.set_exception(ServiceError("replica_failed", "the request's group was cancelled"))
