"""The Router's limits without Ray: bodies (app/request/body_gate.py), request guards (app/request/guards.py) and the V2
parser processes (app/protocol/v2/parse_pool.py). The HTTP side of the same limits is in tests/test_hostile_http.py."""

from __future__ import annotations

import asyncio
import base64
import gzip
import json
import os
import signal
import time
import types
import zlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient

from app.config import Limits, RouterConfig
from app.errors import STATUS, ServiceError
from app.protocol import v2
from app.protocol.v2.parse_pool import INLINE_JSON_BYTES, ParsePool, parse_request
from app.request import guards
from app.request.body_gate import RATIO_FLOOR, BodyGate, check_encoding, content_length, inflate, inflate_limit
from app.request.guards import (
    admin_token,
    bearer,
    check_admin,
    check_url,
    deadline_message,
    parse_top_k,
    wall_deadline,
)

LIMITS = Limits()
HW = (224, 224)


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def code_of(call: Callable[[], Any]) -> str:
    with pytest.raises(ServiceError) as e:
        call()
    assert e.value.status == STATUS[e.value.code]
    return e.value.code


# --------------------------------------------------------------------------- bodies


async def chunks(parts: list[bytes], gap_s: float = 0.0, then_wait: float = 0.0) -> AsyncIterator[bytes]:
    """A request body as Starlette streams it: chunks, `gap_s` apart, and maybe a stall after them."""
    for p in parts:
        if gap_s:
            await asyncio.sleep(gap_s)
        yield p
    if then_wait:
        await asyncio.sleep(then_wait)


def read(gate: BodyGate, stream: AsyncIterator[bytes], **kw: Any) -> Any:
    opts = {"declared": None, "max_bytes": 1000, "timeout_s": 5.0, "slow_after_s": 0.2, "max_slow": 2, **kw}
    return gate.read(stream, **opts)


def test_a_fast_body_is_read_whole_and_takes_no_slow_slot() -> None:
    async def main() -> None:
        gate = BodyGate()
        assert await read(gate, chunks([b"ab", b"cd", b""])) == b"abcd"
        assert gate.slow == 0 and gate.refused_slow == 0

    run(main())


def test_declared_length_over_the_limit_is_refused_before_reading() -> None:
    async def never() -> AsyncIterator[bytes]:
        raise AssertionError("the body must not be read")
        yield b""

    gate = BodyGate()
    assert code_of(lambda: run(read(gate, never(), declared=1001))) == "payload_too_large"
    assert code_of(lambda: run(read(gate, chunks([b"x" * 600, b"x" * 600])))) == "payload_too_large"


def test_a_body_has_a_total_deadline_not_an_inactivity_one() -> None:
    """One byte every 50 ms keeps arriving; the read still ends at timeout_s with 408, its slot handed back."""
    sent: list[bytes] = []

    async def trickle() -> AsyncIterator[bytes]:
        async for part in chunks([b"x"] * 1000, gap_s=0.05):  # 50 s of body, never idle for more than 50 ms
            sent.append(part)
            yield part

    async def main() -> tuple[ServiceError, BodyGate]:
        gate = BodyGate()
        with pytest.raises(ServiceError) as e:
            await read(gate, trickle(), timeout_s=0.6, slow_after_s=0.1)
        return e.value, gate

    error, gate = asyncio.run(asyncio.wait_for(main(), 30))  # a polling timeout: an idle-only deadline never ends it
    assert error.code == "body_timeout" and STATUS[error.code] == 408
    # Ended by its total deadline (the timeout's 408, not the no-room one), while the body was still arriving.
    assert "did not arrive within 0.6s" in error.message and 0 < len(sent) < 1000, (error.message, len(sent))
    assert gate.slow == 0 and gate.timed_out == 1 and gate.refused_slow == 0


