"""The service comparison `make bench` runs (`--quick`: fewer, shorter steps; `--targets app,app_ortcpu`: engine
auto against ORT's CPU EP): each target in turn, the same workload, one report.

For every target: start it (its own process session; Serve targets on a private local Ray instance), poll
until it is ready (GET ready URL -> 200, then one real classify -> 200, against a deadline), drive the
workloads, stop it (SIGINT, then SIGTERM/SIGKILL to the processes it started; never `ray stop`, which would
stop other users' Ray too), and move on. A target that fails to start is reported, not fatal.

Workloads, closed loop, sent by wrk: "sweep" = single images over the concurrency levels, FP32 forced; "v2" =
the same at c=32 through the V2 infer endpoint; "batch" = 16 images per request (/v1/classify/batch) at c=8, FP32
and INT8 in alternating pairs. Writes benchmarks/results/<date>-<host>.json, .md and two PNGs (throughput vs
concurrency; p99 vs throughput).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import yaml

from app.config import read_serve_env
from app.front.instance import private_serve_env
from app.served_model import MODEL_NAME
from app.toolchain.samples import available_photos, sample_bytes
from benchmarks import cost
from benchmarks.corpus import build_corpus
from benchmarks.corpus import describe as describe_corpus
from benchmarks.environment import RESULTS_DIR, format_environment, host_name, print_environment, stamp
from benchmarks.load import Workload, wrk_step
from benchmarks.report import fmt, markdown_table, plot_service, steps_table, write_json
from benchmarks.server_process import ServerProcess, ServerStartError, port_open
from benchmarks.stats import median

REPO = Path(__file__).resolve().parent.parent
PY = sys.executable
# Log lines (regular expressions) that mean a Serve deployment has failed: stop waiting for readiness.
FAILED = ("DEPLOY_FAILED", r"Deploying app '[^']*' failed")
APP_CONFIGS = (
    "local",
    "nobatch",
    "ortcpu",
    "split",
    "localsplit",
    "noqueue",
    "paceonly",
    "lite1",
)  # configs/local.yaml, as is or changed; lite1: configs/examples/efficientnet-lite1.yaml (a user's own model)
# else /healthz; Triton's /v2/health/ready answers 200 before the model has loaded
READY = {**dict.fromkeys(APP_CONFIGS, "/readyz"), "triton_peer": f"/v2/models/{MODEL_NAME}/ready"}
TRITON_VENV = ".venv-triton"


@dataclasses.dataclass(frozen=True)
class Target:
    key: str
    name: str
    runs: str  # a module of benchmarks.baselines, or one of APP_CONFIGS
    port: int
    workloads: tuple[str, ...]
    serve_env: bool = True  # configs/serve.env (HAProxy, throughput-optimised), as `make serve`; else Serve's default
    sweep: tuple[int, ...] = ()  # its concurrency levels; empty: the plan's
    pairs: int = 1  # of the "batch" workload
    one_model: bool = False  # serves one V2 model (no per-variant names): V2 steps name the model, not a variant
    front: bool = True  # this app's targets: HAProxy runs as the admission front (app/front/); peers never
    env: tuple[tuple[str, str], ...] = ()  # on top of configs/serve.env (a variant of the front's limits)
    cwd: str | None = None  # where the server starts (its `app` is the one there); None: this repository

    @property
    def with_front(self) -> bool:
        return self.front and self.runs in APP_CONFIGS  # a config of this app, not a peer

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1/classify"


ENDS = (1, 32)  # the concurrency levels the targets use
# The *_default pair (Ray's example as written) is what the targets were set against; app_ortcpu (every
# variant on ORT's CPU EP) judges "engine auto"; nobatch (coalesce_max 1, max_batch_size 1) "dynamic batching off".
TARGETS = [
    Target("fastapi", "FastAPI + ONNX Runtime, one process", "fastapi_onnx", 8101, ("sweep", "batch"), False),
    Target("echo", "Serve echo floor, serve.env", "serve_echo", 8102, ("sweep",)),
    Target("single", "Serve, one deployment, serve.env", "serve_single", 8103, ("sweep", "batch")),
    Target("echo_default", "Serve echo floor, default runtime", "serve_echo", 8104, ("sweep",), False, ENDS),
    Target("single_default", "Serve, one deployment, default runtime", "serve_single", 8105, ("sweep",), False, ENDS),
    Target("app", "this app", "local", 8000, ("sweep", "v2", "batch"), pairs=3),
    Target("app_ortcpu", "this app, ORT's CPU EP", "ortcpu", 8000, ("sweep", "v2", "v2batch", "batch"), sweep=ENDS),
    Target("app_split", "this app, ORT's CPU EP, decode in a Preprocessor", "split", 8000, ("v2",), sweep=ENDS),
    Target("triton", "Triton (PyTriton), ORT's CPU EP", "triton_peer", 8106, ("v2", "v2batch"), False, one_model=True),
    Target("litserve", "LitServe + ONNX Runtime, batching", "litserve_peer", 8109, ("sweep", "batch"), False),
    Target("nobatch", "this app, batching off", "nobatch", 8000, ("sweep",), sweep=(32,)),
    Target("app_lite1", "this app, EfficientNet-Lite1 as declared", "lite1", 8000, ("batch",), pairs=3),
]
# name: concurrency levels (empty: the target's sweep), images per request, protocol; FP32, "batch" INT8 too
WORKLOADS = {"sweep": ((), 1, "v1"), "v2": (ENDS, 1, "v2"), "v2batch": ((8,), 16, "v2"), "batch": ((8,), 16, "v1")}
FULL = {"duration_s": 10.0, "warmup_s": 2.0, "concurrency": [1, 2, 4, 8, 16, 32, 64]}
QUICK = {"duration_s": 2.0, "warmup_s": 1.0, "concurrency": [1, 4, 16, 32]}


def write_config(directory: Path, kind: str) -> Path:
    """configs/local.yaml with absolute model paths and, for kind "nobatch", every kind of batching off (one
    request per decode and Classifier call), for "ortcpu", every variant on ORT's CPU EP (engine: cpu), for "split",
    that and the images decoded in a Preprocessor deployment of their own (prod.yaml's shape; local.yaml decodes in
    the Router; "localsplit": the Preprocessor without the engine change), for
    "noqueue", the Router's wait queue and refusal pacing off (a 503 at once beyond max_in_flight), for "paceonly",
    the wait queue off and refusals paced; "lite1": configs/examples/efficientnet-lite1.yaml, a user's own model
    (its files made by the commands at the top of that file)."""
    source = "examples/efficientnet-lite1.yaml" if kind == "lite1" else "local.yaml"
    cfg = yaml.safe_load((REPO / "configs" / source).read_text())
    app = cfg["applications"][0]
    for v in app["args"]["variants"].values():
        v.update(model_path=str(REPO / v["model_path"]), **({"engine": "cpu"} if kind in ("ortcpu", "split") else {}))
    if app["args"]["model"].get("labels_path"):
        app["args"]["model"]["labels_path"] = str(REPO / app["args"]["model"]["labels_path"])
    if kind in ("split", "localsplit"):  # the Router's quarter CPU again, and the Preprocessor it had before decode_in
        app["args"]["decode_in"] = "preprocessor"
        app["deployments"][0]["ray_actor_options"]["num_cpus"] = 0.25
        pre = {"num_replicas": 1, "max_ongoing_requests": 32, "max_queued_requests": 256}
        app["deployments"].insert(1, {"name": "Preprocessor", **pre, "ray_actor_options": {"num_cpus": 0.25}})
    for d in app["deployments"] if kind == "nobatch" else []:
        if d["name"] == "Router" or d["name"].startswith("Classifier_"):
            d["user_config"]["coalesce_max" if d["name"] == "Router" else "max_batch_size"] = 1
    for d in app["deployments"] if kind in ("noqueue", "paceonly") else []:
        if d["name"] == "Router":
            d["user_config"] |= {"max_queue_wait_s": 0} | ({"max_refusals_per_s": 0} if kind == "noqueue" else {})
    path = directory / f"local-{kind}.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def start_command(t: Target, log_dir: Path) -> list[str]:
    if t.runs in APP_CONFIGS:
        serve = Path(PY).parent / "serve"  # this venv's, even when not activated
        return [str(serve) if serve.is_file() else "serve", "run", str(write_config(log_dir, t.runs))]
    # Triton's Python stubs need a venv made from the system's Python (see benchmarks/baselines/triton_peer.py).
    py = str(REPO / TRITON_VENV / "bin" / "python") if t.runs == "triton_peer" else PY
    return [py, "-m", f"benchmarks.baselines.{t.runs}", "--port", str(t.port)]  # --device auto


def engines_and_answers(classify_url: str) -> dict[str, Any]:
    """Each variant's engine and start-up figures (GET /v1/models) and its top-1 on the sample photographs."""
    keep = ("engine", "measured", "engine_candidates", "speed_gate")
    out: dict[str, Any] = {}
    with httpx.Client(timeout=30) as client:
        for variant, info in client.get(classify_url.rsplit("/v1/", 1)[0] + "/v1/models").json()["variants"].items():
            top1 = {}
            for photo in available_photos():
                headers = {"Content-Type": "image/jpeg", "X-Model-Variant": variant}
                r = client.post(classify_url, content=sample_bytes(photo), headers=headers)
                top1[photo] = r.json()["predictions"][0]["class_id"] if r.status_code == 200 else r.status_code
            out[variant] = {**{k: info[k] for k in keep if k in info}, "top1": top1}
    return out


