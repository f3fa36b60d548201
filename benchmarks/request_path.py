"""One request's path through app/'s modules, across the app's processes, measured while it runs.

    python -m benchmarks.request_path                        # v1, v2 and grpc, 3 runs each
    python -m benchmarks.request_path --requests grpc,v2 --runs 5 --out /tmp/rp

The question (an open issue): how many of app/'s modules does ONE request pass through, from the HTTP (or gRPC)
handler to the engine and back, across the Router, Preprocessor and Classifier replicas, and in how many
module-to-module steps? Three requests are measured: a REST `/v1/classify` upload of one JPEG, a REST KServe V2
infer (JSON, the JPEG as one base64 BYTES element of `image_bytes`) and a gRPC KServe V2 `ModelInfer` (the JPEG as
`raw_input_contents`, length-prefixed as tritonclient sends it), each forced to the FP32 variant (one path, not the
A/B draw).

How (dynamic; nothing in app/ changes). The app starts as `benchmarks.run` starts a target (`serve run` of a copy
of configs/local.yaml made by `benchmarks.run.write_config`, kind "split" by default: ORT's CPU EP and a Preprocessor
deployment, so the request crosses all three processes; configs/serve.env, HAProxy and the admission front,
`private_serve_env`), on ports of its own, with `--runtime-env-json '{"worker_process_setup_hook": ...}'`: the job's
runtime_env, so every Ray worker of the app (Serve's controller and proxy, every replica) runs `install` below
before it takes work. There is no Router in the driver (`serve run`'s process): with HAProxy each Router replica, a
Ray worker, serves HTTP and gRPC itself, so the workers are every process that runs app code.

`install` puts a profiler on every thread of the process (`sys.setprofile`, and `threading.setprofile` for threads
started later; this venv's Python is 3.11, no `sys.monitoring`), and a thread that polls a file (the arm file, named
by $REQUEST_PATH_ARM_FILE) every 50 ms. Disarmed, the profiler is a C callable (`slice`, via the class's
`__call__`): no Python runs per call. Armed (the file exists; it holds the window's name), every Python call and
return whose frame is in an `app.*` module is recorded: a wall-clock timestamp (`time.time_ns`, one clock for all
processes on this machine), the thread, the asyncio task, the kind, the module and function, the nearest app frame
below it on the stack (the caller, found through library frames such as Starlette's or Serve's, never through
asyncio's or a thread pool's: those schedule work, they do not call it) and the outermost app frame (the root).
A coroutine's events are told apart from its bytecode: a `call` that starts at `RESUME 0` is a call, any other a
resumption; a `return` at `YIELD_VALUE` is a suspension, any other a return. On disarm, each process writes what it
recorded to a JSON file of its own; the tool waits for every live instrumented process's file (a deadline, polled).

The tool: warm up (several requests of each kind), then per run arm, send exactly one request, wait for the reply,
disarm, collect, merge the processes' records by timestamp and keep those between the send and the reply.

Steps. Within one thread of control (a flow: process, thread, asyncio task) a step is a call from a function of
module A into one of module B != A (`call`), or a return from B to a different caller module A (`return`);
resumptions and suspensions of coroutines are not steps (they are the event loop's scheduling, and an `await`
that suspends N times would otherwise count 2N). Control also passes between flows: a task or a thread pool's job
that starts with no app frame below it, or a coroutine resumed after another flow ran, continues from where the
previous flow's control was (its innermost app frame): such a step is a `task` (same thread), `thread` (same
process) or `process` step, the last a process hop. A hop is seen only where app code runs on both sides: the Router
hands the Preprocessor's reply to the Classifier inside Serve (a DeploymentResponse passed to a handle), so that
relay shows as one Preprocessor -> Classifier hop, not two through the Router.

Noise (metrics pushers, health checks, autoscaling reports, the shadow's evidence flushes, Serve's and the
rollout/ledger deployments' own loops), two filters:
1. Quiet windows: before each request window, a window of `--quiet-s` seconds with no request is recorded the same
   way. A flow's signature is its root function and, for a task, where its coroutine was made (the app frames of
   its `cr_origin`: coroutine origin tracking is turned on in each thread at its first armed event, and stays on).
   A flow of a request window whose signature is that of a quiet window's flow, and which ran no function that
   signature's quiet flows did not run, is background: dropped. Flows are compared, not modules: the request runs
   some of the same modules as the background (metrics, A/B stats, app/pipeline/failover.py, whose tasks wait for
   the request's calls and for the shadow's flushes alike: only the origin chain tells those apart) and must keep
   them; a probe that enters the Router's own HTTP entry (if one does) runs a subset of what a request runs.
2. Every run: `--runs` request windows per request (default 3); a step is kept as many times as it appears in every
   run (a multiset intersection, in the first run's order), a module only if every run entered it. This drops what
   a quiet window missed (a 10 s health-check period is longer than a quiet window) unless it fell into every run.
Only the events between the send and the reply count (the arm and disarm take up to 50 ms each side).
Why not only "the request's tasks" (Serve's request id in a contextvar): the app hands work to tasks made in a fresh
context (app/pipeline/coalescer.py) and to thread pools (decode, the engine), which carry no request id. The JSON
lists, per run, the flows dropped, and per quiet window, the flows seen.

Writes <out>/<stamp>-<host>-request-path.json (figures, step lists, each run's steps and the commit), a .md beside
it, and -request-path-events.json (each run's merged, filtered events, to audit a step list).
"""

