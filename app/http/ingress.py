"""The Router's HTTP front door: each request goes to its handler in the route table (a path under /v2 to V2's
dispatch, in the protocol's error shape; any other to its route, exact or templated).

Before a handler runs: the admission front's mark is noted, the URL's size is checked, an admin route's bearer
token is checked; after: an error of any kind is the endpoint's JSON error (V2: the protocol's), never a 500
page, and the replica keeps serving.

Traced (`app.tracing.spans`): each request is an HTTP server span, a child of Serve's span for it or of the caller's
`traceparent`, current while its handler runs; a recorded one's `traceparent` goes back in the reply's header.
"""

from __future__ import annotations

import logging

from starlette.requests import Request
from starlette.responses import Response

from app.errors import ServiceError
from app.http.context import RouterContext
from app.http.front_report import FrontReport
from app.http.routes import Routes
from app.http.v2_rest import V2
from app.protocol import v2 as proto
from app.request.guards import check_admin, check_url
from app.tracing import spans

logger = logging.getLogger("ray.serve")


class Ingress:
    def __init__(self, ctx: RouterContext, routes: Routes, v2: V2, front: FrontReport) -> None:
        """routes: the bound table; v2: the /v2 dispatch; front: the admission fronts this Router's requests came
        through."""
        self.replies, self.policy, self.limits = ctx.replies, ctx.policy, ctx.limits
        self.routes = routes
        self.v2 = v2
        self.front = front

    async def __call__(self, request: Request) -> Response:
        if spans.ENABLED:
            return await self._traced(request)
        return await self._handle(request)

    async def _traced(self, request: Request) -> Response:
        """The request as an HTTP server span (OpenTelemetry's HTTP semantic conventions): a 5xx is its error status,
        a 4xx is the client's (error.type set, status left unset, as the conventions say for a server span)."""
        h = request.headers
        parent = spans.incoming(h.get("traceparent"), h.get("tracestate"))
        attributes = {"http.request.method": request.method, "url.path": request.url.path, "url.scheme": "http"}
        span = spans.start(request.method, parent, "SERVER", attributes)
        try:
            with spans.use(span):
                response = await self._handle(request)
        except BaseException as e:  # the client went away (cancelled): the span says so and ends
            spans.annotate({"error.type": type(e).__name__}, span)
            span.end()
            raise
        status = response.status_code
        spans.annotate({"http.response.status_code": status}, span)
        if status >= 500:
            spans.fail(span, f"HTTP {status}")
        header = spans.traceparent(span)
        if header is not None:
            response.headers["traceparent"] = header
        span.end()
        return response

    async def _handle(self, request: Request) -> Response:
        self.front.saw(request.headers.get("x-app-front"))
        path = app_path(request).rstrip("/") or "/"
        is_v2 = proto.is_v2_path(path)
        try:
            raw_path = request.scope.get("raw_path") or request.url.path.encode()
            check_url(raw_path, request.scope.get("query_string") or b"", self.limits.max_url_bytes)
        except ServiceError as e:
            return self.replies.v2_error(e) if is_v2 else self.replies.error("other", e)
        if is_v2:
            return await self.v2.dispatch(request, path, self.routes.v2)
        found = self.routes.http.resource(path)
        if found is None:
            return self.replies.error("other", ServiceError("not_found", f"no route {request.url.path}"))
        methods, params = found
        route = methods.get(request.method)
        if route is None:
            return self.replies.error("other", ServiceError("method_not_allowed", f"{request.method} not allowed"))
        if params:  # a template's parameters, where Starlette keeps them (request.path_params)
            request.scope["path_params"] = params
        spans.name_route(request.method, route.path)
        try:
            if route.admin:
                anyone = self.policy.config.allow_unauthenticated_admin
                check_admin(request.headers.get("authorization"), self.policy.admin_token, anyone)
            return await route.handler(request)
        except ServiceError as e:
            return self.replies.error(path, e)
        except Exception as e:  # a bug, not an input's fault: keep the replica serving
            logger.exception("unhandled error on %s %s", request.method, request.url.path)
            return self.replies.error(path, ServiceError("internal_error", f"internal error ({type(e).__name__})"))


def app_path(request: Request) -> str:
    """The request's path within this application: Serve puts the application's route_prefix in the ASGI
    `root_path` and leaves it in `path` too, so an app deployed at /lite1 sees /lite1/v1/classify as /v1/classify."""
    path, root = request.url.path, request.scope.get("root_path") or ""
    return path[len(root) :] or "/" if root and path.startswith(root) else path
