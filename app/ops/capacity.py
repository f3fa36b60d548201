"""python -m app.ops capacity CONFIG [--images DIR_OR_FILES] [--mix 640x480:0.7,1080p:0.3] [--engine-img-s N]
    [--gpu-decode-img-s N|SIZE:N,...] [--decode-ms MS|SIZE:MS,...] [--cores N] [--json PATH]

How many Preprocessor replicas (CPU cores) one GPU's Classifier engine needs for an image mix, with the images decoded
on the CPU (`decode_in: preprocessor`, or `router`: the same work in another process) and with `decode_in: gpu`.

What it measures here, with the app's own code and no Ray:
- one Preprocessor core: `preprocess` (`app.imaging.preprocess`) with the model's declared transform over the mix's
  images, CPU-ms per image (the process's CPU time: what a core spends, whatever else shares the machine);
- `decode_in: gpu`: per image only `check_header` on the CPU, plus the images the GPU path declines
  (`app.imaging.gpu_decode.cpu_reason`: not a JPEG, progressive, CMYK, ...), counted on the mix, which the CPU path
  decodes in full;
- the Classifier's engine at its max_batch_size, opened as a replica on this node opens it (`open_engine`) and
  measured as a replica measures itself at start (`start_report`), unless `--engine-img-s` gives it (a GPU node's
  gpu_check result when this node has no GPU).
The GPU's own JPEG decode cannot run without a GPU: its rate is given (`--gpu-decode-img-s`), and the GPU side of
`decode_in: gpu` is then min(engine, GPU decode), an upper bound (both share the GPU).

The arithmetic (`Cost`, `size_cpu_decode`, `size_gpu_decode`, `autoscaling_bounds`) is pure and measures nothing; the
measuring is `measure_cpu`, `measure_engine`. The images, unless `--images`: every bundled sample photograph
(scikit-image's data, matplotlib's grace_hopper) resized to each of the mix's sizes with OpenCV and JPEG-encoded at
quality 90, as the H200 node's decode figures were made (../shared/gpu-2026-12-04/decode_gpu.py).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from app.config import AppArgs, ClassifierConfig, classifier_deployment_name, validate_serve_config
from app.errors import ImageInputError
from app.imaging.gpu_decode import cpu_reason
from app.imaging.opencv import cv2
from app.imaging.preprocess import check_header, preprocess
from app.imaging.transform import Transform
from app.served_model.model_io import transform_of

DEFAULT_MIX = "640x480:0.7,1080p:0.3"
NAMED_SIZES = {"480p": (640, 480), "720p": (1280, 720), "1080p": (1920, 1080), "4k": (3840, 2160)}
JPEG_QUALITY = 90
# `app.imaging.nvimgcodec_decoder` preallocates for max_width x max_height (4096 each, its default): larger
# JPEGs take the CPU path.
GPU_MAX_PIXELS = 4096 * 4096
BUILTIN_INPUT = 224  # the built-in model's input side, assumed where the config's model file is not on this machine


class CapacityError(Exception):
    """The command cannot answer as asked; the message is the one line to print (exit status 1)."""


# --------------------------------------------------------------------------- the arithmetic (pure)


@dataclass(frozen=True)
class Part:
    """One kind of image in the mix and its share of the images."""

    name: str
    share: float
    width: int = 0  # 0: not one size (`--images`)
    height: int = 0


@dataclass(frozen=True)
class Cost:
    """What one image of a part costs a CPU core, and whether the GPU path would take it."""

    name: str
    share: float
    decode_ms: float  # `preprocess`: the header check, the decode and the declared transform
    header_ms: float  # `check_header` alone: all the CPU does for an image the GPU decodes
    declined: float = 0.0  # the part's share of images the GPU path sends to the CPU path


@dataclass(frozen=True)
class Sizing:
    """One decode_in for one set of images: what one GPU's Classifier takes and what it takes to feed it."""

    decode_in: str  # preprocessor | gpu
    images: str  # a part's name, or "mix"
    gpu_img_s: float  # what the Classifier's side takes: its engine, or min(engine, GPU decode)
    gpu_bound: str  # engine | gpu decode
    cpu_ms: float  # CPU-ms per image on the CPU side
    cores: float  # cores that keep the GPU side busy: gpu_img_s x cpu_ms / 1000
    replicas: int | None  # Preprocessor replicas of `cpus_per_replica` each; None for decode_in gpu (no Preprocessor)
    at_cores: float  # the cores the node has for this work
    img_s_at_cores: float  # what the node serves with them: min(GPU side, what the cores decode)
    bottleneck: str

    def describe(self) -> dict[str, Any]:
        return asdict(self)