def workload(t: Target, name: str, variant: str, timeout_s: float = 30.0) -> Workload:
    _, per_request, protocol = WORKLOADS[name]
    model = None if t.one_model and protocol == "v2" else variant
    return Workload(t.url, model, per_request, timeout_s, protocol=protocol)


def probe_for(t: Target) -> Callable[[httpx.Client], bool]:
    """A readiness probe: one real classify request (of the target's first workload) must answer 200."""
    wl = workload(t, t.workloads[0], "fp32")
    body, headers = wl.payloads()[0]
    return lambda client: client.post(wl.target, content=body, headers={**headers, **wl.headers()}).status_code == 200


def drive(t: Target, plan: dict[str, Any], server_cpu: Callable[[], float]) -> list[dict[str, Any]]:
    """Every workload of the target, in wrk; steps tagged with their workload and pair, and the server's CPU per
    image beside the work alone (plan["floor"])."""
    steps, work_ms = [], (plan.get("floor") or {}).get("work_ms_per_image")
    work_ms = None if t.runs == "serve_echo" else work_ms  # no model, so no "over the work" to speak of
    for name in t.workloads:
        levels, per_request, protocol = WORKLOADS[name]
        variants = ("fp32", "int8") if name == "batch" else ("fp32",)
        # Alternating order (fp32 int8, int8 fp32, ...), so drift on a shared machine hits both alike.
        for pair in range(t.pairs if name == "batch" else 1):
            for variant in variants[:: -1 if pair % 2 else 1]:
                wl = workload(t, name, variant, plan["timeout_s"])
                print(f"  {name}: {per_request} image(s)/request, {protocol}, variant {variant}", file=sys.stderr)
                for c in levels or t.sweep or plan["concurrency"]:
                    step = wrk_step(wl, c, plan["duration_s"], plan["warmup_s"], server_cpu)
                    steps.append({"workload": name, "pair": pair, **step, **cost.per_image(step, work_ms)})
    return steps


