"""GET /openapi.json and GET /docs: the OpenAPI document and Swagger UI, its assets served from here (offline).

Swagger UI's files come from the `swagger-ui-bundle-v2` package (import name `swagger_ui_bundle`); only the
files in ASSETS are served, each at its own fixed path, so no request names a file.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from app.errors import ServiceError
from app.http.context import RouterContext
from app.http.openapi import Documented, build_openapi

ASSETS_AT = "/docs/assets/"
JS, CSS = "text/javascript; charset=utf-8", "text/css; charset=utf-8"
# served name -> (file in the package, or None for INIT_JS below; media type)
ASSETS: dict[str, tuple[str | None, str]] = {
    "swagger-ui.css": ("swagger-ui.css", CSS),
    "swagger-ui-bundle.js": ("swagger-ui-bundle.js", JS),
    "init.js": (None, JS),
}
INIT_JS = """window.addEventListener("load", function () {
  window.ui = SwaggerUIBundle({
    url: "openapi.json",
    dom_id: "#swagger-ui",
    deepLinking: true,
    validatorUrl: null,
    presets: [SwaggerUIBundle.presets.apis],
    layout: "BaseLayout",
  });
});
"""
PAGE = f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>Image classification API</title>
<link rel="icon" href="data:,">
<link rel="stylesheet" href="{ASSETS_AT[1:]}swagger-ui.css">
</head>
<body>
<div id="swagger-ui"></div>
<script src="{ASSETS_AT[1:]}swagger-ui-bundle.js"></script>
<script src="{ASSETS_AT[1:]}init.js"></script>
</body>
</html>
"""
# The page may load nothing from elsewhere; Swagger UI styles elements inline and draws icons as data: URLs.
CSP = "default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'; frame-ancestors 'none'"


def swagger_ui_dir() -> Path:
    from swagger_ui_bundle import swagger_ui_path  # a package of static files only

    return Path(str(swagger_ui_path))


@cache
def asset(name: str) -> bytes:
    """An asset's bytes, read once."""
    source, _ = ASSETS[name]
    return INIT_JS.encode() if source is None else (swagger_ui_dir() / source).read_bytes()


def asset_media() -> dict[str, str]:
    """Each asset's path -> media type (documented in /openapi.json too)."""
    return {ASSETS_AT + name: media.split(";")[0] for name, (_, media) in ASSETS.items()}


class Docs:
    """GET /openapi.json, GET /docs and the page's assets."""

    def __init__(self, ctx: RouterContext, routes: Sequence[Documented]) -> None:
        """routes: the table the Ingress dispatches on, which the document describes."""
        self.limits, self.variants, self.policy = ctx.limits, ctx.variants, ctx.policy
        self.routes = routes
        self._spec: tuple[tuple[Any, ...], bytes] | None = None

    async def openapi(self, request: Request) -> Response:
        cfg = self.policy.config
        root = request.scope.get("root_path") or ""  # the application's route_prefix, when it is not "/"
        key = (cfg.sticky_header, cfg.override_header, tuple(self.variants), root)
        if self._spec is None or self._spec[0] != key:  # the header names are live config
            doc = build_openapi(self.routes, self.limits, cfg.sticky_header, cfg.override_header, self.variants)
            if root:  # "Try it out" sends to the application's prefix, not the host's root
                doc["servers"] = [{"url": root}]
            self._spec = (key, json.dumps(doc, separators=(",", ":")).encode())
        return Response(self._spec[1], media_type="application/json")

    async def page(self, request: Request) -> Response:
        return Response(PAGE, media_type="text/html", headers={"Content-Security-Policy": CSP})

    async def serve_asset(self, request: Request) -> Response:
        """One of ASSETS, named by the path's last segment (the route table has one path per asset)."""
        name = request.url.path.rstrip("/").rsplit("/", 1)[-1]
        if name not in ASSETS:
            raise ServiceError("not_found", f"no route {request.url.path}")
        headers = {"Content-Type": ASSETS[name][1], "Cache-Control": "public, max-age=3600"}
        return Response(asset(name), headers=headers)
