"""The served app measured on one GPU node: configs/prod.yaml's deployments at a fixed shape, under wrk.

    python -m benchmarks.gpu_serve                      # on a GPU node (1 GPU, its cores), ~3-5 minutes
    python -m benchmarks.gpu_serve --cpu-dry-run        # the same code paths on this machine's CPUs, ~1.5 minutes
    python -m benchmarks.gpu_serve --routers 8 --preprocessors 7 --duration 20 --engine-result FILE --out DIR

Derives the served config from --config (benchmarks/gpu_serve/shape.py), starts Ray on this node as
docs/operating.md "A Ray cluster of your own" says with the admission front (node.py), deploys, waits until every
deployment is healthy, captures GET /v1/models, runs the c=1 Server-Timing steps and the four throughput steps
(steps.py), stops everything it started, and writes
benchmarks/results/<stamp>-<host>-gpu-serve{,-dryrun}.{json,md,png} with the verdicts against the engine's own rate
(verdict.py). Exit 0: the run completed (a missed target is a result); 1: the app could not be served or measured
(the report says why); 2: it cannot run here at all; 3: deployed, but the app did not become ready (`serve status`
with the replicas' errors and the last lines of the log of each replica still starting are printed and kept in the
report: a retry with --no-cuda-graphs is what the GPU kit does next).

--time-limit S bounds the whole run (Ray's start, the deploy, readiness, the steps, the stop, the report): the ready
deadline is what is left of S once the steps' own time (steps.measure_s) and the start and stop are set aside, so a
run that does not become ready still stops Ray, prints why and writes its report inside S."""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from types import FrameType
from typing import Any

import httpx
import yaml

from benchmarks.environment import RESULTS_DIR, host_name, print_environment, stamp, usable_cores
from benchmarks.gpu_serve import groups, report, steps, verdict
from benchmarks.gpu_serve.gpu import gpu_count
from benchmarks.gpu_serve.node import CPU_POOL, REPO, Node, NodeError, NotReady, node_error, serve_port
from benchmarks.gpu_serve.shape import (
    GPU_DECODE_CLASSIFIER_CPUS,
    PREPROCESSOR_SHARE,
    RESERVED_CORES,
    Shape,
    default_counts,
    derive,
    gpu_decode_routers,
    model_paths,
)
from benchmarks.gpu_serve.shape import given_cores as deployment_cores
from benchmarks.load import Workload