def test_slow_bodies_have_a_budget_and_a_slow_one_without_room_gets_408_at_once() -> None:
    async def main() -> None:
        gate = BodyGate()
        slow = [
            asyncio.create_task(read(gate, chunks([b"x"], then_wait=2.0), slow_after_s=0.05, timeout_s=1.0))
            for _ in range(2)
        ]
        deadline = time.monotonic() + 5
        while gate.slow < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert gate.slow == 2
        # A third slow body: no room, refused as soon as it is slow, before its own deadline: the no-room 408, with
        # the other two still held (none has reached its deadline yet).
        with pytest.raises(ServiceError) as e:
            await read(gate, chunks([b"y"], then_wait=2.0), slow_after_s=0.05, timeout_s=1.0)
        assert e.value.code == "body_timeout" and "slow bodies already" in e.value.message
        assert gate.refused_slow == 1 and gate.timed_out == 0 and gate.slow == 2
        # Fast bodies never wait for the slow ones.
        assert await read(gate, chunks([b"fast"])) == b"fast"
        results = await asyncio.gather(*slow, return_exceptions=True)
        assert all(isinstance(r, ServiceError) and r.code == "body_timeout" for r in results)
        assert gate.slow == 0

    run(main())


def test_a_cancelled_read_stays_cancelled_and_frees_its_slot() -> None:
    """The client going away (Serve cancels the request) is not turned into a 408."""

    async def main() -> None:
        gate = BodyGate()
        task = asyncio.create_task(read(gate, chunks([b"x"], then_wait=5.0), slow_after_s=0.01))
        deadline = time.monotonic() + 5
        while gate.slow < 1 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert gate.slow == 0

    run(main())


@pytest.mark.parametrize("raw", ["", "-1", "1e3", " 12x", "١٢", "²", "+5", "9" * 19])
def test_content_length_is_ascii_digits_only(raw: str) -> None:
    assert code_of(lambda: content_length(raw)) == "bad_request"


def test_content_length_values() -> None:
    assert content_length(None) is None and content_length(" 42 ") == 42 and content_length("0") == 0


# --------------------------------------------------------------------------- inflation


def tritonclient_bodies() -> dict[str, bytes]:
    """Real request bodies as tritonclient builds them, for photograph-like and flat images."""
    rng = np.random.default_rng(0)
    # A photograph stand-in: smooth gradients plus noise compress about as real photographs do (~3-5x in JSON).
    yy, xx = np.mgrid[0:224, 0:224]
    photo = np.stack([(xx + yy) % 256, (2 * xx) % 256, (3 * yy) % 256], -1) + rng.integers(0, 24, (224, 224, 3))
    photo = np.clip(photo, 0, 255).astype(np.uint8)[None]
    out = {}
    for binary in (True, False):
        inp = httpclient.InferInput("image", [1, 224, 224, 3], "UINT8")
        inp.set_data_from_numpy(photo, binary_data=binary)
        body, _ = httpclient.InferenceServerClient.generate_request_body([inp])
        out["pixels-" + ("binary" if binary else "json")] = body
    jpeg = bytes(rng.integers(0, 256, 200_000, dtype=np.uint8))  # entropy-coded data does not compress
    inp = httpclient.InferInput("image_bytes", [1], "BYTES")
    inp.set_data_from_numpy(np.array([base64.b64encode(jpeg)], dtype=np.object_), binary_data=False)
    out["bytes-json"], _ = httpclient.InferenceServerClient.generate_request_body([inp])
    return out


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_real_compressed_requests_are_far_below_the_ratio_limit(encoding: str) -> None:
    """tritonclient compresses with gzip.compress / zlib.compress; every real request inflates back whole."""
    compress = gzip.compress if encoding == "gzip" else zlib.compress
    for name, body in tritonclient_bodies().items():
        packed = compress(body)
        assert len(body) / len(packed) < LIMITS.max_inflate_ratio / 4, name  # 4x headroom at least
        assert inflate(packed, encoding, LIMITS.max_json_bytes, LIMITS.max_inflate_ratio) == body


