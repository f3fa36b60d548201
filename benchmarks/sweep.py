"""Find the Classifier's batching knee on a running app: live user_config updates, one closed-loop step each.

    python -m benchmarks.soak --serve-only --port 8200 --metrics-port 8280 &     # or any running app
    python -m benchmarks.sweep --url http://127.0.0.1:8200/v1/classify --config configs/local.yaml \\
        --batch-sizes 1,4,8,16,32 --waits 0,0.002,0.005,0.01 --variant fp32 --concurrency 32

For every (max_batch_size, batch_wait_timeout_s) it redeploys the live config with only Classifier_<variant>'s
user_config changed (as `serve deploy`: reconfigure() in the same replicas, checked unchanged), raising
max_ongoing_requests where batches could not fill, and drives one closed-loop step; the original config comes back
at the end. The knee: among error-free points within 5% of the best throughput, the lowest p99; its user_config
block for configs/prod.yaml is printed, benchmarks/results/sweep-<date>-<host>.json/.png written.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import itertools
import logging
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import yaml

from benchmarks.environment import REPO, RESULTS_DIR, host_name, print_environment, stamp
from benchmarks.load import NonLoopbackURL, Workload, closed_step, require_loopback
from benchmarks.procs import node_serving
from benchmarks.report import markdown_table, pyplot, save_figure, write_json

TOLERANCE = 0.05
MAX_ERROR_SHARE = 0.01  # a point that failed more requests than this cannot be the knee
STEP_KEYS = ("throughput_rps", "images_per_s", "requests", "errors", "median_batch_size", "variants")


def choose_knee(points: Sequence[dict[str, Any]], tolerance: float = TOLERANCE) -> dict[str, Any] | None:
    """Among measured points with (almost) no errors, those within `tolerance` of the best throughput; of these the
    lowest p99 (then the smaller batch, then the shorter wait). None if nothing was measured."""
    valid = [p for p in points if p.get("throughput_rps") and p.get("p99_ms") is not None]
    valid = [p for p in valid if p.get("error_share", 0.0) <= MAX_ERROR_SHARE]
    best = max((p["throughput_rps"] for p in valid), default=0.0)
    near = [p for p in valid if p["throughput_rps"] >= (1.0 - tolerance) * best]
    return min(near, key=lambda p: (p["p99_ms"], p["max_batch_size"], p["batch_wait_timeout_s"]), default=None)


def config_block(deployment: str, user_config: dict[str, Any], max_ongoing: int | None, note: str) -> str:
    """The deployment entry to paste under `deployments:` (six-space indent, as in configs/*.yaml)."""
    entry: dict[str, Any] = {"name": deployment}
    if max_ongoing is not None:
        entry["max_ongoing_requests"] = max_ongoing
    text = yaml.safe_dump([entry | {"user_config": user_config}], sort_keys=False)
    return "\n".join([f"      # {line}" for line in note.splitlines()] + ["      " + x for x in text.splitlines()])


def edited(
    original: dict[str, dict[str, Any]], app_name: str, deployment: str, user_config: dict[str, Any], max_ongoing: int
) -> dict[str, dict[str, Any]]:
    """All applications' configs with only `deployment`'s user_config and max_ongoing_requests replaced."""
    configs = copy.deepcopy(original)
    deps = configs[app_name].setdefault("deployments", [])
    if (dep := next((d for d in deps if d["name"] == deployment), None)) is None:
        deps.append(dep := {"name": deployment})
    dep.update(user_config=copy.deepcopy(user_config), max_ongoing_requests=max_ongoing)
    return configs


class LiveApp:
    """The running Serve instance, reached through its controller (as the tests' ServeDeployer does)."""

    def __init__(self, url: str, ray_address: str | None, app_name: str, deployment: str) -> None:
        self.base, self.port = f"http://{urlsplit(url).netloc}", urlsplit(url).port or 80
        self.app, self.deployment = app_name, deployment
        if ray_address is None and (node := node_serving(self.port)) is not None:
            ray_address = node.gcs_address
        if not ray_address:
            raise SystemExit(f"error: no local Ray node serves port {self.port}; pass --ray-address")
        self.ray_address = ray_address
        # Ray 2.60 turns token authentication on for every cluster ray.init() starts, but a driver given an
        # explicit address only uses it when told to (before Ray is imported: its config is read then).
        os.environ.setdefault("RAY_AUTH_MODE", "token")
        import ray

        from app.serve.serve_internals import serve_client

        # Serve's namespace, "serve", as `serve run` and `serve deploy` join it.
        ray.init(address=ray_address, namespace="serve", log_to_driver=False, logging_level=logging.WARNING)
        self.client = serve_client()
        details = self.client.get_serve_details()
        apps, serve_port = details.get("applications", {}), (details.get("http_options") or {}).get("port")
        # deploy_apps replaces the whole set of applications: every one must come from a config, to be sent back
        imperative = sorted(n for n, a in apps.items() if not a.get("deployed_app_config"))
        for bad, why in (
            (serve_port != self.port, f"it serves HTTP on port {serve_port}, not {self.port}"),
            (app_name not in apps, f"it has no application {app_name!r}: {sorted(apps)}"),
            (bool(imperative), f"application(s) {imperative} were not deployed from a config (serve.run?)"),
            (deployment not in apps.get(app_name, {}).get("deployments", {}), f"{app_name!r} has no {deployment}"),
        ):
            if bad:
                raise SystemExit(f"error: the Serve instance at {ray_address}: {why}; refusing to reconfigure")
        self.original = {name: app["deployed_app_config"] for name, app in apps.items()}
        self.ongoing = int(apps[app_name]["deployments"][deployment]["deployment_config"]["max_ongoing_requests"])
        deps = self.original[app_name].get("deployments", [])
        self.user_config = dict(next((d.get("user_config") for d in deps if d["name"] == deployment), None) or {})

    def state(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """The application's and the deployment's entries in Serve's details."""
        app = self.client.get_serve_details()["applications"][self.app]
        return app, app["deployments"][self.deployment]

    def replicas(self) -> list[tuple[str, int | None]]:
        return sorted((r["replica_id"], r.get("pid")) for r in self.state()[1]["replicas"] if r["state"] == "RUNNING")

    def model(self, variant: str) -> dict[str, Any]:
        return dict(httpx.get(self.base + "/v1/models", timeout=10).raise_for_status().json()["variants"][variant])

    def deploy(self, variant: str, user_config: dict[str, Any], ongoing: int, restore: bool = False) -> dict[str, Any]:
        """Deploy this batching and max_ongoing_requests (or the original config); wait until the deployment is
        HEALTHY with them and the Classifier reports them through GET /v1/models, whose `variant` entry it returns."""
        from ray.serve.schema import ServeDeploySchema

        configs = self.original if restore else edited(self.original, self.app, self.deployment, user_config, ongoing)
        self.client.deploy_apps(ServeDeploySchema.model_validate({"applications": list(configs.values())}))
        keys = ("max_batch_size", "batch_wait_timeout_s", "max_concurrent_batches")
        want = {k: user_config[k] for k in keys if k in user_config}  # what the config leaves out keeps its default
        deadline, last = time.monotonic() + 180, None
        while time.monotonic() < deadline:
            try:
                app, dep = self.state()
                if app["status"] == "DEPLOY_FAILED":
                    raise SystemExit(f"error: deploy failed: {app.get('message')}")
                healthy = app["status"] == "RUNNING" and dep["status"] == "HEALTHY"
                if healthy and dep["deployment_config"].get("max_ongoing_requests") == ongoing:
                    info = self.model(variant)
                    if {k: (last := info.get("batching") or {}).get(k) for k in want} == want:
                        return info
            except (httpx.HTTPError, KeyError) as e:
                last = e
            time.sleep(0.5)
        raise TimeoutError(f"{self.deployment} did not report {want} within 180 s (last: {last!r})")


def run_sweep(args: argparse.Namespace) -> dict[str, Any]:
    env = print_environment()
    app_name = yaml.safe_load(args.config.read_text())["applications"][0]["name"]
    deployment = f"Classifier_{args.variant}"
    live = LiveApp(args.url, args.ray_address, app_name, deployment)
    base_uc, base_ongoing, replicas0 = live.user_config, live.ongoing, live.replicas()
    replica0 = live.model(args.variant).get("replica_id")
    print(f"{live.ray_address} {deployment}: max_ongoing_requests {base_ongoing}, {base_uc}", file=sys.stderr)
    workload, ongoing_now, points = Workload(args.url, args.variant), base_ongoing, []
    try:
        for wait, bs in itertools.product(args.waits, args.batch_sizes):
            uc = {k: v for k, v in base_uc.items() if k != "profile_batches"}
            uc |= {"max_batch_size": bs, "batch_wait_timeout_s": wait}
            # Batches fill only with max_ongoing_requests >= max_batch_size x max_concurrent_batches (app.config).
            # A raised value goes first, on its own: reconfigure() checks the batch size against the replica
            # context's value, which Ray updates after running reconfigure().
            ongoing, t0 = max(base_ongoing, bs * int(uc.get("max_concurrent_batches", 1))), time.perf_counter()
            if ongoing > ongoing_now:
                live.deploy(args.variant, base_uc, ongoing)
            info = live.deploy(args.variant, uc, ongoing_now := ongoing)
            point: dict[str, Any] = {"max_batch_size": bs, "batch_wait_timeout_s": wait, "max_ongoing": ongoing}
            point["reconfigure_s"] = round(time.perf_counter() - t0, 2)
            point["restarted"] = live.replicas() != replicas0 or info.get("replica_id") != replica0
            note = ", RESTARTED" if point["restarted"] else ""
            print(f"batch {bs} wait {wait:g}: live in {point['reconfigure_s']} s{note}", file=sys.stderr)
            step = asyncio.run(closed_step(workload, args.concurrency, args.duration, args.warmup))  # prints it
            point |= {k: step[k] for k in STEP_KEYS} | {k: step["latency_ms"][k] for k in ("p50_ms", "p99_ms")}
            point["error_share"] = sum(step["errors"].values()) / step["requests"] if step["requests"] else 1.0
            points.append(point)
    finally:
        live.deploy(args.variant, base_uc, base_ongoing, restore=True)
        restarted = live.replicas() != replicas0
        print(f"restored {deployment}; replicas {'CHANGED' if restarted else 'unchanged'}", file=sys.stderr)
    return {
        "stamp": stamp(),
        "environment": env,
        "argv": sys.argv[1:],
        **{k: getattr(args, k) for k in ("url", "variant", "concurrency", "duration", "warmup")},
        "tolerance": TOLERANCE,
        "ray_address": live.ray_address,
        "application": app_name,
        "deployment": deployment,
        "baseline": {"user_config": base_uc, "max_ongoing_requests": base_ongoing, "replicas": replicas0},
        "points": points,
        "knee": choose_knee(points),
        "restarted_during_sweep": restarted,
    }


def plot(result: dict[str, Any], out: Path) -> Path:
    fig, axes = pyplot().subplots(1, 2, figsize=(12, 4.8))
    points, sizes = result["points"], sorted({p["max_batch_size"] for p in result["points"]})
    for ax, key, label in zip(axes, ("throughput_rps", "p99_ms"), ("requests/s", "p99 latency (ms)"), strict=True):
        for wait in sorted({p["batch_wait_timeout_s"] for p in points}):
            pts = sorted((p["max_batch_size"], p[key]) for p in points if p["batch_wait_timeout_s"] == wait)
            ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", label=f"wait {wait * 1000:g} ms")
        if knee := result["knee"]:
            ax.plot([knee["max_batch_size"]], [knee[key]], "k*", markersize=14, label="knee")
        ax.set_xscale("log", base=2)
        ax.set_xticks(sizes, [str(s) for s in sizes])
        ax.set(xlabel="max_batch_size", ylabel=label)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    env = result["environment"]
    fig.suptitle(
        f"{result['deployment']} batching sweep, closed loop c={result['concurrency']}, "
        f"{result['duration']:g} s per point; {env['cpu_model']} ({env['usable_cpus']} cores), {result['stamp']}",
        fontsize=9,
    )
    return save_figure(fig, out, dpi=120)


def table(result: dict[str, Any]) -> str:
    keys = ("throughput_rps", "p50_ms", "p99_ms", "errors")
    rows = [[p["max_batch_size"], f"{p['batch_wait_timeout_s']:g}", *(p[k] for k in keys)] for p in result["points"]]
    return markdown_table(["max_batch_size", "wait s", "req/s", "p50 ms", "p99 ms", "errors"], rows)


def knee_block(result: dict[str, Any]) -> str:
    """The knee, and its deployment entry for configs/prod.yaml with a note on where it was measured."""
    knee, base, env = result["knee"], result["baseline"], result["environment"]
    uc = base["user_config"] | {k: knee[k] for k in ("max_batch_size", "batch_wait_timeout_s")}
    note = (
        f"knee of `python -m benchmarks.sweep` {result['stamp']}: {knee['throughput_rps']:.1f} req/s, "
        f"p99 {knee['p99_ms']:.0f} ms\n(within {result['tolerance']:.0%} of the best throughput, lowest p99) on "
        f"{env['cpu_model']}, {env['usable_cpus']} cores,\n{result['variant']}, "
        f"closed loop c={result['concurrency']}: re-measure on the production hardware before relying on it"
    )
    raised = knee["max_ongoing"] if knee["max_ongoing"] != base["max_ongoing_requests"] else None
    return (
        f"\nknee: max_batch_size={knee['max_batch_size']} batch_wait_timeout_s={knee['batch_wait_timeout_s']}\n"
        "user_config block for configs/prod.yaml (under applications[0].deployments):\n\n"
        + config_block(result["deployment"], uc, raised, note)
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--url", required=True, help="the running app's /v1/classify (loopback only)")
    add("--config", type=Path, default=REPO / "configs" / "local.yaml", help="its Serve config (the first application)")
    add("--ray-address", help="GCS address (default: found from the process serving --url's port)")
    add("--variant", default="fp32")
    add("--batch-sizes", type=lambda t: [int(x) for x in t.split(",")], default=[1, 4, 8, 16, 32])
    add("--waits", type=lambda t: [float(x) for x in t.split(",")], default=[0.0, 0.002, 0.005, 0.01])
    add("--concurrency", type=int, default=32)
    add("--duration", type=float, default=10.0, help="measured seconds per point")
    add("--warmup", type=float, default=2.0, help="dropped seconds per point")
    add("--out", type=Path, help="JSON output (default benchmarks/results/sweep-<date>-<host>.json)")
    args = parser.parse_args(argv)
    if any(b < 1 for b in args.batch_sizes) or any(not 0 <= w <= 1 for w in args.waits):
        parser.error("batch sizes must be >= 1 and waits in [0, 1] s (app.config.ClassifierConfig)")
    try:
        require_loopback(args.url)
    except NonLoopbackURL as e:
        parser.exit(2, f"error: {e}\n")
    result = run_sweep(args)
    out = write_json(args.out or RESULTS_DIR / f"sweep-{result['stamp']}-{host_name()}.json", result)
    png = plot(result, out.with_suffix(".png"))
    print(table(result))
    print(knee_block(result) if result["knee"] else "no point was measured without errors: no knee")
    print(f"\nwrote {out} and {png}")
    return 0 if result["knee"] is not None and not result["restarted_during_sweep"] else 1


if __name__ == "__main__":
    sys.exit(main())
