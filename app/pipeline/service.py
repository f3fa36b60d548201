"""The request pipeline put together: `classify(...) -> Outcome` for encoded images or ready pixels.

Encoded images of every protocol (v1 single and batch, V2) ride the coalescer: at low load a
request leaves at once; under load the requests waiting for a variant leave together, one decode
and one Classifier call for the lot (the group's run: `GroupRun`). The decode's answer (a Preprocessor call, or the
Router's own decode: `Backend.preprocess`) is handed to the Classifier call as it is; the pipeline never reads it.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any

from app.config import CascadeArgs, RouterConfig
from app.errors import ServiceError
from app.imaging.payloads import Pixels
from app.imaging.transform import Transform
from app.pipeline.admission import Admission, Limits
from app.pipeline.cascade_stage import Capture, Cascader, Cascades
from app.pipeline.coalescer import Coalescer
from app.pipeline.failover import Failover
from app.pipeline.group_run import Ask, GroupRun, Key, Outcome
from app.pipeline.model_specs import ModelSpecs
from app.pipeline.ports import Backend, PipelineMetrics
from app.pipeline.routing import Choice, WeightedSplit
from app.pipeline.shadow import Evidence, Shadow
from app.request.guards import deadline_message

logger = logging.getLogger("ray.serve")


class Pipeline:
    def __init__(
        self,
        backend: Backend,
        variants: list[str],
        metrics: PipelineMetrics,
        on_cancel: Callable[[], None] = lambda: None,
        rng: random.Random | None = None,
        cascades: dict[str, CascadeArgs] | None = None,
        capture: Capture | None = None,
        after_flush: Callable[[], Awaitable[None]] | None = None,
        transform: Transform | None = None,
    ) -> None:
        """Every part assembled here, once. capture: the cascades' calibration capture;
        after_flush: run about once a second after the A/B evidence goes to the ledger (the Router's rollout poll);
        transform: the model's, known at construction (every variant's: they take the same input), else None: asked of
        the first Classifier that serves a request (`transform`)."""
        self.backend = backend
        self.variants = variants
        self.admission = Admission(on_cancel)
        self.evidence = Evidence(backend, after_flush)
        self.failover = Failover(backend, variants)
        self.cascades = Cascades(cascades or {})
        self.specs = ModelSpecs(backend, self.failover, variants, self.cascades, transform)
        self.cascader = Cascader(backend, self.failover, metrics, capture)
        self.shadow = Shadow(
            backend,
            variants,
            self.evidence,
            metrics,
            rng,
            self.cascades,
            self.cascader,
            lambda v: self.failover.health.available(v, time.monotonic()),
        )
        self.runs = GroupRun(backend, self.failover, self.specs, self.cascades, self.cascader, self.shadow)
        self.coalescer: Coalescer[Key] = Coalescer(self.runs.group, self.runs.limits)
        self._limits: Limits | None = None

    @property
    def settings(self) -> RouterConfig | None:
        """The Router's config in force (the group's run holds it: it reads it on every group)."""
        return self.runs.settings

    @property
    def split(self) -> WeightedSplit | None:
        return self.runs.split

    def configure(self, settings: RouterConfig, split: WeightedSplit, pair: tuple[str, str] | None = None) -> None:
        """The Router's config in force, its A/B split, and a running rollout's pair (shadowed on each other)."""
        self.runs.configure(settings, split)
        self.shadow.pair = pair
        s = settings
        self._limits = Limits(
            s.max_in_flight,
            s.queue_wait_s,
            s.max_queued,
            int(s.max_queued_mib * 2**20),
            s.max_refusals_per_s,
            s.inference_timeout_s,
            s.queued_per_user,
        )

    def admitted(self, size: int = 0, user: str | None = None) -> Any:
        """`async with pipeline.admitted(len(body), user):` one in-flight slot, after a bounded wait for it, or 503."""
        assert self._limits is not None, "configure() first"
        self.evidence.ensure_flusher()
        return self.admission.admitted(self._limits, size, user)

    # -- classification --------------------------------------------------------------

    async def classify(
        self, choice: Choice, images: list[bytes], top_k: int, received: float, full: bool = False
    ) -> Outcome:
        """Encoded images through the coalescer, Preprocessor and Classifier (with failover and shadowing)."""
        assert self.settings is not None
        key = (choice.variant, choice.reason in ("override", "model"), full)
        left = received + self.settings.inference_timeout_s - time.perf_counter()
        try:  # each request keeps its own deadline, whatever group it rides in
            outcome: Outcome = await asyncio.wait_for(
                self.coalescer.submit(key, images, Ask(choice, top_k, received, full)), max(left, 0.001)
            )
        except asyncio.TimeoutError:
            raise ServiceError("inference_timeout", deadline_message(left), choice.variant) from None
        return outcome

    async def classify_pixels(
        self, choice: Choice, pixels: Pixels, top_k: int, received: float, full: bool = False
    ) -> Outcome:
        """Ready pixels (a V2 tensor) straight to the Classifier."""
        return await self.runs.pixels(choice, pixels, top_k, received, full)
