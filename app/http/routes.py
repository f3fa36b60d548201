"""The Router's HTTP routes: every path (v1, rollout, docs, health and the Open Inference Protocol's REST paths) in one
table, with its method, the handler that answers it, whether it needs the admin token and its /openapi.json entry.
The gRPC methods have their own table beside their handlers (`v2_grpc.RPCS`).

`routes` is the one declaration of the HTTP paths, written as Starlette's route lists are: each entry names the
method of the part that answers it (V1, V2, RolloutAPI, Docs), and the Router's assembly calls it with its parts.
Everything else is derived from it: the Ingress's dispatch (`Routes.http`, exact paths and templates alike), the V2
path matching (`Routes.v2`, read by the V2 protocol's `match_v2_path`) and the OpenAPI document's `paths`
(`build_openapi`, from each entry's `doc`). A path is literal or a template in the grammar of `PathTemplate`
(`v2.MODEL_PATH`: a model's name and optional version). Adding an endpoint is one handler and one entry here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

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


def routes(
    v1: V1 | type[V1], v2: V2 | type[V2], rollout: RolloutAPI | type[RolloutAPI], docs: Docs | type[Docs]
) -> tuple[Route, ...]:
    """The table, each handler the method of the part that answers it: the Router's assembly passes its parts
    (bound methods, what the Ingress calls); `ROUTES` passes their classes (the functions, what the document and
    the tests read). One list either way."""
    return (
        Route(
            "POST",
            "/v1/classify",
            v1.classify,
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
            v1.classify_batch,
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
            "GET",
            "/v1/models",
            v1.models,
            Doc("The variants, the A/B policy and the limits", "state", s.ModelsResponse),
        ),
        Route("GET", "/v1/ab/summary", v1.ab_summary, Doc("The A/B evidence", "A/B", s.ABSummary, (*EVERY, *CONTROL))),
        Route(
            "POST",
            "/v1/ab/reset",
            v1.ab_reset,
            Doc(
                "Zero the A/B counters",
                "A/B",
                s.ABReset,
                (*EVERY, *ADMIN, *CONTROL),
                description="Needs `Authorization: Bearer <admin token>` (403 admin_disabled when no token is "
                "configured).",
            ),
            admin=True,
        ),
        Route(
            "GET",
            "/v1/rollout",
            rollout.get,
            Doc(
                "The rollout: state, step, weights, each step's evidence", "rollout", s.RolloutState, (*EVERY, *CONTROL)
            ),
        ),
        Route(
            "POST",
            "/v1/rollout",
            rollout.start,
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
            rollout.abort,
            Doc(
                "Abort the running rollout: the weights go back to where it started",
                "rollout",
                s.RolloutState,
                (*EVERY, *ADMIN, *CONTROL, "conflict"),
            ),
            admin=True,
        ),
        Route("GET", "/healthz", v1.healthz, Doc("Alive", "state", s.Health)),
        Route(
            "GET",
            "/readyz",
            v1.readyz,
            Doc("Every variant loaded and warmed up", "state", s.Ready, (*EVERY, "not_ready"), body_503=s.NotReadyBody),
        ),
        Route("GET", "/openapi.json", docs.openapi, Doc("This document", "docs", None)),
        Route(
            "GET",
            "/docs",
            docs.page,
            Doc("This document in Swagger UI (served with its assets, offline)", "docs", None, media="text/html"),
        ),
        *(
            Route("GET", path, docs.serve_asset, Doc("A Swagger UI asset of /docs", "docs", None, media=media))
            for path, media in asset_media().items()
        ),
        # The Open Inference Protocol (KServe V2) over REST: every path under /v2, its errors in the protocol's shape.
        Route("GET", "/v2", v2.server_metadata),
        Route("GET", "/v2/health/live", v2.server_live),
        Route("GET", "/v2/health/ready", v2.server_ready),
        Route("GET", "/v2/models/stats", v2.model_stats),  # every model's; exact, so it is no model named "stats"
        Route("GET", M, v2.model_metadata),
        Route("GET", M + "/ready", v2.model_ready),
        Route("GET", M + "/config", v2.model_config),
        Route("GET", M + "/stats", v2.model_stats),
        Route("POST", M + "/infer", v2.infer),
    )


ROUTES: tuple[Route, ...] = routes(V1, V2, RolloutAPI, Docs)  # as declared: the classes' functions


@dataclass(frozen=True)
class Routes:
    """One Router's table as the Ingress dispatches on it."""

    table: tuple[Route, ...]  # as built, each handler a part's method
    http: PathTable[Route]  # every path but V2's: v1, rollout, docs, health
    v2: PathTable[Route]  # under /v2 (the V2 protocol's match_v2_path)

    @classmethod
    def of(cls, table: Sequence[Route]) -> Routes:
        return cls(
            tuple(table),
            PathTable((r.method, r.path, r) for r in table if not proto.is_v2_path(r.path)),
            PathTable((r.method, r.path, r) for r in table if proto.is_v2_path(r.path)),
        )
