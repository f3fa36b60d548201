"""The two targets of the served app on a GPU node, and, where one is missed, what holds it back, from evidence.

Throughput: 16-image requests of 640x480 JPEGs served at >= 80% of the engine's own rate (gpu_check's `cuda-fp32`
target at batch 64: what ONNX Runtime does with the GPU when nothing else runs). Latency: a single 640x480 image at
c=1, the server's own `total` (Server-Timing) p50 under 5 ms.

What holds a step back, in this order: errors (a step that fails requests is not measuring the path); a process group
at >= 90% of its cores (it cannot go faster: the Routers, the Preprocessors' decode, a Classifier's host side,
HAProxy's one thread, or wrk itself); the GPU busy >= 90% of the time (the served engine is the limit); else nothing is
saturated and the work in flight is too little to fill the node, said with the stage a request's server time is
mostly made of (Server-Timing at c=1: queue, inference, preprocess, ...). For the latency target, that stage itself.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from benchmarks.gpu_serve import groups, timing

REFERENCE, BATCH = "cuda-fp32", 64
THROUGHPUT_GOAL = 0.8  # served img/s over the engine's, 640x480, 16 images per request
LATENCY_GOAL_MS = 5.0  # the server's total p50, one 640x480 image at c=1
GPU_BUSY_PCT = 90.0
ERROR_SHARE = 0.01  # errors on more than 1% of a step's requests: the step is about the errors


def engine_rates(result: dict[str, Any], batch: int = BATCH) -> dict[str, float]:
    """{target: img/s at `batch`} of every target of a gpu_check result that measured that batch size."""
    out = {}
    for name, target in (result.get("targets") or {}).items():
        for b in target.get("batches") or []:
            if b.get("batch") == batch and b.get("images_per_s"):
                out[name] = float(b["images_per_s"])
    return out


NONE = Path("none")  # --engine-result none: not judged


def card(environment: dict[str, Any]) -> str:
    """The GPU model a run measured on, as benchmarks/environment.py describes it ("NAME, MEM MiB, driver D"), less
    the driver: "NAME, MEM MiB" (an H100 80GB and an H200 differ; two H200s are the same card). "" on no GPU."""
    gpus = environment.get("gpus") or []
    return ", ".join(str(gpus[0]).split(", ")[:2]) if gpus else ""


def find_engine_result(results_dir: Path, dry_run: bool, on: str | None = None) -> Path | None:
    """The newest gpu_check result in `results_dir` (a dry run's for a dry run: the same engines on the CPU) that
    measured the reference target at batch 64, on the card `on` when given. Result names start with their stamp, so
    names sort by time."""
    pattern = "*-gpu-dryrun.json" if dry_run else "*-gpu.json"
    for path in sorted(results_dir.glob(pattern), key=lambda p: p.name, reverse=True):
        try:
            result = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if REFERENCE in engine_rates(result) and (on is None or card(result.get("environment") or {}) == on):
            return path
    return None


def read_engine(path: Path | None, on: str | None = None) -> dict[str, Any]:
    """The engine's figures from a gpu_check result: its file, its card, every target's img/s at batch 64, the
    reference's. A result from another card than `on` (this run's) gives no reference: an engine rate is the card's."""
    if path is None or path == NONE:
        why = "no gpu_check result given (--engine-result none)" if path == NONE else "no gpu_check result found"
        return {"file": None, "rates": {}, "reference": None, "error": why}
    try:
        result = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        return {"file": str(path), "rates": {}, "reference": None, "error": f"{type(e).__name__}: {e}"}
    rates, measured_on = engine_rates(result), card(result.get("environment") or {})
    out = {"file": str(path), "card": measured_on, "rates": rates, "reference": rates.get(REFERENCE), "batch": BATCH}
    if on is not None and measured_on != on:
        out |= {"reference": None, "error": f"measured on {measured_on or 'no GPU'}, this run is on {on or 'no GPU'}"}
    return out


def engine_for(
    given: Path | None, dirs: tuple[Path, ...], environment: dict[str, Any], dry_run: bool
) -> dict[str, Any]:
    """The engine's figures this run is judged against: `given` (the GPU kit passes the gpu_check of the same node),
    else the newest result in `dirs` measured on this run's card; never another card's."""
    on = card(environment)
    if given is not None:
        return read_engine(given, on)
    found = (find_engine_result(d, dry_run, on) for d in dict.fromkeys(dirs))
    return read_engine(next((f for f in found if f), None), on)


