"""Admission: a request is counted in flight, or refused at once (503) when the Router is at its limit."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

from app.errors import ServiceError


class Admission:
    """The in-flight count of one Router and the requests whose client went away."""

    def __init__(self, on_cancel: Callable[[], None] = lambda: None) -> None:
        self.in_flight = 0
        self.cancelled = 0
        self._on_cancel = on_cancel

    def check(self, limit: int) -> None:
        if self.in_flight >= limit:
            raise ServiceError("overloaded", f"{self.in_flight} requests in flight on this Router; retry shortly")

    def client_gone(self) -> None:
        self.cancelled += 1
        self._on_cancel()

    @contextlib.asynccontextmanager
    async def admitted(self, limit: int) -> AsyncIterator[None]:
        """Hold one of `limit` slots for the body of the `async with`, or raise 503 overloaded now."""
        self.check(limit)
        self.in_flight += 1
        try:
            yield
        except asyncio.CancelledError:
            # The client went away: Serve cancels the handler; a request still waiting for its
            # group is dropped before it is sent, and a sent one's downstream calls are cancelled.
            self.client_gone()
            raise
        finally:
            self.in_flight -= 1