def mix_share(costs: Sequence[Cost], value: Callable[[Cost], float]) -> float:
    """The mix's mean of `value` per image, weighted by share (the shares need not add up to 1)."""
    total = sum(c.share for c in costs)
    if total <= 0:
        raise ValueError("the mix's shares add up to nothing")
    return sum(c.share * value(c) for c in costs) / total


def gpu_decode_rate(costs: Sequence[Cost], rates: dict[str, float]) -> float | None:
    """What the GPU decoder takes of the mix, in img/s of the whole mix (the declined images cost it nothing): the
    inverse of its mean time per image. None: no rate given; inf: the GPU decodes none of the mix."""
    if not rates:
        return None
    seconds = mix_share(costs, lambda c: (1.0 - c.declined) / rates[c.name])
    return math.inf if seconds <= 0 else 1.0 / seconds


def _sizing(
    decode_in: str, images: str, gpu_img_s: float, gpu_bound: str, cpu_ms: float, cpus_per_replica: float, cores: float
) -> Sizing:
    needed = gpu_img_s * cpu_ms / 1000.0
    cpu_img_s = math.inf if cpu_ms <= 0 else cores * 1000.0 / cpu_ms
    if cpu_img_s < gpu_img_s:
        bottleneck = (
            "CPU: the Preprocessors" if decode_in == "preprocessor" else "CPU: header checks and declined images"
        )
    else:
        bottleneck = f"Classifier: {gpu_bound}"
    replicas = max(1, math.ceil(needed / cpus_per_replica - 1e-9)) if decode_in == "preprocessor" else None
    return Sizing(
        decode_in,
        images,
        round(gpu_img_s, 1),
        gpu_bound,
        round(cpu_ms, 3),
        round(needed, 2),
        replicas,
        cores,
        round(min(gpu_img_s, cpu_img_s), 1),
        bottleneck,
    )


def size_cpu_decode(
    engine_img_s: float, costs: Sequence[Cost], images: str, cpus_per_replica: float, cores: float
) -> Sizing:
    """decode_in preprocessor: every image decoded by a Preprocessor core, the GPU only classifies."""
    cpu_ms = mix_share(costs, lambda c: c.decode_ms)
    return _sizing("preprocessor", images, engine_img_s, "engine", cpu_ms, cpus_per_replica, cores)


def size_gpu_decode(
    engine_img_s: float, costs: Sequence[Cost], images: str, gpu_decode_img_s: dict[str, float], cores: float
) -> Sizing:
    """decode_in gpu: the CPU checks each header and decodes only what the GPU path declines; the GPU decodes and
    classifies the rest, at min(engine, GPU decode)."""
    cpu_ms = mix_share(costs, lambda c: c.header_ms + c.declined * c.decode_ms)
    decode = gpu_decode_rate(costs, gpu_decode_img_s)
    if decode is not None and decode < engine_img_s:
        gpu_img_s, bound = decode, "gpu decode"
    else:
        gpu_img_s, bound = engine_img_s, "engine"
    return _sizing("gpu", images, gpu_img_s, bound, cpu_ms, 1.0, cores)


def size_all(
    engine_img_s: float,
    costs: Sequence[Cost],
    gpu_decode_img_s: dict[str, float],
    cpus_per_replica: float,
    cores: float,
) -> list[Sizing]:
    """Each decode_in, for each part alone and (with more than one part) for the mix."""
    sets = [(c.name, [Cost(c.name, 1.0, c.decode_ms, c.header_ms, c.declined)]) for c in costs]
    if len(costs) > 1:
        sets.append(("mix", list(costs)))
    out = [size_cpu_decode(engine_img_s, s, name, cpus_per_replica, cores) for name, s in sets]
    return out + [size_gpu_decode(engine_img_s, s, name, gpu_decode_img_s, cores) for name, s in sets]


