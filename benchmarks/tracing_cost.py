"""What tracing costs: the server's CPU per image with tracing off, on at a sampling ratio of 0.01 and at 1.0, and
what a stalled collector does to requests.

    python -m benchmarks.tracing_cost --before 92a2417 --pairs 3      # about 28 minutes on 2 cores
    python -m benchmarks.tracing_cost --rounds 1 --pairs 1 --duration 3 --warmup 1

Each server is configs/local.yaml served as `make serve` serves it (serve.env, HAProxy in front) with every variant
on ONNX Runtime's CPU EP (benchmarks.run's "ortcpu": `engine: auto` would pick OpenVINO or ORT at each start by a
measurement the machine's noise sways, and servers would differ in that), driven with benchmarks.run's workloads at
c=8: single images ("sweep", FP32) and 16 images per request ("batch", FP32 and INT8). The servers, one after another
in alternating order, round after round:

- "before" (with `--before REF`): that commit's code, where tracing does not exist (a git worktree, where the server
  starts, first on PYTHONPATH: the server and its Ray workers import its `app`);
- "off": this code, tracing not turned on;
- "on": tracing turned on as an operator does, by environment (RAY_SERVE_TRACING_EXPORTER_IMPORT_PATH, and
  OTEL_TRACES_SAMPLER=parentbased_traceidratio with OTEL_TRACES_SAMPLER_ARG=0.01), exporting over OTLP/HTTP to a
  receiver in this process (tests.otlp_receiver: it decodes the wire format and counts the spans, on the same cores),
  at the exporters' defaults (every 5 s, or at 512 spans).
  Its steps alternate, in pairs, between requests without a traceparent (sampled at 0.01) and requests whose caller's
  traceparent says sampled (so every one is traced: 1.0), so 1.0 against 0.01 is measured on one server, step after
  step, free of the start-to-start drift that two servers' comparison carries;
- "unexported": "on" with OTEL_TRACES_EXPORTER=none, its steps alternating the same way: spans made, sampled and
  ended, sent nowhere. 1.0 over 0.01 there is what making the spans costs; "on"'s less that is what exporting them
  (encoding, the OTLP post) costs.

CPU per image is the server's whole process tree (Ray's daemons, Serve's controller, HAProxy, the replicas); per
request it is that times the images per request. Then a stalled collector: the "on" server with the receiver holding
every export and OTEL_BSP_MAX_QUEUE_SIZE at 256, every request traced: requests that failed, spans received meanwhile.
Writes <stamp>-<host>-tracing-cost.json, .md and .png under benchmarks/results/, with one request's trace rendered.
"""

from __future__ import annotations

import argparse
import dataclasses
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
from benchmarks.load import wrk_step
from benchmarks.report import markdown_table, write_json
from tests.otlp_receiver import Receivers, Span

HOOK = "app.serve.tracing:span_processors"
LABELS = ("before", "off", "0.01", "1.0")  # what each step measured
TRACED = ("on", "unexported")  # the servers whose steps alternate 0.01 and 1.0
WORKLOADS = ("sweep", "batch")


def target(config: str, endpoint: str, extra: dict[str, str] | None = None, cwd: str | None = None) -> bench.Target:
    env: dict[str, str] = {}
    if config in TRACED:
        env = {
            "RAY_SERVE_TRACING_EXPORTER_IMPORT_PATH": HOOK,
            "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
            "OTEL_TRACES_SAMPLER_ARG": "0.01",
            "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
            "OTEL_SERVICE_NAME": "image-classifier-bench",
            "OTEL_EXPERIMENTAL_RESOURCE_DETECTORS": "otel,process",  # the process id: which replica made a span
        }
    if config == "unexported":
        env["OTEL_TRACES_EXPORTER"] = "none"
    env |= extra or {}
    name = {
        "before": "the code before tracing",
        "off": "tracing off",
        "on": "tracing on",
        "unexported": "tracing on, spans not exported",
    }[config]
    key = f"app_trace_{config}"
    # ortcpu: every variant on ONNX Runtime's CPU EP. With `engine: auto` each start measures OpenVINO against ORT and
    # keeps the faster, and on a noisy machine servers would differ in that choice, not only in tracing.
    runs = "ortcpu"
    return bench.Target(key, f"this app, {name}", runs, 8000, WORKLOADS, sweep=(8,), env=tuple(env.items()), cwd=cwd)


