"""The Open Inference Protocol (KServe V2) over REST: the same limits, A/B policy, pipeline and status table.

The codec (paths, tensors, metadata, the protocol's error shape) is app/protocol/v2.py; this is the handler side.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
from starlette.requests import Request
from starlette.responses import Response

from app import __version__
from app.errors import ServiceError
from app.http import reading
from app.http.ingress import Ingress
from app.http.replies import json_response
from app.imaging.payloads import Pixels
from app.pipeline.cascade import escalate
from app.pipeline.routing import Choice
from app.pipeline.service import Outcome, ms
from app.protocol import v2, v2_config
from app.protocol.parse_pool import parse_request
from app.request.body import check_encoding
from app.runtime.outputs import probabilities as as_probabilities

logger = logging.getLogger("ray.serve")
ENDPOINT = "/v2/infer"
Params = dict[str, str]


class V2:
    def __init__(self, ingress: Ingress) -> None:
        self.ing = ingress
        self.handlers: dict[str, Callable[[Request, Params], Awaitable[Response]]] = {
            "server_metadata": self.server_metadata,
            "server_live": self.server_live,
            "server_ready": self.server_ready,
            "model_ready": self.model_ready,
            "model_metadata": self.model_metadata,
            "model_config": self.model_config,
            "model_stats": self.model_stats,
            "infer": self.infer,
        }
        ingress.v2 = self.dispatch

    async def dispatch(self, request: Request, path: str) -> Response:
        t0, name, params = time.perf_counter(), "", Params()
        try:
            matched = v2.match_v2_path(request.method, path)
            if matched is None:
                raise ServiceError("not_found", f"no route {request.url.path}")
            name, params = matched
            return await self.handlers[name](request, params)
        except ServiceError as e:
            self.record_failure(e, params.get("model", "") if name == "infer" else "", time.perf_counter() - t0)
            return self.ing.replies.v2_error(e)
        except Exception as e:  # a bug, not an input's fault: counted like every other error
            logger.exception("unhandled error on %s %s", request.method, path)
            return self.ing.replies.v2_error(ServiceError("internal_error", f"internal error ({type(e).__name__})"))

    def record_failure(self, e: ServiceError, model: str, elapsed_s: float) -> None:
        """A failed request in the A/B evidence (a variant's own failure) and in Triton's statistics (a known model)."""
        stats = self.ing.pipeline.evidence.stats
        if e.status >= 500 and e.variant:  # a variant's failure counts against it in the A/B evidence
            stats.record_request(e.variant, 0.0, ok=False)
        if model in v2.model_names(self.ing.args.model.name, self.ing.variants):
            stats.models.failure(model, elapsed_s)

    async def server_metadata(self, request: Request, params: Params) -> Response:
        return json_response(v2.server_metadata(__version__))

    async def server_live(self, request: Request, params: Params) -> Response:
        return Response(status_code=200)

    async def server_ready(self, request: Request, params: Params) -> Response:
        await self._require_ready(self.ing.variants)
        return Response(status_code=200)

    def _pinned(self, params: Params) -> str | None:
        return self.pin(params["model"], params.get("version") or None)

    def pin(self, model: str, version: str | None) -> str | None:
        """The variant a V2 model name pins (None: A/B routed); 404 for an unknown name or version."""
        return v2.resolve_model(model, self.ing.args.model.name, self.ing.variants, version)

    async def model_ready(self, request: Request, params: Params) -> Response:
        pinned = self._pinned(params)
        await self._require_ready([pinned] if pinned else self.ing.variants)
        return Response(status_code=200)

    async def model_metadata(self, request: Request, params: Params) -> Response:
        return json_response(await self.metadata_of(params["model"], params.get("version") or None))

    async def metadata_of(self, model: str, version: str | None) -> dict[str, Any]:
        """The protocol's model metadata of one V2 model (REST and gRPC alike)."""
        spec = await self.ing.pipeline.spec(self.pin(model, version) or self.ing.variants[0])
        return v2.model_metadata(model, [v2.DEFAULT_VERSION], spec, spec.get("classes"))

    async def model_config(self, request: Request, params: Params) -> Response:
        return json_response(await self.config_of(params["model"], params.get("version") or None))

    async def config_of(self, model: str, version: str | None) -> dict[str, Any]:
        """Triton's model configuration of one V2 model (app/protocol/v2_config.py); the A/B model's is its first
        variant's."""
        ing = self.ing
        variant = self.pin(model, version) or ing.variants[0]
        spec = await ing.pipeline.spec(variant)
        described = await ing.pipeline.ask(ing.pipeline.backend.describe(variant), 5.0)
        return v2_config.model_config(model, spec, spec.get("classes"), ing.limits.max_batch_files, described)

    async def model_stats(self, request: Request, params: Params) -> Response:
        return json_response(await self.stats_of(params.get("model") or None, params.get("version") or None))

    async def stats_of(self, model: str | None, version: str | None) -> dict[str, Any]:
        """Triton's statistics of one V2 model, or of every one: the ledger's totals and this Router's unsent part."""
        ing = self.ing
        names = list(v2.model_names(ing.args.model.name, ing.variants))
        if model is not None:
            self.pin(model, version)  # 404 for an unknown name or version
            names = [model]
        pipeline = ing.pipeline
        table = await pipeline.ask(pipeline.backend.ledger_model_stats(), 5.0)
        table.merge(pipeline.evidence.stats.models)
        return table.triton(names, v2.DEFAULT_VERSION)

    async def _require_ready(self, variants: list[str]) -> None:
        detail = await self.ing.pipeline.ready(variants)
        down = [v for v, ok in detail.items() if not ok]
        if down:
            raise ServiceError("not_ready", f"variants not ready: {down}")

    async def infer(self, request: Request, params: Params) -> Response:
        ing, t0 = self.ing, time.perf_counter()
        pinned = self._pinned(params)
        # Everything the headers can refuse is refused before the body is read.
        header_length = v2.parse_header_length(request.headers.get(v2.HEADER_LENGTH))
        encoding = request.headers.get("content-encoding")
        compressed = check_encoding(encoding)
        json_limit, body_limit = ing.limits.max_json_bytes, ing.limits.max_body_bytes
        if header_length is not None and header_length > json_limit:
            raise ServiceError(
                "payload_too_large", f"{v2.HEADER_LENGTH} is {header_length}; the JSON limit is {json_limit} bytes"
            )
        raw = await ing.receive(request, json_limit if header_length is None and not compressed else body_limit)
        pipeline = ing.pipeline
        received = time.perf_counter()  # the deadline runs from the body's arrival, a wait for admission included
        model = v2.model_name_for(ing.args.model.name, pinned)
        async with pipeline.admitted(len(raw), ing.user(request)):
            choice = ing.choose(request, pinned)
            body = await ing.inflate(raw, encoding, json_limit if header_length is None else body_limit)
            spec = await pipeline.spec(choice.variant)
            remaining = received + ing.config.inference_timeout_s - time.perf_counter()
            req = await parse_request(ing.parsers, body, header_length, ing.limits, v2.image_shape(spec), remaining)
            outcome = await self.run(req, choice, received)
        encoded_from = time.perf_counter()
        outputs, parameters = await self.outputs(req, outcome)
        out, headers = v2.build_infer_response(
            model, v2.DEFAULT_VERSION, req.id, outputs, req.binary_outputs, parameters
        )
        reply_headers = self.account(ENDPOINT, model, req, outcome, t0, encoded_from)
        return Response(out, headers={**headers, **reply_headers})

    async def run(self, req: v2.InferRequest, choice: Choice, received: float) -> Outcome:
        """A parsed request through the pipeline (REST and gRPC alike); the caller holds its admission."""
        ing, pipeline = self.ing, self.ing.pipeline
        full = req.needs_logits or req.needs_probabilities
        if req.images is not None:
            target = (await pipeline.transform(choice.variant)).decode_target
            refused, pixels = reading.check_images(req.images, ing.limits, target)
            ing.observe_pixels(pixels)
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

    async def outputs(self, req: v2.InferRequest, outcome: Outcome) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """The requested output tensors and the response parameters (which variant answered, and why)."""
        logits = outcome.logits
        kind = self.ing.args.model.output
        probabilities = as_probabilities(logits, kind) if req.needs_probabilities and logits is not None else None
        outputs = v2.compute_outputs(
            req,
            await self.ing.pipeline.labels(),
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
        """An answered request (REST or gRPC) in the A/B evidence, Triton's statistics and the metrics; the headers
        a success carries. t0: the request's start; encoded_from: when encoding the reply began."""
        done = time.perf_counter()
        timings = {**outcome.timings(), "total": ms(done - t0)}
        stats = self.ing.pipeline.evidence.stats
        stats.record_request(outcome.variant, timings["total"], ok=True)
        stats.models.success(  # app/pipeline/inferstats.py says how the timings map
            model,
            req.batch_size,
            int(time.time() * 1000),
            total_s=done - t0,
            queue_s=outcome.queue_ms / 1000,
            input_s=outcome.preprocess_ms / 1000,
            infer_s=outcome.inference_ms / 1000,
            output_s=done - encoded_from,
        )
        return self.ing.replies.success(endpoint, outcome.variant, timings)
