"""The one route table (app.http.routes: `routes` of the Router's parts) and what is derived from it: the
Ingress's dispatch (exact and templated paths), the V2 path matching (the V2 protocol's match_v2_path) and
/openapi.json's `paths`. An entry planted beside the table shows up in all three with nothing else added. The path
grammar is app.protocol.paths'. Pure: the Router's parts on a fake backend, no Ray."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from typing import Any

import pytest
from openapi_spec_validator import OpenAPIV31SpecValidator
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from app.config import Limits
from app.http.docs import Docs
from app.http.ingress import Ingress
from app.http.openapi import Doc, build_openapi
from app.http.rollout import RolloutAPI
from app.http.routes import ROUTES, Route, Routes, routes
from app.http.v1 import V1
from app.http.v2_rest import V2
from app.protocol import v2
from app.protocol.paths import PathTable, PathTemplate
from tests.test_ingress_rollout_unit import router

VARIANTS = ["fp32", "int8"]
CONFIG = {"weights": {"fp32": 1, "int8": 1}}


Planted = tuple[tuple[type, Route], ...]  # entries added to the table: the part's class, the entry with its function


def ingress(planted: Planted = ()) -> Ingress:
    """The Router's Ingress as app.http.assembly assembles it, on the table with `planted` added (its parts on
    fakes): each added entry's handler the method of the part of its class, as the assembly's `routes` call binds."""
    app = router(VARIANTS, CONFIG)
    ing = app.ingress
    parts: dict[type, Any] = {type(r.handler.__self__): r.handler.__self__ for r in ing.routes.table}
    docs = Docs(app.ctx, (*ROUTES, *(r for _, r in planted)))
    added = [replace(r, handler=getattr(parts[c], r.handler.__name__)) for c, r in planted]
    table = Routes.of((*routes(parts[V1], ing.v2, parts[RolloutAPI], docs), *added))
    return Ingress(app.ctx, table, ing.v2, ing.front)


def call(ing: Ingress, method: str, path: str) -> tuple[int, Any, str | None]:
    scope = {"type": "http", "method": method, "path": path, "headers": [], "query_string": b"", "root_path": ""}
    reply = asyncio.run(ing(Request(scope)))
    return reply.status_code, json.loads(reply.body), reply.headers.get("allow")


async def echo(self: V1, request: Request) -> Response:
    return JSONResponse({"echo": request.path_params})


async def trace(self: V2, request: Request, params: dict[str, str]) -> Response:
    return JSONResponse({"trace": params})


@pytest.fixture
def planted(monkeypatch: pytest.MonkeyPatch) -> Planted:
    """A copy of the table with two entries more: a templated v1 route (documented) and a V2 model path (not)."""
    monkeypatch.setattr(V1, "echo", echo, raising=False)
    monkeypatch.setattr(V2, "trace", trace, raising=False)
    return (
        (V1, Route("GET", "/v1/echo/{word}[/times/{n}]", V1.echo, Doc("Echo a word", "state", None))),  # type: ignore[attr-defined]
        (V2, Route("GET", v2.MODEL_PATH + "/trace", V2.trace)),  # type: ignore[attr-defined]
    )


def test_a_planted_entry_is_dispatched_exact_and_templated(planted: Planted) -> None:
    ing = ingress(planted)
    assert call(ing, "GET", "/v1/echo/hi") == (200, {"echo": {"word": "hi", "n": ""}}, None)
    assert call(ing, "GET", "/v1/echo/hi/times/3/") == (200, {"echo": {"word": "hi", "n": "3"}}, None)
    assert call(ing, "POST", "/v1/echo/hi")[:2] == (
        405,
        {"error": {"code": "method_not_allowed", "message": "POST not allowed"}},
    )
    assert call(ing, "GET", "/v1/echo")[0] == 404
    assert call(ing, "GET", "/healthz")[:2] == (200, {"status": "ok"})  # the declared routes as they were
    bare = ingress()  # without the entry, nothing else answers it
    assert call(bare, "GET", "/v1/echo/hi")[:2] == (
        404,
        {"error": {"code": "not_found", "message": "no route /v1/echo/hi"}},
    )


def test_a_planted_v2_entry_is_matched_with_the_models_name_and_version(planted: Planted) -> None:
    ing = ingress(planted)
    assert call(ing, "GET", "/v2/models/classifier/trace") == (
        200,
        {"trace": {"model": "classifier", "version": ""}},
        None,
    )
    assert call(ing, "GET", "/v2/models/m/versions/1/trace")[1] == {"trace": {"model": "m", "version": "1"}}
    status, body, allow = call(ing, "POST", "/v2/models/m/trace")
    assert (status, allow) == (405, "GET") and body == {"error": "POST is not allowed on /v2/models/m/trace; use GET"}
    found = v2.match_v2_path("GET", "/v2/models/m/trace", ing.routes.v2)
    assert found is not None and found[0].name == "trace" and found[1] == {"model": "m", "version": ""}
    assert call(ingress(), "GET", "/v2/models/m/trace") == (404, {"error": "no route /v2/models/m/trace"}, None)


def test_a_planted_entry_is_in_the_openapi_document_with_its_path_parameters(planted: Planted) -> None:
    ing = ingress(planted)
    status, doc, _ = call(ing, "GET", "/openapi.json")  # served from the very table the Ingress dispatches on
    assert status == 200
    OpenAPIV31SpecValidator(doc).validate()
    before = build_openapi(ROUTES, Limits(), "X-User-Id", "X-Model-Variant", VARIANTS)
    added = [p for p in doc["paths"] if p not in before["paths"]]
    assert added == ["/v1/echo/{word}", "/v1/echo/{word}/times/{n}"]  # documented: its V2 twin is not (V2 never is)
    assert {p: doc["paths"][p] for p in before["paths"]} == before["paths"]
    op = doc["paths"]["/v1/echo/{word}/times/{n}"]["get"]
    assert op["summary"] == "Echo a word" and op["operationId"] == "get_v1_echo_word_times_n"
    assert [(p["name"], p["in"], p["required"]) for p in op["parameters"]] == [
        ("word", "path", True),
        ("n", "path", True),
    ]


def test_every_entry_of_the_table_is_dispatched_to_its_handler() -> None:
    ing = router(VARIANTS, CONFIG).ingress
    for route in ing.routes.table:
        path = PathTemplate(route.path).expand()[-1].replace("{", "x").replace("}", "")
        if v2.is_v2_path(route.path):
            found = v2.match_v2_path(route.method, path, ing.routes.v2)
            assert found is not None and found[0] == route, route
        else:
            resource = ing.routes.http.resource(path)
            assert resource is not None and resource[0][route.method] == route, route
    documented = {(r.method, r.path) for r in ROUTES if r.doc}
    assert documented == {(r.method, r.path) for r in ROUTES if not v2.is_v2_path(r.path)}  # every v1 route, no V2


def test_the_declared_table_is_the_bound_one() -> None:
    """ROUTES (the classes' functions, what the document reads) and a Router's table (its parts' methods) are one."""
    bound = router(VARIANTS, CONFIG).ingress.routes.table
    assert [(r.method, r.path, r.doc, r.admin) for r in bound] == [(r.method, r.path, r.doc, r.admin) for r in ROUTES]
    assert [r.handler.__func__ for r in bound] == [r.handler for r in ROUTES]  # type: ignore[attr-defined]


def test_the_path_grammar() -> None:
    t = PathTemplate("/v2/models/{model}[/versions/{version}]/infer")
    assert t.params == ("model", "version") and not t.literal
    assert t.match("/v2/models/m/infer") == {"model": "m", "version": ""}
    assert t.match("/v2/models/m/versions/2/infer") == {"model": "m", "version": "2"}
    assert t.match("/v2/models/a/b/infer") is None and t.match("/v2/models//infer") is None
    assert t.expand() == ["/v2/models/{model}/infer", "/v2/models/{model}/versions/{version}/infer"]
    assert PathTemplate("/v1/classify").literal and PathTemplate("/v1/classify").expand() == ["/v1/classify"]
    for bad in ("/a[", "/a]", "/{a}/{a}", "a", "/{1}"):
        with pytest.raises(ValueError):
            PathTemplate(bad)


def test_a_literal_path_wins_over_a_template_and_a_path_is_declared_once() -> None:
    table = PathTable([("GET", "/m/{name}", "one"), ("GET", "/m/stats", "all"), ("POST", "/m/{name}", "post")])
    assert table.resource("/m/stats") == ({"GET": "all"}, {})
    assert table.resource("/m/x") == ({"GET": "one", "POST": "post"}, {"name": "x"})
    assert table.resource("/n") is None
    with pytest.raises(ValueError, match="declared twice"):
        PathTable([("GET", "/a", 1), ("GET", "/a", 2)])
