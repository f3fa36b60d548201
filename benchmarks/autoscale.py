"""Autoscaling under a load step: configs/prod.yaml's policies on a local multi-node Ray cluster.

    python -m benchmarks.autoscale                       # ~5 min: capacity, then steady / 4x step / back / idle
    python -m benchmarks.autoscale --step 60 --downscale-delay 30

The cluster of tests/test_cluster.py: a head with no CPUs, a CPU node advertising `cpu_pool` (Routers,
Preprocessors) and a node that declares two GPUs (Classifiers; no device here, so they run on the CPU EP). The
deployments keep prod.yaml's `target_ongoing_requests` and `upscale_delay_s`; `max_replicas` is cut to what these
nodes hold, and `downscale_delay_s` to --downscale-delay (prod's 120-600 s would make a run long; the mechanics
are the same). A closed loop first measures capacity C; then Poisson arrivals at C/4 (--steady s), C (the 4x step,
--step s), C/4 again, then none until every deployment is back at its min_replicas. Each second: replicas per
deployment (RUNNING and STARTING, from the Serve controller's status), what Serve's autoscaler exports (the ongoing
requests it counts per deployment and the replicas it wants, scraped from Ray's metrics port), the Router's in-flight
and waiting requests (its /v1/models), and the client's sent / 200 / 503 and p50/p99 by arrival second.

On a machine of few cores, more replicas add no cores: this shows when and how the policies react, not the
capacity a real cluster would gain. Writes benchmarks/results/<stamp>-<host>-autoscale.{json,md,png}.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import yaml

from app.front.instance import private_serve_env
from app.served_model import ModelFiles, default_files
from benchmarks.environment import REPO, RESULTS_DIR, host_name, print_environment, stamp
from benchmarks.load import MAX_INFLIGHT, Workload, closed_step, drive, poisson_schedule
from benchmarks.report import markdown_table, pyplot, save_figure, write_report
from benchmarks.stats import percentile

APP = "classifier"
DEPLOYMENTS = ("Router", "Preprocessor", "Classifier_fp32", "Classifier_int8")
# (min, max) replicas that fit the nodes below: CPU node 4 CPUs = 2 Routers x 0.5 + 3 Preprocessors x 1;
# GPU node 4 CPUs and 2 declared GPUs = 4 Classifiers x (1 CPU, 0.5 GPU).
FITTED = {"Router": (1, 2), "Preprocessor": (1, 3), "Classifier_fp32": (1, 2), "Classifier_int8": (1, 2)}
NODES = ({"num_cpus": 4, "resources": {"cpu_pool": 100}}, {"num_cpus": 4, "num_gpus": 2})


def prod_on_one_machine(
    model_files: ModelFiles,
    fixed: dict[str, int] | None = None,
    downscale_delay_s: float | None = None,
    look_back_s: float | None = None,
) -> dict[str, Any]:
    """configs/prod.yaml shrunk to fit one machine, placement settings untouched but the per-node Router cap.
    `fixed`: replicas per deployment (min = max; 1 where not named). Else prod's policies with FITTED bounds,
    `downscale_delay_s` and (when given) `look_back_s`. Targets follow prod's rules as the bounds they depend on
    shrink here: a Classifier's is its max_concurrent_batches, the Router's keeps its ratio to max_in_flight."""
    cfg = yaml.safe_load((REPO / "configs" / "prod.yaml").read_text())
    app = cfg["applications"][0]
    args = app["args"]
    args["variants"]["int8"]["model_path"] = str(model_files.int8)
    args["variants"]["fp32"]["model_path"] = str(model_files.fp32)
    args["model"]["labels_path"] = str(model_files.labels)
    args["device"] = "auto"  # CUDA when a GPU was granted; this machine has no CUDA, so ORT falls back
    args["require_gpu"] = False
    args.pop("speed_gate")  # measuring FP32 beside INT8 at start costs these 2 cores a CPU-minute
    for d in app["deployments"]:
        if d["name"].startswith("Classifier_"):
            d["user_config"]["max_batch_size"] = 4  # warm-up of 1..64 on one CPU thread takes a minute
            d["user_config"]["max_concurrent_batches"] = 1
            # Queue bounds are throughput x acceptable wait: prod's are sized for a GPU (~1000 img/s);
            # one CPU thread does ~60 img/s here, so the same wait needs queues ~20x shorter.
            d["max_ongoing_requests"] = 8
            d["max_queued_requests"] = 16
        if d["name"] == "Preprocessor":
            d["max_queued_requests"] = 32
        if d["name"] == "Router":
            router_share = d["autoscaling_config"]["target_ongoing_requests"] / d["user_config"]["max_in_flight"]
            d["user_config"]["max_in_flight"] = 48
        auto = d["autoscaling_config"]
        # The bounds below are this machine's: a new cluster's start at the maximum (prod's initial_replicas) is not,
        # nor prod's one Router per node (a cluster's availability), which one cpu_pool node would hold to one Router.
        auto.pop("initial_replicas", None)
        d.pop("max_replicas_per_node", None)
        if fixed is not None:
            auto["min_replicas"] = auto["max_replicas"] = fixed.get(d["name"], 1)
            continue
        auto["min_replicas"], auto["max_replicas"] = FITTED[d["name"]]
        auto["downscale_delay_s"] = downscale_delay_s
        if look_back_s is not None:
            auto["look_back_period_s"] = look_back_s
        if d["name"].startswith("Classifier_"):  # prod's rule: one group per batch slot (configs/prod.yaml)
            auto["target_ongoing_requests"] = d["user_config"]["max_concurrent_batches"]
        elif d["name"] == "Router":  # prod's share of max_in_flight
            auto["target_ongoing_requests"] = max(1, round(router_share * d["user_config"]["max_in_flight"]))
    return cfg


def replica_counts(deployment: Any) -> dict[str, int]:
    """RUNNING and STARTING replicas of one deployment in `serve.status()` (a DeploymentStatusOverview)."""
    states = {str(k).rsplit(".", 1)[-1]: v for k, v in deployment.replica_states.items()}
    return {"running": states.get("RUNNING", 0), "starting": states.get("STARTING", 0)}


def get_json(url: str, timeout_s: float = 5.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout_s) as r:
        return json.loads(r.read())


# Serve's autoscaler, as it exports itself: the ongoing requests it counts for a deployment (handles' queues and
# replicas together) and the replicas it decides on. Exported by the head node, where the controller runs.
AUTOSCALER_METRICS = {
    "ray_serve_autoscaling_total_requests": "ongoing",
    "ray_serve_autoscaling_desired_replicas": "desired",
}


def autoscaler_view(metrics_text: str) -> dict[str, dict[str, float]]:
    """{deployment: {"ongoing": n, "desired": n}} from a Prometheus scrape of Ray's metrics export."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            if sample.name in AUTOSCALER_METRICS and sample.labels.get("application", APP) == APP:
                out.setdefault(sample.labels["deployment"], {})[AUTOSCALER_METRICS[sample.name]] = sample.value
    return out


