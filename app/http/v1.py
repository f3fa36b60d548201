"""The v1 JSON API: /v1/classify, /v1/classify/batch, /v1/models, /v1/ab/*, /healthz, /readyz."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from app.errors import ServiceError, find_service_error
from app.http import reading
from app.http.ingress import Ingress
from app.http.replies import json_response
from app.pipeline.service import Outcome, ms

logger = logging.getLogger("ray.serve")
SINGLE, BATCH = "/v1/classify", "/v1/classify/batch"


class V1:
    def __init__(self, ingress: Ingress) -> None:
        self.ing = ingress
        ingress.routes.update(
            {
                ("POST", SINGLE): self.classify,
                ("POST", BATCH): self.classify_batch,
                ("GET", "/v1/models"): self.models,
                ("GET", "/v1/ab/summary"): self.ab_summary,
                ("POST", "/v1/ab/reset"): self.ab_reset,
                ("GET", "/healthz"): self.healthz,
                ("GET", "/readyz"): self.readyz,
            }
        )
        ingress.admin_routes.add(("POST", "/v1/ab/reset"))

    # -- classification ----------------------------------------------------------------

    async def classify(self, request: Request) -> Response:
        return await self._classify(request, batch=False)

    async def classify_batch(self, request: Request) -> Response:
        return await self._classify(request, batch=True)

    async def _classify(self, request: Request, batch: bool) -> Response:
        """Both endpoints: check, read the body, then (admitted) the header pre-check and the pipeline."""
        ing, t0 = self.ing, time.perf_counter()
        endpoint = BATCH if batch else SINGLE
        top_k = reading.top_k(request.query_params.get("top_k"), ing.limits)
        content_type = request.headers.get("content-type")
        if batch:
            reading.check_batch_media(content_type)
        else:
            reading.check_single_media(content_type)
        raw = await ing.receive(request)  # admission counts the request only once its body is here
        received = time.perf_counter()  # the request's deadline runs from here, a wait for admission included
        async with ing.pipeline.admitted(len(raw), ing.user(request)):
            rid = ing.request_id(request)
            if batch:
                images = reading.multipart_images(raw, content_type or "", ing.limits.max_batch_files)
            else:
                images = [reading.single_image(raw, content_type)]
            choice = ing.choose(request)
            # The header pre-check on every image; a refused one fails only its own entry.
            refused, pixels = reading.check_images(images, ing.limits, ing.pipeline.known_target(choice.variant))
            ing.observe_pixels(pixels)
            sent = [i for i in range(len(images)) if i not in refused]
            if not batch and refused:
                raise refused[0]
            outcome = Outcome(choice.variant, choice.reason, False, {}, {})
            labels: list[str] = []
            try:
                if sent:
                    outcome = await ing.pipeline.classify(choice, [images[i] for i in sent], top_k, received)
                    labels = await ing.pipeline.labels()  # fetched once, with the first answer
            except ServiceError as e:
                return self._failed(endpoint, rid, e, e.variant or choice.variant)
        timings = {"receive": ms(received - t0), **outcome.timings(), "total": ms(time.perf_counter() - t0)}
        if not batch and outcome.errors:
            return self._failed(endpoint, rid, outcome.errors[0], outcome.variant)
        results: list[dict[str, Any]] = [{} for _ in images]
        for i, err in refused.items():
            results[i] = self._entry_error(endpoint, err)
        for pos, i in enumerate(sent):
            if pos in outcome.errors:
                results[i] = self._entry_error(endpoint, outcome.errors[pos])
            else:
                results[i] = self._result(outcome, pos, f"{rid}-{i}" if batch else rid, top_k, labels)
        ing.pipeline.evidence.stats.record_request(outcome.variant, timings["total"], ok=True)
        logger.info(
            "classify request_id=%s variant=%s status=200 total_ms=%.1f", rid, outcome.variant, timings["total"]
        )
        body: dict[str, Any]
        if batch:
            body = {
                "request_id": rid,
                "variant": outcome.variant,
                "results": results,
                "timings_ms": {**timings, "batch_size": outcome.batch_size},
            }
        else:
            body = results[0]
            body["timings_ms"] = {**timings, "batch_size": outcome.batch_size}
        return json_response(body, headers=ing.replies.success(endpoint, outcome.variant, timings))

    def _failed(self, endpoint: str, rid: str, e: ServiceError, variant: str) -> Response:
        if e.status >= 500:
            self.ing.pipeline.evidence.stats.record_request(variant, 0.0, ok=False)
        logger.info("classify request_id=%s variant=%s status=%d code=%s", rid, variant, e.status, e.code)
        return self.ing.replies.error(endpoint, e, variant)

    def _entry_error(self, endpoint: str, err: ServiceError) -> dict[str, Any]:
        self.ing.metrics.errors.inc(tags={"endpoint": endpoint, "code": err.code})
        return {**err.body(), "status": err.status}

    def _result(self, o: Outcome, pos: int, rid: str, top_k: int, labels: list[str]) -> dict[str, Any]:
        body: dict[str, Any] = {
            "request_id": rid,
            "variant": o.variant,
            "model": self.ing.args.model.name,
            "predictions": [
                {"class_id": c, "label": labels[c] if c < len(labels) else f"class_{c}", "score": round(p, 6)}
                for c, p in o.top[pos][:top_k]
            ],
            "routing": o.routing,
            "timings_ms": {**o.timings(), "batch_size": o.batch_size},
        }
        if o.failed_over:
            body["failover"] = True
        cascade = o.cascade_reply(pos)
        if cascade is not None:
            body["cascade"] = cascade
        return body

    # -- state ---------------------------------------------------------------------------

    async def healthz(self, request: Request) -> Response:
        return json_response({"status": "ok"})

    async def readyz(self, request: Request) -> Response:
        detail = await self.ing.pipeline.ready(self.ing.variants)
        if all(detail.values()):
            return json_response({"status": "ready", "variants": detail})
        err = ServiceError("not_ready", f"variants not ready: {sorted(v for v, ok in detail.items() if not ok)}")
        return json_response({**err.body(), "variants": detail}, err.status, err.headers())

    async def models(self, request: Request) -> Response:
        ing = self.ing
        cfg, split, pipeline = ing.config, ing.split, ing.pipeline
        assert split is not None
        described = await asyncio.gather(
            *(pipeline.ask(pipeline.backend.describe(v), 5.0) for v in ing.variants), return_exceptions=True
        )
        variants = {}
        for v, d in zip(ing.variants, described, strict=True):
            info = d if isinstance(d, dict) else {"error": str(find_service_error(d) or type(d).__name__)}
            variants[v] = {
                "deployment": f"Classifier_{v}",
                "weight": cfg.weights.get(v, 0.0),
                "traffic_fraction": split.fractions.get(v, 0.0),
                "description": ing.args.variants[v].description,
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
        summary = ing.summary()
        for name, c in summary["cascades"].items():
            share = {"weight": cfg.weights.get(name, 0.0), "traffic_fraction": split.fractions.get(name, 0.0)}
            c |= {**share, "description": ing.args.cascades[name].description}
        return json_response(
            {
                "model": ing.args.model.name,
                "declaration": ing.args.model.model_dump(),
                "variants": variants,
                "routing": routing,
                "limits": ing.limits.model_dump(),
                "admission_front": ing.front.describe(),
                **summary,
            }
        )

    async def ab_summary(self, request: Request) -> Response:
        ing, pipeline = self.ing, self.ing.pipeline
        await pipeline.evidence.flush()
        summary = await pipeline.ask(pipeline.backend.ledger_summary(), 10.0)
        if pipeline.cascades.states:  # their evidence is the ledger's too: the thresholds as of this moment
            await ing.refit_cascades()
            summary["cascades"] = pipeline.cascades.describe(with_curve=True)
        return json_response({"model": ing.args.model.name, **summary})

    async def ab_reset(self, request: Request) -> Response:
        """Zero the A/B counters (POST /v1/ab/reset); returns the summary as it was."""
        pipeline = self.ing.pipeline
        pipeline.evidence.reset()  # this replica's unflushed counts go too
        return json_response({"reset": True, "before": await pipeline.ask(pipeline.backend.ledger_reset(), 10.0)})
