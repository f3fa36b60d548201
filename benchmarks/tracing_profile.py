"""Where tracing's CPU goes, free of the drift that CPU-per-image comparisons between steps carry: the CPU each
replica spent in tracing code, at a sampling ratio of 0.01 and at 1.0, on one server.

    python -m benchmarks.tracing_profile --pairs 4 --duration 12      # about 4 minutes on 2 cores
    python -m benchmarks.tracing_profile --pairs 4 --duration 12 --workload batch     # 16 images per request

The server is benchmarks.tracing_cost's "on" (configs/local.yaml as `make serve` serves it, every variant on ONNX
Runtime's CPU EP, OTLP/HTTP export to a receiver in this process, every 5 s). Its steps of one of benchmarks.run's
workloads ("sweep": single images, the default; "batch": 16 per request; FP32, c=8) alternate in pairs between
requests without a traceparent (0.01) and requests whose caller's traceparent says sampled (1.0), while
`py-spy record --gil` samples each replica 200 times a second (a thread holding the GIL:
Python running; each sample stands for 5 ms of it). A sample is tracing's when the export thread took it
(OpenTelemetry's BatchSpanProcessor worker: encoding, the OTLP post) or its innermost frame outside the standard
library is tracing code (OpenTelemetry, protobuf, Serve's tracing_utils, app.tracing, app.serve's batch_trace,
decode_trace, tracing). A step's tracing CPU per image: the replicas' tracing samples so counted, over the images
served; beside it, the server's whole CPU per image. Not seen: native code that released the GIL, and what tracing
does to the rest (garbage collection, caches). Writes <stamp>-<host>-tracing-profile.{json,md,png} in results/.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import cost
from benchmarks import run as bench
from benchmarks.environment import RESULTS_DIR, host_name, print_environment, stamp
from benchmarks.load import wrk_step
from benchmarks.report import markdown_table, write_json
from benchmarks.server_process import ServerProcess
from benchmarks.tracing_cost import sampled_caller, target
from benchmarks.where import _proc, role, stacks
from tests.otlp_receiver import Receivers

TRACING = re.compile(
    r"/opentelemetry/|/google/protobuf/|/ray/serve/_private/tracing_utils\.py|/app/tracing/"
    r"|/app/serve/(batch_trace|decode_trace|tracing)\.py"
)
STDLIB = re.compile(r"/lib/python3\.\d+/(?!site-packages/)")
WHAT = {"sweep": "single-image", "batch": "16-image"}
RATE = 200  # samples a second of a thread holding the GIL: each one stands for 1/RATE s of Python running
EXPORT_THREAD = re.compile(r"BatchProcessor\.worker .*/opentelemetry/")


def is_tracing(frames: list[str]) -> bool:
    """Whether a sample (its frames, outermost first, full file names) ran tracing code: the export thread's, or its
    innermost frame outside the standard library is tracing's."""
    if any(EXPORT_THREAD.search(f) for f in frames):
        return True
    for frame in reversed(frames):
        if not STDLIB.search(frame):
            return bool(TRACING.search(frame))
    return False


def tracing_share(raw: Path) -> tuple[int, int]:
    """(samples, samples that ran tracing code) in py-spy's raw output."""
    total = traced = 0
    for frames, n in stacks(raw):
        total += n
        traced += n if is_tracing(frames) else 0
    return total, traced


def replicas(server: ServerProcess) -> dict[str, int]:
    """The server's Serve replicas by deployment (the first process of each)."""
    server.snapshot_family()
    out: dict[str, int] = {}
    for pid in sorted(server.family):
        p = _proc(pid)
        if p is not None and (argv := p.cmdline()) and argv[0].startswith("ray::ServeReplica:"):
            out.setdefault(role(argv), pid)
    return out


