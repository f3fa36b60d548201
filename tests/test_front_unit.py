"""The admission front (app/front.py) on configs rendered by Serve's own HAProxy code, run by the real HAProxy.

No Ray: Serve's config renderer (HAProxyApi) is plain Python, and HAProxy is the binary ray[serve] bundles. The
last tests put HAProxy with the front's config in front of a tiny HTTP server that holds its requests, so the queue,
its timeout and the 503s are HAProxy's real behaviour.
"""

from __future__ import annotations

import http.server
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
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
    http_backends,
    real_haproxy,
    rewrite,
)
from tests.conftest import REPO, free_port, wait_until


def serve_config(tmp: Path, port: int, replica_port: int, replicas: int = 1, other_app: bool = False) -> str:
    """The config Serve 2.60 writes for application `classifier` at / (HTTP and gRPC; with `other_app`, a second
    at /other), Routers from `replica_port`. Its own ports (stats, metrics, gRPC, fallback) are free ones."""
    from ray.serve._private.common import RequestProtocol
    from ray.serve._private.haproxy import BackendConfig, HAProxyApi, HAProxyConfig, ServerConfig

    cfg = HAProxyConfig(
        socket_path=str(tmp / "admin.sock"),
        server_state_base=str(tmp),
        server_state_file=str(tmp / "server-state"),
        stats_port=free_port(),
        metrics_port=free_port(),
        metrics_enabled=False,  # else HAProxy logs every request to Serve's shared metrics socket
        has_received_routes=True,  # as once Serve's controller has sent them: /-/healthz then answers 200
        has_received_servers=True,
    )
    cfg.http_options.host, cfg.http_options.port = "127.0.0.1", port
    cfg.grpc_options.port = free_port()
    cfg.grpc_options.grpc_servicer_functions = ["app.v2_grpc.add_servicer"]  # any: it only turns gRPC on
    name = "SERVE_REPLICA_classifier-Router-{}"
    servers = [ServerConfig(name.format(i), "127.0.0.1", replica_port + i) for i in range(replicas)]
    fallback = ServerConfig("SERVE_PROXY_ACTOR-fallback", "127.0.0.1", free_port())
    backends = {
        "http": BackendConfig("http-classifier", "/", servers=servers, fallback_server=fallback, app_name="classifier"),
        "grpc": BackendConfig(
            "grpc-classifier", "/", servers=servers, app_name="classifier", protocol=RequestProtocol.GRPC
        ),
    }
    if other_app:
        other = [ServerConfig("SERVE_REPLICA_other-Ingress-0", "127.0.0.1", replica_port + replicas)]
        backends["other"] = BackendConfig("http-other", "/other", servers=other, app_name="other")
    api = HAProxyApi(cfg, backends, config_file_path=str(tmp / "haproxy.cfg"))
    api._generate_config_file_internal()
    return (tmp / "haproxy.cfg").read_text()


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
    # Nothing else of Serve's changed.
    added = [line for line in out.splitlines() if line not in config.splitlines()]
    assert len(added) == 3 + 2 + 2  # the mark and two body picks, timeout + http-error, the two Routers' lines


def test_a_queue_bound_refuses_at_once_in_the_frontend(tmp_path: Path) -> None:
    out = admit(serve_config(tmp_path, 18610, 38610), Front(max_queued=50))
    front = section(out, "frontend http_frontend")
    rule = next(line for line in front.splitlines() if "queue(http-classifier)" in line)
    assert "return status 503" in rule and "ge 50" in rule and "{ var(txn.front_app) -m str http-classifier }" in rule
    assert front.index(rule) < front.index("\n    use_backend ")


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
        ({"APP_FRONT_MAXCONN_PER_REPLICA": "0"}, r"\[1, 100000\]"),
        ({"APP_FRONT_MAXCONN_PER_REPLICA": "1000000"}, r"\[1, 100000\]"),
        ({"APP_FRONT_MAXCONN_PER_REPLICA": "ten"}, "an integer"),
        ({"APP_FRONT_QUEUE_TIMEOUT_S": "0"}, "0.001"),
        ({"APP_FRONT_QUEUE_TIMEOUT_S": "soon"}, "a number"),
        ({"APP_FRONT_MAX_QUEUED": "-1"}, r"0 \(no bound\)"),
    ],
)
def test_bad_limits_are_refused_by_name(env: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message) as e:
        Front.from_env(env)
    assert next(iter(env)) in str(e.value)


