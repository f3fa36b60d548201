"""`FrontArgs` (`args.front`): the admission front's limits, as the app config declares them.

The front itself (HAProxy and `app-haproxy`) is `app.front`, which reads these settings (`app.front.declared`);
here they are validated with the rest of the app's args.
"""

from __future__ import annotations

from pydantic import Field

from app.config.base import _Strict


class FrontArgs(_Strict):
    """The admission front (`app.front`): what HAProxy does before a request reaches a Router. Delivered to HAProxy
    as APP_FRONT_* variables by `make serve`, the tests, the benchmarks and the RayService renderer (`python -m
    app.front env CONFIG` for any other launcher); each Router checks that its requests came through a front
    with these limits (/v1/models)."""

    maxconn_per_replica: int = Field(
        128,
        ge=1,
        le=100_000,
        description="requests HAProxy lets into one Router replica at once (per HAProxy); the rest wait in its queue, "
        "which costs no CPU. Keep it within the Router's max_in_flight + max_slow_bodies",
    )
    queue_timeout_s: float = Field(
        4.0,
        ge=0.001,
        le=3600,
        description="a request still waiting in HAProxy's queue after this gets the JSON 503 + Retry-After from "
        "HAProxy (the wait paces clients that resend at once); keep it under the Router's inference_timeout_s",
    )
    max_queued: int = Field(
        0,
        ge=0,
        le=10_000_000,
        description="> 0: a request that finds this many waiting for its application: 503 at once",
    )
    max_per_client: int = Field(
        32,
        ge=0,
        le=100_000,
        description="requests one client named by client_header may have in flight at this HAProxy (waiting for its "
        "body, queued or at a Router); beyond, held for Retry-After, then JSON 429 + Retry-After. 0: no bound",
    )
    client_header: str = Field(
        "X-User-Id",
        pattern=r"^[A-Za-z0-9][A-Za-z0-9-]{0,63}$",
        description="the request header that names a client (the Router's sticky header)",
    )
    max_per_address: int = Field(
        0,
        ge=0,
        le=100_000,
        description="the same bound per source address, for requests that name no client. 0 (off) unless HAProxy sees "
        "clients' own addresses: on one machine every client is 127.0.0.1, behind a load balancer the balancer",
    )
    head_timeout_s: float = Field(
        5.0, ge=0.001, le=3600, description="the request's head must arrive whole within this (HAProxy's 408 beyond)"
    )
    body_timeout_s: float = Field(
        5.0,
        ge=0.001,
        le=3600,
        description="the body, or its first buffer_bytes, must arrive within this after the head, before the request "
        "takes any place at a Router (JSON 408 beyond): slow bodies cost HAProxy a buffer, not a Router's place",
    )
    buffer_bytes: int = Field(
        65536,
        ge=16384,
        le=16 << 20,
        description="HAProxy's buffer (tune.bufsize): what it holds of each body before passing it on; a larger body "
        "goes on once it is full and meets the Router's own body deadline. Each waiting request holds one",
    )
