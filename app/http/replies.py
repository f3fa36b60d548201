"""Replies: JSON bodies, the error shapes of v1 and V2, Server-Timing; every reply counted in the metrics once."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ValidationError
from starlette.responses import JSONResponse, Response

from app.errors import ServiceError
from app.protocol import v2
from app.tracing import spans

logger = logging.getLogger("ray.serve")

if TYPE_CHECKING:  # a type only: the metrics are made by the deployment and handed in
    from app.http.ports import Metrics


def json_response(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return JSONResponse(body, status_code=status, headers=headers)


def model_response(body: BaseModel, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    """A reply built from its typed model (the v1 protocol's): fields left at their default (a `failover` that
    did not happen, a `cascade` that did not answer) are left out, as the schema documents."""
    return Response(body.model_dump_json(exclude_defaults=True), status, headers, media_type="application/json")


def state_response(schema: type[BaseModel], body: dict[str, Any]) -> Response:
    """A state reply (/v1/models, /v1/ab/*) built through the schema /openapi.json documents it with: the body
    validated into it and written with exactly the fields it was given. A body the schema refuses is a drift between
    the two: logged as an error naming it, and the body served as it is (a state endpoint never fails for it)."""
    try:
        typed = schema.model_validate(body)
    except ValidationError as e:
        logger.error(
            "%s does not fit its schema (%d errors, the first: %s)", schema.__name__, e.error_count(), e.errors()[0]
        )
        return json_response(body)
    return Response(typed.model_dump_json(exclude_unset=True), media_type="application/json")


def error_response(err: ServiceError) -> Response:
    return json_response(err.body(), err.status, err.headers())


def server_timing(timings: dict[str, float]) -> str:
    return ", ".join(f"{k};dur={v}" for k, v in timings.items() if k != "batch_size")


class Replies:
    """The one reply path: a v1 or V2 error, or a success, and its metrics."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def error(self, endpoint: str, err: ServiceError, variant: str | None = None) -> Response:
        """v1: {"error": {"code", "message"}} with the status table's status."""
        self.metrics.error(endpoint, err.code, err.status, variant or err.variant or "none")
        if spans.ENABLED:
            spans.annotate({"error.type": err.code, "app.variant": variant or err.variant})
        return error_response(err)

    def v2_error(self, err: ServiceError, fields: dict[str, Any] | None = None) -> Response:
        """The Open Inference Protocol's flat {"error": "..."}, after any `fields` of the reply the operation
        answers even when it fails (a health reply's `ready`)."""
        status, body = v2.v2_error(err)
        self.metrics.error("/v2", err.code, status, err.variant or "none")
        if spans.ENABLED:
            spans.annotate({"error.type": err.code, "app.variant": err.variant})
        return json_response({**(fields or {}), **body}, status, err.headers())

    def success(self, endpoint: str, variant: str, timings: dict[str, float]) -> dict[str, str]:
        """Count a 200; the headers every successful reply carries."""
        self.metrics.success(endpoint, variant, timings)
        return {"X-Model-Variant": variant, "Server-Timing": server_timing(timings)}