def check_alone(server: ServerProcess, port: int) -> None:
    """Refuse results if another process listens on the target's port too (SO_REUSEPORT shares it)."""
    if foreign := server.foreign_listeners(port):
        raise ServerStartError(
            f"port {port} is also served by process(es) {sorted(foreign)} that this run did not start; "
            "their share of the requests would pollute the numbers"
        )


Steps = Callable[[Target, dict[str, Any], ServerProcess], list[dict[str, Any]]]


def run_target(t: Target, plan: dict[str, Any], log_dir: Path, steps: Steps | None = None) -> dict[str, Any]:
    """Start the target, run `steps` on it (default: its workloads, `drive`), stop it: what it measured."""
    out: dict[str, Any] = {**dataclasses.asdict(t), "url": t.url, "start": start_command(t, log_dir)}
    if port_open(t.url):
        return {**out, "error": f"something already listens at {t.url}: a server this run did not start"}
    # A private Ray, never someone else's, and never the HAProxy files/ports of a `make serve` running beside it.
    env = private_serve_env(
        t.port, {**(read_serve_env() if t.serve_env else {}), "RAY_ADDRESS": "local", **dict(t.env)}, front=t.with_front
    )
    cwd = Path(t.cwd) if t.cwd else REPO
    server = ServerProcess(t.name, out["start"], log_dir / f"{t.key}.log", cwd=cwd, env=env, fail_patterns=FAILED)
    out["log"] = str(server.log_path)
    print(f"\n== {t.name}: {' '.join(out['start'])}", file=sys.stderr, flush=True)
    probe = probe_for(t)  # before the start: building the corpus takes seconds
    server.start()
    try:
        ready = t.url.replace("/v1/classify", READY.get(t.runs, "/healthz"))
        out["ready_s"] = server.wait_ready(ready, 240 if t.runs in APP_CONFIGS else 120, probe)
        print(f"  ready after {out['ready_s']:.1f} s", file=sys.stderr, flush=True)
        check_alone(server, t.port)
        if t.key.startswith("app"):
            out["engines"] = engines_and_answers(t.url)
        server.snapshot_family()  # Ray's daemons and workers, started by now
        if steps is None:
            out["steps"] = drive(t, plan, lambda: cost.tree_cpu_s(server.family))
        else:
            out["steps"] = steps(t, plan, server)
        check_alone(server, t.port)
    except (ServerStartError, ConnectionError) as e:  # it died, or another process listens there too
        out["error"], out["log_tail"] = str(e), server.log_tail()
        print(f"  FAILED: {e}\n{out['log_tail']}", file=sys.stderr, flush=True)
    finally:
        out["stop"] = server.stop()
        print(f"  stopped: {out['stop']['stopped']}", file=sys.stderr, flush=True)
    return out