from __future__ import annotations

import argparse
import dis
import functools
import json
import os
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ARM_ENV, OUT_ENV = "REQUEST_PATH_ARM_FILE", "REQUEST_PATH_OUT_DIR"
HOOK = "benchmarks.request_path.install"
POLL_S = 0.05
ORIGIN_DEPTH = 24  # frames of a coroutine's creation kept (cr_origin), while armed
# Modules whose frames schedule the work above them rather than call it: a walk down the stack for the caller stops.
SCHEDULERS = ("asyncio", "concurrent.futures", "threading", "selectors", "uvloop", "anyio")
GENERATOR_LIKE = 0x20 | 0x80 | 0x100 | 0x200  # CO_GENERATOR, CO_COROUTINE, CO_ITERABLE_COROUTINE, CO_ASYNC_GENERATOR
RESUME, YIELD_VALUE = dis.opmap.get("RESUME", -1), dis.opmap["YIELD_VALUE"]
KINDS = ("v1", "v2", "grpc")
CONFIG_KIND = "split"  # benchmarks.run.write_config: ORT's CPU EP, decode in a Preprocessor deployment


def is_app(module: str) -> bool:
    return module == "app" or module.startswith("app.")


def package(module: str) -> str:
    """`app.http.v1` -> `app.http`; a top-level module (`app.errors`, `app.main`) is its own package."""
    return ".".join(module.split(".")[:2])


# -- in every Ray worker of the app ---------------------------------------------------------------------------------


class _Profiler:
    """The profile function of every thread. Its class's `__call__` is `slice` while disarmed (a C call that takes
    the three arguments and does nothing that matters) and `_armed_call` while armed: switching the class switches
    every thread at once, which `sys.setprofile` (this thread only, on 3.11) cannot."""

    __call__: Any = slice
    recorder: _Recorder


class _Recorder:
    def __init__(self) -> None:
        self.records: list[tuple[Any, ...]] = []
        self.tasks: dict[int, Any] = {}  # the tasks seen in this window, kept alive: their ids stay unique
        self.code: dict[Any, bytes] = {}
        self.tracking: set[int] = set()  # the threads that record where their coroutines are made
        self.files: dict[str, str | None] = {}  # a source file -> its app module
        import asyncio

        self._loop = asyncio._get_running_loop
        self._task = asyncio.current_task

    def kind(self, frame: Any, event: str) -> str:
        code = frame.f_code
        if not code.co_flags & GENERATOR_LIKE:
            return event
        raw = self.code.get(code)
        if raw is None:
            raw = self.code[code] = code.co_code
        at = frame.f_lasti
        if not 0 <= at < len(raw) - 1:
            return event
        if event == "call":
            return "call" if raw[at] == RESUME and raw[at + 1] == 0 else "resume"
        return "yield" if raw[at] == YIELD_VALUE else "return"

    def record(self, frame: Any, event: str, arg: Any) -> None:
        if event != "call" and event != "return":
            return
        module = frame.f_globals.get("__name__") or ""
        if not is_app(module):
            return
        caller = caller_fid = root = None
        f, depth = frame.f_back, 0
        while f is not None and depth < 100:
            m = f.f_globals.get("__name__") or ""
            if m.startswith(SCHEDULERS):
                break
            if is_app(m):
                if caller is None:
                    caller, caller_fid = m, id(f)
                root = f
            f, depth = f.f_back, depth + 1
        root = root or frame
        tid = threading.get_ident()
        if tid not in self.tracking:  # per thread, from its first app event on: where each coroutine is made
            self.tracking.add(tid)
            sys.set_coroutine_origin_tracking_depth(ORIGIN_DEPTH)
        loop = self._loop()
        task = self._task(loop) if loop is not None else None
        kind = self.kind(frame, event)
        origin = None
        if task is not None:
            self.tasks[id(task)] = task
            if kind == "call" and caller is None:  # an entry: the task's coroutine was made where?
                origin = self.origin(getattr(task.get_coro(), "cr_origin", None))
        self.records.append(
            (
                time.time_ns(),
                tid,
                None if task is None else id(task),
                kind,
                module,
                frame.f_code.co_qualname,
                id(frame),
                caller,
                caller_fid,
                f"{root.f_globals.get('__name__')}:{root.f_code.co_qualname}",
                origin,
            )
        )

    def origin(self, frames: Any) -> str | None:
        """Where a coroutine was made: the app frames of its `cr_origin` ((file, line, function), innermost first) as
        `module:function < module:function ...`; None when no app frame made it (Serve's replica, Ray) or it was
        made untracked. The chain, not only the innermost frame: the same helper makes tasks for the request and
        for background work (app/pipeline/failover.py for the request's calls and for the shadow's flushes)."""
        chain: list[str] = []
        for filename, _line, function in frames or ():
            if filename not in self.files:
                self.files.update(
                    {getattr(m, "__file__", None) or "": n for n, m in list(sys.modules.items()) if is_app(n)}
                )
                self.files.setdefault(filename, None)
            if (module := self.files[filename]) is not None and (not chain or chain[-1] != f"{module}:{function}"):
                chain.append(f"{module}:{function}")
        return " < ".join(chain) or None