@dataclass(frozen=True)
class GpuFootprint:
    """The GPUs the config's Classifiers hold at their autoscaling minimum and maximum (num_gpus x replicas)."""

    min_gpus: float
    max_gpus: float


def classifier_gpus(cfg: dict[str, Any], args: AppArgs) -> GpuFootprint:
    """Summed over the variants' Classifier deployments; a deployment without autoscaling holds num_replicas."""
    low = high = 0.0
    for variant in args.variants:
        d = _deployment(cfg, classifier_deployment_name(variant))
        gpus = float((d.get("ray_actor_options") or {}).get("num_gpus", 0) or 0)
        scaling = d.get("autoscaling_config") or {}
        fixed = d.get("num_replicas", 1)
        fixed = fixed if isinstance(fixed, int) else 1  # "auto": autoscaling_config says
        low += gpus * int(scaling.get("min_replicas", fixed))
        high += gpus * int(scaling.get("max_replicas", fixed))
    return GpuFootprint(low, high)


def autoscaling_bounds(mix: Sizing, gpus: GpuFootprint, cpus_per_replica: float) -> dict[str, Any] | None:
    """Preprocessor min/max replicas that feed the Classifiers' GPUs at their minimum and at their maximum (`mix`:
    decode_in preprocessor, one GPU); None when they hold no GPU. A GPU counts as one engine at its full rate: two
    replicas sharing one GPU share its rate. The exact need is scaled, then rounded up once."""
    if mix.decode_in != "preprocessor" or gpus.max_gpus <= 0:
        return None
    per_gpu = mix.cores / cpus_per_replica
    return {
        "images": mix.images,
        "min_replicas": max(1, math.ceil(per_gpu * gpus.min_gpus - 1e-9)),
        "max_replicas": max(1, math.ceil(per_gpu * gpus.max_gpus - 1e-9)),
    }


# --------------------------------------------------------------------------- parsing the command line


def parse_size(text: str) -> tuple[int, int]:
    """ "640x480" or a name (1080p, 720p, 480p, 4k) -> (width, height)."""
    key = text.strip().lower()
    if key in NAMED_SIZES:
        return NAMED_SIZES[key]
    m = re.fullmatch(r"(\d+)x(\d+)", key)
    if m is None or int(m[1]) <= 0 or int(m[2]) <= 0:
        raise CapacityError(f"{text!r} is not a size: WIDTHxHEIGHT (640x480) or one of {', '.join(NAMED_SIZES)}")
    return int(m[1]), int(m[2])


def parse_mix(text: str) -> list[Part]:
    """ "640x480:0.7,1080p:0.3" -> the parts, shares as given (they are weights: need not add up to 1)."""
    parts: list[Part] = []
    for item in (s.strip() for s in text.split(",") if s.strip()):
        size, _, share = item.partition(":")
        try:
            weight = float(share) if share else 1.0
        except ValueError:
            raise CapacityError(f"--mix: {item!r}: the share after ':' must be a number") from None
        if weight <= 0:
            raise CapacityError(f"--mix: {item!r}: a share must be positive")
        w, h = parse_size(size)
        parts.append(Part(size.strip(), weight, w, h))
    if not parts:
        raise CapacityError("--mix names no image size")
    if len({(p.width, p.height) for p in parts}) < len(parts):
        raise CapacityError(f"--mix names a size twice: {text}")
    return parts


