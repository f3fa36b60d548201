"""The cascade served: `auto` fitted by the app from live shadows, then throughput and agreement over HTTP.

    python -m benchmarks.cascade_served            # 360 images (benchmarks/cascade.py's corpus), ~4 minutes
    python -m benchmarks.cascade_served --quick    # 4 variations per photograph

Two starts of configs/local.yaml (by default every variant on ORT's CPU EP, so both starts run the same INT8
kernels; `--engine auto` keeps local.yaml's own rule, the faster of OpenVINO and the CPU EP measured at each start,
and records what each start picked):
1. **Fit, from live shadows.** The cascade `int8>fp32` with `margin: auto` (target 0.995, min_samples: the fit
   half's size), `shadow_fraction: 1`; the fit half (every other image) goes to INT8 as 16-image
   /v1/classify/batch requests, one at a time, so every image is shadowed on FP32. The threshold is what
   `GET /v1/ab/summary` says the app fitted.
2. **Measure.** The cascade at that threshold (fixed, no shadows); the held-out half as 16-image requests in wrk,
   c=8, for INT8, FP32 and the cascade, in one run. Then one pass of the held-out half through the cascade and FP32
   (untimed): the cascade's top-1 agreement with FP32 and its share escalated, from its replies.
Writes benchmarks/results/<stamp>-<host>-cascade-served.{json,md,png}.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from app.config import read_serve_env
from app.front.instance import private_serve_env
from benchmarks import cost
from benchmarks.cascade import BATCH, GOAL, TARGET, corpus, save
from benchmarks.environment import RESULTS_DIR, host_name, print_environment, stamp
from benchmarks.load import CorpusImage, Payload, Workload, multipart_body, wrk_step
from benchmarks.report import markdown_table, pyplot, save_figure
from benchmarks.run import FAILED, REPO, write_config
from benchmarks.server_process import ServerProcess

PORT = 8000
URL = f"http://127.0.0.1:{PORT}"
CASCADE = "int8>fp32"
CONCURRENCY = 8


def config(directory: Path, cascade: dict[str, Any], shadow: float, engine: str) -> Path:
    """local.yaml with this cascade and shadow fraction; engine "cpu": every variant on ORT's CPU EP (benchmarks.run's
    "ortcpu"), "auto": local.yaml's engines as written."""
    path = write_config(directory, "ortcpu" if engine == "cpu" else "asis")
    cfg = yaml.safe_load(path.read_text())
    app = cfg["applications"][0]
    app["args"]["cascades"] = {CASCADE: {"first": "int8", "then": "fp32", **cascade}}
    router = app["deployments"][0]["user_config"]
    router |= {"shadow_fraction": shadow, "max_shadow_in_flight": 64}
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def started(directory: Path, path: Path, name: str) -> ServerProcess:
    serve = Path(sys.executable).parent / "serve"  # this venv's, even when not activated
    cmd = [str(serve) if serve.is_file() else "serve", "run", str(path)]
    env = private_serve_env(PORT, {**read_serve_env(), "RAY_ADDRESS": "local"})
    server = ServerProcess(name, cmd, directory / f"{name}.log", cwd=REPO, env=env, fail_patterns=FAILED)
    server.start()
    try:
        server.wait_ready(URL + "/readyz", 240)
    except BaseException:
        server.stop()
        raise
    server.snapshot_family()
    return server


def batches(images: list[tuple[str, bytes]]) -> list[list[CorpusImage]]:
    items = [CorpusImage(f"{photo}-{i}", 0, 0, data) for i, (photo, data) in enumerate(images)]
    return [items[i : i + BATCH] for i in range(0, len(items), BATCH)]


def classify(client: httpx.Client, batch: list[CorpusImage], variant: str) -> list[dict[str, Any]]:
    body, headers = multipart_body(batch)
    r = client.post(URL + "/v1/classify/batch", content=body, headers={**headers, "X-Model-Variant": variant})
    r.raise_for_status()
    results: list[dict[str, Any]] = r.json()["results"]
    return results


def engines(client: httpx.Client) -> dict[str, str]:
    """The engine each variant's replica runs (picked at its start under engine auto)."""
    return {name: v["engine"] for name, v in client.get(URL + "/v1/models").json()["variants"].items()}


def fit(directory: Path, fit_half: list[tuple[str, bytes]], engine: str) -> dict[str, Any]:
    """Phase 1: the app fits `auto` from its own shadows of the fit half."""
    cascade = {"margin": "auto", "target_agreement": TARGET, "min_samples": len(fit_half)}
    server = started(directory, config(directory, cascade, 1.0, engine), "cascade-fit")
    try:
        with httpx.Client(timeout=60) as client:
            picked = engines(client)
            for batch in batches(fit_half):
                classify(client, batch, "int8")
            summary: dict[str, Any] = {}
            deadline = time.monotonic() + 60  # the shadows finish and reach the ledger within seconds: poll
            while time.monotonic() < deadline:
                summary = client.get(URL + "/v1/ab/summary").json()["cascades"][CASCADE]
                if summary["evidence"]["comparisons"] >= len(fit_half) and summary["fit"]["fitted"]:
                    break
                time.sleep(0.2)
            else:
                raise RuntimeError(f"the app did not fit auto from {len(fit_half)} shadows: {summary}")
    finally:
        stop = server.stop()
    return {"summary": summary, "engines": picked, "stop": stop}


@dataclasses.dataclass(frozen=True)
class BatchWorkload(Workload):
    """16-image /v1/classify/batch requests of the held-out images (not benchmarks.corpus's)."""

    bodies: tuple[Payload, ...] = ()

    def payloads(self) -> tuple[Payload, ...]:
        return self.bodies