def worktree(ref: str, log_dir: Path) -> Path:
    """`ref`'s tree checked out beside this one; its `app` is the one a server started with it first on PYTHONPATH
    imports (checked here, as the server's processes will)."""
    path = log_dir / "before"
    subprocess.run(["git", "-C", str(bench.REPO), "worktree", "add", "--detach", str(path), ref], check=True)
    env = {**os.environ, "PYTHONPATH": str(path)}
    check = [sys.executable, "-c", "import app; print(app.__file__)"]
    where = subprocess.run(check, env=env, cwd=path, capture_output=True)
    if not where.stdout.decode().startswith(str(path)):
        raise RuntimeError(f"PYTHONPATH={path} does not put {ref}'s app first: {where.stdout!r} {where.stderr!r}")
    return path


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
        names = ("POST /v1/classify", "decode", "classifier batch")
        spans = receivers.sink.wait_for(lambda t: set(names) <= {s.name for s in t}, tid)
    finally:
        receivers.sink.keep = False
    return [f"reply traceparent: {reply.headers.get('traceparent')}", *render(spans)]


def sampled_caller(trace_id: str | None = None) -> tuple[tuple[str, str], ...]:
    """A caller's traceparent that says sampled (one trace id for a step: the cost per span is the same, and the
    step's spans are found by it whenever their export arrives)."""
    return (("traceparent", f"00-{trace_id or secrets.token_hex(16)}-{secrets.token_hex(8)}-01"),)


def settled(receivers: Receivers, quiet_s: float = 6.5, limit_s: float = 60.0) -> None:
    """Until no span has arrived for `quiet_s` (longer than the exporters' 5 s schedule), at most `limit_s`."""
    deadline, last, since = time.monotonic() + limit_s, -1, time.monotonic()
    while time.monotonic() < deadline:
        if receivers.sink.count != last:
            last, since = receivers.sink.count, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            return
        time.sleep(0.25)


def steps_of(t: bench.Target, plan: dict[str, Any], server: Any, modes: list[str], receivers: Receivers) -> Any:
    """benchmarks.run's workloads once per mode, in that order: "0.01" sends no traceparent, "1.0" a sampled caller's
    ("-": tracing is not on); each step tagged with its mode, the spans that arrived during it, and (once every
    export is in) the spans of its trace id and the requests it sent."""
    steps = []
    start = receivers.sink.count
    for mode in modes:
        for name in WORKLOADS:
            levels = bench.WORKLOADS[name][0]
            for variant in ("fp32", "int8") if name == "batch" else ("fp32",):
                tid = secrets.token_hex(16) if mode == "1.0" else None
                extra = sampled_caller(tid) if tid else ()
                wl = dataclasses.replace(bench.workload(t, name, variant, plan["timeout_s"]), extra=extra)
                before = receivers.sink.count
                step = wrk_step(wl, levels[0] if levels else 8, plan["duration_s"], plan["warmup_s"], server)
                arrived = receivers.sink.count - before
                step |= {"workload": name, "mode": mode, "trace_id": tid, "arrived": arrived}
                step |= cost.per_image(step, None)
                steps.append(step)
    if any(m != "-" for m in modes):  # every step's spans in (the exporters send every 5 s), each 1.0 step's by its id
        settled(receivers)
        for st in steps:
            st["sent"] = st["requests"] + st["warmup_requests"] + 1  # the measured, the warm-up's and the drain
            st["spans"] = receivers.sink.by_trace[st["trace_id"]] if st["trace_id"] else None
        traced = sum(st["spans"] or 0 for st in steps)
        steps[-1]["untraced_spans"] = receivers.sink.count - start - traced  # the 0.01 steps' (and the 1% sampled)
    return steps


def run_server(
    config: str,
    receivers: Receivers,
    plan: dict[str, Any],
    log_dir: Path,
    modes: list[str],
    cwd: str | None = None,
    show: list[str] | None = None,
    extra: dict[str, str] | None = None,
) -> dict[str, Any]:
    """One server's start, steps (`modes`, steps_of) and stop; `show`: a list one request's rendered trace goes in."""

    def steps(t: bench.Target, plan: dict[str, Any], server: Any) -> list[dict[str, Any]]:
        out = steps_of(t, plan, lambda: cost.tree_cpu_s(server.family), modes, receivers)
        if show is not None:
            try:
                show.extend(one_trace(t.url, receivers))
            except (AssertionError, httpx.HTTPError) as e:  # the figures stand without it: say so in the report
                show.append(f"no trace: {e}")
        return out

    env = {**(extra or {}), **({"PYTHONPATH": cwd} if cwd else {})}
    out = bench.run_target(target(config, receivers.http_url, env, cwd), plan, log_dir, steps)
    if out.get("error"):
        raise RuntimeError(f"{config}: {out['error']}")
    return out