def _target(result: dict[str, Any], key: str) -> dict[str, Any] | None:
    """The target with this key, if it ran without error."""
    return next((t for t in result["targets"] if t.get("key") == key and not t.get("error")), None)


def _steps(result: dict[str, Any], key: str, workload: str) -> list[dict[str, Any]]:
    return [st for st in (_target(result, key) or {}).get("steps", []) if st["workload"] == workload]


def _measure(
    result: dict[str, Any], key: str, workload: str, concurrency: int | None, field: str = "throughput_rps"
) -> float | None:
    """The median of `field` (a step's, or its latency's: p50_ms) over the target's FP32 steps of the workload at
    this concurrency (the "batch" pairs: three FP32 steps); concurrency None: the best of them."""
    steps = [st for st in _steps(result, key, workload) if st.get("variant") in ("fp32", None)]
    values = [st.get(field, st["latency_ms"].get(field)) for st in steps if concurrency in (None, st["concurrency"])]
    values = [v for v in values if v is not None]
    return max(values) if concurrency is None and values else median(values)


def pair_ratios(steps: list[dict[str, Any]], num: str, den: str) -> list[float]:
    """images/s of variant `num` over variant `den`, per alternating pair of 16-image steps."""
    out = []
    for pair in sorted({st.get("pair", 0) for st in steps}):
        by = {st["variant"]: st["images_per_s"] for st in steps if st.get("pair", 0) == pair}
        if by.get(num) and by.get(den):
            out.append(by[num] / by[den])
    return out


TARGET_HEADERS = ["target", "measured", "ratio", "goal", "met"]
ONE, SAME = "1-deployment Serve, default runtime", "1-deployment Serve, same serve.env"
INT8_ROWS = {"app": " (median of alternating pairs)", "fastapi": ", FastAPI + ORT, one process", "single": f", {SAME}"}


def _row(what: str, measured: str, r: float | None, goal: str | None = None) -> list[Any]:
    """A target row: `goal` is ">= X.Yx" or "<= X.Yx"; None: reported beside the judged rows, not judged."""
    met = None if r is None or goal is None else r >= float(goal[3:-1]) if goal[0] == ">" else r <= float(goal[3:-1])
    return [what, measured, None if r is None else f"{r:.2f}x", goal or "(reported)", met]


