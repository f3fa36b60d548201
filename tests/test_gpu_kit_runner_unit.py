"""The GPU kit's runner (benchmarks/gpu_kit/runner.py) and plan (plan.py): every step's timeout inside one device
command's 600 s, a step's results in $OUT the moment it ends (also when its timeout kills it), the retry without
CUDA graphs only after a gpu_serve that did not become ready, and the calls a kit's parts make. The steps here are
stand-ins (small Python programs that write a result and exit, fail, or outlive their timeout), run as real
processes under the runner's real timeouts; no Ray, no GPU."""

from __future__ import annotations

import json
import sys
import tarfile
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from benchmarks.gpu_kit import plan, runner
from benchmarks.gpu_kit.runner import Context, Step

# --------------------------------------------------------------------------- budgets


def test_every_phase_fits_one_command_with_a_minute_to_spare(monkeypatch: pytest.MonkeyPatch) -> None:
    assert runner.phases_over_limit() == []
    # and every step can start in a command of its own: its minimum fits beside the setup
    for step in runner.STEPS:
        assert runner.given_s(step, runner.CALL_LIMIT_S - runner.SETUP_S) == step.limit_s, step.name
    # the guard sees a step set past the command's limit
    serve = next(s for s in runner.STEPS if s.name == "gpu_serve")
    longer = tuple(replace(s, limit_s=s.limit_s + 200) if s is serve else s for s in runner.STEPS)
    monkeypatch.setattr(runner, "STEPS", longer)
    assert runner.phases_over_limit() == [serve.phase]


def test_a_step_gets_what_is_left_of_the_command_or_is_skipped() -> None:
    serve = next(s for s in runner.STEPS if s.name == "gpu_serve")
    assert runner.given_s(serve, 600) == serve.limit_s
    left = serve.min_s + runner.SPARE_S + runner.KILL_AFTER_S + 7
    assert runner.given_s(serve, left) == serve.min_s + 7
    assert runner.given_s(serve, left - 8) == 0  # less than its minimum: skipped


def test_gpu_serve_is_told_a_time_limit_inside_its_timeout_and_the_engine_result_of_this_node(tmp_path: Path) -> None:
    ctx = Context(tmp_path / "store", tmp_path / "out", tmp_path / "models", tmp_path)
    serve = next(s for s in runner.STEPS if s.name == "gpu_serve")
    argv = ctx.argv(serve, 200)
    assert argv[argv.index("--time-limit") + 1] == "195" and argv[argv.index("--engine-result") + 1] == "none"
    check = ctx.results(runner.STEPS[0])
    check.mkdir(parents=True)
    (check / "2026-12-07-101010-node-gpu.json").write_text("{}")
    (check / "2026-12-07-111111-node-gpu.json").write_text("{}")
    argv = ctx.argv(serve, 200)
    assert argv[argv.index("--engine-result") + 1] == str(check / "2026-12-07-111111-node-gpu.json")
    retry = next(s for s in runner.STEPS if s.retry_of == "gpu_serve")
    assert "--no-cuda-graphs" in ctx.argv(retry, 200)


# --------------------------------------------------------------------------- stand-in steps


def stand_in(code: str) -> str:
    """A stand-in step's module source: writes a result into its --out, then `code`."""
    return (
        "import sys, time, pathlib\n"
        "out = pathlib.Path(sys.argv[sys.argv.index('--out') + 1])\n"
        "print('step started', flush=True)\n"
        "(out / 'result.json').write_text('{\"ok\": 1}')\n" + code + "\n"
    )


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A project whose step modules are stand-ins: fast (exits 0), failing (exit 1), slow (outlives any timeout),
    not_ready (exit 3, as gpu_serve when the app does not become ready)."""
    root = tmp_path / "project"
    (root / "standin").mkdir(parents=True)
    (root / "standin" / "__init__.py").write_text("")
    sources = {
        "fast": "",
        "failing": "sys.exit(1)",
        "slow": "time.sleep(60)",
        "not_ready": "sys.exit(3)",
        "graphs_off": "sys.exit(0 if '--no-cuda-graphs' in sys.argv else 3)",
    }
    for name, code in sources.items():
        (root / "standin" / f"{name}.py").write_text(stand_in(code))
    return root


def context(tmp_path: Path, project: Path, **kw: object) -> Context:
    return Context(tmp_path / "store", tmp_path / "out", tmp_path / "models", project, started=time.time(), **kw)  # type: ignore[arg-type]


def names(tar: Path) -> set[str]:
    with tarfile.open(tar) as t:
        return set(t.getnames())


def test_a_step_killed_by_its_timeout_leaves_its_own_and_the_earlier_archives(
    tmp_path: Path, project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runner, "KILL_AFTER_S", 2)
    steps = (
        Step(1, "first", runner.ENGINES, "standin.fast", limit_s=30, min_s=1, expected_s=1),
        Step(2, "second", runner.ENGINES, "standin.slow", limit_s=2, min_s=1, expected_s=1),
    )
    monkeypatch.setattr(runner, "STEPS", steps)
    ctx = context(tmp_path, project, limit_s=0)  # no command limit: each step its own
    done = runner.run(ctx, [runner.ENGINES])
    assert [d["exit"] for d in done] == [0, runner.TIMED_OUT]  # the slow one was stopped, not waited for
    assert sorted(p.name for p in ctx.out.iterdir()) == ["01-first.tar.gz", "02-second.tar.gz"]
    assert names(ctx.out / "01-first.tar.gz") == {"01-first/01-first.log", "01-first/result.json"}
    assert names(ctx.out / "02-second.tar.gz") == {"02-second/02-second.log", "02-second/result.json"}
    with tarfile.open(ctx.out / "02-second.tar.gz") as t:
        log = t.extractfile("02-second/02-second.log").read().decode()  # type: ignore[union-attr]
    assert "step started" in log and "timed out after 2 s" in log
    assert (ctx.store / "results" / "second" / "result.json").is_file()  # the store keeps it for later calls
    assert runner.status(done) == runner.TIMED_OUT
    history = json.loads((ctx.store / "results" / "steps.json").read_text())
    assert [s["step"] for s in history[0]["steps"]] == ["first", "second"]


def test_a_running_steps_console_is_in_out_while_it_runs(
    tmp_path: Path, project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a command killed from outside mid-step brings back: the step's console so far, already in $OUT."""
    monkeypatch.setattr(runner, "KILL_AFTER_S", 2)
    ctx = context(tmp_path, project, limit_s=0)
    slow = Step(1, "slow", runner.ENGINES, "standin.slow", limit_s=4, min_s=1, expected_s=1)
    worker = threading.Thread(target=runner.run_step, args=(ctx, slow, 4))
    worker.start()
    log, seen = ctx.out / "01-slow.log", ""
    deadline = time.monotonic() + 20
    while "step started" not in seen and time.monotonic() < deadline and worker.is_alive():
        seen = log.read_text() if log.is_file() else ""
        time.sleep(0.05)  # polling the file against a deadline
    running = worker.is_alive()
    worker.join(30)
    assert "step started" in seen and running
    assert not log.exists() and (ctx.out / "01-slow.tar.gz").is_file()  # once ended: inside the archive


