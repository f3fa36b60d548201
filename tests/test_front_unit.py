"""The admission front (app/front.py) on configs rendered by Serve's own HAProxy code, run by the real HAProxy.

No Ray: Serve's config renderer (HAProxyApi) is plain Python, and HAProxy is the binary ray[serve] bundles. The
last tests put HAProxy with the front's config in front of a tiny HTTP server that holds its requests, so the queue,
its timeout and the 503s are HAProxy's real behaviour.
"""

from __future__ import annotations

import http.server
import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from app.front import SUFFIX, V1_BODY, V2_BODY, Front, Unrecognised, admit, http_backends, real_haproxy, rewrite_args
from tests.conftest import REPO, wait_until


def serve_config(tmp: Path, port: int, replica_port: int, replicas: int = 1) -> str:
    """The config Serve 2.60 writes for one application `classifier` (HTTP and gRPC), Routers at `replica_port`."""
    from ray.serve._private.common import RequestProtocol
    from ray.serve._private.haproxy import BackendConfig, HAProxyApi, HAProxyConfig, ServerConfig

    cfg = HAProxyConfig(
        socket_path=str(tmp / "admin.sock"),
        server_state_base=str(tmp),
        server_state_file=str(tmp / "server-state"),
        stats_port=port + 1,
        metrics_port=port + 2,
        has_received_routes=True,  # as once Serve's controller has sent them: /-/healthz then answers 200
        has_received_servers=True,
    )
    cfg.http_options.host, cfg.http_options.port = "127.0.0.1", port
    cfg.grpc_options.port = port + 3
    cfg.grpc_options.grpc_servicer_functions = ["app.v2_grpc.add_servicer"]  # any: it only turns gRPC on
    name = "SERVE_REPLICA_classifier-Router-{}"
    servers = [ServerConfig(name.format(i), "127.0.0.1", replica_port + i) for i in range(replicas)]
    fallback = ServerConfig("SERVE_PROXY_ACTOR-fallback", "127.0.0.1", port + 4)
    backends = {
        "http": BackendConfig("http-classifier", "/", servers=servers, fallback_server=fallback, app_name="classifier"),
        "grpc": BackendConfig(
            "grpc-classifier", "/", servers=servers, app_name="classifier", protocol=RequestProtocol.GRPC
        ),
    }
    api = HAProxyApi(cfg, backends, config_file_path=str(tmp / "haproxy.cfg"))
    api._generate_config_file_internal()
    return (tmp / "haproxy.cfg").read_text()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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
    assert len(added) == 2 + 2 + 2  # the two body picks, timeout + http-error, the two Routers' lines


def test_a_queue_bound_refuses_at_once_in_the_frontend(tmp_path: Path) -> None:
    out = admit(serve_config(tmp_path, 18610, 38610), Front(max_queued=50))
    front = section(out, "frontend http_frontend")
    rule = next(line for line in front.splitlines() if "queue(http-classifier)" in line)
    assert "return status 503" in rule and "ge 50" in rule and "if is_http-classifier" in rule
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
    cfg.write_text("global\n    maxconn 10\nfrontend web\n    bind :80\n    use_backend b\nbackend b\n")
    with pytest.raises(Unrecognised):
        http_backends(cfg.read_text())
    args = ["-db", "-f", str(cfg), "-sf", "123"]
    assert rewrite_args(args, Front()) == args
    assert "unchanged" in capsys.readouterr().err
    assert not (tmp_path / ("other.cfg" + SUFFIX)).exists()


def test_serves_arguments_are_kept_and_the_config_swapped(tmp_path: Path) -> None:
    serve_config(tmp_path, 18630, 38630)
    source = tmp_path / "haproxy.cfg"
    args = rewrite_args(["-db", "-f", str(source), "-dR", "-sf", "41", "42"], Front())
    assert args == ["-db", "-f", str(source) + SUFFIX, "-dR", "-sf", "41", "42"]
    assert "maxconn 128" not in source.read_text() and " maxconn 96" in Path(args[2]).read_text()
    assert rewrite_args(["-vv"], Front()) == ["-vv"]


@pytest.mark.parametrize(
    "env, message",
    [
        ({"APP_FRONT_MAXCONN_PER_REPLICA": "0"}, "at least 1"),
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
def fronted(tmp_path: Path) -> Iterator[tuple[str, type[Holding]]]:
    """HAProxy (the real binary, through `app-haproxy`'s own argument rewrite) before one held Router."""
    backend = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Holding)
    threading.Thread(target=backend.serve_forever, daemon=True).start()
    port = free_port()
    serve_config(tmp_path, port, backend.server_address[1])
    env = {**os.environ, "APP_FRONT_MAXCONN_PER_REPLICA": "1", "APP_FRONT_QUEUE_TIMEOUT_S": "0.5"}
    cmd = [sys.executable, "-c", "from app.front import main; main()", "-db", "-f", str(tmp_path / "haproxy.cfg")]
    proc = subprocess.Popen(cmd, env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: httpx.get(url + "/-/healthz", timeout=1).status_code == 200, timeout_s=20, what="HAProxy up")
        yield url, Holding
    finally:
        Holding.release.set()
        proc.terminate()
        proc.wait(10)
        backend.shutdown()
        Holding.release.clear()
        Holding.entered.clear()


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
    assert "RAY_SERVE_HAPROXY_BINARY_PATH" not in private_serve_env(18640, front=False)  # the Serve peers
    assert "RAY_SERVE_HAPROXY_BINARY_PATH" not in private_serve_env(18640, {"RAY_SERVE_THROUGHPUT_OPTIMIZED": "1"})
    mine = {"RAY_SERVE_ENABLE_HA_PROXY": "1", "RAY_SERVE_HAPROXY_BINARY_PATH": "/opt/haproxy"}
    assert private_serve_env(18640, mine)["RAY_SERVE_HAPROXY_BINARY_PATH"] == "/opt/haproxy"  # an operator's wins