def _ratio_row(what: str, a: float | None, b: float | None, goal: str | None = None, unit: str = " req/s") -> list[Any]:
    return _row(what, f"{fmt(a)} / {fmt(b)}{unit}", a / b if a is not None and b else None, goal)


def target_rows(result: dict[str, Any]) -> list[list[Any]]:
    """The performance targets, computed from this run's steps. The issue's peer is Ray's example as written
    (default runtime); the same peer on this app's runtime (configs/serve.env) is reported beside it."""

    m = functools.partial(_measure, result)
    app32, app1, app16 = m("app", "sweep", 32), m("app", "sweep", 1, "p50_ms"), m("app", "batch", 8, "images_per_s")
    fastest = m("fastapi", "sweep", None)
    rows = [
        _ratio_row(f"single image, FP32, c=32: app / {ONE}", app32, m("single_default", "sweep", 32), ">= 1.0x"),
        _ratio_row(f"single image, FP32, c=32: app / {SAME}", app32, m("single", "sweep", 32)),
        _ratio_row(f"p50 at c=1: app / {ONE}", app1, m("single_default", "sweep", 1, "p50_ms"), "<= 1.5x", " ms"),
        _ratio_row(f"p50 at c=1: app / {SAME}", app1, m("single", "sweep", 1, "p50_ms"), None, " ms"),
        _ratio_row("16 images/request, c=8, FP32 img/s: app / FastAPI's best req/s", app16, fastest, ">= 1.1x", ""),
        _ratio_row("dynamic batching on / off, single image, c=32", app32, m("nobatch", "sweep", 32), ">= 1.15x"),
        _ratio_row("single image, FP32, c=32, app: V2 infer / /v1/classify", m("app", "v2", 32), app32, ">= 0.9x"),
    ]
    # The app's INT8 / FP32 is judged; the peers' (their own 16-image endpoints, same decode, same models) are
    # reported beside it: how much of it the machine allows at all, whatever the serving path.
    for key, label in INT8_ROWS.items():
        pairs = pair_ratios(_steps(result, key, "batch"), "int8", "fp32")
        what, measured = f"16 images/request, c=8: INT8 / FP32 img/s{label}", ", ".join(f"{x:.2f}" for x in pairs)
        rows.append(_row(what, measured or "n/a", median(pairs), ">= 1.6x" if key == "app" else None))
    rows += engine_rows(result) + triton_rows(result)
    if app := _target(result, "app"):
        errors = sum(sum(st["errors"].values()) for st in app.get("steps", []))
        top = max((st.get("concurrency") or 0 for st in app.get("steps", [])), default=0)
        rows.append([f"errors, app, every step (up to c={top})", str(errors), None, "0", errors == 0])
    return rows


def triton_rows(result: dict[str, Any]) -> list[list[Any]]:
    """The app on ORT's CPU EP against Triton on the same engine, and against the machine's ceiling."""

    m = functools.partial(_measure, result)
    one, v2 = m("app_ortcpu", "sweep", 32), m("app_ortcpu", "v2", 32)
    triton1, many = m("triton", "v2", 32), m("app_ortcpu", "v2batch", 8, "images_per_s")
    ceiling = (result.get("plan", {}).get("floor") or {}).get("ceiling_images_per_s")
    return [
        _ratio_row("single image, c=32: app /v1/classify / Triton V2", one, triton1, ">= 1.0x"),
        _ratio_row("single image, c=32: app V2 / Triton V2", v2, triton1, ">= 1.0x"),
        _ratio_row(
            "16 images/request, c=8, V2 img/s: app / Triton",
            many,
            m("triton", "v2batch", 8, "images_per_s"),
            ">= 1.0x",
            "",
        ),
        _ratio_row(
            "p50 at c=1, V2: app / Triton",
            m("app_ortcpu", "v2", 1, "p50_ms"),
            m("triton", "v2", 1, "p50_ms"),
            "<= 1.2x",
            " ms",
        ),
        _ratio_row("16 images/request, c=8, V2 img/s: app / the machine's ceiling", many, ceiling, ">= 0.75x", ""),
    ]


CPU_HEADERS = ["target", "workload", "c", "img/s", "server CPU ms/image", "serving path ms/image", "wrk CPU ms/image"]


