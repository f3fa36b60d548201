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
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from app.imaging.payloads import Scores
from app.pipeline.abstats import ABStats, compare_top
from app.pipeline.cascade_rule import escalate, margin
from app.pipeline.cascade_stage import Cascader, Cascades, CascadeState, Escalation, Source, Top
from app.pipeline.coalescer import detached_task
from app.pipeline.ports import Backend, Call, ShadowMetrics
from app.tracing import spans

logger = logging.getLogger("ray.serve")
SHADOW_TOP_K = 5  # the classifier always returns at least this many, so a shadow pair can compare top-5
SHADOW_TIMEOUT_S = 30.0
FLUSH_EVERY_S = 1.0


class Evidence:
    """This Router's A/B counts since the last flush, and the flush to the ledger."""

    def __init__(self, backend: Backend, after_flush: Callable[[], Awaitable[None]] | None = None) -> None:
        """after_flush: run after each flush, about once a second (the Router's rollout poll, cascade refit)."""
        self.backend = backend
        self.stats = ABStats()
        self._flusher: asyncio.Task[None] | None = None
        self.after_flush = after_flush

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
            if self.after_flush is not None:
                await self.after_flush()


class Shadow:
    def __init__(
        self,
        backend: Backend,
        variants: list[str],
        evidence: Evidence,
        metrics: ShadowMetrics,
        rng: random.Random | None = None,
        cascades: Cascades | None = None,
        cascader: Cascader | None = None,
        available: Callable[[str], bool] = lambda _variant: True,
    ) -> None:
        """available: whether a variant is not failing now (the Pipeline's failover health)."""
        self.backend = backend
        self.variants = variants
        self.evidence = evidence
        self.metrics = metrics
        self.rng = rng or random.Random()
        self.cascades = cascades or Cascades({})
        self.cascader = cascader  # keeps a cascade's disagreements (its capture), when one is set
        self.running: set[asyncio.Task[None]] = set()
        self.pair: tuple[str, str] | None = None  # a rollout's candidate and baseline: shadowed on each other
        self.available = available

    def partner(self, variant: str) -> str:
        """The variant a request answered by `variant` is shadowed on: its rollout partner, else a cascade's `then`,
        else the first other variant."""
        if self.pair is not None and variant in self.pair:
            return self.pair[1] if variant == self.pair[0] else self.pair[0]
        state = self.cascades.get(variant)
        if state is not None:
            return state.then
        return next(v for v in self.variants if v != variant)

    def maybe(
        self,
        primary: Scores,
        pixels: Call | Any,
        fraction: float,
        max_in_flight: int,
        escalation: Escalation | None = None,
        source: Source | None = None,
    ) -> list[int]:
        """Sample rows of `primary` and re-run them on the other variant in the background; the rows sampled.

        `escalation`: what a cascade's second stage did for this group (primary is the cascade's answer)."""
        if fraction <= 0 or len(self.variants) < 2:
            return []
        rows = [i for i in range(len(primary.top)) if self.rng.random() < fraction]
        if not rows:
            return []
        other = self.partner(primary.variant)
        if len(self.running) >= max_in_flight:  # shed shadows first under load
            self._lost(primary.variant, other, rows, "dropped")
            return rows
        run = self._run(primary, other, pixels, rows, escalation, source)
        if spans.ENABLED:  # traced: a child of the group's span, which its own task does not carry
            task = detached_task(self._traced(run, other, len(rows)), spans.current())
        else:
            task = detached_task(run)
        self.running.add(task)
        task.add_done_callback(self.running.discard)
        return rows

    def _lost(self, variant: str, other: str, rows: list[int], outcome: str) -> None:
        for _ in rows:
            self.evidence.stats.record_dropped_shadow(variant, other)
        self.metrics.shadow_outcome(_pair(variant, other), outcome, len(rows))

    @staticmethod
    async def _traced(run: Coroutine[Any, Any, None], other: str, rows: int) -> None:
        with spans.span("shadow", {"app.shadow.variant": other, "app.shadow.rows": rows}):
            await run

    async def _run(
        self,
        primary: Scores,
        other: str,
        pixels: Any,
        rows: list[int],
        escalation: Escalation | None,
        source: Source | None,
    ) -> None:
        esc = escalation if escalation is not None and other == escalation.cascade.then else None
        known = [r for r in rows if esc is not None and esc.escalated(r)]
        ask = [r for r in rows if r not in known]  # an escalated row's `then` answer is the cascade's own
        if not ask and not self.available(other):
            # A shadow call fails while `other` is failing, dropping its rows; a group needing none must go too, or
            # the evidence would keep the low margins (escalated) and lose the high ones (kept) meanwhile.
            self._lost(primary.variant, other, rows, "dropped")
            return
        first_of: dict[int, Top] = {}  # the shadow cascade's `first` answer, by row
        try:
            shadow_top = await self._shadow_top(primary, other, pixels, ask, first_of)
        except Exception:
            self._lost(primary.variant, other, rows, "failed")
            return
        answers = dict(zip(ask, shadow_top, strict=True)) | {r: primary.top[r] for r in known}
        pair = _pair(primary.variant, other)
        stats = self.evidence.stats
        for row in rows:
            mine, theirs = primary.top[row], answers[row]
            agree, overlap, dp = compare_top(mine, theirs)
            stats.record_shadow(primary.variant, other, agree, overlap, dp)
            self.metrics.shadow_outcome(pair, "agree" if agree else "disagree")
            self.metrics.shadow_delta(pair, dp)
            found = self._comparisons(primary.variant, other, row, mine, theirs, escalation, first_of)
            for state, first, then in found:
                stats.record_margin(state.first, state.then, margin(first), first[0][0] == then[0][0])
                if self.cascader is not None and source is not None:
                    self.cascader.keep_disagreement(state, source(row), first, then)

    async def _shadow_top(
        self, primary: Scores, other: str, pixels: Any, rows: list[int], first_of: dict[int, Top]
    ) -> list[Top]:
        if not rows:
            return []
        state = self.cascades.get(other)
        if state is None:
            return await self._top(other, pixels, rows)
        # Shadowed on a cascade: run it, first on every row, then on the rows below its threshold (not asked
        # again when `then` answered the request).
        first = await self._top(state.first, pixels, rows)
        first_of.update(zip(rows, first, strict=True))
        answer = list(first)
        up = [i for i, t in enumerate(first) if escalate(margin(t), state.threshold)]
        if primary.variant == state.then:
            then = [primary.top[rows[i]] for i in up]
        else:
            then = await self._top(state.then, pixels, [rows[i] for i in up]) if up else []
        for i, t in zip(up, then, strict=True):
            answer[i] = t
        return answer

    async def _top(self, variant: str, pixels: Any, rows: list[int]) -> list[Top]:
        """`variant`'s top-k of `rows`, within SHADOW_TIMEOUT_S (cancelled at the replica if not)."""
        call = self.backend.classify(variant, pixels, SHADOW_TOP_K, False, rows)
        try:
            shadow = await asyncio.wait_for(self.backend.result(call), SHADOW_TIMEOUT_S)
        except BaseException:
            call.cancel()
            raise
        return list(shadow.top)

    def _comparisons(
        self,
        variant: str,
        other: str,
        row: int,
        mine: Top,
        theirs: Top,
        escalation: Escalation | None,
        first_of: dict[int, Top],
    ) -> list[tuple[CascadeState, Top, Top]]:
        """The (cascade, first's answer, then's answer) this comparison is evidence for: only where every sampled
        row gives one, so the evidence stays an unbiased sample of the margins; once per (first, then), however
        many cascades share the pair (the evidence is the pair's)."""
        out, seen = [], set()
        for state in self.cascades.states.values():
            if (state.first, state.then) in seen:
                continue
            if (variant, other) == (state.first, state.then):
                out.append((state, mine, theirs))
            elif (variant, other) == (state.then, state.first):
                out.append((state, theirs, mine))
            elif variant == state.name and other == state.then and escalation is not None:
                out.append((state, escalation.first_top.get(row, mine), theirs))
            elif other == state.name and variant == state.then:
                out.append((state, first_of[row], mine))
            else:
                continue
            seen.add((state.first, state.then))
        return out


def _pair(a: str, b: str) -> str:
    return "|".join(sorted((a, b)))
