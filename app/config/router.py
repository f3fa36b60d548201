"""`RouterConfig`: the Router deployment's user_config, the A/B policy and per-request deadlines (all live)."""

from __future__ import annotations

from pydantic import Field, field_validator, model_validator

from app.config.base import _Strict


class RouterConfig(_Strict):
    """The Router's user_config: the A/B policy and per-request deadlines (all live)."""

    weights: dict[str, float] = Field(description="variant -> relative weight; need not sum to 1")
    sticky_header: str = Field("X-User-Id", description="requests with this header always get the same variant")
    override_header: str = Field("X-Model-Variant", description="header that names a variant explicitly")
    allow_override: bool = Field(True, description="honour the override header (403 when false)")
    failover: bool = Field(True, description="serve from another variant when the chosen one is down")
    inference_timeout_s: float = Field(
        10.0,
        gt=0,
        description="deadline per request, from when its body has arrived (503 beyond); the body has its own, "
        "body_timeout_s",
    )
    shadow_fraction: float = Field(0.0, ge=0, le=1, description="share of requests also run on the other variant")
    max_shadow_in_flight: int = Field(8, ge=0, description="shadow runs in flight per Router; beyond, dropped")
    coalesce_max: int = Field(
        16,
        gt=0,
        le=256,
        description="images sent down the chain together, from concurrent requests of any protocol (1: one call each)",
    )
    max_groups_in_flight: int = Field(
        2, gt=0, le=64, description="groups per variant in flight at once; arrivals meanwhile form the next group"
    )
    max_in_flight: int = Field(
        192,
        gt=0,
        description="requests in flight per Router replica, counted once their body has arrived; beyond, an "
        "immediate JSON 503 (load shedding)",
    )
    max_queue_wait_s: float | None = Field(
        None,
        ge=0,
        description="beyond max_in_flight, a request waits for a slot (FIFO) if the wait it can expect at the "
        "measured rate of finishing requests fits in this, else it gets an immediate JSON 503; the wait counts "
        "toward inference_timeout_s, which must leave room for the work (default: half of it). 0: no queue, "
        "refuse at once. A waiting request costs no CPU; a refused one that its client resends at once costs "
        "as much as a small request",
    )
    max_queued: int = Field(512, ge=0, description="requests waiting for a slot per Router replica (503 beyond)")
    max_queued_per_user: int | None = Field(
        None,
        ge=0,
        description="of those, how many one user (the sticky header, X-User-Id) may hold, so one client cannot "
        "take the whole queue (default: a quarter of max_queued; 0: no cap). Requests without the header are "
        "not capped: through HAProxy the Router cannot tell connections apart",
    )
    max_refusals_per_s: float = Field(
        100,
        ge=0,
        description="503 overloaded replies per second per Router replica sent at once; beyond, each waits its "
        "turn (at most inference_timeout_s), so clients that resend at once cannot spend the replicas' CPU on "
        "refusals (each costs about what a small request does). 0: never paced",
    )
    max_queued_mib: float = Field(
        256, gt=0, description="body bytes held by the waiting requests per Router replica (503 beyond)"
    )
    body_timeout_s: float = Field(
        5.0,
        gt=0,
        le=60,
        description="the whole body must arrive within this, from when the Router starts reading it (408 "
        "body_timeout beyond): a total, not an inactivity timeout, so one byte a second does not reset it. "
        "10 MiB in 5 s needs 2 MB/s",
    )
    slow_body_after_s: float = Field(
        0.5,
        ge=0,
        description="a body still arriving after this is slow and needs one of max_slow_bodies slots; bodies "
        "that arrive sooner (every client that sends its body right after its headers) need none",
    )
    max_slow_bodies: int = Field(
        32,
        gt=0,
        description="slow bodies arriving at once per Router replica, apart from max_in_flight; a body that "
        "becomes slow with all taken gets 408 body_timeout at once. Requests whose bodies are arriving still "
        "count toward the Router's max_ongoing_requests (Serve's own cap): keep max_in_flight + max_queued + this "
        "within it",
    )
    admin_token_env: str | None = Field(
        "APP_ADMIN_TOKEN",
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        description="the environment variable holding the admin token that POST /v1/ab/reset needs as "
        "`Authorization: Bearer <token>` (the token itself never goes in a config)",
    )
    allow_unauthenticated_admin: bool = Field(
        False,
        description="with no admin token in the environment, let anyone call the admin endpoints (local use "
        "only); false: they answer 403. A configured token is required either way",
    )

    @property
    def queued_per_user(self) -> int:
        return max(1, self.max_queued // 4) if self.max_queued_per_user is None else self.max_queued_per_user

    @property
    def queue_wait_s(self) -> float:
        return self.inference_timeout_s / 2 if self.max_queue_wait_s is None else self.max_queue_wait_s

    @model_validator(mode="after")
    def _queue_leaves_time_for_work(self) -> RouterConfig:
        if self.max_queue_wait_s is not None and self.max_queue_wait_s >= self.inference_timeout_s:
            raise ValueError(
                f"max_queue_wait_s ({self.max_queue_wait_s}) must be below inference_timeout_s "
                f"({self.inference_timeout_s}): the wait counts toward the deadline, and the work needs time too"
            )
        return self

    def max_ongoing_needed(self) -> int:
        """What Serve's max_ongoing_requests must allow the Router: in flight, waiting, and slow bodies."""
        queue = self.max_queued if self.queue_wait_s > 0 else 0
        return self.max_in_flight + queue * (2 if self.max_refusals_per_s > 0 else 1) + self.max_slow_bodies

    @field_validator("weights")
    @classmethod
    def _weights_valid(cls, w: dict[str, float]) -> dict[str, float]:
        negative = {k: v for k, v in w.items() if v < 0}
        if negative:
            raise ValueError(f"weights must be >= 0, got {negative}")
        if not w or sum(w.values()) <= 0:
            raise ValueError(f"at least one weight must be positive, got {w}")
        return w


def router_deployment_name() -> str:
    return "Router"
