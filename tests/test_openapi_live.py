"""GET /openapi.json and /docs on the real app: the document validates, and real replies (successes and
errors) fit the schemas it declares for their path and status. Pure checks: test_openapi_unit.py."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest
from openapi_spec_validator import OpenAPIV31SpecValidator

from app.toolchain.samples import sample_bytes
from tests.conftest import ServeDeployer
from tests.openapi_support import check, component, declared

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def doc(local_app: ServeDeployer) -> dict[str, Any]:
    r = httpx.get(local_app.url + "/openapi.json", timeout=30)
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/json")
    body: dict[str, Any] = r.json()
    return body


def conforms(doc: dict[str, Any], r: httpx.Response, path: str, method: str) -> Any:
    """The reply fits the schema the document declares for its path, method and status."""
    assert r.headers["content-type"].startswith("application/json"), r.headers
    body = r.json()
    check(doc, declared(doc, path, method, r.status_code), body)
    if r.status_code == 503:
        assert r.headers["retry-after"] == "1"
    return body


def test_the_served_document_is_valid_openapi_3_1(doc: dict[str, Any]) -> None:
    OpenAPIV31SpecValidator(doc).validate()
    params = {p["name"]: p for p in doc["paths"]["/v1/classify"]["post"]["parameters"]}
    assert set(params) == {"top_k", "X-User-Id", "X-Model-Variant"}  # configs/local.yaml's header names
    assert params["X-Model-Variant"]["schema"]["enum"] == ["fp32", "int8"]


def test_classification_replies_fit_the_document(local_app: ServeDeployer, doc: dict[str, Any]) -> None:
    url = local_app.url
    photo = sample_bytes("chelsea")
    raw = httpx.post(url + "/v1/classify", content=photo, headers={"Content-Type": "image/jpeg"}, timeout=30)
    assert raw.status_code == 200, raw.text
    assert conforms(doc, raw, "/v1/classify", "POST")["predictions"][0]["class_id"] == 282
    files = {"file": ("c.jpg", photo, "image/jpeg")}
    sticky = httpx.post(url + "/v1/classify", files=files, params={"top_k": 2}, headers={"X-User-Id": "u1"}, timeout=30)
    assert conforms(doc, sticky, "/v1/classify", "POST")["routing"] == "sticky"
    parts = [("file", ("a.jpg", photo, "image/jpeg")), ("file", ("b.png", b"garbage", "image/png"))]
    batch = httpx.post(url + "/v1/classify/batch", files=parts, headers={"X-Model-Variant": "int8"}, timeout=30)
    assert batch.status_code == 200, batch.text
    results = conforms(doc, batch, "/v1/classify/batch", "POST")["results"]
    assert results[0]["predictions"] and results[1]["error"]["code"] == "undecodable_image"


def test_state_replies_fit_the_document(local_app: ServeDeployer, doc: dict[str, Any]) -> None:
    for path in ("/v1/models", "/v1/ab/summary", "/healthz", "/readyz"):
        r = httpx.get(local_app.url + path, timeout=30)
        assert r.status_code == 200, (path, r.text)
        conforms(doc, r, path, "GET")


@pytest.mark.parametrize(
    ("request_args", "status", "code"),
    [
        ({"content": b"x", "headers": {"Content-Type": "text/plain"}}, 415, "unsupported_media_type"),
        ({"content": b"", "headers": {"Content-Type": "image/png"}}, 400, "empty_body"),
        ({"content": b"jpeg", "headers": {"Content-Type": "image/jpeg"}, "params": {"top_k": 999}}, 422, None),
        ({"content": b"jpeg", "headers": {"Content-Type": "image/jpeg", "X-Model-Variant": "int4"}}, 422, None),
    ],
)
def test_error_replies_fit_the_document(
    local_app: ServeDeployer, doc: dict[str, Any], request_args: dict[str, Any], status: int, code: str | None
) -> None:
    r = httpx.post(local_app.url + "/v1/classify", timeout=30, **request_args)
    assert r.status_code == status, r.text
    body = conforms(doc, r, "/v1/classify", "POST")
    assert code is None or body["error"]["code"] == code
    batch = httpx.post(local_app.url + "/v1/classify/batch", content=b"x", headers={"Content-Type": "image/png"})
    assert batch.status_code == 415
    conforms(doc, batch, "/v1/classify/batch", "POST")


def test_unknown_paths_and_methods_answer_the_error_body(local_app: ServeDeployer, doc: dict[str, Any]) -> None:
    for r, status in ((httpx.get(local_app.url + "/v1/nothing"), 404), (httpx.post(local_app.url + "/docs"), 405)):
        assert r.status_code == status
        check(doc, component("ErrorBody"), r.json())


def test_docs_page_works_offline(local_app: ServeDeployer) -> None:
    page = httpx.get(local_app.url + "/docs", timeout=30)
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    urls = re.findall(r'(?:src|href)="([^"]*)"', page.text)
    assert not re.search(r"https?://", page.text)
    # relative, so the page works under an application's route_prefix too (/lite1/docs -> /lite1/docs/assets/...)
    assets = [u for u in urls if u.startswith("docs/assets/")]
    assert len(assets) == 3 and set(urls) - set(assets) == {"data:,"}
    for url in assets:
        r = httpx.get(f"{local_app.url}/{url}", timeout=30)
        assert r.status_code == 200 and r.content
        assert r.headers["content-type"].split(";")[0] in ("text/javascript", "text/css"), (url, r.headers)
    assert httpx.get(local_app.url + "/docs/assets/../../etc/passwd").status_code == 404
    assert httpx.get(local_app.url + "/docs/assets/swagger-ui.js.map").status_code == 404


def test_docs_page_renders_in_a_real_headless_browser(local_app: ServeDeployer, tmp_path: Path) -> None:
    """Chromium (no network but the app's): Swagger UI draws every v1 operation from /openapi.json; a screenshot."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("no chromium here (.ci/run installs Debian's)")
    flags = ["--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1280,1400", "--hide-scrollbars"]
    flags += ["--virtual-time-budget=15000", f"--user-data-dir={tmp_path / 'profile'}"]
    url = local_app.url + "/docs"
    dom = subprocess.run([browser, *flags, "--dump-dom", url], capture_output=True, text=True, timeout=120).stdout
    assert "swagger-ui" in dom and "OAS 3.1" in dom, dom[-2000:]
    for path in ("/v1/classify", "/v1/classify/batch", "/v1/models", "/readyz"):
        assert f'data-path="{path}"' in dom, path
    shot = tmp_path / "docs.png"
    subprocess.run([browser, *flags, f"--screenshot={shot}", url], capture_output=True, timeout=120, check=True)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000
    if out := os.environ.get("DOCS_SCREENSHOT"):  # docs/api.md's picture: DOCS_SCREENSHOT=path pytest -k headless
        shutil.copy(shot, out)
