"""The kit's steps on the node, each under a timeout that fits one device command, each leaving its results in $OUT
the moment it ends.

    python -m benchmarks.gpu_kit.runner PHASE[,PHASE] --store STORE --out OUT --models DIR [--cpu-dry-run]
                                        [--started EPOCH_S] [-- ARGS for gpu_serve]

run.sh calls it once the segments a phase needs are unpacked; the phases and their steps:

    engines     gpu_check (the engines' own rates: the reference the served run is judged against), gpu_decode
    serve       gpu_serve (host decode); if it does not become ready (exit 3), once more with --no-cuda-graphs
    gpu-decode  gpu_serve --decode-in gpu (an optional call of its own, when device time is left)

A device command ends at CALL_LIMIT_S (600 s) and what it has not put in $OUT by then is lost, so every step gets
min(its own limit, what is left of the command's limit less SPARE_S and the kill's grace), counted from --started
(run.sh's own start: receiving and unpacking count), and a step that would get less than its minimum is skipped,
said so. gpu_serve is told its time (--time-limit) and sets its ready deadline inside it, so its `serve status` and
the replicas' errors are printed and kept before the step's timeout could kill it. As each step ends (timed out
too), its console output and its result files are archived into OUT/NN-STEP.tar.gz, and its console output is in
OUT/NN-STEP.log while it runs: a command killed from outside still brings back what ran. The store keeps each
step's results too (STORE/results/STEP/), so gpu_serve, calls later, is judged against the gpu_check of the same
node. Standard library only: it runs on the node before the kit's site is known to import.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

CALL_LIMIT_S = 600  # one device command's limit
SPARE_S = 60  # the steps of a command end at least this long before its limit
KILL_AFTER_S = 20  # a step that outlives its timeout: SIGTERM, then SIGKILL this long after (gpu_serve stops Ray)
SETUP_S = 30  # what a command spends before its first step (receive, unpack a segment, the requirements check)
TIMED_OUT = 124  # timeout(1)'s status, kept for a step this runner stopped
NOT_READY = 3  # gpu_serve: the app did not become ready (benchmarks/gpu_serve/run.py)
ENGINES, SERVE, GPU_DECODE = "engines", "serve", "gpu-decode"
PHASES = (ENGINES, SERVE, GPU_DECODE)
TARGETS = "cuda-fp32,cuda-fp32-graphs,cuda-fp16,cuda-fp16-graphs,trt-int8,trt-fp16"  # gpu_check's (KIT_TARGETS)
DURATION_S = "10"  # gpu_serve's measured seconds per throughput step on the node (its default 20 does not fit)


@dataclass(frozen=True)
class Step:
    """One step: the module it runs, its phase, its limit, the least worth starting it with, and what it is expected
    to take on an H100/H200-class node (the plan's estimate: gpu_check from the H200 run of 2026-12-04, the others
    from their own plans)."""

    number: int
    name: str
    phase: str
    module: str
    limit_s: int
    min_s: int
    expected_s: int
    args: tuple[str, ...] = ()
    retry_of: str | None = None  # runs only when that step exited NOT_READY


STEPS = (
    Step(1, "gpu_check", ENGINES, "benchmarks.gpu_check", limit_s=200, min_s=90, expected_s=120),
    Step(2, "gpu_decode", ENGINES, "benchmarks.gpu_decode", limit_s=100, min_s=40, expected_s=45),
    Step(3, "gpu_serve", SERVE, "benchmarks.gpu_serve", limit_s=255, min_s=180, expected_s=180),
    Step(
        4,
        "gpu_serve-nographs",
        SERVE,
        "benchmarks.gpu_serve",
        limit_s=215,
        min_s=150,
        expected_s=0,
        args=("--no-cuda-graphs",),
        retry_of="gpu_serve",
    ),
    Step(
        5,
        "gpu_serve-gpu-decode",
        GPU_DECODE,
        "benchmarks.gpu_serve",
        limit_s=255,
        min_s=180,
        expected_s=180,
        args=("--decode-in", "gpu"),
    ),
)


def steps_of(phases: list[str]) -> list[Step]:
    return [s for s in STEPS if s.phase in phases]


def worst_case_s(phase: str) -> int:
    """A command running `phase` alone, every step to its limit and the kill's grace: what it may take at most."""
    return SETUP_S + sum(s.limit_s + KILL_AFTER_S for s in steps_of([phase]))