def sampled_step(t: bench.Target, mode: str, plan: dict[str, Any], server: ServerProcess, spy: Path) -> dict[str, Any]:
    """One sweep step in `mode` with each replica sampled for the measured window; CPU per image by replica."""
    wl = dataclasses.replace(
        bench.workload(t, plan["workload"], "fp32", plan["timeout_s"]), extra=sampled_caller() if mode == "1.0" else ()
    )
    pids = replicas(server)
    exe = shutil.which("py-spy") or str(Path(bench.PY).parent / "py-spy")
    args = ["record", "-d", str(round(plan["duration_s"])), "-r", str(RATE), "--gil", "-f", "raw", "--full-filenames"]
    files = {name: spy / f"{mode}-{time.monotonic_ns()}-{name}.txt" for name in pids}
    before = {name: cost.tree_cpu_s([pid]) for name, pid in pids.items()}

    def cpu() -> float:
        return cost.tree_cpu_s(server.family)

    samplers: list[subprocess.Popen[bytes]] = []

    def started() -> float:  # the samplers start with the measured window, after the warm-up
        samplers.extend(
            subprocess.Popen(
                [exe, *args, "--nonblocking", "-p", str(pid), "-o", str(files[name])], stderr=subprocess.DEVNULL
            )
            for name, pid in pids.items()
        )
        return cpu()

    reads = iter([started, cpu])
    step = wrk_step(wl, 8, plan["duration_s"], plan["warmup_s"], lambda: next(reads)())
    for s in samplers:
        s.wait(timeout=60)
    images = step["images_per_s"] * step["window_s"]
    by: dict[str, Any] = {}
    for name, pid in pids.items():
        total, traced = tracing_share(files[name])
        by[name] = {
            "samples": total,
            "tracing_samples": traced,
            "share": traced / total if total else None,  # of the replica's Python samples
            "cpu_ms": (cost.tree_cpu_s([pid]) - before[name]) * 1000 / images if images else None,
            "python_ms": total / RATE * 1000 / images if images else None,
            "tracing_ms": traced / RATE * 1000 / images if images else None,
        }
    server_ms = step["server_cpu_s"] * 1000 / images if images else None
    traced_ms = sum(r["tracing_ms"] or 0.0 for r in by.values())
    return {
        "mode": mode,
        "images_per_s": step["images_per_s"],
        "cpu_ms_per_image": server_ms,
        "replicas": by,
        "tracing_ms_per_image": traced_ms,
        "tracing_fraction": traced_ms / server_ms if server_ms else None,
    }


def summarise(steps: list[dict[str, Any]]) -> dict[str, Any]:
    """Per mode: medians of the server's CPU per image, tracing's ms and fraction of it, and each replica's share."""
    out: dict[str, Any] = {}
    for mode in ("0.01", "1.0"):
        mine = [s for s in steps if s["mode"] == mode]
        names = sorted({n for s in mine for n in s["replicas"]})
        out[mode] = {
            "cpu_ms_per_image": statistics.median(s["cpu_ms_per_image"] for s in mine),
            "tracing_ms_per_image": statistics.median(s["tracing_ms_per_image"] for s in mine),
            "tracing_fraction": statistics.median(s["tracing_fraction"] for s in mine),
            "replicas": {
                n: {
                    "share": statistics.median(s["replicas"][n]["share"] or 0.0 for s in mine if n in s["replicas"]),
                    "cpu_ms": statistics.median(s["replicas"][n]["cpu_ms"] or 0.0 for s in mine if n in s["replicas"]),
                    "tracing_ms": statistics.median(
                        s["replicas"][n]["tracing_ms"] or 0.0 for s in mine if n in s["replicas"]
                    ),
                }
                for n in names
            },
        }
    added = out["1.0"]["tracing_ms_per_image"] - out["0.01"]["tracing_ms_per_image"]
    out["added_ms_per_image"] = added
    out["added_over_0.01"] = added / out["0.01"]["cpu_ms_per_image"]  # what 1.0 adds, as a fraction of 0.01's CPU
    return out