class Sampler:
    """Once a second, in a thread: replicas per deployment from the controller, the autoscaler's own metrics, the
    Router's admission state."""

    def __init__(self, base_url: str, metrics_url: str | None = None) -> None:
        self.base_url, self.rows, self._stop = base_url, list[dict[str, Any]](), threading.Event()
        self.metrics_url = metrics_url
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.t0 = time.perf_counter()

    def _run(self) -> None:
        from ray import serve

        while not self._stop.is_set():
            row: dict[str, Any] = {"t": round(time.perf_counter() - self.t0, 2)}
            try:
                deployments = serve.status().applications[APP].deployments
                for name in DEPLOYMENTS:
                    row[name] = replica_counts(deployments[name])
                if self.metrics_url:
                    with urllib.request.urlopen(self.metrics_url, timeout=5) as r:
                        row["autoscaler"] = autoscaler_view(r.read().decode())
                admission = get_json(self.base_url + "/v1/models").get("admission", {})
                row["router"] = {k: admission.get(k) for k in ("in_flight", "waiting", "finishing_per_s")}
            except Exception as e:  # a sample lost is written down, never fatal to the run
                row["error"] = f"{type(e).__name__}: {e}"[:200]
            self.rows.append(row)
            self._stop.wait(1.0)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def at_min(self) -> bool:
        last = self.rows[-1] if self.rows else {}
        return all(last.get(n, {}).get("running") == FITTED[n][0] and not last[n]["starting"] for n in DEPLOYMENTS)


def schedule(segments: list[tuple[str, float, float]]) -> list[float]:
    """Arrival offsets (s) of Poisson arrivals at each segment's rate, one segment after another."""
    out: list[float] = []
    start = 0.0
    for i, (_, rate, length) in enumerate(segments):
        out += [start + t for t in poisson_schedule(rate, length, 10**6, seed=i)] if rate > 0 else []
        start += length
    return out


def latency_figures(samples: list[Any]) -> dict[str, Any]:
    """p50 and p99 (ms) of the successes among `samples`, None without any."""
    ok = [s.latency_s * 1000 for s in samples if s.status == 200]
    return {"p50_ms": percentile(ok, 50) if ok else None, "p99_ms": percentile(ok, 99) if ok else None}


