"""What tracing costs: the server's CPU per image with tracing off, on at a sampling ratio of 0.01 and at 1.0, and
what a stalled collector does to requests.

    python -m benchmarks.tracing_cost                  # about 12 minutes on 2 cores
    python -m benchmarks.tracing_cost --rounds 1 --duration 4 --warmup 1

Each configuration is configs/local.yaml served as `make serve` serves it (benchmarks.run's "app" target: serve.env,
HAProxy in front), with tracing turned on as an operator does, by environment: Serve's
RAY_SERVE_TRACING_EXPORTER_IMPORT_PATH=app.serve.tracing:span_processors and RAY_SERVE_TRACING_SAMPLING_RATIO, the
spans exported over OTLP/HTTP to a receiver in this process (tests.otlp_receiver: it decodes the wire format and counts
the spans, on the same two cores). The workloads are benchmarks.run's: single images at c=8 ("sweep") and 16 images
per request at c=8 ("batch", FP32 and INT8). The configurations run in alternating order, round after round (off, 0.01,
1.0, then 1.0, 0.01, off, ...), so drift on a shared machine hits each alike; the figures are medians over rounds.
CPU per image is the server's whole process tree (Ray's daemons, Serve's controller, HAProxy, the replicas).

With `--before REF` a fourth configuration runs in the same rounds: the code of that commit (a git worktree first on
PYTHONPATH, so the server and its Ray workers import its `app`), tracing absent, the baseline "off" is compared with.

Then a stalled collector: tracing at 1.0 with the receiver holding every export and OTEL_BSP_MAX_QUEUE_SIZE at 256:
requests that failed, throughput and CPU against the run at 1.0, spans received meanwhile.

Writes <stamp>-<host>-tracing-cost.json, .md and .png under benchmarks/results/.
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from app.toolchain.samples import sample_bytes
from benchmarks import cost
from benchmarks import run as bench
from benchmarks.environment import RESULTS_DIR, host_name, print_environment, stamp
from benchmarks.report import markdown_table, write_json
from tests.otlp_receiver import Receivers, Span

HOOK = "app.serve.tracing:span_processors"
CONFIGS = ("off", "0.01", "1.0")
WORKLOADS = ("sweep", "batch")


def target(config: str, endpoint: str, extra: dict[str, str] | None = None) -> bench.Target:
    traced = config not in ("off", "before")
    env = {"RAY_SERVE_TRACING_EXPORTER_IMPORT_PATH": HOOK} if traced else {}
    if traced:
        env |= {"RAY_SERVE_TRACING_SAMPLING_RATIO": config, "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint}
        env |= {"OTEL_SERVICE_NAME": "image-classifier-bench"}
    env |= extra or {}
    name = f"this app, tracing {config}"
    return bench.Target(f"app_trace_{config}", name, "local", 8000, WORKLOADS, sweep=(8,), env=tuple(env.items()))


def worktree(ref: str, log_dir: Path) -> Path:
    """`ref`'s tree checked out beside this one; its `app` is the one a server started with it first on PYTHONPATH
    imports (checked here, as the server's processes will)."""
    path = log_dir / "before"
    subprocess.run(["git", "-C", str(bench.REPO), "worktree", "add", "--detach", str(path), ref], check=True)
    env = {**os.environ, "PYTHONPATH": str(path)}
    where = subprocess.run([sys.executable, "-c", "import app; print(app.__file__)"], env=env, capture_output=True)
    if not where.stdout.decode().startswith(str(path)):
        raise RuntimeError(f"PYTHONPATH={path} does not put {ref}'s app first: {where.stdout!r} {where.stderr!r}")
    return path


def served(steps: list[dict[str, Any]]) -> int:
    return sum(st["ok"] for st in steps)


# The attributes a rendered trace shows, where a span has them.
SHOWN = (
    "http.response.status_code",
    "app.variant",
    "app.routing.reason",
    "app.group.requests",
    "app.group.images",
    "app.images",
    "app.image.format",
    "app.image.pixels",
    "app.batch.images",
    "app.batch.requests",
    "app.batch.rows",
    "app.engine",
    "app.execution_provider",
)


def render(spans: list[Span]) -> list[str]:
    """A trace as an operator reads it in a trace viewer: the tree by parent, each span's duration, its process (the
    deployment Serve's span in that process names) and the attributes that say what happened; links as arrows."""
    where = {s.resource.get("process.pid"): s.attributes["deployment"] for s in spans if "deployment" in s.attributes}
    ids = {s.span_id for s in spans}
    children: dict[str, list[Span]] = {}
    for s in spans:
        children.setdefault(s.parent_span_id if s.parent_span_id in ids else "", []).append(s)
    lines: list[str] = []

    def walk(parent: str, depth: int) -> None:
        for s in sorted(children.get(parent, []), key=lambda x: x.start_ns):
            ms = (s.end_ns - s.start_ns) / 1e6
            attrs = " ".join(f"{k.removeprefix('app.')}={s.attributes[k]}" for k in SHOWN if k in s.attributes)
            proc = where.get(s.resource.get("process.pid"), "?")
            link = " -> linked to " + ", ".join(sid[:8] for _, sid in s.links) if s.links else ""
            lines.append(f"{'  ' * depth}{s.name}  {ms:.1f} ms  [{proc}] {s.span_id[:8]} {attrs}{link}".rstrip())
            walk(s.span_id, depth + 1)

    walk("", 0)
    return lines


def one_trace(url: str, receivers: Receivers) -> list[str]:
    """One single-image request with a sampled caller's traceparent, and its trace once every process exported it."""
    tid = secrets.token_hex(16)
    header = f"00-{tid}-{secrets.token_hex(8)}-01"
    receivers.sink.keep = True
    try:
        headers = {"content-type": "image/png", "traceparent": header, "X-Model-Variant": "int8"}
        reply = httpx.post(url, content=sample_bytes("coffee"), headers=headers, timeout=30)
        reply.raise_for_status()
        names = ("classifier batch", "batch queue", "coalesced group", "router queue")
        spans = receivers.sink.wait_for(lambda t: set(names) <= {s.name for s in t}, tid)
    finally:
        receivers.sink.keep = False
    return [f"reply traceparent: {reply.headers.get('traceparent')}", *render(spans)]


def run_config(
    config: str, receivers: Receivers, plan: dict[str, Any], log_dir: Path, extra: Any = None, show: Any = None
) -> Any:
    """One configuration's run; `show`: a list the rendered trace of one request is put in (after the workloads)."""
    before = receivers.sink.count

    def steps(t: bench.Target, plan: dict[str, Any], server: Any) -> list[dict[str, Any]]:
        out = bench.drive(t, plan, lambda: cost.tree_cpu_s(server.family))
        if show is not None:
            show.extend(one_trace(t.url, receivers))
        return out

    out = bench.run_target(target(config, receivers.http_url, extra), plan, log_dir, steps)
    if out.get("error"):
        raise RuntimeError(f"tracing {config}: {out['error']}")
    out["spans_received"] = receivers.sink.count - before
    out["requests_ok"] = served(out["steps"])
    return out


def cpu_of(runs: list[dict[str, Any]], workload: str, variant: str) -> list[float]:
    """CPU ms per image of each run's step of that workload and variant."""
    return [
        st["cpu_ms_per_image"]
        for r in runs
        for st in r["steps"]
        if st["workload"] == workload and st.get("variant") == variant and "cpu_ms_per_image" in st
    ]


def summarise(by_config: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    rows = []
    base = {
        (w, v): statistics.median(cpu_of(by_config["off"], w, v))
        for w in WORKLOADS
        for v in ("fp32", "int8")
        if cpu_of(by_config["off"], w, v)
    }
    for config, runs in by_config.items():
        for (w, v), off in base.items():
            values = cpu_of(runs, w, v)
            med = statistics.median(values)
            rows.append(
                {
                    "config": config,
                    "workload": w,
                    "variant": v,
                    "cpu_ms_per_image": values,
                    "median": round(med, 2),
                    "vs_off": round(med / off, 3),
                    "spread": round((max(values) - min(values)) / med, 3) if len(values) > 1 else 0.0,
                    "spans_per_request": round(
                        sum(r["spans_received"] for r in runs) / max(1, sum(r["requests_ok"] for r in runs)), 2
                    ),
                }
            )
    return rows


def stalled(receivers: Receivers, plan: dict[str, Any], log_dir: Path) -> dict[str, Any]:
    """Tracing at 1.0 while the collector holds every export; a small queue so it fills within the step."""
    receivers.hold()
    try:
        before = receivers.sink.count
        out = bench.run_target(
            target("1.0", receivers.http_url, {"OTEL_BSP_MAX_QUEUE_SIZE": "256"}),
            {**plan, "duration_s": max(plan["duration_s"], 10.0)},
            log_dir,
        )
        out["spans_received_while_held"] = receivers.sink.count - before
    finally:
        receivers.release()
    if out.get("error"):
        raise RuntimeError(f"stalled collector: {out['error']}")
    return out


def write(result: dict[str, Any], base: Path) -> None:
    write_json(base.with_suffix(".json"), result)
    rows = [
        [r["config"], r["workload"], r["variant"], r["median"], r["vs_off"], r["spread"], r["spans_per_request"]]
        for r in result["summary"]
    ]
    headers = ["tracing", "workload", "variant", "CPU ms/image (median)", "vs off", "spread", "spans/request"]
    st = result["stalled"]
    failed = sum(s["requests"] - s["ok"] for s in st["steps"])
    lines = [
        f"# What tracing costs ({result['stamp']})",
        "",
        f"`{result['command']}`; {result['rounds']} rounds, configurations in alternating order; "
        f"{result['plan']['duration_s']} s steps after {result['plan']['warmup_s']} s warm-up, c=8.",
        "",
        markdown_table(headers, rows, 2),
        "",
        "Spread: (max - min) / median of the rounds. spans/request: spans the receiver took per request answered.",
        "",
        "## A stalled collector (tracing 1.0, OTEL_BSP_MAX_QUEUE_SIZE=256, every export held)",
        "",
        f"Requests {sum(s['requests'] for s in st['steps'])}, failed {failed}; spans received while held "
        f"{st['spans_received_while_held']}.",
        "",
        markdown_table(
            ["workload", "variant", "images/s", "p99 ms", "CPU ms/image"],
            [
                [s["workload"], s.get("variant"), s["images_per_s"], s["latency_ms"]["p99_ms"], s["cpu_ms_per_image"]]
                for s in st["steps"]
            ],
            2,
        ),
        "",
        "## One request's trace (tracing 1.0, a caller's sampled traceparent, X-Model-Variant: int8)",
        "",
        "```",
        *result["trace"],
        "```",
    ]
    base.with_suffix(".md").write_text("\n".join(lines) + "\n")
    plot(result, base.with_suffix(".png"))


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = sorted({(r["workload"], r["variant"]) for r in result["summary"]})
    configs = list(dict.fromkeys(r["config"] for r in result["summary"]))
    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.8 / len(configs)
    for i, config in enumerate(configs):
        values = [
            next(r["median"] for r in result["summary"] if r["config"] == config and (r["workload"], r["variant"]) == g)
            for g in groups
        ]
        label = "before the change" if config == "before" else f"tracing {config}"
        ax.bar([x + i * width for x in range(len(groups))], values, width, label=label)
    ax.set_xticks([x + width * (len(configs) - 1) / 2 for x in range(len(groups))], [f"{w} {v}" for w, v in groups])
    ax.set_ylabel("server CPU ms per image (median of rounds)")
    ax.set_title("Tracing off / 0.01 / 1.0, configs/local.yaml, c=8")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=10.0, help="measured s per step")
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--out-dir", type=Path, default=RESULTS_DIR)
    parser.add_argument("--before", metavar="REF", help="also run this commit's code (tracing absent) each round")
    args = parser.parse_args(argv)
    env, run_stamp, t0 = print_environment(), stamp(), time.perf_counter()
    plan = {"duration_s": args.duration, "warmup_s": args.warmup, "concurrency": [8], "timeout_s": 30.0}
    plan["floor"] = cost.floor(1.0)
    log_dir = Path(tempfile.mkdtemp(prefix="tracing-cost-"))
    print(f"server logs: {log_dir}", file=sys.stderr)
    configs = (("before",) if args.before else ()) + CONFIGS
    by_config: dict[str, list[dict[str, Any]]] = {c: [] for c in configs}
    before = worktree(args.before, log_dir) if args.before else None
    try:
        with Receivers() as receivers:
            receivers.sink.keep = False
            shown: list[str] = []
            for r in range(args.rounds):
                for config in configs[:: -1 if r % 2 else 1]:
                    show = shown if config == "1.0" and r == 0 else None
                    extra = {"PYTHONPATH": str(before)} if config == "before" else None
                    by_config[config].append(run_config(config, receivers, plan, log_dir, extra, show))
            held = stalled(receivers, plan, log_dir)
    finally:
        if before is not None:
            subprocess.run(["git", "-C", str(bench.REPO), "worktree", "remove", "--force", str(before)], check=False)
    result = {
        "stamp": run_stamp,
        "environment": env,
        "command": "python -m benchmarks.tracing_cost " + " ".join(argv if argv is not None else sys.argv[1:]),
        "rounds": args.rounds,
        "before": args.before,
        "plan": plan,
        "runs": by_config,
        "summary": summarise(by_config),
        "stalled": held,
        "trace": shown,
        "wall_s": round(time.perf_counter() - t0, 1),
    }
    base = args.out_dir / f"{run_stamp}-{host_name()}-tracing-cost"
    write(result, base)
    print(base.with_suffix(".md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
