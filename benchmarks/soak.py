"""A soak test: open-loop Poisson load at a fraction of capacity for minutes, watching memory, errors and latency.

    python -m benchmarks.soak --start --minutes 10 --shadow-fraction 0.05   # app on :8200, Ray metrics on :8280
    python -m benchmarks.soak --url http://127.0.0.1:8200/v1/classify --metrics-url http://127.0.0.1:8280/metrics
    python -m benchmarks.soak --serve-only --port 8200 --metrics-port 8280   # just the app, until Ctrl-C

With --start, the app is started here (configs/local.yaml on --port, HAProxy in front as `make serve` runs it,
on a private local Ray instance whose Prometheus export is fixed at --metrics-port) and stopped at the end with
SIGINT. Without --start, --url must point at an app that is already running on this machine.

The run: a short closed-loop step measures capacity (unless --rate is given), then Poisson arrivals at
--fraction of it for --minutes. Every --sample-every seconds it records each Serve replica's resident memory
(by process title, from /proc), the requests and errors by status and the p50/p99 of the requests due in
that window; with --metrics-url it also scrapes Ray's metrics export (benchmarks.dashboard renders those).
Writes benchmarks/results/soak-<date>-<host>.json and .png (with metrics also -scrapes.json and -dashboard.png:
`python -m benchmarks.dashboard --render <either JSON>` renders the panels again) and
prints memory growth per replica (median of the first minute vs median of the last minute, MB), the error
count and p50/p99. Bounded in time and in requests; loopback targets only.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import copy
import math
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from app.config import private_serve_env
from benchmarks import dashboard
from benchmarks.environment import RESULTS_DIR, host_name, print_environment, stamp
from benchmarks.load import (
    DEFAULT_URL,
    NonLoopbackURL,
    Sample,
    Workload,
    _session,
    closed_step,
    poisson_schedule,
    require_loopback,
    send,
)
from benchmarks.report import pyplot, write_json
from benchmarks.server_process import ServerProcess, ServerStartError, listening_pids, port_open
from benchmarks.stats import latency_summary

REPO = Path(__file__).resolve().parent.parent
PY = sys.executable
SERVE_FAILURES = ("DEPLOY_FAILED", r"Deploying app '[^']*' failed")
DEFAULT_PORT = 8200
DEFAULT_METRICS_PORT = 8280
REPLICA_TITLE = "ray::ServeReplica:"


# --------------------------------------------------------------------------- starting the app


def app_config(source: Path, port: int, shadow_fraction: float | None = None) -> dict[str, Any]:
    """A Serve config file with its HTTP port (and optionally the Router's shadow_fraction) replaced."""
    cfg = copy.deepcopy(yaml.safe_load(source.read_text()))
    cfg.setdefault("http_options", {})["port"] = port
    if shadow_fraction is not None:
        for app in cfg["applications"]:
            for d in app.get("deployments", []):
                if d["name"] == "Router":
                    d.setdefault("user_config", {})["shadow_fraction"] = shadow_fraction
    return cfg


def private_env(port: int) -> dict[str, str]:
    """A private local Ray instance with configs/serve.env, sharing no HAProxy files or ports with others."""
    return {"RAY_ADDRESS": "local", **private_serve_env(port)}


def serve_child(config_path: str, metrics_port: int) -> None:
    """`serve run <config>` on a private local Ray instance whose metrics export port is fixed.

    `serve run` alone cannot fix the port (it calls ray.init(address=...) with nothing else), and `ray start
    --head --metrics-export-port` leaves daemons behind that only `ray stop` (everyone's Ray) would clean up.
    So: ray.init here, then Serve's own `run` command, which reuses an initialised Ray. Ctrl-C (SIGINT) makes
    it shut Serve down and exit; Ray goes with this process.
    """
    import ray
    from ray.serve._private.constants import SERVE_NAMESPACE
    from ray.serve.scripts import run

    # A process started in the background by a non-interactive shell inherits SIGINT ignored, and Python then
    # leaves it ignored: `serve run` would never see Ctrl-C and only SIGTERM would stop it, uncleanly.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    ray.init(
        address="local",
        namespace=SERVE_NAMESPACE,
        include_dashboard=False,
        _metrics_export_port=metrics_port,
    )
    print(f"ray address {ray.get_runtime_context().gcs_address}; metrics on :{metrics_port}", flush=True)
    run.main([config_path], standalone_mode=False)


