"""GET /v1/rollout, POST /v1/rollout, POST /v1/rollout/abort: the rollout controller's API on the ingress.

The controller is its own deployment (the RolloutController, its logic the rollout package's); the
Router only relays. Starting and aborting change the weights, so they are admin routes (bearer token).
"""

from __future__ import annotations

import json
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from app.errors import ServiceError
from app.http.context import RouterContext
from app.http.replies import json_response

MAX_SPEC_BYTES = 16 * 1024  # a spec is a few hundred bytes


class RolloutAPI:
    def __init__(self, ctx: RouterContext) -> None:
        self.model = ctx.args.model.name
        self.pipeline, self.policy, self.bodies = ctx.pipeline, ctx.policy, ctx.bodies

    async def _call(self, method: str, *args: Any) -> Any:
        return await self.pipeline.specs.ask(self.pipeline.backend.rollout(method, *args), 10.0)

    async def get(self, request: Request) -> Response:
        return json_response({"model": self.model, **await self._call("get")})

    async def start(self, request: Request) -> Response:
        raw = await self.bodies.receive(request, MAX_SPEC_BYTES)
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            raise ServiceError("bad_request", "the rollout spec must be a JSON object") from None
        if not isinstance(body, dict):
            raise ServiceError("bad_request", "the rollout spec must be a JSON object")
        policy = self.policy
        router = {"config_id": policy.config_id, "weights": policy.base.weights if policy.base else None}
        return json_response({"model": self.model, **await self._call("start", body, router)}, 202)

    async def abort(self, request: Request) -> Response:
        return json_response({"model": self.model, **await self._call("abort")})
