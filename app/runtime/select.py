"""From a plan to a running engine: build the candidates, check what really runs, keep the fastest."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import hashlib
import logging
import os
import platform
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import Executor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from app.runtime.device_batch import DeviceBatch
from app.runtime.fallback import Build, NeedsTensorRT, Serving, fallback_failed, tensorrt_absence, tensorrt_failed
from app.runtime.measure import Throughput, measure_alternating
from app.runtime.openvino_engine import OpenVinoEngine, openvino_available
from app.runtime.ort_engine import OrtEngine, ort_version, tensorrt_version, usable_providers
from app.runtime.plan import (
    CUDA,
    TENSORRT,
    EngineChoice,
    EnginePlan,
    PlanError,
    Provider,
    RuntimeOptions,
    engine_build_key,
    engine_cache_path,
    plan_engines,
    slow_int8_message,
    tensorrt_provider,
)
from app.runtime.spec import ModelLoadError, ModelSpec, read_onnx_input

logger = logging.getLogger("ray.serve")

# The built-in model's contract (DESIGN.md), for planning when the model file is not on this machine.
DEFAULT_INPUT = ("image", (224, 224, 3))


class Engine(Protocol):
    """What the Classifier needs from any engine."""

    name: str
    spec: ModelSpec
    path: Path
    providers: list[str]
    requested_providers: list[str]

    @property
    def alive(self) -> bool: ...

    @property
    def active_provider(self) -> str: ...

    def logits(self, batch: np.ndarray) -> np.ndarray: ...

    def dummy_batch(self, n: int) -> np.ndarray: ...

    def end_profiling(self) -> str | None: ...

    def placement_counts(self) -> dict[str, int]: ...

    def describe(self) -> dict[str, Any]: ...

    def prepare(self, max_batch: int) -> None:
        """Before traffic, after the open: whatever must happen once per engine (CUDA graphs are captured here)."""
        ...

    def close(self) -> None: ...

    # What it can do beyond host arrays, said by the engine rather than probed.

    @property
    def fixed_parallel(self) -> bool:
        """Whether the number of batches run at once is fixed at open (another number: open it again)."""
        ...

    @property
    def executor(self) -> Executor | None:
        """The threads its batches must run on (CUDA graphs live on theirs); None: any thread."""
        ...

    def device_input(self) -> tuple[str, int] | None:
        """Where `run_device` reads a DeviceBatch from ("cuda" | "cpu", device id); None: it reads host arrays only."""
        ...

    def rows_for(self, n: int) -> int:
        """The rows a batch of `n` images binds (padding included): a DeviceBatch must hold that many."""
        ...

    def graph_bucket(self, n: int) -> int | None:
        """The CUDA graph bucket a batch of `n` replays (its padded rows); None: a plain run."""
        ...

    def run_device(self, batch: DeviceBatch, n: int, outputs: list[str] | None = None) -> list[np.ndarray]:
        """The outputs for rows 0..n-1 of `batch`, read in place (only where `device_input()` is not None)."""
        ...


@functools.lru_cache(maxsize=16)
def model_sha256(path: str, mtime_ns: int) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def gpu_name(device_id: int) -> str:
    """The GPU's product name (nvidia-smi), for the engine cache key; "unknown-gpu" when it cannot be read."""
    visible = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    index = visible[device_id] if device_id < len(visible) else str(device_id)
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader", "-i", index.strip()],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
        return out.stdout.strip().splitlines()[0] or "unknown-gpu"
    except (OSError, subprocess.SubprocessError, IndexError):
        return "unknown-gpu"


def tensorrt_for(path: str, opts: RuntimeOptions, cache_key: dict[str, str] | None = None) -> Provider:
    """The TensorRT provider for `path`, its cache directory keyed on this model, ORT, TensorRT, the GPU and how
    the engine is built (profile, precision, workspace, builder level)."""
    read = read_onnx_input(path) if Path(path).is_file() else None
    name, sample = read or DEFAULT_INPUT
    key = cache_key or {
        "model_sha256": model_sha256(path, Path(path).stat().st_mtime_ns),
        "ort": ort_version(),
        "tensorrt": tensorrt_version(),
        "gpu": gpu_name(opts.device_id),
    }
    build = engine_build_key(opts)
    cache = engine_cache_path(
        opts.tensorrt.cache_dir, key["model_sha256"], key["ort"], key["tensorrt"], key["gpu"], build
    )
    return tensorrt_provider(opts, cache, name, sample)