def test_the_issue_gzip_bomb_is_refused_at_the_ratio_floor() -> None:
    """~10 KB of gzip inflating to 10 MiB of `{"inputs":[[],...]}`: stopped at 1 MiB out, never 10 MiB."""
    text = b'{"inputs":[' + b"[]," * 3_495_000 + b"[]]}"
    bomb = gzip.compress(text, 9)
    assert len(bomb) < 16_000 and len(text) / len(bomb) > 500
    assert inflate_limit(len(bomb), LIMITS.max_body_bytes, LIMITS.max_inflate_ratio) == RATIO_FLOOR
    with pytest.raises(ServiceError) as e:
        inflate(bomb, "gzip", LIMITS.max_body_bytes, LIMITS.max_inflate_ratio)
    assert e.value.code == "payload_too_large" and "times its size" in e.value.message
    # Without the ratio, the absolute limit still holds: the JSON limit is lower than the body limit.
    with pytest.raises(ServiceError) as e:
        inflate(bomb, "gzip", LIMITS.max_json_bytes)
    assert e.value.code == "payload_too_large" and str(LIMITS.max_json_bytes) in e.value.message


def test_small_bodies_are_never_refused_for_their_ratio() -> None:
    blank = b'{"inputs":[{"name":"image","data":[' + b"0," * 150_527 + b"0]}]}"  # one blank image, ~300 KB
    packed = gzip.compress(blank)
    assert len(blank) / len(packed) > 100 and len(blank) < RATIO_FLOOR
    assert inflate(packed, "gzip", LIMITS.max_json_bytes, LIMITS.max_inflate_ratio) == blank


def test_inflate_limits_and_encodings() -> None:
    assert inflate_limit(10_000, 10 << 20, 32) == RATIO_FLOOR
    assert inflate_limit(1 << 20, 10 << 20, 32) == 10 << 20
    assert inflate_limit(100_000, 10 << 20, 32) == 3_200_000
    assert inflate_limit(100_000, 10 << 20, None) == 10 << 20
    assert inflate(b"plain", None, 10) == b"plain" and inflate(b"plain", "identity", 10) == b"plain"
    assert code_of(lambda: inflate(b"x" * 11, None, 10)) == "payload_too_large"
    assert inflate(zlib.compress(b"z" * 100)[2:-4], "deflate", 1000) == b"z" * 100  # raw deflate
    assert code_of(lambda: inflate(b"junk", "gzip", 1000)) == "bad_request"
    assert code_of(lambda: inflate(gzip.compress(b"abc") + b"tail", "gzip", 1000)) == "bad_request"
    assert code_of(lambda: inflate(b"x", "br", 1000)) == "unsupported_media_type"
    assert check_encoding(" GZIP ") and check_encoding("deflate") and not check_encoding(None)
    assert not check_encoding("identity")
    assert code_of(lambda: check_encoding("compress")) == "unsupported_media_type"


# --------------------------------------------------------------------------- guards


@pytest.mark.parametrize("raw", ["٣", "5_0", "+5", "-1", " 5", "5 ", "0x5", "5.0", "\uff11", "²", "12345", "0", "21"])
def test_top_k_is_strict(raw: str) -> None:
    assert code_of(lambda: parse_top_k(raw, 5, 20)) == "invalid_parameter"


def test_top_k_values() -> None:
    assert parse_top_k(None, 5, 20) == 5 and parse_top_k("", 5, 20) == 5
    assert parse_top_k("1", 5, 20) == 1 and parse_top_k("20", 5, 20) == 20 and parse_top_k("0007", 5, 20) == 7


def test_url_length() -> None:
    check_url(b"/v1/classify", b"top_k=5", 8192)
    check_url(b"/" + b"a" * 8191, b"", 8192)
    assert code_of(lambda: check_url(b"/" + b"a" * 8192, b"", 8192)) == "uri_too_long"
    assert code_of(lambda: check_url(b"/x", b"q" * 8190, 8192)) == "uri_too_long"  # path, "?" and query count
    assert STATUS["uri_too_long"] == 414


def test_admin_needs_the_token_when_one_is_configured() -> None:
    token = "s3cret-token-0123456789"
    check_admin(f"Bearer {token}", token, False)
    check_admin(f"bearer  {token} ", token, False)
    for header in (None, "", "Bearer", f"Basic {token}", f"Bearer {token}x", "Bearer wrong", token):
        with pytest.raises(ServiceError) as e:
            check_admin(header, token, True)  # a configured token is required even where open admin is allowed
        assert e.value.code == "unauthorized" and e.value.status == 401
        assert e.value.headers()["WWW-Authenticate"].startswith("Bearer")


