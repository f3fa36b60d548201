"""The served config: configs/prod.yaml as a cluster runs it, on one node, at a fixed shape.

prod.yaml autoscales; a measurement needs a known shape, so every `autoscaling_config` becomes a fixed `num_replicas`
(its bounds gone), and the model files, labels and TensorRT cache are re-pointed at this node's. Placement stays
prod.yaml's (Routers and Preprocessors on `cpu_pool`, Classifiers on `{GPU: 0.5, CPU: 1}`), so the node must offer
what a cluster offers (benchmarks/gpu_serve/node.py starts it so). prod.yaml itself is never written.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROUTER, PREPROCESSOR, CLASSIFIER = "Router", "Preprocessor", "Classifier_"
# Cores kept off Ray's books for what runs beside the replicas on the same node: wrk (2 threads, benchmarks/load.py)
# and HAProxy (1 thread, RAY_SERVE_HAPROXY_NBTHREAD in configs/serve.env). Ray's daemons and Serve's controller and
# proxy actor idle at ~15% of a core (docs/performance.md) and share them.
RESERVED_CORES = 3.0
# Of the cores left after the Classifiers and the reserve, the Preprocessors' share. Decoding a web-sized JPEG costs
# ~2-4 CPU-ms, the Router ~1-2 CPU-ms per request beside it (docs/performance.md "Where the gap is"): for single
# images the Preprocessors need about twice the Routers' cores; 16-image requests pay the Router once, so decode
# weighs more still. Two thirds to the Preprocessors, one third to the Routers.
PREPROCESSOR_SHARE = 2 / 3
DRY_RUN_CPUS = 0.25  # every replica's num_cpus in a CPU dry run: four replicas take one of this machine's two cores
# A CPU dry run's Classifiers batch at most 16 (configs/local.yaml's): each warms up every batch size to its maximum
# and measures itself (and the speed gate) at it before serving, which at 64 takes minutes on a quarter of a core.
DRY_RUN_MAX_BATCH = 16
# The TensorRT INT8 artifact (symmetric S8S8 QDQ) is a GPU build: on ONNX Runtime's CPU EP it runs ~6x slower than the
# CPU INT8 build (U8S8 kernels refused for its weights), too slow for any dry run. A dry run serves the CPU build of
# the same model (`make models` builds both) in its place.
TRT_SUFFIX = "-trt.onnx"


# decode_in: gpu: each Classifier decodes its batches' JPEGs on the GPU and the rest (PNG, progressive, CMYK) on its own
# CPUs; the bench's images are baseline JPEGs, so its CPUs mostly check headers and gather the batch. Two each.
GPU_DECODE_CLASSIFIER_CPUS = 2.0
STANDIN = {
    "APP_GPU_DECODER": "standin"
}  # a dry run of decode_in: gpu: the host stand-in (app/imaging/standin_decoder.py)


@dataclass(frozen=True)
class Shape:
    """How many replicas of each deployment, and what each asks of the node. `decode_in`: where images are decoded,
    prod.yaml's Preprocessors or (gpu) the Classifiers' batches: then there are no Preprocessors. `cuda_graphs`
    False: args.cuda_graphs.enabled false (gpu_serve --no-cuda-graphs: a second try where a capture broke the start)."""

    routers: int
    preprocessors: int
    dry_run: bool = False
    decode_in: str = "preprocessor"
    cuda_graphs: bool = True

    def describe(self) -> str:
        where = "CPU dry run: every replica num_cpus 0.25, no GPU" if self.dry_run else "prod.yaml's placement"
        where += "" if self.cuda_graphs else "; CUDA graphs off"
        if self.decode_in == "gpu":
            return f"{self.routers} Router(s), 1 Classifier per variant decoding on the GPU (decode_in: gpu; {where})"
        return f"{self.routers} Router(s), {self.preprocessors} Preprocessor(s), 1 Classifier per variant ({where})"


def gpu_decode_routers(cores: int, prod: dict[str, Any]) -> int:
    """decode_in: gpu: Routers to fill the node beside the Classifiers (GPU_DECODE_CLASSIFIER_CPUS each) and
    RESERVED_CORES, at prod.yaml's num_cpus, never past its max_replicas."""
    deployments = {d["name"]: d for d in app_of(prod).get("deployments", [])}
    classifiers = sum(GPU_DECODE_CLASSIFIER_CPUS for n in deployments if n.startswith(CLASSIFIER))
    router_cpus = float(_actor(deployments.get(ROUTER, {})).get("num_cpus", 1.0))
    routers = max(1, math.floor((cores - classifiers - RESERVED_CORES) / router_cpus + 1e-9))
    return min(routers, _max_replicas(deployments.get(ROUTER, {})))