def phases_over_limit() -> list[str]:
    """The phases whose worst case would not end SPARE_S before a command's limit (none, as the steps are set)."""
    return [p for p in PHASES if worst_case_s(p) > CALL_LIMIT_S - SPARE_S]


def given_s(step: Step, left_s: float) -> int:
    """The timeout `step` gets with `left_s` left of the command (0: not enough, skip it)."""
    room = int(left_s - SPARE_S - KILL_AFTER_S)
    timeout = min(step.limit_s, room)
    return timeout if timeout >= step.min_s else 0


def latest(folder: Path, pattern: str) -> Path | None:
    found = sorted(folder.glob(pattern), key=lambda p: p.name) if folder.is_dir() else []
    return found[-1] if found else None


@dataclass
class Context:
    store: Path  # the kit's store on the node (results/ under it)
    out: Path  # $OUT: what comes back from this command
    models: Path
    project: Path  # the project whose benchmarks run (cwd of every step)
    dry_run: bool = False
    started: float = 0.0  # epoch seconds the command started
    limit_s: float = CALL_LIMIT_S
    extra: tuple[str, ...] = ()  # gpu_serve's arguments from the command line
    python: str = sys.executable
    targets: str = TARGETS

    def results(self, step: Step) -> Path:
        return self.store / "results" / step.name

    def argv(self, step: Step, timeout_s: int) -> list[str]:
        """The step's command line."""
        dry = ["--cpu-dry-run"] if self.dry_run else []
        own = ["--out", str(self.results(step)), *dry]
        if step.module == "benchmarks.gpu_check":
            own += ["--targets", self.targets]
        if step.module == "benchmarks.gpu_serve":
            engine = latest(self.store / "results" / "gpu_check", "*-gpu-dryrun.json" if self.dry_run else "*-gpu.json")
            own += ["--models", str(self.models), "--time-limit", str(max(timeout_s - 5, 1))]
            own += ["--engine-result", str(engine) if engine else "none"]
            own += ["--duration", DURATION_S] if not self.dry_run else []
            own += [*step.args, *self.extra]
        return [self.python, "-m", step.module, *own]


def say(text: str) -> None:
    print(f"{time.strftime('%H:%M:%S', time.gmtime())} runner: {text}", flush=True)


def pump(stream: object, log: Path) -> threading.Thread:
    """Copy a step's output to the console and to `log`, line by line, as it comes."""

    def copy() -> None:
        with log.open("ab") as f:
            for line in iter(stream.readline, b""):  # type: ignore[attr-defined]
                f.write(line)
                f.flush()
                sys.stdout.buffer.write(line)
                sys.stdout.flush()

    t = threading.Thread(target=copy, daemon=True)
    t.start()
    return t


def execute(argv: list[str], timeout_s: float, log: Path, cwd: Path) -> tuple[int, float]:
    """Run `argv` in a process group of its own under `timeout_s`: SIGTERM to the group at the timeout, SIGKILL
    KILL_AFTER_S later. (exit status, TIMED_OUT when stopped; seconds)."""
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    reader = pump(proc.stdout, log)
    try:
        rc = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        with log.open("a") as f:
            f.write(f"\n[runner] timed out after {timeout_s:g} s: SIGTERM to its process group\n")
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=KILL_AFTER_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        rc = TIMED_OUT
    reader.join(timeout=5)
    return rc, time.monotonic() - t0


def archive(out: Path, name: str, log: Path, results: Path) -> Path:
    """OUT/name.tar.gz: the step's console output and result files; the bare log then goes (it is inside)."""
    dest = out / f"{name}.tar.gz"
    tmp = out / f".{name}.tar.gz.tmp"
    with tarfile.open(tmp, "w:gz") as tar:
        if log.is_file():
            tar.add(log, arcname=f"{name}/{log.name}")
        for f in sorted(results.rglob("*")) if results.is_dir() else []:
            if f.is_file():
                tar.add(f, arcname=f"{name}/{f.relative_to(results)}")
    tmp.rename(dest)
    log.unlink(missing_ok=True)
    return dest