FIELDS = ("ts", "tid", "task", "kind", "module", "func", "fid", "caller", "caller_fid", "root", "origin")


def _title() -> str:
    try:
        return Path("/proc/self/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
    except OSError:
        return sys.argv[0] if sys.argv else "?"


def _write_json(path: Path, doc: Any) -> None:
    tmp = path.with_name(path.name + ".part")
    tmp.write_text(json.dumps(doc))
    tmp.replace(path)  # whole or absent: the tool never reads half a file


def _poll(profiler: _Profiler, arm: Path, out: Path) -> None:
    """Arm while the arm file exists (it names the window), dump on disarm; forever, every POLL_S."""
    pid, window, recorder = os.getpid(), None, None
    while True:
        try:
            wanted: str | None = arm.read_text().strip() or None
        except OSError:
            wanted = None
        if window is not None and wanted != window and recorder is not None:
            type(profiler).__call__ = slice  # type: ignore[method-assign]
            records, recorder.records = recorder.records, []
            _write_json(out / f"{window}-{pid}.json", {"pid": pid, "title": _title(), "records": records})
            window = recorder = None
        if window is None and wanted is not None and not (out / f"{wanted}-{pid}.json").exists():
            recorder, window = _Recorder(), wanted
            _Profiler.recorder = recorder
            type(profiler).__call__ = _armed_call  # type: ignore[method-assign]
            (out / f"ack-{window}-{pid}").touch()
        time.sleep(POLL_S)


def install() -> None:
    """The worker_process_setup_hook: a no-op unless $REQUEST_PATH_ARM_FILE and $REQUEST_PATH_OUT_DIR are set."""
    arm, out = os.environ.get(ARM_ENV), os.environ.get(OUT_ENV)
    if not arm or not out or getattr(sys, "_request_path_installed", False):
        return
    sys._request_path_installed = True  # type: ignore[attr-defined]
    profiler = _Profiler()
    _Profiler.__call__ = slice  # type: ignore[method-assign]
    sys.setprofile(profiler)
    threading.setprofile(profiler)
    _write_json(Path(out) / f"proc-{os.getpid()}.json", {"pid": os.getpid(), "title": _title()})
    threading.Thread(target=_poll, args=(profiler, Path(arm), Path(out)), name="request-path", daemon=True).start()


def _armed_call(self: _Profiler, frame: Any, event: str, arg: Any) -> None:
    """The profiler's `__call__` while armed (a function: the instance binds as `self`), into this window's recorder."""
    self.recorder.record(frame, event, arg)


# -- merging and counting (pure: tests/test_request_path_unit.py) ----------------------------------------------------


@dataclass(frozen=True)
class Event:
    ts: int
    pid: int
    tid: int
    task: int | None
    kind: str  # call, return, resume, yield
    module: str
    func: str
    fid: int
    caller: str | None  # the nearest app module below it on its stack (through library code), None: none
    caller_fid: int | None
    root: str  # module:qualname of the outermost app frame on its stack
    origin: str | None = None  # a task's first call: the app frames that made its coroutine, innermost first

    @property
    def flow(self) -> tuple[int, int, int | None]:
        return (self.pid, self.tid, self.task)


@dataclass(frozen=True)
class Step:
    src: str
    dst: str
    kind: str  # call, return, task, thread, process
    where: str = ""  # the process (role) of dst

    def __str__(self) -> str:
        arrow = {"call": "->", "return": "<-", "process": "=>"}.get(self.kind, "~>")
        if self.kind == "return":  # control goes back to dst, the caller
            return f"{self.dst} <- {self.src} [{self.where}]"
        return f"{self.src} {arrow} {self.dst} [{self.where}{'' if self.kind == 'call' else ', ' + self.kind}]"


def merge(dumps: Iterable[dict[str, Any]]) -> list[Event]:
    """The per-process dumps as one list of events in time order (ties: a process's own order)."""
    keyed = []
    for dump in dumps:
        for seq, rec in enumerate(dump["records"]):
            values = dict(zip(FIELDS, rec, strict=True))
            keyed.append(((values["ts"], dump["pid"], seq), Event(pid=dump["pid"], **values)))
    return [e for _, e in sorted(keyed, key=lambda k: k[0])]


def clip(events: Sequence[Event], start: int, end: int) -> list[Event]:
    return [e for e in events if start <= e.ts <= end]


def flows(events: Iterable[Event]) -> dict[tuple[int, int, int | None], list[Event]]:
    out: dict[tuple[int, int, int | None], list[Event]] = {}
    for e in events:
        out.setdefault(e.flow, []).append(e)
    return out


Signature = tuple[str, "str | None"]  # a flow's root function, and where its task's coroutine was made


def signature(flow: Sequence[Event]) -> Signature:
    return (flow[0].root, flow[0].origin)


def background(quiet: Iterable[Sequence[Event]]) -> dict[Signature, set[tuple[str, str]]]:
    """Per signature of a flow in the quiet windows: every (module, function) its flows ran."""
    out: dict[Signature, set[tuple[str, str]]] = {}
    for events in quiet:
        for fl in flows(events).values():
            out.setdefault(signature(fl), set()).update((e.module, e.func) for e in fl)
    return out


def drop_noise(
    events: Sequence[Event], noise: dict[Signature, set[tuple[str, str]]]
) -> tuple[list[Event], list[dict[str, Any]]]:
    """The events of the flows that are not background, and the flows dropped: a flow whose signature (root, origin)
    is one of the quiet windows' and which ran nothing that signature's quiet flows did not run is background."""
    keep, dropped = set(), []
    for key, fl in flows(events).items():
        ran = noise.get(signature(fl))
        if ran is None or not {(e.module, e.func) for e in fl} <= ran:
            keep.add(key)
        else:
            dropped.append({"pid": key[0], "root": fl[0].root, "origin": fl[0].origin, "events": len(fl)})
    return [e for e in events if e.flow in keep], dropped


def walk(events: Sequence[Event], where: Callable[[int], str] = str) -> list[Step]:
    """The module-to-module steps of time-ordered events (see the module docstring); `where` names a pid."""
    steps: list[Step] = []
    at: dict[tuple[int, int, int | None], str] = {}  # per flow, the module its control is in (innermost app frame)
    last_kind: dict[tuple[int, int, int | None], str] = {}
    prev: Event | None = None
    for i, e in enumerate(events):
        other = prev is not None and prev.flow != e.flow
        src = at.get(prev.flow) if prev is not None else None
        handoff = "task"
        if prev is not None and prev.pid != e.pid:
            handoff = "process"
        elif prev is not None and prev.tid != e.tid:
            handoff = "thread"
        if e.kind == "call":
            if e.caller is not None:
                if e.caller != e.module:
                    steps.append(Step(e.caller, e.module, "call", where(e.pid)))
            elif e.origin is not None:  # a task's first run: it continues from where it was made
                if (made_in := e.origin.split(":", 1)[0]) != e.module:
                    steps.append(Step(made_in, e.module, "task", where(e.pid)))
            elif src is not None and (src != e.module or handoff == "process"):
                steps.append(Step(src, e.module, handoff if other else "call", where(e.pid)))
            at[e.flow] = e.module
        elif e.kind == "return":
            if e.caller is not None and e.caller != e.module:
                steps.append(Step(e.module, e.caller, "return", where(e.pid)))
            at[e.flow] = e.caller or e.module
        elif e.kind == "resume":
            if e.caller is None and other and src is not None:
                j = i  # the chain of resumptions, outermost first: control continues in the innermost
                while (
                    j + 1 < len(events)
                    and events[j + 1].kind == "resume"
                    and events[j + 1].flow == e.flow
                    and events[j + 1].caller_fid == events[j].fid
                ):
                    j += 1
                if src != events[j].module or handoff == "process":
                    steps.append(Step(src, events[j].module, handoff, where(e.pid)))
            at[e.flow] = e.module
        else:  # yield: a chain of them, innermost first; control stays where the first one was
            if last_kind.get(e.flow) != "yield":
                at[e.flow] = e.module
        last_kind[e.flow] = e.kind
        prev = e
    return steps


def common(runs: Sequence[Sequence[Step]]) -> list[Step]:
    """The steps every run took, each as many times as the run that took it fewest times; the first run's order."""
    if not runs:
        return []
    counts = [Counter(r) for r in runs]
    quota = {s: min(c[s] for c in counts) for s in counts[0]}
    out, used = [], Counter[Step]()
    for s in runs[0]:
        if used[s] < quota[s]:
            out.append(s)
            used[s] += 1
    return out


def figures(steps: Sequence[Step], modules: Iterable[str]) -> dict[str, Any]:
    """The counts the issue asks for: modules entered, their packages, steps (by kind), process hops."""
    mods = sorted(set(modules) | {m for s in steps for m in (s.src, s.dst)})
    by_kind = Counter(s.kind for s in steps)
    return {
        "modules": len(mods),
        "packages": len({package(m) for m in mods}),
        "steps": len(steps),
        "steps_by_kind": dict(sorted(by_kind.items())),
        "process_hops": by_kind.get("process", 0),
        "module_list": mods,
        "package_list": sorted({package(m) for m in mods}),
    }


def difference(a: Sequence[Step], b: Sequence[Step]) -> dict[str, Any]:
    """Steps of `a` minus those of `b` (as multisets), and the other way; ignoring where they ran."""
    ca = Counter((s.src, s.dst, s.kind) for s in a)
    cb = Counter((s.src, s.dst, s.kind) for s in b)
    fmt = lambda c: [f"{src} {'<-' if k == 'return' else '->'} {dst} ({k}) x{n}" for (src, dst, k), n in c.items()]  # noqa: E731
    return {"steps": len(a) - len(b), "only_in_first": fmt(ca - cb), "only_in_second": fmt(cb - ca)}


def role(title: str, pid: int) -> str:
    from benchmarks.procs import process_label

    return process_label([title]) or f"pid {pid}"


# -- the requests ---------------------------------------------------------------------------------------------------


def jpeg() -> bytes:
    """One JPEG photograph (scikit-image's rocket; another sample photo re-encoded when it is missing)."""
    from app.toolchain.samples import available_photos, sample_bytes

    photos = available_photos()
    if "rocket" in photos:
        return sample_bytes("rocket")
    import cv2
    import numpy as np

    image = cv2.imdecode(np.frombuffer(sample_bytes(photos[0]), np.uint8), cv2.IMREAD_COLOR)
    assert image is not None, f"sample photo {photos[0]} does not decode"
    return bytes(cv2.imencode(".jpg", image)[1])


class Client:
    """The three requests, on connections that stay open (warmed up with the app)."""

    def __init__(self, base: str, grpc_target: str, variant: str = "fp32") -> None:
        import base64

        import grpc
        import httpx

        from app.protocol.v2 import names
        from app.protocol.v2.pb import grpc_service_pb2, grpc_service_pb2_grpc
        from app.served_model import MODEL_NAME

        self.base, self.image, self.variant = base, jpeg(), variant
        self.model = names.model_name_for(MODEL_NAME, variant)
        self.http = httpx.Client(timeout=60)
        self.channel = grpc.insecure_channel(grpc_target)
        self.stub = grpc_service_pb2_grpc.GRPCInferenceServiceStub(self.channel)
        self.v2_body = {
            "inputs": [
                {
                    "name": "image_bytes",
                    "datatype": "BYTES",
                    "shape": [1],
                    "data": [base64.b64encode(self.image).decode()],
                }
            ]
        }
        tensor = grpc_service_pb2.ModelInferRequest.InferInputTensor(name="image_bytes", datatype="BYTES", shape=[1])
        self.grpc_request = grpc_service_pb2.ModelInferRequest(
            model_name=self.model,
            inputs=[tensor],
            raw_input_contents=[len(self.image).to_bytes(4, "little") + self.image],
        )

    def send(self, kind: str) -> str:
        """Send one request of this kind, wait for the whole reply: what came back, in a few words."""
        if kind == "v1":
            headers = {"Content-Type": "image/jpeg", "X-Model-Variant": self.variant}
            r = self.http.post(f"{self.base}/v1/classify", content=self.image, headers=headers)
            return f"HTTP {r.status_code}, {len(r.content)} bytes"
        if kind == "v2":
            r = self.http.post(f"{self.base}/v2/models/{self.model}/infer", json=self.v2_body)
            return f"HTTP {r.status_code}, {len(r.content)} bytes"
        if kind == "grpc":
            reply = self.stub.ModelInfer(self.grpc_request, timeout=60)
            return f"gRPC OK, {len(reply.outputs)} outputs"
        raise ValueError(f"unknown request kind {kind!r}: one of {KINDS}")

    def ok(self, kind: str) -> bool:
        try:
            answer = self.send(kind)
        except Exception:
            return False
        return answer.startswith(("HTTP 200", "gRPC OK"))

    def close(self) -> None:
        self.http.close()
        self.channel.close()


# -- the windows ----------------------------------------------------------------------------------------------------


class Windows:
    """Arms and disarms the instrumented processes through the arm file, and collects what they recorded."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.arm_file = directory / "armed"
        self.out = directory / "records"
        self.out.mkdir(parents=True, exist_ok=True)
        self.titles: dict[str, str] = {}  # pid -> process title at its last dump (a replica's, once it is one)

    def processes(self) -> dict[int, str]:
        """The live instrumented processes: pid -> title at start."""
        out = {}
        for f in self.out.glob("proc-*.json"):
            doc = json.loads(f.read_text())
            try:
                os.kill(doc["pid"], 0)
            except ProcessLookupError:
                continue
            except PermissionError:
                pass
            out[doc["pid"]] = doc["title"]
        return out

    def _wait(self, what: Callable[[], set[int]], deadline_s: float) -> set[int]:
        """Poll `what` (the pids still missing) until none is, or the deadline: those still missing."""
        deadline = time.monotonic() + deadline_s
        while (missing := what()) and time.monotonic() < deadline:
            time.sleep(POLL_S)
        return missing

    def record(self, name: str, action: Callable[[], Any]) -> dict[str, Any]:
        """Arm every process, run `action`, disarm, collect: the window's dumps and when `action` ran."""
        pids = set(self.processes())
        self._arm(name)
        unacked = self._wait(lambda: {p for p in pids if not (self.out / f"ack-{name}-{p}").exists()}, 10)
        armed = pids - unacked
        start = time.time_ns()
        result = action()
        end = time.time_ns()
        self.arm_file.unlink()
        alive = set(self.processes())
        missing = self._wait(lambda: {p for p in armed & alive if not (self.out / f"{name}-{p}.json").exists()}, 15)
        dumps = [json.loads(f.read_text()) for p in armed if (f := self.out / f"{name}-{p}.json").exists()]
        self.titles |= {str(d["pid"]): d["title"] for d in dumps}
        return {
            "name": name,
            "start": start,
            "end": end,
            "result": result,
            "dumps": dumps,
            "processes": len(armed),
            "unacked": sorted(unacked),
            "missing": sorted(missing & alive),
        }

    def _arm(self, name: str) -> None:
        tmp = self.arm_file.with_name("armed.part")
        tmp.write_text(name)
        tmp.replace(self.arm_file)


def analyse(window: dict[str, Any], noise: dict[Signature, set[tuple[str, str]]]) -> dict[str, Any]:
    """One request window: its events (clipped to the request, noise dropped), steps and figures."""
    titles = {d["pid"]: d["title"] for d in window["dumps"]}
    events, dropped = drop_noise(clip(merge(window["dumps"]), window["start"], window["end"]), noise)
    names = {pid: role(t, pid) for pid, t in titles.items()}
    steps = walk(events, lambda pid: names.get(pid, f"pid {pid}"))
    return {
        "events": events,
        "steps": steps,
        "modules": sorted({e.module for e in events}),
        "processes": [names.get(p, str(p)) for p in dict.fromkeys(e.pid for e in events)],
        "dropped": [d | {"pid": names.get(d["pid"], d["pid"])} for d in dropped],
        "figures": figures(steps, (e.module for e in events)),
    }


# -- the run --------------------------------------------------------------------------------------------------------


def commit(repo: Path) -> dict[str, Any]:
    import subprocess

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=False)
        return done.stdout.strip()

    status = git("status", "--porcelain", "--untracked-files=no", "--", "app")
    return {"commit": git("rev-parse", "HEAD"), "repo": str(repo), "app_modified_files": status.splitlines()}


