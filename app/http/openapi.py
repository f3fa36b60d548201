"""The OpenAPI 3.1 document of the v1 API, built from the response models (app/protocol/v1.py) and a table
of operations; every error status comes from the one status table (app/errors.py STATUS).

Pure: no Ray, no Starlette. app/http/docs.py serves it as GET /openapi.json.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from app import __version__
from app.config import Limits
from app.errors import RETRY_AFTER_S, STATUS, ServiceError
from app.protocol import v1 as s
from app.rollout.spec import RolloutSpec

REF = "#/components/schemas/{model}"
ADMIN_SCHEME = "adminBearer"

# Error codes by where they arise; an operation's error responses are the statuses of its codes.
EVERY = ("uri_too_long", "internal_error")  # the Router's own checks, before and around every handler
BODY = ("bad_request", "body_timeout", "payload_too_large")  # reading the body
MULTIPART = ("bad_multipart", "missing_file", "too_many_files", "unsupported_media_type")
IMAGE = ("empty_body", "undecodable_image", "too_many_pixels", "decode_budget_exceeded", "unsupported_image")
ROUTED = ("invalid_parameter", "unknown_variant", "override_forbidden")  # top_k and the A/B headers
INFERENCE = ("overloaded", "inference_timeout", "variant_unavailable", "replica_failed")
CONTROL = ("inference_timeout", "variant_unavailable", "replica_failed")  # a call to the A/B ledger
ADMIN = ("unauthorized", "admin_disabled")


@dataclass(frozen=True)
class Operation:
    """One v1 route: what it takes and what it answers."""

    method: str
    path: str
    summary: str
    tag: str
    response: type[BaseModel] | None  # the 200 body; None: not JSON (see `media`)
    errors: tuple[str, ...] = EVERY
    body: str | None = None  # "single" (an image or multipart `file`) or "batch" (multipart `file` parts)
    routed: bool = False  # takes top_k and the A/B headers
    admin: bool = False
    media: str = "application/json"
    body_503: type[BaseModel] = s.ErrorBody  # /readyz adds each variant's readiness
    description: str = ""
    json_body: type[BaseModel] | None = None  # body "json": this model
    status: int = 200  # the success status


CLASSIFY_ERRORS = (*EVERY, *BODY, *MULTIPART, *IMAGE, *ROUTED, *INFERENCE)
BATCH_ERRORS = (*EVERY, *BODY, *MULTIPART, *ROUTED, *INFERENCE)

OPERATIONS: tuple[Operation, ...] = (
    Operation(
        "POST",
        "/v1/classify",
        "Classify one image",
        "classify",
        s.ClassifyResponse,
        CLASSIFY_ERRORS,
        "single",
        routed=True,
        description="The raw image bytes (image/*, application/octet-stream), or multipart/form-data with one "
        "part named `file`.",
    ),
    Operation(
        "POST",
        "/v1/classify/batch",
        "Classify several images",
        "classify",
        s.BatchResponse,
        BATCH_ERRORS,
        "batch",
        routed=True,
        description="multipart/form-data with one or more parts named `file`; `results` is in their order. An "
        "image that cannot be used fails only its own entry (400, 413 or 415 codes, with its `status`).",
    ),
    Operation("GET", "/v1/models", "The variants, the A/B policy and the limits", "state", s.ModelsResponse),
    Operation("GET", "/v1/ab/summary", "The A/B evidence", "A/B", s.ABSummary, (*EVERY, *CONTROL)),
    Operation(
        "POST",
        "/v1/ab/reset",
        "Zero the A/B counters",
        "A/B",
        s.ABReset,
        (*EVERY, *ADMIN, *CONTROL),
        admin=True,
        description="Needs `Authorization: Bearer <admin token>` (403 admin_disabled when no token is configured).",
    ),
    Operation(
        "GET",
        "/v1/rollout",
        "The rollout: state, step, weights, each step's evidence",
        "rollout",
        s.RolloutState,
        (*EVERY, *CONTROL),
    ),
    Operation(
        "POST",
        "/v1/rollout",
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
        admin=True,
        json_body=RolloutSpec,
        status=202,
        description="Every field but `candidate` and `baseline` has a default. 409 conflict while one runs.",
    ),
    Operation(
        "POST",
        "/v1/rollout/abort",
        "Abort the running rollout: the weights go back to where it started",
        "rollout",
        s.RolloutState,
        (*EVERY, *ADMIN, *CONTROL, "conflict"),
        admin=True,
    ),
    Operation("GET", "/healthz", "Alive", "state", s.Health),
    Operation(
        "GET",
        "/readyz",
        "Every variant loaded and warmed up",
        "state",
        s.Ready,
        (*EVERY, "not_ready"),
        body_503=s.NotReadyBody,
    ),
    Operation("GET", "/openapi.json", "This document", "docs", None),
    Operation(
        "GET", "/docs", "This document in Swagger UI (served with its assets, offline)", "docs", None, media="text/html"
    ),
)


def build_openapi(
    limits: Limits,
    sticky_header: str,
    override_header: str,
    variants: list[str] | None = None,
    assets: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The document; the header names are RouterConfig's, `assets` the /docs assets' paths -> media types."""
    refs, defs = models_json_schema([(m, "serialization") for m in _models()], ref_template=REF, title="components")
    ref = {m: refs[(m, "serialization")] for m in _models()}
    builder = _Paths(limits, sticky_header, override_header, variants, ref)
    paths: dict[str, dict[str, Any]] = {}
    asset_ops = (
        Operation("GET", p, "A Swagger UI asset of /docs", "docs", None, media=m) for p, m in (assets or {}).items()
    )
    for op in (*OPERATIONS, *asset_ops):
        paths.setdefault(op.path, {})[op.method.lower()] = builder.operation(op)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Image classification: the v1 API",
            "version": __version__,
            "description": 'Errors are `{"error": {"code", "message"}}`; the status follows from the code '
            "(app/errors.py). Every 503 carries `Retry-After`. An unknown path answers 404 `not_found`, a "
            "known one with another method 405 `method_not_allowed`, both with that body.",
        },
        "tags": [{"name": t} for t in dict.fromkeys(op.tag for op in OPERATIONS)],
        "paths": paths,
        "components": {
            "schemas": defs.get("$defs", {}),
            "securitySchemes": {ADMIN_SCHEME: {"type": "http", "scheme": "bearer", "description": "the admin token"}},
        },
    }


