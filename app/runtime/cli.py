"""python -m app.runtime plan CONFIG [--available EP,EP,...] [--gpu]
python -m app.runtime build-engines CONFIG [--dry-run]

What each Classifier replica of a Serve config would run on a node that offers those execution
providers: engine, model file, providers in priority order with their options. No model is loaded
and no Ray is started, so a GPU cluster's config can be checked on a laptop:

    python -m app.runtime plan configs/prod.yaml --gpu \\
        --available TensorrtExecutionProvider,CUDAExecutionProvider,CPUExecutionProvider

Exit status 1, with the reason, when a variant cannot run as configured there (an INT8 variant that
would land on the CUDA EP without TensorRT, require_gpu on a node without a usable GPU provider, decode_in: gpu
without a GPU, the CUDA EP or nvImageCodec).

`build-engines` builds (or loads, when cached) the TensorRT engines of every GPU variant, and of each speed
gate's baseline, into the engine cache exactly as the replicas would (`app.runtime.prebuild`), so a Job or
an init container fills a shared cache ahead of a rollout. Without TensorRT it exits 1 with one line;
`--dry-run` prints the cache directories it would fill and builds nothing.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import yaml

from app.config import AppArgs, validate_serve_config
from app.runtime.cuda_transform import nvimgcodec_installed, plan_decode
from app.runtime.fallback import Serving, tensorrt_absence
from app.runtime.openvino_engine import openvino_available
from app.runtime.ort_engine import ort_version, tensorrt_version, usable_providers
from app.runtime.plan import OPENVINO, TENSORRT, PlanError, RuntimeOptions, plan_engines
from app.runtime.prebuild import (
    BuildRefused,
    as_released,
    check_tensorrt_here,
    engine_builds,
    replica_threads_streams,
    run_build,
)
from app.runtime.select import model_sha256, tensorrt_for
from app.runtime.spec import ModelLoadError
from app.runtime.variants import fallback_options, runtime_options


def plan_config(
    cfg: dict[str, Any], available: list[str], openvino: bool, gpu: bool, listed: bool = False
) -> dict[str, Any]:
    """{"variants": {name: plan}} for every variant of the config's first application. A variant whose INT8 build
    needs TensorRT where it is not usable plans its declared fallback instead, and says so (`fallback`, `serving`).
    `listed`: `available` was given by hand, not read off this machine."""
    args: AppArgs = validate_serve_config(cfg)
    args = as_released(cfg, args)  # the user_configs' versions, remote files fetched here as a replica would
    decode = plan_decode(args.decode_in, gpu, available, None if listed else nvimgcodec_installed())
    out: dict[str, Any] = {}
    for variant, v in args.variants.items():
        threads, streams = replica_threads_streams(cfg, args, variant)
        opts = runtime_options(args, variant, gpu, threads, streams)
        path = str(args.resolved_path(v.model_path))
        try:
            out[variant] = _plan_build(variant, path, opts, available, openvino)
        except PlanError as e:
            declared = fallback_options(args, variant, gpu, threads, streams)
            if not e.needs_tensorrt or declared is None:
                raise PlanError(f"variants.{variant}: {e}") from e
            fb_path, fb_opts = declared
            try:
                planned = _plan_build(variant, str(fb_path), fb_opts, available, openvino)
            except PlanError as again:
                raise PlanError(f"variants.{variant}: {e}; its declared fallback cannot run either: {again}") from again
            serving = Serving(v.precision, path, fb_opts.precision, str(fb_path), tensorrt_absence(available, listed))
            out[variant] = {**planned, "fallback": serving.describe(), "serving": serving.line(variant)}
            continue
        out[variant]["serving"] = f"Classifier_{variant}: {v.precision} on {out[variant]['engine']}"
    return {"variants": out, "decode": decode}


def _plan_build(variant: str, path: str, opts: RuntimeOptions, available: list[str], openvino: bool) -> dict[str, Any]:
    """One build's plan, as `python -m app.runtime plan` prints it."""
    trt = None
    if opts.prefer_gpu and TENSORRT in available:
        key = {
            "model_sha256": model_sha256(path, Path(path).stat().st_mtime_ns) if Path(path).is_file() else "MODEL",
            "ort": ort_version(),
            "tensorrt": tensorrt_version() if TENSORRT in usable_providers() else "VERSION",
            "gpu": "GPU",
        }
        trt = tensorrt_for(path, opts, key)
    plan = plan_engines(variant, opts, available, openvino, trt)
    out = {"model_path": path, "precision": opts.precision, **plan.describe()}
    if trt is not None:
        out["cache_key"] = "MODEL, VERSION, GPU: the file's sha256, TensorRT's version, the GPU's name"
    if plan.gpu and opts.cuda_graphs is not None:
        out["cuda_graphs"] = {"buckets": list(opts.cuda_graphs.buckets)}
    if not Path(path).is_file():
        out["model_file"] = "not on this machine: shapes assume the built-in model's input"
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m app.runtime", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("plan", help="print each variant's engine and providers as JSON")
    s.add_argument("config", help="a Serve config file (configs/local.yaml, configs/prod.yaml)")
    s.add_argument(
        "--available",
        help="comma-separated providers the node offers (ONNX Runtime names; OpenVINO for OpenVINO's runtime); "
        "default: what really loads on this machine",
    )
    s.add_argument("--gpu", action="store_true", help="plan for a replica that was granted a GPU")
    b = sub.add_parser("build-engines", help="build each GPU variant's TensorRT engines into the engine cache")
    b.add_argument("config", help="the Serve config the replicas run (configs/prod.yaml)")
    b.add_argument("--dry-run", action="store_true", help="print the cache directories it would fill; build nothing")
    ns = p.parse_args(argv)
    with open(ns.config) as f:
        cfg = yaml.safe_load(f)
    if ns.command == "build-engines":
        return build_engines(ns.config, cfg, ns.dry_run)
    if ns.available is None:
        available, openvino = usable_providers(), openvino_available()
    else:
        listed = [a.strip() for a in ns.available.split(",") if a.strip()]
        available, openvino = [a for a in listed if a != OPENVINO], OPENVINO in listed
    try:
        result = plan_config(cfg, available, openvino, ns.gpu, listed=ns.available is not None)
    except (PlanError, ValueError) as e:
        print(f"{ns.config}: {e}", file=sys.stderr)
        return 1
    print(json.dumps(result, indent=2))
    for planned in result["variants"].values():  # what each variant will run, one line each
        print(planned["serving"], file=sys.stderr)
    return 0


def build_engines(name: str, cfg: dict[str, Any], dry_run: bool) -> int:
    try:
        usable = [] if dry_run else check_tensorrt_here()
        builds = engine_builds(cfg)
        if dry_run:
            print(json.dumps({"dry_run": True, "builds": [b.describe() for b in builds]}, indent=2))
            return 0
        done = []
        for b in builds:
            print(f"build-engines: {b.cache_dir} ({', '.join(b.used_by)})", file=sys.stderr, flush=True)
            done.append(run_build(b, usable))
    except BuildRefused as e:
        print(e, file=sys.stderr)
        return 1
    except (ModelLoadError, PlanError, ValueError) as e:
        print(f"build-engines: {name}: {e}", file=sys.stderr)
        return 1
    print(json.dumps({"builds": done}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
