"""A soak test: open-loop Poisson load at a fraction of capacity for minutes, watching memory, errors and latency.

    python -m benchmarks.soak --start --minutes 10 --shadow-fraction 0.05   # app on :8200, Ray metrics on :8280
    python -m benchmarks.soak --url http://127.0.0.1:8200/v1/classify --metrics-port 8280   # an app running here
    python -m benchmarks.soak --serve-only --port 8200 --metrics-port 8280   # just the app, until Ctrl-C

--start runs configs/local.yaml on --port on a private local Ray whose metrics export is at --metrics-port,
scraped by a real Prometheus (Debian's `prometheus`). A closed-loop step measures capacity, then
benchmarks.load's open loop offers --fraction of it for --minutes while every Serve process's RSS is read (psutil).
Writes benchmarks/results/soak-<date>-<host>.json and .png (app.ops.panels queried from Prometheus, and memory per
process); prints memory growth (first vs last minute), errors and p50/p99.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import yaml

from app.front.instance import private_serve_env
from benchmarks import dashboard
from benchmarks.environment import REPO, RESULTS_DIR, host_name, print_environment, stamp
from benchmarks.load import DEFAULT_URL, NonLoopbackURL, Workload, closed_step, open_run, require_loopback
from benchmarks.procs import Monitor, node_serving
from benchmarks.report import fmt, markdown_table, write_json
from benchmarks.server_process import ServerProcess, ServerStartError, port_open

SERVE_FAILURES = ("DEPLOY_FAILED", r"Deploying app '[^']*' failed")


def app_config(source: Path, port: int, shadow_fraction: float | None = None) -> dict[str, Any]:
    """A Serve config file with its HTTP port (and optionally the Router's shadow_fraction) replaced."""
    cfg = yaml.safe_load(source.read_text())
    cfg.setdefault("http_options", {})["port"] = port
    if "grpc_options" in cfg:  # its own gRPC port too, beside an app already serving the config's
        cfg["grpc_options"]["port"] = port + 95
    routers = [d for app in cfg["applications"] for d in app.get("deployments", []) if d["name"] == "Router"]
    for d in routers if shadow_fraction is not None else []:
        d.setdefault("user_config", {})["shadow_fraction"] = shadow_fraction
    return cfg


def serve_child(config_path: str, metrics_port: int) -> None:
    """`serve run <config>` on a private local Ray whose metrics export port is fixed: `serve run` alone cannot fix
    it and `ray start --head` leaves daemons that only `ray stop` (everyone's Ray) ends. Ctrl-C stops both."""
    import ray
    from ray.serve.scripts import run

    # Started in the background by a non-interactive shell, a process inherits SIGINT ignored, and Python then
    # leaves it ignored: `serve run` would never see Ctrl-C and only SIGTERM would stop it, uncleanly.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    # Serve's namespace, "serve", as `serve run` joins it.
    ray.init(address="local", namespace="serve", include_dashboard=False, _metrics_export_port=metrics_port)
    print(f"ray address {ray.get_runtime_context().gcs_address}; metrics on :{metrics_port}", flush=True)
    run.main([config_path], standalone_mode=False)


@contextlib.contextmanager
def started_app(args: argparse.Namespace) -> Iterator[ServerProcess]:
    """The app from a temporary copy of --config, in a child process, until the block ends."""
    for port in (args.port, args.metrics_port):
        if port_open(f"http://127.0.0.1:{port}"):
            raise ServerStartError(f"something already listens on :{port}: pick other ports")
    config_path = Path(tempfile.mkdtemp(prefix="soak-")) / "serve.yaml"
    config_path.write_text(yaml.safe_dump(app_config(args.config, args.port, args.shadow_fraction), sort_keys=False))
    cmd = [sys.executable, "-m", "benchmarks.soak", f"--serve-child={config_path}"]
    cmd.append(f"--metrics-port={args.metrics_port}")
    env = {"RAY_ADDRESS": "local", **private_serve_env(args.port)}  # sharing no HAProxy files or ports with others
    server = ServerProcess("app", cmd, config_path.with_suffix(".log"), REPO, env, SERVE_FAILURES)
    print(f"starting the app: {' '.join(server.cmd)} (log {server.log_path})", file=sys.stderr)
    server.start()
    try:
        ready = server.wait_ready(f"http://127.0.0.1:{args.port}/readyz", 300)
        server.snapshot_family()
        print(f"  ready after {ready:.1f} s", file=sys.stderr)
        yield server
    finally:
        t0 = time.perf_counter()
        out = server.stop(grace_s=90)  # Serve's shutdown drains replicas (graceful_shutdown_timeout_s) first
        print(f"  app stopped: {out['stopped']} after {time.perf_counter() - t0:.1f} s", file=sys.stderr)


def memory_growth(
    series: dict[str, list[tuple[float, float]]], edge_s: float = 60.0, until: float | None = None
) -> dict[str, Any]:
    """Per process: median RSS (MB) of the first and of the last `edge_s` s of the samples up to `until` (a third
    of the run each if it is shorter than 3 x edge_s), their difference (None for a process missing at either end),
    and the least-squares slope."""
    series = {k: kept for k, pts in series.items() if (kept := [p for p in pts if until is None or p[0] <= until])}
    times = [t for pts in series.values() for t, _ in pts]  # the first sample is taken at t = 0
    t_first, t_last = min(times, default=0.0), max(times, default=0.0)
    edge = min(edge_s, (t_last - t_first) / 3)
    out = {}
    for key, pts in sorted(series.items()):
        ts, vs = [t for t, _ in pts], [v for _, v in pts]
        first = [v for t, v in pts if t <= t_first + edge]
        last = [v for t, v in pts if t >= t_last - edge]
        a, b = (statistics.median(first) if first else None), (statistics.median(last) if last else None)
        out[key] = {
            "first_mb": a,
            "last_mb": b,
            "max_mb": max(vs),
            "points": len(pts),
            "growth_mb": round(b - a, 2) if a is not None and b is not None else None,
            "slope_mb_per_min": round(statistics.linear_regression(ts, vs).slope * 60, 4) if len(set(ts)) > 2 else None,
        }
    return {"edge_s": round(edge, 3), "processes": out}


async def soak_load(args: argparse.Namespace, workload: Workload, rate: float, monitor: Monitor) -> dict[str, Any]:
    """benchmarks.load's open loop at `rate` for --minutes, the Serve processes' RSS sampled every --sample-every s
    (and once after the load) meanwhile."""
    duration_s = args.minutes * 60
    async with monitor.sampling(args.sample_every):
        return await open_run(workload, rate, duration_s, warmup_s=0.0, max_requests=int(1.5 * rate * duration_s) + 100)


def admission_front(url: str) -> dict[str, Any] | None:
    """The Router's view of the admission front after the load (/v1/models): in place, on which HAProxy, how many
    requests came without it."""
    with contextlib.suppress(httpx.HTTPError, KeyError, ValueError):
        return dict(httpx.get(url.replace("/v1/classify", "/v1/models"), timeout=10).json()["admission_front"])
    return None


def summary_text(result: dict[str, Any]) -> str:
    step, cfg, lat, mem = result["load"], result["config"], result["load"]["latency_ms"], result["memory"]
    edge = f"{mem['edge_s']:.0f} s"
    rows = [
        [k, m["first_mb"], m["last_mb"], m["growth_mb"], m["slope_mb_per_min"]] for k, m in mem["processes"].items()
    ]
    head = (
        f"soak: {cfg['minutes'] * 60:.0f} s of Poisson arrivals at {cfg['rate']:.1f} req/s ({cfg['fraction']:.0%} of "
        f"{result['capacity_step']['throughput_rps']:.1f} measured); {step['requests']} requests, {step['ok']} ok, "
        f"errors {step['errors'] or 'none'}\nlatency (client side, ok requests): p50 {fmt(lat['p50_ms'])} ms, "
        f"p99 {fmt(lat['p99_ms'])} ms, max {fmt(lat['max_ms'])} ms\nmemory per Serve process (RSS, MB: medians of "
        f"the first and the last {edge} of load; n/a: not there the whole run)\n"
    )
    table = markdown_table(["process", "first", "last", "growth", "slope MB/min"], rows, digits=2)
    return head + table + front_line(result)


def front_line(result: dict[str, Any]) -> str:
    front = result.get("admission_front")
    if not front:
        return "admission front: unknown (/v1/models did not say)\n"
    hosts = [h for h, f in front["haproxies"].items() if f["active"]]
    where = f"in place on {', '.join(hosts)}" if front["in_place"] else "NOT in place"
    return f"admission front: {where}; {front['requests_without_front']} requests reached the Router without it\n"


def run(args: argparse.Namespace, url: str, prom: dashboard.Prometheus | None) -> int:
    env, run_stamp = print_environment(), stamp()
    if (node := node_serving(urlsplit(url).port or 80)) is None:
        print(f"warning: no local Ray node serves {url}: memory is not sampled", file=sys.stderr)
    workload = Workload(url, args.variant)
    capacity = asyncio.run(closed_step(workload, 16, 10.0, 2.0, 100_000))
    if not capacity["throughput_rps"]:
        print("error: the capacity step completed no requests", file=sys.stderr)
        return 1
    rate = args.fraction * capacity["throughput_rps"]
    print(f"soak: {rate:.1f} req/s (Poisson) for {args.minutes * 60:.0f} s", file=sys.stderr, flush=True)
    start, monitor = time.time(), Monitor(time.perf_counter(), node.raylet_pid if node else None)
    step = asyncio.run(soak_load(args, workload, rate, monitor))
    panels = []
    if prom is not None:
        prom.wait_scrapes(1, since=time.time(), timeout_s=max(30, 5 * args.scrape_every))  # one after the load
        panels = dashboard.fetch(prom, start, time.time(), args.scrape_every)
    memory = {"title": "resident memory per Serve process (psutil)", "unit": "decmbytes", "share": False}
    memory["series"] = [{"name": k, "dashed": False, "points": p} for k, p in monitor.series.items()]
    keys = ("minutes", "fraction", "sample_every", "variant", "shadow_fraction")
    result: dict[str, Any] = {
        "stamp": run_stamp,
        "title": f"soak {run_stamp} on {env['host']}: {rate:.1f} req/s for {args.minutes:g} min",
        "environment": env,
        "argv": sys.argv[1:],
        "url": url,
        "ray_node": None if node is None else {"raylet_pid": node.raylet_pid, "gcs_address": node.gcs_address},
        "config": {
            **{k: getattr(args, k) for k in keys},
            "rate": rate,
            "prometheus_scrape_every_s": args.scrape_every if prom else None,
        },
        "capacity_step": capacity,
        "load": step,
        "memory": memory_growth(monitor.series, 60.0, until=args.minutes * 60 + args.sample_every / 2),
        "rss_mb": monitor.series,  # per Serve process: [[s since the load started, MB], ...]
        "panels": panels,  # what Prometheus answered to each panel's PromQL
        "admission_front": admission_front(url),
    }
    out = args.out or RESULTS_DIR / f"soak-{run_stamp}-{host_name()}.json"
    png = dashboard.render([*panels, memory], write_json(out, result).with_suffix(".png"), result["title"])
    print(f"{summary_text(result)}wrote {out} and {png}")
    return 1 if step["ok"] == 0 or step["requests"] - step["ok"] > args.max_error_rate * step["requests"] else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--minutes", type=float, default=10.0, help="how long the load runs (at most 24 h)")
    add("--fraction", type=float, default=0.7, help="share of the capacity measured first to offer (0-1]")
    add("--url", help=f"/v1/classify of a running app (loopback; default {DEFAULT_URL})")
    add("--start", action="store_true", help="start the app here (and stop it at the end)")
    add("--serve-only", action="store_true", help="start the app (as --start) and wait for Ctrl-C")
    add("--config", type=Path, default=REPO / "configs" / "local.yaml", help="with --start")
    add("--port", type=int, default=8200, help="with --start: the app's HTTP port")
    add("--metrics-port", type=int, default=8280, help="Ray's metrics export (on 127.0.0.1)")
    add("--shadow-fraction", type=float, help="with --start: the Router's shadow_fraction")
    add("--no-metrics", action="store_true", help="no Prometheus: memory and the client's figures only")
    add("--scrape-every", type=float, default=2.0, help="Prometheus's scrape interval (s)")
    add("--variant", help="send X-Model-Variant (default: the Router's weights decide)")
    add("--sample-every", type=float, default=5.0, help="seconds between memory samples")
    add("--max-error-rate", type=float, default=0.001, help="exit 1 above this share of errors")
    add("--out", type=Path, help="JSON output (default benchmarks/results/soak-<date>-<host>.json)")
    add("--serve-child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve_child:
        serve_child(args.serve_child, args.metrics_port)
        return 0
    start = args.start or args.serve_only
    if not 0 < args.minutes <= 24 * 60 or not 0 < args.fraction <= 1:
        parser.error("--minutes must be in (0, 1440] and --fraction in (0, 1]")
    if (args.url and start) or (args.shadow_fraction is not None and not start):
        parser.error("--start/--serve-only start an app on --port (with --shadow-fraction); --url names a running one")
    try:
        url = require_loopback(f"http://127.0.0.1:{args.port}/v1/classify" if start else args.url or DEFAULT_URL)
    except NonLoopbackURL as e:
        parser.exit(2, f"error: {e}\n")
    with contextlib.ExitStack() as stack:
        server = stack.enter_context(started_app(args)) if start else None
        if server is not None and args.serve_only:
            print(f"app:     {url}\nmetrics: http://127.0.0.1:{args.metrics_port}/metrics\nCtrl-C stops it", flush=True)
            signal.signal(signal.SIGTERM, signal.default_int_handler)  # SIGTERM stops it as cleanly as Ctrl-C
            signal.signal(signal.SIGINT, signal.default_int_handler)  # even when started in the background
            with contextlib.suppress(KeyboardInterrupt):
                server.proc.wait()  # type: ignore[union-attr]
            return 0
        if not port_open(url):
            print(f"error: nothing listens at {url} (use --start to start the app)", file=sys.stderr)
            return 2
        prom, target = None, f"127.0.0.1:{args.metrics_port}"
        if not args.no_metrics and not port_open(f"http://{target}"):
            print(f"warning: nothing listens on {target}: no Prometheus panels", file=sys.stderr)
        elif not args.no_metrics:
            prom = stack.enter_context(dashboard.Prometheus([target], args.scrape_every))
            print(f"prometheus at {prom.url} scraping {target} every {args.scrape_every:g} s", file=sys.stderr)
        return run(args, url, prom)


if __name__ == "__main__":
    sys.exit(main())
