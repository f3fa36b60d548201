"""The calls that carry a kit to a lent GPU machine, and what they will cost, worked out before anyone needs one.

A lent machine (the device tool) gives one session 15 minutes in all, start included; each call carries the
checkout it is made from (the files git tracks or does not ignore) beside the folders it names, 64 MiB together; the
machine is given back 30 s after a call unless the next one comes. So each part of the kit is as large as one call
may carry beside the checkout *as it travels*, measured when the kit is built (contents.travelling_bytes), less
FOLDER_RESERVE for run.sh and manifest.json beside the part and MARGIN for what the checkout may gain before the
calls. Each call carries one folder, DIR/call-N, and runs the same command, `bash DIR/call-N/run.sh call
DIR/call-N`: store the part, then run whatever the stored parts now allow that has not run (the engines once the
engines segment is whole, the served app once everything is).

The estimate adds, with the assumptions it prints: the machine's start; per call the tool's own cost and the
transfer of what it carries; between calls the time to read one reply and send the next; per segment its unpacking;
per phase the requirements check and its steps' expected times (runner.STEPS).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from benchmarks.gpu_kit import runner
from benchmarks.gpu_kit.segments import ENGINES, SEGMENTS, SERVING

MIB = 2**20
CALL_BYTES = 64 * MIB  # what one call carries: the checkout and the folders it names
FOLDER_RESERVE = 256 * 2**10  # run.sh and manifest.json beside each part (the build checks they fit)
MARGIN = 1 * MIB  # what the checkout may gain between the build and the calls (a new result file, a note)
MAX_CALLS, MAX_MINUTES = 5, 11.0  # the targets: a rerun's worth left of the 15 minutes
STORE = "/root/app-gpu-kit"  # run.sh's store on the node (APP_KIT_HOME)
# The phase a segment's completion allows: the engines once theirs is whole, the served app once everything is.
PHASE_OF = {ENGINES: runner.ENGINES, SERVING: runner.SERVE}


@dataclass(frozen=True)
class Assumptions:
    """What the estimate assumes, each from what was seen or stated (docs/engines.md "The sequence")."""

    start_s: float = 120.0  # a machine's start: "1-3 minutes" (the device tool)
    call_s: float = 5.0  # one call's own cost beside its transfer and command
    mib_per_s: float = 8.0  # what a call carries, sent to the machine
    gap_s: float = 20.0  # from one call's reply to the next call (within the 30 s the machine waits)
    unpack_mib_per_s: float = 15.0  # a segment's compressed bytes, unpacked on the node (lzma + tarfile, one core)
    check_s: float = 10.0  # a phase's environment, requirements check and nvidia-smi before its steps


def room(checkout_bytes: int) -> int:
    """The largest part one call can carry beside a checkout of `checkout_bytes`."""
    return CALL_BYTES - checkout_bytes - FOLDER_RESERVE - MARGIN


def segment_ends(streams: list[dict[str, Any]]) -> dict[str, int]:
    """Segment -> the byte offset where its last stream ends in the parts' concatenation."""
    ends: dict[str, int] = {}
    for s in streams:
        ends[s["segment"]] = max(ends.get(s["segment"], 0), s["offset"] + s["bytes"])
    return ends


def expected_s(phase: str) -> int:
    return sum(s.expected_s for s in runner.steps_of([phase]))


