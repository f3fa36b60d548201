"""The Open Inference Protocol's operations over the pipeline, whatever the transport: its data plane.

REST's and gRPC's handlers each decode their message, call the operations here, and encode what they return. An
inference is, for both and in this order: the model name's pin, admission, the A/B choice from the routing headers
(gRPC metadata for gRPC), the transport's parse of the tensors, the pipeline, the requested outputs, the transport's
encoding, then the A/B evidence, Triton's statistics and the Router's metrics (`account`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any

import numpy as np

from app.errors import ServiceError
from app.http import inputs
from app.http.context import RouterContext
from app.imaging.payloads import Pixels
from app.pipeline.cascade_rule import escalate
from app.pipeline.group_run import Outcome, ms
from app.pipeline.routing import Choice
from app.protocol import v2
from app.protocol.v2 import triton_config
from app.served_model.outputs import probabilities as as_probabilities

if TYPE_CHECKING:
    pass

Outputs = dict[str, np.ndarray]


class V2DataPlane:
    def __init__(self, ctx: RouterContext) -> None:
        self.args, self.limits, self.variants = ctx.args, ctx.limits, ctx.variants
        self.pipeline, self.policy = ctx.pipeline, ctx.policy
        self.replies, self.metrics = ctx.replies, ctx.metrics

    # -- health, metadata, statistics ----------------------------------------------------

    def pin(self, model: str, version: str | None) -> str | None:
        """The variant a V2 model name pins (None: A/B routed); 404 for an unknown name or version."""
        return v2.resolve_model(model, self.args.model.name, self.variants, version)

    async def ready(self, model: str | None = None, version: str | None = None) -> list[str]:
        """The variants behind the server (model None) or behind one model that are not ready now."""
        pinned = self.pin(model, version) if model is not None else None
        detail = await self.pipeline.specs.ready([pinned] if pinned else self.variants)
        return [v for v, ok in detail.items() if not ok]

    async def metadata(self, model: str, version: str | None) -> dict[str, Any]:
        """The protocol's model metadata of one V2 model."""
        spec = await self.pipeline.specs.spec(self.pin(model, version) or self.variants[0])
        return v2.model_metadata(model, [v2.DEFAULT_VERSION], spec, spec.get("classes"))

    async def config(self, model: str, version: str | None) -> dict[str, Any]:
        """Triton's model configuration of one V2 model (`triton_config.model_config`); the A/B model's is its
        first variant's."""
        variant = self.pin(model, version) or self.variants[0]
        spec = await self.pipeline.specs.spec(variant)
        described = await self.pipeline.specs.ask(self.pipeline.backend.describe(variant), 5.0)
        return triton_config.model_config(model, spec, spec.get("classes"), self.limits.max_batch_files, described)

    async def statistics(self, model: str | None, version: str | None) -> dict[str, Any]:
        """Triton's statistics of one V2 model, or of every one: the ledger's totals and this Router's unsent part."""
        names = list(v2.model_names(self.args.model.name, self.variants))
        if model is not None:
            self.pin(model, version)  # 404 for an unknown name or version
            names = [model]
        table = await self.pipeline.specs.ask(self.pipeline.backend.ledger_model_stats(), 5.0)
        table.merge(self.pipeline.evidence.stats.models)
        return table.triton(names, v2.DEFAULT_VERSION)

    def record_failure(self, e: ServiceError, model: str, elapsed_s: float) -> None:
        """A failed request in the A/B evidence (a variant's own failure) and in Triton's statistics (a known model)."""
        stats = self.pipeline.evidence.stats
        if e.status >= 500 and e.variant:  # a variant's failure counts against it in the A/B evidence
            stats.record_request(e.variant, 0.0, ok=False)
        if model in v2.model_names(self.args.model.name, self.variants):
            stats.models.failure(model, elapsed_s)

    # -- inference: the steps a transport's handler takes in order ----------------------

    def model_name(self, pinned: str | None) -> str:
        """The V2 model name an answer carries: the A/B model's, or a pinned variant's."""
        return v2.model_name_for(self.args.model.name, pinned)

    def admitted(self, size: int, headers: Mapping[str, str]) -> AbstractAsyncContextManager[None]:
        """Admission for a request of `size` bytes from the caller its headers name; held while it is parsed and run."""
        return self.pipeline.admitted(size, self.policy.user(headers))

    def choose(self, headers: Mapping[str, str], pinned: str | None) -> Choice:
        """The variant that serves it: the pinned one, or the A/B choice from the routing headers."""
        return self.policy.choose(headers, pinned)

    async def image_shape(self, choice: Choice) -> tuple[int, int, int]:
        """The chosen variant's input image shape, which the transport's parse checks tensors against."""
        return v2.image_shape(await self.pipeline.specs.spec(choice.variant))

    async def run(self, req: v2.InferRequest, choice: Choice, received: float) -> Outcome:
        """A parsed request through the pipeline; the caller holds its admission. received: when its body was in
        (the deadline runs from there)."""
        pipeline = self.pipeline
        full = req.needs_logits or req.needs_probabilities
        if req.images is not None:
            target = (await pipeline.specs.transform(choice.variant)).decode_target
            refused, pixels = inputs.check_images(req.images, self.limits, target)
            self.metrics.observe_pixels(pixels)
            if refused:  # the protocol has no per-item errors: the first refusal fails the request
                raise refused[min(refused)]
            outcome = await pipeline.classify(choice, req.images, req.max_k, received, full)
        else:
            assert req.pixels is not None
            n = len(req.pixels)
            tensor = Pixels(np.ascontiguousarray(req.pixels), 0.0, {}, list(range(n)))
            outcome = await pipeline.classify_pixels(choice, tensor, req.max_k, received, full)
        if outcome.errors:  # the protocol has no per-item errors: the first bad image fails the request
            raise outcome.errors[min(outcome.errors)]
        return outcome

    async def outputs(self, req: v2.InferRequest, outcome: Outcome) -> tuple[Outputs, dict[str, Any]]:
        """The requested output tensors and the response parameters (which variant answered, and why)."""
        logits = outcome.logits
        kind = self.args.model.output
        probabilities = as_probabilities(logits, kind) if req.needs_probabilities and logits is not None else None
        outputs = v2.compute_outputs(
            req,
            await self.pipeline.specs.labels(),
            logits=logits,
            probabilities=probabilities,
            top=[outcome.top[i] for i in sorted(outcome.top)],
        )
        parameters: dict[str, Any] = {"variant": outcome.variant, "routing": outcome.routing}
        if outcome.failed_over:
            parameters["failover"] = True
        if outcome.cascade is not None and outcome.margins is not None:  # parameters are scalars: counts, not lists
            parameters["cascade_escalated"] = sum(e for e, _ in outcome.margins.values())
            parameters["cascade_threshold"] = outcome.cascade.threshold
            meant = any(escalate(m, outcome.cascade.threshold) for _, m in outcome.margins.values())
            if outcome.cascade.failed is not None and meant:  # this request had an image meant to go on
                parameters["cascade_escalation_failed"] = outcome.cascade.failed
        return outputs, parameters

    def account(
        self, endpoint: str, model: str, req: v2.InferRequest, outcome: Outcome, t0: float, encoded_from: float
    ) -> dict[str, str]:
        """An answered request in the A/B evidence, Triton's statistics and the metrics; the headers a success
        carries. t0: the request's start; encoded_from: when encoding the reply began."""
        done = time.perf_counter()
        timings = {**outcome.timings(), "total": ms(done - t0)}
        stats = self.pipeline.evidence.stats
        stats.record_request(outcome.variant, timings["total"], ok=True)
        stats.models.success(  # the statistics' module says how the timings map
            model,
            req.batch_size,
            int(time.time() * 1000),
            total_s=done - t0,
            queue_s=outcome.queue_ms / 1000,
            input_s=outcome.preprocess_ms / 1000,
            infer_s=outcome.inference_ms / 1000,
            output_s=done - encoded_from,
        )
        return self.replies.success(endpoint, outcome.variant, timings)
