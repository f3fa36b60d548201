"""The Router's HTTP routes: every path (v1, rollout, docs, health and the Open Inference Protocol's REST paths) in one
table, with its method, the handler that answers it, whether it needs the admin token and its /openapi.json entry.
The gRPC methods have their own table beside their handlers (`v2_grpc.RPCS`).

`ROUTES` is the one declaration of the HTTP paths. Everything else is derived from it: the Ingress's dispatch
(`Routes.http`, exact paths and templates alike), the V2 path matching (`Routes.v2`, read by the V2 protocol's
`match_v2_path`) and the OpenAPI document's `paths` (`build_openapi`, from each entry's `doc`). A path is literal
or a template in the grammar of `PathTemplate` (`v2.MODEL_PATH`: a model's name and optional version). Adding
an endpoint is one handler (a method of one of the Router's parts: V1, V2, RolloutAPI, Docs) and one entry here;
`route_table` binds each entry's handler to the part that defines it (by the Router's assembly, once per replica).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from app.http.docs import Docs, asset_media
from app.http.openapi import ADMIN, BATCH_ERRORS, BODY, CLASSIFY_ERRORS, CONTROL, EVERY, Doc
from app.http.rollout import RolloutAPI
from app.http.route import Route
from app.http.v1 import V1
from app.http.v2_rest import V2
from app.protocol import v1 as s
from app.protocol import v2 as proto
from app.protocol.paths import PathTable
from app.rollout.spec import RolloutSpec

M = proto.MODEL_PATH  # /v2/models/{model}[/versions/{version}]

ROUTES: tuple[Route, ...] = (
    Route(
        "POST",
        "/v1/classify",
        V1.classify,
        Doc(
            "Classify one image",
            "classify",
            s.ClassifyResponse,
            CLASSIFY_ERRORS,
            "single",
            routed=True,
            description="The raw image bytes (image/*, application/octet-stream), or multipart/form-data with one "
            "part named `file`.",
        ),
    ),
    Route(
        "POST",
        "/v1/classify/batch",
        V1.classify_batch,
        Doc(
            "Classify several images",
            "classify",
            s.BatchResponse,
            BATCH_ERRORS,
            "batch",
            routed=True,
            description="multipart/form-data with one or more parts named `file`; `results` is in their order. An "
            "image that cannot be used fails only its own entry (400, 413 or 415 codes, with its `status`).",
        ),
    ),
    Route(
        "GET", "/v1/models", V1.models, Doc("The variants, the A/B policy and the limits", "state", s.ModelsResponse)
    ),
    Route("GET", "/v1/ab/summary", V1.ab_summary, Doc("The A/B evidence", "A/B", s.ABSummary, (*EVERY, *CONTROL))),
    Route(
        "POST",
        "/v1/ab/reset",
        V1.ab_reset,
        Doc(
            "Zero the A/B counters",
            "A/B",
            s.ABReset,
            (*EVERY, *ADMIN, *CONTROL),
            description="Needs `Authorization: Bearer <admin token>` (403 admin_disabled when no token is configured).",
        ),
        admin=True,
    ),
    Route(
        "GET",
        "/v1/rollout",
        RolloutAPI.get,
        Doc("The rollout: state, step, weights, each step's evidence", "rollout", s.RolloutState, (*EVERY, *CONTROL)),
    ),
    Route(
        "POST",
        "/v1/rollout",
        RolloutAPI.start,
        Doc(
            "Start a rollout of a candidate variant against a baseline",
            "rollout",
            s.RolloutState,
            (
                *EVERY,
                *BODY,
                *ADMIN,
                *CONTROL,
                "conflict",
                "invalid_parameter",
                "unknown_variant",
                "bad_request",
                "not_ready",
            ),
            "json",
            json_body=RolloutSpec,
            status=202,
            description="Every field but `candidate` and `baseline` has a default. 409 conflict while one runs.",
        ),
        admin=True,
    ),
    Route(
        "POST",
        "/v1/rollout/abort",
        RolloutAPI.abort,
        Doc(
            "Abort the running rollout: the weights go back to where it started",
            "rollout",
            s.RolloutState,
            (*EVERY, *ADMIN, *CONTROL, "conflict"),
        ),
        admin=True,
    ),
    Route("GET", "/healthz", V1.healthz, Doc("Alive", "state", s.Health)),
    Route(
        "GET",
        "/readyz",
        V1.readyz,
        Doc("Every variant loaded and warmed up", "state", s.Ready, (*EVERY, "not_ready"), body_503=s.NotReadyBody),
    ),
    Route("GET", "/openapi.json", Docs.openapi, Doc("This document", "docs", None)),
    Route(
        "GET",
        "/docs",
        Docs.page,
        Doc("This document in Swagger UI (served with its assets, offline)", "docs", None, media="text/html"),
    ),
    *(
        Route("GET", path, Docs.serve_asset, Doc("A Swagger UI asset of /docs", "docs", None, media=media))
        for path, media in asset_media().items()
    ),
    # The Open Inference Protocol (KServe V2) over REST: every path under /v2, its errors in the protocol's shape.
    Route("GET", "/v2", V2.server_metadata),
    Route("GET", "/v2/health/live", V2.server_live),
    Route("GET", "/v2/health/ready", V2.server_ready),
    Route("GET", "/v2/models/stats", V2.model_stats),  # every model's; exact, so it is no model named "stats"
    Route("GET", M, V2.model_metadata),
    Route("GET", M + "/ready", V2.model_ready),
    Route("GET", M + "/config", V2.model_config),
    Route("GET", M + "/stats", V2.model_stats),
    Route("POST", M + "/infer", V2.infer),
)


@dataclass(frozen=True)
class Routes:
    """The table bound to one Router's parts: what the Ingress dispatches on."""

    table: tuple[Route, ...]  # as declared, each handler bound
    http: PathTable[Route]  # every path but V2's: v1, rollout, docs, health
    v2: PathTable[Route]  # under /v2 (the V2 protocol's match_v2_path)


def route_table(v1: V1, v2: V2, rollout: RolloutAPI, docs: Docs, table: Sequence[Route] = ROUTES) -> Routes:
    bound = bind(table, (v1, v2, rollout, docs))
    return Routes(
        bound,
        PathTable((r.method, r.path, r) for r in bound if not proto.is_v2_path(r.path)),
        PathTable((r.method, r.path, r) for r in bound if proto.is_v2_path(r.path)),
    )


def bind(table: Iterable[Route], parts: Sequence[object]) -> tuple[Route, ...]:
    """Each entry with its handler bound to the one part whose class defines it (a subclass's override wins)."""
    out = []
    for route in table:
        fn = route.handler
        owners = [p for p in parts if any(vars(c).get(fn.__name__) is fn for c in type(p).__mro__)]
        if len(owners) != 1:
            raise TypeError(f"{route.method} {route.path}: {fn.__qualname__} is a method of {len(owners)} parts")
        out.append(replace(route, handler=getattr(owners[0], fn.__name__)))
    return tuple(out)
