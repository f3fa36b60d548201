"""The Router's routes, all in one table: every HTTP path, the Open Inference Protocol's REST operations and its
gRPC methods, each with the handler that answers it and whether it needs the admin token.

The table is built once from the handlers (`route_table`, called by app/http/assembly.py); the Ingress dispatches
on it and nothing else adds to it. /openapi.json documents exactly the HTTP routes (tests/test_openapi_unit.py).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import Response

if TYPE_CHECKING:
    from app.http.docs import Docs
    from app.http.grpc import GRPC
    from app.http.rollout import RolloutAPI
    from app.http.v1 import V1
    from app.http.v2 import V2

Handler = Callable[[Request], Awaitable[Response]]
V2Handler = Callable[[Request, dict[str, str]], Awaitable[Response]]  # with the path's model and version
RPC = Callable[[Any, Headers], Awaitable[Any]]  # a gRPC message and the call's metadata


@dataclass(frozen=True)
class Route:
    method: str
    path: str
    handler: Handler
    admin: bool = False  # needs the admin bearer token (it changes the traffic or the evidence)


@dataclass(frozen=True)
class Routes:
    http: dict[tuple[str, str], Route]  # (method, path) -> route: v1, rollout, docs, health
    v2: dict[str, V2Handler]  # the operation app/protocol's V2 path matching names -> its handler (under /v2)
    grpc: dict[str, RPC]  # the RPC's name -> its handler (GRPCInferenceService)
    paths: frozenset[str] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "paths", frozenset(p for _, p in self.http))


def route_table(v1: V1, v2: V2, grpc: GRPC, rollout: RolloutAPI, docs: Docs) -> Routes:
    http = [
        Route("POST", "/v1/classify", v1.classify),
        Route("POST", "/v1/classify/batch", v1.classify_batch),
        Route("GET", "/v1/models", v1.models),
        Route("GET", "/v1/ab/summary", v1.ab_summary),
        Route("POST", "/v1/ab/reset", v1.ab_reset, admin=True),
        Route("GET", "/v1/rollout", rollout.get),
        Route("POST", "/v1/rollout", rollout.start, admin=True),
        Route("POST", "/v1/rollout/abort", rollout.abort, admin=True),
        Route("GET", "/healthz", v1.healthz),
        Route("GET", "/readyz", v1.readyz),
        Route("GET", "/openapi.json", docs.openapi),
        Route("GET", "/docs", docs.page),
        *(Route("GET", path, handler) for path, handler in docs.assets().items()),
    ]
    rest_v2: dict[str, V2Handler] = {
        "server_metadata": v2.server_metadata,
        "server_live": v2.server_live,
        "server_ready": v2.server_ready,
        "model_ready": v2.model_ready,
        "model_metadata": v2.model_metadata,
        "model_config": v2.model_config,
        "model_stats": v2.model_stats,
        "infer": v2.infer,
    }
    rpcs: dict[str, RPC] = {
        "ServerLive": grpc.server_live,
        "ServerReady": grpc.server_ready,
        "ModelReady": grpc.model_ready,
        "ServerMetadata": grpc.server_metadata,
        "ModelMetadata": grpc.model_metadata,
        "ModelConfig": grpc.model_config,
        "ModelStatistics": grpc.model_statistics,
        "ModelInfer": grpc.infer,
    }
    return Routes({(r.method, r.path): r for r in http}, rest_v2, rpcs)