def cpu_rows(result: dict[str, Any]) -> list[list[Any]]:
    """Every FP32 step's CPU per image: the server's processes, what its path adds over the work alone, wrk's."""
    rows = []
    for t in result["targets"]:
        for st in t.get("steps", []) if not t.get("error") else []:
            if st.get("variant") in ("fp32", None) and st.get("pair", 0) == 0 and st["concurrency"] in (1, 8, 32):
                head = [t["key"], st["workload"], st["concurrency"], st.get("images_per_s")]
                rows.append([*head, *(st.get(f"{k}_ms_per_image") for k in ("cpu", "path", "client"))])
    return rows


def engine_rows(result: dict[str, Any]) -> list[list[Any]]:
    """engine auto against the same app forced to ORT's CPU EP: 16-image FP32 img/s, and the same answers."""
    a, b = (_measure(result, key, "batch", 8, "images_per_s") for key in ("app", "app_ortcpu"))
    app, forced = _target(result, "app"), _target(result, "app_ortcpu")
    engines = (app or {}).get("engines", {})
    chosen = engines.get("fp32", {}).get("engine", "n/a")
    what = f"16 images/request, c=8, FP32 img/s: engine auto ({chosen}) / forced ORT CPU EP"
    rows = [_ratio_row(what, a, b, ">= 1.3x" if chosen == "openvino" else None, "")]
    if chosen != "openvino":
        rows[0][3] = "(auto chose the CPU EP: no gain to judge)"
    if app and forced:
        theirs = forced.get("engines", {})
        same = all(engines.get(v, {}).get("top1") == theirs.get(v, {}).get("top1") for v in ("fp32", "int8"))
        rows.append(["same top-1 on the sample photographs, auto / forced CPU EP", str(same), None, "True", same])
    return rows


def sweep_steps(t: dict[str, Any]) -> list[dict[str, Any]]:
    """The target's single-image FP32 steps by concurrency: /v1/classify's, else (a V2-only peer) V2's."""
    steps = [s for s in t.get("steps", []) if s["workload"] == "sweep"]
    steps = steps or [s for s in t.get("steps", []) if s["workload"] == "v2"]
    return sorted(steps, key=lambda s: s["concurrency"])


SUMMARY_HEADERS = ["target", "p50 ms at c=1", "req/s at c=32", "best req/s", "errors (every step)"]


def summary_rows(targets: list[dict[str, Any]]) -> list[list[Any]]:
    """The per-target table: one row per target from its single-image steps."""
    rows = []
    for t in targets:
        if t.get("error") or not (steps := sweep_steps(t)):
            rows.append([t["name"], None, None, None, t.get("error", "no single-image steps")])
            continue
        at, best = {s["concurrency"]: s for s in steps}, max(steps, key=lambda s: s["throughput_rps"] or 0)
        p50, c32 = at[1]["latency_ms"]["p50_ms"] if 1 in at else None, at[32]["throughput_rps"] if 32 in at else None
        errors = sum(sum(s["errors"].values()) for s in t["steps"])
        rows.append([t["name"], p50, c32, f"{fmt(best['throughput_rps'])} (c={best['concurrency']})", errors])
    return rows


def to_markdown(result: dict[str, Any], targets: list[list[Any]], pngs: list[str]) -> str:
    plan = result["plan"]
    parts = [
        f"# Service benchmark {result['stamp']} on {result['environment']['host']}\n",
        f"```\n{format_environment(result['environment'])}\n```\n",
        f"Corpus: {result['corpus']}. Each step: {plan['warmup_s']:g} s warm-up (dropped) + "
        f"{plan['duration_s']:g} s measured, closed loop, sent by wrk on the same machine (it shares the server's "
        "cores). Latency in ms, client side, over every response.\n",
        "## Summary (single image, FP32)\n",
        markdown_table(SUMMARY_HEADERS, summary_rows(result["targets"])),
        "## Targets (computed from this run)\n",
        markdown_table(TARGET_HEADERS, targets),
        "The 1920x1080 preprocessing target is measured by `python -m benchmarks.preprocess_bench`.\n",
        "## CPU per image (FP32)\n",
        f"The work alone (benchmarks/cost.py, this run): {fmt(result['plan'].get('floor'))}.\n",
        markdown_table(CPU_HEADERS, cpu_rows(result)),
    ]
    for t in result["targets"]:
        parts.append(f"## {t['name']}\n\n`{' '.join(t['start'])}` → {t['url']}\n")
        if t.get("error"):
            parts.append(f"**Not measured:** {fmt(t['error'])}{' These steps are discarded.' * bool(t.get('steps'))}\n")
        if t.get("steps"):
            parts += [f"Ready after {t['ready_s']:.1f} s.\n", steps_table(t["steps"])]
    parts.append(f"## Plots\n\n![throughput vs concurrency]({pngs[0]})\n\n![p99 vs throughput]({pngs[1]})\n")
    return "\n".join(parts)


