"""The benchmarks' one process walker, on psutil: who listens on a port, which Ray node that is (several may run
on one machine: a tool watches only the processes under the raylet serving its port), which of its processes are
Serve's, and their memory: now, at its peak, and sampled over a run."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

REPLICA_TITLE = "ray::ServeReplica:"


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    argv: tuple[str, ...]  # for a Ray worker, argv[0] is its title
    rss_mb: float | None
    started: float = 0.0  # creation time (epoch s): a reused pid is another process

    @property
    def replica(self) -> bool:
        return bool(self.argv) and self.argv[0].startswith(REPLICA_TITLE)


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


def serve_processes(raylet_pid: int | None, table: dict[int, Proc] | None = None) -> dict[str, Proc]:
    """The Serve processes (replicas, controller, proxy, HAProxy) under one raylet (None: none), keyed
    "<label>[<pid>]" (a restarted replica is a new key). A replica is a Ray worker, a child of the raylet; a process
    a replica forks keeps its title until it execs, and is left out."""
    if raylet_pid is None:
        return {}
    table = proc_table() if table is None else table
    out = {}
    for pid, p in table.items():
        label = process_label(p.argv)
        if label and raylet_above(pid, table) == raylet_pid and (p.ppid == raylet_pid or not p.replica):
            out[f"{label}[{pid}]"] = p
    return dict(sorted(out.items()))


def rss_mib(pid: int | None = None) -> float:
    """Resident memory of a process, by default this one; psutil.NoSuchProcess when it is gone."""
    return float(psutil.Process(pid).memory_info().rss / 2**20)


def peak_rss_mib(pid: int | str = "self") -> float | None:
    """VmHWM, the peak RSS since start or reset_peak_rss (psutil has no equivalent); None when it is gone."""
    try:
        line = next(x for x in Path(f"/proc/{pid}/status").read_text().splitlines() if x.startswith("VmHWM:"))
        return int(line.split()[1]) / 1024
    except (OSError, StopIteration):
        return None


def reset_peak_rss() -> bool:
    """Make VmHWM start again from the current RSS (Linux >= 4.0); False where the kernel refuses."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


class Monitor:
    """RSS (MB) series of Serve processes, from `clock0` (perf_counter), and the kernel's peak RSS (VmHWM) of each at
    its first and last sample. `fixed`: only those processes (one that goes is missing from then on); else those
    under `raylet_pid`, found again at every sample (a replacement is a new key)."""

    def __init__(self, clock0: float, raylet_pid: int | None = None, fixed: dict[str, Proc] | None = None) -> None:
        self.clock0, self.raylet_pid, self.fixed = clock0, raylet_pid, fixed
        self.series: dict[str, list[tuple[float, float]]] = {k: [] for k in fixed or {}}
        self.hwm: dict[str, tuple[float, float]] = {}  # (first, last)

    def sample(self) -> None:
        t = round(time.perf_counter() - self.clock0, 3)
        procs = serve_processes(self.raylet_pid) if self.fixed is None else self.fixed
        for key, p in procs.items():
            with contextlib.suppress(psutil.Error):  # the process is gone
                rss = rss_mib(p.pid)
                self.series.setdefault(key, []).append((t, round(rss, 2)))
                hwm = peak_rss_mib(p.pid) or rss
                self.hwm[key] = (self.hwm.get(key, (hwm,))[0], hwm)

    @contextlib.asynccontextmanager
    async def sampling(self, every_s: float) -> AsyncIterator[None]:
        """A sample every `every_s` s while the block runs, and one after it; in a thread, off the event loop (a
        walk of the process table takes a while)."""
        stop = asyncio.Event()

        async def loop() -> None:
            while not stop.is_set():
                await asyncio.to_thread(self.sample)
                with contextlib.suppress(asyncio.TimeoutError):  # on a grid: a slow sample delays no later one
                    await asyncio.wait_for(stop.wait(), every_s - (time.perf_counter() - self.clock0) % every_s)
            await asyncio.to_thread(self.sample)

        task = asyncio.create_task(loop())
        try:
            yield
        finally:
            stop.set()
            await task

    def start(self, key: str) -> float | None:
        return self.series[key][0][1] if self.series.get(key) else None

    def peak(self, key: str) -> float | None:
        """The highest sample; the high-water mark instead where it rose above it since the first sample (a spike
        between samples)."""
        peak = max((v for _, v in self.series.get(key, [])), default=None)
        first, last = self.hwm.get(key, (0.0, 0.0))
        return round(last, 2) if last > first and last > (peak or 0.0) else peak


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