def default_counts(cores: int, prod: dict[str, Any]) -> tuple[int, int]:
    """(Routers, Preprocessors) that fill a node of `cores` beside one Classifier per variant and RESERVED_CORES:
    the rest split PREPROCESSOR_SHARE to the Preprocessors, the remainder to the Routers, at prod.yaml's num_cpus
    each, and never past prod.yaml's max_replicas. 16 cores, two Classifiers of 1 CPU: 11 left, 7 Preprocessors
    (1 CPU) and 8 Routers (0.5 CPU)."""
    deployments = {d["name"]: d for d in app_of(prod).get("deployments", [])}
    cpus = {name: float(_actor(deployments.get(name, {})).get("num_cpus", 1.0)) for name in (ROUTER, PREPROCESSOR)}
    classifiers = sum(float(_actor(d).get("num_cpus", 1.0)) for n, d in deployments.items() if n.startswith(CLASSIFIER))
    rest = cores - classifiers - RESERVED_CORES
    pre = max(1, round(rest * PREPROCESSOR_SHARE / cpus[PREPROCESSOR]))
    routers = max(1, math.floor((rest - pre * cpus[PREPROCESSOR]) / cpus[ROUTER] + 1e-9))
    caps = {name: _max_replicas(deployments.get(name, {})) for name in (ROUTER, PREPROCESSOR)}
    return min(routers, caps[ROUTER]), min(pre, caps[PREPROCESSOR])


def _max_replicas(deployment: dict[str, Any]) -> int:
    auto = deployment.get("autoscaling_config") or {}
    return int(auto.get("max_replicas", deployment.get("max_replicas", 10**6)))


def _actor(deployment: dict[str, Any]) -> dict[str, Any]:
    return dict(deployment.get("ray_actor_options") or {})


def app_of(config: dict[str, Any]) -> dict[str, Any]:
    """The config's (first) application: prod.yaml has one."""
    apps = config.get("applications") or []
    if not apps:
        raise ValueError("the config has no applications")
    return dict(apps[0])


def repoint(path: str, models: Path, dry_run: bool = False) -> str:
    """A model or labels path of prod.yaml (the image's /home/ray/models/...) as this node's file of the same name; in
    a dry run a TensorRT artifact as the CPU build beside it (TRT_SUFFIX)."""
    name = Path(path).name
    if dry_run and name.endswith(TRT_SUFFIX):
        name = name.removesuffix(TRT_SUFFIX) + ".onnx"
    return str(models / name)


def model_paths(config: dict[str, Any]) -> dict[str, str]:
    """Every file the config names: labels, each variant's model, each variant's fallback's model."""
    args = app_of(config).get("args") or {}
    out = {"labels": args.get("model", {}).get("labels_path")} if args.get("model", {}).get("labels_path") else {}
    for name, variant in (args.get("variants") or {}).items():
        out[f"{name}"] = variant["model_path"]
        if isinstance(variant.get("fallback"), dict) and variant["fallback"].get("model_path"):
            out[f"{name}.fallback"] = variant["fallback"]["model_path"]
    return out