def measure(
    directory: Path, held_out: list[tuple[str, bytes]], threshold: float, seconds: float, engine: str
) -> dict[str, Any]:
    """Phase 2: throughput of INT8, FP32 and the cascade in wrk; the cascade's agreement and escalation."""
    server = started(directory, config(directory, {"margin": threshold}, 0.0, engine), "cascade-measure")
    out: dict[str, Any] = {}
    try:
        with httpx.Client(timeout=60) as client:
            out["engines"] = engines(client)
        items = [im for b in batches(held_out) for im in b]
        starts = range(0, len(items), max(1, len(items) // 48))  # up to 48 bodies, 16 images each, cyclically
        bodies = tuple(multipart_body([items[(i + j) % len(items)] for j in range(BATCH)]) for i in starts)
        steps = []
        for variant in ("fp32", "int8", CASCADE, "fp32"):  # FP32 twice, first and last: drift shows
            wl = BatchWorkload(URL + "/v1/classify", variant, BATCH, 60.0, bodies=bodies)
            step = wrk_step(wl, CONCURRENCY, seconds, 2.0, lambda: cost.tree_cpu_s(server.family))
            steps.append({"variant": variant, **step})
        out["steps"] = steps
        agree = escalated = n = 0
        with httpx.Client(timeout=60) as client:
            for batch in batches(held_out):
                mine, theirs = classify(client, batch, CASCADE), classify(client, batch, "fp32")
                for a, b in zip(mine, theirs, strict=True):
                    n += 1
                    agree += a["predictions"][0]["class_id"] == b["predictions"][0]["class_id"]
                    escalated += bool(a["cascade"]["escalated"])
        out |= {"images": n, "agreement": agree / n, "escalation": escalated / n}
    finally:
        out["stop"] = server.stop()
    return out


def summarize(result: dict[str, Any]) -> dict[str, Any]:
    steps = result["measured"]["steps"]
    rate = {s["variant"]: s["images_per_s"] for s in steps if s["variant"] != "fp32"}
    fp32 = [s["images_per_s"] for s in steps if s["variant"] == "fp32"]
    base = sum(fp32) / len(fp32)
    return {
        "img_per_s": {"fp32 (mean of first and last)": round(base, 1), **rate},
        "vs_fp32": {k: round(v / base, 3) for k, v in rate.items()},
        "threshold": result["threshold"],
        "agreement": round(result["measured"]["agreement"], 4),
        "escalation": round(result["measured"]["escalation"], 4),
        "goal": GOAL,
    }


def to_markdown(r: dict[str, Any]) -> str:
    s = r["summary"]
    rows = [[k, v, f"{s['vs_fp32'].get(k, 1.0):.2f}x"] for k, v in s["img_per_s"].items()]
    return (
        f"# Cascade {CASCADE}, served: {r['images']} images, fitted on {r['fit_images']}, read on the rest\n\n"
        f"`auto` (target {TARGET}) fitted by the app from {r['fit_images']} live shadow comparisons: threshold "
        f"**{s['threshold']:.2f}**. Served on the held-out half: agreement with FP32 **{s['agreement']:.3f}**, "
        f"escalated {s['escalation']:.3f} (goal: agreement >= {GOAL['agreement']} and >= {GOAL['speedup']}x FP32).\n\n"
        f"Engines (`--engine {r.get('engine', 'cpu')}`): fit start {r['fit'].get('engines')}, "
        f"measuring start {r['measured'].get('engines')}.\n\n"
        + markdown_table([f"{BATCH} images/request, c={CONCURRENCY}", "img/s", "vs FP32"], rows)
        + "\n"
    )


def plot(r: dict[str, Any], png: Path) -> Path:
    plt = pyplot()
    s = r["summary"]
    fig, ax = plt.subplots(figsize=(7, 4))
    names = list(s["img_per_s"])
    bars = ax.bar(names, [s["img_per_s"][n] for n in names], color=["tab:blue", "tab:orange", "tab:green"])
    ax.bar_label(bars, fmt="%.1f")
    ax.set_ylabel(f"images/s ({BATCH}-image requests, c={CONCURRENCY})")
    ax.set_title(
        f"{CASCADE} at auto = {s['threshold']:.2f}: agreement {s['agreement']:.3f}, escalated {s['escalation']:.2f}"
    )
    return save_figure(fig, png)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--per-photo", type=int, default=60, help="variations of each sample photograph")
    ap.add_argument("--quick", action="store_true", help="4 variations per photograph, 3 s steps")
    ap.add_argument("--seconds", type=float, default=10.0, help="each wrk step")
    ap.add_argument(
        "--engine",
        choices=["cpu", "auto"],
        default="cpu",
        help="cpu: every variant on ORT's CPU EP; auto: local.yaml's rule (the faster of OpenVINO and the CPU EP)",
    )
    ap.add_argument("--out-dir", type=Path, default=RESULTS_DIR)
    args = ap.parse_args(argv)
    env = print_environment()
    images = corpus(4 if args.quick else args.per_photo)
    fit_half, held_out = images[0::2], images[1::2]
    with tempfile.TemporaryDirectory(prefix="cascade-served-") as tmp:
        fitted = fit(Path(tmp), fit_half, args.engine)
        threshold = float(fitted["summary"]["threshold"])
        measured = measure(Path(tmp), held_out, threshold, 3.0 if args.quick else args.seconds, args.engine)
    result = {
        "environment": env,
        "engine": args.engine,
        "images": len(images),
        "fit_images": len(fit_half),
        "threshold": threshold,
        "fit": fitted,
        "measured": measured,
    }
    result["summary"] = summarize(result)
    save(result, args.out_dir / f"{stamp()}-{host_name()}-cascade-served", to_markdown, plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
