"""Failover: a deadline on every call, one retry elsewhere on a replica failure, and no wait on a dead variant.

"Elsewhere" is the next healthy variant when failover is on, else the same variant (Serve routes
the retry to another replica, or to the replacement). A variant known to be down is skipped
without waiting for it, and a call still waiting when its variant fails is abandoned at once:
after a replica dies, Serve holds new calls until a replacement starts (seconds).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from typing import Any, Protocol, TypeVar

from app.errors import ServiceError
from app.pipeline.coalescer import detached_task
from app.pipeline.ports import Backend, Call, ReplicaLost
from app.pipeline.routing import Choice, VariantHealth, WeightedSplit, candidates
from app.request.guards import deadline_message

logger = logging.getLogger("ray.serve")
T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)
CHECK_EVERY_S = 0.1  # how often a waiting call asks whether its variant still has replicas
POLL_EVERY_S = 1.0
QUIET_S = 30.0  # the health poll stops this long after the last failure, once every variant has replicas


class Attempt(Protocol[T_co]):
    """One request's calls on a variant (`group_run.DecodeAndClassify`, `group_run.Classify`), which `Failover.run`
    makes on the chosen variant and, after a replica failure, once more elsewhere."""

    async def on(self, variant: str, deadline: float, abort: asyncio.Event | None) -> T_co:
        """The answer from `variant` by `deadline` (perf_counter); ReplicaLost to fail over. `abort`: set when the
        variant fails meanwhile (the call is abandoned at once)."""
        ...


class Failover:
    def __init__(self, backend: Backend, variants: list[str], health: VariantHealth | None = None) -> None:
        self.backend = backend
        self.variants = variants
        self.health = health or VariantHealth()
        self._failures: dict[str, asyncio.Event] = collections.defaultdict(asyncio.Event)
        self._poller: asyncio.Task[None] | None = None

    async def run(
        self, choice: Choice, split: WeightedSplit, failover: bool, deadline: float, attempt: Attempt[T]
    ) -> tuple[T, str]:
        """`attempt.on` the chosen variant, retried once on ReplicaLost; (answer, the variant that gave it).

        A ServiceError from the chain carries the variant it came from (ServiceError.variant).
        """
        if self.health.down_until:  # only after a failure: a handle that lost every replica is down now
            self.health.set_routable({v: self.backend.routable(v) for v in self.variants})
        order = candidates(choice, self.variants, split, failover, self.health, time.monotonic())
        if not order:
            raise ServiceError(
                "variant_unavailable", f"variant {choice.variant} has no healthy replica; retry shortly", choice.variant
            )
        tries = order[:2] if len(order) > 1 else order * 2  # one retry: elsewhere if we can, else the same again
        failure: ReplicaLost | None = None
        for n, variant in enumerate(tries):
            if n and time.perf_counter() >= deadline:
                break
            abort = self.abort_event(variant) if n == 0 and tries[1] != variant else None
            try:
                return await attempt.on(variant, deadline, abort), variant
            except ReplicaLost as e:
                self.mark_failed(variant)
                logger.warning(
                    "Classifier_%s or the decode failed mid-request (%s)%s",
                    variant,
                    e,
                    "; retrying once" if n == 0 else "",
                )
                failure = e
            except ServiceError as e:
                e.variant = e.variant or variant
                raise
        unavailable = failure is not None and failure.unavailable
        raise ServiceError(
            "variant_unavailable" if unavailable else "replica_failed",
            f"Classifier_{choice.variant} or the decode failed ({failure}) and the retry too",
            choice.variant,
        )

    async def call(
        self,
        call: Call,
        timeout_s: float,
        *upstream: Call,
        abort: asyncio.Event | None = None,
        variant: str | None = None,
    ) -> Any:
        """Await a downstream call with a deadline (503 inference_timeout, cancelling it and its upstream calls).

        With `abort`, the call is abandoned (ReplicaLost, so the caller retries elsewhere) when the event
        is set or the handle of `variant` has no replica left, checked every CHECK_EVERY_S.
        """
        try:
            return await asyncio.wait_for(self._wait(call, abort, variant), timeout=max(timeout_s, 0.001))
        except asyncio.TimeoutError:
            for c in (call, *upstream):
                c.cancel()
            raise ServiceError("inference_timeout", deadline_message(timeout_s)) from None
        except asyncio.CancelledError:  # nobody waits for the answer any more: neither should the replicas
            for c in (call, *upstream):
                c.cancel()
            raise

    async def _wait(self, call: Call, abort: asyncio.Event | None, variant: str | None) -> Any:
        if abort is None:
            return await self.backend.result(call)
        answer = asyncio.ensure_future(self.backend.result(call))
        aborted = asyncio.ensure_future(abort.wait())
        try:
            while True:
                # Serve may re-queue a call whose replica died without failing it; then it waits
                # for a replacement. Asking the handle too catches that.
                await asyncio.wait((answer, aborted), timeout=CHECK_EVERY_S, return_when=asyncio.FIRST_COMPLETED)
                if answer.done():
                    return answer.result()
                if abort.is_set() or (variant is not None and self.backend.routable(variant) == 0):
                    answer.cancel()
                    call.cancel()
                    raise ReplicaLost("abandoned: its variant lost its replicas")
        finally:
            aborted.cancel()
            if not answer.done():
                answer.cancel()

    def abort_event(self, variant: str) -> asyncio.Event:
        """Set when a call on `variant` fails (mark_failed): a call waiting on it is abandoned at once."""
        return self._failures[variant]

    def mark_failed(self, variant: str) -> None:
        self.health.mark_failed(variant, time.monotonic())
        waiting = self._failures.pop(variant, None)
        if waiting is not None:
            waiting.set()  # wakes every call waiting on this variant; the next gets a new event
        if self._poller is None or self._poller.done():
            self._poller = detached_task(self._poll_health())
            self._poller.add_done_callback(lambda _t: self.health.set_running({}))

    async def _poll_health(self) -> None:
        """Once a second, RUNNING replicas per Classifier from the controller, only while it matters:
        from a failure until every variant has replicas again and QUIET_S passed without one (the poll
        costs the controller CPU that an idle 2-core machine should not spend)."""
        while self.health.recently_troubled(time.monotonic(), quiet_s=QUIET_S):
            try:
                running = await self.backend.running()
            except Exception as e:  # the controller restarting must not take the Router down
                logger.debug("health poll failed: %s", e)
            else:
                if running is None:  # no controller to ask (outside a Serve replica)
                    return
                self.health.set_running(running)
            await asyncio.sleep(POLL_EVERY_S)
