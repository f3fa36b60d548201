"""Overload: a retry storm (`make overload`, `python -m benchmarks.overload`) against this app and the Triton peer.

Clients that ignore Retry-After and resend at once: wrk, closed loop, single images (FP32), at 32, 128, 512 and
1024 connections. Each step reports goodput (200s per second), refusals per second by status, wrk's latency over
every answer, and, from a probe beside wrk (a well-behaved client sending a few requests a second, on a schedule),
the latency of accepted and of refused answers apart, and whether every refusal was a JSON 503 with Retry-After
(wrk's Lua gets no per-response time). The server's CPU per step is split per process (HAProxy, Router, ...) and,
beside the goodput, gives the CPU each refusal cost: (server CPU - goodput x CPU per success at 32 connections) /
refusals. After the last step: how long until a request succeeds again. Then open-loop Poisson arrivals at 2x, 4x
and 10x the capacity measured at 32 connections (the Python client of benchmarks/load.py).

Targets:
- "app": configs/local.yaml + serve.env with the admission front (app/front/), its limits from local.yaml's
  args.front. HAProxy lets maxconn_per_replica requests into the Router at once and holds the rest in its queue;
  what waited queue_timeout_s gets a JSON 503 from HAProxy (the wait paces clients that resend at once). wrk sends
  no X-User-Id, so the per-client bound does not apply (benchmarks/fairness.py measures it).
- "app_fastrefuse": the front with max_queued 128 (APP_FRONT_MAX_QUEUED=128 over the config's): beyond 128
  waiting, HAProxy refuses at once.
- "app_router": no front, the Router is the first line: beyond max_in_flight a bounded wait queue, then JSON 503s,
  paced beyond max_refusals_per_s.
- "app_paceonly" (no front, no wait queue: max_queue_wait_s 0) and "app_noqueue" (no front, neither: a 503 at once
  beyond max_in_flight, the behaviour before both).
- "app_split": as "app", but decoding in a Preprocessor deployment, not in the Router (prod.yaml's shape).
- "triton": PyTriton; its dynamic batcher queues without bound.

Writes
benchmarks/results/<date>-<host>-overload.json, .md and a PNG.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import psutil

from benchmarks import cost, run
from benchmarks.environment import RESULTS_DIR, host_name, print_environment, stamp
from benchmarks.load import Workload, open_run, wrk_step
from benchmarks.procs import process_label, rss_mib
from benchmarks.report import markdown_table, pyplot, save_figure, write_report
from benchmarks.server_process import ServerProcess
from benchmarks.stats import latency_summary

CONNECTIONS = (32, 128, 512, 1024)
OPEN_LOAD = (2, 4, 10)  # x the goodput at the first closed step
PROBE_RATE = 8.0  # requests/s from the well-behaved probe
TARGETS = {
    "app": run.Target("app", "this app (admission front, configs/serve.env)", "local", 8000, ("sweep",)),
    "app_fastrefuse": run.Target(
        "app_fastrefuse",
        "this app, front refusing at once beyond 128 waiting",
        "local",
        8000,
        ("sweep",),
        env=(("APP_FRONT_MAX_QUEUED", "128"),),
    ),
    "app_router": run.Target(
        "app_router", "this app, no front (the Router refuses)", "local", 8000, ("sweep",), front=False
    ),
    "app_paceonly": run.Target(
        "app_paceonly", "this app, no front, paced refusals, no queue", "paceonly", 8000, ("sweep",), front=False
    ),
    "app_noqueue": run.Target(
        "app_noqueue", "this app, no front, refusing at once", "noqueue", 8000, ("sweep",), front=False
    ),
    "app_split": run.Target("app_split", "this app, decode in a Preprocessor", "localsplit", 8000, ("sweep",)),
    "triton": dataclasses.replace(next(t for t in run.TARGETS if t.key == "triton"), workloads=("v2",)),
}


class ProcessCPU:
    """CPU seconds per labelled process of a server (HAProxy, each replica, Ray's daemons as "other")."""

    def __init__(self, server: ServerProcess) -> None:
        self.server = server
        self.marks: list[dict[str, float]] = []

    def read(self) -> dict[str, float]:
        out: Counter[str] = Counter()
        for pid in self.server.family:
            with contextlib.suppress(psutil.Error):
                p = psutil.Process(pid)
                out[process_label(p.cmdline()) or "other"] += cost.process_cpu_s(p)
        return dict(out)

    def __call__(self) -> float:
        """wrk_step's `cpu`: the total, remembering the split for `split()`."""
        self.marks.append(self.read())
        return sum(self.marks[-1].values())

    def split(self) -> dict[str, float]:
        """CPU seconds per process between the last two reads."""
        a, b = self.marks[-2], self.marks[-1]
        return {k: round(b.get(k, 0.0) - a.get(k, 0.0), 3) for k in sorted(b)}

    def rss_mib(self) -> float:
        return round(sum(rss_mib(pid) for pid in self.server.family if psutil.pid_exists(pid)), 1)


async def probe(wl: Workload, start_in_s: float, duration_s: float, rate: float) -> list[dict[str, Any]]:
    """Requests every 1/rate s for duration_s, from start_in_s on: status, latency, and what a refusal carried."""
    body, headers = wl.payloads()[0]
    samples: list[dict[str, Any]] = []

    async def one(session: aiohttp.ClientSession) -> None:
        t0, sample = time.perf_counter(), dict[str, Any]()
        try:
            async with session.post(wl.target, data=body, headers={**headers, **wl.headers()}) as r:
                await r.read()
                sample = {"status": r.status, "json": r.content_type == "application/json"}
                sample["retry_after"] = "Retry-After" in r.headers
        except (aiohttp.ClientError, asyncio.TimeoutError) as e:
            sample = {"status": type(e).__name__}
        samples.append({**sample, "latency_s": time.perf_counter() - t0})

    await asyncio.sleep(start_in_s)  # the schedule: the probe covers wrk's measured run, not its warm-up
    timeout = aiohttp.ClientTimeout(total=wl.timeout_s)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as session:
        tasks, t0 = [], time.perf_counter()
        for i in range(int(duration_s * rate)):
            await asyncio.sleep(max(0.0, t0 + i / rate - time.perf_counter()))
            tasks.append(asyncio.create_task(one(session)))
        await asyncio.gather(*tasks)
    return samples


def probe_summary(samples: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [s["latency_s"] for s in samples if s["status"] == 200]
    refused = [s for s in samples if s["status"] == 503]
    return {
        "sent": len(samples),
        "statuses": dict(Counter(str(s["status"]) for s in samples)),
        "accepted_ms": latency_summary(ok),
        "refused_ms": latency_summary([s["latency_s"] for s in refused]),
        "refusals_not_json_503_with_retry_after": sum(1 for s in refused if not (s["json"] and s["retry_after"])),
    }


def storm_step(wl: Workload, connections: int, plan: dict[str, Any], cpu: ProcessCPU) -> dict[str, Any]:
    """One closed-loop wrk step with the probe beside it."""
    found: list[dict[str, Any]] = []
    start_in, length = plan["warmup_s"] + 1.0, max(1.0, plan["duration_s"] - 2.0)
    prober = threading.Thread(target=lambda: found.extend(asyncio.run(probe(wl, start_in, length, PROBE_RATE))))
    prober.start()
    step = wrk_step(wl, connections, plan["duration_s"], plan["warmup_s"], cpu)
    prober.join()
    refused = step["errors"].get("503", 0) / step["window_s"]
    step |= {"workload": "storm", "goodput_rps": step["throughput_rps"], "refused_per_s": round(refused, 1)}
    step |= {"cpu_by_process_s": cpu.split(), "rss_mib": cpu.rss_mib(), "probe": probe_summary(found)}
    return step


INGRESS = ("haproxy", "HAProxyManager", "ProxyActor", "Router")  # the processes a refusal passes through


def ingress_cpu_s(step: dict[str, Any]) -> float | None:
    """CPU seconds of the ingress processes in a step (all the server's where they are not told apart)."""
    split = step.get("cpu_by_process_s") or {}
    if any(k in split for k in INGRESS):
        return sum(split.get(k, 0.0) for k in INGRESS)
    return step.get("server_cpu_s")


def cost_per_refusal(steps: list[dict[str, Any]]) -> None:
    """CPU ms per refusal at the ingress: each step's ingress CPU less its successes at the first step's ingress
    CPU per success, over its refusals. The Classifiers are left out: their CPU per image moves with batch size."""
    base = steps[0]
    base_cpu = ingress_cpu_s(base)
    per_ok = base_cpu / max(1, base["ok"]) if base_cpu else None
    for st in steps:
        refusals = st["refused_per_s"] * st["window_s"]
        cpu = ingress_cpu_s(st)
        if per_ok is None or refusals < 1 or cpu is None:
            continue
        st["cpu_ms_per_refusal"] = round((cpu - st["ok"] * per_ok) * 1000 / refusals, 3)


def recovery_s(wl: Workload, timeout_s: float = 60.0) -> float | None:
    """Seconds from now until one request gets a 200 (None: not within timeout_s). Not ServerProcess.wait_ready:
    its 5 s client timeout would round a backlog's drain up to the next 5 s."""
    body, headers = wl.payloads()[0]
    t0 = time.perf_counter()
    with httpx.Client(timeout=timeout_s) as client:
        while time.perf_counter() - t0 < timeout_s:
            with contextlib.suppress(httpx.HTTPError):
                if client.post(wl.target, content=body, headers={**headers, **wl.headers()}).status_code == 200:
                    return round(time.perf_counter() - t0, 3)
            time.sleep(0.1)  # the poll's period, after a refusal or a failed connection
    return None


def overload_steps(plan: dict[str, Any]) -> run.Steps:
    def steps(t: run.Target, _: dict[str, Any], server: ServerProcess) -> list[dict[str, Any]]:
        wl, cpu = run.workload(t, t.workloads[0], "fp32", plan["timeout_s"]), ProcessCPU(server)
        out = [storm_step(wl, c, plan, cpu) for c in plan["connections"]]
        cost_per_refusal(out)
        out[-1]["recovery_s"] = recovery_s(wl)
        capacity = out[0]["goodput_rps"] or 0
        for x in plan["open_load"] if capacity else ():
            step = asyncio.run(open_run(wl, x * capacity, plan["duration_s"], plan["warmup_s"]))
            out.append({**step, "workload": "open", "load_x": x, "goodput_rps": step["throughput_rps"]})
        return out

    return steps


HEADERS = [
    "target", "load", "goodput/s", "503/s", "other errors", "wrk p50 / p99 ms (all)", "accepted p50 / p99 ms",
    "refused p50 / p99 ms", "bad refusals", "CPU ms / refusal", "RSS MiB",
]  # fmt: skip


def rows(targets: list[dict[str, Any]]) -> list[list[Any]]:
    out = []
    for t in targets:
        for st in t.get("steps", []):
            lat, pr = st["latency_ms"], st.get("probe", {})
            acc, ref = pr.get("accepted_ms", {}), pr.get("refused_ms", {})
            load = f"c={st['concurrency']}" if st["workload"] == "storm" else f"{st['load_x']}x open"
            other = {k: n for k, n in st["errors"].items() if k != "503"}
            refused = st.get("refused_per_s", round(st["errors"].get("503", 0) / st["window_s"], 1))
            out.append([
                t["key"], load, st["goodput_rps"], refused, other or "-",
                f"{lat['p50_ms'] or 0:.0f} / {lat['p99_ms'] or 0:.0f}",
                f"{acc.get('p50_ms') or 0:.0f} / {acc.get('p99_ms') or 0:.0f}" if acc else "-",
                f"{ref.get('p50_ms') or 0:.0f} / {ref.get('p99_ms') or 0:.0f}" if ref.get("p50_ms") else "-",
                pr.get("refusals_not_json_503_with_retry_after", "-"), st.get("cpu_ms_per_refusal", "-"),
                st.get("rss_mib", "-"),
            ])  # fmt: skip
    return out


def plot(targets: list[dict[str, Any]], png: Path, title: str) -> None:
    fig, (left, right) = pyplot().subplots(1, 2, figsize=(11, 4.5))
    for t in targets:
        storm = [s for s in t.get("steps", []) if s["workload"] == "storm"]
        if not storm:
            continue
        xs = [s["concurrency"] for s in storm]
        left.plot(xs, [s["goodput_rps"] for s in storm], marker="o", label=f"{t['key']} goodput")
        refused = [s["refused_per_s"] or float("nan") for s in storm]  # none: no point on a log scale
        left.plot(xs, refused, marker="x", linestyle=":", label=f"{t['key']} 503/s")
        p99 = [(s["probe"]["accepted_ms"].get("p99_ms") or float("nan")) / 1000 for s in storm]
        right.plot(xs, p99, marker="o", label=f"{t['key']} accepted p99")
    for ax, ylabel in ((left, "requests/s"), (right, "seconds")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(CONNECTIONS, [str(c) for c in CONNECTIONS])
        ax.set(xlabel="connections (closed loop, resend at once)", ylabel=ylabel)
        ax.set_yscale("log")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    save_figure(fig, png, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--targets", default=",".join(TARGETS), help=f"comma-separated, from {', '.join(TARGETS)}")
    add("--connections", type=lambda s: [int(x) for x in s.split(",")], default=list(CONNECTIONS))
    add("--open-load", type=lambda s: [float(x) for x in s.split(",") if x], default=list(OPEN_LOAD))
    add("--duration", dest="duration_s", type=float, default=10.0)
    add("--warmup", dest="warmup_s", type=float, default=2.0)
    add("--out-dir", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    plan = {k: getattr(args, k) for k in ("connections", "open_load", "duration_s", "warmup_s")} | {"timeout_s": 30.0}
    env, run_stamp, t0 = print_environment(), stamp(), time.perf_counter()
    log_dir = Path(tempfile.mkdtemp(prefix="overload-logs-"))
    targets = []
    for key in args.targets.split(","):
        targets.append(run.run_target(TARGETS[key], plan, log_dir, overload_steps(plan)))
    stem = args.out_dir / f"{run_stamp}-{host_name()}-overload"
    result: dict[str, Any] = {"stamp": run_stamp, "environment": env, "plan": plan, "targets": targets}
    result["wall_s"] = round(time.perf_counter() - t0, 1)
    title = f"retry storm, single images, FP32; {env['cpu_model']} ({env['usable_cpus']} cores), {run_stamp}"
    plot(targets, stem.parent / f"{stem.name}.png", title)
    table = markdown_table(HEADERS, rows(targets))
    md = f"# Overload, {run_stamp}\n\n{table}\n\n![goodput and accepted p99]({stem.name}.png)\n"
    print(table)
    print(write_report(stem, result, md))
    return 1 if any(t.get("error") for t in targets) else 0


if __name__ == "__main__":
    sys.exit(main())