def _models() -> list[type[BaseModel]]:
    found = {op.response for op in OPERATIONS if op.response} | {op.body_503 for op in OPERATIONS}
    found |= {op.json_body for op in OPERATIONS if op.json_body}
    return sorted(found, key=lambda m: m.__name__)


def codes_by_status(codes: tuple[str, ...]) -> dict[int, list[str]]:
    """The status table, restricted to `codes`: status -> its codes, in table order."""
    out: dict[int, list[str]] = {}
    for code in STATUS:
        if code in codes:
            out.setdefault(STATUS[code], []).append(code)
    return dict(sorted(out.items()))


class _Paths:
    """Operation objects: parameters, request body and responses."""

    def __init__(
        self,
        limits: Limits,
        sticky: str,
        override: str,
        variants: list[str] | None,
        ref: dict[type[BaseModel], dict[str, Any]],
    ) -> None:
        self.limits, self.sticky, self.override, self.variants, self.ref = limits, sticky, override, variants, ref

    def operation(self, op: Operation) -> dict[str, Any]:
        out: dict[str, Any] = {
            "operationId": op.method.lower() + op.path.replace("/", "_").replace(".", "_"),
            "summary": op.summary,
            "tags": [op.tag],
        }
        if op.description:
            out["description"] = op.description
        if op.routed:
            out["parameters"] = self.parameters()
        if op.json_body is not None:
            schema = self.ref[op.json_body]
            out["requestBody"] = {"required": True, "content": {"application/json": {"schema": schema}}}
        elif op.body:
            out["requestBody"] = self.request_body(op.body)
        if op.admin:
            out["security"] = [{ADMIN_SCHEME: []}]
        out["responses"] = {str(op.status): self.success(op), **self.errors(op)}
        return out

    def parameters(self) -> list[dict[str, Any]]:
        lim = self.limits
        variant: dict[str, Any] = {"type": "string"}
        if self.variants:
            variant["enum"] = list(self.variants)
        return [
            {
                "name": "top_k",
                "in": "query",
                "description": "how many classes to return, best first (422 invalid_parameter outside the range)",
                "schema": {"type": "integer", "minimum": 1, "maximum": lim.max_top_k, "default": lim.default_top_k},
            },
            {
                "name": self.sticky,
                "in": "header",
                "description": "a user id: requests with the same one always get the same variant",
                "schema": {"type": "string"},
            },
            {
                "name": self.override,
                "in": "header",
                "description": "the variant to use (422 unknown_variant; 403 override_forbidden when the config "
                "refuses overrides)",
                "schema": variant,
            },
        ]

    def request_body(self, kind: str) -> dict[str, Any]:
        binary = {"type": "string", "format": "binary"}
        if kind == "single":
            one = {"type": "object", "properties": {"file": binary}, "required": ["file"]}
            content = {
                "image/*": {"schema": binary},
                "application/octet-stream": {"schema": binary},
                "multipart/form-data": {"schema": one, "encoding": {"file": {"contentType": "image/*"}}},
            }
            limit = f"at most {self.limits.max_body_bytes} bytes and {self.limits.max_pixels} pixels"
        else:
            n = self.limits.max_batch_files
            many = {"type": "array", "items": binary, "minItems": 1, "maxItems": n}
            content = {
                "multipart/form-data": {
                    "schema": {"type": "object", "properties": {"file": many}, "required": ["file"]},
                    "encoding": {"file": {"contentType": "image/*"}},
                }
            }
            lim = self.limits
            limit = f"at most {n} files, {lim.max_body_bytes} bytes in all, each image {lim.max_pixels} pixels"
        return {"required": True, "description": f"JPEG, PNG, WebP, BMP, TIFF or GIF; {limit}", "content": content}

    def success(self, op: Operation) -> dict[str, Any]:
        if op.response is None:
            schema = {"type": "string"} if op.media == "text/html" else {"type": "object"}
            return {"description": "OK", "content": {op.media: {"schema": schema}}}
        out: dict[str, Any] = {
            "description": op.response.__doc__.strip().splitlines()[0] if op.response.__doc__ else "OK",
            "content": {"application/json": {"schema": self.ref[op.response]}},
        }
        if op.routed:
            out["headers"] = {
                "X-Model-Variant": {"description": "the variant that answered", "schema": {"type": "string"}},
                "Server-Timing": {"description": "the timings_ms, as name;dur=ms", "schema": {"type": "string"}},
            }
        return out

    def errors(self, op: Operation) -> dict[str, dict[str, Any]]:
        out = {}
        for status, codes in codes_by_status(op.errors).items():
            model = op.body_503 if status == 503 else s.ErrorBody
            extra = {"variants": dict.fromkeys(self.variants or ["fp32"], False)} if model is s.NotReadyBody else {}
            examples = {c: {"value": {**ServiceError(c, f"({c})").body(), **extra}} for c in codes}
            response: dict[str, Any] = {
                "description": ", ".join(codes),
                "content": {"application/json": {"schema": self.ref[model], "examples": examples}},
            }
            if status == 503:
                response["headers"] = {
                    "Retry-After": {"description": "seconds", "schema": {"type": "integer", "const": RETRY_AFTER_S}}
                }
            elif status == 401:
                response["headers"] = {"WWW-Authenticate": {"schema": {"type": "string"}}}
            out[str(status)] = response
        return out