class App:
    """The app as a child process (benchmarks.server_process) from a temporary copy of the config."""

    def __init__(
        self,
        config: Path,
        port: int,
        metrics_port: int,
        shadow_fraction: float | None = None,
        ready_timeout_s: float = 300,
    ) -> None:
        self.port, self.metrics_port, self.ready_timeout_s = port, metrics_port, ready_timeout_s
        self.stop_grace_s = 90.0  # Serve's shutdown drains replicas (graceful_shutdown_timeout_s) first
        self.scratch = Path(tempfile.mkdtemp(prefix="soak-"))
        self.config_path = self.scratch / "serve.yaml"
        self.config_path.write_text(yaml.safe_dump(app_config(config, port, shadow_fraction), sort_keys=False))
        self.url = f"http://127.0.0.1:{port}/v1/classify"
        self.metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
        cmd = [PY, "-m", "benchmarks.soak", "--serve-child", str(self.config_path), "--metrics-port", str(metrics_port)]
        self.server = ServerProcess(
            "app",
            cmd,
            self.scratch / "serve.log",
            cwd=REPO,
            env=private_env(port),
            fail_patterns=SERVE_FAILURES,
        )

    def start(self) -> float:
        for url in (self.url, self.metrics_url):
            if port_open(url):
                raise ServerStartError(f"something already listens at {url}: pick other ports")
        print(f"starting the app: {' '.join(self.server.cmd)} (log {self.server.log_path})", file=sys.stderr)
        self.server.start()
        ready = self.server.wait_ready(f"http://127.0.0.1:{self.port}/readyz", self.ready_timeout_s)
        self.server.snapshot_family()
        print(f"  ready after {ready:.1f} s", file=sys.stderr)
        return ready

    def stop(self) -> dict[str, Any]:
        t0 = time.perf_counter()
        out = self.server.stop(grace_s=self.stop_grace_s)
        out["stop_s"] = round(time.perf_counter() - t0, 1)
        print(f"  app stopped: {out['stopped']} after {out['stop_s']} s", file=sys.stderr)
        return out

    def __enter__(self) -> App:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


# --------------------------------------------------------------------------- processes and their memory


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    argv: tuple[str, ...]
    rss_mb: float | None


def read_proc(pid: int) -> Proc | None:
    """A live process's parent, command line (its title, for Ray workers) and resident memory; None if gone."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    ppid, rss = 0, None
    for line in status.splitlines():
        if line.startswith("PPid:"):
            ppid = int(line.split()[1])
        elif line.startswith("VmRSS:"):
            rss = int(line.split()[1]) / 1024
    argv = tuple(a.decode(errors="replace") for a in raw.split(b"\0") if a)
    return Proc(pid, ppid, argv, rss)


def proc_table() -> dict[int, Proc]:
    table = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (p := read_proc(int(entry))) is not None:
            table[p.pid] = p
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


@dataclass(frozen=True)
class RayNode:
    """The Ray node serving a port on this machine: its raylet, and the cluster's GCS address."""

    raylet_pid: int
    gcs_address: str | None


def node_serving(port: int, table: dict[int, Proc] | None = None) -> RayNode | None:
    """Which local Ray node listens on `port` (Serve's proxy or HAProxy), found from /proc; None if no Ray does.

    Several Ray instances may run on one machine; this is how the tools attach to the right one.
    """
    table = table if table is not None else proc_table()
    for pid in sorted(listening_pids(port)):
        raylet = raylet_above(pid, table)
        if raylet is not None:
            gcs = next((a.split("=", 1)[1] for a in table[raylet].argv if a.startswith("--gcs-address=")), None)
            return RayNode(raylet, gcs)
    return None


