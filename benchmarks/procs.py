"""The benchmarks' one process walker, on psutil: who listens on a port, which Ray node that is (several may run
on one machine: a tool watches only the processes under the raylet serving its port), which of its processes are
Serve's, and their memory."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from dataclasses import dataclass

import psutil

REPLICA_TITLE = "ray::ServeReplica:"


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    argv: tuple[str, ...]  # for a Ray worker, argv[0] is its title
    rss_mb: float | None
    started: float = 0.0  # creation time (epoch s): a reused pid is another process


def proc_table() -> dict[int, Proc]:
    """Every live process this user can see, by pid."""
    table = {}
    for p in psutil.process_iter(["pid", "ppid", "cmdline", "memory_info", "create_time"]):
        i, mem = p.info, p.info["memory_info"]
        rss = mem.rss / 2**20 if mem is not None else None
        table[i["pid"]] = Proc(i["pid"], i["ppid"] or 0, tuple(i["cmdline"] or ()), rss, i["create_time"] or 0.0)
    return table


def is_raylet(p: Proc) -> bool:
    return bool(p.argv) and os.path.basename(p.argv[0]) == "raylet"


def raylet_above(pid: int, table: dict[int, Proc]) -> int | None:
    """The raylet that (indirectly) started `pid`: every Ray worker, and HAProxy under its manager, has one."""
    seen = set()
    while pid in table and pid not in seen and pid > 1:
        if is_raylet(table[pid]):
            return pid
        seen.add(pid)
        pid = table[pid].ppid
    return None


def listening_pids(port: int) -> set[int]:
    """Processes listening on TCP `port`. Serve's proxies bind with SO_REUSEPORT, so a second server on the same
    port starts fine and silently takes half the connections: this is how a benchmark notices it is not alone."""
    conns = psutil.net_connections(kind="tcp")
    return {c.pid for c in conns if c.pid and c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port}


@dataclass(frozen=True)
class RayNode:
    raylet_pid: int
    gcs_address: str | None


def node_serving(port: int) -> RayNode | None:
    """The local Ray node whose Serve proxy or HAProxy listens on `port`; None if no Ray does."""
    table = proc_table()
    for pid in sorted(listening_pids(port)):
        if (raylet := raylet_above(pid, table)) is not None:
            gcs = next((a.split("=", 1)[1] for a in table[raylet].argv if a.startswith("--gcs-address=")), None)
            return RayNode(raylet, gcs)
    return None


def process_label(argv: Sequence[str]) -> str | None:
    """A short name for the Serve processes worth watching, from the process title; None for others.
    Replica titles are "ray::ServeReplica:<app>:<deployment>", with ".<method>" while a method runs."""
    title = argv[0] if argv else ""
    if title.startswith(REPLICA_TITLE):
        return title[len(REPLICA_TITLE) :].partition(":")[2].split(".", 1)[0] or None
    for prefix in ("ray::ProxyActor", "ray::ServeController", "ray::HAProxyManager"):
        if title.startswith(prefix):
            return prefix[len("ray::") :]
    return "haproxy" if os.path.basename(title) == "haproxy" else None


def serve_memory(raylet_pid: int, table: dict[int, Proc] | None = None) -> dict[str, float]:
    """RSS (MB) of the Serve processes under one raylet, keyed "<label>[<pid>]" (a restarted replica is new)."""
    table = proc_table() if table is None else table
    out = {}
    for pid, p in table.items():
        label = process_label(p.argv)
        if label is not None and p.rss_mb is not None and raylet_above(pid, table) == raylet_pid:
            out[f"{label}[{pid}]"] = round(p.rss_mb, 2)
    return dict(sorted(out.items()))


def rss_bytes(pid: int) -> int | None:
    """Resident memory of a live process; None if it is gone."""
    with contextlib.suppress(psutil.Error):
        return int(psutil.Process(pid).memory_info().rss)
    return None


def family(root: int) -> dict[int, float]:
    """{pid: creation time} of `root`, its descendants, and every process still in its session."""
    kin = {root}
    with contextlib.suppress(psutil.Error):
        kin |= {c.pid for c in psutil.Process(root).children(recursive=True)}
    out = {}
    for p in psutil.process_iter(["create_time"]):
        with contextlib.suppress(OSError):
            if p.pid in kin or os.getsid(p.pid) == root:
                out[p.pid] = p.info["create_time"]
    return out


def alive(members: dict[int, float]) -> dict[int, float]:
    """The members still running as the same process (a reused pid has another creation time)."""
    out = {}
    for pid, created in members.items():
        with contextlib.suppress(psutil.Error):
            p = psutil.Process(pid)
            if p.create_time() == created and p.status() != psutil.STATUS_ZOMBIE:
                out[pid] = created
    return out