def per_part(text: str | None, parts: Sequence[Part], flag: str) -> dict[str, float]:
    """A number for every part: "N" for all, or "SIZE:N,..." naming each part's size; {} when not given."""
    if text is None:
        return {}
    try:
        one = float(text)
    except ValueError:
        pass
    else:
        if one <= 0:
            raise CapacityError(f"{flag}: must be positive, got {text}")
        return {p.name: one for p in parts}
    given: dict[tuple[int, int], float] = {}
    for item in (s.strip() for s in text.split(",") if s.strip()):
        size, _, value = item.partition(":")
        try:
            given[parse_size(size)] = float(value)
        except ValueError:
            raise CapacityError(f"{flag}: {item!r}: want SIZE:NUMBER") from None
    out = {}
    for p in parts:
        if (p.width, p.height) not in given:
            raise CapacityError(f"{flag}: no figure for {p.name} (give one number for all, or SIZE:N for each)")
        if given[(p.width, p.height)] <= 0:
            raise CapacityError(f"{flag}: {p.name}: must be positive")
        out[p.name] = given[(p.width, p.height)]
    return out


# --------------------------------------------------------------------------- the images


def sample_jpegs(width: int, height: int) -> list[bytes]:
    """Every bundled sample photograph resized to width x height, JPEG quality 90."""
    from app.toolchain.samples import available_photos, sample_bytes

    out = []
    for name in available_photos():
        img = cv2.imdecode(np.frombuffer(sample_bytes(name), np.uint8), cv2.IMREAD_COLOR)
        if img is None:
            continue
        resized = cv2.resize(img, (width, height), interpolation=cv2.INTER_CUBIC)
        ok, buf = cv2.imencode(".jpg", resized, [cv2.IMWRITE_JPEG_QUALITY, JPEG_QUALITY])
        if ok:
            out.append(buf.tobytes())
    if not out:
        raise CapacityError("no sample photograph is installed here (scikit-image, matplotlib): pass --images")
    return out


def read_images(paths: Sequence[str]) -> list[bytes]:
    """The files named, and the files directly inside the folders named, in name order."""
    files: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            files += sorted(f for f in p.iterdir() if f.is_file())
        elif p.is_file():
            files.append(p)
        else:
            raise CapacityError(f"--images: {p} is neither a file nor a folder")
    if not files:
        raise CapacityError("--images: no files found")
    return [f.read_bytes() for f in files]


# --------------------------------------------------------------------------- measuring


def cpu_ms_per_image(work: Callable[[bytes], object], images: Sequence[bytes], seconds: float) -> float:
    """The median over passes of the process's CPU time per image (one untimed pass first; at least three passes and
    `seconds` of CPU in all)."""
    for data in images:
        work(data)
    passes: list[float] = []
    while len(passes) < 3 or sum(passes) < seconds:
        t0 = time.process_time()
        for data in images:
            work(data)
        passes.append(time.process_time() - t0)
    return statistics.median(passes) * 1000.0 / len(images)


@dataclass
class Measured:
    """One part's images and what the CPU measured on them."""

    cost: Cost
    images: int
    mean_bytes: int
    refused: int = 0  # images preprocess refuses (left out of the timing)
    reasons: dict[str, int] = field(default_factory=dict)  # why the GPU path declines, counted

    def describe(self) -> dict[str, Any]:
        return {
            **asdict(self.cost),
            "images": self.images,
            "mean_bytes": self.mean_bytes,
            "refused": self.refused,
            "declined_why": self.reasons,
        }


def measure_cpu(
    part: Part,
    images: Sequence[bytes],
    transform: Transform,
    args: AppArgs,
    seconds: float,
    decode_ms: float | None = None,
    header_ms: float | None = None,
) -> Measured:
    """One part: the CPU-ms of `preprocess` and of `check_header` per image (unless given) and the GPU path's
    declines, with the config's limits."""
    limits = args.limits
    target = transform.decode_target
    ok: list[bytes] = []
    reasons: Counter[str] = Counter()
    for data in images:
        try:
            info, _ = check_header(data, limits.max_pixels, target, limits.max_decode_bytes)
            preprocess(data, transform, limits.max_pixels, True, limits.max_decode_bytes)
        except ImageInputError:
            continue
        ok.append(data)
        why = cpu_reason(info, GPU_MAX_PIXELS)
        if why:
            reasons[why] += 1
    if not ok:
        raise CapacityError(f"{part.name}: preprocess refuses every image")

    def decode(data: bytes) -> object:
        return preprocess(data, transform, limits.max_pixels, True, limits.max_decode_bytes)

    def header(data: bytes) -> object:
        return check_header(data, limits.max_pixels, target, limits.max_decode_bytes)

    d_ms = decode_ms if decode_ms is not None else cpu_ms_per_image(decode, ok, seconds)
    h_ms = header_ms if header_ms is not None else cpu_ms_per_image(header, ok, min(seconds, 0.2))
    declined = sum(reasons.values()) / len(ok)
    cost = Cost(part.name, part.share, round(d_ms, 4), round(h_ms, 4), round(declined, 4))
    mean = int(sum(len(b) for b in ok) / len(ok))
    return Measured(cost, len(ok), mean, len(images) - len(ok), dict(reasons))


