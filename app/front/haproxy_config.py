"""The admission front's edit of the HAProxy config Serve writes: what HAProxy does before any Python sees a request.

`admit(config, front)` adds, to Serve's own config (idempotent, nothing of Serve's removed):

- in the `http_frontend`, before it routes (`use_backend`):
  - who the client is: the `client_header` (X-User-Id) when sent, else (with `max_per_address`) its source
    address; each client's admitted requests in flight are counted in a stick table, and one beyond
    `max_per_client` (`max_per_address`) is held for Retry-After, then gets the service's JSON 429 +
    Retry-After (one client cannot take every place at the Routers nor the whole queue, and resending at
    once does not turn into thousands of refusals a second);
  - a body declared over Limits.max_body_bytes: the JSON 413 at once;
  - the whole request first: the head within `head_timeout_s` (`timeout http-request`) and the body, or the
    first `buffer_bytes` of it, within `body_timeout_s` (`http-request wait-for-body`), else a 408 from
    HAProxy (JSON for a body; HAProxy's own for a head that never came whole, which its HTTP/1 layer answers
    before there is a request to hang a reply on). A slow client costs HAProxy a socket and a buffer, never
    a Router's place; a body larger than the buffer goes on once the buffer is full, and the Router's own
    body deadline (RouterConfig.body_timeout_s, max_slow_bodies) is the second line;
  - `X-App-Front`, replacing any the client sent: this HAProxy's host name and limits, so each Router can say
    which fronts its requests came through (`/v1/models`, `app_admission_front_active`), and requests without
    it show the front is missing;
  - with `max_queued` > 0, a request that finds that many already waiting for its application: 503 at once;
- in `global`: `tune.bufsize buffer_bytes`;
- in every HTTP application backend: `maxconn maxconn_per_replica` on each Router replica (`server` and
  `server-template` lines; not the backup proxy), `timeout queue queue_timeout_s`, and the JSON 503 +
  Retry-After for what waited that long.

Left alone: gRPC backends (HTTP/2 streams share a connection, so `maxconn` would not count requests) and the
ingress request router's `-via-ingress-request-router` backends (a Serve feature this app does not use).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import asdict, dataclass

REFUSAL = "the service is at capacity: no Router could take the request in time (or none is up); retry shortly"
TOO_MANY = "this client has too many requests in flight at once; retry when one has finished"
SLOW = "the request did not arrive whole in time"


def _bodies(code: str, message: str) -> tuple[str, str]:
    """The service's error body (v1) and the Open Inference Protocol's (/v2), as compact JSON."""
    v1 = json.dumps({"error": {"code": code, "message": message}}, separators=(",", ":"))
    return v1, json.dumps({"error": message}, separators=(",", ":"))


V1_BODY, V2_BODY = _bodies("overloaded", REFUSAL)
V1_429, V2_429 = _bodies("too_many_requests", TOO_MANY)
V1_408, V2_408 = _bodies("body_timeout", SLOW)
TOO_LARGE = "the request declares a body larger than the limit (Limits.max_body_bytes)"
V1_413, V2_413 = _bodies("payload_too_large", TOO_LARGE)
MARK = "# app-haproxy: the admission front (app/front/)"
HEADER = "X-App-Front"  # what the front tells the Routers: this HAProxy's host and limits
CLIENTS = "app_front_clients"  # the stick tables of requests in flight per named client, and per address
ADDRESSES = "app_front_addresses"


@dataclass(frozen=True)
class Front:
    """The front's limits (AppArgs.front in the app's config, handed to HAProxy as APP_FRONT_* variables)."""

    maxconn_per_replica: int = 128
    queue_timeout_s: float = 4.0
    max_queued: int = 0  # 0: no bound but the timeout (and HAProxy's global maxconn)
    max_per_client: int = 32  # requests in flight per named client (client_header) at this HAProxy; 0: no bound
    client_header: str = "X-User-Id"
    max_per_address: int = 0  # requests in flight per source address, of requests that name no client; 0: none
    head_timeout_s: float = 5.0
    body_timeout_s: float = 5.0
    buffer_bytes: int = 65536
    max_body_bytes: int = 10 * 1024 * 1024  # Limits.max_body_bytes: a body declared larger is refused at once
    retry_after_s: int = 1

    def header_value(self) -> str:
        """X-App-Front's value, a log-format string: `host=<this HAProxy's host> <limit>=<value> ...`."""
        limits = " ".join(f"{k}={v}" for k, v in asdict(self).items() if k != "retry_after_s")
        return f"host=%[hostname] {limits}"


def parse_header(value: str) -> dict[str, str]:
    """X-App-Front's value as the Router reads it: {"host": ..., limit: value, ...}; {} for anything else."""
    pairs = [item.split("=", 1) for item in value.split()]
    out = {k: v for k, v in (p for p in pairs if len(p) == 2) if k}
    return out if "host" in out else {}


class Unrecognised(ValueError):
    """Serve's config does not have the shape the front edits (then it is run unchanged)."""


_SECTION = re.compile(r"^(global|defaults|frontend|backend|listen|userlist|peers|resolvers|cache|program)\b")
_ROUTER = re.compile(r"\s+server(-template)? \S+ \S+")


def http_backends(config: str) -> list[str]:
    """The backends the http frontend routes applications to (`use_backend X if is_X`)."""
    m = re.search(r"^frontend http_frontend\n(.*?)(?=^\S|\Z)", config, re.S | re.M)
    if m is None:
        raise Unrecognised("no `frontend http_frontend`")
    return re.findall(r"^\s+use_backend (\S+) if is_\1\s*$", m[1], re.M)  # none before any app is deployed


def _frontend_rules(front: Front, backends: list[str]) -> Iterator[str]:
    """The http frontend's lines, in order, before its first `use_backend`."""
    yield MARK
    v2 = "{ path_beg /v2/ }"
    bodies = (("busy", V1_BODY, V2_BODY), ("429", V1_429, V2_429), ("408", V1_408, V2_408), ("413", V1_413, V2_413))
    for var, v1_body, v2_body in bodies:
        yield f"http-request set-var(txn.front_{var}) {_literal(v1_body)}"
        yield f"http-request set-var(txn.front_{var}) {_literal(v2_body)} if {v2}"
    yield (  # a body declared over the limit is never waited for (the Router would refuse it from the header too)
        'http-request return status 413 content-type application/json lf-string "%[var(txn.front_413)]" '
        f"if {{ req.hdr_val(content-length) gt {front.max_body_bytes} }}"
    )
    yield f"timeout http-request {_ms(front.head_timeout_s)}"
    yield 'http-error status 408 content-type application/json lf-string "%[var(txn.front_408)]"'
    # One client's requests in flight, counted once admitted (a refused one never is): beyond the bound, the
    # request is held for Retry-After and then refused (a tarpit: a socket, no CPU), so a client that resends at
    # once is paced, not answered thousands of times a second. `table_trackers` counts its own look-up of an
    # existing entry too (HAProxy 2.8: the admitted requests + 1), hence `gt`; tests/test_front_unit.py checks the
    # bound is exactly max_per_client on the HAProxy ray[serve] pins.
    yield f"timeout tarpit {_ms(front.retry_after_s)}"
    refuse = (
        'http-request tarpit deny_status 429 content-type application/json lf-string "%[var(txn.front_429)]" '
        f"hdr Retry-After {front.retry_after_s}"
    )
    named = "{ var(txn.front_client) -m found }"
    if front.max_per_client:
        header = front.client_header.lower()
        yield f"http-request set-var(txn.front_client) req.hdr({header}) if {{ req.hdr({header}) -m found }}"
        yield f"{refuse} if {named} {{ var(txn.front_client),table_trackers({CLIENTS}) gt {front.max_per_client} }}"
        yield f"http-request track-sc0 var(txn.front_client) table {CLIENTS} if {named}"
    if front.max_per_address:
        anonymous = f"!{named}" if front.max_per_client else ""
        yield f"{refuse} if {anonymous} {{ src,table_trackers({ADDRESSES}) gt {front.max_per_address} }}"
        yield f"http-request track-sc1 src table {ADDRESSES} {f'if {anonymous}' if anonymous else ''}".rstrip()
    yield f"http-request wait-for-body time {_ms(front.body_timeout_s)} at-least {front.buffer_bytes}"
    yield f"http-request del-header {HEADER}"
    yield f'http-request set-header {HEADER} "{front.header_value()}"'
    if front.max_queued:
        # Which application: the first backend whose path matches, as `use_backend` picks it (Serve lists
        # them longest prefix first).
        for b in backends:
            yield f"http-request set-var(txn.front_app) str({b}) if is_{b} !{{ var(txn.front_app) -m found }}"
        for b in backends:
            yield (
                'http-request return status 503 content-type application/json lf-string "%[var(txn.front_busy)]" '
                f"hdr Retry-After {front.retry_after_s} "
                f"if {{ var(txn.front_app) -m str {b} }} {{ queue({b}) ge {front.max_queued} }}"
            )


def admit(config: str, front: Front) -> str:
    """Serve's HAProxy config with the front in it (see the module's docstring; idempotent)."""
    if MARK in config:
        return config  # already the front's (HAProxy restarted on a file Serve did not rewrite)
    backends = http_backends(config)
    if not backends:
        return config  # nothing deployed yet: HAProxy answers everything itself
    picks = [f"    {line}" for line in _frontend_rules(front, backends)]
    limits = [
        f"    timeout queue {_ms(front.queue_timeout_s)}",
        f'    http-error status 503 content-type application/json lf-string "%[var(txn.front_busy)]" '
        f"hdr Retry-After {front.retry_after_s}",
    ]
    closing = {"global": [f"    tune.bufsize {front.buffer_bytes}"], "backend": limits}
    lines: list[str] = []
    header: list[str] = []  # the current section's header, as words
    placed = False

    def close_section() -> list[str]:  # at its end: after anything Serve sets there, so ours holds
        if header[:1] == ["global"]:
            return closing["global"]
        return limits if _edited(header, backends) else []

    for line in config.splitlines():
        if _SECTION.match(line):
            lines += close_section()
            header = line.split()
        if header == ["frontend", "http_frontend"] and not placed and line.startswith("    use_backend "):
            lines += picks
            placed = True
        if _edited(header, backends) and _ROUTER.match(line) and not re.search(r"\sbackup\b", line):
            line += f" maxconn {front.maxconn_per_replica}"
        lines.append(line)
    lines += close_section()
    if not placed:
        raise Unrecognised("the http frontend has no use_backend line to put the front's rules before")
    for table, kind, on in (
        (CLIENTS, "string len 128", front.max_per_client),
        (ADDRESSES, "ipv6", front.max_per_address),
    ):
        if on:  # a table is a backend of its own in HAProxy; the entries only count trackers
            lines += [f"backend {table}", f"    stick-table type {kind} size 100k expire 60s"]
    return "\n".join(lines) + "\n"


def _edited(header: list[str], backends: list[str]) -> bool:
    """Whether the section with this header is one of the HTTP application backends the front limits."""
    return len(header) > 1 and header[0] == "backend" and header[1] in backends


def _ms(seconds: float) -> str:
    return f"{round(seconds * 1000)}ms"


def _literal(text: str) -> str:
    """`str(text)` as one HAProxy config word: single quotes keep the sample argument's commas, the
    config's double quotes (with `\\"`) keep its spaces and quotes."""
    if any(c in text for c in "'\\\n#"):
        raise ValueError(f"cannot quote {text!r} for HAProxy")
    return "\"str('" + text.replace('"', '\\"') + "')\""