def per_second(samples: list[Any], length_s: float) -> list[dict[str, Any]]:
    """The client's view by arrival second: sent, answered 200 / 503 / otherwise, p50 and p99 of the 200s (ms)."""
    rows: list[dict[str, Any]] = []
    for sec in range(int(length_s) + 1):
        these = [s for s in samples if sec <= s.due < sec + 1]
        by = Counter(s.status for s in these)
        row = {
            "t": sec,
            "sent": len(these),
            "ok": by[200],
            "shed_503": by[503],
            "other": len(these) - by[200] - by[503],
        }
        rows.append(row | latency_figures(these))
    return rows


def reactions(
    timeline: list[dict[str, Any]], segments: list[tuple[str, float, float]], load_t0: float
) -> dict[str, Any]:
    """Per deployment: replicas before the step, most during it, seconds from the step's start to the first added
    replica RUNNING, and from the load's end to the last one gone."""
    bounds, start = {}, 0.0
    for name, _, length in segments:
        bounds[name] = (load_t0 + start, load_t0 + start + length)
        start += length
    step_from, load_end = bounds["step"][0], load_t0 + start
    out = {}
    for name in DEPLOYMENTS:
        rows = [(r["t"], r[name]["running"]) for r in timeline if name in r]
        before = max((n for t, n in rows if t <= step_from), default=None)
        up = next((t - step_from for t, n in rows if t > step_from and before is not None and n > before), None)
        peak = max((n for t, n in rows if t > step_from), default=None)
        last_above = [t for t, n in rows if t > load_end and n > FITTED[name][0]]
        down = (max(last_above) - load_end if last_above else 0.0) if rows and rows[-1][1] == FITTED[name][0] else None
        out[name] = {"before_step": before, "peak": peak, "scale_up_s": up, "back_to_min_s": down}
    return out


def plot(result: dict[str, Any], png: Path, title: str) -> None:
    fig, (rate, latency, replicas, seen) = pyplot().subplots(4, 1, figsize=(10, 10), sharex=True)
    t0 = result["load_t0_s"]
    client = result["client"]
    xs = [t0 + r["t"] for r in client]
    rate.plot(xs, [r["sent"] for r in client], label="sent/s", color="grey")
    rate.plot(xs, [r["ok"] for r in client], label="200/s")
    rate.plot(xs, [r["shed_503"] for r in client], label="503/s")
    nan = float("nan")
    latency.plot(xs, [(r["p50_ms"] or nan) / 1000 for r in client], label="p50 of 200s")
    latency.plot(xs, [(r["p99_ms"] or nan) / 1000 for r in client], label="p99 of 200s")
    samples = [r for r in result["timeline"] if "Router" in r]
    for name in DEPLOYMENTS:
        line = replicas.step([r["t"] for r in samples], [r[name]["running"] for r in samples], where="post", label=name)
        views = [(r["t"], r.get("autoscaler", {}).get(name, {})) for r in samples]
        desired = [(t, v["desired"]) for t, v in views if "desired" in v]
        color = line[0].get_color()
        replicas.step([t for t, _ in desired], [n for _, n in desired], where="post", linestyle=":", color=color)
        ongoing = [(t, v["ongoing"]) for t, v in views if "ongoing" in v]
        seen.plot([t for t, _ in ongoing], [n for _, n in ongoing], label=name, color=color)
    start = t0
    panels = (rate, latency, replicas, seen)
    for name, _, length in result["segments"]:
        for ax in panels:
            ax.axvline(start, color="k", alpha=0.2)
        rate.text(start + 1, rate.get_ylim()[1] * 0.9, name, fontsize=7)
        start += length
    for ax in panels:
        ax.axvline(start, color="k", alpha=0.2)
    rate.text(start + 1, rate.get_ylim()[1] * 0.9, "idle", fontsize=7)
    labels = ("requests/s", "seconds", "replicas (dotted: desired)", "ongoing (autoscaler)")
    for ax, label in zip(panels, labels, strict=True):
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7, loc="upper right")
    seen.set_xlabel("seconds since the cluster was ready")
    fig.suptitle(title, fontsize=9)
    save_figure(fig, png)


def start_cluster(port: int, cfg: dict[str, Any]) -> Any:
    import ray
    from ray import serve
    from ray.cluster_utils import Cluster
    from ray.serve.schema import ServeDeploySchema

    from app.serve.serve_internals import serve_client

    os.environ.update(private_serve_env(port))  # every node's processes inherit it
    # Ray's metrics reach its export every second (default 10 s), so the autoscaler's view is sampled finely.
    head = {"num_cpus": 0, "_system_config": {"metrics_report_interval_ms": 1000}}
    cluster = Cluster(initialize_head=True, head_node_args=head)
    for node in NODES:
        cluster.add_node(**node)
    ray.init(address=cluster.address, namespace="serve", log_to_driver=False)
    serve.start(http_options={"host": "127.0.0.1", "port": port}, proxy_location="HeadOnly")
    serve_client().deploy_apps(ServeDeploySchema.model_validate({"applications": cfg["applications"]}))
    return cluster