def process_label(argv: Sequence[str]) -> str | None:
    """A short name for the Serve processes worth watching, from the process title; None for others.

    Replica titles are "ray::ServeReplica:<app>:<deployment>", with ".<method>" while a method runs.
    """
    title = argv[0] if argv else ""
    if title.startswith(REPLICA_TITLE):
        _, _, deployment = title[len(REPLICA_TITLE) :].partition(":")
        return deployment.split(".", 1)[0] or None
    for prefix in ("ray::ProxyActor", "ray::ServeController", "ray::HAProxyManager"):
        if title.startswith(prefix):
            return prefix[len("ray::") :]
    if os.path.basename(title) == "haproxy":
        return "haproxy"
    return None


def serve_memory(raylet_pid: int, table: dict[int, Proc] | None = None) -> dict[str, float]:
    """RSS (MB) of the Serve processes under one raylet, keyed "<label>[<pid>]" (a restarted replica is new)."""
    table = table if table is not None else proc_table()
    out = {}
    for pid, p in table.items():
        label = process_label(p.argv)
        if label is not None and p.rss_mb is not None and raylet_above(pid, table) == raylet_pid:
            out[f"{label}[{pid}]"] = round(p.rss_mb, 2)
    return dict(sorted(out.items()))


# --------------------------------------------------------------------------- the figures


