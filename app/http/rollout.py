"""GET /v1/rollout, POST /v1/rollout, POST /v1/rollout/abort: the rollout controller's API on the ingress.

The controller is its own deployment (app/serve/deployments.py's RolloutController, logic in app/rollout/); the
Router only relays. Starting and aborting change the weights, so they are admin routes (bearer token).
"""

from __future__ import annotations

import json
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from app.errors import ServiceError
from app.http.ingress import Ingress
from app.http.replies import json_response

ROLLOUT, ABORT = "/v1/rollout", "/v1/rollout/abort"
MAX_SPEC_BYTES = 16 * 1024  # a spec is a few hundred bytes


class RolloutAPI:
    def __init__(self, ingress: Ingress) -> None:
        self.ing = ingress
        ingress.routes.update({("GET", ROLLOUT): self.get, ("POST", ROLLOUT): self.start, ("POST", ABORT): self.abort})
        ingress.admin_routes.update({("POST", ROLLOUT), ("POST", ABORT)})

    async def _call(self, method: str, *args: Any) -> Any:
        pipeline = self.ing.pipeline
        return await pipeline.ask(pipeline.backend.rollout(method, *args), 10.0)

    async def get(self, request: Request) -> Response:
        return json_response({"model": self.ing.args.model.name, **await self._call("get")})

    async def start(self, request: Request) -> Response:
        raw = await self.ing.receive(request, MAX_SPEC_BYTES)
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            raise ServiceError("bad_request", "the rollout spec must be a JSON object") from None
        if not isinstance(body, dict):
            raise ServiceError("bad_request", "the rollout spec must be a JSON object")
        ing = self.ing
        router = {"config_id": ing.config_id, "weights": ing.base.weights if ing.base else None}
        return json_response({"model": ing.args.model.name, **await self._call("start", body, router)}, 202)

    async def abort(self, request: Request) -> Response:
        return json_response({"model": self.ing.args.model.name, **await self._call("abort")})
