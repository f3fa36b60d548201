"""Fairness at the admission front (`make fairness`, `python -m benchmarks.fairness`): one greedy client beside a
polite one.

The polite client: 4 connections, each sending one single-image request (FP32) every 0.5 s on a schedule (the next
is due 0.5 s after the last was due, or at once when the reply came later): 8 requests/s, a tenth of what the app
serves here, as a dashboard or a batch job that paces itself would. The greedy client: wrk, 500 connections
resending at once (closed loop, Retry-After ignored). Each names itself in the front's client header
(Front.client_header, X-User-Id). Three phases per target: the polite client alone (its unloaded rate), the polite
client with the greedy one, and the greedy one's refusals (429: its share was full; 503: the front's queue timed
out). The polite client's rate under the greedy one over its unloaded rate is the figure (issue's target: >= 0.9).

Targets:
- "app": configs/local.yaml + serve.env, the shipped runtime: the front with args.front.max_per_client (32 per
  named client at once, per HAProxy).
- "app_nofair": the same front without the per-client bound (APP_FRONT_MAX_PER_CLIENT=0): the greedy client can
  take every Router place and the whole queue.
- "app_router": no front at all (the Router's own overload defences, first come first served).

Writes benchmarks/results/<date>-<host>-fairness.json, .md and a PNG.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp

from benchmarks import overload, run
from benchmarks.environment import RESULTS_DIR, host_name, print_environment, stamp
from benchmarks.load import Workload, wrk_step
from benchmarks.report import markdown_table, pyplot, save_figure, write_report
from benchmarks.server_process import ServerProcess
from benchmarks.stats import latency_summary

POLITE_CONNECTIONS, POLITE_PERIOD_S, GREEDY_CONNECTIONS = 4, 0.5, 500
TARGETS = {
    "app": overload.TARGETS["app"],
    "app_nofair": dataclasses.replace(
        overload.TARGETS["app"],
        key="app_nofair",
        name="this app, front without the per-client bound",
        env=(("APP_FRONT_MAX_PER_CLIENT", "0"),),
    ),
    "app_router": overload.TARGETS["app_router"],
}


async def polite(wl: Workload, duration_s: float) -> list[dict[str, Any]]:
    """POLITE_CONNECTIONS connections, each one request every POLITE_PERIOD_S on a schedule, for duration_s."""
    body, headers = wl.payloads()[0]
    samples: list[dict[str, Any]] = []
    t0 = time.perf_counter()

    async def connection(session: aiohttp.ClientSession, k: int) -> None:
        due = t0 + k * POLITE_PERIOD_S / POLITE_CONNECTIONS  # the 4 spread over a period
        while due < t0 + duration_s:
            await asyncio.sleep(max(0.0, due - time.perf_counter()))
            start = time.perf_counter()
            try:
                async with session.post(wl.target, data=body, headers={**headers, **wl.headers()}) as r:
                    await r.read()
                    status: int | str = r.status
            except (aiohttp.ClientError, asyncio.TimeoutError) as e:
                status = type(e).__name__
            samples.append({"t": start - t0, "status": status, "latency_s": time.perf_counter() - start})
            due = max(due + POLITE_PERIOD_S, time.perf_counter())

    connector = aiohttp.TCPConnector(limit=POLITE_CONNECTIONS)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=wl.timeout_s)) as s:
        await asyncio.gather(*(connection(s, k) for k in range(POLITE_CONNECTIONS)))
    return samples


def polite_summary(samples: list[dict[str, Any]], duration_s: float) -> dict[str, Any]:
    ok = [s["latency_s"] for s in samples if s["status"] == 200]
    return {
        "sent": len(samples),
        "statuses": dict(Counter(str(s["status"]) for s in samples)),
        "ok_per_s": round(len(ok) / duration_s, 2),
        "latency_ms": latency_summary(ok),
        "series": [(round(s["t"], 3), round(s["latency_s"], 4), s["status"]) for s in samples],
    }


def fairness_steps(plan: dict[str, Any]) -> run.Steps:
    def steps(t: run.Target, _: dict[str, Any], server: ServerProcess) -> list[dict[str, Any]]:
        base = run.workload(t, "sweep", "fp32", plan["timeout_s"])
        polite_wl = dataclasses.replace(base, client="polite")
        greedy_wl = dataclasses.replace(base, client="greedy")
        duration = plan["duration_s"]
        alone = polite_summary(asyncio.run(polite(polite_wl, duration)), duration)
        print(f"  polite alone: {alone['ok_per_s']}/s {alone['statuses']}", file=sys.stderr, flush=True)
        found: list[dict[str, Any]] = []
        # The polite client starts once wrk's warm-up is over, and stops before wrk's measured run does.
        window = max(1.0, duration - 2.0)
        start_in = plan["warmup_s"] + 1.0

        def polite_later() -> None:
            time.sleep(start_in)
            found.extend(asyncio.run(polite(polite_wl, window)))

        prober = threading.Thread(target=polite_later)
        prober.start()
        greedy = wrk_step(greedy_wl, GREEDY_CONNECTIONS, duration, plan["warmup_s"])
        prober.join()
        beside = polite_summary(found, window)
        ratio = round(beside["ok_per_s"] / alone["ok_per_s"], 3) if alone["ok_per_s"] else None
        refused = {k: round(n / greedy["window_s"], 1) for k, n in greedy["errors"].items()}
        print(f"  polite beside greedy: {beside['ok_per_s']}/s ({ratio}) {beside['statuses']}", file=sys.stderr)
        return [
            {
                "polite_alone": alone,
                "polite_beside_greedy": beside,
                "polite_ratio": ratio,
                "greedy": greedy,
                "greedy_ok_per_s": greedy["throughput_rps"],
                "greedy_refused_per_s": refused,
            }
        ]

    return steps


HEADERS = [
    "target", "polite alone /s", "polite beside greedy /s", "ratio", "polite p50 / p99 ms (beside)",
    "polite non-200", "greedy 200/s", "greedy refused /s",
]  # fmt: skip


def rows(targets: list[dict[str, Any]]) -> list[list[Any]]:
    out = []
    for t in targets:
        for st in t.get("steps", []):
            beside = st["polite_beside_greedy"]
            lat = beside["latency_ms"]
            bad = {k: n for k, n in beside["statuses"].items() if k != "200"}
            out.append([
                t["key"], st["polite_alone"]["ok_per_s"], beside["ok_per_s"], st["polite_ratio"],
                f"{lat.get('p50_ms') or 0:.0f} / {lat.get('p99_ms') or 0:.0f}" if lat else "-", bad or "-",
                st["greedy_ok_per_s"], st["greedy_refused_per_s"] or "-",
            ])  # fmt: skip
        if t.get("error"):
            out.append([t["key"], "error", t["error"][:80], "", "", "", "", ""])
    return out


def plot(targets: list[dict[str, Any]], png: Path, title: str) -> None:
    """The polite client's requests beside the greedy one: latency over time, refusals marked."""
    fig, ax = pyplot().subplots(figsize=(9, 4.2))
    for t in targets:
        for st in t.get("steps", []):
            series = st["polite_beside_greedy"]["series"]
            ok = [(x, lat) for x, lat, status in series if status == 200]
            bad = [(x, lat) for x, lat, status in series if status != 200]
            colour = None
            if ok:
                (line,) = ax.plot(*zip(*ok, strict=True), marker=".", linestyle="", label=f"{t['key']} 200")
                colour = line.get_color()
            if bad:
                ax.plot(*zip(*bad, strict=True), marker="x", linestyle="", color=colour, label=f"{t['key']} not 200")
    ax.set(xlabel="seconds into the greedy client's run", ylabel="polite request latency (s)", yscale="log")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    save_figure(fig, png, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--targets", default=",".join(TARGETS), help=f"comma-separated, from {', '.join(TARGETS)}")
    add("--duration", dest="duration_s", type=float, default=20.0)
    add("--warmup", dest="warmup_s", type=float, default=2.0)
    add("--out-dir", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    plan = {"duration_s": args.duration_s, "warmup_s": args.warmup_s, "timeout_s": 30.0}
    env, run_stamp, t0 = print_environment(), stamp(), time.perf_counter()
    log_dir = Path(tempfile.mkdtemp(prefix="fairness-logs-"))
    targets = [run.run_target(TARGETS[k], plan, log_dir, fairness_steps(plan)) for k in args.targets.split(",")]
    stem = args.out_dir / f"{run_stamp}-{host_name()}-fairness"
    result: dict[str, Any] = {"stamp": run_stamp, "environment": env, "plan": plan, "targets": targets}
    result["wall_s"] = round(time.perf_counter() - t0, 1)
    title = (
        f"polite ({POLITE_CONNECTIONS} conns, 1 req / {POLITE_PERIOD_S:g} s each) beside greedy "
        f"({GREEDY_CONNECTIONS} conns, resend at once); {env['cpu_model']} ({env['usable_cpus']} cores), {run_stamp}"
    )
    plot(targets, stem.parent / f"{stem.name}.png", title)
    table = markdown_table(HEADERS, rows(targets))
    md = f"# Fairness, {run_stamp}\n\n{table}\n\n![polite latency beside greedy]({stem.name}.png)\n"
    print(table)
    print(write_report(stem, result, md))
    return 1 if any(t.get("error") for t in targets) else 0


if __name__ == "__main__":
    sys.exit(main())