def window_stats(samples: Sequence[Sample], every_s: float, duration_s: float) -> list[dict[str, Any]]:
    """Per window of `every_s` seconds (by when each request was due): counts, errors by status, p50/p99 (ms),
    and the requests completed in it per second."""
    n = max(1, math.ceil(duration_s / every_s))
    due: list[list[Sample]] = [[] for _ in range(n)]
    completed = [0] * n
    for s in samples:
        i = int(s.due // every_s)
        if 0 <= i < n:
            due[i].append(s)
        j = int(s.end // every_s)
        if s.ok and 0 <= j < n:
            completed[j] += 1
    out = []
    for i, group in enumerate(due):
        ok = [s.latency_s for s in group if s.ok]
        lat = latency_summary(ok)
        out.append(
            {
                "t": round((i + 1) * every_s, 3),
                "requests": len(group),
                "ok": len(ok),
                "errors": dict(sorted(Counter(str(s.status) for s in group if not s.ok).items())),
                "p50_ms": lat["p50_ms"],
                "p99_ms": lat["p99_ms"],
                "completed_rps": completed[i] / every_s,
            }
        )
    return out


def memory_growth(
    snapshots: Sequence[dict[str, Any]], edge_s: float = 60.0, until: float | None = None
) -> dict[str, Any]:
    """Per process: median RSS of the first `edge_s` seconds vs the last `edge_s` seconds (MB), and a slope.

    `snapshots` are {"t": seconds, "rss_mb": {key: MB}}; only those up to `until` count (the load phase).
    Runs shorter than 3 x edge_s use a third of the run at each end, so the two windows never overlap.
    A process missing from either end (started or exited during the run) gets growth None.
    """
    snaps = [s for s in snapshots if until is None or s["t"] <= until]
    if not snaps:
        return {"edge_s": 0.0, "processes": {}}
    t_first, t_last = min(s["t"] for s in snaps), max(s["t"] for s in snaps)
    span = t_last - t_first
    edge = min(edge_s, span / 3) if span > 0 else 0.0
    series: dict[str, list[tuple[float, float]]] = {}
    for s in snaps:
        for key, mb in s["rss_mb"].items():
            series.setdefault(key, []).append((s["t"], mb))
    out = {}
    for key, pts in sorted(series.items()):
        first = [v for t, v in pts if t <= t_first + edge]
        last = [v for t, v in pts if t >= t_last - edge]
        entry: dict[str, Any] = {
            "first_mb": statistics.median(first) if first else None,
            "last_mb": statistics.median(last) if last else None,
            "max_mb": max(v for _, v in pts),
            "points": len(pts),
        }
        entry["growth_mb"] = round(entry["last_mb"] - entry["first_mb"], 2) if first and last and span > 0 else None
        entry["slope_mb_per_min"] = _slope_per_min(pts) if len(pts) >= 3 else None
        out[key] = entry
    return {"edge_s": round(edge, 3), "processes": out}


def _slope_per_min(pts: Sequence[tuple[float, float]]) -> float | None:
    """Least-squares slope of MB over time, per minute."""
    ts = [t for t, _ in pts]
    if max(ts) - min(ts) <= 0:
        return None
    mt, mv = statistics.fmean(ts), statistics.fmean(v for _, v in pts)
    num = sum((t - mt) * (v - mv) for t, v in pts)
    den = sum((t - mt) ** 2 for t in ts)
    return round(num / den * 60, 4) if den else None


def overall(samples: Sequence[Sample], duration_s: float) -> dict[str, Any]:
    ok = [s for s in samples if s.ok]
    lat = latency_summary([s.latency_s for s in ok])
    return {
        "requests": len(samples),
        "ok": len(ok),
        "errors": dict(sorted(Counter(str(s.status) for s in samples if not s.ok).items())),
        "error_count": len(samples) - len(ok),
        "offered_rps": len(samples) / duration_s if duration_s > 0 else None,
        "throughput_rps": len(ok) / duration_s if duration_s > 0 else None,
        "latency_ms": lat,
    }


# --------------------------------------------------------------------------- the run


class Recorder:
    """What the soak samples every few seconds: Serve processes' RSS and (optionally) a metrics scrape."""

    def __init__(self, raylet_pid: int | None, metrics_url: str | None) -> None:
        self.raylet_pid, self.metrics_url = raylet_pid, metrics_url
        self.snapshots: list[dict[str, Any]] = []
        self.scrapes: list[dict[str, Any]] = []
        self.keep = dashboard.metric_names()

    def sample(self, t: float, inflight: int) -> dict[str, Any]:
        rss = serve_memory(self.raylet_pid) if self.raylet_pid is not None else {}
        snap = {"t": round(t, 3), "inflight": inflight, "rss_mb": rss}
        self.snapshots.append(snap)
        if self.metrics_url:
            self.scrapes.append({**dashboard.scrape(self.metrics_url, self.keep), "elapsed": round(t, 3)})
        return snap


async def soak_load(
    workload: Workload,
    rate: float,
    duration_s: float,
    recorder: Recorder,
    every_s: float = 5.0,
    tail_s: float = 15.0,
    max_requests: int = 1_000_000,
    max_inflight: int = 512,
    seed: int = 0,
    progress_every_s: float = 30.0,
) -> tuple[list[Sample], float]:
    """Poisson arrivals at `rate` for `duration_s` (benchmarks.load's schedule, sender and Sample), sampling the
    recorder every `every_s` s and for `tail_s` s after the last arrival (a progress line every
    `progress_every_s` s; 0: none). Ctrl-C ends the arrivals early.
    Returns the samples and the seconds of load actually offered."""
    payloads = workload.payloads()
    schedule = poisson_schedule(rate, duration_s, max_requests, seed)
    samples: list[Sample] = []
    tasks: set[asyncio.Task[None]] = set()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    with contextlib.suppress(NotImplementedError, RuntimeError):
        loop.add_signal_handler(signal.SIGINT, stop.set)
    clock0 = time.perf_counter()
    load_end = duration_s

    async def ticker() -> None:
        k, last_print = 0, 0.0
        while True:
            k += 1
            await asyncio.sleep(max(0.0, clock0 + k * every_s - time.perf_counter()))
            t = time.perf_counter() - clock0
            snap = await asyncio.to_thread(recorder.sample, t, len(tasks))
            if progress_every_s > 0 and t - last_print >= progress_every_s - 1e-6:
                last_print = t
                _progress_line(t, samples, snap, progress_every_s)
            if t >= load_end + tail_s:
                return

    async def one(session: Any, payload: Any, due: float) -> None:
        samples.append(await send(session, workload, payload, due, clock0))

    await asyncio.to_thread(recorder.sample, 0.0, 0)
    ticking = asyncio.create_task(ticker())
    async with _session(workload, max_inflight) as session:
        for i, offset in enumerate(schedule):
            delay = clock0 + offset - time.perf_counter()
            if delay > 0:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stop.wait(), delay)  # the arrival schedule, or Ctrl-C
            if stop.is_set():
                load_end = time.perf_counter() - clock0
                print(f"\nstopped by Ctrl-C after {load_end:.0f} s", file=sys.stderr)
                break
            payload = payloads[i % len(payloads)]
            if len(tasks) >= max_inflight:  # the client's own bound; counted, never silent
                samples.append(Sample(offset, 0.0, "client_overflow", payload.images))
                continue
            task = asyncio.create_task(one(session, payload, clock0 + offset))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.gather(*tasks)
    load_end = min(load_end, duration_s)
    await ticking
    with contextlib.suppress(NotImplementedError, RuntimeError):
        loop.remove_signal_handler(signal.SIGINT)
    return sorted(samples, key=lambda s: s.due), load_end


def _progress_line(t: float, samples: Sequence[Sample], snap: dict[str, Any], span_s: float) -> None:
    recent = [s for s in samples if s.due >= t - span_s]
    ok = [s.latency_s for s in recent if s.ok]
    lat = latency_summary(ok)

    def f(x: float | None) -> str:
        return "n/a" if x is None else f"{x:.1f}"

    errors = sum(1 for s in samples if not s.ok)
    print(
        f"  {t:6.0f} s  {len(samples)} requests, {errors} errors; last {span_s:.0f} s: {len(recent)} req, "
        f"p50 {f(lat['p50_ms'])} p99 {f(lat['p99_ms'])} ms; in flight {snap['inflight']}; "
        f"serve RSS {sum(snap['rss_mb'].values()):.0f} MB in {len(snap['rss_mb'])} processes",
        file=sys.stderr,
        flush=True,
    )


def measure_capacity(
    workload: Workload, concurrency: int, seconds: float, warmup_s: float, progress: bool = True
) -> dict[str, Any]:
    """One closed-loop step (benchmarks.load.closed_step): completed requests/s at `concurrency`."""
    step = asyncio.run(closed_step(workload, concurrency, seconds, warmup_s, 100_000, progress))
    lat = step["latency_ms"]
    print(
        f"capacity: {step['throughput_rps'] or 0:.1f} req/s at concurrency {concurrency} "
        f"(p50 {lat['p50_ms'] or 0:.1f} ms, p99 {lat['p99_ms'] or 0:.1f} ms, errors {step['errors'] or 0})",
        file=sys.stderr,
    )
    return step


# --------------------------------------------------------------------------- output


def plot(result: dict[str, Any], out: Path) -> Path:
    """Memory per process over time; latency p50/p99 per window; errors per window with offered/completed rates."""
    plt = pyplot()
    fig, (ax_mem, ax_lat, ax_err) = plt.subplots(3, 1, figsize=(11, 10), sharex=True)
    series: dict[str, list[tuple[float, float]]] = {}
    for snap in result["snapshots"]:
        for key, mb in snap["rss_mb"].items():
            series.setdefault(key, []).append((snap["t"], mb))
    for key, pts in series.items():
        ax_mem.plot([t for t, _ in pts], [v for _, v in pts], label=key, linewidth=1.2)
    ax_mem.set_ylabel("RSS (MB)")
    ax_mem.set_title("resident memory per Serve process", fontsize=9)
    if series:
        ax_mem.legend(fontsize=7, ncol=2)
    windows = result["windows"]
    ts = [w["t"] for w in windows]
    for key, style in (("p50_ms", "-"), ("p99_ms", "--")):
        pts = [(w["t"], w[key]) for w in windows if w[key] is not None]
        ax_lat.plot([t for t, _ in pts], [v for _, v in pts], style, marker=".", label=key.replace("_ms", ""))
    ax_lat.set_ylabel("latency (ms)")
    ax_lat.set_yscale("log")
    ax_lat.set_title(f"client-side latency per {result['config']['sample_every_s']:g} s window", fontsize=9)
    ax_lat.legend(fontsize=8)
    width = result["config"]["sample_every_s"] * 0.8
    errors = [sum(w["errors"].values()) for w in windows]
    ax_err.bar([t - result["config"]["sample_every_s"] / 2 for t in ts], errors, width=width, color="tab:red")
    ax_err.set_ylabel("errors per window", color="tab:red")
    ax_err.set_ylim(0, max([1, *errors]) * 1.1)
    twin = ax_err.twinx()
    every = result["config"]["sample_every_s"]
    twin.plot(ts, [w["requests"] / every for w in windows], ":", color="grey", label="offered req/s")
    twin.plot(ts, [w["completed_rps"] for w in windows], "-", color="tab:green", label="completed req/s")
    twin.set_ylabel("req/s")
    twin.legend(fontsize=8, loc="upper right")
    ax_err.set_xlabel("seconds since the soak started")
    ax_err.set_title("errors (bars) and request rates", fontsize=9)
    for ax in (ax_mem, ax_lat, ax_err):
        ax.grid(True, alpha=0.3)
    cfg = result["config"]
    fig.suptitle(
        f"soak {result['stamp']}: {cfg['rate']:.1f} req/s for {result['load_s']:.0f} s "
        f"({result['environment']['cpu_model']}, {result['environment']['usable_cpus']} cores)",
        fontsize=10,
    )
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def summary_text(result: dict[str, Any]) -> str:
    tot = result["overall"]
    lat = tot["latency_ms"]

    def f(x: float | None, spec: str = ".1f") -> str:
        return "n/a" if x is None else format(x, spec)

    cfg = result["config"]
    cap = result.get("capacity_rps")
    how = f"{cfg['fraction']:.0%} of {cap:.1f} measured" if cap and cfg.get("rate_from") == "capacity" else "given"
    lines = [
        f"soak: {result['load_s']:.0f} s of Poisson arrivals at {cfg['rate']:.1f} req/s ({how}); "
        f"{tot['requests']} requests, {tot['ok']} ok, {tot['error_count']} errors {tot['errors'] or ''}",
        f"latency (client side, ok requests): p50 {f(lat['p50_ms'])} ms, p99 {f(lat['p99_ms'])} ms, "
        f"max {f(lat['max_ms'])} ms",
    ]
    mem = result["memory"]
    if mem["processes"]:
        lines.append(
            f"memory per process (RSS, MB): median of the first {mem['edge_s']:.0f} s -> median of the last "
            f"{mem['edge_s']:.0f} s of load (growth; least-squares slope)"
        )
        for key, m in mem["processes"].items():
            growth = "n/a (not there the whole run)" if m["growth_mb"] is None else f"{m['growth_mb']:+.1f} MB"
            slope = f"{m['slope_mb_per_min']:+.2f} MB/min" if m["slope_mb_per_min"] is not None else "n/a"
            lines.append(f"  {key:32s} {f(m['first_mb']):>8} -> {f(m['last_mb']):>8}  {growth}; {slope}")
    else:
        lines.append("memory: no Serve processes found for this URL (not a Ray Serve app on this machine?)")
    return "\n".join(lines)


# --------------------------------------------------------------------------- command line


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=10.0, help="how long the load runs (at most 24 h)")
    how = parser.add_mutually_exclusive_group()
    how.add_argument("--rate", type=float, help="arrivals per second (skips the capacity step)")
    how.add_argument("--fraction", type=float, default=0.7, help="share of measured capacity to offer (0-1]")
    parser.add_argument("--url", help=f"/v1/classify of a running app (loopback; default {DEFAULT_URL})")
    parser.add_argument("--start", action="store_true", help="start the app here (and stop it at the end)")
    parser.add_argument("--config", type=Path, default=REPO / "configs" / "local.yaml", help="with --start")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help="with --start: the app's HTTP port")
    parser.add_argument("--metrics-port", type=int, default=DEFAULT_METRICS_PORT, help="with --start: Ray's")
    parser.add_argument("--shadow-fraction", type=float, help="with --start: the Router's shadow_fraction")
    parser.add_argument("--metrics-url", help="scrape this Prometheus endpoint too (default with --start: Ray's)")
    parser.add_argument("--no-metrics", action="store_true", help="do not scrape metrics")
    parser.add_argument("--variant", help="send X-Model-Variant (default: the Router's weights decide)")
    parser.add_argument("--sample-every", type=float, default=5.0, help="seconds between samples")
    parser.add_argument("--capacity-concurrency", type=int, default=16, help="closed-loop step for capacity")
    parser.add_argument("--capacity-seconds", type=float, default=10.0, help="measured seconds of that step")
    parser.add_argument("--max-requests", type=int, help="cap on arrivals (default 1.5 x rate x duration + 100)")
    parser.add_argument("--max-inflight", type=int, default=512, help="client-side bound on requests in flight")
    parser.add_argument("--tail", type=float, default=15.0, help="seconds to keep sampling after the load")
    parser.add_argument("--max-error-rate", type=float, default=0.001, help="exit 1 above this share of errors")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="JSON output (default benchmarks/results/soak-<date>-<host>.json)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar or lines")
    parser.add_argument("--serve-only", action="store_true", help="start the app (as --start) and wait for Ctrl-C")
    parser.add_argument("--serve-child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.serve_child:
        serve_child(args.serve_child, args.metrics_port)
        return 0
    if not 0 < args.minutes <= 24 * 60:
        parser.error("--minutes must be in (0, 1440]")
    if args.rate is None and not 0 < args.fraction <= 1:
        parser.error("--fraction must be in (0, 1]")
    if (args.start or args.serve_only) and args.url:
        parser.error("--url names an app that is already running; --start starts one on --port")
    if args.shadow_fraction is not None and not (args.start or args.serve_only):
        parser.error("--shadow-fraction needs --start (it edits the config the app starts from)")
    try:
        for u in (args.url, args.metrics_url):
            if u:
                require_loopback(u)
    except NonLoopbackURL as e:
        parser.exit(2, f"error: {e}\n")

    if args.serve_only:
        return serve_only(args)
    env = print_environment()
    if not args.start:
        return run(args, env, args.url or DEFAULT_URL, None if args.no_metrics else args.metrics_url)
    with App(args.config, args.port, args.metrics_port, shadow_fraction=args.shadow_fraction) as app:
        return run(args, env, app.url, None if args.no_metrics else args.metrics_url or app.metrics_url, app)


def serve_only(args: argparse.Namespace) -> int:
    with App(args.config, args.port, args.metrics_port, shadow_fraction=args.shadow_fraction) as app:
        node = node_serving(args.port)
        print(f"app:     {app.url}\nmetrics: {app.metrics_url}")
        if node is not None:
            print(f"ray:     {node.gcs_address} (raylet pid {node.raylet_pid})")
        print("Ctrl-C stops it", flush=True)
        stop = threading.Event()
        signal.signal(signal.SIGINT, lambda *_: stop.set())
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        while not stop.is_set() and app.server.proc is not None and app.server.proc.poll() is None:
            stop.wait(1.0)
    return 0


def run(
    args: argparse.Namespace, env: dict[str, Any], url: str, metrics_url: str | None, app: App | None = None
) -> int:
    run_stamp = stamp()
    port = urlsplit(url).port or 80
    if not port_open(url):
        print(f"error: nothing listens at {url} (use --start to start the app)", file=sys.stderr)
        return 2
    node = node_serving(port)
    if node is None:
        print(f"warning: no local Ray node serves port {port}: memory is not sampled", file=sys.stderr)
    workload = Workload(url, args.variant)
    capacity = None
    if args.rate is not None:
        rate = args.rate
    else:
        capacity = measure_capacity(
            workload, args.capacity_concurrency, args.capacity_seconds, 2.0, not args.no_progress
        )
        if not capacity["throughput_rps"]:
            print("error: the capacity step completed no requests", file=sys.stderr)
            return 1
        rate = args.fraction * capacity["throughput_rps"]
    duration_s = args.minutes * 60
    max_requests = args.max_requests or int(1.5 * rate * duration_s) + 100
    print(
        f"soak: {rate:.1f} req/s (Poisson) for {duration_s:.0f} s, at most {max_requests} requests; sampling every "
        f"{args.sample_every:g} s{'; scraping ' + metrics_url if metrics_url else ''}",
        file=sys.stderr,
        flush=True,
    )
    recorder = Recorder(node.raylet_pid if node else None, metrics_url)
    samples, load_s = asyncio.run(
        soak_load(
            workload,
            rate,
            duration_s,
            recorder,
            args.sample_every,
            args.tail,
            max_requests,
            args.max_inflight,
            args.seed,
            0.0 if args.no_progress else 30.0,
        )
    )
    result: dict[str, Any] = {
        "stamp": run_stamp,
        "title": f"soak {run_stamp} on {env['host']}",
        "environment": env,
        "argv": sys.argv[1:],
        "url": url,
        "ray_node": None if node is None else {"raylet_pid": node.raylet_pid, "gcs_address": node.gcs_address},
        "started_app": app is not None,
        "config": {
            "rate": rate,
            "rate_from": "given" if args.rate is not None else "capacity",
            "fraction": args.fraction if args.rate is None else None,
            "minutes": args.minutes,
            "sample_every_s": args.sample_every,
            "max_requests": max_requests,
            "max_inflight": args.max_inflight,
            "variant": args.variant,
            "seed": args.seed,
            "shadow_fraction": args.shadow_fraction,
            "metrics_url": metrics_url,
        },
        "capacity_step": capacity,
        "capacity_rps": capacity["throughput_rps"] if capacity else None,
        "load_s": load_s,
        "overall": overall([s for s in samples if s.due <= load_s], load_s),
        "windows": window_stats(samples, args.sample_every, load_s),
        "memory": memory_growth(recorder.snapshots, 60.0, until=load_s + args.sample_every / 2),
        "snapshots": recorder.snapshots,
    }
    out = args.out or RESULTS_DIR / f"soak-{run_stamp}-{host_name()}.json"
    files = [str(out)]
    if recorder.scrapes:
        scrapes_path = dashboard.write_scrapes(
            out.with_name(out.stem + "-scrapes.json"), recorder.scrapes, result["title"]
        )
        result["scrapes_file"] = scrapes_path.name
        files.append(str(scrapes_path))
    write_json(out, result)
    files.append(str(plot(result, out.with_suffix(".png"))))
    if recorder.scrapes:
        panels = dashboard.render(recorder.scrapes, out.with_name(out.stem + "-dashboard.png"), result["title"])
        files.append(str(panels))
    print(summary_text(result))
    print(f"wrote {', '.join(files)}")
    tot = result["overall"]
    if tot["ok"] == 0:
        return 1
    return 1 if tot["error_count"] > args.max_error_rate * tot["requests"] else 0


if __name__ == "__main__":
    sys.exit(main())
