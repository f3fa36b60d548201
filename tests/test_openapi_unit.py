"""The OpenAPI 3.1 document and /docs without Ray: the document validates, documents every v1 route with
the status table's errors, and the bodies the real code builds fit its schemas. Live: test_openapi_live.py."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from openapi_spec_validator import OpenAPIV31SpecValidator
from starlette.requests import Request

from app import __version__
from app.config import Limits
from app.errors import STATUS, ServiceError
from app.http import docs
from app.http.openapi import build_openapi
from app.http.routes import ROUTES
from app.pipeline.abstats import ABStats
from app.pipeline.group_run import Outcome
from app.protocol import v1
from tests.openapi_support import check, component, declared, fits
from tests.test_ingress_rollout_unit import router

VARIANTS = ["fp32", "int8"]


def document(limits: Limits | None = None, sticky: str = "X-User-Id", override: str = "X-Model-Variant") -> Any:
    return build_openapi(ROUTES, limits or Limits(), sticky, override, VARIANTS)


def route_table() -> tuple[dict[tuple[str, str], Any], set[tuple[str, str]]]:
    """The Router's HTTP routes and its admin ones, from the one route table (app/http/routes.py) as the Router
    assembles it (on a fake backend)."""
    routes = router(VARIANTS, {"weights": {"fp32": 1, "int8": 1}}).ingress.routes.http.exact
    by_method = {(m, p): r for p, methods in routes.items() for m, r in methods.items()}
    return {k: r.handler for k, r in by_method.items()}, {k for k, r in by_method.items() if r.admin}


def operations(doc: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(m.upper(), p): op for p, item in doc["paths"].items() for m, op in item.items()}


def test_the_document_is_valid_openapi_3_1() -> None:
    doc = document()
    OpenAPIV31SpecValidator(doc).validate()
    assert doc["openapi"] == "3.1.0" and doc["info"]["version"] == __version__
    json.dumps(doc, allow_nan=False)  # plain JSON


def test_the_document_names_no_source_file() -> None:
    """What the API's readers see (descriptions, schema docstrings) says what and why, never where in app/ it lives."""
    assert re.findall(r"app/[\w/]+", json.dumps(document())) == []


def test_every_route_of_the_table_is_documented_and_nothing_else() -> None:
    routes, admin = route_table()
    ops = operations(document())
    assert set(ops) == set(routes)
    secured = {k for k, op in ops.items() if op.get("security")}
    assert secured == admin == {("POST", "/v1/ab/reset"), ("POST", "/v1/rollout"), ("POST", "/v1/rollout/abort")}
    assert ops[("POST", "/v1/ab/reset")]["security"] == [{"adminBearer": []}]


def test_every_error_response_is_the_error_body_with_the_status_tables_codes() -> None:
    doc = document()
    for (method, path), op in operations(doc).items():
        for status, response in op["responses"].items():
            if status in ("200", "202"):
                continue
            codes = response["description"].split(", ")
            assert codes and all(STATUS[c] == int(status) for c in codes), (path, status)
            schema = declared(doc, path, method, status)
            examples = response["content"]["application/json"]["examples"]
            assert list(examples) == codes
            for code in codes:  # what ServiceError.body() sends fits, whatever the schema's name
                assert fits(doc, schema, ServiceError(code, "a message").body() | _readyz_extra(path, status))
                check(doc, schema, examples[code]["value"])
            assert not fits(doc, schema, {"error": "flat, as V2 has it"})
            if status == "503":
                assert response["headers"]["Retry-After"]["schema"]["const"] == 1
        assert "414" in op["responses"] and "500" in op["responses"]  # every route passes the Router's checks


def _readyz_extra(path: str, status: str) -> dict[str, Any]:
    return {"variants": {"fp32": False, "int8": True}} if (path, status) == ("/readyz", "503") else {}


def test_classification_documents_its_statuses_headers_and_bodies() -> None:
    ops = operations(document(Limits(max_top_k=7, default_top_k=3, max_batch_files=4), "X-Who", "X-Which"))
    single, batch = ops[("POST", "/v1/classify")], ops[("POST", "/v1/classify/batch")]
    assert set(single["responses"]) == {"200", "400", "403", "408", "413", "414", "415", "422", "500", "503"}
    assert set(batch["responses"]) == set(single["responses"])
    params = {p["name"]: p for p in single["parameters"]}
    assert params["top_k"]["schema"] == {"type": "integer", "minimum": 1, "maximum": 7, "default": 3}
    assert params["X-Who"]["in"] == params["X-Which"]["in"] == "header"
    assert params["X-Which"]["schema"]["enum"] == VARIANTS
    assert set(single["requestBody"]["content"]) == {"image/*", "application/octet-stream", "multipart/form-data"}
    assert set(batch["requestBody"]["content"]) == {"multipart/form-data"}
    files = batch["requestBody"]["content"]["multipart/form-data"]["schema"]["properties"]["file"]
    assert (files["minItems"], files["maxItems"]) == (1, 4)
    assert set(ops[("POST", "/v1/ab/reset")]["responses"]) == {"200", "401", "403", "414", "500", "503"}
    assert set(ops[("GET", "/readyz")]["responses"]) == {"200", "414", "500", "503"}


