"""Where a target's CPU goes: one wrk step, and each of its processes' CPU per image served.

    python -m benchmarks.where --targets app_ortcpu,triton --workload v2 --concurrency 32
    python -m benchmarks.where --targets app_ortcpu --workload v2batch --concurrency 8 --py-spy
    python -m benchmarks.where --targets app_ortcpu,triton --workload v2 --concurrency 32 --perf

Starts each target as `make bench` does (`benchmarks.run.run_target`: a private Ray, configs/serve.env), runs one
closed-loop wrk step of a workload of benchmarks.run.WORKLOADS, and reads the CPU time of every process the target
started around the measured window. Processes are named by role: a Serve replica by its deployment, then HAProxy,
Ray's daemons (raylet, GCS, dashboard and its agents), Triton's server and stubs. With `--py-spy`, each replica is
also sampled by `py-spy record` for the window (collapsed stacks, and in the JSON the hottest functions and the
share of samples by package: ours, Ray Serve, Ray core, gRPC, the HTTP server, ...). With `--perf`, each of the
target's busy processes is also sampled by Linux `perf record` (every thread, native code included, no call
graphs), and its CPU is shared out by library: the engine, OpenCV, the Python interpreter, libc, the kernel, gRPC,
Ray's core: what py-spy cannot see (code that released the GIL, threads that are not Python's). perf slows what it
samples, unevenly (Triton's server fell from ~115 to 69 img/s under it in one run): take the shares from a `--perf`
run and throughput from one without.
Writes benchmarks/results/<stamp>-<host>-where.{json,md}.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil

from benchmarks import cost
from benchmarks.environment import RESULTS_DIR, host_name, stamp
from benchmarks.load import wrk_step
from benchmarks.report import markdown_table, pyplot, save_figure, write_report
from benchmarks.run import PY, TARGETS, WORKLOADS, Target, run_target, workload
from benchmarks.server_process import ServerProcess

ROLES = (  # (pattern on the process's argv, its role); the first match names it
    (r"ray::ServeReplica:[^:]+:(\w+)", r"\1"),
    (r"ray::ServeController", "Serve controller"),
    (r"haproxy", "HAProxy"),
    (r"raylet", "raylet"),
    (r"gcs_server", "GCS"),
    (r"dashboard/agent|dashboard_agent|runtime_env/agent", "dashboard agents"),
    (r"dashboard", "dashboard"),
    (r"log_monitor|monitor\.py", "Ray monitors"),
    (r"triton_python_backend_stub", "Triton Python stubs"),
    (r"tritonserver", "tritonserver"),
    (r"^(ray::\w+)", r"\1"),  # another Ray worker or actor, by its title
)


def role(argv: tuple[str, ...] | list[str]) -> str:
    """A process's role, from its command line (a Ray worker's argv[0] is its title)."""
    line = " ".join(argv)
    for pattern, name in ROLES:
        if m := re.search(pattern, line):
            return m.expand(name)
    return "the started process (a peer: its Python) and others"


def cpu_by_role(pids: dict[int, float]) -> dict[str, float]:
    """CPU seconds so far per role, over these processes (pid -> creation time; a reused pid is skipped)."""
    out: dict[str, float] = defaultdict(float)
    for pid, created in pids.items():
        with contextlib.suppress(psutil.Error):
            p = psutil.Process(pid)
            if abs(p.create_time() - created) > 1.0:
                continue
            out[role(p.cmdline())] += cost.process_cpu_s(p)
    return dict(out)


Sampler = dict[str, subprocess.Popen[bytes]]  # per process sampled (its name): the sampler running on it


def sample_each(pids: dict[str, int], command: Callable[[str, int], list[str]]) -> Sampler:
    """Start `command(name, pid)` for each process, its output silenced (the samplers write files)."""
    return {
        name: subprocess.Popen(command(name, pid), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for name, pid in pids.items()
    }


def py_spy(pids: dict[str, int], seconds: float, out_dir: Path) -> Sampler:
    """Start `py-spy record` on each replica for `seconds`: only samples of a thread holding the GIL (Python running;
    a thread waiting in C, or running C that released the GIL (ONNX Runtime, OpenCV, gRPC's core), is not sampled).
    Collapsed stacks: any flame graph tool draws them."""
    exe = shutil.which("py-spy") or str(Path(PY).parent / "py-spy")
    args = ["record", "-d", str(max(1, round(seconds))), "-r", "100", "--gil", "-f", "raw", "--nonblocking"]
    return sample_each(pids, lambda name, pid: [exe, *args, "-p", str(pid), "-o", str(out_dir / f"{name}.txt")])


LIBRARIES = (  # (pattern on a shared object's name, its group), the first match names it
    (r"onnxruntime|openvino|libdnnl|libtbb", "engine"),
    (r"cv2|libjpeg|libpng|libavif|libwebp|libopencv", "OpenCV"),
    (r"grpc", "gRPC"),
    (r"_raylet|libray", "Ray core"),
    (r"numpy|_multiarray|openblas", "numpy"),
    (r"libpython|^python3", "Python interpreter"),
    (r"\.cpython-\d+", "other Python extensions"),
    (r"^libc[.-]|^libm[.-]|libpthread|ld-linux", "libc"),
    (r"kernel", "kernel"),
)
PERF_HZ = 499  # samples a second per busy thread: enough for shares to ~1 point over 10 s, little overhead


def library(dso: str) -> str:
    for pattern, name in LIBRARIES:
        if re.search(pattern, dso):
            return name
    return "other native code"


def perf_record(pids: dict[str, int], seconds: float, out_dir: Path) -> Sampler:
    """Start `perf record` on each process for `seconds` (all its threads, user and kernel, no call graphs)."""
    exe = shutil.which("perf") or "perf"  # main() checked that it is there
    args, until = ["record", "-q", "-F", str(PERF_HZ)], ["--", "sleep", str(max(1, round(seconds)))]
    return sample_each(
        pids, lambda name, pid: [exe, *args, "-p", str(pid), "-o", str(out_dir / f"{name}.perf.data"), *until]
    )


def perf_counts(report: str) -> Counter[str]:
    """`perf report --sort dso -n -t ';'` output (share; samples; library) -> samples by library group."""
    counts: Counter[str] = Counter()
    for line in report.splitlines():
        fields = line.split(";")
        if line.startswith("#") or len(fields) != 3 or not fields[1].strip().isdigit():
            continue
        counts[library(fields[2].strip())] += int(fields[1])
    return counts


def perf_by_library(files: dict[str, Path]) -> dict[str, dict[str, float]]:
    """Per role, the share of its processes' perf samples by library group (a role's processes pooled: a peer's
    launcher and its server are one role). A file perf left empty or missing counts nothing."""
    pooled: dict[str, Counter[str]] = defaultdict(Counter)
    for name, data in files.items():
        if data.is_file():
            cmd = ["perf", "report", "-i", str(data), "--no-children", "--sort", "dso", "--stdio", "-g", "none"]
            done = subprocess.run([*cmd, "-n", "-t", ";"], capture_output=True, text=True, timeout=120, check=False)
            pooled[name.split("#")[0]] += perf_counts(done.stdout)
    return {r: {g: round(n / total, 3) for g, n in c.most_common()} for r, c in pooled.items() if (total := c.total())}


PACKAGES = (  # (pattern on a frame's file, its group), the first match names it
    (r"[(/]app/", "app (ours)"),
    (r"[(/]ray/serve/", "Ray Serve"),
    (r"[(/]ray/", "Ray core"),
    (r"grpc", "gRPC"),
    (r"starlette|uvicorn|httptools|h11", "HTTP server"),
    (r"onnxruntime|openvino", "engine"),
    (r"numpy|cv2", "numpy/OpenCV"),
    (r"asyncio/|concurrent/|threading\.py|selectors\.py", "asyncio and threads"),
)


def package(frame: str) -> str:
    for pattern, name in PACKAGES:
        if re.search(pattern, frame):
            return name
    return "other Python"


def stacks(raw: Path) -> Iterator[tuple[list[str], int]]:
    """py-spy's raw (collapsed) output: each stack, outermost frame first, and its sample count (none if the
    file is missing)."""
    with contextlib.suppress(OSError):
        for line in raw.read_text().splitlines():
            stack, _, samples = line.rpartition(" ")
            if samples.isdigit() and stack:
                yield stack.split(";"), int(samples)


def by_package(raw: Path) -> dict[str, dict[str, float]]:
    """Where a replica's samples were, by package: `self` the innermost frame's (what ran), `under` any frame's
    on the stack (what it was done for; a sample counts once per package)."""
    own: Counter[str] = Counter()
    under: Counter[str] = Counter()
    total = 0
    for frames, k in stacks(raw):
        total += k
        own[package(frames[-1])] += k
        for name in {package(f) for f in frames}:
            under[name] += k
    if not total:
        return {}
    share = lambda c: {n: round(v / total, 3) for n, v in c.most_common()}  # noqa: E731
    return {"self": share(own), "under": share(under), "samples": {"n": float(total)}}


def hottest(raw: Path, n: int = 12) -> list[tuple[str, float]]:
    """The functions that were on the stack most (inclusive share of samples), from py-spy's raw output."""
    counts: Counter[str] = Counter()
    total = 0
    for frames, k in stacks(raw):
        total += k
        for frame in set(frames):
            counts[re.sub(r" \(.*?/(site-packages|lib/python3\.\d+)/", " (", frame)] += k
    return [(f, round(c / total, 3)) for f, c in counts.most_common(n)] if total else []