def plan_for(variant: str, path: str, opts: RuntimeOptions, available: list[str] | None = None) -> EnginePlan:
    """The plan on this node: ONNX Runtime's usable providers and OpenVINO if installed."""
    available = usable_providers() if available is None else available
    trt = tensorrt_for(path, opts) if opts.prefer_gpu and TENSORRT in available else None
    return _checked_plan(variant, path, opts, available, trt)


def _checked_plan(
    variant: str, path: str, opts: RuntimeOptions, available: list[str], trt: Provider | None = None
) -> EnginePlan:
    """The plan, made again with `u8s8_overflow` when it runs on this CPU and the model's int8 weights can
    overflow its U8S8 kernels (a GPU plan never reads the model for this)."""
    plan = plan_engines(variant, opts, available, openvino_available(), trt)
    if plan.gpu or not u8s8_overflows_here(path):
        return plan
    return plan_engines(variant, opts, available, openvino_available(), trt, u8s8_overflow=True)


def u8s8_overflows_here(path: str) -> bool:
    """This CPU is x86 without VNNI and the model has int8 weight pairs its U8S8 kernels can overflow. A model
    that cannot be read here is not judged (False): loading it reports that with the variant's name."""
    if not x86_without_vnni() or not os.path.isfile(path):
        return False
    # Here, not at import: the Triton peer (benchmarks/baselines/triton_peer.py) runs app.runtime in an
    # environment with ONNX Runtime but without the onnx package.
    import onnx

    from app.served_model.u8s8 import pair_problems

    try:
        problems = pair_problems(onnx.load(path))  # external data too, beside the model
    except Exception as e:
        logger.warning("%s: could not check int8 weights for U8S8 overflow (%s)", path, e)
        return False
    if problems:
        logger.warning("%s: int8 weights can overflow U8S8 kernels on this CPU: %s", path, "; ".join(problems[:3]))
    return bool(problems)


def x86_without_vnni(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """An x86-64 CPU whose flags (Linux) name no VNNI: ORT's U8S8 kernels there sum pairs in 16 bits."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    try:
        flags = next((line for line in Path(cpuinfo).read_text().splitlines() if line.startswith("flags")), "")
    except OSError:
        return False  # unknown: keep the plan as it was
    return bool(flags) and not {"avx512_vnni", "avx_vnni"} & set(flags.split())


class CacheNotWritable(ModelLoadError):
    """The TensorRT engine cache directory cannot be written: a deployment's mistake, never a reason to fall back."""


# flock() errors of a file system that keeps no locks (an NFS mount with `nolock`, some FUSE file systems).
NO_LOCKS = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS)


def engine_cache_dir(choice: EngineChoice) -> Path | None:
    """The TensorRT engine cache directory `choice` builds into (None: it has no TensorRT provider)."""
    trt = next((p for p in choice.providers if p.name == TENSORRT), None)
    return None if trt is None else Path(trt.options["trt_engine_cache_path"])


@contextlib.contextmanager
def _build_lock(choice: EngineChoice) -> Iterator[None]:
    """Replicas building the same TensorRT engine take turns: the second loads the first's. On one node's disk and
    on a shared volume alike (docs/engines.md "A shared engine cache": Linux's NFS client sends flock() to the
    server as a whole-file lock, so Pods on other nodes wait too). Where the file system keeps no locks, the
    build goes on unlocked: two Pods may then build the same engine at once, and one that meets the other's
    half-written engine sets it aside and builds again (`build`)."""
    cache = engine_cache_dir(choice)
    if cache is None:
        yield
        return
    try:
        cache.mkdir(parents=True, exist_ok=True)
        lock = open(cache / ".build.lock", "w")  # noqa: SIM115 - held for the whole build
    except OSError as e:
        raise CacheNotWritable(
            f"TensorRT engine cache {cache} is not writable ({e.strerror}): mount a writable volume there "
            "(k8s/rayservice.yaml mounts one at $APP_TRT_CACHE_DIR) or set tensorrt.cache_dir"
        ) from e
    with lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
        except OSError as e:
            if e.errno not in NO_LOCKS:
                raise
            logger.warning("TensorRT engine cache %s cannot be locked (%s): building without the lock", cache, e)
        yield


