"""The OpenAPI 3.1 document of the v1 API, built from the route table (each entry's `Doc`)
and the response models (the v1 protocol's); every error status comes from the one status table (`app.errors.STATUS`
STATUS).

Pure: no Ray, no Starlette (the table is handed in). `Docs` serves it as GET /openapi.json.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from app import __version__
from app.config import Limits
from app.errors import RETRY_AFTER_S, STATUS, ServiceError
from app.protocol import v1 as s
from app.protocol.paths import PathTemplate

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
class Doc:
    """A route's entry in the document: what it takes and what it answers (its method, path and admin flag are the
    route's own, in the route table)."""

    summary: str
    tag: str
    response: type[BaseModel] | None  # the 200 body; None: not JSON (see `media`)
    errors: tuple[str, ...] = EVERY
    body: str | None = None  # "single" (an image or multipart `file`) or "batch" (multipart `file` parts)
    routed: bool = False  # takes top_k and the A/B headers
    media: str = "application/json"
    body_503: type[BaseModel] = s.ErrorBody  # /readyz adds each variant's readiness
    description: str = ""
    json_body: type[BaseModel] | None = None  # body "json": this model
    status: int = 200  # the success status


class Documented(Protocol):
    """A route as the document reads it (the route table's `Route`)."""

    @property
    def method(self) -> str: ...
    @property
    def path(self) -> str: ...  # literal or a template (`PathTemplate`)
    @property
    def admin(self) -> bool: ...
    @property
    def doc(self) -> Doc | None: ...  # None: not in the document (the V2 protocol's routes)


CLASSIFY_ERRORS = (*EVERY, *BODY, *MULTIPART, *IMAGE, *ROUTED, *INFERENCE)
BATCH_ERRORS = (*EVERY, *BODY, *MULTIPART, *ROUTED, *INFERENCE)


def build_openapi(
    routes: Iterable[Documented],
    limits: Limits,
    sticky_header: str,
    override_header: str,
    variants: list[str] | None = None,
) -> dict[str, Any]:
    """The document of the routes that have a `doc`, in their order; the header names are RouterConfig's."""
    documented = [r for r in routes if r.doc is not None]
    docs = [d for r in documented if (d := r.doc) is not None]
    models = _models(docs)
    refs, defs = models_json_schema([(m, "serialization") for m in models], ref_template=REF, title="components")
    ref = {m: refs[(m, "serialization")] for m in models}
    builder = _Paths(limits, sticky_header, override_header, variants, ref)
    paths: dict[str, dict[str, Any]] = {}
    for route in documented:
        template = PathTemplate(route.path)
        for path in template.expand():  # a template: each of its optional parts absent, then present
            paths.setdefault(path, {})[route.method.lower()] = builder.operation(route, path)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Image classification: the v1 API",
            "version": __version__,
            "description": 'Errors are `{"error": {"code", "message"}}`; the status follows from the code. '
            "Every 503 carries `Retry-After`. An unknown path answers 404 `not_found`, a "
            "known one with another method 405 `method_not_allowed`, both with that body.",
        },
        "tags": [{"name": t} for t in dict.fromkeys(d.tag for d in docs)],
        "paths": paths,
        "components": {
            "schemas": defs.get("$defs", {}),
            "securitySchemes": {ADMIN_SCHEME: {"type": "http", "scheme": "bearer", "description": "the admin token"}},
        },
    }


def _models(docs: list[Doc]) -> list[type[BaseModel]]:
    found = {d.response for d in docs if d.response} | {d.body_503 for d in docs}
    found |= {d.json_body for d in docs if d.json_body}
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

    def operation(self, route: Documented, path: str) -> dict[str, Any]:
        """`path`: the route's path, or one of its template's (PathTemplate.expand)."""
        op = route.doc
        assert op is not None
        name = path.replace("/", "_").replace(".", "_").replace("{", "").replace("}", "")
        out: dict[str, Any] = {"operationId": route.method.lower() + name, "summary": op.summary, "tags": [op.tag]}
        if op.description:
            out["description"] = op.description
        in_path = re.findall(r"\{(\w+)\}", path)
        parameters = [{"name": p, "in": "path", "required": True, "schema": {"type": "string"}} for p in in_path] + (
            self.parameters() if op.routed else []
        )
        if parameters:
            out["parameters"] = parameters
        if op.json_body is not None:
            schema = self.ref[op.json_body]
            out["requestBody"] = {"required": True, "content": {"application/json": {"schema": schema}}}
        elif op.body:
            out["requestBody"] = self.request_body(op.body)
        if route.admin:
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

    def success(self, op: Doc) -> dict[str, Any]:
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

    def errors(self, op: Doc) -> dict[str, dict[str, Any]]:
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