def write_outputs(result: dict[str, Any], stem: Path) -> None:
    """<stem>.json, <stem>.md, <stem>-throughput.png and <stem>-p99.png; the summary tables to stdout."""
    pngs = [f"{stem.name}-throughput.png", f"{stem.name}-p99.png"]
    series = {t["name"]: sweep_steps(t) for t in result["targets"] if not t.get("error")}
    env = result["environment"]
    title = f"single image, FP32, closed loop; {env['cpu_model']} ({env['usable_cpus']} cores), {result['stamp']}"
    plot_service(series, stem.parent / pngs[0], stem.parent / pngs[1], title)
    targets = target_rows(result)
    result["targets_check"] = [dict(zip(TARGET_HEADERS, row, strict=True)) for row in targets]
    write_json(Path(f"{stem}.json"), result)
    Path(f"{stem}.md").write_text(to_markdown(result, targets, pngs))
    print(markdown_table(SUMMARY_HEADERS, summary_rows(result["targets"])))
    print(markdown_table(TARGET_HEADERS, targets))
    print(markdown_table(CPU_HEADERS, cpu_rows(result)))
    print(f"wrote {stem}.json, .md, -throughput.png and -p99.png ({result['wall_s']} s)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--quick", action="store_true", help="concurrency 1,4,16,32; 1 s warm-up + 2 s steps")
    add("--targets", help=f"comma-separated keys from: {', '.join(t.key for t in TARGETS)}")
    add("--concurrency", type=lambda s: [int(x) for x in s.split(",")], help="of the sweep")
    add("--duration", dest="duration_s", type=float, metavar="S", help="measured s per step (wrk: whole seconds)")
    add("--warmup", dest="warmup_s", type=float, metavar="S", help="dropped s per step")
    add("--out-dir", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    keys = args.targets.split(",") if args.targets else [t.key for t in TARGETS]
    if unknown := sorted(set(keys) - {t.key for t in TARGETS}):
        parser.error(f"unknown target(s) {unknown}")
    if not shutil.which("wrk"):
        parser.error("the closed-loop steps are sent by wrk: install it (apt-get install wrk)")
    plan = {**(QUICK if args.quick else FULL), "timeout_s": 30.0, "client": "wrk"}
    plan |= {k: getattr(args, k) for k in ("duration_s", "warmup_s", "concurrency") if getattr(args, k) is not None}
    env, run_stamp, t0 = print_environment(), stamp(), time.perf_counter()
    plan["floor"] = cost.floor(0.5 if args.quick else 2.0)  # before any server runs: the machine to itself
    print(f"the work alone: {plan['floor']}", file=sys.stderr)
    log_dir = Path(tempfile.mkdtemp(prefix="bench-logs-"))
    print(f"server logs: {log_dir}", file=sys.stderr)
    targets = [run_target(t, plan, log_dir) for t in TARGETS if t.key in keys]
    corpus, wall_s = describe_corpus(build_corpus()), round(time.perf_counter() - t0, 1)
    result = {"stamp": run_stamp, "environment": env, "corpus": corpus, "plan": plan, "wall_s": wall_s}
    write_outputs({**result, "targets": targets}, args.out_dir / f"{run_stamp}-{host_name()}")
    return 1 if any(t.get("error") for t in targets) else 0


if __name__ == "__main__":
    sys.exit(main())