PERFED = ("the started process", "tritonserver", "Triton Python stubs", "HAProxy")  # beside the replicas, with --perf


def measure(
    t: Target, name: str, concurrency: int, seconds: float, spy_dir: Path | None, perf_dir: Path | None = None
) -> Any:
    def steps(t: Target, plan: dict[str, Any], server: ServerProcess) -> list[dict[str, Any]]:
        server.snapshot_family()
        replicas: dict[str, int] = {}
        others: dict[str, int] = {}  # a peer's processes, HAProxy: sampled by perf only
        for pid in sorted(server.family):
            p = _proc(pid)
            if p is None or not p.cmdline():
                continue
            who = role(p.cmdline())  # not `name`: that is the workload's
            into = replicas if p.cmdline()[0].startswith("ray::ServeReplica:") else others
            if into is replicas or who.startswith(PERFED):
                into[f"{who}#{pid}" if who in into else who] = pid  # a second process of one role
        wl = workload(t, name, "fp32", plan["timeout_s"])
        before: dict[str, float] = {}
        spies: Sampler = {}

        def cpu() -> float:  # called by wrk_step just before and just after the measured run
            nonlocal before, spies
            now = cpu_by_role(server.family)
            if not before:
                before = now
                if spy_dir is not None:
                    spies = py_spy(replicas, seconds, spy_dir)
                if perf_dir is not None:
                    spies |= {f"perf:{k}": v for k, v in perf_record(replicas | others, seconds, perf_dir).items()}
            return sum(now.values())

        step = wrk_step(wl, concurrency, seconds, plan["warmup_s"], cpu)
        after = cpu_by_role(server.family)
        for p in spies.values():
            p.wait(timeout=60)
        if perf_dir is not None:
            step["perf_by_library"] = perf_by_library({r: perf_dir / f"{r}.perf.data" for r in replicas | others})
        images = step["images_per_s"] * step["window_s"]
        step["cpu_ms_per_image_by_role"] = {
            r: round((after[r] - before.get(r, 0.0)) * 1000 / images, 2) for r in sorted(after) if images
        }
        if spy_dir is not None:
            step["py_spy"] = {r: hottest(spy_dir / f"{r}.txt") for r in replicas}
            step["py_spy_by_package"] = {r: by_package(spy_dir / f"{r}.txt") for r in replicas}
        return [step]

    plan = {"timeout_s": 30.0, "warmup_s": 2.0}
    with tempfile.TemporaryDirectory(prefix="where-") as logs:
        return run_target(t, plan, Path(logs), steps)