@dataclass(frozen=True)
class EngineRate:
    img_s: float
    batch: int | None
    source: str


def _deployment(cfg: dict[str, Any], name: str) -> dict[str, Any]:
    app = cfg["applications"][0]
    return next((d for d in app.get("deployments") or [] if d.get("name") == name), {})


def classifier_batch(cfg: dict[str, Any], args: AppArgs, variant: str) -> int:
    """The variant's max_batch_size as its replicas run it (clamped to the TensorRT profile, as a replica clamps it)."""
    d = _deployment(cfg, classifier_deployment_name(variant))
    batch = ClassifierConfig.model_validate(d.get("user_config") or {}).max_batch_size
    return min(batch, args.tensorrt.max_batch_size) if args.may_use_tensorrt(variant) else batch


def measure_engine(cfg: dict[str, Any], args: AppArgs, variant: str) -> EngineRate:
    """The variant's engine as a replica on this node opens it, measured as the replica measures itself at start."""
    # ONNX Runtime (and OpenVINO) load only when the engine is measured here, not for given figures.
    from app.runtime import Build, ModelLoadError, PlanError, open_engine
    from app.runtime.ort_engine import usable_providers
    from app.runtime.plan import CUDA, TENSORRT
    from app.runtime.prebuild import replica_threads_streams, served_path
    from app.runtime.startup import start_report
    from app.runtime.variants import fallback_options, runtime_options
    from app.served_model.model_io import model_io

    gpu = bool({CUDA, TENSORRT} & set(usable_providers()))
    threads, streams = replica_threads_streams(cfg, args, variant)
    batch = classifier_batch(cfg, args, variant)
    try:
        opts = runtime_options(args, variant, gpu, threads, streams)
        declared = fallback_options(args, variant, gpu, threads, streams)
        fallback = None
        if declared is not None:
            fb_path, fb_opts = declared
            if fb_path.is_file():
                fb_path = model_io(args.model, fb_path, f"variants.{variant}.fallback.model_path").served.path
            fallback = Build(str(fb_path), fb_opts)
        opened = open_engine(variant, served_path(args, variant), opts, batch, fallback)
        try:
            opened.engine.prepare(batch)
            report = start_report(opened, batch, streams)
        finally:
            opened.engine.close()
    except (ModelLoadError, PlanError, ValueError, OSError) as e:
        raise CapacityError(
            f"variants.{variant}: its engine cannot be measured here ({e}); give a GPU node's figure, "
            "e.g. --engine-img-s 8777 (an H200's FP32 engine at batch 64: docs/performance.md, "
            '"Sizing Preprocessors to a GPU")'
        ) from e
    t = report.measured[f"batch_{batch}"]
    where = "GPU" if gpu else "CPU"
    return EngineRate(
        t.img_per_s,
        batch,
        f"measured here: {report.engine} on this machine's {where}, batch {batch} x {t.parallel} in parallel",
    )


def config_transform(args: AppArgs) -> tuple[Transform, str]:
    """The model's declared transform from its file on this machine; else the declaration at the built-in input."""
    t = transform_of(args.model, args.model_files())
    if t is not None:
        return t, "the model file's input and the declaration (args.model.preprocess)"
    p = args.model.preprocess
    t = Transform(BUILTIN_INPUT, BUILTIN_INPUT, 3, p.resize_shorter, p.interpolation, p.color)
    return t, f"the declaration at the built-in model's {BUILTIN_INPUT}x{BUILTIN_INPUT} input: no model file here"


