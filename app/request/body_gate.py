"""Request bodies: read with a deadline under a budget for slow ones, then inflated with limits.

Pure asyncio and zlib; no Ray, no Starlette. The Router reads every body through a `BodyGate`
*before* the request counts toward `max_in_flight`, so a client that sends slowly holds no
admission slot. Bodies that arrive within `slow_after_s` (every ordinary client: its body follows
its headers at once) take nothing else either. A body still arriving after `slow_after_s` is *slow*
and needs one of `max_slow` slots; with none free it gets 408 body_timeout there and then. Every
body has `timeout_s` in all (a total, not an inactivity timeout: one byte a second never resets it).
A declared Content-Length over the limit is refused (413) before a byte is read.

Why slow bodies, not all bodies, have the budget: a budget every body must pass through is itself
what slow clients fill (32 connections trickling one byte a second would hold it for good, and
every fast client would be refused behind them); here a slow client costs one of `max_slow` slots
for at most `timeout_s`, or nothing but `slow_after_s` of waiting when they are taken, and fast
clients never wait for it.

`inflate` undoes a Content-Encoding (what tritonclient's request_compression_algorithm sends) with
two bounds: the inflated size (`max_bytes`) and the inflation ratio (`max_ratio` times the
compressed size, but never less than `RATIO_FLOOR`, so a small request is never refused for
compressing well). zlib releases the GIL while it inflates, so the Router runs large inflations on
a thread (`INLINE_INFLATE_BYTES`) and its event loop keeps serving meanwhile.
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import AsyncIterable

from app.errors import ServiceError
from app.request.guards import byte_count

RATIO_FLOOR = 1 << 20  # bodies that inflate to at most 1 MiB are never refused for their ratio
INLINE_INFLATE_BYTES = 4096  # compressed bodies up to this inflate on the event loop (<= RATIO_FLOOR out: ~1 ms)


def content_length(raw: str | None) -> int | None:
    """The Content-Length header as an int (None when absent): ASCII digits only, anything else is 400."""
    return byte_count(raw, "Content-Length")


class _Reader:
    """One body being read: its task, its timers, whether it holds a slow slot, why the gate stopped it."""

    __slots__ = ("reason", "slow", "task", "timers")

    def __init__(self, task: asyncio.Task[object]) -> None:
        self.task = task
        self.timers: list[asyncio.TimerHandle] = []
        self.slow = False
        self.reason: str | None = None  # "timeout" or "no_room" once the gate cancelled the read

    def stop(self, reason: str) -> None:
        if self.reason is None:
            self.reason = reason
            self.task.cancel()


class BodyGate:
    """The bodies arriving at one Router (see the module docstring). Event-loop only, no locks."""

    def __init__(self) -> None:
        self.slow = 0  # slow bodies arriving now
        self.timed_out = 0  # totals since start, for /v1/models and tests
        self.refused_slow = 0

    def _became_slow(self, reader: _Reader, max_slow: int) -> None:
        if self.slow >= max_slow:
            self.refused_slow += 1
            reader.stop("no_room")
        else:
            self.slow += 1
            reader.slow = True

    async def read(
        self,
        chunks: AsyncIterable[bytes],
        *,
        declared: int | None,
        max_bytes: int,
        timeout_s: float,
        slow_after_s: float,
        max_slow: int,
    ) -> bytes:
        """The whole body, within `timeout_s` and `max_bytes`; past `slow_after_s` it needs one of `max_slow` slots.

        Raises ServiceError: payload_too_large (413; from the declared length, before reading, when it
        can) and body_timeout (408: not all there within timeout_s, or slow when every slow slot is taken).
        """
        if declared is not None and declared > max_bytes:
            raise ServiceError("payload_too_large", f"body of {declared} bytes exceeds the {max_bytes}-byte limit")
        task = asyncio.current_task()
        assert task is not None
        loop = asyncio.get_running_loop()
        started = loop.time()
        reader = _Reader(task)
        reader.timers = [
            loop.call_later(timeout_s, reader.stop, "timeout"),
            loop.call_later(slow_after_s, self._became_slow, reader, max_slow),
        ]
        parts: list[bytes] = []
        size = 0
        try:
            async for chunk in chunks:
                size += len(chunk)
                if size > max_bytes:
                    raise ServiceError("payload_too_large", f"body exceeds the {max_bytes}-byte limit")
                parts.append(chunk)
        except asyncio.CancelledError:
            if reader.reason is None:
                raise  # not the gate's doing: the client went away, or Serve cancelled the request
            uncancel = getattr(task, "uncancel", None)  # Python 3.11+: this cancellation ends here
            if uncancel is not None:
                uncancel()
            if reader.reason == "no_room":
                raise ServiceError(
                    "body_timeout",
                    f"the request body was still arriving after {loop.time() - started:.1f}s ({size} bytes) and "
                    f"{max_slow} slow bodies already are; send it faster or retry later",
                ) from None
            self.timed_out += 1
            raise ServiceError(
                "body_timeout", f"the request body did not arrive within {timeout_s:g}s ({size} bytes received)"
            ) from None
        finally:
            for timer in reader.timers:
                timer.cancel()
            if reader.slow:
                self.slow -= 1
        return b"".join(parts)


def _encoding(content_encoding: str | None) -> str:
    enc = (content_encoding or "").strip().lower()
    if enc not in ("", "identity", "gzip", "deflate"):
        raise ServiceError("unsupported_media_type", f"Content-Encoding {enc!r} is not supported; use gzip or deflate")
    return "" if enc == "identity" else enc


def check_encoding(content_encoding: str | None) -> bool:
    """Whether the body is compressed (gzip or deflate); any other encoding is 415, before the body is read."""
    return bool(_encoding(content_encoding))


def inflate_limit(compressed_bytes: int, max_bytes: int, max_ratio: float | None) -> int:
    """How many bytes a body of `compressed_bytes` may inflate to: the ratio bound, floored, capped by max_bytes."""
    if max_ratio is None:
        return max_bytes
    return min(max_bytes, max(int(max_ratio * compressed_bytes), RATIO_FLOOR))


def inflate(body: bytes, content_encoding: str | None, max_bytes: int, max_ratio: float | None = None) -> bytes:
    """Undo the request's Content-Encoding (gzip, or deflate: zlib or raw), within the size and ratio bounds.

    max_ratio None: no ratio bound. An identity body is only checked against max_bytes. Errors:
    payload_too_large (413: too big, or inflates too far), bad_request (400: not that encoding,
    truncated, trailing data), unsupported_media_type (415: another encoding). Never allocates more
    than the limit + 1 byte.
    """
    enc = _encoding(content_encoding)
    if not enc:
        if len(body) > max_bytes:
            raise ServiceError("payload_too_large", f"the body of {len(body)} bytes exceeds the {max_bytes}-byte limit")
        return body
    allowed = inflate_limit(len(body), max_bytes, max_ratio)
    candidates = [16 + zlib.MAX_WBITS] if enc == "gzip" else [zlib.MAX_WBITS, -zlib.MAX_WBITS]
    for n, wbits in enumerate(candidates):  # HTTP "deflate" is the zlib format; some clients send raw deflate
        d = zlib.decompressobj(wbits)
        try:
            out = d.decompress(body, allowed + 1)
        except zlib.error as e:
            if n + 1 < len(candidates):
                continue
            raise ServiceError("bad_request", f"the {enc} body does not decompress: {e}") from None
        if len(out) > allowed or d.unconsumed_tail:
            if allowed < max_bytes:
                raise ServiceError(
                    "payload_too_large",
                    f"the {enc} body of {len(body)} bytes inflates past {allowed} bytes, more than {max_ratio:g} "
                    "times its size (a compression bomb, or send it uncompressed)",
                )
            raise ServiceError("payload_too_large", f"the decompressed body exceeds the {max_bytes}-byte limit")
        if not d.eof or d.unused_data:
            raise ServiceError("bad_request", f"the {enc} body is truncated or has trailing data")
        return out
    raise AssertionError("unreachable")