def window_events(window: dict[str, Any]) -> list[Event]:
    return clip(merge(window["dumps"]), window["start"], window["end"])


def summarise(request_windows: dict[str, list[dict[str, Any]]], quiet_windows: list[dict[str, Any]]) -> dict[str, Any]:
    """Every request's figures and step list from its windows, the quiet windows' flows dropped."""
    noise = background(window_events(w) for w in quiet_windows)
    out: dict[str, Any] = {"requests": {}, "_events": {}}
    out["quiet_windows"] = [
        {k: w[k] for k in ("name", "processes", "unacked", "missing")}
        | {"flows": sorted(f"{root} (made in {origin})" for root, origin in background([window_events(w)]))}
        for w in quiet_windows
    ]
    for kind, wins in request_windows.items():
        analysed = [analyse(w, noise) for w in wins]
        steps = common([a["steps"] for a in analysed])
        modules = set.intersection(*(set(a["modules"]) for a in analysed))
        out["requests"][kind] = {
            **figures(steps, modules),
            "step_list": [str(s) for s in steps],
            "steps_detail": [asdict(s) for s in steps],
            "runs": [
                {
                    "reply": w["result"],
                    "processes_in_order": a["processes"],
                    "events": len(a["events"]),
                    "dropped_flows": a["dropped"],
                    "unacked": w["unacked"],
                    "missing": w["missing"],
                    **{k: a["figures"][k] for k in ("modules", "packages", "steps", "process_hops")},
                    "step_list": [str(s) for s in a["steps"]],
                }
                for w, a in zip(wins, analysed, strict=True)
            ],
        }
        out["_events"][kind] = [[asdict(e) for e in a["events"]] for a in analysed]
    return out


