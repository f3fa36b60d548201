"""Find the Classifier's batching knee on a running app: live user_config updates, one closed-loop step each.

    python -m benchmarks.soak --serve-only --port 8200 --metrics-port 8280 &     # or any running app
    python -m benchmarks.sweep --url http://127.0.0.1:8200/v1/classify --config configs/local.yaml \\
        --batch-sizes 1,4,8,16,32 --waits 0,0.002,0.005,0.01 --variant fp32 --concurrency 32

For every (max_batch_size, batch_wait_timeout_s) it redeploys the app's live config with only
Classifier_<variant>'s user_config changed (the controller's deploy_apps, as `serve deploy` does; a
lightweight update, so reconfigure() runs in the same replica), waits until GET /v1/models reports the new
batching, checks the replica ids and pids did not change (no restart), and drives one closed-loop step with
X-Model-Variant set. A batch can only fill when max_ongoing_requests >= max_batch_size x
max_concurrent_batches: for larger batches the sweep raises max_ongoing_requests too (also a lightweight
update; --no-raise skips those points instead). At the end the original config is deployed again.

The knee: among the points within 5% of the best throughput (without errors), the one with the lowest p99.
Prints its user_config block for configs/prod.yaml and writes benchmarks/results/sweep-<date>-<host>.json/.png.

The app is found through the URL's port: the Ray node whose proxy (or HAProxy) listens there gives the GCS
address (override with --ray-address), and the sweep refuses a cluster whose Serve HTTP port is another.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import math
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import yaml

from benchmarks.environment import RESULTS_DIR, host_name, print_environment, stamp
from benchmarks.load import NonLoopbackURL, Workload, closed_step, require_loopback
from benchmarks.report import markdown_table, pyplot, write_json
from benchmarks.soak import node_serving

REPO = Path(__file__).resolve().parent.parent
TOLERANCE = 0.05
MAX_ERROR_SHARE = 0.01  # a point that failed more requests than this cannot be the knee


# --------------------------------------------------------------------------- choosing


def choose_knee(points: Sequence[dict[str, Any]], tolerance: float = TOLERANCE) -> dict[str, Any] | None:
    """Among measured points with (almost) no errors, those within `tolerance` of the best throughput; of these the
    lowest p99 (then the smaller batch, then the shorter wait). None if nothing was measured."""
    valid = [
        p
        for p in points
        if not p.get("skipped")
        and p.get("throughput_rps")
        and p.get("p99_ms") is not None
        and math.isfinite(p["throughput_rps"])
        and p.get("error_share", 0.0) <= MAX_ERROR_SHARE
    ]
    if not valid:
        return None
    best = max(p["throughput_rps"] for p in valid)
    near = [p for p in valid if p["throughput_rps"] >= (1.0 - tolerance) * best]
    return min(near, key=lambda p: (p["p99_ms"], p["max_batch_size"], p["batch_wait_timeout_s"]))


def needed_ongoing(user_config: dict[str, Any], max_batch_size: int) -> int:
    """max_ongoing_requests a replica needs for batches of `max_batch_size` to fill (app.config.check_against)."""
    return max_batch_size * int(user_config.get("max_concurrent_batches", 1))


def config_block(deployment: str, user_config: dict[str, Any], max_ongoing: int | None, note: str) -> str:
    """The deployment entry to paste under `deployments:` (six-space indent, as in configs/*.yaml)."""
    entry: dict[str, Any] = {"name": deployment}
    if max_ongoing is not None:
        entry["max_ongoing_requests"] = max_ongoing
    entry["user_config"] = user_config
    text = yaml.safe_dump([entry], sort_keys=False, default_flow_style=False)
    lines = [f"      # {line}" for line in note.splitlines()]
    lines += ["      " + line for line in text.rstrip().splitlines()]
    return "\n".join(lines)


# --------------------------------------------------------------------------- the running app


class LiveApp:
    """The running Serve instance, reached through its controller (as the tests' ServeDeployer does)."""

    def __init__(self, url: str, ray_address: str | None, app_name: str) -> None:
        self.url = url
        parts = urlsplit(url)
        self.base = f"{parts.scheme}://{parts.netloc}"
        self.port = parts.port or 80
        self.app_name = app_name
        if ray_address is None:
            node = node_serving(self.port)
            if node is None or not node.gcs_address:
                raise SystemExit(f"error: no local Ray node serves port {self.port}; pass --ray-address")
            ray_address = node.gcs_address
        self.ray_address = ray_address
        # Ray 2.60 turns token authentication on for every cluster ray.init() starts, but a driver given an
        # explicit address only uses it when told to (before Ray is imported: its config is read then); Ray then
        # reads the cluster's token from where it keeps it.
        os.environ.setdefault("RAY_AUTH_MODE", "token")
        import ray
        from ray.serve._private.constants import SERVE_NAMESPACE
        from ray.serve.context import _connect

        ray.init(address=ray_address, namespace=SERVE_NAMESPACE, log_to_driver=False, logging_level="WARNING")
        self.client = _connect()
        details = self.details()
        serve_port = (details.get("http_options") or {}).get("port")
        if serve_port != self.port:
            raise SystemExit(
                f"error: the Serve instance at {ray_address} serves HTTP on port {serve_port}, not {self.port}: "
                "refusing to reconfigure an app the URL does not reach"
            )
        if app_name not in details.get("applications", {}):
            raise SystemExit(f"error: no application {app_name!r} at {ray_address}: {sorted(details['applications'])}")
        # Every application's config as deployed: deploy_apps replaces the whole set, so all are sent back.
        imperative = sorted(n for n, a in details["applications"].items() if not a.get("deployed_app_config"))
        if imperative:
            raise SystemExit(
                f"error: application(s) {imperative} were not deployed from a config (serve.run?): redeploying "
                "the config would remove them; the sweep only works on config-deployed instances"
            )
        self.original = {name: app["deployed_app_config"] for name, app in details["applications"].items()}

    def details(self) -> dict[str, Any]:
        return self.client.get_serve_details()

    def deploy(self, configs: dict[str, dict[str, Any]]) -> None:
        from ray.serve.schema import ServeDeploySchema

        self.client.deploy_apps(ServeDeploySchema.model_validate({"applications": list(configs.values())}))

    def replicas(self, deployment: str) -> list[tuple[str, int | None]]:
        deps = self.details()["applications"][self.app_name]["deployments"]
        return sorted((r["replica_id"], r.get("pid")) for r in deps[deployment]["replicas"] if r["state"] == "RUNNING")

    def models(self) -> dict[str, Any]:
        r = httpx.get(self.base + "/v1/models", timeout=10)
        r.raise_for_status()
        return r.json()

    def wait_live(
        self, deployment: str, variant: str, user_config: dict[str, Any], max_ongoing: int, timeout_s: float = 180
    ) -> dict[str, Any]:
        """Until the app is RUNNING, the deployment HEALTHY with the wanted max_ongoing_requests, and the
        Classifier reports the wanted batching through GET /v1/models. Returns what /v1/models said."""
        keys = ("max_batch_size", "batch_wait_timeout_s", "max_concurrent_batches")
        want = {k: user_config[k] for k in keys if k in user_config}  # what the config leaves out keeps its default
        deadline = time.monotonic() + timeout_s
        last: Any = None
        while time.monotonic() < deadline:
            try:
                app = self.details()["applications"][self.app_name]
                dep = app["deployments"][deployment]
                if app["status"] == "DEPLOY_FAILED":
                    raise SystemExit(f"error: deploy failed: {app.get('message')}")
                if (
                    app["status"] == "RUNNING"
                    and dep["status"] == "HEALTHY"
                    and dep["deployment_config"].get("max_ongoing_requests") == max_ongoing
                ):
                    info = self.models()["variants"][variant]
                    last = info.get("batching") or {}
                    if {k: last.get(k) for k in want} == want:
                        return info
            except (httpx.HTTPError, KeyError) as e:
                last = e
            time.sleep(0.5)
        raise TimeoutError(f"{deployment} did not report {want} within {timeout_s:.0f} s (last: {last!r})")


def edited(
    original: dict[str, dict[str, Any]], app_name: str, deployment: str, user_config: dict[str, Any], max_ongoing: int
) -> dict[str, dict[str, Any]]:
    """All applications' configs with only `deployment`'s user_config and max_ongoing_requests replaced."""
    configs = copy.deepcopy(original)
    deps = configs[app_name].setdefault("deployments", [])
    dep = next((d for d in deps if d["name"] == deployment), None)
    if dep is None:
        dep = {"name": deployment}
        deps.append(dep)
    dep["user_config"] = copy.deepcopy(user_config)
    dep["max_ongoing_requests"] = max_ongoing
    return configs


def deployment_entry(configs: dict[str, dict[str, Any]], app_name: str, deployment: str) -> dict[str, Any]:
    return next((d for d in configs[app_name].get("deployments", []) if d["name"] == deployment), {})


# --------------------------------------------------------------------------- the sweep


def apply(
    live: LiveApp,
    current: dict[str, Any],
    deployment: str,
    variant: str,
    user_config: dict[str, Any],
    max_ongoing: int,
) -> tuple[dict[str, Any], list[str]]:
    """Deploy new batching for `deployment`; returns /v1/models' entry and notes.

    When max_ongoing_requests goes up it is deployed first, on its own: the replica runs reconfigure() with the new
    user_config before Ray updates the replica context's max_ongoing_requests, which Classifier.reconfigure checks the
    batch size against, so one deploy of both would be judged against the old (lower) value.
    """
    notes = []
    if max_ongoing > current["max_ongoing"]:
        live.deploy(edited(live.original, live.app_name, deployment, current["user_config"], max_ongoing))
        live.wait_live(deployment, variant, current["user_config"], max_ongoing)
        notes.append(f"max_ongoing_requests {current['max_ongoing']} -> {max_ongoing} deployed first")
    live.deploy(edited(live.original, live.app_name, deployment, user_config, max_ongoing))
    info = live.wait_live(deployment, variant, user_config, max_ongoing)
    current.update(user_config=copy.deepcopy(user_config), max_ongoing=max_ongoing)
    return info, notes


def run_sweep(args: argparse.Namespace) -> dict[str, Any]:
    env = print_environment()
    cfg_file = yaml.safe_load(args.config.read_text())
    app_name = args.app or cfg_file["applications"][0]["name"]
    deployment = f"Classifier_{args.variant}"
    live = LiveApp(args.url, args.ray_address, app_name)
    print(f"connected to {live.ray_address}: application {app_name!r}, deployment {deployment}", file=sys.stderr)
    orig_entry = deployment_entry(live.original, app_name, deployment)
    file_entry = deployment_entry({app_name: cfg_file["applications"][0]}, app_name, deployment)
    orig_uc = dict(orig_entry.get("user_config") or {})
    live_deps = live.details()["applications"][app_name]["deployments"]
    if deployment not in live_deps:
        raise SystemExit(f"error: {app_name!r} has no deployment {deployment}: {sorted(live_deps)}")
    orig_ongoing = int(live_deps[deployment]["deployment_config"]["max_ongoing_requests"])
    if (file_entry.get("user_config") or {}) != orig_uc:
        print(
            f"note: the running {deployment} user_config {orig_uc} differs from {args.config}'s "
            f"{file_entry.get('user_config')}; the running one is the baseline and is restored at the end",
            file=sys.stderr,
        )
    replicas0 = live.replicas(deployment)
    models0 = live.models()["variants"][args.variant]
    print(
        f"baseline: max_ongoing_requests {orig_ongoing}, user_config {orig_uc}, replicas {replicas0}", file=sys.stderr
    )
    workload = Workload(args.url, args.variant, timeout_s=args.timeout)
    payloads = workload.payloads()
    current = {"user_config": copy.deepcopy(orig_uc), "max_ongoing": orig_ongoing}
    points: list[dict[str, Any]] = []
    restore: dict[str, Any] = {}
    try:
        for wait in args.waits:
            for bs in args.batch_sizes:
                uc = {**orig_uc, "max_batch_size": bs, "batch_wait_timeout_s": wait}
                uc.pop("profile_batches", None)
                need = needed_ongoing(uc, bs)
                ongoing = max(orig_ongoing, need)
                point: dict[str, Any] = {"max_batch_size": bs, "batch_wait_timeout_s": wait, "max_ongoing": ongoing}
                if need > orig_ongoing and args.no_raise:
                    point["skipped"] = (
                        f"max_batch_size {bs} x max_concurrent_batches {uc.get('max_concurrent_batches', 1)} = {need} "
                        f"> max_ongoing_requests {orig_ongoing} (--no-raise)"
                    )
                    print(f"skip: {point['skipped']}", file=sys.stderr)
                    points.append(point)
                    continue
                t0 = time.perf_counter()
                info, notes = apply(live, current, deployment, args.variant, uc, ongoing)
                point["reconfigure_s"] = round(time.perf_counter() - t0, 2)
                replicas = live.replicas(deployment)
                point["replicas"] = replicas
                point["restarted"] = replicas != replicas0 or info.get("replica_id") != models0.get("replica_id")
                point["notes"] = notes
                if point["restarted"]:
                    print(f"WARNING: {deployment} replicas changed {replicas0} -> {replicas}", file=sys.stderr)
                step = asyncio.run(
                    closed_step(
                        workload,
                        args.concurrency,
                        args.duration,
                        args.warmup,
                        args.max_requests,
                        not args.no_progress,
                        payloads,
                    )
                )
                lat = step["latency_ms"]
                errors = sum(step["errors"].values())
                point.update(
                    throughput_rps=step["throughput_rps"],
                    images_per_s=step["images_per_s"],
                    p50_ms=lat["p50_ms"],
                    p99_ms=lat["p99_ms"],
                    requests=step["requests"],
                    errors=step["errors"],
                    error_share=errors / step["requests"] if step["requests"] else 1.0,
                    median_batch_size=step["median_batch_size"],
                    variants=step["variants"],
                    client_cpu_cores=step["client_cpu_cores"],
                    load_average_1m=step["load_average_1m"],
                )
                points.append(point)
                print(_point_line(point), file=sys.stderr, flush=True)
    finally:
        t0 = time.perf_counter()
        live.deploy(live.original)
        info = live.wait_live(deployment, args.variant, orig_uc, orig_ongoing)
        replicas = live.replicas(deployment)
        restore = {
            "restored_s": round(time.perf_counter() - t0, 2),
            "batching": info.get("batching"),
            "max_ongoing_requests": orig_ongoing,
            "replicas": replicas,
            "restarted_during_sweep": replicas != replicas0,
        }
        print(
            f"restored {deployment}: {info.get('batching')}, max_ongoing_requests {orig_ongoing}; "
            f"replicas {'CHANGED' if replicas != replicas0 else 'unchanged'} {replicas}",
            file=sys.stderr,
        )
    knee = choose_knee(points, args.tolerance)
    return {
        "stamp": stamp(),
        "environment": env,
        "argv": sys.argv[1:],
        "url": args.url,
        "ray_address": live.ray_address,
        "application": app_name,
        "deployment": deployment,
        "variant": args.variant,
        "concurrency": args.concurrency,
        "duration_s": args.duration,
        "warmup_s": args.warmup,
        "tolerance": args.tolerance,
        "baseline": {"user_config": orig_uc, "max_ongoing_requests": orig_ongoing, "replicas": replicas0},
        "points": points,
        "knee": knee,
        "restore": restore,
    }


def _point_line(p: dict[str, Any]) -> str:
    def f(x: float | None) -> str:
        return "n/a" if x is None else f"{x:.1f}"

    return (
        f"  batch {p['max_batch_size']:>3} wait {p['batch_wait_timeout_s']:<6g} -> {f(p['throughput_rps'])} req/s, "
        f"p50 {f(p['p50_ms'])} p99 {f(p['p99_ms'])} ms, errors {p['errors'] or 0}, median batch "
        f"{p['median_batch_size']}, live in {p['reconfigure_s']} s{', RESTARTED' if p['restarted'] else ''}"
    )


# --------------------------------------------------------------------------- output


def plot(result: dict[str, Any], out: Path) -> Path:
    plt = pyplot()
    fig, (ax_t, ax_p) = plt.subplots(1, 2, figsize=(12, 4.8))
    waits = sorted({p["batch_wait_timeout_s"] for p in result["points"]})
    for wait in waits:
        pts = sorted(
            (p for p in result["points"] if p["batch_wait_timeout_s"] == wait and not p.get("skipped")),
            key=lambda p: p["max_batch_size"],
        )
        if not pts:
            continue
        xs = [p["max_batch_size"] for p in pts]
        ax_t.plot(xs, [p["throughput_rps"] for p in pts], marker="o", label=f"wait {wait * 1000:g} ms")
        ax_p.plot(xs, [p["p99_ms"] for p in pts], marker="o", label=f"wait {wait * 1000:g} ms")
    knee = result.get("knee")
    if knee:
        ax_t.plot([knee["max_batch_size"]], [knee["throughput_rps"]], "k*", markersize=14, label="knee")
        ax_p.plot([knee["max_batch_size"]], [knee["p99_ms"]], "k*", markersize=14, label="knee")
    sizes = sorted({p["max_batch_size"] for p in result["points"]})
    for ax, label in ((ax_t, "requests/s"), (ax_p, "p99 latency (ms)")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(sizes, [str(s) for s in sizes])
        ax.set_xlabel("max_batch_size")
        ax.set_ylabel(label)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    env = result["environment"]
    fig.suptitle(
        f"{result['deployment']} batching sweep, closed loop c={result['concurrency']}, "
        f"{result['duration_s']:g} s per point; {env['cpu_model']} ({env['usable_cpus']} cores), {result['stamp']}",
        fontsize=9,
    )
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def table(result: dict[str, Any]) -> str:
    rows = []
    for p in result["points"]:
        if p.get("skipped"):
            rows.append([p["max_batch_size"], f"{p['batch_wait_timeout_s']:g}", "skipped", "", "", "", "", ""])
            continue
        rows.append(
            [
                p["max_batch_size"],
                f"{p['batch_wait_timeout_s']:g}",
                p["throughput_rps"],
                p["p50_ms"],
                p["p99_ms"],
                p["errors"] or "-",
                p["median_batch_size"],
                "yes" if p["restarted"] else "no",
            ]
        )
    headers = ["max_batch_size", "wait s", "req/s", "p50 ms", "p99 ms", "errors", "median batch", "restarted"]
    return markdown_table(headers, rows)


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", required=True, help="the running app's /v1/classify (loopback only)")
    parser.add_argument("--config", type=Path, default=REPO / "configs" / "local.yaml", help="the app's Serve config")
    parser.add_argument("--app", help="application name (default: the config's first)")
    parser.add_argument("--ray-address", help="GCS address (default: found from the process serving --url's port)")
    parser.add_argument("--variant", default="fp32")
    parser.add_argument("--batch-sizes", type=_ints, default=[1, 4, 8, 16, 32])
    parser.add_argument("--waits", type=_floats, default=[0.0, 0.002, 0.005, 0.01], help="batch_wait_timeout_s")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--duration", type=float, default=10.0, help="measured seconds per point")
    parser.add_argument("--warmup", type=float, default=2.0, help="dropped seconds per point")
    parser.add_argument("--max-requests", type=int, default=20_000, help="cap per point")
    parser.add_argument("--timeout", type=float, default=30.0, help="per-request timeout (s)")
    parser.add_argument("--tolerance", type=float, default=TOLERANCE, help="knee: share below the best throughput")
    parser.add_argument("--no-raise", action="store_true", help="skip batches that need more max_ongoing_requests")
    parser.add_argument("--out", type=Path, help="JSON output (default benchmarks/results/sweep-<date>-<host>.json)")
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    try:
        require_loopback(args.url)
    except NonLoopbackURL as e:
        parser.exit(2, f"error: {e}\n")
    if any(b < 1 for b in args.batch_sizes) or any(not 0 <= w <= 1 for w in args.waits):
        parser.error("batch sizes must be >= 1 and waits in [0, 1] s (app.config.ClassifierConfig)")
    result = run_sweep(args)
    out = args.out or RESULTS_DIR / f"sweep-{result['stamp']}-{host_name()}.json"
    write_json(out, result)
    png = plot(result, out.with_suffix(".png"))
    print(table(result))
    knee = result["knee"]
    if knee is None:
        print("no point was measured without errors: no knee")
    else:
        uc = {**result["baseline"]["user_config"], "max_batch_size": knee["max_batch_size"]}
        uc["batch_wait_timeout_s"] = knee["batch_wait_timeout_s"]
        raised = knee["max_ongoing"] if knee["max_ongoing"] != result["baseline"]["max_ongoing_requests"] else None
        env = result["environment"]
        note = (
            f"knee of `python -m benchmarks.sweep` {result['stamp']}: {knee['throughput_rps']:.1f} req/s, "
            f"p99 {knee['p99_ms']:.0f} ms\n(within {result['tolerance']:.0%} of the best throughput, lowest p99) on "
            f"{env['cpu_model']}, {env['usable_cpus']} cores,\n{result['variant']}, "
            f"closed loop c={result['concurrency']}: re-measure on the production hardware before relying on it"
        )
        print(f"\nknee: max_batch_size={knee['max_batch_size']} batch_wait_timeout_s={knee['batch_wait_timeout_s']}")
        print("user_config block for configs/prod.yaml (under applications[0].deployments):\n")
        print(config_block(result["deployment"], uc, raised, note))
    print(f"\nwrote {out} and {png}")
    return 0 if knee is not None and not result["restore"].get("restarted_during_sweep") else 1


if __name__ == "__main__":
    sys.exit(main())