def derive(
    prod: dict[str, Any], shape: Shape, *, models: Path, trt_cache: Path, http_port: int, grpc_port: int
) -> dict[str, Any]:
    """prod.yaml as served here: files re-pointed at `models`, the TensorRT cache at `trt_cache`, fixed replica counts,
    the ingress on loopback ports of this run; with `shape.dry_run`, on this machine's CPUs (device cpu, no GPU asked
    for, every replica num_cpus DRY_RUN_CPUS, Classifier batches of at most DRY_RUN_MAX_BATCH, the CPU INT8 build for
    the TensorRT one). Everything else as prod.yaml has it."""
    cfg = copy.deepcopy(prod)
    cfg["http_options"] = {**(cfg.get("http_options") or {}), "host": "127.0.0.1", "port": http_port}
    if "grpc_options" in cfg:
        cfg["grpc_options"] = {**cfg["grpc_options"], "port": grpc_port}
    app = cfg["applications"][0]
    args = app.setdefault("args", {})
    if args.get("model", {}).get("labels_path"):
        args["model"]["labels_path"] = repoint(args["model"]["labels_path"], models)
    for variant in (args.get("variants") or {}).values():
        variant["model_path"] = repoint(variant["model_path"], models, shape.dry_run)
        if isinstance(variant.get("fallback"), dict) and variant["fallback"].get("model_path"):
            variant["fallback"]["model_path"] = repoint(variant["fallback"]["model_path"], models, shape.dry_run)
    args["tensorrt"] = {**(args.get("tensorrt") or {}), "cache_dir": str(trt_cache)}
    if not shape.cuda_graphs:
        args["cuda_graphs"] = {**(args.get("cuda_graphs") or {}), "enabled": False}
    if shape.dry_run:
        args.update(device="cpu", require_gpu=False)
    if shape.decode_in == "gpu":
        _decode_on_gpu(app, shape.dry_run)
    for d in app.get("deployments", []):
        d.pop("autoscaling_config", None)
        d.pop("min_replicas", None)
        d.pop("max_replicas", None)
        # One node here: prod.yaml's one-Router-per-node cap (for a cluster's availability) would leave all Routers
        # but one unplaced.
        d.pop("max_replicas_per_node", None)
        d["num_replicas"] = replicas_of(d["name"], shape)
        if shape.dry_run:
            d["ray_actor_options"] = {**_actor(d), "num_cpus": DRY_RUN_CPUS, "num_gpus": 0}
            batching = d.get("user_config") or {}
            if d["name"].startswith(CLASSIFIER) and batching.get("max_batch_size", 0) > DRY_RUN_MAX_BATCH:
                d["user_config"] = {**batching, "max_batch_size": DRY_RUN_MAX_BATCH}
    return cfg


def _decode_on_gpu(app: dict[str, Any], dry_run: bool) -> None:
    """decode_in: gpu: no Preprocessor; each Classifier GPU_DECODE_CLASSIFIER_CPUS (in a dry run, the stand-in for
    nvImageCodec in its environment)."""
    app["args"]["decode_in"] = "gpu"
    app["deployments"] = [d for d in app.get("deployments", []) if d["name"] != PREPROCESSOR]
    for d in app["deployments"]:
        if d["name"].startswith(CLASSIFIER):
            options = {**_actor(d), "num_cpus": GPU_DECODE_CLASSIFIER_CPUS}
            if dry_run:
                runtime_env = dict(options.get("runtime_env") or {})
                options["runtime_env"] = {**runtime_env, "env_vars": {**runtime_env.get("env_vars", {}), **STANDIN}}
            d["ray_actor_options"] = options


def replicas_of(deployment: str, shape: Shape) -> int:
    if deployment == ROUTER:
        return shape.routers
    return shape.preprocessors if deployment == PREPROCESSOR else 1


def given_cores(config: dict[str, Any]) -> dict[str, float]:
    """The CPU each deployment of the served config was given in all: num_replicas x num_cpus."""
    out = {}
    for d in app_of(config).get("deployments", []):
        out[d["name"]] = round(int(d.get("num_replicas", 1)) * float(_actor(d).get("num_cpus", 1.0)), 3)
    return out


def gpus_asked(config: dict[str, Any]) -> float:
    """GPUs the served config's replicas ask for in all (0 in a dry run)."""
    deployments = app_of(config).get("deployments", [])
    return sum(int(d.get("num_replicas", 1)) * float(_actor(d).get("num_gpus", 0) or 0) for d in deployments)


def cpus_asked(config: dict[str, Any]) -> float:
    return sum(given_cores(config).values())