def measure(
    kinds: Sequence[str], config_kind: str, port: int, runs: int, quiet_s: float, warmup: int, directory: Path
) -> dict[str, Any]:
    import yaml

    from app.config import read_serve_env
    from app.front.instance import private_serve_env
    from benchmarks.run import FAILED, REPO, write_config
    from benchmarks.server_process import ServerProcess, port_open

    grpc_port = port + 95  # past private_serve_env's own +91 .. +94, as tests/conftest.py's GRPC_PORT
    base = f"http://127.0.0.1:{port}"
    if taken := [u for u in (base, f"http://127.0.0.1:{grpc_port}") if port_open(u)]:
        raise SystemExit(f"something already listens at {taken}: pick another --port")
    path = write_config(directory, config_kind)
    cfg = yaml.safe_load(path.read_text())
    cfg["http_options"]["port"], cfg["grpc_options"]["port"] = port, grpc_port
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    windows = Windows(directory)
    env = private_serve_env(port, {**read_serve_env(), "RAY_ADDRESS": "local"}, front=True, config=cfg)
    pythonpath = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    env |= {ARM_ENV: str(windows.arm_file), OUT_ENV: str(windows.out), "PYTHONPATH": pythonpath}
    serve = Path(sys.executable).parent / "serve"
    hook = json.dumps({"worker_process_setup_hook": HOOK})
    cmd = [str(serve if serve.is_file() else "serve"), "run", "--runtime-env-json", hook, str(path)]
    server = ServerProcess("request-path", cmd, directory / "serve.log", cwd=REPO, env=env, fail_patterns=FAILED)
    out: dict[str, Any] = {"config": config_kind, "start": cmd, "log": str(server.log_path), "requests": {}}
    print(f"== {' '.join(cmd)}", file=sys.stderr, flush=True)
    client = Client(base, f"127.0.0.1:{grpc_port}")  # connects on its first request
    server.start()
    try:
        out["ready_s"] = server.wait_ready(f"{base}/readyz", 300, lambda _http: client.ok("v1"))
        print(f"  ready after {out['ready_s']:.0f} s; {len(windows.processes())} instrumented", file=sys.stderr)
        for kind in kinds:
            answers = [client.send(kind) for _ in range(warmup)]
            if not all(a.startswith(("HTTP 200", "gRPC OK")) for a in answers):
                raise RuntimeError(f"{kind} warm-up failed: {answers}")
        quiet_windows, request_windows = [], {k: list[dict[str, Any]]() for k in kinds}
        for i in range(runs):
            for kind in kinds:
                quiet_windows.append(windows.record(f"quiet-{kind}-{i}", lambda: time.sleep(quiet_s)))
                request_windows[kind].append(windows.record(f"{kind}-{i}", functools.partial(client.send, kind)))
                print(f"  {kind} run {i}: {request_windows[kind][-1]['result']}", file=sys.stderr, flush=True)
        out |= summarise(request_windows, quiet_windows)
        out["instrumented"] = windows.titles
    finally:
        client.close()
        out["stop"] = server.stop()
    return out


