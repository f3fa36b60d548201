"""The Open Inference Protocol over gRPC: each call decoded, handed to the protocol's operations (the same as REST's),
and its answer encoded; errors as the call's status.

`RPCS` is the one declaration of the gRPC methods: Serve's gRPC ingress (its proxy, or with HAProxy each Router
replica's own gRPC server) calls the Router's method named after the RPC with the request message and a
`grpc_context`, and the Router has one such method per entry, each handing both to `GRPC.call`. The messages and
their conversion are app.protocol.v2.grpc. What the REST endpoint does, this does in the same order with the same
objects: the model name's pin, the size limit, admission, the A/B choice from the routing headers (here gRPC
metadata, `x-user-id` and `x-model-variant` by default), the pipeline, Triton's statistics and the Router's metrics
(endpoint `grpc`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from starlette.datastructures import Headers

from app import __version__
from app.errors import ServiceError
from app.http.context import RouterContext
from app.http.v2_dataplane import V2DataPlane
from app.protocol import v2
from app.protocol.v2 import grpc as v2_grpc
from app.protocol.v2.pb import grpc_service_pb2 as pb
from app.tracing import spans

if TYPE_CHECKING:
    pass

logger = logging.getLogger("ray.serve")
ENDPOINT = "grpc"
SERVICE = "inference.GRPCInferenceService"
# The status codes a gRPC server span marks as its error (OpenTelemetry's RPC semantic conventions); the others are the
# caller's (an invalid argument, a resource exhausted).
SERVER_ERRORS = frozenset(("UNKNOWN", "DEADLINE_EXCEEDED", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS"))


def metadata_headers(context: Any) -> Headers:
    """The call's invocation metadata as case-insensitive headers (binary `-bin` entries left out)."""
    pairs = context.invocation_metadata() if context is not None else ()
    return Headers(raw=[(k.lower().encode(), v.encode()) for k, v in pairs or () if isinstance(v, str)])