def held_back(step: dict[str, Any], c1: dict[str, Any] | None) -> dict[str, Any]:
    """What holds a throughput step back: {"stage": a short name, "why": the evidence in words}."""
    errors, requests = sum((step.get("errors") or {}).values()), step.get("requests") or 0
    if errors and errors > ERROR_SHARE * max(requests, 1):
        return {"stage": "errors", "why": f"{errors} of {requests} requests failed ({step['errors']})"}
    full = groups.saturated(step.get("groups") or {})
    if full:
        g, share = full[0]
        given = step["groups"][g]["cores_given"]
        more = "".join(f"; {o} at {s:.0%}" for o, s in full[1:])
        return {"stage": g, "why": f"{g} at {share:.0%} of its {given:g} core(s){more}"}
    gpu = step.get("gpu")
    if gpu and gpu["util_mean_pct"] >= GPU_BUSY_PCT:
        return {"stage": "GPU", "why": f"the GPU busy {gpu['util_mean_pct']:.0f}% of the time (mean over the step)"}
    busiest = max(
        ((g, u["share"]) for g, u in (step.get("groups") or {}).items() if u.get("share") is not None),
        key=lambda x: x[1],
        default=None,
    )
    parts = [f"busiest group {busiest[0]} at {busiest[1]:.0%} of its cores" if busiest else "no group measured"]
    parts.append(f"GPU busy {gpu['util_mean_pct']:.0f}%" if gpu else "GPU utilisation n/a")
    if step.get("median_batch_size") is not None:
        parts.append(f"median Classifier batch {step['median_batch_size']:g}")
    slowest = timing.slowest_stage((c1 or {}).get("server_timing") or {})
    if slowest:
        parts.append(f"at c=1 a request's server time is mostly {slowest[0]} ({slowest[1]:.2f} ms p50)")
    why = "nothing saturated: too little work in flight to fill the node; " + ", ".join(parts)
    return {"stage": "none saturated", "why": why}


def throughput_verdict(
    step: dict[str, Any] | None, engine: dict[str, Any], c1: dict[str, Any] | None
) -> dict[str, Any]:
    """Served img/s of 640x480 16-image requests against the engine's rate at batch 64."""
    out: dict[str, Any] = {"target": f"640x480 batch16 img/s >= {THROUGHPUT_GOAL:.0%} of {REFERENCE} at batch {BATCH}"}
    served, reference = (step or {}).get("images_per_s"), engine.get("reference")
    out |= {"served_img_s": served, "engine_img_s": reference}
    if not served or not reference:
        return out | {"share": None, "met": None, "held_back": None}
    share = served / reference
    met = share >= THROUGHPUT_GOAL
    return out | {"share": round(share, 3), "met": met, "held_back": None if met else held_back(step or {}, c1)}


def latency_verdict(c1: dict[str, Any] | None) -> dict[str, Any]:
    """The server's total p50 for one 640x480 image at c=1 against LATENCY_GOAL_MS; where missed, its slowest stage."""
    out: dict[str, Any] = {"target": f"c=1 single 640x480 server total p50 < {LATENCY_GOAL_MS:g} ms"}
    summary = (c1 or {}).get("server_timing") or {}
    p50 = summary.get(timing.TOTAL, {}).get("p50_ms")
    if p50 is None:
        return out | {"p50_ms": None, "met": None, "held_back": None}
    met = p50 < LATENCY_GOAL_MS
    slowest = timing.slowest_stage(summary)
    why = None
    if not met and slowest:
        stages = ", ".join(f"{n} {summary[n]['p50_ms']:.2f}" for n in (*timing.STAGES, timing.OTHER) if n in summary)
        why = {"stage": slowest[0], "why": f"{slowest[0]} is {slowest[1]:.2f} of {p50:.2f} ms (p50 ms: {stages})"}
    return out | {"p50_ms": p50, "met": met, "held_back": why}


def line(v: dict[str, Any]) -> str:
    """One verdict line for the Markdown and the console."""
    if v.get("met") is None:
        return f"{v['target']}: not judged (a figure is missing)"
    if "share" in v:
        figure = f"{v['share']:.0%} ({v['served_img_s']:.1f} / {v['engine_img_s']:.1f} img/s)"
    else:
        figure = f"{v['p50_ms']:.2f} ms"
    verdict = "met" if v["met"] else "NOT met"
    held = f"; held back by **{v['held_back']['stage']}**: {v['held_back']['why']}" if v.get("held_back") else ""
    return f"{v['target']}: {figure}: **{verdict}**{held}"