def test_admin_without_a_token_is_refused_unless_allowed() -> None:
    check_admin(None, None, True)
    with pytest.raises(ServiceError) as e:
        check_admin("Bearer anything", None, False)
    assert e.value.code == "admin_disabled" and e.value.status == 403


def test_admin_token_comes_from_the_named_environment_variable() -> None:
    env = {"APP_ADMIN_TOKEN": "  tok-from-env  ", "EMPTY": " "}
    assert admin_token("APP_ADMIN_TOKEN", env) == "tok-from-env"
    assert admin_token("EMPTY", env) is None and admin_token("MISSING", env) is None and admin_token(None, env) is None
    assert bearer("Bearer abc") == "abc" and bearer("Token abc") is None and bearer("Bearer ") is None
    # The config names the variable; a token itself is not a config field.
    assert "admin_token" not in RouterConfig.model_fields
    with pytest.raises(ValueError):
        RouterConfig.model_validate({"weights": {"a": 1}, "admin_token_env": "not a name"})
    assert RouterConfig(weights={"a": 1}).allow_unauthenticated_admin is False


def test_the_deadline_message_is_never_negative() -> None:
    assert deadline_message(-5.2) == "the request's deadline passed"
    assert deadline_message(0) == "the request's deadline passed"
    assert deadline_message(2.5) == "no answer within the 2.5s deadline"
    assert "-" not in deadline_message(0.0004)


def test_wall_deadline_converts_perf_counter_time() -> None:
    assert wall_deadline(105.0, now_perf=100.0, now_wall=1_700_000_000.0) == 1_700_000_005.0
    assert wall_deadline(95.0, now_perf=100.0, now_wall=1_700_000_000.0) == 1_699_999_995.0  # already past
    # By default, from the two clocks themselves: time.perf_counter() and time.time(), read once each.
    clocks = types.SimpleNamespace(perf_counter=lambda: 100.0, time=lambda: 1_700_000_000.0)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(guards, "time", clocks)
        assert wall_deadline(103.0) == 1_700_000_003.0


def test_limits_keep_json_within_the_body_limit() -> None:
    assert LIMITS.max_json_bytes < LIMITS.max_body_bytes
    with pytest.raises(ValueError):
        Limits(max_body_bytes=1 << 20)  # the default max_json_bytes (4 MiB) would exceed it
    Limits(max_body_bytes=1 << 20, max_json_bytes=1 << 20)


# --------------------------------------------------------------------------- parsing in a child process


def pixels_json(n: int) -> bytes:
    pixels = np.random.default_rng(n).integers(0, 256, size=(n, 224, 224, 3), dtype=np.uint8)
    inp = httpclient.InferInput("image", [n, 224, 224, 3], "UINT8")
    inp.set_data_from_numpy(pixels, binary_data=False)
    body, header_length = httpclient.InferenceServerClient.generate_request_body([inp])
    assert header_length is None
    return body


@pytest.fixture(scope="module")
def pool_loop() -> Any:
    """One event loop and one ParsePool for the module: a child starts once (~1 s), as in a Router."""
    loop = asyncio.new_event_loop()
    pool = ParsePool(workers=1, max_waiting=2)
    yield loop, pool
    pool.close()
    loop.run_until_complete(asyncio.sleep(0.1))
    loop.close()


def test_a_large_request_is_parsed_in_the_child_exactly_as_inline(pool_loop: Any) -> None:
    loop, pool = pool_loop
    body = pixels_json(2)
    assert len(body) > INLINE_JSON_BYTES
    req = loop.run_until_complete(parse_request(pool, body, None, LIMITS, HW, 60))
    inline = v2.parse_infer_request(body, None, LIMITS, HW)
    assert req.pixels is not None and inline.pixels is not None
    np.testing.assert_array_equal(req.pixels, inline.pixels)
    assert req.outputs == inline.outputs and pool.started == 1 and pool.parsed >= 1


