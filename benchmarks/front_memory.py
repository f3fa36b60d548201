"""What HAProxy holds per request waiting at the admission front (`python -m benchmarks.front_memory`).

The front makes HAProxy keep a request until it is whole (app/front/haproxy_config.py): its head, and its body or
the first Front.buffer_bytes of it. This measures what that costs: the real HAProxy ray[serve] bundles, started through
`app-haproxy` as Serve starts it, on a config Serve's own renderer writes, with the front's limits from
configs/local.yaml's args.front (the head and body deadlines lifted to a minute, so nothing is ended while it is
measured). Three kinds of waiting connection, each at 250, 500 and 1,000 connections at once:

- "full buffer": a head declaring 1 MiB, then a body just short of buffer_bytes (the most a request can make HAProxy
  hold before it goes on to a Router);
- "slow body": a head, then 100 bytes of body;
- "slow head": most of a head, never finished.

HAProxy's RSS (and PSS) is read once every connection is open and has sent its bytes; the figure per connection is
the least-squares slope over the three counts, the worst case that slope times HAProxy's global maxconn as Serve
renders it (RAY_SERVE_HAPROXY_MAXCONN). Writes benchmarks/results/<date>-<host>-front-memory.{json,md,png}.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, suppress
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import yaml

from app.front import config_env
from benchmarks.environment import RESULTS_DIR, host_name, print_environment, stamp
from benchmarks.report import markdown_table, pyplot, save_figure, write_report
from benchmarks.server_process import free_port, port_open

REPO = Path(__file__).resolve().parent.parent
COUNTS = (250, 500, 1000)
KINDS = ("full buffer", "slow body", "slow head")


def serve_config(tmp: Path, port: int, replica_port: int, replicas: int = 1, other_app: bool = False) -> str:
    """The config Serve 2.60 writes for application `classifier` at / (HTTP and gRPC; with `other_app`, a second
    at /other), Routers from `replica_port`, in tmp/haproxy.cfg. Its own ports (stats, metrics, gRPC, fallback) are
    free ones. Serve's renderer (app.serve.serve_internals.render_haproxy_config) is plain Python: no Ray is started."""
    from app.serve.serve_internals import HAProxyBackend, render_haproxy_config

    ports = {"stats": free_port(), "metrics": free_port(), "http": port, "grpc": free_port()}
    name = "SERVE_REPLICA_classifier-Router-{}"
    servers = [(name.format(i), "127.0.0.1", replica_port + i) for i in range(replicas)]
    fallback = ("SERVE_PROXY_ACTOR-fallback", "127.0.0.1", free_port())
    backends = [
        HAProxyBackend("http-classifier", "/", "classifier", servers, fallback=fallback),
        HAProxyBackend("grpc-classifier", "/", "classifier", servers, grpc=True),
    ]
    if other_app:
        other = [("SERVE_REPLICA_other-Ingress-0", "127.0.0.1", replica_port + replicas)]
        backends.append(HAProxyBackend("http-other", "/other", "other", other))
    return render_haproxy_config(tmp, "127.0.0.1", ports, backends)


def serve_maxconn() -> int:
    from app.serve.serve_internals import haproxy_maxconn

    return haproxy_maxconn()


@contextmanager
def fronted_haproxy(env: dict[str, str]) -> Iterator[tuple[int, int]]:
    """HAProxy through the front (`app.front.main`, as Serve execs it), a listener as its Router that never answers:
    (HAProxy's pid, its HTTP port)."""
    router = socket.socket()
    router.bind(("127.0.0.1", 0))
    router.listen(64)
    tmp = Path(tempfile.mkdtemp(prefix="front-mem-", dir="/tmp"))  # short: HAProxy's socket paths are limited
    port = free_port()
    serve_config(tmp, port, router.getsockname()[1])
    cmd = [sys.executable, "-c", "from app.front import main; main()", "-db", "-f", str(tmp / "haproxy.cfg")]
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}  # HAProxy's warnings about the test config
    proc = subprocess.Popen(cmd, env={**os.environ, **env}, cwd=REPO, **quiet)
    try:
        deadline = time.monotonic() + 20
        while not port_open(f"http://127.0.0.1:{port}"):
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError("HAProxy did not start")
            time.sleep(0.05)
        yield proc.pid, port
    finally:
        proc.terminate()
        proc.wait(10)
        router.close()
        shutil.rmtree(tmp, ignore_errors=True)


def first_bytes(kind: str, buffer_bytes: int) -> bytes:
    """What one waiting connection of `kind` sends, and then nothing more."""
    head = "POST /v1/classify HTTP/1.1\r\nHost: x\r\nContent-Type: image/jpeg\r\n"
    if kind == "slow head":
        return (head + "X-Trickle: aaaa").encode()
    body = b"x" * (buffer_bytes - 1024 if kind == "full buffer" else 100)
    return (head + f"Content-Length: {1 << 20}\r\n\r\n").encode() + body