def _proc(pid: int) -> psutil.Process | None:
    try:
        return psutil.Process(pid)
    except psutil.Error:
        return None


def to_markdown(result: dict[str, Any]) -> str:
    rows: dict[str, dict[str, float]] = {}
    names = []
    for t in result["targets"]:
        if t.get("error") or not t.get("steps"):
            continue
        names.append(t["name"])
        for r, ms in t["steps"][0]["cpu_ms_per_image_by_role"].items():
            rows.setdefault(r, {})[t["name"]] = ms
    table = [[r, *(rows[r].get(n, "") for n in names)] for r in sorted(rows, key=lambda r: -max(rows[r].values()))]
    table.append(["**all**", *(round(sum(v.get(n, 0.0) for v in rows.values()), 2) for n in names)])
    tput = [
        "images/s",
        *(round(t["steps"][0]["images_per_s"], 1) for t in result["targets"] if t.get("steps") and not t.get("error")),
    ]
    env = " ".join(f"{k}={v}" for k, v in result.get("env", {}).items())
    head = f"# CPU ms per image by process, {result['workload']} at c={result['concurrency']} {env}\n\n"
    tables = markdown_table(["process", *names], [tput, *table])
    return head + tables + "\n" + spy_markdown(result) + perf_markdown(result)


def perf_markdown(result: dict[str, Any]) -> str:
    """Per process sampled by perf: its CPU ms per image by library (its role's CPU times perf's shares)."""
    out = []
    groups = [name for _, name in LIBRARIES] + ["other native code"]
    for t in result["targets"]:
        step = (t.get("steps") or [{}])[0]
        ms = step.get("cpu_ms_per_image_by_role") or {}
        rows = [
            [r, ms[r], *(round(ms[r] * shares.get(g, 0.0), 2) for g in groups)]
            for r, shares in (step.get("perf_by_library") or {}).items()
            if ms.get(r, 0.0) >= 0.5
        ]
        if rows:
            out.append(
                f"\n## {t['name']}: each busy process's CPU ms per image by library (perf, every thread)\n\n"
                + markdown_table(["process", "all", *groups], rows)
                + "\n"
                + work_and_path(ms, step["perf_by_library"])
            )
    return "".join(out)