def test_the_childs_errors_come_back_as_service_errors(pool_loop: Any) -> None:
    loop, pool = pool_loop
    name_is_object = json.dumps({"inputs": [{"name": {"a": [1] * 20_000}, "datatype": "UINT8"}]}).encode()
    assert len(name_is_object) > INLINE_JSON_BYTES
    with pytest.raises(ServiceError) as e:
        loop.run_until_complete(parse_request(pool, name_is_object, None, LIMITS, HW, 60))
    assert e.value.code == "invalid_tensor" and len(e.value.message) < 300  # the object's repr is bounded
    with pytest.raises(ServiceError) as e:
        loop.run_until_complete(parse_request(pool, b"[" * 100_000, None, LIMITS, HW, 60))
    assert e.value.code == "bad_request"


def test_small_requests_are_parsed_inline_and_json_over_the_limit_is_refused(pool_loop: Any) -> None:
    loop, pool = pool_loop
    started = pool.started
    small = json.dumps({"inputs": [{"name": "image_bytes", "datatype": "BYTES", "shape": [1], "data": ["eA=="]}]})
    req = loop.run_until_complete(parse_request(pool, small.encode(), None, LIMITS, HW, 5))
    assert req.images == [b"x"] and pool.started == started
    small_limits = Limits(max_json_bytes=100_000)
    with pytest.raises(ServiceError) as e:
        loop.run_until_complete(parse_request(pool, pixels_json(1), None, small_limits, HW, 5))
    assert e.value.code == "payload_too_large" and "binary" in e.value.message


def test_the_event_loop_keeps_running_while_the_issue_bomb_is_parsed(pool_loop: Any) -> None:
    """The JSON limit's worth of `{"inputs":[[],...]}`, the costliest JSON per byte: parsed inline it holds the
    loop for the whole parse; in the child the loop keeps ticking (generous: at least 5 ticks of 1 ms)."""
    loop, pool = pool_loop
    bomb = b'{"inputs":[' + b"[]," * (LIMITS.max_json_bytes // 3 - 10) + b"[]]}"
    assert len(bomb) <= LIMITS.max_json_bytes

    async def main() -> int:
        ticks = 0
        done = asyncio.Event()

        async def ticker() -> None:
            nonlocal ticks
            while not done.is_set():
                await asyncio.sleep(0.001)
                ticks += 1

        t = asyncio.create_task(ticker())
        try:
            with pytest.raises(ServiceError) as e:
                await parse_request(pool, bomb, None, LIMITS, HW, 120)
            assert e.value.code == "bad_request"  # parsed (the costly part), then refused
        finally:
            done.set()
            await t
        return ticks

    assert loop.run_until_complete(main()) >= 5


def test_a_caller_past_its_deadline_gets_503_and_the_child_is_reused(pool_loop: Any) -> None:
    loop, pool = pool_loop
    started = pool.started
    with pytest.raises(ServiceError) as e:
        loop.run_until_complete(parse_request(pool, pixels_json(6), None, LIMITS, HW, 0.001))
    assert e.value.code == "inference_timeout" and "deadline passed" in e.value.message
    req = loop.run_until_complete(parse_request(pool, pixels_json(1), None, LIMITS, HW, 60))  # waits its turn
    assert req.pixels is not None and pool.started == started


def test_waiting_parses_are_bounded(pool_loop: Any) -> None:
    loop, pool = pool_loop
    body = pixels_json(3)

    async def main() -> list[Any]:
        return await asyncio.gather(
            *(parse_request(pool, body, None, LIMITS, HW, 60) for _ in range(6)), return_exceptions=True
        )

    results = loop.run_until_complete(main())
    refused = [r for r in results if isinstance(r, ServiceError)]
    assert all(r.code == "overloaded" for r in refused) and len(refused) == 3  # 1 parsing + 2 waiting
    assert all(isinstance(r, v2.InferRequest) for r in results if r not in refused)


def test_a_dead_child_fails_its_request_and_is_replaced(pool_loop: Any) -> None:
    loop, pool = pool_loop
    started = pool.started
    (child,) = pool._idle
    os.kill(child.proc.pid, signal.SIGKILL)
    with pytest.raises(ServiceError) as e:
        loop.run_until_complete(parse_request(pool, pixels_json(1), None, LIMITS, HW, 60))
    assert e.value.code == "internal_error"
    assert loop.run_until_complete(parse_request(pool, pixels_json(1), None, LIMITS, HW, 60)).pixels is not None
    assert pool.started == started + 1