NOT_READY = 3  # the exit status of a run whose app did not become ready
GPU = {"duration_s": 20.0, "warmup_s": 3.0, "c1_requests": 200, "c1_warmup": 10, "ready_s": 900.0}
DRY = {"duration_s": 5.0, "warmup_s": 1.0, "c1_requests": 20, "c1_warmup": 3, "ready_s": 180.0}


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.gpu_serve", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--config", type=Path, default=REPO / "configs" / "prod.yaml", help="the Serve config to serve")
    default_models = Path(os.environ.get("APP_MODEL_DIR") or REPO / "models")
    p.add_argument("--models", type=Path, default=default_models, help="model files ($APP_MODEL_DIR or ./models)")
    p.add_argument("--cpu-dry-run", action="store_true", help="device cpu, no GPU, 1 replica each, short steps")
    p.add_argument(
        "--decode-in",
        choices=("preprocessor", "gpu"),
        default="preprocessor",
        help="where images are decoded: prod.yaml's Preprocessors, or the Classifiers' batches on the GPU (decode_in: "
        "gpu; needs nvImageCodec on the node; a dry run uses the host stand-in)",
    )
    p.add_argument("--routers", type=int, help="Router replicas (default: from the node's cores; dry run 1)")
    p.add_argument("--preprocessors", type=int, help="Preprocessor replicas (default: from the cores; dry run 1)")
    p.add_argument("--duration", type=float, help="measured seconds per throughput step (20; dry run 5)")
    p.add_argument("--single-concurrency", type=int, help="single-image step's c (default 16 per Router, >= 32)")
    p.add_argument("--batch-concurrency", type=int, help="16-image step's c (default 4 per Router, >= 8)")
    p.add_argument("--ready-timeout", type=float, help="seconds for every deployment to be healthy (900; dry run 180)")
    p.add_argument(
        "--engine-result",
        type=Path,
        help="gpu_check's result JSON to judge against ('none': not judged); default: the newest in --out or "
        "benchmarks/results/ measured on this node's GPU model",
    )
    p.add_argument("--no-cuda-graphs", action="store_true", help="serve with args.cuda_graphs.enabled false")
    p.add_argument("--time-limit", type=float, help="seconds for the whole run; the ready deadline follows from it")
    p.add_argument("--out", type=Path, default=RESULTS_DIR, help="where the report goes")
    args = p.parse_args(argv)
    for name in ("routers", "preprocessors", "single_concurrency", "batch_concurrency"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    return args


def shape_of(args: argparse.Namespace, prod: dict[str, Any], cores: int) -> tuple[Shape, str]:
    """The replica counts (flags, else from the cores) and the sentence that says where they came from."""
    gpu_decode = args.decode_in == "gpu"
    if args.cpu_dry_run:
        routers, pre = args.routers or 1, 0 if gpu_decode else args.preprocessors or 1
        why = (
            "A CPU dry run: one replica of each, every one num_cpus 0.25, Classifier batches of at most 16 and the CPU "
            "INT8 build in place of the TensorRT one, so all of it starts and runs on this machine's cores."
        )
    elif gpu_decode:
        d_routers = gpu_decode_routers(cores, prod)
        routers, pre = args.routers or d_routers, 0
        why = (
            f"decode_in: gpu, default from {cores} cores: one Classifier per variant at {GPU_DECODE_CLASSIFIER_CPUS:g} "
            f"CPUs (headers, the CPU path for what the GPU declines), {RESERVED_CORES:g} cores kept for wrk and "
            f"HAProxy, the rest to the Routers at prod.yaml's num_cpus, capped at its max_replicas: {d_routers} "
            "Routers, no Preprocessor" + ("" if args.routers is None else "; overridden by --routers") + "."
        )
    else:
        d_routers, d_pre = default_counts(cores, prod)
        routers, pre = args.routers or d_routers, args.preprocessors or d_pre
        why = (
            f"Default from {cores} cores: one Classifier per variant at prod.yaml's CPU, {RESERVED_CORES:g} cores kept "
            f"for wrk (2 threads) and HAProxy (1 thread), the rest {PREPROCESSOR_SHARE:.0%} to the Preprocessors "
            "(decode: ~2-4 CPU-ms per image) and the remainder to the Routers (~1-2 CPU-ms per request), each at "
            f"prod.yaml's num_cpus, capped at its max_replicas: {d_routers} Routers and {d_pre} Preprocessors"
            + ("" if (args.routers, args.preprocessors) == (None, None) else "; overridden by the flags")
            + "."
        )
    shape = Shape(routers, pre, dry_run=args.cpu_dry_run, decode_in=args.decode_in, cuda_graphs=not args.no_cuda_graphs)
    return shape, why + (" CUDA graphs off (--no-cuda-graphs)." if args.no_cuda_graphs else "")


def plan_of(args: argparse.Namespace, shape: Shape) -> steps.Plan:
    base = DRY if args.cpu_dry_run else GPU
    c = {k: steps.concurrency(k, shape.routers, shape.dry_run) for k in steps.KINDS}
    c = {"single": args.single_concurrency or c["single"], "batch16": args.batch_concurrency or c["batch16"]}
    duration = args.duration if args.duration is not None else base["duration_s"]
    return steps.Plan(duration, base["warmup_s"], int(base["c1_requests"]), int(base["c1_warmup"]), c)


# Set aside from --time-limit for what is not waiting: Ray's start and the deploy, the stop (ServerProcess's 30 s grace
# at most), the report. What remains after the steps' own time is the ready deadline; under MIN_READY_S the run cannot
# show anything and does not start.
START_S, STOP_S, REPORT_S, MIN_READY_S = 30.0, 35.0, 5.0, 30.0


def ready_deadline(args: argparse.Namespace, plan: steps.Plan) -> float:
    """Seconds the deployments get to become healthy: --ready-timeout, bounded by what --time-limit leaves."""
    own = args.ready_timeout or (DRY if args.cpu_dry_run else GPU)["ready_s"]
    if args.time_limit is None:
        return own
    left = args.time_limit - START_S - STOP_S - REPORT_S - steps.measure_s(plan, args.cpu_dry_run)
    if left < MIN_READY_S:
        measuring = steps.measure_s(plan, args.cpu_dry_run)
        raise ValueError(
            f"--time-limit {args.time_limit:g} s leaves {left:.0f} s to become ready: at least {MIN_READY_S:g} s "
            f"(the steps take ~{measuring:.0f} s)"
        )
    return min(own, left)


def missing_files(served: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(required files missing, fallback files missing): a fallback's file is needed only when it runs."""
    gone = [f"{k}: {v}" for k, v in model_paths(served).items() if not Path(v).is_file()]
    fallbacks = [g for g in gone if g.split(":", 1)[0].endswith(".fallback")]
    return [g for g in gone if g not in fallbacks], fallbacks


def probe(url: str) -> bool:
    """One real request through the whole path (HAProxy, a Router, a Preprocessor, a Classifier) answers 200."""
    body, headers = Workload(url + "/v1/classify", sizes=(steps.SIZES["640x480"],)).payloads()[0]
    try:
        return httpx.post(url + "/v1/classify", content=body, headers=headers, timeout=30).status_code == 200
    except httpx.HTTPError:
        return False


def models_json(url: str) -> dict[str, Any] | str:
    """GET /v1/models as the Router answered it, or why not."""
    try:
        r = httpx.get(url + "/v1/models", timeout=30)
        return r.json() if r.status_code == 200 else f"HTTP {r.status_code}: {r.text[:300]}"
    except (httpx.HTTPError, ValueError) as e:
        return f"{type(e).__name__}: {e}"


def ingress_of(models: dict[str, Any] | str) -> dict[str, Any] | str:
    if not isinstance(models, dict):
        return "n/a"
    front = models.get("admission_front") or {}
    return {"runs": (models.get("ingress") or {}).get("runs"), "front_in_place": front.get("in_place")}


def measure(node: Node, plan: steps.Plan, served: dict[str, Any]) -> tuple[list[Any], list[Any]]:
    """The c=1 steps (an idle node), then the throughput steps."""
    url = node.url + "/v1/classify"
    latency = [steps.latency_step(url, size, plan) for size in steps.SIZES]
    nbthread = int(node.env.get("RAY_SERVE_HAPROXY_NBTHREAD") or 1)
    given = groups.given_cores(deployment_cores(served), nbthread, steps.WRK_THREADS)
    throughput = [
        steps.throughput_step(url, kind, size, plan, node.pids, given) for kind in steps.KINDS for size in steps.SIZES
    ]
    return latency, throughput


def unmeasured(latency: list[dict[str, Any]], throughput: list[dict[str, Any]]) -> list[str]:
    """The steps in which no request succeeded: the app was not measured there (errors alone are a result)."""
    return [f"{s['kind']} {s['size']} c={s['concurrency']}: {s['errors']}" for s in latency + throughput if not s["ok"]]


def _terminate(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")  # SIGTERM as Ctrl-C: the node is stopped on the way out


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    t_start = time.perf_counter()
    if shutil.which("wrk") is None:
        print("error: the throughput steps are sent by wrk, not on PATH (apt-get install wrk)", file=sys.stderr)
        return 2
    cores, gpus = usable_cores(), 0 if args.cpu_dry_run else gpu_count()
    if not args.cpu_dry_run and gpus == 0:
        print("error: no GPU (nvidia-smi lists none); --cpu-dry-run runs the same flow on the CPUs", file=sys.stderr)
        return 2
    prod = yaml.safe_load(args.config.read_text())
    shape, why = shape_of(args, prod, cores)
    plan = plan_of(args, shape)
    try:
        ready_s = ready_deadline(args, plan)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    tmp = Path(tempfile.mkdtemp(prefix="gsv-", dir="/tmp"))  # short: Ray's and HAProxy's socket paths live under it
    port = serve_port()
    served = derive(prod, shape, models=args.models.resolve(), trt_cache=tmp / "trt-cache", http_port=port,
                    grpc_port=port + 95)  # fmt: skip
    required, fallbacks = missing_files(served)
    if required:
        print(f"error: model files missing: {'; '.join(required)} (--models DIR)", file=sys.stderr)
        shutil.rmtree(tmp, ignore_errors=True)
        return 2
    if fallbacks:
        print(f"warning: a fallback's model file is missing (used only if it runs): {'; '.join(fallbacks)}", flush=True)
    env = print_environment()
    print(f"shape: {shape.describe()}\n{why}\nplan: {plan}\nrun directory: {tmp}", flush=True)
    node = Node(tmp, served, cores, gpus, port)
    result: dict[str, Any] = {"stamp": stamp(), "dry_run": args.cpu_dry_run, "environment": env}
    result |= {"config_source": str(args.config), "models_dir": str(args.models.resolve()), "served_config": served}
    result["shape"] = {"routers": shape.routers, "preprocessors": shape.preprocessors, "describe": shape.describe()}
    result["shape"]["decode_in"] = shape.decode_in
    result["shape"] |= {"why": why, "cores": cores, "gpus": gpus, "cpu_pool": CPU_POOL}
    result["shape"]["given_cores"] = deployment_cores(served)
    why_c = steps.WHY_DRY_RUN if shape.dry_run else steps.WHY
    result["plan"] = {
        **plan.__dict__,
        "why_concurrency": why_c,
        "ready_deadline_s": ready_s,
        "time_limit_s": args.time_limit,
    }
    result |= {"latency_steps": [], "throughput_steps": [], "error": None, "models": None, "ingress": None}
    previous = signal.signal(signal.SIGTERM, _terminate)
    failed, not_ready = True, False
    try:
        node.prepare()
        node.start()
        node.deploy()
        print(f"deployed; waiting for every deployment to be healthy (at most {ready_s:g} s)...", flush=True)
        status = node.wait_healthy(ready_s, lambda: probe(node.url))
        print(f"ready: {node.timings_s}", flush=True)
        result["serve_status"] = status
        models = models_json(node.url)
        result["models"] = models
        result["latency_steps"], result["throughput_steps"] = measure(node, plan, served)
        result["models_after"] = models_json(node.url)  # the ingress report once requests have passed the front
        result["ingress"] = ingress_of(result["models_after"])
        if empty := unmeasured(result["latency_steps"], result["throughput_steps"]):
            raise NodeError(f"no request succeeded in {'; '.join(empty)}")
        failed = False
    except NotReady as e:
        result["error"], result["replica_logs"], not_ready = node_error(e), e.logs, True
        print(f"FAILED: {result['error']}", file=sys.stderr, flush=True)
        for name, tail in e.logs.items():
            print(f"--- the last lines of {name} ---\n{tail}", file=sys.stderr, flush=True)
    except (NodeError, ConnectionError, OSError) as e:
        result["error"] = node_error(e)
        print(f"FAILED: {result['error']}", file=sys.stderr, flush=True)
    except KeyboardInterrupt as e:
        result["error"] = f"interrupted ({str(e) or 'Ctrl-C'})"
        print(f"\n{result['error']}: stopping the node", file=sys.stderr, flush=True)
    finally:
        result["node"] = {**node.timings_s, "stop": node.stop()}
        signal.signal(signal.SIGTERM, previous)
        print(f"stopped: {result['node']['stop']}", flush=True)
    c1 = next((s for s in result["latency_steps"] if s["size"] == "640x480"), None)
    batch = next((s for s in result["throughput_steps"] if (s["kind"], s["size"]) == ("batch16", "640x480")), None)
    result["engine"] = verdict.engine_for(args.engine_result, (args.out, RESULTS_DIR), env, args.cpu_dry_run)
    result["verdicts"] = {"throughput": verdict.throughput_verdict(batch, result["engine"], c1)}
    result["verdicts"]["latency"] = verdict.latency_verdict(c1)
    result["wall_s"] = round(time.perf_counter() - t_start, 1)
    suffix = ("-gpu-decode" if shape.decode_in == "gpu" else "") + ("-dryrun" if args.cpu_dry_run else "")
    name = f"{result['stamp']}-{host_name()}-gpu-serve{suffix}"
    print(report.write(result, args.out, name))
    if failed:
        print(f"the run's files are kept for a look: {tmp}", file=sys.stderr)
    else:
        node.remove_files()
    return NOT_READY if not_ready else 1 if failed else 0
