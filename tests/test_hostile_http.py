"""The hostile-input corpus over real HTTP, then deadlines and client disconnects.

Every case must get its expected status and error code as JSON, fast; afterwards the
service still answers a valid image correctly and no replica has restarted.
"""

from __future__ import annotations

import asyncio
import collections
import socket
import time
from typing import Any

import httpx
import pytest

from app.models import ModelFiles
from app.models.samples import sample_bytes
from tests.conftest import ServeDeployer, deployment, local_config, wait_until
from tests.hostile import HostileCase, hostile_cases
from tests.test_app import replica_ids, small_png

pytestmark = pytest.mark.slow


def send(url: str, case: HostileCase) -> httpx.Response:
    headers = {"Content-Type": case.content_type} if case.content_type else {}
    return httpx.post(url + "/v1/classify", content=case.body, headers=headers, timeout=30)


def test_the_corpus_gets_its_expected_answers_and_the_service_stays_healthy(local_app: ServeDeployer) -> None:
    cases = hostile_cases()
    assert len(cases) >= 30
    before = replica_ids(local_app.url)
    wrong: list[str] = []
    slowest = 0.0
    for case in cases:
        t0 = time.perf_counter()
        r = send(local_app.url, case)
        slowest = max(slowest, time.perf_counter() - t0)
        got_code = r.json()["error"]["code"] if r.status_code != 200 else ""
        if (r.status_code, got_code) != (case.expected_status, case.expected_code):
            wrong.append(
                f"{case.name}: got {r.status_code} {got_code!r}, want {case.expected_status} {case.expected_code!r}"
            )
        assert r.headers["content-type"].startswith("application/json"), case.name
        if r.status_code != 200:
            assert r.json()["error"]["message"], case.name
    assert not wrong, "\n".join(wrong)
    assert slowest < 10, slowest  # bombs are refused from their headers, not decoded
    ok = httpx.post(
        local_app.url + "/v1/classify",
        content=sample_bytes("grace_hopper"),
        headers={"Content-Type": "image/jpeg"},
        timeout=30,
    )
    assert ok.status_code == 200 and ok.json()["predictions"][0]["class_id"] == 652
    assert replica_ids(local_app.url) == before  # nothing crashed or was restarted


def test_body_over_the_limit_is_refused_before_it_is_read(local_app: ServeDeployer) -> None:
    # A client announcing 40 MB gets 413 without sending it.
    with socket.create_connection(("127.0.0.1", int(local_app.url.rsplit(":", 1)[1])), timeout=10) as s:
        s.sendall(
            b"POST /v1/classify HTTP/1.1\r\nHost: x\r\nContent-Type: image/jpeg\r\n"
            b"Content-Length: 41943040\r\n\r\n" + b"\xff\xd8" * 512
        )
        reply = ""
        deadline = time.monotonic() + 10
        while "}}" not in reply and time.monotonic() < deadline:  # headers and the JSON body may come apart
            chunk = s.recv(65536).decode(errors="replace")
            if not chunk:
                break
            reply += chunk
    assert reply.startswith("HTTP/1.1 413"), reply[:200]
    assert "payload_too_large" in reply


def test_batch_endpoint_limits(local_app: ServeDeployer) -> None:
    files = [("file", (f"{i}.png", small_png(i), "image/png")) for i in range(65)]
    r = httpx.post(local_app.url + "/v1/classify/batch", files=files, timeout=60)
    assert r.status_code == 413 and r.json()["error"]["code"] == "too_many_files"
    r = httpx.post(local_app.url + "/v1/classify/batch", files={"other": ("a", b"x", "image/png")}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["code"] == "missing_file"


def test_inference_deadline_returns_503_with_retry_after(local_app: ServeDeployer, model_files: ModelFiles) -> None:
    # A deadline shorter than one inference: every request must come back 503 inference_timeout, quickly.
    local_app.deploy(local_config(model_files, inference_timeout_s=0.002))
    try:
        for _ in range(3):
            t0 = time.perf_counter()
            r = httpx.post(
                local_app.url + "/v1/classify",
                content=sample_bytes("coffee"),
                headers={"Content-Type": "image/png"},
                timeout=30,
            )
            assert r.status_code == 503 and r.json()["error"]["code"] == "inference_timeout", r.text
            assert r.headers["retry-after"] == "1"
            assert time.perf_counter() - t0 < 2
    finally:
        local_app.deploy(local_config(model_files))
    assert (
        httpx.post(
            local_app.url + "/v1/classify",
            content=sample_bytes("coffee"),
            headers={"Content-Type": "image/png"},
            timeout=30,
        ).status_code
        == 200
    )


def test_client_disconnect_cancels_the_request(local_app: ServeDeployer, model_files: ModelFiles) -> None:
    # fp32 batches wait a full second to fill, so a request is still queued when its client leaves.
    cfg = local_config(model_files)
    deployment(cfg, "Classifier_fp32")["user_config"].update(batch_wait_timeout_s=1.0, max_concurrent_batches=1)
    local_app.deploy(cfg)
    try:
        before = _cancelled_total(local_app.url)

        async def leave_early() -> None:
            async with httpx.AsyncClient(base_url=local_app.url, timeout=0.3) as client:
                with pytest.raises(httpx.TimeoutException):
                    await client.post(
                        "/v1/classify",
                        content=sample_bytes("coffee"),
                        headers={"Content-Type": "image/png", "X-Model-Variant": "fp32"},
                    )

        asyncio.run(leave_early())
        wait_until(lambda: _cancelled_total(local_app.url) > before, 30, 0.5, "cancellation recorded")
    finally:
        local_app.deploy(local_config(model_files))


def _cancelled_total(url: str) -> int:
    return int(httpx.get(url + "/v1/models", timeout=10).json()["cancelled_requests"])


def test_overload_on_one_machine_sheds_with_503_not_errors(local_app: ServeDeployer, model_files: ModelFiles) -> None:
    # Tight limits so a short burst saturates them: the Router's in-flight cap sheds the excess.
    local_app.deploy(local_config(model_files, max_in_flight=4))
    try:

        async def burst() -> list[httpx.Response]:
            limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
            async with httpx.AsyncClient(base_url=local_app.url, timeout=30, limits=limits) as client:
                return await asyncio.gather(
                    *(
                        client.post(
                            "/v1/classify", content=sample_bytes("coffee"), headers={"Content-Type": "image/png"}
                        )
                        for _ in range(48)
                    )
                )

        responses = asyncio.run(burst())
        by: dict[Any, int] = collections.Counter(r.status_code for r in responses)
        assert set(by) <= {200, 503} and by[200] >= 4 and by[503] >= 1, by
        for r in responses:
            if r.status_code == 503:
                assert r.json()["error"]["code"] == "overloaded" and r.headers["retry-after"] == "1"
    finally:
        local_app.deploy(local_config(model_files))