def wait_ready(base_url: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(base_url + "/readyz", timeout=5).close()
            return
        except OSError:
            time.sleep(1.0)  # polling a deadline, not synchronising on an event
    raise TimeoutError(f"{base_url} not ready within {timeout_s:g} s")


def run(args: argparse.Namespace) -> dict[str, Any]:
    import ray
    from ray import serve

    files = default_files(REPO / "models")
    missing = [str(p) for p in (files.fp32, files.int8, files.labels) if not p.is_file()]
    if missing:
        raise SystemExit(f"models missing ({', '.join(missing)}): run `make models` first")
    cfg = prod_on_one_machine(files, downscale_delay_s=args.downscale_delay, look_back_s=args.look_back)
    base = f"http://127.0.0.1:{args.port}"
    wl = Workload(url=base + "/v1/classify")
    cluster = start_cluster(args.port, cfg)
    try:
        wait_ready(base, 300)
        metrics_url = f"http://127.0.0.1:{cluster.head_node.metrics_export_port}/metrics"
        with Sampler(base, metrics_url) as sampler:
            capacity = asyncio.run(closed_step(wl, 16, 8.0, warmup_s=2.0))["throughput_rps"]
            base_rate = capacity / 4
            segments = [("steady", base_rate, args.steady), ("step", capacity, args.step)]
            segments += [("back", base_rate, args.steady)]
            load_t0 = time.perf_counter() - sampler.t0
            samples, _ = asyncio.run(drive(wl, MAX_INFLIGHT, schedule(segments)))
            deadline = time.monotonic() + args.downscale_delay + 120
            while not sampler.at_min() and time.monotonic() < deadline:
                time.sleep(1.0)  # the idle phase: watched until every deployment is back at its minimum
        length = sum(s[2] for s in segments)
        policies = {d["name"]: d["autoscaling_config"] for d in cfg["applications"][0]["deployments"]}
        result = {"capacity_rps": capacity, "segments": segments, "load_t0_s": round(load_t0, 2)}
        result |= {"policies": policies, "timeline": sampler.rows, "client": per_second(samples, length)}
        result["reactions"] = reactions(sampler.rows, segments, load_t0)
        by_segment, start = {}, 0.0
        for name, rate, seg_len in segments:
            these = [s for s in samples if start <= s.due < start + seg_len]
            counts = Counter(str(s.status) for s in these)
            by_segment[name] = {"offered_rps": rate, "sent": len(these), "statuses": dict(counts)}
            by_segment[name] |= latency_figures(these)
            start += seg_len
        result["segments_summary"] = by_segment
        return result
    finally:
        serve.shutdown()
        ray.shutdown()
        cluster.shutdown()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--steady", type=float, default=40.0, help="seconds at a quarter of capacity, before and after the step")
    add("--step", type=float, default=60.0, help="seconds at capacity (4x the steady rate)")
    add("--downscale-delay", type=float, default=30.0, help="downscale_delay_s for every deployment (prod: 120-600)")
    add("--look-back", type=float, default=None, help="look_back_period_s for every deployment (default: prod's)")
    add("--port", type=int, default=8300)
    add("--out-dir", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    env, run_stamp = print_environment(), stamp()
    result = {"stamp": run_stamp, "environment": env, **run(args)}
    stem = args.out_dir / f"{run_stamp}-{host_name()}-autoscale"
    title = f"autoscaling under a 4x step; {env['cpu_model']} ({env['usable_cpus']} cores), {run_stamp}"
    plot(result, stem.parent / f"{stem.name}.png", title)
    headers = [
        "deployment",
        "policy (target, up/down delay s)",
        "replicas before step",
        "peak",
        "scale-up s",
        "back to min s",
    ]
    rows = []
    for name, r in result["reactions"].items():
        p = result["policies"][name]
        policy = f"{p['target_ongoing_requests']}, {p['upscale_delay_s']}/{p['downscale_delay_s']}"
        rows.append([name, policy, r["before_step"], r["peak"], r["scale_up_s"], r["back_to_min_s"]])
    seg_rows = [
        [n, s["offered_rps"], s["sent"], s["statuses"], s["p50_ms"], s["p99_ms"]]
        for n, s in result["segments_summary"].items()
    ]
    md = f"# Autoscaling, {run_stamp}\n\ncapacity {result['capacity_rps']:.1f} req/s\n\n"
    md += (
        markdown_table(headers, rows)
        + "\n"
        + markdown_table(["segment", "offered req/s", "sent", "statuses", "p50 ms", "p99 ms"], seg_rows)
    )
    md += f"\n![replicas, rates and latency over time]({stem.name}.png)\n"
    print(md)
    print(write_report(stem, result, md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
