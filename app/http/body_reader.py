"""A request's body: read whole through the body gate before admission, and its Content-Encoding undone.

The gate (`BodyGate`) bounds what a body still arriving costs: its bytes, its deadline and the slots of
slow ones. Inflating runs inline for small bodies and on a thread for large ones (zlib frees the GIL).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Protocol

from starlette.requests import ClientDisconnect, Request

from app.config import Limits, RouterConfig
from app.errors import ServiceError
from app.request.body_gate import INLINE_INFLATE_BYTES, BodyGate, check_encoding, content_length, inflate
from app.tracing import spans

if TYPE_CHECKING:  # a type only: the Router's metrics are made and handed in by the deployment
    from app.http.ports import Metrics


class LiveConfig(Protocol):
    """Whatever holds the Router's config in force (the live policy)."""

    @property
    def config(self) -> RouterConfig: ...


class BodyReader:
    def __init__(
        self,
        limits: Limits,
        live: LiveConfig,
        metrics: Metrics,
        client_gone: Callable[[], None],
    ) -> None:
        """live: holds the Router's config in force (its body deadlines are live); client_gone: counts a client that
        left before its body arrived (the admission's count of cancelled requests)."""
        self.limits = limits
        self.live = live
        self.metrics = metrics
        self.client_gone = client_gone
        self.gate = BodyGate()  # bodies still arriving: before admission, with their own deadline
        self.inflater = ThreadPoolExecutor(max_workers=2, thread_name_prefix="inflate")

    async def receive(self, request: Request, max_bytes: int | None = None) -> bytes:
        """The whole body through the body gate, before the request is admitted: 413/408 here."""
        cfg, t0 = self.live.config, time.perf_counter()
        try:
            body = await self.gate.read(
                request.stream(),
                declared=content_length(request.headers.get("content-length")),
                max_bytes=self.limits.max_body_bytes if max_bytes is None else max_bytes,
                timeout_s=cfg.body_timeout_s,
                slow_after_s=cfg.slow_body_after_s,
                max_slow=cfg.max_slow_bodies,
            )
        except ClientDisconnect:
            self.client_gone()
            raise ServiceError("bad_request", "the client closed the connection before its body arrived") from None
        self.metrics.body_received(len(body))
        if spans.ENABLED:  # on the request's span: a span of its own would cost more than what it says
            read_ms = round((time.perf_counter() - t0) * 1000.0, 3)
            spans.annotate({"http.request.body.size": len(body), "app.body_read_ms": read_ms})
        return body

    async def inflate(self, raw: bytes, encoding: str | None, max_bytes: int) -> bytes:
        """Undo the Content-Encoding within the size and ratio limits; a large one on a thread (zlib frees the GIL)."""
        ratio = self.limits.max_inflate_ratio
        if check_encoding(encoding) and len(raw) > INLINE_INFLATE_BYTES:
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(self.inflater, inflate, raw, encoding, max_bytes, ratio)
        return inflate(raw, encoding, max_bytes, ratio)

    def describe(self) -> dict[str, int]:
        return {"slow_now": self.gate.slow, "timed_out": self.gate.timed_out, "refused_slow": self.gate.refused_slow}
