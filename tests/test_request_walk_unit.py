"""One /v1/classify request's walk through app/'s modules, recorded call by call (sys.setprofile) on the Router's
parts as app/http/assembly.py puts them together, on fake handles (no Ray): it goes down the layers and comes back
by returning, never by calling up into a layer it came from (docs/architecture.md "Following one request"), except
through the ports the layers below declare (the metrics, app/http/ports.py and app/pipeline/ports.py); the request's
reading enters app/http/inputs.py once before the body and twice after it (the images, then their header check
against the chosen variant's target); the model's transform is never asked of a Classifier."""

from __future__ import annotations

import asyncio
import sys
from types import FrameType
from typing import Any

import numpy as np

from app.config import AppArgs, RouterConfig
from app.http.assembly import RouterApp
from app.imaging.opencv import cv2
from app.imaging.transform import Transform
from app.serve.metrics import RouterMetrics
from tests.test_pipeline_unit import FakeBackend

# pyproject.toml's layers contract, top first (a package's rank: its layer).
LAYERS = [
    ["app.serve"],
    ["app.http"],
    ["app.protocol", "app.pipeline", "app.rollout"],
    ["app.toolchain"],
    ["app.runtime", "app.front"],
    ["app.config"],
    ["app.served_model", "app.request"],
    ["app.imaging"],
    ["app.errors"],
]
RANK = {package: rank for rank, layer in enumerate(LAYERS) for package in layer}
# Implementations of the lower layers' ports: the metrics (app/http/ports.py, app/pipeline/ports.py) and Serve's
# handles (app/pipeline/ports.py's Backend; FakeBackend here, outside app/).
PORTS = {"app.serve.metrics", "app.serve.handles"}


def package(module: str) -> str:
    return ".".join(module.split(".")[:2])


def climbs(calls: list[tuple[str, str, str]]) -> list[tuple[str, str, str]]:
    """The calls from a package into one of a higher layer, other than into a port's implementation."""
    return [
        (a, b, f)
        for a, b, f in calls
        if package(a) in RANK and package(b) in RANK and RANK[package(b)] < RANK[package(a)] and b not in PORTS
    ]


def router(backend: FakeBackend) -> RouterApp:
    args = AppArgs.model_validate(
        {
            "model": {"name": "classifier"},
            "variants": {"fp32": {"model_path": "fp32.onnx"}},
            "check_model_files": False,
            "build_default_models": False,
        }
    )
    transform = Transform(224, 224, 3, 256, "cubic", "RGB")  # as build_app reads it from the model's files
    app = RouterApp(args, backend, ["fp32"], "r1", RouterMetrics("classifier"), transform=transform)
    app.configure(RouterConfig.model_validate({"weights": {"fp32": 1}}))
    return app


async def classify(app: RouterApp, body: bytes) -> Any:
    from starlette.requests import Request

    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/classify",
        "raw_path": b"/v1/classify",
        "query_string": b"top_k=2",
        "headers": [(b"content-type", b"image/jpeg"), (b"content-length", str(len(body)).encode())],
        "client": ("127.0.0.1", 1),
        "server": ("test", 80),
        "scheme": "http",
        "root_path": "",
        "http_version": "1.1",
    }
    return await app.ingress(Request(scope, receive))


def walk(app: RouterApp, body: bytes) -> tuple[Any, list[tuple[str, str, str]]]:
    """The reply, and each call from one app module into another: (caller, callee, function)."""
    calls: list[tuple[str, str, str]] = []

    def profile(frame: FrameType, event: str, _arg: object) -> None:
        if event != "call":
            return
        callee = frame.f_globals.get("__name__", "")
        caller = frame.f_back.f_globals.get("__name__", "") if frame.f_back else ""
        if callee.startswith("app.") and caller.startswith("app.") and callee != caller:
            calls.append((caller, callee, frame.f_code.co_name))

    async def go() -> Any:
        await classify(app, body)  # the first request fetches the labels once
        sys.setprofile(profile)
        try:
            return await classify(app, body)
        finally:
            sys.setprofile(None)

    return asyncio.run(asyncio.wait_for(go(), 10)), calls


def test_a_request_goes_down_the_layers_and_never_calls_back_up_but_through_a_port() -> None:
    backend = FakeBackend(("fp32",))
    jpeg = cv2.imencode(".jpg", np.full((64, 64, 3), 128, np.uint8))[1].tobytes()
    reply, calls = walk(router(backend), jpeg)
    assert reply.status_code == 200, reply.body

    assert climbs(calls) == []
    # The walk really crossed the layers it claims to (a vacuous record passes the check above).
    crossed = {(package(a), package(b)) for a, b, _ in calls}
    assert {("app.http", "app.pipeline"), ("app.http", "app.imaging"), ("app.pipeline", "app.request")} <= crossed
    read = [f for a, b, f in calls if (a, b) == ("app.http.v1", "app.http.inputs")]
    assert read == ["v1_head", "v1_images", "check_images"]
    assert backend.described == []  # the transform came by construction, not from a Classifier


def test_the_check_sees_a_call_up_a_layer_and_lets_ports_through() -> None:
    planted = [
        ("app.http.v1", "app.pipeline.service", "classify"),  # down: fine
        ("app.pipeline.service", "app.http.policy", "user"),  # up, into the handlers: caught
        ("app.imaging.preprocess", "app.config.limits", "x"),  # up, into config: caught
        ("app.pipeline.shadow", "app.serve.metrics", "shadow_outcome"),  # up, through a port: fine
    ]
    assert climbs(planted) == [planted[1], planted[2]]