def this_machine() -> dict[str, Any]:
    cpuinfo = Path("/proc/cpuinfo")
    found = re.search(r"^model name\s*:\s*(.+)$", cpuinfo.read_text(), re.M) if cpuinfo.is_file() else None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return {
        "time_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "cpu_model": found[1].strip() if found else "unknown",
        "usable_cpus": cores,
        "load_average_1_5_15": [round(x, 2) for x in os.getloadavg()],
    }


# --------------------------------------------------------------------------- the command


def capacity(ns: argparse.Namespace) -> dict[str, Any]:
    """The whole answer as JSON-able data (what `--json` writes)."""
    with open(ns.config) as f:
        cfg = yaml.safe_load(f)
    try:
        args = validate_serve_config(cfg)
    except ValueError as e:
        raise CapacityError(f"{ns.config}: {e}") from e
    variant = ns.variant or next(iter(args.variants))
    if variant not in args.variants:
        raise CapacityError(f"--variant {variant}: the config's variants are {', '.join(args.variants)}")
    transform, transform_source = config_transform(args)
    machine = this_machine()

    if ns.images:
        if ns.mix is not None:
            raise CapacityError("--images and --mix: give one (the files are the mix, each one image)")
        parts = [Part("images", 1.0)]
        images = {"images": read_images(ns.images)}
    else:
        parts = parse_mix(ns.mix or DEFAULT_MIX)
        images = {p.name: sample_jpegs(p.width, p.height) for p in parts}
    decode_ms = per_part(ns.decode_ms, parts, "--decode-ms")
    gpu_decode = per_part(ns.gpu_decode_img_s, parts, "--gpu-decode-img-s")
    measured = [
        measure_cpu(p, images[p.name], transform, args, ns.seconds, decode_ms.get(p.name), ns.header_ms) for p in parts
    ]
    costs = [m.cost for m in measured]

    if ns.engine_img_s is not None:
        engine = EngineRate(ns.engine_img_s, None, "given (--engine-img-s)")
    else:
        engine = measure_engine(cfg, args, variant)
    pre = _deployment(cfg, "Preprocessor")
    cpus_per_replica = float((pre.get("ray_actor_options") or {}).get("num_cpus", 1.0) or 1.0)
    cores = float(ns.cores) if ns.cores is not None else float(machine["usable_cpus"])
    rows = size_all(engine.img_s, costs, gpu_decode, cpus_per_replica, cores)
    mix_name = "mix" if len(parts) > 1 else parts[0].name
    mix_row = next(r for r in rows if r.decode_in == "preprocessor" and r.images == mix_name)
    gpus = classifier_gpus(cfg, args)
    cpu_source = "given (--decode-ms)" if decode_ms else f"measured on this machine ({machine['cpu_model']}, one core)"
    return {
        "command": "python -m app.ops capacity " + " ".join(ns.argv),
        "config": ns.config,
        "variant": variant,
        "machine": machine,
        "transform": {**transform.to_dict(), "source": transform_source},
        "engine": asdict(engine),
        "gpu_decode_img_s": {"rates": gpu_decode, "source": "given (--gpu-decode-img-s)" if gpu_decode else None},
        "cpu": {
            "decode_ms_source": cpu_source,
            "header_ms_source": "given (--header-ms)" if ns.header_ms is not None else "measured on this machine",
            "preprocessor_cpus_per_replica": cpus_per_replica,
            "cores": cores,
            "cores_source": "given (--cores)" if ns.cores is not None else "this machine's usable cores",
            "parts": [m.describe() for m in measured],
        },
        "rows": [r.describe() for r in rows],
        "classifier_gpus": asdict(gpus),
        "preprocessor_autoscaling": autoscaling_bounds(mix_row, gpus, cpus_per_replica),
    }