# The files ORT's TensorRT EP keeps in its engine cache directory (engines, their profiles, contexts).
ENGINE_FILES = ("*.engine", "*.profile", "*_ctx.onnx")


def engine_files_state(cache: Path) -> dict[str, tuple[int, int, int]]:
    """Each engine file under `cache` (its path relative to `cache`; `rejected/` left out) with its size, mtime
    (ns) and inode. ORT writes a rebuilt engine under the same name, so the names alone cannot tell a start that
    loaded the engine from one that built it again: an unchanged state can."""
    if not cache.is_dir():
        return {}
    state = {}
    for pattern in ENGINE_FILES:
        for f in cache.rglob(pattern):
            rel = f.relative_to(cache)
            if "rejected" in rel.parts[:-1] or not f.is_file():
                continue
            st = f.stat()
            state[str(rel)] = (st.st_size, st.st_mtime_ns, st.st_ino)
    return dict(sorted(state.items()))


def build(path: str, opts: RuntimeOptions, choice: EngineChoice) -> Engine:
    if choice.engine == "openvino":
        return OpenVinoEngine(path, opts)
    with _build_lock(choice):
        try:
            return OrtEngine(path, opts, choice)
        except ModelLoadError as e:
            # ORT writes an engine in place: a replica killed mid-build leaves a truncated file that every
            # later start would load and fail on. Set the cached engines aside and build once more, but only
            # when TensorRT said it could not deserialise them: on a shared cache any other failure (this GPU
            # out of memory, a missing builder library, a bad option) is this Pod's, not the engines'.
            if not engine_unreadable(e) or not _set_aside_cached_engines(choice, e):
                raise
            return OrtEngine(path, opts, choice)


# What ORT's TensorRT EP says when a cached engine does not load ("TensorRT EP could not deserialize engine
# from cache: <path>", tensorrt_execution_provider.cc); matched loosely, the rest of the wording may change.
DESERIALIZE_FAILED = "deserializ"


def tensorrt_said(error: Exception) -> bool:
    """The failure came from TensorRT (ONNX Runtime's TensorRT EP names itself in its errors), not from the cache
    directory, the file or the options: only then is the variant's fallback the answer."""
    return not isinstance(error, CacheNotWritable) and "tensorrt" in str(error).lower()


def engine_unreadable(error: Exception) -> bool:
    """The load failed on a cached engine TensorRT could not deserialise (truncated, or from another build)."""
    return DESERIALIZE_FAILED in str(error).lower()


def _set_aside_cached_engines(choice: EngineChoice, error: Exception) -> bool:
    """Move the TensorRT engine files of `choice`'s cache into `rejected/` (kept to look at, each under its name
    and the time it was set aside); False if none."""
    cache = engine_cache_dir(choice)
    if cache is None:
        return False
    found = sorted({f for pattern in ENGINE_FILES for f in cache.glob(pattern)})
    if not found:
        return False
    rejected = cache / "rejected"
    rejected.mkdir(exist_ok=True)
    # Each setting-aside keeps its own copies (a second one must not overwrite the first's evidence).
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    for f in found:
        f.replace(_unused(rejected / f"{f.name}.{stamp}"))
    logger.warning(
        "TensorRT engine cache %s: loading failed (%s); %d cached file(s) set aside in %s, building afresh",
        cache,
        error,
        len(found),
        rejected,
    )
    return True


def _unused(path: Path) -> Path:
    """`path`, or `path.1`, `path.2`... the first that does not exist yet."""
    n = 0
    candidate = path
    while candidate.exists():
        n += 1
        candidate = path.with_name(f"{path.name}.{n}")
    return candidate


