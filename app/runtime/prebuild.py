"""TensorRT engines built ahead of a rollout: `python -m app.runtime build-engines CONFIG`.

Each GPU variant of a Serve config, and each speed gate's baseline as a gated replica opens it, is opened
here exactly as a replica on this node would open it: the same served model file, the same RuntimeOptions
(`app.runtime.variants.runtime_options`), the same TensorRT provider options and cache directory (`tensorrt_for`: the
model's sha256, ONNX Runtime's and TensorRT's versions, the GPU's name, `engine_build_key`), under the same
build lock (`select.build`). ONNX Runtime's TensorRT EP builds an engine when the session is made (the
profile is explicit) and writes it to that directory, so a replica that starts later loads it instead of
building. Run on a node of the GPU type the replicas run on, in the serving image, with the cache volume
mounted where the replicas mount it (docs/engines.md "Engines built once per GPU type").
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.config import AppArgs, ClassifierConfig, classifier_deployment_name, validate_serve_config
from app.runtime import threads_for
from app.runtime.model_files import fetched_here, with_version
from app.runtime.ort_engine import missing_libraries, ort_version, tensorrt_version, usable_providers
from app.runtime.plan import TENSORRT, PlanError, Provider, RuntimeOptions, engine_build_key, plan_engines
from app.runtime.select import build, engine_files_state, gpu_name, model_sha256, tensorrt_for
from app.runtime.variants import runtime_options, speed_gate_for


class BuildRefused(RuntimeError):
    """Engines cannot be built here; the message is the one line to print."""


@dataclass
class EngineBuild:
    """One cache directory to fill: the model file and options of the first variant that needs it."""

    cache_dir: str
    model_path: str
    variant: str
    opts: RuntimeOptions
    provider: Provider
    used_by: list[str] = field(default_factory=list)  # "Classifier_fp32", "speed gate of Classifier_int8"

    def describe(self) -> dict[str, Any]:
        return {
            "cache_dir": self.cache_dir,
            "model_path": self.model_path,
            "build": engine_build_key(self.opts),
            "used_by": self.used_by,
        }


def _deployment(cfg: dict[str, Any], name: str) -> dict[str, Any]:
    app = cfg["applications"][0]
    return next((d for d in app.get("deployments", []) if d.get("name") == name), {})


def as_released(cfg: dict[str, Any], args: AppArgs) -> AppArgs:
    """`args` with each variant's model the version its Classifier's user_config names (a release in place), every
    remote file fetched into this node's cache: what the replicas of this node open."""
    for variant in args.variants:
        user_config = _deployment(cfg, classifier_deployment_name(variant)).get("user_config") or {}
        version = ClassifierConfig.model_validate(user_config).version()
        if version:
            args = with_version(args, variant, version)
    return fetched_here(args)


def served_path(args: AppArgs, variant: str) -> str:
    """The file a replica of `variant` loads (its served copy when the model needs a prologue); the declared
    file when it is not on this machine (a dry run elsewhere)."""
    from app.served_model.model_io import model_io

    path = args.resolved_path(args.variants[variant].model_path)
    if not path.is_file():
        return str(path)
    return str(model_io(args.model, path, f"variants.{variant}.model_path").served.path)


def replica_threads_streams(cfg: dict[str, Any], args: AppArgs, variant: str) -> tuple[int, int]:
    """(intra-op threads, parallel batches) of `variant`'s replicas: its deployment's num_cpus and
    user_config.max_concurrent_batches in the Serve config."""
    d = _deployment(cfg, classifier_deployment_name(variant))
    num_cpus = float((d.get("ray_actor_options") or {}).get("num_cpus", 1.0))
    batching = ClassifierConfig.model_validate(d.get("user_config") or {})
    return args.intra_op_threads or threads_for(num_cpus), batching.max_concurrent_batches


def cache_key_here(path: str, opts: RuntimeOptions) -> dict[str, str]:
    """The cache key's parts as far as this machine knows them: MODEL, VERSION, GPU where it cannot tell."""
    trt = tensorrt_version()
    gpu = gpu_name(opts.device_id)
    return {
        "model_sha256": model_sha256(path, Path(path).stat().st_mtime_ns) if Path(path).is_file() else "MODEL",
        "ort": ort_version(),
        "tensorrt": trt if trt != "none" else "VERSION",
        "gpu": gpu if gpu != "unknown-gpu" else "GPU",
    }


def engine_builds(cfg: dict[str, Any], key: dict[str, str] | None = None) -> list[EngineBuild]:
    """Every TensorRT cache directory the config's GPU replicas open, once each, in config order.

    `key`: the cache key's parts (None: this machine's, read as the replicas read them). A speed gate's
    baseline opens the baseline variant's model with that variant's options on the engine the gated variant
    chose (`app.runtime.variants.speed_gate_for`, with TensorRT chosen): its directory is the baseline replicas' own, so
    it is listed under them rather than built twice.
    """
    args = as_released(cfg, validate_serve_config(cfg))
    builds: dict[str, EngineBuild] = {}

    def add(variant: str, opts: RuntimeOptions, user: str) -> None:
        path = served_path(args, variant)
        provider = tensorrt_for(path, opts, key or cache_key_here(path, opts))
        cache_dir = str(provider.options["trt_engine_cache_path"])
        found = builds.setdefault(cache_dir, EngineBuild(cache_dir, path, variant, opts, provider))
        found.used_by.append(user)

    gpu_variants = [v for v in args.variants if args.may_use_tensorrt(v)]
    for variant in gpu_variants:  # the replicas first: a build opens with a replica's own options where one has it
        threads, streams = replica_threads_streams(cfg, args, variant)
        add(variant, runtime_options(args, variant, True, threads, streams), classifier_deployment_name(variant))
    for variant in gpu_variants:
        gate = speed_gate_for(args, variant, True, *replica_threads_streams(cfg, args, variant), "tensorrt")
        if gate is not None and args.may_use_tensorrt(gate[0].baseline) and gate[2].engine == "tensorrt":
            add(gate[0].baseline, gate[2], f"speed gate of {classifier_deployment_name(variant)}")
    return list(builds.values())


def check_tensorrt_here() -> list[str]:
    """The providers usable here; BuildRefused when TensorRT's is not among them."""
    usable = usable_providers()
    if TENSORRT not in usable:
        missing = missing_libraries(TENSORRT)
        why = f"missing {', '.join(missing)}" if missing else "not in this ONNX Runtime build"
        raise BuildRefused(
            f"build-engines: TensorrtExecutionProvider cannot load here ({why}); run it in the serving image on a "
            "node of the GPU type the replicas run on (docs/engines.md), or pass --dry-run"
        )
    return usable


def run_build(b: EngineBuild, usable: list[str]) -> dict[str, Any]:
    """Open `b` as its replica would (the TensorRT EP builds or loads the engine), then close it."""
    cache = Path(b.cache_dir)
    before = engine_files_state(cache)
    try:
        plan = plan_engines(b.variant, b.opts, usable, openvino=False, tensorrt=b.provider)
    except PlanError as e:
        raise BuildRefused(f"build-engines: {e}") from e
    t0 = time.perf_counter()
    engine = build(b.model_path, b.opts, plan.candidates[0])
    seconds = time.perf_counter() - t0
    placement = engine.placement_counts()
    engine.close()
    after = engine_files_state(cache)
    return {
        **b.describe(),
        "engine_files": sorted(after),
        # loaded: engines were there and none was written again (a rebuild keeps the names, not size/mtime/inode)
        "loaded_from_cache": bool(before) and after == before,
        "seconds": round(seconds, 1),
        "nodes_per_provider": placement,
    }