def work_and_path(ms: dict[str, float], shares: dict[str, dict[str, float]]) -> str:
    """The target's CPU per image split into the work (the engine and OpenCV, wherever they ran) and the rest: the
    serving path (a process perf did not sample counts whole as serving path)."""
    total = sum(ms.values())
    work = {g: sum(ms.get(r, 0.0) * s.get(g, 0.0) for r, s in shares.items()) for g in ("engine", "OpenCV")}
    path = total - sum(work.values())
    return (
        f"\nAll processes: {total:.2f} CPU-ms per image: the engine {work['engine']:.2f}, OpenCV {work['OpenCV']:.2f}, "
        f"**the serving path {path:.2f}** (everything else, every process).\n"
    )


def spy_markdown(result: dict[str, Any]) -> str:
    """Per replica sampled: its Python time (samples holding the GIL) by the package of the innermost frame."""
    out = []
    for t in result["targets"]:
        spied = (t.get("steps") or [{}])[0].get("py_spy_by_package") or {}
        rows = {r: v for r, v in spied.items() if v and v["samples"]["n"] >= 20}  # idle replicas say nothing
        if not rows:
            continue
        groups = [name for _, name in PACKAGES] + ["other Python"]
        table = [
            [r, int(v["samples"]["n"]), *(f"{v['self'].get(g, 0.0):.0%}" for g in groups)] for r, v in rows.items()
        ]
        out.append(
            f"\n## {t['name']}: where each replica's Python time went (py-spy, GIL held, by innermost frame)\n\n"
            + markdown_table(["replica", "samples", *groups], table)
            + "\n"
        )
    return "".join(out)


