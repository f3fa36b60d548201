"""The small checks the Router makes on a request before any work, and its deadline arithmetic. Pure: no Ray.

- `parse_top_k`: `?top_k=` is 1-4 ASCII digits, nothing else (Python's int() also takes "٣", "5_0",
  "+5" and " 5 ").
- `check_url`: path + query longer than Limits.max_url_bytes -> 414 uri_too_long.
- `check_admin`: state-changing admin endpoints (POST /v1/ab/reset) need `Authorization: Bearer
  <token>`, the token read from the environment variable RouterConfig.admin_token_env names
  (never from the config itself, which is not a secret store), compared in constant time. With
  no token configured they are refused (403) unless RouterConfig.allow_unauthenticated_admin.
- `deadline_message`, `wall_deadline`: what a missed deadline says, and a perf_counter deadline
  turned into wall-clock time for another process.
"""

from __future__ import annotations

import hmac
import os
import time

from app.errors import ServiceError

TOP_K_DIGITS = 4
MIN_ADMIN_TOKEN_CHARS = 16


def byte_count(raw: str | None, header: str) -> int | None:
    """A header that holds a byte count (Content-Length, Inference-Header-Content-Length): ASCII digits only,
    at most 18 of them; None when absent; anything else is 400."""
    if raw is None:
        return None
    s = raw.strip()
    if not (s.isascii() and s.isdigit()) or len(s) > 18:
        raise ServiceError("bad_request", f"{header} must be a byte count, got {raw[:32]!r}")
    return int(s)


def parse_top_k(raw: str | None, default: int, maximum: int) -> int:
    """`?top_k=`: absent or empty -> default; else 1-4 ASCII digits within 1..maximum (422 otherwise)."""
    if raw is None or raw == "":
        return default
    if not (len(raw) <= TOP_K_DIGITS and raw.isascii() and raw.isdigit()):
        raise ServiceError("invalid_parameter", f"top_k must be an integer from 1 to {maximum}, got {raw[:32]!r}")
    k = int(raw)
    if not 1 <= k <= maximum:
        raise ServiceError("invalid_parameter", f"top_k must be between 1 and {maximum}, got {k}")
    return k


def check_url(raw_path: bytes, query_string: bytes, max_bytes: int) -> None:
    """414 uri_too_long when the request target (path and query) is longer than max_bytes."""
    n = len(raw_path) + (len(query_string) + 1 if query_string else 0)
    if n > max_bytes:
        raise ServiceError("uri_too_long", f"the request URL is {n} bytes; the limit is {max_bytes}")


def admin_token(env_name: str | None, environ: dict[str, str] | None = None) -> str | None:
    """The admin token from the environment variable `env_name` (None: unset, empty or no variable named)."""
    if not env_name:
        return None
    value = (os.environ if environ is None else environ).get(env_name, "").strip()
    return value or None


def bearer(authorization: str | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` header (scheme case-insensitive), else None."""
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


def check_admin(authorization: str | None, token: str | None, allow_unauthenticated: bool) -> None:
    """Let an admin request through, or raise: 401 unauthorized (token configured, wrong or missing
    credentials), 403 admin_disabled (no token configured and unauthenticated admin not allowed).

    A configured token is always required, whatever allow_unauthenticated says.
    """
    if token:
        given = bearer(authorization)
        if given is None or not hmac.compare_digest(given.encode("utf-8"), token.encode("utf-8")):
            raise ServiceError("unauthorized", "this endpoint needs Authorization: Bearer <admin token>")
        return
    if not allow_unauthenticated:
        raise ServiceError(
            "admin_disabled",
            "admin endpoints are disabled: no admin token is configured (RouterConfig.admin_token_env)",
        )


def deadline_message(remaining_s: float) -> str:
    """What a 503 inference_timeout says: never a negative deadline."""
    if remaining_s <= 0:
        return "the request's deadline passed"
    return f"no answer within the {remaining_s:.3g}s deadline"


def wall_deadline(deadline: float, now_perf: float | None = None, now_wall: float | None = None) -> float:
    """A `time.perf_counter()` deadline as wall-clock time (`time.time()`), which another process understands."""
    perf = time.perf_counter() if now_perf is None else now_perf
    wall = time.time() if now_wall is None else now_wall
    return wall + (deadline - perf)
