"""The Open Inference Protocol's health replies (app/http/v2_rest.py, app/protocol/v2/metadata.py): the bodies KServe's
clients read (`{"live": true}`, `{"ready": bool}`, `{"name", "ready"}`) and the status tritonclient reads (200, or
503 when not ready). The handlers and their Starlette replies are the real ones; the variants' readiness is stood in
for (a replica that is not ready cannot be had on demand without a cluster), and so are the metrics (Ray's). The live
app answers the same, through HAProxy, to both clients: tests/test_kserve_client.py."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any

import pytest

from app.config import Limits
from app.errors import ServiceError
from app.http.replies import Replies
from app.http.v2_rest import V2
from app.protocol import v2

MODEL = "efficientnet_lite0-fp32"


class Variants:
    """Stands in for V2DataPlane' readiness: the variants named in `down` are not ready; one model is known."""

    def __init__(self, down: list[str]) -> None:
        self.down = down

    async def ready(self, model: str | None = None, version: str | None = None) -> list[str]:
        if model is not None and model != MODEL:
            raise ServiceError("not_found", f"unknown model {model!r}")
        return self.down


class Metrics:
    def __init__(self) -> None:
        self.errors: list[tuple[Any, ...]] = []

    def error(self, *tags: Any) -> None:
        self.errors.append(tags)


def handlers(down: list[str]) -> tuple[V2, Metrics]:
    metrics = Metrics()
    ctx: Any = SimpleNamespace(limits=Limits(), policy=None, bodies=None, replies=Replies(metrics))  # type: ignore[arg-type]
    return V2(ctx, Variants(down), None), metrics  # type: ignore[arg-type]


def answer(call: Any) -> tuple[int, dict[str, Any], Any]:
    reply = asyncio.run(call)
    assert reply.headers["content-type"] == "application/json"
    return reply.status_code, json.loads(reply.body), reply.headers


def test_live_and_ready_answer_the_protocols_bodies() -> None:
    ops, _ = handlers([])
    assert answer(ops.server_live(None, {}))[:2] == (200, {"live": True})
    assert answer(ops.server_ready(None, {}))[:2] == (200, {"ready": True})
    assert answer(ops.model_ready(None, {"model": MODEL}))[:2] == (200, {"name": MODEL, "ready": True})
    assert answer(ops.model_ready(None, {"model": MODEL, "version": "1"}))[:2] == (200, {"name": MODEL, "ready": True})


def test_not_ready_is_503_with_ready_false_and_the_protocols_error() -> None:
    ops, metrics = handlers(["int8"])
    status, body, headers = answer(ops.server_ready(None, {}))
    assert (status, body["ready"]) == (503, False) and "int8" in body["error"] and set(body) == {"ready", "error"}
    assert "retry-after" in headers  # every 503 of the service carries it
    status, body, _ = answer(ops.model_ready(None, {"model": MODEL}))
    assert (status, body["name"], body["ready"]) == (503, MODEL, False) and "int8" in body["error"]
    assert [m[:3] for m in metrics.errors] == [("/v2", "not_ready", 503)] * 2  # counted as errors, as before


def test_an_unknown_model_is_the_protocols_404() -> None:
    ops, _ = handlers([])
    with pytest.raises(ServiceError) as e:  # dispatch turns it into {"error": ...} 404, as for every operation
        asyncio.run(ops.model_ready(None, {"model": "resnet50"}))
    assert e.value.status == 404


@pytest.mark.parametrize("model", [None, MODEL])
def test_readiness_bodies(model: str | None) -> None:
    for ready in (True, False):
        body = v2.readiness(ready, model)
        assert body["ready"] is ready and body.get("name") == model
    assert v2.server_live() == {"live": True}
