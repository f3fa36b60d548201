"""The Open Inference Protocol (KServe V2) over REST: the same limits, A/B policy, pipeline and status table.

The codec (paths, tensors, metadata, the protocol's error shape) is app/v2.py; this is the handler side.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
from starlette.requests import Request
from starlette.responses import Response

from app import __version__, v2
from app.body import check_encoding
from app.errors import ServiceError
from app.http import reading
from app.http.ingress import Ingress
from app.http.replies import json_response
from app.parse_pool import parse_request
from app.payloads import Pixels
from app.pipeline.service import ms
from app.runtime.outputs import softmax

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
            "infer": self.infer,
        }
        ingress.v2 = self.dispatch

    async def dispatch(self, request: Request, path: str) -> Response:
        try:
            matched = v2.match_v2_path(request.method, path)
            if matched is None:
                raise ServiceError("not_found", f"no route {request.url.path}")
            name, params = matched
            return await self.handlers[name](request, params)
        except ServiceError as e:
            if e.status >= 500 and e.variant:  # a variant's failure counts against it in the A/B evidence
                self.ing.pipeline.evidence.stats.record_request(e.variant, 0.0, ok=False)
            return self.ing.replies.v2_error(e)
        except Exception as e:  # a bug, not an input's fault: counted like every other error
            logger.exception("unhandled error on %s %s", request.method, path)
            return self.ing.replies.v2_error(ServiceError("internal_error", f"internal error ({type(e).__name__})"))

    async def server_metadata(self, request: Request, params: Params) -> Response:
        return json_response(v2.server_metadata(__version__))

    async def server_live(self, request: Request, params: Params) -> Response:
        return Response(status_code=200)

    async def server_ready(self, request: Request, params: Params) -> Response:
        await self._require_ready(self.ing.variants)
        return Response(status_code=200)

    def _pinned(self, params: Params) -> str | None:
        ing = self.ing
        return v2.resolve_model(params["model"], ing.args.model_name, ing.variants, params.get("version") or None)

    async def model_ready(self, request: Request, params: Params) -> Response:
        pinned = self._pinned(params)
        await self._require_ready([pinned] if pinned else self.ing.variants)
        return Response(status_code=200)

    async def model_metadata(self, request: Request, params: Params) -> Response:
        pinned = self._pinned(params)
        spec = await self.ing.pipeline.spec(pinned or self.ing.variants[0])
        labels = len(self.ing.labels) or None
        return json_response(v2.model_metadata(params["model"], [v2.DEFAULT_VERSION], spec, labels))

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
        async with pipeline.admitted(len(raw), ing.user(request)):
            choice = ing.choose(request, pinned)
            body = await ing.inflate(raw, encoding, json_limit if header_length is None else body_limit)
            spec = await pipeline.spec(choice.variant)
            remaining = received + ing.config.inference_timeout_s - time.perf_counter()
            req = await parse_request(ing.parsers, body, header_length, ing.limits, v2.image_hw(spec), remaining)
            full = req.needs_logits or req.needs_probabilities
            if req.images is not None:
                size = await pipeline.input_size(choice.variant)
                refused, pixels = reading.check_images(req.images, ing.limits, size)
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
        logits = outcome.logits
        probabilities = softmax(logits) if req.needs_probabilities and logits is not None else None
        parameters: dict[str, Any] = {"variant": outcome.variant, "routing": outcome.routing}
        if outcome.failed_over:
            parameters["failover"] = True
        out, headers = v2.encode_infer_response(
            req,
            v2.model_name_for(ing.args.model_name, pinned),
            ing.labels,
            logits=logits,
            probabilities=probabilities,
            top=[outcome.top[i] for i in sorted(outcome.top)],
            parameters=parameters,
        )
        timings = {**outcome.timings(), "total": ms(time.perf_counter() - t0)}
        pipeline.evidence.stats.record_request(outcome.variant, timings["total"], ok=True)
        return Response(out, headers={**headers, **ing.replies.success(ENDPOINT, outcome.variant, timings)})
