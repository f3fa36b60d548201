"""The run's report: benchmarks/results/<stamp>-<host>-gpu-serve{,-dryrun}.{json,md,png}.

The JSON holds everything (the served config, /v1/models as the Routers answered it, every step); the Markdown a table
per step kind, the CPU per process group, the Server-Timing stages, what each Classifier says it runs, and the verdict
lines; the PNG img/s per step against the engine's rate, and the cores each group used.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks.environment import format_environment
from benchmarks.gpu_serve import verdict
from benchmarks.gpu_serve.timing import OTHER, STAGES, TOTAL
from benchmarks.report import fmt, markdown_table, pyplot, save_figure, write_report

VARIANT_HEADERS = ["variant", "engine", "execution provider", "precision", "measured img/s at start", "speed gate",
                   "serving (fallback)", "cuda_graphs"]  # fmt: skip
STEP_HEADERS = ["step", "c", "img/s", "req/s", "p50 ms", "p99 ms", "errors", "median batch", "GPU util % mean/max",
                "GPU mem MiB max"]  # fmt: skip


def step_name(step: dict[str, Any]) -> str:
    return f"{step['kind']} {step['size']}"


def throughput_rows(steps: list[dict[str, Any]]) -> list[list[Any]]:
    rows = []
    for s in steps:
        lat, g = s.get("latency_ms") or {}, s.get("gpu")
        util = f"{g['util_mean_pct']:.0f} / {g['util_max_pct']:.0f}" if g else "n/a"
        errors = sum((s.get("errors") or {}).values())
        errors_cell = f"{errors} ({fmt(s['errors'])})" if errors else "0"
        rows.append([step_name(s), s["concurrency"], s.get("images_per_s"), s.get("throughput_rps"), lat.get("p50_ms"),
                     lat.get("p99_ms"), errors_cell, s.get("median_batch_size"), util,
                     g["mem_used_max_mib"] if g else "n/a"])  # fmt: skip
    return rows


def group_rows(steps: list[dict[str, Any]]) -> tuple[list[str], list[list[Any]]]:
    """One row per process group, one column per step: cores used (share of the cores given)."""
    names = list(dict.fromkeys(g for s in steps for g in s.get("groups") or {}))
    headers = ["group", "cores given", *(step_name(s) for s in steps)]
    rows = []
    for g in names:
        given = next((s["groups"][g]["cores_given"] for s in steps if g in s.get("groups", {})), None)
        cells = []
        for s in steps:
            u = (s.get("groups") or {}).get(g)
            share = f" ({u['share']:.0%})" if u and u.get("share") is not None else ""
            cells.append(f"{u['cores_used']:.2f}{share}" if u and u.get("cores_used") is not None else "n/a")
        rows.append([g, given, *cells])
    return headers, rows


def timing_rows(step: dict[str, Any]) -> list[list[Any]]:
    summary = step.get("server_timing") or {}
    order = [n for n in (TOTAL, *STAGES, OTHER) if n in summary] + sorted(set(summary) - {TOTAL, OTHER, *STAGES})
    return [[n, summary[n]["p50_ms"], summary[n]["p99_ms"], summary[n]["mean_ms"], summary[n]["n"]] for n in order]


def variant_rows(models: dict[str, Any] | str | None) -> list[list[Any]]:
    """Per variant, what its Classifier says it runs (GET /v1/models): engine, provider, precision, its own measured
    img/s, the speed gate, and the fields being added (`serving` when a fallback runs, `cuda_graphs`). A /v1/models
    that did not answer: one row saying why."""
    if isinstance(models, str):
        return [["(none)", f"GET /v1/models: {models}", "", "", "", "", "", ""]]
    rows = []
    for name, v in ((models or {}).get("variants") or {}).items():
        if "error" in v:
            rows.append([name, f"unreachable: {v['error']}", "", "", "", "", "", ""])
            continue
        measured = ", ".join(f"{k} {m.get('img_per_s', 0):.0f}" for k, m in (v.get("measured") or {}).items())
        gate = v.get("speed_gate")
        gate_cell = f"{'passed' if gate.get('passed') else 'FAILED'} ({gate.get('speedup', 0):.2f}x)" if gate else "n/a"
        rows.append([name, v.get("engine"), v.get("execution_provider"), v.get("precision"), measured or "n/a",
                     gate_cell, fmt(v.get("serving")) if v.get("serving") else "-",
                     fmt(v.get("cuda_graphs")) if "cuda_graphs" in v else "n/a"])  # fmt: skip
    return rows


def to_markdown(result: dict[str, Any], png: str | None) -> str:
    dry = result["dry_run"]
    mode = "CPU dry run on this machine's cores (the flow, not a GPU's figures)" if dry else "one GPU node"
    shape, plan, engine = result["shape"], result["plan"], result["engine"]
    parts = [f"# The served app, {mode}: {result['stamp']} on {result['environment']['host']}\n",
             f"```\n{format_environment(result['environment'])}\n```\n"]  # fmt: skip
    if result.get("error"):
        parts.append(f"**Not completed:**\n\n```\n{result['error']}\n```\n")
    for name, text in (result.get("replica_logs") or {}).items():
        parts.append(f"The last lines of `{name}`:\n\n```\n{text}\n```\n")
    parts += [
        "## Shape\n",
        f"`{result['config_source']}` as served here (models from `{result['models_dir']}`): {shape['describe']}; "
        f"Ray given {shape['cores']} CPUs, {shape['gpus']} GPU(s) and `cpu_pool` {shape['cpu_pool']}. "
        f"{shape['why']}\n",
        f"Ingress: {fmt(result.get('ingress'))}. Ray up in {fmt(result['node'].get('ray_start'))} s, the app ready "
        f"{fmt(result['node'].get('ready'))} s after `serve deploy`; the whole run {fmt(result.get('wall_s'))} s.\n",
        f"Load: wrk, {plan['warmup_s']:g} s warm-up then {plan['duration_s']:g} s per throughput step (single "
        f"c={plan['concurrency']['single']}, 16 images per request c={plan['concurrency']['batch16']}: "
        f"{plan['why_concurrency']}); c=1: {plan['c1_requests']} single-image requests per size after "
        f"{plan['c1_warmup']} dropped. JPEGs of the sample photographs, quality 90.\n",
        "## Verdict\n",
        *(f"- {verdict.line(v)}" for v in result["verdicts"].values()),
        "",
        f"Engine rate: {fmt(engine.get('rates'))} img/s at batch {verdict.BATCH} (`{engine.get('file')}`"
        f"{'; ' + engine['error'] if engine.get('error') else ''}).\n",
        "## What the Classifiers say they run (GET /v1/models)\n",
        markdown_table(VARIANT_HEADERS, variant_rows(result.get("models"))),
        "## Throughput steps\n",
        markdown_table(STEP_HEADERS, throughput_rows(result["throughput_steps"])),
        "## CPU per process group during each throughput step: cores used (share of the cores given)\n",
        markdown_table(*group_rows(result["throughput_steps"]), digits=2),
        "Cores given: num_replicas x num_cpus of each deployment, HAProxy's threads (RAY_SERVE_HAPROXY_NBTHREAD), "
        "wrk's threads; none for Serve's actors and Ray's daemons. A group at >= 90% of its cores is the limit.\n",
    ]
    for step in result["latency_steps"]:
        lat = step.get("latency_ms") or {}
        parts += [
            f"## c=1, single {step['size']}: Server-Timing (ms)\n",
            f"{step['ok']} of {step['requests']} answered 200, errors {fmt(step.get('errors') or 'none')}; client "
            f"latency p50 {fmt(lat.get('p50_ms'), 2)}, p99 {fmt(lat.get('p99_ms'), 2)} ms.\n",
            markdown_table(["entry", "p50", "p99", "mean", "requests"], timing_rows(step), digits=2),
        ]
    if png:
        parts.append(f"## Plot\n\n![img/s per step against the engine's rate; CPU cores per process group]({png})\n")
    return "\n".join(parts)


def plot(result: dict[str, Any], png: Path) -> Path:
    """img/s per throughput step against the engine's rate (and its 80%); below, cores used per group per step."""
    plt = pyplot()
    steps = result["throughput_steps"]
    names = [step_name(s) for s in steps]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 8))
    top.bar(names, [s.get("images_per_s") or 0 for s in steps], color="tab:blue")
    for i, s in enumerate(steps):
        top.text(i, s.get("images_per_s") or 0, f"{s.get('images_per_s') or 0:.0f}", ha="center", va="bottom")
    if (rate := result["engine"].get("reference")) is not None:
        top.axhline(rate, color="tab:red", label=f"engine: {verdict.REFERENCE} batch {verdict.BATCH}, {rate:.0f} img/s")
        top.axhline(rate * verdict.THROUGHPUT_GOAL, color="tab:red", ls="--", label="80% of it")
        top.legend(fontsize=8)
    top.set_ylabel("images/s served")
    mode = "CPU dry run" if result["dry_run"] else "GPU node"
    top.set_title(f"{mode}: served throughput, {result['stamp']}", fontsize=9)
    groups = list(dict.fromkeys(g for s in steps for g in s.get("groups") or {}))
    width = 0.8 / max(1, len(groups))
    for j, g in enumerate(groups):
        used = [((s.get("groups") or {}).get(g) or {}).get("cores_used") or 0 for s in steps]
        bottom.bar([i + j * width - 0.4 + width / 2 for i in range(len(steps))], used, width, label=g)
    bottom.set_xticks(range(len(steps)), names)
    bottom.set_ylabel("CPU cores used")
    bottom.legend(fontsize=7, ncol=3)
    return save_figure(fig, png)


def write(result: dict[str, Any], out_dir: Path, stem_name: str) -> str:
    """JSON, Markdown and PNG under `out_dir`; the Markdown returned."""
    stem = out_dir / stem_name
    png = None
    if result["throughput_steps"]:
        plot(result, Path(f"{stem}.png"))
        png = f"{stem_name}.png"
    markdown = to_markdown(result, png)
    print(write_report(stem, result, markdown) + (f" and {stem}.png" if png else ""))
    return markdown