def make(parts: list[dict[str, Any]], streams: list[dict[str, Any]], checkout: dict[str, int], folder: str,
         folder_bytes: list[int], a: Assumptions = Assumptions()) -> dict[str, Any]:  # fmt: skip
    """The calls, in order, for `parts` (each {name, bytes}) whose concatenation holds `streams`; `folder`: the kit's
    folder as the calls name it (relative to the checkout); `folder_bytes`: each call folder's bytes in all."""
    ends, calls, offset = segment_ends(streams), [], 0
    seg_bytes = {seg: sum(s["bytes"] for s in streams if s["segment"] == seg) for seg in SEGMENTS}
    for i, (part, carried) in enumerate(zip(parts, folder_bytes, strict=True), 1):
        offset += part["bytes"]
        completes = [seg for seg in SEGMENTS if seg in ends and offset - part["bytes"] < ends[seg] <= offset]
        runs = [PHASE_OF[seg] for seg in completes]
        transfer = (checkout["bytes"] + carried) / MIB / a.mib_per_s
        work = sum(seg_bytes[seg] / MIB / a.unpack_mib_per_s for seg in completes)
        work += sum(a.check_s + expected_s(p) for p in runs)
        where = f"{folder}/call-{i}"
        calls.append({
            "call": i, "carry": where, "part": part["name"], "part_bytes": part["bytes"], "folder_bytes": carried,
            "total_bytes": checkout["bytes"] + carried, "completes": completes, "runs": runs,
            "command": f"bash {where}/run.sh call {where}", "estimate_s": round(a.call_s + transfer + work, 1),
        })  # fmt: skip
    optional = {
        "command": f"bash {STORE}/run.sh run {runner.GPU_DECODE}", "carry": None, "runs": [runner.GPU_DECODE],
        "estimate_s": round(a.gap_s + a.call_s + a.check_s + expected_s(runner.GPU_DECODE), 1),
    }  # fmt: skip
    total_s = a.start_s + sum(c["estimate_s"] for c in calls) + a.gap_s * max(len(calls) - 1, 0)
    kit_bytes = sum(p["bytes"] for p in parts)
    aside_room = room(checkout["bytes"] - checkout["results_bytes"])
    over = runner.phases_over_limit()  # the steps' limits, as the runner sets them
    return {
        "calls": calls,
        "optional_call": optional,
        "checkout": checkout,
        "room_bytes": room(checkout["bytes"]),
        "call_bytes": CALL_BYTES,
        "estimate_s": round(total_s, 1),
        "assumptions": asdict(a),
        "targets": {"calls": MAX_CALLS, "minutes": MAX_MINUTES},
        "fits": len(calls) <= MAX_CALLS
        and total_s / 60 <= MAX_MINUTES
        and all(c["total_bytes"] <= CALL_BYTES for c in calls)
        and not over,
        "phases_over_limit": over,
        "worst_case_s": {p: runner.worst_case_s(p) for p in runner.PHASES},
        "call_limit_s": runner.CALL_LIMIT_S,
        # with benchmarks/results/ set aside (aside.py) and the kit built again: this many calls
        "calls_with_results_aside": -(-kit_bytes // aside_room) if checkout["results_bytes"] else None,
    }


def mib(n: float) -> str:
    return f"{n / MIB:.1f} MiB"


def render(plan: dict[str, Any]) -> list[str]:
    """The plan as lines for the console and DIR/plan.txt."""
    c, a = plan["checkout"], plan["assumptions"]
    calls = plan["calls"]
    out = [
        f"{len(calls)} call(s), each carrying the checkout ({mib(c['bytes'])} in {c['files']} files, "
        f"benchmarks/results/ {mib(c['results_bytes'])} of it) and one folder of the kit; a part's room beside "
        f"them: {mib(plan['room_bytes'])} of {mib(plan['call_bytes'])}",
    ]
    for call in calls:
        after = "; then " + " and ".join(runs_said(r) for r in call["runs"]) if call["runs"] else ""
        out.append(
            f"  call {call['call']}: carry {call['carry']} ({call['part']}, {mib(call['folder_bytes'])}; "
            f"{mib(call['total_bytes'])} with the checkout{over(call)}), ~{call['estimate_s']:.0f} s: "
            f"stores the part{after}"
        )
        out.append(f"          {call['command']}")
    opt = plan["optional_call"]
    worst = plan["worst_case_s"][runner.GPU_DECODE] / 60
    said = runs_said(runner.GPU_DECODE)
    out.append(f"  then, if `status` shows {worst:.1f} minutes left (no carry), ~{opt['estimate_s']:.0f} s: {said}")
    out.append(f"          {opt['command']}")
    minutes = plan["estimate_s"] / 60
    t = plan["targets"]
    missed = []
    if len(calls) > t["calls"]:
        missed.append(f"{len(calls)} calls")
    if minutes > t["minutes"]:
        missed.append(f"{minutes:.1f} minutes")
    if any(c["total_bytes"] > CALL_BYTES for c in calls):
        missed.append(f"calls over {mib(CALL_BYTES)}")
    if plan.get("phases_over_limit"):
        missed.append(f"steps past a command's {plan['call_limit_s']} s: {', '.join(plan['phases_over_limit'])}")
    verdict = f"OVER: {', '.join(missed)};" if missed else "within"
    out.append(
        f"estimate: {minutes:.1f} device minutes for the {len(calls)} calls ({verdict} the targets of "
        f"{t['calls']} calls, {t['minutes']:g} minutes, {mib(CALL_BYTES)} a call): the start {a['start_s']:g} s, "
        f"per call {a['call_s']:g} s + what it carries at {a['mib_per_s']:g} MiB/s, {a['gap_s']:g} s between calls, "
        f"unpacking at {a['unpack_mib_per_s']:g} MiB/s, per phase {a['check_s']:g} s of checks + its steps' expected "
        f"times ({', '.join(f'{s.name} {s.expected_s} s' for s in runner.STEPS if s.expected_s)})"
    )
    if plan["calls_with_results_aside"] and plan["calls_with_results_aside"] < len(calls):
        out.append(
            f"benchmarks/results/ counted: with it set aside (`python -m benchmarks.gpu_kit aside`, then build again) "
            f"the kit would take {plan['calls_with_results_aside']} calls"
        )
    worst = ", ".join(f"{p} {s} s" for p, s in plan["worst_case_s"].items())
    out.append(f"each command at most: {worst} (every step to its limit; a command may run {plan['call_limit_s']} s)")
    return out


def over(call: dict[str, Any]) -> str:
    return f": OVER {mib(CALL_BYTES)}" if call["total_bytes"] > CALL_BYTES else ""


def runs_said(phase: str) -> str:
    names = [s.name for s in runner.steps_of([phase]) if not s.retry_of]
    retry = [s for s in runner.steps_of([phase]) if s.retry_of]
    said = ", ".join(names)
    if retry:
        said += f" (once more with {' '.join(retry[0].args)} if it does not become ready)"
    return said
