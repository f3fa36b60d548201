"""The Open Inference Protocol over gRPC: the handler side, over the REST endpoint's pipeline and limits.

Serve's gRPC ingress (its proxy, or with HAProxy each Router replica's own gRPC server) calls the Router's
method named after the RPC with the request message and a `grpc_context`; the Router hands both here. The
messages and their conversion are app/protocol/v2_grpc.py. What the REST endpoint does, this does in the same order
with the same objects: the model name's pin, the A/B choice from the routing headers (here gRPC metadata,
`x-user-id` and `x-model-variant` by default), the body limit, admission, the pipeline, Triton's statistics
and the Router's metrics (endpoint `grpc`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.datastructures import Headers
from tritonclient.grpc import service_pb2 as pb

from app import __version__
from app.errors import ServiceError
from app.http.ingress import Ingress
from app.http.v2 import V2
from app.protocol import v2, v2_grpc

logger = logging.getLogger("ray.serve")
ENDPOINT = "grpc"
EMPTY: dict[str, Callable[[], Any]] = {
    "ServerLive": pb.ServerLiveResponse,
    "ServerReady": pb.ServerReadyResponse,
    "ModelReady": pb.ModelReadyResponse,
    "ServerMetadata": pb.ServerMetadataResponse,
    "ModelMetadata": pb.ModelMetadataResponse,
    "ModelConfig": pb.ModelConfigResponse,
    "ModelStatistics": pb.ModelStatisticsResponse,
    "ModelInfer": pb.ModelInferResponse,
}


def metadata_headers(context: Any) -> Headers:
    """The call's invocation metadata as case-insensitive headers (binary `-bin` entries left out)."""
    pairs = context.invocation_metadata() if context is not None else ()
    return Headers(raw=[(k.lower().encode(), v.encode()) for k, v in pairs or () if isinstance(v, str)])


class GRPC:
    def __init__(self, ingress: Ingress, rest: V2) -> None:
        self.ing = ingress
        self.rest = rest
        self.methods: dict[str, Callable[[Any, Headers], Awaitable[Any]]] = {
            "ServerLive": self.server_live,
            "ServerReady": self.server_ready,
            "ModelReady": self.model_ready,
            "ServerMetadata": self.server_metadata,
            "ModelMetadata": self.model_metadata,
            "ModelConfig": self.model_config,
            "ModelStatistics": self.model_statistics,
            "ModelInfer": self.infer,
        }

    async def call(self, method: str, msg: Any, context: Any) -> Any:
        """One RPC: its answer, or an empty message with the error's status set on the context."""
        t0 = time.perf_counter()
        try:
            return await self.methods[method](msg, metadata_headers(context))
        except ServiceError as e:
            return self._fail(method, msg, context, e, t0)
        except Exception as e:  # a bug, not an input's fault: counted like every other error
            logger.exception("unhandled error in gRPC %s", method)
            return self._fail(
                method, msg, context, ServiceError("internal_error", f"internal error ({type(e).__name__})"), t0
            )

    def _fail(self, method: str, msg: Any, context: Any, e: ServiceError, t0: float) -> Any:
        self.rest.record_failure(e, msg.model_name if method == "ModelInfer" else "", time.perf_counter() - t0)
        self.ing.metrics.error(ENDPOINT, e.code, e.status, e.variant or "none")
        if context is not None:
            code, details, trailing = v2_grpc.status_of(e)
            context.set_code(code)
            context.set_details(details)
            context.set_trailing_metadata(trailing)
        return EMPTY[method]()

    # -- health and metadata -------------------------------------------------------------

    async def server_live(self, msg: pb.ServerLiveRequest, headers: Headers) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=True)

    async def server_ready(self, msg: pb.ServerReadyRequest, headers: Headers) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=await self._ready(self.ing.variants))

    async def model_ready(self, msg: pb.ModelReadyRequest, headers: Headers) -> pb.ModelReadyResponse:
        pinned = self.rest.pin(msg.name, msg.version or None)
        return pb.ModelReadyResponse(ready=await self._ready([pinned] if pinned else self.ing.variants))

    async def _ready(self, variants: list[str]) -> bool:
        return all((await self.ing.pipeline.ready(variants)).values())

    async def server_metadata(self, msg: pb.ServerMetadataRequest, headers: Headers) -> pb.ServerMetadataResponse:
        return v2_grpc.server_metadata(v2.server_metadata(__version__))

    async def model_metadata(self, msg: pb.ModelMetadataRequest, headers: Headers) -> pb.ModelMetadataResponse:
        return v2_grpc.model_metadata(await self.rest.metadata_of(msg.name, msg.version or None))

    async def model_config(self, msg: pb.ModelConfigRequest, headers: Headers) -> pb.ModelConfigResponse:
        return v2_grpc.model_config(await self.rest.config_of(msg.name, msg.version or None))

    async def model_statistics(self, msg: pb.ModelStatisticsRequest, headers: Headers) -> pb.ModelStatisticsResponse:
        return v2_grpc.model_statistics(await self.rest.stats_of(msg.name or None, msg.version or None))

    # -- inference -----------------------------------------------------------------------

    async def infer(self, msg: pb.ModelInferRequest, headers: Headers) -> pb.ModelInferResponse:
        ing, t0 = self.ing, time.perf_counter()
        pinned = self.rest.pin(msg.model_name, msg.model_version or None)
        size = v2_grpc.request_bytes(msg)  # already received whole by gRPC (its own limit is in configs/serve.env)
        if size > ing.limits.max_body_bytes:
            raise ServiceError(
                "payload_too_large",
                f"the request carries {size} bytes of tensors; the limit is {ing.limits.max_body_bytes}",
            )
        pipeline = ing.pipeline
        model = v2.model_name_for(ing.args.model.name, pinned)
        async with pipeline.admitted(size, ing.user(headers)):
            choice = ing.choose(headers, pinned)
            spec = await pipeline.spec(choice.variant)
            req = v2_grpc.infer_request(msg, ing.limits, v2.image_shape(spec))
            outcome = await self.rest.run(req, choice, t0)
        encoded_from = time.perf_counter()
        outputs, parameters = await self.rest.outputs(req, outcome)
        reply = v2_grpc.infer_response(model, v2.DEFAULT_VERSION, req.id, outputs, parameters)
        self.rest.account(ENDPOINT, model, req, outcome, t0, encoded_from)
        return reply
