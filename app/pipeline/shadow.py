"""Shadowing: a sample of images re-run on the other variant off the response path, and the A/B evidence.

Each image is sampled with probability `fraction`; only the sampled rows are re-run, on the
pixels already decoded for the answer. Under load shadows are shed first: beyond `max_in_flight`
shadow runs a sample is dropped (and counted as dropped). The counts go to the ABLedger about
once a second (`Evidence.flush_forever`).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from typing import Any

from app.abstats import ABStats, compare_top
from app.payloads import Scores
from app.pipeline.coalescer import detached_task
from app.pipeline.ports import Backend, Call, ShadowMetrics

logger = logging.getLogger("ray.serve")
SHADOW_TOP_K = 5  # the classifier always returns at least this many, so a shadow pair can compare top-5
SHADOW_TIMEOUT_S = 30.0
FLUSH_EVERY_S = 1.0


class Evidence:
    """This Router's A/B counts since the last flush, and the flush to the ledger."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.stats = ABStats()
        self._flusher: asyncio.Task[None] | None = None
        self.poller: Callable[[], Awaitable[None]] | None = None  # run after each flush (the rollout's weights)

    def reset(self) -> None:
        self.stats = ABStats()

    async def flush(self) -> None:
        if self.stats.empty():
            return
        delta, self.stats = self.stats, ABStats()
        call = self.backend.ledger_add(delta)
        try:
            await asyncio.wait_for(self.backend.result(call), 5.0)
        except Exception as e:  # the evidence is best-effort; serving is not
            call.cancel()
            logger.warning(
                "A/B ledger unreachable (%s); dropping %d variants' deltas", type(e).__name__, len(delta.variants)
            )

    def ensure_flusher(self) -> None:
        if self._flusher is None or self._flusher.done():
            self._flusher = detached_task(self._flush_forever())

    async def _flush_forever(self) -> None:
        while True:
            await asyncio.sleep(FLUSH_EVERY_S)
            await self.flush()
            if self.poller is not None:
                await self.poller()


class Shadow:
    def __init__(
        self,
        backend: Backend,
        variants: list[str],
        evidence: Evidence,
        metrics: ShadowMetrics,
        rng: random.Random | None = None,
    ) -> None:
        self.backend = backend
        self.variants = variants
        self.evidence = evidence
        self.metrics = metrics
        self.rng = rng or random.Random()
        self.running: set[asyncio.Task[None]] = set()
        self.pair: tuple[str, str] | None = None  # a rollout's candidate and baseline: shadowed on each other

    def partner(self, variant: str) -> str:
        """The variant a request answered by `variant` is shadowed on: its rollout partner, else the first other."""
        if self.pair is not None and variant in self.pair:
            return self.pair[1] if variant == self.pair[0] else self.pair[0]
        return next(v for v in self.variants if v != variant)

    def maybe(self, primary: Scores, pixels: Call | Any, fraction: float, max_in_flight: int) -> list[int]:
        """Sample rows of `primary` and re-run them on the other variant in the background; the rows sampled."""
        if fraction <= 0 or len(self.variants) < 2:
            return []
        rows = [i for i in range(len(primary.top)) if self.rng.random() < fraction]
        if not rows:
            return []
        other = self.partner(primary.variant)
        if len(self.running) >= max_in_flight:  # shed shadows first under load
            self._lost(primary.variant, other, rows, "dropped")
            return rows
        task = detached_task(self._run(primary, other, pixels, rows))
        self.running.add(task)
        task.add_done_callback(self.running.discard)
        return rows

    def _lost(self, variant: str, other: str, rows: list[int], outcome: str) -> None:
        for _ in rows:
            self.evidence.stats.record_dropped_shadow(variant, other)
        self.metrics.shadow_outcome(_pair(variant, other), outcome, len(rows))

    async def _run(self, primary: Scores, other: str, pixels: Any, rows: list[int]) -> None:
        call = self.backend.classify(other, pixels, SHADOW_TOP_K, False, rows)
        try:
            shadow = await asyncio.wait_for(self.backend.result(call), SHADOW_TIMEOUT_S)
        except Exception:
            call.cancel()
            self._lost(primary.variant, other, rows, "failed")
            return
        pair = _pair(primary.variant, other)
        for row, shadow_top in zip(rows, shadow.top, strict=True):
            agree, overlap, dp = compare_top(primary.top[row], shadow_top)
            self.evidence.stats.record_shadow(primary.variant, other, agree, overlap, dp)
            self.metrics.shadow_outcome(pair, "agree" if agree else "disagree")
            self.metrics.shadow_delta(pair, dp)


def _pair(a: str, b: str) -> str:
    return "|".join(sorted((a, b)))
