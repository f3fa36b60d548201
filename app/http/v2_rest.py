"""The Open Inference Protocol (KServe V2) over REST: each request decoded, handed to the protocol's operations (the
same as gRPC's), and its answer encoded; errors in the protocol's flat shape. The codec (paths, tensors, metadata,
the protocol's error shape) is app.protocol.v2.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import Response

from app import __version__
from app.errors import ServiceError
from app.http.context import RouterContext
from app.http.replies import json_response
from app.http.route import Route
from app.http.v2_dataplane import V2DataPlane
from app.protocol import v2
from app.protocol.v2.parse_pool import parse_request
from app.request.body_gate import check_encoding
from app.tracing import spans

if TYPE_CHECKING:
    from app.protocol.paths import PathTable
    from app.protocol.v2.parse_pool import ParsePool

logger = logging.getLogger("ray.serve")
ENDPOINT = "/v2/infer"
Params = dict[str, str]


class V2:
    def __init__(self, ctx: RouterContext, ops: V2DataPlane, parsers: ParsePool) -> None:
        """ops: the protocol's operations (shared with gRPC); parsers: where large JSON bodies are parsed."""
        self.limits, self.policy, self.bodies, self.replies = ctx.limits, ctx.policy, ctx.bodies, ctx.replies
        self.ops = ops
        self.parsers = parsers

    async def dispatch(self, request: Request, path: str, routes: PathTable[Route]) -> Response:
        """A /v2 request to the handler of its route in the table, errors in the protocol's shape."""
        t0, name, params = time.perf_counter(), "", Params()
        try:
            matched = v2.match_v2_path(request.method, path, routes)
            if matched is None:
                raise ServiceError("not_found", f"no route {request.url.path}")
            route, params = matched
            name = route.name
            spans.name_route(request.method, route.path)
            return await route.handler(request, params)
        except ServiceError as e:
            self.ops.record_failure(e, params.get("model", "") if name == "infer" else "", time.perf_counter() - t0)
            return self.replies.v2_error(e)
        except Exception as e:  # a bug, not an input's fault: counted like every other error
            logger.exception("unhandled error on %s %s", request.method, path)
            return self.replies.v2_error(ServiceError("internal_error", f"internal error ({type(e).__name__})"))

    async def server_metadata(self, request: Request, params: Params) -> Response:
        return json_response(v2.server_metadata(__version__))

    async def server_live(self, request: Request, params: Params) -> Response:
        return json_response(v2.server_live())

    async def server_ready(self, request: Request, params: Params) -> Response:
        return await self._ready(None, None)

    async def model_ready(self, request: Request, params: Params) -> Response:
        return await self._ready(params["model"], params.get("version") or None)

    async def _ready(self, model: str | None, version: str | None) -> Response:
        """200 with the protocol's readiness body; 503 `not_ready` with `"ready": false` beside the error (an
        unknown model is 404, raised by the pin)."""
        down = await self.ops.ready(model, version)
        if down:
            err = ServiceError("not_ready", f"variants not ready: {down}")
            return self.replies.v2_error(err, v2.readiness(False, model))
        return json_response(v2.readiness(True, model))

    async def model_metadata(self, request: Request, params: Params) -> Response:
        return json_response(await self.ops.metadata(params["model"], params.get("version") or None))

    async def model_config(self, request: Request, params: Params) -> Response:
        return json_response(await self.ops.config(params["model"], params.get("version") or None))

    async def model_stats(self, request: Request, params: Params) -> Response:
        return json_response(await self.ops.statistics(params.get("model") or None, params.get("version") or None))

    async def infer(self, request: Request, params: Params) -> Response:
        t0 = time.perf_counter()
        pinned = self.ops.pin(params["model"], params.get("version") or None)  # an unknown model: 404 before its body
        # Everything the headers can refuse is refused before the body is read.
        header_length = v2.parse_header_length(request.headers.get(v2.HEADER_LENGTH))
        encoding = request.headers.get("content-encoding")
        compressed = check_encoding(encoding)
        json_limit, body_limit = self.limits.max_json_bytes, self.limits.max_body_bytes
        if header_length is not None and header_length > json_limit:
            raise ServiceError(
                "payload_too_large", f"{v2.HEADER_LENGTH} is {header_length}; the JSON limit is {json_limit} bytes"
            )
        raw = await self.bodies.receive(request, json_limit if header_length is None and not compressed else body_limit)
        received = time.perf_counter()  # the deadline runs from the body's arrival, a wait for admission included
        ops = self.ops
        async with ops.admitted(len(raw), request.headers):
            choice = ops.choose(request.headers, pinned)
            body = await self.bodies.inflate(raw, encoding, json_limit if header_length is None else body_limit)
            shape = await ops.image_shape(choice)  # after the body is undone: a bad encoding costs no backend call
            remaining = received + self.policy.config.inference_timeout_s - time.perf_counter()
            req = await parse_request(self.parsers, body, header_length, self.limits, shape, remaining)
            outcome = await ops.run(req, choice, received)
        encoded_from = time.perf_counter()
        outputs, parameters = await ops.outputs(req, outcome)
        name = ops.model_name(pinned)
        out, headers = v2.build_infer_response(
            name, v2.DEFAULT_VERSION, req.id, outputs, req.binary_outputs, parameters
        )
        reply = Response(out, headers=headers)
        reply.headers.update(ops.account(ENDPOINT, name, req, outcome, t0, encoded_from))
        return reply