def test_the_shipped_environment_sets_the_front() -> None:
    from app.config import read_serve_env

    front = Front.from_env(read_serve_env())
    assert front.maxconn_per_replica == 128 and front.queue_timeout_s == 4 and front.max_queued == 0


class Holding(http.server.BaseHTTPRequestHandler):
    """Answers 200 once the test releases it: a Router busy with its requests."""

    release = threading.Event()
    entered = threading.Event()

    def do_GET(self) -> None:
        if self.path != "/-/healthz":  # HAProxy's health checks are answered at once
            self.entered.set()
            self.release.wait(10)
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def fronted() -> Iterator[tuple[str, type[Holding]]]:
    """HAProxy (the real binary, started through `app-haproxy` as Serve starts it) before one held Router."""
    backend = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Holding)
    threading.Thread(target=backend.serve_forever, daemon=True).start()
    tmp = Path(tempfile.mkdtemp(prefix="front-", dir="/tmp"))  # short: HAProxy's socket paths are limited
    port = free_port()
    serve_config(tmp, port, backend.server_address[1])
    env = {**os.environ, "APP_FRONT_MAXCONN_PER_REPLICA": "1", "APP_FRONT_QUEUE_TIMEOUT_S": "0.5"}
    cmd = [sys.executable, "-c", "from app.front import main; main()", "-db", "-f", str(tmp / "haproxy.cfg")]
    proc = subprocess.Popen(cmd, env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
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
        shutil.rmtree(tmp, ignore_errors=True)


def test_beyond_a_routers_limit_requests_wait_then_get_the_services_503(
    fronted: tuple[str, type[Holding]],
) -> None:
    url, held = fronted
    with httpx.Client(timeout=10) as first, httpx.Client(timeout=10) as second:
        busy = threading.Thread(target=first.get, args=(url + "/v1/classify",))
        busy.start()  # takes the Router's one slot, and holds it
        wait_until(held.entered.is_set, timeout_s=5, what="the first request at the Router")
        refused = second.get(url + "/v1/classify")
        assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
        assert refused.headers["content-type"] == "application/json" and refused.json() == json.loads(V1_BODY)
        assert refused.elapsed.total_seconds() >= 0.45  # it waited its queue timeout, not refused at once
        v2 = second.get(url + "/v2/models/fp32/infer")
        assert v2.status_code == 503 and v2.json() == json.loads(V2_BODY)
        held.release.set()
        busy.join(10)
        assert second.get(url + "/v1/classify").status_code == 200  # the slot is free again


def test_the_installed_front_is_serves_haproxy_where_haproxy_is_on() -> None:
    from app.config import front_binary, private_serve_env

    binary = front_binary()
    assert binary is not None and Path(binary).parent == Path(sys.executable).parent
    # As Serve runs it: RAY_SERVE_HAPROXY_BINARY_PATH names the front itself, which must not exec itself.
    env = {**os.environ, "RAY_SERVE_HAPROXY_BINARY_PATH": binary}
    version = subprocess.run([binary, "-v"], capture_output=True, text=True, timeout=30, env=env)
    assert version.returncode == 0 and "HAProxy version" in version.stdout  # the real one, exec'd by the front
    assert private_serve_env(18640)["RAY_SERVE_HAPROXY_BINARY_PATH"] == binary
    peer = private_serve_env(18640, front=False)["RAY_SERVE_HAPROXY_BINARY_PATH"]  # the Serve peers: HAProxy itself
    assert Path(peer).name == "haproxy" and Path(peer).resolve() != Path(binary).resolve()
    assert "RAY_SERVE_HAPROXY_BINARY_PATH" not in private_serve_env(18640, {"RAY_SERVE_THROUGHPUT_OPTIMIZED": "1"})
    mine = {"RAY_SERVE_ENABLE_HA_PROXY": "1", "RAY_SERVE_HAPROXY_BINARY_PATH": "/opt/haproxy"}
    assert private_serve_env(18640, mine)["RAY_SERVE_HAPROXY_BINARY_PATH"] == "/opt/haproxy"  # an operator's wins