def write(result: dict[str, Any], base: Path) -> None:
    write_json(base.with_suffix(".json"), result)
    s = result["summary"]
    names = sorted(s["1.0"]["replicas"])
    rows = [
        [mode, s[mode]["cpu_ms_per_image"], s[mode]["tracing_ms_per_image"], 100 * s[mode]["tracing_fraction"]]
        + [100 * s[mode]["replicas"][n]["share"] for n in names]
        for mode in ("0.01", "1.0")
    ]
    headers = ["sampled", "server CPU ms/image", "tracing ms/image", "tracing % of server CPU"]
    headers += [f"{n}: % of its samples" for n in names]
    lines = [
        f"# Where tracing's CPU goes ({result['stamp']})",
        "",
        f"`{result['command']}`: one server (tracing on, OTLP/HTTP), {result['pairs']} pairs of "
        f"{WHAT[result['plan']['workload']]} steps "
        f"(c=8, {result['plan']['duration_s']} s each after {result['plan']['warmup_s']} s warm-up) alternating "
        f"0.01 and 1.0, each replica sampled by py-spy --gil {RATE} times a second. Medians over the steps of each "
        "mode; a replica's share is of its Python samples.",
        "",
        markdown_table(headers, rows, 2),
        "",
        f"Every request traced adds **{s['added_ms_per_image']:.2f} CPU-ms per image** in tracing code over 0.01, "
        f"**{100 * s['added_over_0.01']:.1f}%** of the server's CPU per image at 0.01 (as far as a Python profile "
        "sees: not native code that released the GIL, nor garbage collection or cache effects).",
        "",
        "Per step:",
        "",
        markdown_table(
            ["sampled", "images/s", "server CPU ms/image", "tracing ms/image", *(f"{n} CPU ms/image" for n in names)],
            [
                [st["mode"], st["images_per_s"], st["cpu_ms_per_image"], st["tracing_ms_per_image"]]
                + [st["replicas"].get(n, {}).get("cpu_ms") for n in names]
                for st in result["steps"]
            ],
            2,
        ),
    ]
    base.with_suffix(".md").write_text("\n".join(lines) + "\n")
    plot(result, base.with_suffix(".png"))


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = result["summary"]
    names = sorted(s["1.0"]["replicas"])
    fig, ax = plt.subplots(figsize=(7, 3.5))
    for i, mode in enumerate(("0.01", "1.0")):
        shares = [100 * s[mode]["replicas"][n]["share"] for n in names]
        ax.bar([x + i * 0.4 for x in range(len(names))], shares, 0.4, label=f"sampled {mode}")
    ax.set_xticks([x + 0.2 for x in range(len(names))], names)
    ax.set_ylabel("% of the replica's Python samples in tracing code")
    ax.set_title(f"Where tracing's CPU goes ({WHAT[result['plan']['workload']]}, c=8)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=4, help="0.01/1.0 step pairs")
    parser.add_argument("--duration", type=float, default=12.0, help="measured s per step")
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--workload", choices=sorted(WHAT), default="sweep")
    parser.add_argument("--out-dir", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    env, run_stamp, t0 = print_environment(), stamp(), time.perf_counter()
    plan = {"duration_s": args.duration, "warmup_s": args.warmup, "concurrency": [8], "timeout_s": 30.0}
    plan["workload"] = args.workload
    log_dir = Path(tempfile.mkdtemp(prefix="tracing-profile-"))
    print(f"server logs and samples: {log_dir}", file=sys.stderr)
    modes = [m for p in range(args.pairs) for m in (("0.01", "1.0") if p % 2 == 0 else ("1.0", "0.01"))]

    def steps(t: bench.Target, plan: dict[str, Any], server: ServerProcess) -> list[dict[str, Any]]:
        return [sampled_step(t, mode, plan, server, log_dir) for mode in modes]

    with Receivers() as receivers:
        receivers.sink.keep = False
        out = bench.run_target(target("on", receivers.http_url), plan, log_dir, steps)
    if out.get("error"):
        raise RuntimeError(out["error"])
    result = {
        "stamp": run_stamp,
        "environment": env,
        "command": "python -m benchmarks.tracing_profile " + " ".join(argv if argv is not None else sys.argv[1:]),
        "pairs": args.pairs,
        "plan": plan,
        "steps": out["steps"],
        "summary": summarise(out["steps"]),
        "wall_s": round(time.perf_counter() - t0, 1),
    }
    base = args.out_dir / f"{run_stamp}-{host_name()}-tracing-profile{'' if args.workload == 'sweep' else '-batch'}"
    write(result, base)
    print(base.with_suffix(".md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
