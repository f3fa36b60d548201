"""Models from storage, measured: a replica's start from a cold and a warm cache, one download per node, a release in
place under load, and a release with a wrong digest.

    python -m benchmarks.model_release                 # about 8 minutes on 2 cores
    python -m benchmarks.model_release --window-s 60 --out-dir /tmp/mr

An S3-compatible store runs in this process (moto's server, `tests.storage_servers.S3Server`: the test extra), reached
by the app only through the standard AWS_* variables, as it would reach S3. The model is published to it with
`python -m app.models publish` (version 1: configs/local.yaml's files; version 2: the same graphs with another
producer version in their metadata, so other bytes and digests). Then, each a `serve run` of configs/local.yaml with
the variants named by their s3:// URIs and sha256s (Classifier_int8 with two replicas on this one node):

1. cold: an empty model cache. Seconds from `serve run` to /readyz, each replica's fetch (its `fetch_s` in
   /v1/models), and the GETs the store answered per object: one per node however many replicas start.
2. a release under load: wrk at --concurrency single images for --before-s (before), then for --window-s while
   `serve deploy` changes both Classifiers' user_config to version 2 (a lightweight update: no restart): failed
   requests (non-200 or socket errors), p50/p99 during against before, and seconds from `serve deploy` to every
   replica serving version 2 (/v1/models polled; a replica counts once it was seen on the new version and the old
   one was not seen since).
3. a wrong digest: the same, user_config naming version 1's INT8 file with a sha256 of zeros: failed requests, and
   the replicas still on version 2, their release state `failed`.
4. warm: `serve run` again on the same cache with version 2: no GET, start seconds; and local: the files from the
   disk (configs/local.yaml as it is), the baseline a start from storage is compared with.

Writes <stamp>-<host>-model-release.json, .md and .png under benchmarks/results/.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from app.served_model import BUILTIN_MODEL
from benchmarks.environment import REPO, RESULTS_DIR, host_name, print_environment, stamp
from benchmarks.load import Workload, wrk_step
from benchmarks.report import markdown_table
from benchmarks.server_process import ServerProcess, free_port

PY = sys.executable
SERVE = str(Path(PY).parent / "serve")
BUCKET = "models"


def publish(config: Path, env: dict[str, str]) -> dict[str, Any]:
    out = subprocess.run(
        [PY, "-m", "app.models", "publish", "--config", str(config), "--to", f"s3://{BUCKET}/releases", "--json"],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        check=True,
    )
    return dict(json.loads(out.stdout))


def second_version(directory: Path) -> Path:
    """configs/local.yaml's two files with another producer version in their metadata (other bytes, same graph)."""
    import onnx

    cfg = yaml.safe_load((REPO / "configs" / "local.yaml").read_text())
    app = cfg["applications"][0]
    for v in app["args"]["variants"].values():
        m = onnx.load(str(REPO / v["model_path"]))
        m.producer_version = (m.producer_version or "") + "+v2"
        out = directory / Path(v["model_path"]).name
        onnx.save(m, str(out))
        v["model_path"] = str(out)
    path = directory / "local-v2.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def app_config(directory: Path, name: str, published: dict[str, Any] | None, cache: Path, port: int) -> Path:
    """configs/local.yaml on `port`, its variants from `published` (None: the local files), two INT8 replicas."""
    cfg = yaml.safe_load((REPO / "configs" / "local.yaml").read_text())
    cfg["http_options"]["port"] = port
    cfg.pop("grpc_options", None)
    app = cfg["applications"][0]
    if published is None:
        for v in app["args"]["variants"].values():
            v["model_path"] = str(REPO / v["model_path"])
    else:
        for variant, block in published["args"]["variants"].items():
            app["args"]["variants"][variant].update(block)
        app["args"]["model"] = {**app["args"].get("model", BUILTIN_MODEL), **published["args"]["model"]}
    app["args"]["model_cache"] = {"dir": str(cache)}
    for d in app["deployments"]:
        if d["name"] == "Classifier_int8":
            d["num_replicas"] = 2
    path = directory / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def with_user_config(path: Path, versions: dict[str, dict[str, Any]]) -> Path:
    cfg = yaml.safe_load(path.read_text())
    for d in cfg["applications"][0]["deployments"]:
        if d["name"].removeprefix("Classifier_") in versions:
            d["user_config"] = {**d.get("user_config", {}), **versions[d["name"].removeprefix("Classifier_")]}
    out = path.with_name(path.stem + "-" + "-".join(sorted(versions)) + f"-{len(list(path.parent.iterdir()))}.yaml")
    out.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return out