def render(result: dict[str, Any]) -> str:
    """The answer as a table with what each figure came from."""
    e, cpu = result["engine"], result["cpu"]
    gd = result["gpu_decode_img_s"]
    lines = [
        f"{result['config']}, variant {result['variant']}; transform from {result['transform']['source']}",
        f"engine: {e['img_s']:,.1f} img/s, {e['source']}",
        f"GPU decode: {', '.join(f'{k} {v:,.0f} img/s' for k, v in gd['rates'].items()) or 'not given'}"
        + (f", {gd['source']}" if gd["source"] else " (decode_in gpu then counts the engine alone)"),
        f"CPU-ms per image: decode {cpu['decode_ms_source']}, header check {cpu['header_ms_source']}; "
        f"cores: {cpu['cores']:g}, {cpu['cores_source']}",
        "",
        "| decode_in | images | Classifier takes img/s (bound) | CPU-ms/img | to feed it | at "
        f"{cpu['cores']:g} cores: img/s | bottleneck |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        feed = (
            f"{r['replicas']} Preprocessor replicas ({r['cores']:.2f} cores)"
            if r["replicas"] is not None
            else f"{r['cores']:.2f} cores in the Classifier"
        )
        lines.append(
            f"| {r['decode_in']} | {r['images']} | {r['gpu_img_s']:,.0f} ({r['gpu_bound']}) | {r['cpu_ms']:.3f} | "
            f"{feed} | {r['img_s_at_cores']:,.0f} | {r['bottleneck']} |"
        )
    lines.append("")
    for p in cpu["parts"]:
        why = ", ".join(f"{n} {k}" for k, n in p["declined_why"].items()) or "none"
        lines.append(
            f"{p['name']}: {p['images']} images, {p['mean_bytes']:,} bytes mean, decode {p['decode_ms']} ms, "
            f"header {p['header_ms']} ms, declined by the GPU path: {p['declined']:.0%} ({why})"
            + (f", {p['refused']} refused" if p["refused"] else "")
        )
    g, bounds = result["classifier_gpus"], result["preprocessor_autoscaling"]
    if bounds is not None:
        lines.append(
            f"Preprocessor autoscaling (decode_in preprocessor, {bounds['images']}): min_replicas "
            f"{bounds['min_replicas']} to feed the Classifiers' GPUs at their min_replicas ({g['min_gpus']:g} GPU), "
            f"max_replicas {bounds['max_replicas']} at their max_replicas ({g['max_gpus']:g} GPU)"
        )
    lines.append(
        "With decode_in gpu the CPU work is the Classifier replica's (header checks, declined images); the GPU side "
        "is min(engine, GPU decode), an upper bound: both share the GPU."
    )
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m app.ops capacity", description=__doc__.split("\n\n")[1])
    p.add_argument("config", help="a Serve config file (configs/prod.yaml, configs/local.yaml)")
    p.add_argument("--images", nargs="+", metavar="DIR_OR_FILE", help="measure these images (each one of the mix)")
    p.add_argument("--mix", help=f"sizes and shares of generated JPEGs (default {DEFAULT_MIX})")
    p.add_argument("--variant", help="the Classifier variant whose engine is measured (default: the config's first)")
    p.add_argument(
        "--engine-img-s", type=float, help="the engine's img/s at its max_batch_size (default: measured here)"
    )
    p.add_argument(
        "--gpu-decode-img-s",
        help="the GPU's JPEG decode + resize rate, one number or SIZE:N,... (H200: 640x480:13820,1080p:4280)",
    )
    p.add_argument("--decode-ms", help="CPU-ms per image of preprocess on the target's core, one number or SIZE:MS,...")
    p.add_argument("--header-ms", type=float, help="CPU-ms per image of the header check (default: measured here)")
    p.add_argument("--cores", type=float, help="cores the node gives this CPU work (default: this machine's)")
    p.add_argument("--seconds", type=float, default=1.0, help="CPU seconds per measurement, at least (default 1)")
    p.add_argument("--json", metavar="PATH", help="also write the answer as JSON")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ns = parser().parse_args(argv)
    ns.argv = argv
    try:
        result = capacity(ns)
    except CapacityError as e:
        print(f"capacity: {e}", file=sys.stderr)
        return 1
    print(render(result))
    if ns.json:
        Path(ns.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0