def memory(pid: int) -> dict[str, float]:
    info = psutil.Process(pid).memory_full_info()
    return {"rss_kib": info.rss / 1024, "pss_kib": info.pss / 1024}


def measure(pid: int, port: int, kind: str, count: int, buffer_bytes: int) -> dict[str, Any]:
    """`count` connections of `kind` open at once: HAProxy's memory before and with them."""
    before = memory(pid)
    data = first_bytes(kind, buffer_bytes)
    with ExitStack() as stack:
        conns = [stack.enter_context(socket.create_connection(("127.0.0.1", port), timeout=10)) for _ in range(count)]
        for s in conns:
            s.sendall(data)
        time.sleep(1.0)  # HAProxy reads what was sent (an event-loop turn per connection): a pause, not a sync
        with_them = memory(pid)
        ended = 0  # connections HAProxy already answered or closed: they would not be waiting
        for s in conns:
            s.setblocking(False)
            with suppress(BlockingIOError):
                s.recv(1)  # a reply's first byte, or b"" for a close: either way it ended
                ended += 1
    return {"kind": kind, "connections": count, "before": before, "with": with_them, "ended": ended}


def per_connection(points: list[dict[str, Any]], key: str) -> float:
    xs = np.array([p["connections"] for p in points], dtype=float)
    ys = np.array([p["with"][key] - p["before"][key] for p in points], dtype=float)
    slope, _ = np.polyfit(xs, ys, 1)
    return round(float(slope), 1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, default=REPO / "configs/local.yaml")
    parser.add_argument("--out-dir", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    env_vars, run_stamp = print_environment(), stamp()
    front_env = config_env(yaml.safe_load(args.config.read_text()))
    front_env |= {"APP_FRONT_HEAD_TIMEOUT_S": "60", "APP_FRONT_BODY_TIMEOUT_S": "60"}
    buffer_bytes = int(front_env["APP_FRONT_BUFFER_BYTES"])
    points: list[dict[str, Any]] = []
    for kind in KINDS:
        for count in COUNTS:  # a fresh HAProxy each time: its pools keep what they once took
            with fronted_haproxy(front_env) as (pid, port):
                points.append(measure(pid, port, kind, count, buffer_bytes))
                p = points[-1]
                grew = p["with"]["rss_kib"] - p["before"]["rss_kib"]
                print(f"  {kind:>11} x {count:>4}: RSS +{grew / 1024:.1f} MiB", file=sys.stderr, flush=True)
    maxconn = serve_maxconn()
    summary = {}
    for kind in KINDS:
        mine = [p for p in points if p["kind"] == kind]
        rss, pss = per_connection(mine, "rss_kib"), per_connection(mine, "pss_kib")
        summary[kind] = {"rss_kib_per_connection": rss, "pss_kib_per_connection": pss}
        summary[kind]["worst_case_mib"] = round(rss * maxconn / 1024, 1)
    result = {
        "stamp": run_stamp,
        "environment": env_vars,
        "front": {**front_env},
        "buffer_bytes": buffer_bytes,
        "haproxy_global_maxconn": maxconn,
        "points": points,
        "summary": summary,
    }
    stem = args.out_dir / f"{run_stamp}-{host_name()}-front-memory"
    rows = [
        [k, *(v[f] for f in ("rss_kib_per_connection", "pss_kib_per_connection", "worst_case_mib"))]
        for k, v in summary.items()
    ]
    table = markdown_table(
        ["waiting connection", "RSS KiB each", "PSS KiB each", f"RSS at HAProxy's maxconn ({maxconn}), MiB"], rows
    )
    fig, ax = pyplot().subplots(figsize=(7, 4))
    for kind in KINDS:
        mine = [p for p in points if p["kind"] == kind]
        ax.plot(
            [p["connections"] for p in mine],
            [(p["with"]["rss_kib"] - p["before"]["rss_kib"]) / 1024 for p in mine],
            marker="o",
            label=f"{kind}: {summary[kind]['rss_kib_per_connection']:g} KiB each",
        )
    ax.set(xlabel="connections waiting at the front", ylabel="HAProxy RSS growth (MiB)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.suptitle(f"tune.bufsize {buffer_bytes}; {env_vars['cpu_model']}, {run_stamp}", fontsize=9)
    save_figure(fig, stem.parent / f"{stem.name}.png")
    md = f"# Front memory, {run_stamp}\n\n{table}\n\n![HAProxy RSS per waiting connection]({stem.name}.png)\n"
    print(table)
    print(write_report(stem, result, md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