def label(config: str, step: dict[str, Any]) -> str:
    if config in TRACED:
        return str(step["mode"]) if config == "on" else f"{config} {step['mode']}"
    return config


def medians(servers: list[tuple[str, dict[str, Any]]]) -> dict[tuple[str, str, str], float]:
    """Median CPU ms per image by (label, workload, variant) over every step."""
    values: dict[tuple[str, str, str], list[float]] = {}
    for config, out in servers:
        for st in out["steps"]:
            if "cpu_ms_per_image" in st:
                values.setdefault((label(config, st), st["workload"], st["variant"]), []).append(st["cpu_ms_per_image"])
    return {k: statistics.median(v) for k, v in values.items()}


def paired(servers: list[tuple[str, dict[str, Any]]], which: str = "on") -> dict[tuple[str, str], list[float]]:
    """1.0 over 0.01 per adjacent pair of steps on the same server of config `which`, by (workload, variant)."""
    out: dict[tuple[str, str], list[float]] = {}
    for config, server in servers:
        if config != which:
            continue
        by: dict[tuple[str, str, str], list[float]] = {}
        for st in server["steps"]:
            if "cpu_ms_per_image" in st:
                by.setdefault((st["mode"], st["workload"], st["variant"]), []).append(st["cpu_ms_per_image"])
        for (mode, w, v), ones in by.items():
            if mode == "1.0":
                out.setdefault((w, v), []).extend(a / b for a, b in zip(ones, by[("0.01", w, v)], strict=True))
    return out


