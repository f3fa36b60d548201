"""The admission front (app/front/) on configs rendered by Serve's own HAProxy code, run by the real HAProxy.

No Ray: Serve's config renderer (HAProxyApi) is plain Python, and HAProxy is the binary ray[serve] bundles. The
last tests put HAProxy with the front's config in front of a tiny HTTP server that holds its requests, so the queue,
its timeout and the 503s are HAProxy's real behaviour.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import http.server
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from app.front import (
    MARK,
    SERVE_COPY,
    V1_BODY,
    V2_BODY,
    Front,
    Unrecognised,
    admit,
    config_env,
    env_of,
    from_env,
    http_backends,
    real_haproxy,
    rewrite,
)
from app.front.haproxy_config import HEADER, V1_408, V1_429, V2_408, parse_header
from benchmarks.front_memory import serve_config
from tests.conftest import REPO, free_port, wait_until


def section(config: str, header: str) -> str:
    lines = config.splitlines()
    start = lines.index(header)
    end = next((i for i in range(start + 1, len(lines)) if lines[i] and not lines[i][0].isspace()), len(lines))
    return "\n".join(lines[start:end])


def test_the_front_limits_each_router_and_queues_in_http_backends_only(tmp_path: Path) -> None:
    config = serve_config(tmp_path, 18600, 38600, replicas=2)
    out = admit(config, Front(maxconn_per_replica=7, queue_timeout_s=2.5))
    http = section(out, "backend http-classifier")
    routers = [line for line in http.splitlines() if "SERVE_REPLICA" in line]
    assert len(routers) == 2 and all(line.endswith(" maxconn 7") for line in routers)
    fallback = next(line for line in http.splitlines() if "fallback" in line and line.strip().startswith("server"))
    assert "maxconn" not in fallback  # the backup proxy, used only when no Router is up
    assert "timeout queue 2500ms" in http and "http-error status 503" in http and "Retry-After 1" in http
    grpc = section(out, "backend grpc-classifier")
    assert grpc == section(config, "backend grpc-classifier")  # HTTP/2 streams: left alone
    front = section(out, "frontend http_frontend")
    first_route = front.index("\n    use_backend ")
    assert 0 < front.index("set-var(txn.front_busy)") < first_route
    assert "queue(" not in front  # max_queued 0: no refusal before the timeout
    # Nothing of Serve's removed; what is added: the frontend's rules, the global buffer, the backend's limits, the
    # two Routers' maxconn and the per-client table.
    assert all(line in out.splitlines() or "SERVE_REPLICA" in line for line in config.splitlines())
    assert "    tune.bufsize 65536" in section(out, "global")
    assert section(out, "backend app_front_clients").splitlines()[1].strip().startswith("stick-table type string")


def test_server_template_lines_are_limited_too(tmp_path: Path) -> None:
    """A Serve that declares its Routers with `server-template` (a pool HAProxy fills at run time) gets the same."""
    config = serve_config(tmp_path, 18605, 38605)
    line = next(x for x in config.splitlines() if x.strip().startswith("server SERVE_REPLICA"))
    templated = config.replace(line, "    server-template SERVE_REPLICA_classifier-Router- 4 127.0.0.1:38605 check")
    out = admit(templated, Front(maxconn_per_replica=9))
    assert "    server-template SERVE_REPLICA_classifier-Router- 4 127.0.0.1:38605 check maxconn 9" in out
    (tmp_path / "t.cfg").write_text(out)
    assert subprocess.run([real_haproxy(), "-c", "-f", str(tmp_path / "t.cfg")], capture_output=True).returncode == 0


def test_a_queue_bound_refuses_at_once_in_the_frontend(tmp_path: Path) -> None:
    out = admit(serve_config(tmp_path, 18610, 38610), Front(max_queued=50))
    front = section(out, "frontend http_frontend")
    rule = next(line for line in front.splitlines() if "queue(http-classifier)" in line)
    assert "return status 503" in rule and "ge 50" in rule and "{ var(txn.front_app) -m str http-classifier }" in rule
    assert front.index(rule) < front.index("\n    use_backend ")


def test_a_client_beyond_its_share_is_held_by_the_tarpit(tmp_path: Path) -> None:
    """A request beyond max_per_client is HAProxy's tarpit's: held for Retry-After (`timeout tarpit`), then the JSON
    429. How long it is held is HAProxy's timer, set here; the live tests check who answered, not when."""
    out = admit(serve_config(tmp_path, 18615, 38615), Front(max_per_client=2))
    front = section(out, "frontend http_frontend").splitlines()
    assert "    timeout tarpit 1000ms" in front
    rule = next(line for line in front if "table_trackers(app_front_clients)" in line)
    assert rule.strip().startswith("http-request tarpit deny_status 429") and "hdr Retry-After 1" in rule
    assert rule.endswith("gt 2 }")


