"""Decoding in the Router (`decode_in: router`): ServeBackend's local path, and the config that selects it. No Ray.

The backend's Preprocessor calls become Tasks on the Router's own loop, under the same DecodeBudget; the Classifier
handle (a stand-in here: a real one needs a Serve replica) gets the decoded Pixels by value.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import numpy as np
import pytest

import app.serve.preprocessor as preprocessor_module
from app.config import AppArgs, Limits, validate_serve_config
from app.errors import ServiceError
from app.imaging.payloads import Encoded, Pixels
from app.serve.handles import ServeBackend
from app.serve.preprocessor import Decoder
from tests.conftest import BlockingDecode, load_config
from tests.hostile import cv_encode, pattern_image, png_16bit_rgba_bomb


class Handle:
    """What ServeBackend uses of a Classifier's DeploymentHandle: `.remote(...)`, awaitable."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def remote(self, *args: Any) -> asyncio.Future[Any]:
        self.calls.append(args)
        pixels = args[0]
        assert isinstance(pixels, Pixels)  # decoded here and sent by value, never a Task
        return asyncio.ensure_future(asyncio.sleep(0, {"rows": len(pixels.array), "errors": sorted(pixels.errors)}))


def backend(handle: Handle, limits: Limits | None = None) -> ServeBackend:
    return ServeBackend(None, {"fp32": handle}, ledger=None, decoder=Decoder(limits or Limits()))  # type: ignore[arg-type]


def jpeg() -> bytes:
    return cv_encode(".jpg", pattern_image(64, 96))


def test_the_router_decodes_and_sends_the_pixels_on() -> None:
    handle = Handle()

    async def main() -> None:
        b = backend(handle)
        pixels = b.preprocess([jpeg(), png_16bit_rgba_bomb(), jpeg()], 32, time.time() + 10)
        answer = await b.result(b.classify("fp32", pixels, 5, False, None))
        assert answer == {"rows": 2, "errors": [1]}  # the bomb refused from its header, only its own position
        again = await b.result(b.classify("fp32", pixels, 10, True, [1]))  # a shadow run: the same pixels
        assert again == {"rows": 1, "errors": []} and handle.calls[1][1:] == (10, True)  # only its rows travel
        first, sampled = handle.calls[0][0], handle.calls[1][0]
        assert sampled.positions == [2] and np.array_equal(sampled.array[0], first.array[1])
        assert b.decoder is not None and b.decoder.budget.in_flight == 0

    asyncio.run(main())


def test_a_decode_past_its_deadline_is_the_services_503() -> None:
    async def main() -> None:
        b = backend(Handle())
        with pytest.raises(ServiceError) as info:
            await b.result(b.classify("fp32", b.preprocess([jpeg()], 32, time.time() - 1), 5, False, None))
        assert info.value.code == "inference_timeout" and info.value.status == 503

    asyncio.run(main())


def test_cancelling_the_classify_call_cancels_its_decode(monkeypatch: pytest.MonkeyPatch) -> None:
    """A deadline or a client gone cancels the call; the decode behind it stops before its next image."""
    slow = BlockingDecode()
    monkeypatch.setattr(preprocessor_module, "preprocess", slow)
    handle = Handle()

    async def main() -> None:
        b = backend(handle)
        pixels = b.preprocess([jpeg(), jpeg()], 32, time.time() + 30)
        call = b.classify("fp32", pixels, 5, False, None)
        await asyncio.get_running_loop().run_in_executor(None, slow.started.wait, 30)
        call.cancel()
        slow.release.set()
        with pytest.raises(asyncio.CancelledError):
            await call
        with pytest.raises(asyncio.CancelledError):  # the cancellation reached the decode (synchronously)
            await pixels

    asyncio.run(main())
    assert len(slow.calls) == 1 and handle.calls == []  # the second image never started, no Classifier call


class Response:
    """A Classifier call that never answers, and says whether Serve was asked to cancel it."""

    def __init__(self) -> None:
        self.cancelled = False
        self._never: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

    def __await__(self) -> Any:
        return self._never.__await__()

    def cancel(self) -> None:
        self.cancelled = True


def test_cancelling_the_call_after_the_decode_cancels_the_classifier_request_at_serve() -> None:
    """A deadline (or a client gone) on the classify call reaches Serve: the inference's batch slot is given back."""
    responses: list[Response] = []

    class Stuck:
        def remote(self, *args: Any) -> Response:
            responses.append(Response())
            return responses[-1]

    async def main() -> None:
        b = ServeBackend(None, {"fp32": Stuck()}, ledger=None, decoder=Decoder(Limits()))  # type: ignore[arg-type]
        call = b.classify("fp32", b.preprocess([jpeg()], 32, time.time() + 30), 5, False, None)
        while not responses:  # the decode finished and the Classifier call went out
            await asyncio.sleep(0.005)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        assert responses[0].cancelled

    asyncio.run(asyncio.wait_for(main(), 30))


def test_a_backend_has_one_way_to_decode() -> None:
    with pytest.raises(ValueError, match="not both"):
        ServeBackend(object(), {}, ledger=None, decoder=Decoder(Limits()))  # type: ignore[arg-type]


def test_without_a_decoder_the_encoded_images_go_to_the_classifier() -> None:
    """decode_in: gpu: no Preprocessor, no decoder here; the Classifier gets the bytes and the deadline, and a shadow's
    `rows` (which pick among the images the Classifier decodes)."""
    sent: list[tuple[Any, ...]] = []

    class Handle:
        def remote(self, *args: Any) -> Any:
            sent.append(args)
            done: asyncio.Future[str] = asyncio.get_running_loop().create_future()
            done.set_result("scores")
            return done

    async def main() -> None:
        b = ServeBackend(None, {"fp32": Handle()}, ledger=None)  # type: ignore[arg-type, dict-item]
        encoded = b.preprocess([jpeg(), b"png"], 32, 1234.5)
        assert await b.classify("fp32", encoded, 5, False, None) == "scores"
        assert await b.classify("fp32", encoded, 3, False, [1]) == "scores"

    asyncio.run(main())
    (first, top, full), (again, top2, full2, rows) = sent
    assert isinstance(first, Encoded) and first is again
    assert first.images == [jpeg(), b"png"] and first.wall_deadline == 1234.5
    assert (top, full, top2, full2, rows) == (5, False, 3, False, [1])


def test_local_yaml_decodes_in_the_router_and_prod_in_a_preprocessor() -> None:
    local, prod = load_config("local.yaml"), load_config("prod.yaml")
    assert validate_serve_config(local).decode_in == "router"
    assert "Preprocessor" not in {d["name"] for d in local["applications"][0]["deployments"]}
    assert validate_serve_config(prod).decode_in == "preprocessor"
    assert AppArgs().decode_in == "preprocessor"


def test_a_preprocessor_deployment_beside_decode_in_router_is_refused_naming_both() -> None:
    cfg = load_config("local.yaml")
    cfg["applications"][0]["deployments"].append({"name": "Preprocessor", "num_replicas": 1})
    with pytest.raises(ValueError, match=r"deployments\[Preprocessor\].*decode_in is router"):
        validate_serve_config(cfg)