def summarise(servers: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    med, pairs, made = medians(servers), paired(servers), paired(servers, "unexported")
    rows = []
    for w in WORKLOADS:
        for v in ("fp32", "int8") if w == "batch" else ("fp32",):
            per_request = bench.WORKLOADS[w][1]
            off = med.get(("off", w, v))
            row: dict[str, Any] = {"workload": w, "variant": v, "images_per_request": per_request}
            for lab in LABELS:
                m = med.get((lab, w, v))
                row[lab] = None if m is None else round(m, 2)
                row[f"{lab}_per_request"] = None if m is None else round(m * per_request, 2)
            ratios = pairs.get((w, v), [])
            row["1.0_over_0.01_paired"] = round(statistics.median(ratios), 3) if ratios else None
            row["1.0_over_0.01_pairs"] = [round(r, 3) for r in ratios]
            unexported = made.get((w, v), [])
            row["unexported_1.0_over_0.01_paired"] = round(statistics.median(unexported), 3) if unexported else None
            row["unexported_1.0_over_0.01_pairs"] = [round(r, 3) for r in unexported]
            row["0.01_over_off"] = round(med[("0.01", w, v)] / off, 3) if off and ("0.01", w, v) in med else None
            row["off_over_before"] = round(off / med[("before", w, v)], 3) if off and ("before", w, v) in med else None
            rows.append(row)
    return rows


def spans_per_request(servers: list[tuple[str, dict[str, Any]]], mode: str) -> float | None:
    """Spans the collector received per request sent, in the "on" servers' steps of `mode` (warm-ups included)."""
    steps = [st for c, out in servers if c == "on" for st in out["steps"]]  # "on" exports
    sent = sum(st["sent"] for st in steps if st["mode"] == mode)
    if mode == "1.0":
        spans = sum(st["spans"] for st in steps if st["mode"] == mode)
    else:
        spans = sum(st.get("untraced_spans", 0) for st in steps)
    return round(spans / sent, 2) if sent else None


def stalled(receivers: Receivers, plan: dict[str, Any], log_dir: Path) -> dict[str, Any]:
    """The "on" server, every request traced, while the collector holds every export; a queue of 256 spans."""
    receivers.hold()
    try:
        return run_server("on", receivers, plan, log_dir, ["1.0"], extra={"OTEL_BSP_MAX_QUEUE_SIZE": "256"})
    finally:
        receivers.release()


def write(result: dict[str, Any], base: Path) -> None:
    write_json(base.with_suffix(".json"), result)
    ratios = ("1.0_over_0.01_paired", "unexported_1.0_over_0.01_paired", "0.01_over_off", "off_over_before")
    rows = [
        [r["workload"], r["variant"], *(r[lab] for lab in LABELS), *(r[k] for k in ratios)] for r in result["summary"]
    ]
    headers = ["workload", "variant", *(f"{lab} CPU ms/image" for lab in LABELS), "1.0 / 0.01 (paired)"]
    headers += ["1.0 / 0.01 unexported (paired)"]
    headers += ["0.01 / off", "off / before"]
    st = result["stalled"]["steps"]
    lines = [
        f"# What tracing costs ({result['stamp']})",
        "",
        f"`{result['command']}`: {result['rounds']} rounds of servers in alternating order, {result['pairs']} pairs "
        f"of 0.01/1.0 steps per tracing-on server; {result['plan']['duration_s']} s steps after "
        f"{result['plan']['warmup_s']} s warm-up, c=8. Medians over every step; the paired ratio is the median of "
        "1.0 over 0.01 in adjacent steps on one server.",
        "",
        markdown_table(headers, rows, 3),
        "",
        f"Spans per request: {result['spans_per_request']['1.0']} at 1.0, {result['spans_per_request']['0.01']} at "
        "0.01 (received by the collector; Serve's spans included).",
        "",
        "## A stalled collector (every request traced, OTEL_BSP_MAX_QUEUE_SIZE=256, every export held)",
        "",
        f"Requests {sum(s['requests'] for s in st)}, failed {sum(s['requests'] - s['ok'] for s in st)}; spans "
        f"received while held: {sum(s['arrived'] for s in st)}.",
        "",
        markdown_table(
            ["workload", "variant", "images/s", "p99 ms", "CPU ms/image"],
            [
                [s["workload"], s["variant"], s["images_per_s"], s["latency_ms"]["p99_ms"], s.get("cpu_ms_per_image")]
                for s in st
            ],
            2,
        ),
        "",
        "## One request's trace (a caller's sampled traceparent, X-Model-Variant: int8)",
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

    rows = result["summary"]
    labels = [lab for lab in LABELS if any(r[lab] is not None for r in rows)]
    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.8 / len(labels)
    for i, lab in enumerate(labels):
        values = [r[lab] or 0.0 for r in rows]
        name = {"before": "before the change", "off": "tracing off"}.get(lab, f"tracing, sampled {lab}")
        ax.bar([x + i * width for x in range(len(rows))], values, width, label=name)
    ax.set_xticks(
        [x + width * (len(labels) - 1) / 2 for x in range(len(rows))], [f"{r['workload']} {r['variant']}" for r in rows]
    )
    ax.set_ylabel("server CPU ms per image (median)")
    ax.set_title("Tracing's CPU, configs/local.yaml, c=8")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--pairs", type=int, default=2, help="0.01/1.0 step pairs per tracing-on server")
    parser.add_argument("--duration", type=float, default=6.0, help="measured s per step")
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--out-dir", type=Path, default=RESULTS_DIR)
    parser.add_argument("--before", metavar="REF", help="also run this commit's code (tracing absent) each round")
    parser.add_argument(
        "--no-unexported", dest="unexported", action="store_false", help="skip the OTEL_TRACES_EXPORTER=none server"
    )
    args = parser.parse_args(argv)
    env, run_stamp, t0 = print_environment(), stamp(), time.perf_counter()
    plan = {"duration_s": args.duration, "warmup_s": args.warmup, "concurrency": [8], "timeout_s": 30.0}
    log_dir = Path(tempfile.mkdtemp(prefix="tracing-cost-"))
    print(f"server logs: {log_dir}", file=sys.stderr)
    configs = (["before"] if args.before else []) + ["off", "on"] + (["unexported"] if args.unexported else [])
    before = worktree(args.before, log_dir) if args.before else None
    servers: list[tuple[str, dict[str, Any]]] = []
    shown: list[str] = []
    try:
        with Receivers() as receivers:
            receivers.sink.keep = False
            for r in range(args.rounds):
                for config in configs[:: -1 if r % 2 else 1]:
                    modes = ["-"]
                    if config in TRACED:  # alternating within the server too: 0.01 1.0 1.0 0.01 ...
                        modes = [
                            m
                            for p in range(args.pairs)
                            for m in (("0.01", "1.0") if (p + r) % 2 == 0 else ("1.0", "0.01"))
                        ]
                    cwd = str(before) if config == "before" else None
                    show = shown if config == "on" and not shown else None
                    servers.append((config, run_server(config, receivers, plan, log_dir, modes, cwd, show)))
            held = stalled(receivers, plan, log_dir)
    finally:
        if before is not None:
            subprocess.run(["git", "-C", str(bench.REPO), "worktree", "remove", "--force", str(before)], check=False)
    result = {
        "stamp": run_stamp,
        "environment": env,
        "command": "python -m benchmarks.tracing_cost " + " ".join(argv if argv is not None else sys.argv[1:]),
        "rounds": args.rounds,
        "pairs": args.pairs,
        "before": args.before,
        "plan": plan,
        "servers": [{"config": c, **out} for c, out in servers],
        "summary": summarise(servers),
        "spans_per_request": {m: spans_per_request(servers, m) for m in ("0.01", "1.0")},
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