def test_haproxy_accepts_the_config(tmp_path: Path) -> None:
    out = tmp_path / "front.cfg"
    out.write_text(admit(serve_config(tmp_path, 18620, 38620, replicas=3), Front(max_queued=10)))
    check = subprocess.run([real_haproxy(), "-c", "-f", str(out)], capture_output=True, text=True)
    assert check.returncode == 0, check.stderr


def test_the_bodies_are_the_services_errors() -> None:
    v1, v2 = json.loads(V1_BODY), json.loads(V2_BODY)
    assert v1["error"]["code"] == "overloaded" and v1["error"]["message"]
    assert isinstance(v2["error"], str) and v2["error"] == v1["error"]["message"]


def test_an_unrecognised_config_runs_unchanged(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "other.cfg"
    text = "global\n    maxconn 10\nfrontend web\n    bind :80\n    use_backend b\nbackend b\n"
    cfg.write_text(text)
    with pytest.raises(Unrecognised):
        http_backends(text)
    rewrite(["-db", "-f", str(cfg), "-sf", "123"])
    assert cfg.read_text() == text and "unchanged" in capsys.readouterr().err


def test_a_bad_limit_leaves_serves_config_and_haproxy_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    text = serve_config(tmp_path, free_port(), 38640)
    monkeypatch.setenv("APP_FRONT_QUEUE_TIMEOUT_S", "soon")  # a hand-edited Pod env: fail open, not a dead ingress
    rewrite(["-db", "-f", str(tmp_path / "haproxy.cfg")])
    assert (tmp_path / "haproxy.cfg").read_text() == text
    assert "APP_FRONT_QUEUE_TIMEOUT_S" in capsys.readouterr().err


def test_the_config_is_edited_in_place_once_and_serves_kept_beside_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # In place: Serve finds its HAProxy processes by this path in their command line (re-signalling draining
    # workers on reloads, counting leaked ones), so the arguments stay Serve's.
    text = serve_config(tmp_path, free_port(), 38630)
    source = tmp_path / "haproxy.cfg"
    monkeypatch.setenv("APP_FRONT_MAXCONN_PER_REPLICA", "33")
    rewrite(["-db", "-f", str(source), "-dR", "-sf", "41", "42"])
    edited = source.read_text()
    assert MARK in edited and " maxconn 33" in edited  # the limit from the environment Serve gave HAProxy
    assert (tmp_path / ("haproxy.cfg" + SERVE_COPY)).read_text() == text
    rewrite(["-db", "-f", str(source)])  # HAProxy restarted on the same file: nothing added twice
    assert source.read_text() == edited
    rewrite(["-vv"])  # no config: nothing to do


def test_a_full_queue_refuses_only_its_own_applications_requests(tmp_path: Path) -> None:
    # /other/x matches both applications' path ACLs (`/` is a prefix of everything); it goes to the longer
    # prefix, so only that application's queue may refuse it.
    out = admit(serve_config(tmp_path, free_port(), 38650, other_app=True), Front(max_queued=5))
    front = section(out, "frontend http_frontend").splitlines()
    tags = [line.strip() for line in front if "set-var(txn.front_app)" in line]
    assert tags[0].startswith("http-request set-var(txn.front_app) str(http-other) if is_http-other")
    assert all("!{ var(txn.front_app) -m found }" in t for t in tags) and len(tags) == 2
    rules = [line for line in front if "return status 503" in line and "queue(" in line]
    assert {r.split("queue(")[1].split(")")[0] for r in rules} == {"http-other", "http-classifier"}
    assert all("{ var(txn.front_app) -m str " in r for r in rules)
    check = tmp_path / "two.cfg"
    check.write_text(out)
    assert subprocess.run([real_haproxy(), "-c", "-f", str(check)], capture_output=True).returncode == 0


def test_the_front_never_execs_itself(tmp_path: Path) -> None:
    env = {**os.environ, "APP_FRONT_EXECED": "1"}  # as if HAProxy had resolved to the front again
    out = subprocess.run(
        [sys.executable, "-c", "from app.front import main; main()", "-v"],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode != 0 and "is the front itself" in out.stderr


@pytest.mark.parametrize(
    "env, message",
    [
        ({"APP_FRONT_MAXCONN_PER_REPLICA": "0"}, "greater than or equal to 1"),
        ({"APP_FRONT_MAXCONN_PER_REPLICA": "1000000"}, "less than or equal to 100000"),
        ({"APP_FRONT_MAXCONN_PER_REPLICA": "ten"}, "integer"),
        ({"APP_FRONT_QUEUE_TIMEOUT_S": "0"}, "0.001"),
        ({"APP_FRONT_QUEUE_TIMEOUT_S": "soon"}, "number"),
        ({"APP_FRONT_MAX_QUEUED": "-1"}, "greater than or equal to 0"),
        ({"APP_FRONT_CLIENT_HEADER": "x user"}, "pattern"),
        ({"APP_FRONT_BUFFER_BYTES": "1024"}, "16384"),
    ],
)
def test_bad_limits_are_refused_by_name(env: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message) as e:
        from_env(env)
    assert next(iter(env)) in str(e.value)


def test_the_front_takes_its_limits_from_the_app_config_and_back() -> None:
    import yaml

    local = yaml.safe_load((REPO / "configs" / "local.yaml").read_text())
    env = config_env(local)
    front = from_env(env)
    assert front == Front() and front.maxconn_per_replica == 128 and front.queue_timeout_s == 4
    assert env == env_of(front) and env["APP_FRONT_BUFFER_BYTES"] == "65536"
    local["applications"][0]["args"]["front"]["max_per_client"] = 3
    assert from_env(config_env(local)).max_per_client == 3
    limits = {k: str(v) for k, v in dataclasses.asdict(Front()).items() if k != "retry_after_s"}
    assert parse_header(Front().header_value().replace("%[hostname]", "node-1")) == {"host": "node-1", **limits}
    assert parse_header("garbage") == {} and parse_header("a=b") == {}


class Holding(http.server.BaseHTTPRequestHandler):
    """Answers 200 once the test releases it: a Router busy with its requests. Records what reached it."""

    release = threading.Event()
    entered = threading.Event()
    seen: list[tuple[str, dict[str, str], int]] = []  # (path, headers, body bytes) of each request that reached it
    service_s = 0.0  # once released, each request takes this long: a Router's service time

    def _answer(self) -> None:
        if self.path != "/-/healthz":  # HAProxy's health checks are answered at once
            body = self.rfile.read(int(self.headers.get("content-length") or 0))
            self.seen.append((self.path, {k.lower(): v for k, v in self.headers.items()}, len(body)))
            self.entered.set()
            self.release.wait(10)
            time.sleep(self.service_s)  # the Router's service time (the load's shape), not synchronisation
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    do_GET = do_POST = _answer

    def log_message(self, *args: object) -> None:
        pass


STATS_SOCKETS: dict[str, Path] = {}  # each `fronted` HAProxy's admin socket, by its URL


def backend_stats(url: str, backend: str = "http-classifier") -> dict[str, str]:
    """HAProxy's own counters of `backend` (`show stat` on its admin socket): qmax, the most requests that ever
    waited in its queue for a Router's place at once; smax, the most it ever had at the Routers at once; ..."""
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(10)
        s.connect(str(STATS_SOCKETS[url]))
        s.sendall(b"show stat\n")
        raw = b""
        while chunk := s.recv(65536):
            raw += chunk
    lines = raw.decode().splitlines()
    fields = lines[0].removeprefix("# ").split(",")
    rows = [dict(zip(fields, line.split(","), strict=False)) for line in lines[1:] if line]
    return next(r for r in rows if r["pxname"] == backend and r["svname"] == "BACKEND")


FRONTED = {"APP_FRONT_MAXCONN_PER_REPLICA": "1", "APP_FRONT_QUEUE_TIMEOUT_S": "0.5"}
GREEDY_CASE = {"APP_FRONT_MAXCONN_PER_REPLICA": "8", "APP_FRONT_QUEUE_TIMEOUT_S": "1.5"}


@pytest.fixture
def fronted(request: pytest.FixtureRequest) -> Iterator[tuple[str, type[Holding]]]:
    """HAProxy (the real binary, started through `app-haproxy` as Serve starts it) before one held Router; the front's
    variables FRONTED, or the test's own (`@pytest.mark.parametrize("fronted", [{...}], indirect=True)`)."""
    backend = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Holding)
    threading.Thread(target=backend.serve_forever, daemon=True).start()
    tmp = Path(tempfile.mkdtemp(prefix="front-", dir="/tmp"))  # short: HAProxy's socket paths are limited
    port = free_port()
    serve_config(tmp, port, backend.server_address[1])
    env = {**os.environ, **getattr(request, "param", FRONTED)}
    cmd = [sys.executable, "-c", "from app.front import main; main()", "-db", "-f", str(tmp / "haproxy.cfg")]
    proc = subprocess.Popen(cmd, env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    STATS_SOCKETS[url] = tmp / "admin.sock"  # serve_config's `stats socket`
    try:
        wait_until(lambda: httpx.get(url + "/-/healthz", timeout=1).status_code == 200, timeout_s=20, what="HAProxy up")
        # The process Serve started is HAProxy now, with Serve's arguments: Serve finds it by its config's path.
        cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes().split(b"\0")
        assert str(tmp / "haproxy.cfg").encode() in cmdline and Path(cmdline[0].decode()).name == "haproxy"
        yield url, Holding
    finally:
        Holding.release.set()
        proc.terminate()
        proc.wait(10)
        backend.shutdown()
        Holding.release.clear()
        Holding.entered.clear()
        Holding.seen.clear()
        Holding.service_s = 0.0
        STATS_SOCKETS.pop(url, None)
        shutil.rmtree(tmp, ignore_errors=True)


def trickle(url: str, path: str, head: bytes, body: bytes, per_s: float, give_up_s: float = 10) -> tuple[bytes, int]:
    """A raw connection that sends `head` whole, then `body` at `per_s` bytes a second until an answer comes (or
    `give_up_s` passes); what came back, and how many bytes of the body were sent before it."""
    host, port = url.removeprefix("http://").split(":")
    give_up_at = time.monotonic() + give_up_s
    sent = 0
    with socket.create_connection((host, int(port)), timeout=give_up_s) as s:
        s.sendall(head)
        s.setblocking(False)
        reply = b""
        for i in range(len(body)):
            with contextlib.suppress(BlockingIOError):
                reply += s.recv(4096)
            if reply or time.monotonic() > give_up_at:
                break
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                sent += s.send(body[i : i + 1])
            time.sleep(1 / per_s)  # the trickle's pace (the attack's shape), not synchronisation
        s.setblocking(True)
        with contextlib.suppress(OSError):
            reply += s.recv(4096)
        return reply, sent


def post_head(path: str, length: int, extra: str = "") -> bytes:
    return f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {length}\r\n{extra}\r\n".encode()


@pytest.mark.parametrize("fronted", [{**FRONTED, "APP_FRONT_BODY_TIMEOUT_S": "0.6"}], indirect=True)
def test_a_slow_body_waits_in_haproxy_and_never_reaches_a_router(fronted: tuple[str, type[Holding]]) -> None:
    url, held = fronted
    for path, body in (("/v1/classify", V1_408), ("/v2/models/m/infer", V2_408)):
        reply, sent = trickle(url, path, post_head(path, 1000), b"x" * 1000, per_s=5)
        status, _, payload = reply.partition(b"\r\n\r\n")
        assert status.startswith(b"HTTP/1.1 408") and b"application/json" in status.lower()
        # The front's body deadline ended it (its own JSON 408) while the body was still coming, part of it read.
        assert json.loads(payload) == json.loads(body) and 0 < sent < 1000, sent
    assert held.seen == []  # the Router never saw them: no place was taken
    # a whole body passes, with the front's header replacing the client's own; the Router answers at once (unreleased,
    # it would hold the request for as long as the client waits: a race between its 10 s and the client's)
    held.release.set()
    ok = httpx.post(url + "/v1/classify", content=b"x" * 40_000, headers={HEADER: "host=forged"}, timeout=10)
    assert ok.status_code == 200
    path, headers, size = held.seen[-1]
    front = parse_header(headers[HEADER.lower()])
    assert size == 40_000 and front["host"] != "forged" and front["body_timeout_s"] == "0.6"


@pytest.mark.parametrize(
    "fronted", [{**FRONTED, "APP_FRONT_MAXCONN_PER_REPLICA": "8", "APP_FRONT_MAX_PER_CLIENT": "2"}], indirect=True
)
def test_one_client_may_hold_its_share_and_no_more(fronted: tuple[str, type[Holding]]) -> None:
    url, held = fronted
    greedy = {"X-User-Id": "greedy"}

    def send(headers: dict[str, str] | None = None) -> threading.Thread:
        thread = threading.Thread(
            target=httpx.get, args=(url + "/v1/classify",), kwargs={"headers": headers, "timeout": 10}
        )
        thread.start()
        return thread

    busy = [send(greedy), send(greedy)]
    wait_until(lambda: len(held.seen) == 2, timeout_s=5, what="the greedy client's two requests at the Router")
    refused = httpx.get(url + "/v1/classify", headers=greedy, timeout=10)
    assert refused.status_code == 429 and refused.json() == json.loads(V1_429)
    # HAProxy's tarpit answered it: held for Retry-After (its `timeout tarpit`, the config's: see
    # test_a_client_beyond_its_share_is_held_by_the_tarpit), then refused.
    assert refused.headers["retry-after"] == "1"
    assert len(held.seen) == 2  # the refused one never reached the Router
    polite = send({"X-User-Id": "polite"})  # another client is not refused: it reaches the Router beside it
    wait_until(lambda: len(held.seen) == 3, timeout_s=5, what="the polite client's request at the Router")
    anonymous = send()  # no X-User-Id, and max_per_address 0: not bounded per client
    wait_until(lambda: len(held.seen) == 4, timeout_s=5, what="an anonymous request at the Router")
    held.release.set()
    for t in [*busy, polite, anonymous]:
        t.join(10)
    assert httpx.get(url + "/v1/classify", headers=greedy, timeout=10).status_code == 200  # its share is free again


@pytest.mark.parametrize(
    "fronted", [{**FRONTED, "APP_FRONT_MAXCONN_PER_REPLICA": "8", "APP_FRONT_MAX_PER_ADDRESS": "1"}], indirect=True
)
def test_requests_that_name_no_client_are_bounded_per_address_when_asked(fronted: tuple[str, type[Holding]]) -> None:
    url, held = fronted

    def get(source: str) -> httpx.Response:
        with httpx.Client(transport=httpx.HTTPTransport(local_address=source), timeout=10) as client:
            return client.get(url + "/v1/classify")

    first = threading.Thread(target=get, args=("127.0.0.1",))
    first.start()
    wait_until(lambda: len(held.seen) == 1, timeout_s=5, what="the first address's request at the Router")
    assert get("127.0.0.1").status_code == 429  # its address's one place is taken
    other = threading.Thread(target=get, args=("127.0.0.2",))
    other.start()  # another address is another client
    wait_until(lambda: len(held.seen) == 2, timeout_s=5, what="another address's request at the Router")
    held.release.set()
    for t in (first, other):
        t.join(10)


async def _greedy(url: str, connections: int, stop: threading.Event) -> Counter[int]:
    """`connections` raw connections resending at once (a new connection per request) until `stop` is set, all as
    one named client; the statuses they got."""
    host, port = url.removeprefix("http://").split(":")
    request = b"GET /v1/classify HTTP/1.1\r\nHost: x\r\nX-User-Id: greedy\r\nConnection: close\r\n\r\n"
    statuses: Counter[int] = Counter()

    async def one() -> None:
        while not stop.is_set():
            with contextlib.suppress(OSError, asyncio.TimeoutError, ValueError):
                reader, writer = await asyncio.open_connection(host, int(port))
                writer.write(request)
                reply = await asyncio.wait_for(reader.read(), timeout=10)
                statuses[int(reply.split(b" ", 2)[1])] += 1
                writer.close()

    await asyncio.gather(*(one() for _ in range(connections)))
    return statuses


def _polite(url: str, every_s: float, requests: int) -> list[int]:
    """One connection sending `requests` requests, one every `every_s` on a schedule: the status of each."""
    out, due = [], time.monotonic()
    with httpx.Client(timeout=10, headers={"X-User-Id": "polite"}) as client:
        for _ in range(requests):
            time.sleep(max(0.0, due - time.monotonic()))  # the schedule (the load's shape), not synchronisation
            out.append(client.get(url + "/v1/classify").status_code)
            due += every_s
    return out


@pytest.mark.parametrize(
    ("fronted", "bounded"),
    [
        ({**GREEDY_CASE, "APP_FRONT_MAX_PER_CLIENT": "4"}, True),
        ({**GREEDY_CASE, "APP_FRONT_MAX_PER_CLIENT": "0"}, False),
    ],
    indirect=["fronted"],
)
def test_a_greedy_client_with_500_connections_leaves_a_polite_one_its_rate(
    fronted: tuple[str, type[Holding]], bounded: bool
) -> None:
    """The issue's case at HAProxy: one client resending at once on 500 connections, one sending a request every
    0.2 s, a Router taking 50 ms per request with 8 places. With max_per_client (4 here), the greedy client holds 4
    places and its other 496 connections are held and refused with 429; the polite one finds a place at once. The
    same without the bound: the greedy client fills the places and the queue, and the polite one waits behind it
    (or is refused with 503), which shows what the bound is for."""
    url, held = fronted
    held.service_s = 0.05
    held.release.set()
    stop = threading.Event()
    greedy: Counter[int] = Counter()
    loop = threading.Thread(target=lambda: greedy.update(asyncio.run(_greedy(url, 500, stop))))
    loop.start()
    try:
        wait_until(lambda: len(held.seen) >= 20, timeout_s=5, what="the greedy client at the Router")
        polite = _polite(url, 0.2, 12)  # all of it while the greedy client resends
    finally:
        stop.set()
        loop.join(15)
    stats = backend_stats(url)
    print(f"polite {polite}; greedy {dict(greedy)}; HAProxy: qmax {stats['qmax']}, smax {stats['smax']}")
    if bounded:
        assert polite == [200] * 12, polite  # every one answered, none refused
        assert greedy[429] > 100 and greedy[200] > 0, greedy  # refused beyond its share, served within it
        # The greedy client held at most its 4 of the 8 places, so a place was always free: no request ever waited
        # in HAProxy's queue (its own count), the polite one's included. It got a place at once.
        assert stats["qmax"] == "0", stats
        front = [parse_header(h[HEADER.lower()]) for _, h, _ in held.seen]
        assert {f["max_per_client"] for f in front} == {"4"}
    else:
        # Without the bound the greedy client takes every place and fills the queue, and is never refused: the
        # polite one waits in that queue behind it (or is refused with 503 there), which shows what the bound is for.
        assert int(stats["qmax"]) > 0 and greedy[429] == 0, (stats, greedy)


def test_a_routers_report_of_the_fronts_it_saw() -> None:
    """FrontReport (app/http/front_report.py): each HAProxy's limits as its header said, differences from the
    config, and requests without the front counted, each handed to the metric once."""
    from app.http.front_report import FrontReport

    report = FrontReport(Front())
    same = Front().header_value().replace("%[hostname]", "node-1")
    other = dataclasses.replace(Front(), max_per_client=8).header_value().replace("%[hostname]", "node-2")
    for raw in (same, same, None, "not the front's", other):
        report.saw(raw)
    described = report.describe()
    assert described["in_place"] and described["requests_without_front"] == 2
    assert described["haproxies"]["node-1"]["differs_from_config"] == []
    assert described["haproxies"]["node-2"]["differs_from_config"] == ["max_per_client"]
    assert report.unreported() == 2 and report.unreported() == 0
    report.saw(None)
    assert report.unreported() == 1 and report.describe()["requests_without_front"] == 3


def test_a_router_says_which_ingress_it_is_behind_and_what_of_serve_env_is_in_force(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """FrontReport's `ingress`: read from the Router's environment against configs/serve.env, logged at start."""
    from app.config import read_serve_env
    from app.http.front_report import FrontReport, ingress_of, serve_env_state

    wanted = read_serve_env()
    front = {**wanted, "RAY_SERVE_HAPROXY_BINARY_PATH": "/opt/venv/bin/app-haproxy"}
    assert ingress_of(front) == "haproxy+admission-front"
    assert ingress_of({**wanted, "RAY_SERVE_HAPROXY_BINARY_PATH": "/usr/sbin/haproxy"}) == "haproxy"
    assert ingress_of(wanted) == "haproxy"  # HAProxy on, Serve's own binary
    assert ingress_of({}) == ingress_of({"RAY_SERVE_ENABLE_HA_PROXY": "0"}) == "serve-python-proxy"

    full = serve_env_state(front)
    assert full["read"] and full["in_force"] == sorted(wanted) and full["missing"] == [] and full["differs"] == {}
    partial = {k: v for k, v in wanted.items() if k != "RAY_SERVE_GRPC_MAX_MESSAGE_SIZE"}
    partial["RAY_SERVE_HAPROXY_NBTHREAD"] = "4"
    state = serve_env_state(partial)
    assert state["missing"] == ["RAY_SERVE_GRPC_MAX_MESSAGE_SIZE"]
    assert state["differs"] == {"RAY_SERVE_HAPROXY_NBTHREAD": {"serve_env": "1", "set": "4"}}
    assert "RAY_SERVE_HAPROXY_NBTHREAD" not in state["in_force"] and len(state["in_force"]) == len(wanted) - 2
    absent = serve_env_state({}, tmp_path / "serve.env")
    assert not absent["read"] and absent["missing"] == [] and "serve.env" in absent["error"]

    with caplog.at_level(logging.INFO, logger="ray.serve"):
        bare = FrontReport(Front(), environ={"PATH": "/usr/bin"})
    assert bare.ingress["runs"] == "serve-python-proxy"
    assert bare.ingress["serve_env"]["missing"] == sorted(wanted) and bare.ingress["serve_env"]["in_force"] == []
    (line,) = [r for r in caplog.records if r.getMessage().startswith("ingress:")]
    assert line.levelno == logging.WARNING and "serve-python-proxy" in line.getMessage()
    assert "RAY_SERVE_ENABLE_HA_PROXY" in line.getMessage()
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="ray.serve"):
        FrontReport(Front(), environ=front)
    (line,) = [r for r in caplog.records if r.getMessage().startswith("ingress:")]
    assert line.levelno == logging.INFO and "haproxy+admission-front; every setting" in line.getMessage()
    caplog.clear()
    copy = tmp_path / "image" / "serve.env"  # an install without configs/: the image's copy, named by the variable
    copy.parent.mkdir()
    copy.write_text("RAY_SERVE_ENABLE_HA_PROXY=1\n")
    with caplog.at_level(logging.INFO, logger="ray.serve"):
        named = FrontReport(Front(), environ={**front, "APP_SERVE_ENV_FILE": str(copy)})
        unread = FrontReport(Front(), environ={**front, "APP_SERVE_ENV_FILE": str(tmp_path / "none")})
    assert named.ingress["serve_env"]["file"] == str(copy) and named.ingress["serve_env"]["in_force"] == [
        "RAY_SERVE_ENABLE_HA_PROXY"
    ]
    assert not unread.ingress["serve_env"]["read"]
    (line,) = [r for r in caplog.records if "not read" in r.getMessage()]
    assert line.levelno == logging.WARNING and "APP_SERVE_ENV_FILE" in line.getMessage()