def run_step(ctx: Context, step: Step, timeout_s: int) -> dict[str, object]:
    """One step under `timeout_s`, archived into ctx.out as it ends; its record."""
    name = f"{step.number:02d}-{step.name}"
    results = ctx.results(step)
    shutil.rmtree(results, ignore_errors=True)
    results.mkdir(parents=True)
    ctx.out.mkdir(parents=True, exist_ok=True)
    log = ctx.out / f"{name}.log"
    argv = ctx.argv(step, timeout_s)
    say(f"{step.name}: start (at most {timeout_s} s): {' '.join(argv[1:])}")
    rc, took = execute(argv, timeout_s, log, ctx.project)
    shutil.copy2(log, results / f"{name}.log")  # the store keeps it beside the results
    kept = archive(ctx.out, name, log, results)
    said = (
        " (timed out)"
        if rc == TIMED_OUT
        else " (not ready)"
        if rc == NOT_READY and step.module.endswith("serve")
        else ""
    )
    say(f"{step.name}: exit {rc}{said} after {took:.0f} s; {kept.name}")
    return {"step": step.name, "exit": rc, "seconds": round(took, 1), "timeout_s": timeout_s, "archive": kept.name}


def run(ctx: Context, phases: list[str]) -> list[dict[str, object]]:
    """The phases' steps in order, each given what is left of the command; a retry only after its step's NOT_READY.
    The records, also in STORE/results/steps.json (every command's, appended)."""
    done: list[dict[str, object]] = []
    exits: dict[str, int] = {}
    for step in steps_of(phases):
        if step.retry_of and exits.get(step.retry_of) != NOT_READY:
            continue
        left = ctx.limit_s - (time.time() - ctx.started) if ctx.limit_s else float("inf")
        timeout = given_s(step, left) if ctx.limit_s else step.limit_s
        if not timeout:
            why = f"{left:.0f} s left of this command's {ctx.limit_s:g} s, it needs {step.min_s} s + {SPARE_S} s spare"
            say(f"{step.name}: skipped ({why})")
            done.append({"step": step.name, "skipped": why})
            continue
        record = run_step(ctx, step, timeout)
        exits[step.name] = int(record["exit"])  # type: ignore[call-overload]
        done.append(record)
    history = ctx.store / "results" / "steps.json"
    history.parent.mkdir(parents=True, exist_ok=True)
    previous = json.loads(history.read_text()) if history.is_file() else []
    history.write_text(json.dumps([*previous, {"phases": phases, "steps": done}], indent=1) + "\n")
    return done


def status(done: list[dict[str, object]]) -> int:
    """0 when every step that ran passed (a retry that passed excuses its first try); else the first failure's."""
    exits = {str(d["step"]): int(d["exit"]) for d in done if "exit" in d}  # type: ignore[call-overload]
    for step in STEPS:
        rc = exits.get(step.name)
        if rc and not any(s.retry_of == step.name and exits.get(s.name) == 0 for s in STEPS):
            return rc
    return 0


def main(argv: list[str] | None = None) -> int:
    args, _, extra = (sys.argv[1:] if argv is None else argv), None, []
    if "--" in args:
        i = args.index("--")
        args, extra = args[:i], args[i + 1 :]
    p = argparse.ArgumentParser(prog="python -m benchmarks.gpu_kit.runner", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("phases", type=lambda s: [x for x in s.split(",") if x])
    p.add_argument("--store", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--models", type=Path, required=True)
    p.add_argument("--cpu-dry-run", action="store_true")
    p.add_argument("--started", type=float, default=time.time(), help="epoch seconds the command started (now)")
    p.add_argument("--limit", type=float, default=float(os.environ.get("KIT_CALL_LIMIT_S", CALL_LIMIT_S)),
                   help="the command's limit, s (KIT_CALL_LIMIT_S, 600; 0: none, each step its own limit)")  # fmt: skip
    a = p.parse_args(args)
    unknown = [x for x in a.phases if x not in PHASES]
    if unknown or not a.phases:
        p.error(f"phases: {unknown or 'none'}; choose from {', '.join(PHASES)}")
    ctx = Context(a.store, a.out, a.models, Path.cwd(), a.cpu_dry_run, a.started, a.limit, tuple(extra),
                  targets=os.environ.get("KIT_TARGETS", TARGETS))  # fmt: skip
    return status(run(ctx, a.phases))


if __name__ == "__main__":
    sys.exit(main())