def test_bodies_built_by_the_real_code_fit_their_schemas() -> None:
    doc = document()
    stats = ABStats()
    stats.record_request("fp32", 12.5, ok=True)
    stats.record_request("int8", 0.0, ok=False)
    stats.record_shadow("fp32", "int8", True, 0.8, 0.01)
    stats.record_dropped_shadow("fp32", "int8")
    summary = {"since": 1.7e9, **stats.summary()}
    check(doc, declared(doc, "/v1/ab/summary", "GET", 200), summary)
    check(doc, declared(doc, "/v1/ab/summary", "GET", 200), {"since": 1.7e9, **ABStats().summary()})
    check(doc, declared(doc, "/v1/ab/reset", "POST", 200), {"reset": True, "before": summary})
    entry_error = {**ServiceError("undecodable_image", "bad").body(), "status": 400}
    assert fits(doc, component("BatchEntryError"), entry_error)
    assert fits(doc, component("Limits"), Limits().model_dump())
    assert not fits(doc, component("ErrorBody"), {"error": {"code": "no_such_code", "message": "m"}})
    assert not fits(doc, component("Health"), {"status": "ok", "extra": 1})  # closed objects catch drift


def test_the_docs_assets_ship_with_swagger_ui_5_which_reads_openapi_3_1() -> None:
    folder = docs.swagger_ui_dir()
    major = re.fullmatch(r"swagger-ui-(\d+)\.\d+\.\d+", folder.name)
    assert major and int(major.group(1)) >= 5, folder.name
    for name, (source, media) in docs.ASSETS.items():
        assert len(docs.asset(name)) > 0
        assert source is None or (folder / source).is_file()
        assert media.split(";")[0] in ("text/javascript", "text/css")
    assert b"SwaggerUIBundle" in docs.asset("swagger-ui-bundle.js")


def call(handler: Any, path: str) -> Any:
    scope = {"type": "http", "method": "GET", "path": path, "headers": [], "query_string": b""}
    return asyncio.run(handler(Request(scope)))


def test_the_docs_page_loads_only_its_own_assets() -> None:
    routes, _ = route_table()
    page = call(routes[("GET", "/docs")], "/docs")
    html = page.body.decode()
    assert page.media_type == "text/html" and "default-src 'self'" in page.headers["content-security-policy"]
    urls = re.findall(r'(?:src|href)="([^"]*)"', html)
    assert not [u for u in urls if "//" in u]
    # relative to the page, so /docs works under an application's route_prefix too
    local = ["/" + u for u in urls if u.startswith("docs/")]
    assert sorted(local) == sorted(docs.asset_media())
    for url in local:
        reply = call(routes[("GET", url)], url)
        assert reply.status_code == 200 and reply.headers["content-type"].startswith(docs.asset_media()[url])
    assert "//" not in docs.asset("init.js").decode().replace("// ", "")
    spec = call(routes[("GET", "/openapi.json")], "/openapi.json")
    assert spec.media_type == "application/json" and json.loads(spec.body) == document()


def test_the_document_and_its_models_are_pure() -> None:
    code = (
        "import sys, app.http.openapi, app.protocol.v1\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('ray', 'starlette'))\n"
        "print(bad); sys.exit(1 if bad else 0)\n"
    )
    root = Path(__file__).resolve().parent.parent
    done = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("route", [r for r in ROUTES if r.doc], ids=lambda r: f"{r.method} {r.path}")
def test_each_operation_has_a_summary_and_a_tag(route: Any) -> None:
    assert route.doc.summary and route.doc.tag and route.path.startswith("/")


def test_a_score_past_one_by_a_rounding_error_is_one_not_a_refused_reply() -> None:
    """A graph declared `output: probabilities` may give 1.0000005: the reply says 1.0 (its schema's bound), where
    building the reply from the model would otherwise fail the request."""
    routes, _ = route_table()
    handler = routes[("POST", "/v1/classify")].__self__
    outcome = Outcome("fp32", "weighted", False, {0: [(1, 1.0000005), (0, -1e-9)]}, {})
    fields = handler._classification(outcome, 0, "r", 2, ["a", "b"])
    took = v1.RequestTimings(preprocess=1, queue=0, inference=2, batch_size=1, receive=0, total=3)
    body = v1.ClassifyResponse(**fields, timings_ms=took)
    assert [(p.label, p.score) for p in body.predictions] == [("b", 1.0), ("a", 0.0)]
    assert "failover" not in body.model_dump_json(exclude_defaults=True)