def markdown(result: dict[str, Any]) -> str:
    reqs = result["requests"]
    lines = [
        "# One request's path through app/",
        "",
        f"Commit {result['commit']['commit']} ({result['commit']['repo']}), config `{result['config']}` "
        f"(benchmarks.run.write_config), {result['runs']} runs per request, quiet windows of {result['quiet_s']} s. "
        "Steps: calls and returns between different app modules within a thread of control, plus hand-offs between "
        "flows (task, thread) and processes (a hop); kept only as often as every run took them, background flows "
        "(seen in the quiet windows) dropped. A process hop is a change of process between app code: the Router "
        "hands the Preprocessor's reply to the Classifier inside Serve, so Preprocessor => Classifier is one hop. "
        "See benchmarks/request_path.py's docstring.",
        "",
        "| request | modules | packages | steps | calls | returns | task/thread hand-offs | process hops |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for kind, r in reqs.items():
        k = r["steps_by_kind"]
        lines.append(
            f"| {kind} | {r['modules']} | {r['packages']} | {r['steps']} | {k.get('call', 0)} | {k.get('return', 0)} "
            f"| {k.get('task', 0) + k.get('thread', 0)} | {r['process_hops']} |"
        )
    if "grpc_minus_v2" in result:
        d = result["grpc_minus_v2"]
        lines += ["", f"## gRPC minus REST V2: {d['steps']:+d} steps", ""]
        lines += [f"- only gRPC: {s}" for s in d["only_in_first"]] + [f"- only V2: {s}" for s in d["only_in_second"]]
    for kind, r in reqs.items():
        lines += ["", f"## {kind}: {r['steps']} steps", "", f"Packages: {', '.join(r['package_list'])}", ""]
        lines += [f"Modules: {', '.join(r['module_list'])}", ""]
        lines += [f"{i}. {s}" for i, s in enumerate(r["step_list"], 1)]
        per_run = ", ".join(str(run["steps"]) for run in r["runs"])
        lines += ["", f"Steps in each run before the intersection: {per_run}."]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    import tempfile

    from benchmarks.environment import RESULTS_DIR, describe_environment, host_name, stamp
    from benchmarks.run import REPO

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--requests", default=",".join(KINDS), help="comma-separated, of v1,v2,grpc")
    ap.add_argument("--out", type=Path, default=RESULTS_DIR, help="where the results go")
    ap.add_argument("--config", default=CONFIG_KIND, help="a kind of benchmarks.run.write_config (default split)")
    ap.add_argument("--port", type=int, default=8650, help="the app's HTTP port (gRPC: +95)")
    ap.add_argument("--runs", type=int, default=3, help="request windows per request")
    ap.add_argument("--quiet-s", type=float, default=3.0, help="length of each quiet window")
    ap.add_argument("--warmup", type=int, default=5, help="requests of each kind before measuring")
    args = ap.parse_args(argv)
    kinds = [k.strip() for k in args.requests.split(",") if k.strip()]
    if unknown := [k for k in kinds if k not in KINDS]:
        ap.error(f"unknown requests {unknown}: of {','.join(KINDS)}")
    directory = Path(tempfile.mkdtemp(prefix="request-path-"))
    result = {
        "commit": commit(REPO),
        "environment": describe_environment(),
        "runs": args.runs,
        "quiet_s": args.quiet_s,
        **measure(kinds, args.config, args.port, args.runs, args.quiet_s, args.warmup, directory),
    }
    if "grpc" in result["requests"] and "v2" in result["requests"]:
        grpc_steps = [Step(**s) for s in result["requests"]["grpc"]["steps_detail"]]
        v2_steps = [Step(**s) for s in result["requests"]["v2"]["steps_detail"]]
        result["grpc_minus_v2"] = difference(grpc_steps, v2_steps)
    events = result.pop("_events", {})
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"{stamp()}-{host_name()}-request-path"
    Path(f"{stem}.json").write_text(json.dumps(result, indent=2) + "\n")
    Path(f"{stem}-events.json").write_text(json.dumps(events) + "\n")
    Path(f"{stem}.md").write_text(markdown(result))
    print(markdown(result))
    print(f"wrote {stem}.json, .md, -events.json", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