def plot(result: dict[str, Any], png: Path) -> Path:
    """One stacked bar per target: its CPU ms per image, by role (the small ones together)."""
    plt = pyplot()
    done = [t for t in result["targets"] if t.get("steps") and not t.get("error")]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    roles: dict[str, list[float]] = {}
    for i, t in enumerate(done):
        for r, ms in t["steps"][0]["cpu_ms_per_image_by_role"].items():
            key = r if ms >= 1.0 else "the rest (< 1 ms each)"
            roles.setdefault(key, [0.0] * len(done))[i] += ms
    bottom = [0.0] * len(done)
    for r, values in sorted(roles.items(), key=lambda kv: -max(kv[1])):
        ax.bar([t["name"] for t in done], values, bottom=bottom, label=r)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    for i, t in enumerate(done):
        label = f"{bottom[i]:.1f} ms, {t['steps'][0]['images_per_s']:.0f} img/s"
        ax.text(i, bottom[i], label, ha="center", va="bottom")
    ax.set_ylabel("server CPU ms per image")
    ax.set_title(f"CPU per image by process: {result['workload']}, c={result['concurrency']}")
    ax.set_ylim(0, max(bottom, default=1.0) * 1.45)  # room above the bars for the legend
    ax.legend(fontsize=8, loc="upper center", ncol=2)
    return save_figure(fig, png)


def render(path: Path) -> str:
    """The markdown and the plot of a saved run (its JSON), written beside it."""
    result = json.loads(path.read_text())
    md = to_markdown(result)
    stem = str(path).removesuffix(".json")  # not with_suffix: a host name in the stem may hold dots
    Path(f"{stem}.md").write_text(md)
    plot(result, Path(f"{stem}.png"))
    return md


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--targets", default="app_ortcpu,triton", help="keys of benchmarks.run.TARGETS")
    ap.add_argument("--workload", default="v2", choices=sorted(WORKLOADS))
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--duration", type=float, default=10.0, help="measured seconds")
    ap.add_argument("--py-spy", action="store_true", help="also sample each Serve replica with py-spy")
    ap.add_argument("--perf", action="store_true", help="also sample each busy process with Linux perf, by library")
    ap.add_argument("--out-dir", type=Path, default=RESULTS_DIR)
    ap.add_argument(
        "--env", action="append", default=[], metavar="KEY=VALUE", help="set for the targets (beyond serve.env)"
    )
    args = ap.parse_args(argv)
    if args.perf and shutil.which("perf") is None:  # before any target starts, not in the middle of a step
        ap.error("--perf needs Linux perf (apt: linux-perf)")
    env = dict(kv.split("=", 1) for kv in args.env)
    os.environ.update(env)  # every target's processes inherit it; configs/serve.env's own keys still win
    by_key = {t.key: t for t in TARGETS}
    stem = args.out_dir / f"{stamp()}-{host_name()}-where"
    spy_root = Path(f"{stem}-py-spy") if args.py_spy else None
    targets = []
    for key in args.targets.split(","):
        spy_dir = None
        if spy_root is not None:
            spy_dir = spy_root / key
            spy_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="where-perf-") as perf_tmp:  # perf's files are large: not kept
            perf_dir = Path(perf_tmp) if args.perf else None
            targets.append(measure(by_key[key], args.workload, args.concurrency, args.duration, spy_dir, perf_dir))
    result = {"workload": args.workload, "concurrency": args.concurrency, "env": env, "targets": targets}
    args.out_dir.mkdir(parents=True, exist_ok=True)
    md = to_markdown(result)
    print(md, write_report(stem, result, md), sep="\n")
    plot(result, Path(f"{stem}.png"))
    return 1 if any(t.get("error") for t in targets) else 0


if __name__ == "__main__":
    sys.exit(main())