def check_int8_placement(variant: str, opts: RuntimeOptions, engine: Engine) -> None:
    """An INT8 variant whose compute landed on the CUDA EP after all (TensorRT refused the graph)."""
    if opts.precision != "int8" or opts.allow_slow_int8 or engine.name != "tensorrt":
        return
    counts = engine.placement_counts()
    if counts.get(CUDA, 0) > counts.get(TENSORRT, 0):
        engine.close()
        took = f"TensorRT took {counts.get(TENSORRT, 0)} nodes, CUDA {counts.get(CUDA)}"
        raise NeedsTensorRT(
            f"{slow_int8_message(variant)} ({took}: is this a TensorRT build, from `python -m app.models quantize "
            "--target tensorrt`?)",
            f"TensorRT refused most of the graph ({took})",
        )


@dataclass
class Opened:
    engine: Engine
    plan: EnginePlan
    candidates: dict[str, Throughput] = field(default_factory=dict)  # measured, when the plan had several
    serving: Serving | None = None  # set when the variant's declared fallback runs instead of its own build


# Candidates are compared at a batch no larger than this: per-image cost on a CPU is nearly flat in the batch
# size, and every second spent here delays the replica's start.
CHOICE_BATCH = 8


def open_engine(
    variant: str, path: str, opts: RuntimeOptions, measure_batch: int = 16, fallback: Build | None = None
) -> Opened:
    """The engine `variant` runs on here: planned, built, checked, and (for several candidates) measured. When the
    build runs as intended only on TensorRT and TensorRT is not usable here, `fallback` (the variant's declared
    fallback build) is opened instead and `Opened.serving` says so (`app.runtime.fallback`)."""
    try:
        return _open_build(variant, path, opts, measure_batch)
    except NeedsTensorRT as refused:
        if fallback is None:
            raise
        serving = Serving(opts.precision, path, fallback.opts.precision, fallback.path, refused.reason)
        logger.warning("%s (%s)", serving.line(variant), "the variant's declared fallback")
        try:
            opened = _open_build(variant, fallback.path, fallback.opts, measure_batch)
        except ModelLoadError as e:
            raise fallback_failed(variant, refused, fallback, e) from e
        opened.serving = serving
        return opened


def _open_build(variant: str, path: str, opts: RuntimeOptions, measure_batch: int) -> Opened:
    if not Path(path).is_file():  # the deployment's error, whatever engine would run it: never a fallback's cue
        raise ModelLoadError(f"model file not found: {path}")
    try:
        plan = plan_for(variant, path, opts)
    except PlanError as e:
        if e.needs_tensorrt:
            raise NeedsTensorRT(str(e), tensorrt_absence(usable_providers())) from e
        raise ModelLoadError(str(e)) from e
    first = plan.candidates[0]
    try:
        engines = [build(path, opts, choice) for choice in plan.candidates]
    except ModelLoadError as e:
        if first.engine != "tensorrt" or opts.engine == "tensorrt" or not tensorrt_said(e):
            raise
        # TensorRT failed to load or build (logged): plan again without it; INT8 then refuses the CUDA EP.
        logger.warning("Classifier_%s: TensorRT failed (%s); planning without it", variant, e)
        try:
            plan = _checked_plan(variant, path, opts, [p for p in usable_providers() if p != TENSORRT])
        except PlanError as again:
            if again.needs_tensorrt:
                raise NeedsTensorRT(f"{again} (TensorRT failed: {e})", tensorrt_failed(e)) from e
            raise ModelLoadError(f"{again} (TensorRT failed: {e})") from e
        engines = [build(path, opts, choice) for choice in plan.candidates]
    for engine in engines:
        check_int8_placement(variant, opts, engine)
    if len(engines) == 1:
        return Opened(engines[0], plan)
    x = engines[0].dummy_batch(min(measure_batch, CHOICE_BATCH))
    measured = measure_alternating({e.name: e.logits for e in engines}, x, parallel=max(1, opts.streams))
    best = max(engines, key=lambda e: measured[e.name].img_per_s)
    for engine in engines:
        if engine is not best:
            engine.close()
    logger.info(
        "Classifier_%s: %s",
        variant,
        ", ".join(f"{n} {t.img_per_s} img/s" for n, t in measured.items()) + f" at batch {len(x)}: {best.name}",
    )
    return Opened(best, plan, measured)
