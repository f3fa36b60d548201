"""The load: throughput steps sent by wrk, and c=1 steps sent one at a time to read the server's own timings.

Throughput: for each of single images (/v1/classify, the raw JPEG) and 16-image requests (/v1/classify/batch,
multipart) at 640x480 and 1920x1080, one closed-loop wrk step (benchmarks/load.py's `wrk_step`, benchmarks/wrk.lua)
after a warm-up, with the CPU of every process group (benchmarks/gpu_serve/groups.py) and the GPU (nvidia-smi) read
around its measured window. Concurrency: enough in flight to keep every Router's coalescer full, so the node, not the
client, sets the pace: single images 16 per Router replica (a full group of coalesce_max 16 forming while the
previous ones run), at least 32; 16-image requests 4 per Router replica (each already a whole group), at least 8.
On 16 cores (8 Routers) that is c=128 and c=32.

Latency: ~200 single-image requests one after another per size (a Python client: the time is the server's, read
from each reply's Server-Timing header, benchmarks/gpu_serve/timing.py), warm-up requests dropped.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import httpx

from benchmarks.gpu_serve import gpu, groups, timing
from benchmarks.load import Workload, wrk_step
from benchmarks.report import fmt
from benchmarks.stats import latency_summary

SIZES = {"640x480": (640, 480), "1080p": (1920, 1080)}
KINDS = {"single": 1, "batch16": 16}
PER_ROUTER = {"single": 16, "batch16": 4}  # requests in flight per Router replica (above)
AT_LEAST = {"single": 32, "batch16": 8}
WRK_THREADS = 2  # benchmarks/load.py: wrk -t min(c, 2)


# A CPU dry run's: enough to exercise the path, little enough that a quarter-core Classifier answers within the
# Router's 5 s deadline (inference_timeout_s) at ~30-50 img/s.
DRY_RUN = {"single": 8, "batch16": 2}
WHY = "16 single-image requests per Router replica, 4 sixteen-image ones, so every Router's coalescer stays full"
WHY_DRY_RUN = "a dry run's: enough to run the path, few enough for a quarter-core Classifier within the 5 s deadline"


def concurrency(kind: str, routers: int, dry_run: bool = False) -> int:
    """The throughput step's concurrency for `kind` with `routers` Router replicas (the module's docstring: why)."""
    return DRY_RUN[kind] if dry_run else max(AT_LEAST[kind], PER_ROUTER[kind] * routers)


@dataclass(frozen=True)
class Plan:
    duration_s: float
    warmup_s: float
    c1_requests: int
    c1_warmup: int
    concurrency: dict[str, int]  # per kind
    timeout_s: float = 30.0


# What the steps' own time is made of beside their measured seconds (measure_s): a c=1 request's round trip, bounded
# generously (a GPU node answers a 1080p image in ~10-20 ms; the dry run's quarter cores in ~50-100), and each
# throughput step's start and stop around its warm-up and window (wrk, the nvidia-smi sampler, the CPU readings).
C1_REQUEST_S = {"gpu": 0.05, "dry_run": 0.3}
STEP_OVERHEAD_S = 3.0


def measure_s(plan: Plan, dry_run: bool = False) -> float:
    """An upper estimate of the c=1 steps and the throughput steps together: what gpu_serve's --time-limit keeps
    for them before it sets the ready deadline."""
    c1 = len(SIZES) * (plan.c1_requests + plan.c1_warmup) * C1_REQUEST_S["dry_run" if dry_run else "gpu"]
    return c1 + len(SIZES) * len(KINDS) * (plan.warmup_s + plan.duration_s + STEP_OVERHEAD_S)


def throughput_step(
    url: str,
    kind: str,
    size: str,
    plan: Plan,
    pids: Callable[[], Iterable[int]],
    given: dict[str, float | None],
) -> dict[str, Any]:
    """One wrk step: img/s, req/s, latency, errors (load.py's step), and beside it the CPU per process group and the
    GPU's utilisation and memory over the measured window."""
    wl = Workload(url, None, KINDS[kind], plan.timeout_s, sizes=(SIZES[size],))
    c, sampler, readings = plan.concurrency[kind], gpu.Sampler(), dict[str, Any]()

    def cpu() -> float:  # wrk_step calls it just before and just after the measured run
        now = groups.read_cpu(pids())
        if "before" not in readings:
            readings.update(before=now, t0=time.perf_counter())
            sampler.start()
        else:
            readings.update(after=now, t1=time.perf_counter(), gpu=sampler.stop())
        return sum(cpu_s for _, cpu_s in now.values())

    print(f"  {kind} {size}: c={c}, {plan.duration_s:g} s", flush=True)
    try:
        step = wrk_step(wl, c, plan.duration_s, plan.warmup_s, cpu)
    finally:
        sampler.stop()
    spent = groups.cpu_by_group(readings["before"], readings["after"])
    spent[groups.WRK] = step.get("client_cpu_s") or 0.0
    wrk_given: dict[str, float | None] = {groups.WRK: float(min(c, WRK_THREADS))}
    step["groups"] = groups.usage(spent, readings["t1"] - readings["t0"], given | wrk_given)
    return {"kind": kind, "size": size, **step, "gpu": readings.get("gpu")}


def latency_step(url: str, size: str, plan: Plan) -> dict[str, Any]:
    """Single images one at a time: the client's latency, and the server's Server-Timing per stage."""
    payloads = Workload(url, None, 1, plan.timeout_s, sizes=(SIZES[size],)).payloads()
    latencies, timings, errors = [], [], Counter[str]()
    with httpx.Client(timeout=plan.timeout_s) as client:
        for i in range(plan.c1_warmup + plan.c1_requests):
            body, headers = payloads[i % len(payloads)]
            t0 = time.perf_counter()
            try:
                r = client.post(url, content=body, headers=headers)
            except httpx.HTTPError as e:
                errors[type(e).__name__] += i >= plan.c1_warmup
                continue
            took = time.perf_counter() - t0
            if i < plan.c1_warmup:
                continue
            if r.status_code != 200:
                errors[str(r.status_code)] += 1
                continue
            latencies.append(took)
            timings.append(timing.parse(r.headers.get("server-timing")))
    step: dict[str, Any] = {"kind": "single", "size": size, "concurrency": 1, "requests": plan.c1_requests}
    step["ok"] = len(latencies)
    step |= {"errors": dict(+errors), "latency_ms": latency_summary(latencies)}
    step["server_timing"] = timing.summarise([t for t in timings if t])
    total = step["server_timing"].get(timing.TOTAL, {})
    p50 = total.get("p50_ms")
    print(f"  c=1 single {size}: server total p50 {fmt(p50, 2)} ms, {dict(+errors) or 'no'} errors", flush=True)
    return step