def test_the_retry_without_cuda_graphs_runs_only_after_not_ready(
    tmp_path: Path, project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    serve = Step(3, "gpu_serve", runner.SERVE, "standin.graphs_off", limit_s=30, min_s=1, expected_s=1)
    retry = Step(4, "gpu_serve-nographs", runner.SERVE, "standin.graphs_off", limit_s=30, min_s=1, expected_s=0,
                 args=("--no-cuda-graphs",), retry_of="gpu_serve")  # fmt: skip
    monkeypatch.setattr(runner, "STEPS", (serve, retry))
    ctx = context(tmp_path, project)
    monkeypatch.setattr(Context, "argv", lambda self, step, t: [sys.executable, "-m", step.module, "--out",
                        str(self.results(step)), *step.args])  # fmt: skip
    done = runner.run(ctx, [runner.SERVE])
    assert [(d["step"], d["exit"]) for d in done] == [("gpu_serve", 3), ("gpu_serve-nographs", 0)]
    assert runner.status(done) == 0  # the retry served: the run passed

    monkeypatch.setattr(runner, "STEPS", (replace(serve, module="standin.failing"), retry))
    other = context(tmp_path / "b", project)
    done = runner.run(other, [runner.SERVE])
    assert [d["step"] for d in done] == ["gpu_serve"] and runner.status(done) == 1  # no retry after another failure


def test_a_step_without_enough_of_the_command_left_is_skipped_and_said(
    tmp_path: Path, project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runner, "STEPS", (Step(1, "late", runner.ENGINES, "standin.fast", 200, 90, 1),))
    ctx = context(tmp_path, project)
    ctx.started = time.time() - 500  # 100 s left of 600: less than 90 + the spare minute + the kill's grace
    done = runner.run(ctx, [runner.ENGINES])
    assert "skipped" in done[0] and "it needs 90 s" in str(done[0]["skipped"])
    assert not ctx.out.exists() or not list(ctx.out.iterdir())


# --------------------------------------------------------------------------- the plan


def streams(*sizes: tuple[str, int]) -> list[dict[str, object]]:
    out, at = [], 0
    for segment, n in sizes:
        out.append({"segment": segment, "kind": "plain", "offset": at, "bytes": n})
        at += n
    return out


def test_the_plan_runs_the_engines_in_the_call_that_completes_them_and_serves_in_the_last() -> None:
    mib = plan.MIB
    checkout = {"bytes": 13 * mib, "files": 900, "results_bytes": 11 * mib}
    room = plan.room(checkout["bytes"])
    total = 4 * room + 10 * mib
    engines = 2 * room + room // 2  # ends inside the third part
    parts = [{"name": f"part-0{i}-of-05.bin", "bytes": min(room, total - i * room + room)} for i in range(1, 6)]
    parts[-1]["bytes"] = total - 4 * room
    s = streams(("engines", engines), ("serving", total - engines))
    made = plan.make(parts, s, checkout, ".gpukit", [p["bytes"] + 60_000 for p in parts])
    calls = made["calls"]
    assert [c["runs"] for c in calls] == [[], [], ["engines"], [], ["serve"]]
    assert all(c["total_bytes"] <= plan.CALL_BYTES - plan.MARGIN for c in calls)
    assert calls[2]["command"] == "bash .gpukit/call-3/run.sh call .gpukit/call-3"
    text = "\n".join(plan.render(made))
    assert "call 3: carry .gpukit/call-3" in text and "gpu_check, gpu_decode" in text
    assert "once more with --no-cuda-graphs" in text and f"run {runner.GPU_DECODE}" in text
    expected = made["assumptions"]["start_s"] + sum(c["estimate_s"] for c in calls) + 4 * made["assumptions"]["gap_s"]
    assert made["estimate_s"] == pytest.approx(expected, abs=0.2)


def test_one_part_runs_both_phases_in_its_one_call() -> None:
    made = plan.make([{"name": "part-01-of-01.bin", "bytes": 1000}], streams(("engines", 600), ("serving", 400)),
                     {"bytes": 1, "files": 1, "results_bytes": 0}, "k", [2000])  # fmt: skip
    assert made["calls"][0]["runs"] == ["engines", "serve"] and made["calls"][0]["completes"] == ["engines", "serving"]