class Replicas:
    """Each Classifier replica's model version as /v1/models shows it (one replica per variant per answer; polled
    until each replica has been seen)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.seen: dict[str, dict[str, Any]] = {}  # replica id -> {variant, version, state, at}

    def poll(self) -> None:
        variants = httpx.get(self.url + "/v1/models", timeout=10).json()["variants"]
        for name, v in variants.items():
            if "model_version" in v:
                mv = v["model_version"]
                version = (mv.get("serving") or {}).get("version")
                self.seen[v["replica_id"]] = {"variant": name, "version": version, "state": mv["state"], "v": mv}

    def all_on(self, digests: dict[str, str], replicas: dict[str, int]) -> bool:
        for variant, n in replicas.items():
            on = [r for r in self.seen.values() if r["variant"] == variant]
            if len(on) < n or any(r["version"] != digests[variant] for r in on):
                return False
        return True


def start(name: str, config: Path, env: dict[str, str], logs: Path, port: int) -> tuple[ServerProcess, float]:
    server = ServerProcess(
        f"serve-{name}",
        [SERVE, "run", str(config)],
        logs / f"serve-{name}.log",
        cwd=REPO,
        env={**env, "RAY_ADDRESS": "local"},
        fail_patterns=("DEPLOY_FAILED", r"Deploying app '[^']*' failed"),
    )
    t0 = time.perf_counter()
    server.start()
    try:
        server.wait_ready(f"http://127.0.0.1:{port}/readyz", 300)
    except BaseException:
        server.stop()
        raise
    return server, round(time.perf_counter() - t0, 1)


def fetches(url: str, rounds: int = 40) -> dict[str, list[dict[str, Any]]]:
    r = Replicas(url)
    for _ in range(rounds):
        r.poll()
    return {
        rid: [{k: f[k] for k in ("field", "downloaded", "fetch_s", "bytes")} for f in s["v"]["serving"]["files"]]
        for rid, s in r.seen.items()
    }


def release_under_load(
    url: str, config: Path, wl: Workload, concurrency: int, window_s: float, digests: dict[str, str], failed: bool
) -> dict[str, Any]:
    """wrk for `window_s` while `serve deploy config` runs (2 s in); until every replica is on `digests` (or, `failed`,
    until each INT8 replica's release is refused: the config changes only Classifier_int8's)."""
    result: dict[str, Any] = {}
    load = threading.Thread(target=lambda: result.update(wrk_step(wl, concurrency, window_s, warmup_s=0)))
    load.start()
    time.sleep(2.0)  # a pace: the load runs before the change, not a wait for anything
    t0 = time.perf_counter()
    deployed = subprocess.run(
        [SERVE, "deploy", str(config), "-a", "http://127.0.0.1:8265"],
        capture_output=True,
        text=True,
        env={**os.environ, "RAY_AUTH_MODE": "token"},  # serve run's cluster asks the CLI for its token
    )
    if deployed.returncode:
        load.join()
        raise RuntimeError(f"serve deploy: {deployed.stderr.strip()[-2000:]}")
    replicas, done_s = Replicas(url), None
    expect = {"int8": 2, "fp32": 1}
    while time.perf_counter() - t0 < window_s - 4:
        replicas.poll()
        states = [r["state"] for r in replicas.seen.values() if r["variant"] == "int8"]
        if failed and len(states) == expect["int8"] and all(s == "failed" for s in states):
            done_s = round(time.perf_counter() - t0, 1)
            break
        if not failed and replicas.all_on(digests, expect):
            done_s = round(time.perf_counter() - t0, 1)
            break
        time.sleep(0.25)  # the poll's period
    load.join()
    return {
        "seconds_to_every_replica": done_s,
        "replicas": {
            rid: {k: s[k] for k in ("variant", "version", "state")} | {"error": s["v"].get("error")}
            for rid, s in replicas.seen.items()
        },
        "load": result,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    from tests.storage_servers import S3Server

    work = Path(tempfile.mkdtemp(prefix="model-release-"))
    port = free_port()
    wl = Workload(url=f"http://127.0.0.1:{port}/v1/classify")
    out: dict[str, Any] = {"concurrency": args.concurrency, "window_s": args.window_s, "before_s": args.before_s}
    try:
        with S3Server() as s3:
            env = s3.env()
            s3.client().create_bucket(Bucket=BUCKET)
            v1 = publish(REPO / "configs" / "local.yaml", env)
            v2 = publish(second_version(work), env)
            out["published"] = {"v1": v1["prefix"], "v2": v2["prefix"]}
            objects = {
                f"{n}:{v}": u["model_path"]
                for n, pub in (("v1", v1), ("v2", v2))
                for v, u in pub["args"]["variants"].items()
            }
            cache = work / "cache"
            cold_cfg = app_config(work, "cold", v1, cache, port)
            server, cold_s = start("cold", cold_cfg, env, work, port)
            try:
                url = f"http://127.0.0.1:{port}"
                out["cold"] = {
                    "start_s": cold_s,
                    "fetches": fetches(url),
                    "gets": {k: s3.count("GET", u) for k, u in objects.items()},
                }
                print(f"cold start {cold_s} s; GETs {out['cold']['gets']}", file=sys.stderr)
                out["before"] = wrk_step(wl, args.concurrency, args.before_s, warmup_s=2)
                v2_user = {
                    v: {"model_path": b["model_path"], "sha256": b["sha256"]} for v, b in v2["args"]["variants"].items()
                }
                digests = {v: b["sha256"] for v, b in v2_user.items()}
                out["release"] = release_under_load(
                    url, with_user_config(cold_cfg, v2_user), wl, args.concurrency, args.window_s, digests, False
                )
                print(f"release: {out['release']['seconds_to_every_replica']} s", file=sys.stderr)
                bad = {"int8": {"model_path": v1["args"]["variants"]["int8"]["model_path"], "sha256": "0" * 64}}
                bad_cfg = with_user_config(with_user_config(cold_cfg, v2_user), bad)
                out["wrong_digest"] = release_under_load(
                    url, bad_cfg, wl, args.concurrency, args.window_s, digests, True
                )
                out["gets_after_releases"] = {k: s3.count("GET", u) for k, u in objects.items()}
            finally:
                out["cold"]["stopped"] = server.stop()
            warm_cfg = with_user_config(app_config(work, "warm", v2, cache, port), {})
            gets0 = {k: s3.count("GET", u) for k, u in objects.items()}
            server, warm_s = start("warm", warm_cfg, env, work, port)
            try:
                out["warm"] = {
                    "start_s": warm_s,
                    "fetches": fetches(f"http://127.0.0.1:{port}"),
                    "new_gets": {k: s3.count("GET", u) - gets0[k] for k, u in objects.items()},
                }
            finally:
                server.stop()
        server, local_s = start("local", app_config(work, "local", None, work / "cache-local", port), {}, work, port)
        try:
            out["local"] = {"start_s": local_s, "fetches": fetches(f"http://127.0.0.1:{port}")}
        finally:
            server.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out


def failures(step: dict[str, Any]) -> int:
    return int(sum(step["errors"].values())) if step.get("errors") else 0


def rows(r: dict[str, Any]) -> list[list[Any]]:
    def fetch_s(which: str) -> str:
        per = [sum(f["fetch_s"] for f in files) for files in r[which]["fetches"].values()]
        return "/".join(f"{s:.2f}" for s in per)

    out = [
        ["start, local files", f"{r['local']['start_s']} s", f"fetch+check per replica {fetch_s('local')} s"],
        ["start, cold cache (S3)", f"{r['cold']['start_s']} s", f"fetch+check per replica {fetch_s('cold')} s"],
        ["start, warm cache (S3)", f"{r['warm']['start_s']} s", f"fetch+check per replica {fetch_s('warm')} s"],
        ["GETs per object, cold start (3 replicas)", json.dumps(r["cold"]["gets"]), ""],
        ["GETs per object, warm start", json.dumps(r["warm"]["new_gets"]), ""],
    ]
    b = r["before"]
    for name in ("release", "wrong_digest"):
        s = r[name]["load"]
        out.append(
            [
                f"{name}: failed requests / sent",
                f"{failures(s)} / {s['requests']}",
                f"p50 {s['latency_ms']['p50_ms']} ms, p99 {s['latency_ms']['p99_ms']} ms (before: "
                f"{b['latency_ms']['p50_ms']}, {b['latency_ms']['p99_ms']} ms; {failures(b)} failed)",
            ]
        )
        out.append([f"{name}: seconds from serve deploy", str(r[name]["seconds_to_every_replica"]), ""])
    return out


def plot(r: dict[str, Any], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    starts = {k: r[k]["start_s"] for k in ("local", "cold", "warm")}
    a.bar(list(starts), list(starts.values()), color=["grey", "tab:blue", "tab:green"])
    a.set_ylabel("seconds from serve run to /readyz")
    a.set_title("a start")
    steps = {"before": r["before"], "release": r["release"]["load"], "wrong digest": r["wrong_digest"]["load"]}
    x = range(len(steps))
    for off, q in ((-0.2, "p50_ms"), (0.2, "p99_ms")):
        b.bar([i + off for i in x], [s["latency_ms"][q] or 0 for s in steps.values()], width=0.4, label=q[:3])
    b.set_xticks(list(x), [f"{k}\n{failures(s)} failed" for k, s in steps.items()])
    b.set_ylabel("latency, ms")
    b.set_title(f"c={r['concurrency']} single images")
    b.legend()
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--before-s", type=float, default=15.0)
    ap.add_argument("--window-s", type=float, default=90.0, help="wrk's run around each release")
    ap.add_argument("--out-dir", type=Path, default=RESULTS_DIR)
    args = ap.parse_args(argv)
    env = print_environment()
    t0 = time.perf_counter()
    result = {"stamp": stamp(), "environment": env, **run(args)}
    result["wall_s"] = round(time.perf_counter() - t0, 1)
    stem = args.out_dir / f"{result['stamp']}-{host_name()}-model-release"
    stem.parent.mkdir(parents=True, exist_ok=True)
    table = markdown_table(["measured", "value", "beside it"], rows(result))
    Path(f"{stem}.json").write_text(json.dumps(result, indent=2) + "\n")
    plot(result, Path(f"{stem}.png"), f"models from storage; {env['cpu_model']}, {result['stamp']}")
    Path(f"{stem}.md").write_text(
        f"# Models from storage: start, release, wrong digest ({result['stamp']})\n\n{table}\n"
    )
    print(table)
    print(f"wrote {stem}.json, .md, .png ({result['wall_s']} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