class GRPC:
    def __init__(self, ctx: RouterContext, ops: V2DataPlane) -> None:
        self.limits, self.metrics = ctx.limits, ctx.metrics
        self.ops = ops

    async def call(self, method: str, msg: Any, context: Any) -> Any:
        """One RPC to its handler in RPCS: its answer, or an empty message with the error's status set on the
        context."""
        if spans.ENABLED:
            return await self._traced(method, msg, context)
        return await self._call(method, msg, context)

    async def _traced(self, method: str, msg: Any, context: Any) -> Any:
        """The RPC as a gRPC server span (OpenTelemetry's RPC conventions), a child of Serve's span or of the caller's
        `traceparent` metadata; a recorded one's traceparent goes back in the trailing metadata."""
        headers = metadata_headers(context)
        parent = spans.incoming(headers.get("traceparent"), headers.get("tracestate"))
        attributes = {"rpc.system": "grpc", "rpc.service": SERVICE, "rpc.method": method}
        span = spans.start(f"{SERVICE}/{method}", parent, "SERVER", attributes)
        try:
            with spans.use(span):
                reply = await self._call(method, msg, context)
        finally:
            code = context.code() if context is not None else None
            name = getattr(code, "name", "OK") if code is not None else "OK"
            spans.annotate({"rpc.grpc.status_code": code.value[0] if code is not None else 0}, span)
            if name in SERVER_ERRORS:
                spans.fail(span, name)
            header = spans.traceparent(span)
            if header is not None and context is not None:
                kept = [kv for kv in context.trailing_metadata() or () if kv[0] != "request_id"]
                context.set_trailing_metadata([*kept, ("traceparent", header)])
            span.end()
        return reply

    async def _call(self, method: str, msg: Any, context: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return await BY_NAME[method].handler(self, msg, metadata_headers(context))
        except ServiceError as e:
            return self._fail(method, msg, context, e, t0)
        except Exception as e:  # a bug, not an input's fault: counted like every other error
            logger.exception("unhandled error in gRPC %s", method)
            return self._fail(
                method, msg, context, ServiceError("internal_error", f"internal error ({type(e).__name__})"), t0
            )

    def _fail(self, method: str, msg: Any, context: Any, e: ServiceError, t0: float) -> Any:
        self.ops.record_failure(e, msg.model_name if method == "ModelInfer" else "", time.perf_counter() - t0)
        self.metrics.error(ENDPOINT, e.code, e.status, e.variant or "none")
        if spans.ENABLED:
            spans.annotate({"error.type": e.code, "app.variant": e.variant})
        if context is not None:
            code, details, trailing = v2_grpc.status_of(e)
            context.set_code(code)
            context.set_details(details)
            context.set_trailing_metadata(trailing)
        return BY_NAME[method].empty()

    # -- health and metadata -------------------------------------------------------------

    async def server_live(self, msg: pb.ServerLiveRequest, headers: Headers) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=True)

    async def server_ready(self, msg: pb.ServerReadyRequest, headers: Headers) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=not await self.ops.ready())

    async def model_ready(self, msg: pb.ModelReadyRequest, headers: Headers) -> pb.ModelReadyResponse:
        return pb.ModelReadyResponse(ready=not await self.ops.ready(msg.name, msg.version or None))

    async def server_metadata(self, msg: pb.ServerMetadataRequest, headers: Headers) -> pb.ServerMetadataResponse:
        return v2_grpc.server_metadata(v2.server_metadata(__version__))

    async def model_metadata(self, msg: pb.ModelMetadataRequest, headers: Headers) -> pb.ModelMetadataResponse:
        return v2_grpc.model_metadata(await self.ops.metadata(msg.name, msg.version or None))

    async def model_config(self, msg: pb.ModelConfigRequest, headers: Headers) -> pb.ModelConfigResponse:
        return v2_grpc.model_config(await self.ops.config(msg.name, msg.version or None))

    async def model_statistics(self, msg: pb.ModelStatisticsRequest, headers: Headers) -> pb.ModelStatisticsResponse:
        return v2_grpc.model_statistics(await self.ops.statistics(msg.name or None, msg.version or None))

    # -- inference -----------------------------------------------------------------------

    async def infer(self, msg: pb.ModelInferRequest, headers: Headers) -> pb.ModelInferResponse:
        t0 = time.perf_counter()
        ops = self.ops
        pinned = ops.pin(msg.model_name, msg.model_version or None)  # an unknown model: 404 before anything else
        size = v2_grpc.request_bytes(msg)  # already received whole by gRPC (its own limit is in configs/serve.env)
        if size > self.limits.max_body_bytes:
            raise ServiceError(
                "payload_too_large",
                f"the request carries {size} bytes of tensors; the limit is {self.limits.max_body_bytes}",
            )
        async with ops.admitted(size, headers):
            choice = ops.choose(headers, pinned)
            req = v2_grpc.infer_request(msg, self.limits, await ops.image_shape(choice))
            outcome = await ops.run(req, choice, t0)
        encoded_from = time.perf_counter()
        outputs, parameters = await ops.outputs(req, outcome)
        name = ops.model_name(pinned)
        reply = v2_grpc.infer_response(name, v2.DEFAULT_VERSION, req.id, outputs, parameters)
        ops.account(ENDPOINT, name, req, outcome, t0, encoded_from)
        return reply


@dataclass(frozen=True)
class Rpc:
    name: str  # the method of GRPCInferenceService, and of the Router that Serve calls for it
    handler: Callable[[GRPC, Any, Headers], Awaitable[Any]]
    empty: Callable[[], Any]  # the reply an error carries (its status is on the call's context)


RPCS: tuple[Rpc, ...] = (
    Rpc("ServerLive", GRPC.server_live, pb.ServerLiveResponse),
    Rpc("ServerReady", GRPC.server_ready, pb.ServerReadyResponse),
    Rpc("ModelReady", GRPC.model_ready, pb.ModelReadyResponse),
    Rpc("ServerMetadata", GRPC.server_metadata, pb.ServerMetadataResponse),
    Rpc("ModelMetadata", GRPC.model_metadata, pb.ModelMetadataResponse),
    Rpc("ModelConfig", GRPC.model_config, pb.ModelConfigResponse),
    Rpc("ModelStatistics", GRPC.model_statistics, pb.ModelStatisticsResponse),
    Rpc("ModelInfer", GRPC.infer, pb.ModelInferResponse),
)
BY_NAME = {rpc.name: rpc for rpc in RPCS}
