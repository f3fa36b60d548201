"""The admission front's limits: the app config's `args.front` (AppArgs validates them with the rest), carried to
HAProxy's processes as APP_FRONT_* variables, and read back there."""

from __future__ import annotations

import os
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from app.front.haproxy_config import Front

if TYPE_CHECKING:
    from app.config import FrontArgs, Limits

# The variable that carries each limit (AppArgs.front's fields, which say what each is and bound it).
VARIABLES = {
    "maxconn_per_replica": "APP_FRONT_MAXCONN_PER_REPLICA",
    "queue_timeout_s": "APP_FRONT_QUEUE_TIMEOUT_S",
    "max_queued": "APP_FRONT_MAX_QUEUED",
    "max_per_client": "APP_FRONT_MAX_PER_CLIENT",
    "client_header": "APP_FRONT_CLIENT_HEADER",
    "max_per_address": "APP_FRONT_MAX_PER_ADDRESS",
    "head_timeout_s": "APP_FRONT_HEAD_TIMEOUT_S",
    "body_timeout_s": "APP_FRONT_BODY_TIMEOUT_S",
    "buffer_bytes": "APP_FRONT_BUFFER_BYTES",
    "max_body_bytes": "APP_FRONT_MAX_BODY_BYTES",  # args.limits.max_body_bytes
}


def from_env(env: dict[str, str] | os._Environ[str]) -> Front:
    """The front's limits from APP_FRONT_* (absent: the default), checked as AppArgs.front checks them; a bad value
    is an error naming its variable."""
    # Imported here, not at the top: `app-haproxy` imports this package on every HAProxy start and reload, and
    # anything the config loads (pydantic, the model's contract) must fail inside `rewrite`'s fail-open try.
    from pydantic import ValidationError

    from app.config import FrontArgs

    given = {name: env[key] for name, key in VARIABLES.items() if env.get(key)}
    body = given.pop("max_body_bytes", None)
    try:
        front = declared(FrontArgs.model_validate(given))
    except ValidationError as e:
        first = e.errors()[0]
        name = str(first["loc"][0]) if first["loc"] else ""
        raise ValueError(f"{VARIABLES.get(name, 'APP_FRONT_*')}={given.get(name)!r}: {first['msg']}") from None
    if body is None:
        return front
    if not body.isdigit() or int(body) == 0:
        raise ValueError(f"{VARIABLES['max_body_bytes']}={body!r}: expected a positive integer (Limits.max_body_bytes)")
    return replace(front, max_body_bytes=int(body))


def declared(front: FrontArgs, limits: Limits | None = None) -> Front:
    """The front's limits as the app config declares them (args.front); with the app's `limits`, its body limit too
    (refused by HAProxy from the header)."""
    limits_here = Front(**front.model_dump())
    return replace(limits_here, max_body_bytes=limits.max_body_bytes) if limits is not None else limits_here


def env_of(front: Front) -> dict[str, str]:
    """The APP_FRONT_* variables that give HAProxy these limits (what `from_env` reads back)."""
    return {key: _text(getattr(front, name)) for name, key in VARIABLES.items()}


def _text(value: object) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def config_env(config: dict[str, Any], application: str | None = None) -> dict[str, str]:
    """The APP_FRONT_* variables of a Serve config's application (the first, unless named): its args.front.

    One front serves every application of a Serve instance (one HAProxy per node): the first application's
    limits are the instance's."""
    from app.config import AppArgs  # as in from_env

    apps = config.get("applications") or []
    app = next((a for a in apps if a.get("name") == application), None) if application else (apps or [None])[0]
    if app is None:
        raise ValueError(f"no application {application!r}" if application else "no applications")
    args = AppArgs.model_validate(app.get("args") or {})
    return env_of(declared(args.front, args.limits))
