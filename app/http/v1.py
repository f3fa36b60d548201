"""The v1 JSON API: /v1/classify, /v1/classify/batch, /v1/models, /v1/ab/*, /healthz, /readyz."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import Response

from app.errors import ServiceError, find_service_error
from app.http import inputs
from app.http.context import RouterContext
from app.http.front_report import FrontReport
from app.http.replies import model_response, state_response
from app.http.report import RouterReport
from app.pipeline.group_run import Outcome, ms
from app.protocol import v1
from app.tracing import spans

if TYPE_CHECKING:  # a type only: the Router's metrics are made and handed in by the deployment
    pass

logger = logging.getLogger("ray.serve")
SINGLE, BATCH = "/v1/classify", "/v1/classify/batch"


def _score(p: float) -> float:
    """A probability to 6 digits, within [0, 1]: a graph declared `output: probabilities` may overshoot by a
    rounding error (1.0000005), which the reply's schema would refuse."""
    return min(1.0, max(0.0, round(p, 6)))


def _trace_field() -> str:
    """` trace_id=<hex>` for the log line of a recorded request: the line, its reply's traceparent and its trace find
    each other."""
    if not spans.ENABLED:
        return ""
    tid = spans.trace_id()
    return f" trace_id={tid}" if tid else ""


class V1:
    def __init__(
        self,
        ctx: RouterContext,
        report: RouterReport,
        front: FrontReport,
        serve_request_id: Callable[[], str | None],
    ) -> None:
        """report: this Router replica's state for /v1/models; front: the admission fronts its requests came
        through; serve_request_id: Serve's id of the request being handled."""
        self.args, self.limits, self.variants = ctx.args, ctx.limits, ctx.variants
        self.pipeline, self.policy, self.bodies = ctx.pipeline, ctx.policy, ctx.bodies
        self.replies, self.metrics = ctx.replies, ctx.metrics
        self.report = report
        self.front = front
        self.serve_request_id = serve_request_id

    # -- classification ----------------------------------------------------------------

    async def classify(self, request: Request) -> Response:
        return await self._classify(request, batch=False)

    async def classify_batch(self, request: Request) -> Response:
        return await self._classify(request, batch=True)

    async def _classify(self, request: Request, batch: bool) -> Response:
        """Both endpoints: check, read the body, then (admitted) the header pre-check and the pipeline."""
        t0, pipeline, limits = time.perf_counter(), self.pipeline, self.limits
        endpoint = BATCH if batch else SINGLE
        head = inputs.v1_head(
            batch, request.headers, request.query_params.get("top_k"), self.serve_request_id(), limits
        )
        top_k, rid = head.top_k, head.request_id
        raw = await self.bodies.receive(request)  # admission counts the request only once its body is here
        received = time.perf_counter()  # the request's deadline runs from here, a wait for admission included
        async with pipeline.admitted(len(raw), self.policy.user(request.headers)):
            images = inputs.v1_images(raw, head, limits)
            choice = self.policy.choose(request.headers)
            # The header pre-check on every image; a refused one fails only its own entry.
            refused, pixels = inputs.check_images(images, limits, pipeline.specs.known_target(choice.variant))
            self.metrics.observe_pixels(pixels)
            sent = [i for i in range(len(images)) if i not in refused]
            if not batch and refused:
                raise refused[0]
            outcome = Outcome(choice.variant, choice.reason, False, {}, {})
            labels: list[str] = []
            try:
                if sent:
                    outcome = await pipeline.classify(choice, [images[i] for i in sent], top_k, received)
                    labels = await pipeline.specs.labels()  # fetched once, with the first answer
            except ServiceError as e:
                return self._failed(endpoint, rid, e, e.variant or choice.variant)
        timings = {"receive": ms(received - t0), **outcome.timings(), "total": ms(time.perf_counter() - t0)}
        if not batch and outcome.errors:
            return self._failed(endpoint, rid, outcome.errors[0], outcome.variant)
        took = v1.RequestTimings(**timings, batch_size=outcome.batch_size)
        body: v1.ClassifyResponse | v1.BatchResponse
        if batch:
            entries: dict[int, v1.BatchEntry | v1.BatchEntryError] = {
                i: self._entry_error(endpoint, err) for i, err in refused.items()
            }
            entry_timings = v1.EntryTimings(**outcome.timings(), batch_size=outcome.batch_size)
            for pos, i in enumerate(sent):
                if pos in outcome.errors:
                    entries[i] = self._entry_error(endpoint, outcome.errors[pos])
                else:
                    fields = self._classification(outcome, pos, f"{rid}-{i}", top_k, labels)
                    entries[i] = v1.BatchEntry(**fields, timings_ms=entry_timings)
            results = [entries[i] for i in range(len(images))]
            body = v1.BatchResponse(request_id=rid, variant=outcome.variant, results=results, timings_ms=took)
        else:
            body = v1.ClassifyResponse(**self._classification(outcome, 0, rid, top_k, labels), timings_ms=took)
        pipeline.evidence.stats.record_request(outcome.variant, timings["total"], ok=True)  # the reply is built
        logger.info(
            "classify request_id=%s variant=%s status=200 total_ms=%.1f%s",
            rid,
            outcome.variant,
            timings["total"],
            _trace_field(),
        )
        return model_response(body, headers=self.replies.success(endpoint, outcome.variant, timings))

    def _failed(self, endpoint: str, rid: str, e: ServiceError, variant: str) -> Response:
        if e.status >= 500:
            self.pipeline.evidence.stats.record_request(variant, 0.0, ok=False)
        logger.info(
            "classify request_id=%s variant=%s status=%d code=%s%s", rid, variant, e.status, e.code, _trace_field()
        )
        return self.replies.error(endpoint, e, variant)

    def _entry_error(self, endpoint: str, err: ServiceError) -> v1.BatchEntryError:
        self.metrics.entry_error(endpoint, err.code)
        return v1.BatchEntryError(error=v1.ErrorDetail(code=err.code, message=err.message), status=err.status)

    def _classification(self, o: Outcome, pos: int, rid: str, top_k: int, labels: list[str]) -> dict[str, Any]:
        """What a single reply and a batch entry share, for the image at `pos` of the outcome."""
        cascade = o.cascade_reply(pos)
        return {
            "request_id": rid,
            "variant": o.variant,
            "model": self.args.model.name,
            "predictions": [
                v1.Prediction(class_id=c, label=labels[c] if c < len(labels) else f"class_{c}", score=_score(p))
                for c, p in o.top[pos][:top_k]
            ],
            "routing": o.routing,
            "failover": o.failed_over,
            "cascade": None if cascade is None else v1.CascadeReply(**cascade),
        }

    # -- state ---------------------------------------------------------------------------

    async def healthz(self, request: Request) -> Response:
        return model_response(v1.Health(status="ok"))

    async def readyz(self, request: Request) -> Response:
        detail = await self.pipeline.specs.ready(self.variants)
        if all(detail.values()):
            return model_response(v1.Ready(status="ready", variants=detail))
        err = ServiceError("not_ready", f"variants not ready: {sorted(v for v, ok in detail.items() if not ok)}")
        body = v1.NotReadyBody(error=v1.ErrorDetail(code=err.code, message=err.message), variants=detail)
        return model_response(body, err.status, err.headers())

    async def models(self, request: Request) -> Response:
        cfg, split, pipeline, args = self.policy.config, self.policy.split, self.pipeline, self.args
        assert split is not None
        described = await asyncio.gather(
            *(pipeline.specs.ask(pipeline.backend.describe(v), 5.0) for v in self.variants), return_exceptions=True
        )
        variants = {}
        for v, d in zip(self.variants, described, strict=True):
            info = d if isinstance(d, dict) else {"error": str(find_service_error(d) or type(d).__name__)}
            variants[v] = {
                "deployment": f"Classifier_{v}",
                "weight": cfg.weights.get(v, 0.0),
                "traffic_fraction": split.fractions.get(v, 0.0),
                "description": args.variants[v].description,
                **info,
            }
        routing = {
            k: getattr(cfg, k)
            for k in (
                "sticky_header",
                "override_header",
                "allow_override",
                "failover",
                "inference_timeout_s",
                "shadow_fraction",
            )
        }
        summary = self.report.summary()
        for name, c in summary["cascades"].items():
            share = {"weight": cfg.weights.get(name, 0.0), "traffic_fraction": split.fractions.get(name, 0.0)}
            c |= {**share, "description": args.cascades[name].description}
        body = {
            "model": args.model.name,
            "declaration": args.model.model_dump(),
            "variants": variants,
            "routing": routing,
            "limits": self.limits.model_dump(),
            "ingress": self.front.ingress,
            "admission_front": self.front.describe(),
            **summary,
        }
        return state_response(v1.ModelsResponse, body)

    async def ab_summary(self, request: Request) -> Response:
        pipeline = self.pipeline
        await pipeline.evidence.flush()
        summary = await pipeline.specs.ask(pipeline.backend.ledger_summary(), 10.0)
        if pipeline.cascades.states:  # their evidence is the ledger's too: the thresholds as of this moment
            await self.policy.refit_cascades()
            summary["cascades"] = pipeline.cascades.describe(with_curve=True)
        body = {"model": self.args.model.name, "serving": await self._serving(), **summary}
        return state_response(v1.ABSummary, body)

    async def _serving(self) -> dict[str, dict[str, Any]]:
        """Each variant's build as its replica says it runs (a fallback in force included); nulls if it did not
        answer within 5 s."""
        pipeline = self.pipeline
        described = await asyncio.gather(
            *(pipeline.specs.ask(pipeline.backend.describe(v), 5.0) for v in self.variants), return_exceptions=True
        )
        out = {}
        for v, d in zip(self.variants, described, strict=True):
            d = d if isinstance(d, dict) else {}
            fallback = d.get("fallback") or {}
            out[v] = {k: d.get(k) for k in ("precision", "requested_precision", "engine", "execution_provider")} | {
                "fallback_reason": fallback.get("reason")
            }
        return out

    async def ab_reset(self, request: Request) -> Response:
        """Zero the A/B counters (POST /v1/ab/reset); returns the summary as it was."""
        pipeline = self.pipeline
        pipeline.evidence.reset()  # this replica's unflushed counts go too
        before = await pipeline.specs.ask(pipeline.backend.ledger_reset(), 10.0)
        return state_response(v1.ABReset, {"reset": True, "before": before})
