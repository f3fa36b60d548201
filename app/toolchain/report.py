"""What a build of the FP32 model (INT8 or FP16) costs in accuracy and buys in speed, measured on this machine.

One report per build, for any model, served as its declaration says (`app.served_model.declaration`). A cpu build
is judged through ONNX Runtime's fused CPU kernels (what serves it) and timed against FP32; a TensorRT build
(symmetric S8S8, app.toolchain.quantize target tensorrt) is judged with Q/DQ computed as written, which is
TensorRT's arithmetic; its speed belongs to TensorRT on a GPU, not here. An FP16 build (app.toolchain.fp16) is judged
on the CUDA EP's FP16 kernels where that provider is usable here, else on the CPU EP. That one has only float
kernels for most ops: its InsertCastTransformer casts the FP16 graph onto them, folds the Casts of the weights into
FP32 copies and drops the Cast pairs between two float kernels (ORT 1.31: the session's optimised graph, written by
SessionOptions.optimized_model_filepath, shows it), so it computes FP32 arithmetic on FP16-rounded weights, with
the activations in FP32. That judges the weights' rounding, not the GPU's FP16 activations and accumulation, and
the report says which of the two judged it (`evaluated_as`). An FP16 build's speed belongs to a GPU.
"""

from __future__ import annotations

import json
import os
import platform
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from app.runtime import CPU, CUDA, OrtEngine, RuntimeOptions, cpu_engine, onnxruntime_engine, usable_providers
from app.runtime.plan import cpu_choice
from app.served_model import Target
from app.served_model.declaration import ModelDeclaration
from app.served_model.graph import read_graph
from app.served_model.model_io import Preparation
from app.served_model.outputs import probabilities
from app.served_model.prologue import served_model
from app.served_model.u8s8 import pair_problems
from app.toolchain.calibration import sample_directory
from app.toolchain.fp16 import clamped, float32_ops
from app.toolchain.samples import EVAL_PHOTOS, available_photos, sample_bytes

BATCH_SIZES = (1, 8, 16, 32)
QDQ_OPS = {"QuantizeLinear", "DequantizeLinear"}
# Ops that move or reshape data: "stayed FP32" is only interesting for ops that compute.
PLUMBING_OPS = {"Cast", "Transpose", "Flatten", "Reshape", "Shape", "Identity", "Squeeze", "Unsqueeze"}
# ONNX Runtime session config key (onnxruntime_session_options_config_keys.h): keep every
# QuantizeLinear/DequantizeLinear a node of its own instead of fusing Q/DQ groups into ORT's integer kernels.
DISABLE_QDQ_FUSION = "session.disable_quant_qdq"


@dataclass(frozen=True)
class EvalImage:
    name: str
    data: bytes
    label: int | None


def graph_summary(path: Path) -> dict[str, Any]:
    """An FP32 model or an INT8 build: its size, its Q/DQ, what computes in FP32 and what can overflow U8S8."""
    model = onnx.load(str(path))
    nodes = model.graph.node
    dq_outputs = {o for n in nodes if n.op_type == "DequantizeLinear" for o in n.output}
    counts = Counter(n.op_type for n in nodes)
    fp32_ops = Counter(
        n.op_type
        for n in nodes
        if n.op_type not in QDQ_OPS | PLUMBING_OPS and not any(i in dq_outputs for i in n.input)
    )
    return {
        "file": str(path),
        "bytes": path.stat().st_size,
        "nodes": len(nodes),
        "quantize_linear": counts.get("QuantizeLinear", 0),
        "dequantize_linear": counts.get("DequantizeLinear", 0),
        "fp32_op_types": dict(sorted(fp32_ops.items())),
        # Layers whose int8 weight pairs can overflow ONNX Runtime's U8S8 kernels on x86 without VNNI.
        "u8s8_overflow_layers": len(pair_problems(model)),
    }


def fp16_summary(fp32: Path, path: Path) -> dict[str, Any]:
    """An FP16 build: its size, its FP16 weights, the op types it computes in FP32, and the weights of `fp32` that
    FP16 cannot hold as they are (app.toolchain.fp16.Clamped)."""
    model = onnx.load(str(path))
    half = sum(int(np.prod(t.dims)) for t in model.graph.initializer if t.data_type == onnx.TensorProto.FLOAT16)
    return {
        "file": str(path),
        "bytes": path.stat().st_size,
        "nodes": len(model.graph.node),
        "float16_weights": half,
        "fp32_op_types": dict(sorted(float32_ops(model).items())),
        "clamped_weights": clamped(onnx.load(str(fp32)), model).to_dict(),
    }


def resolve_label(name: str | None, labels: Sequence[str]) -> int | None:
    """A class folder named by ImageNet id ('285') or by label ('Egyptian cat', any case)."""
    if name is None:
        return None
    if name.isdigit():
        return int(name)
    wanted = name.replace("_", " ").lower()
    return next((i for i, lab in enumerate(labels) if lab.lower() == wanted), None)


def eval_images(eval_dir: Path | None, labels: Sequence[str], limit: int = 1000) -> list[EvalImage]:
    """`eval_dir`'s images (class folders named by id or label give accuracy), else the sample photographs (their
    ImageNet classes count only for a model with 1000 classes)."""
    if eval_dir is None:
        imagenet = len(labels) == 1000
        return [
            EvalImage(n, sample_bytes(n), EVAL_PHOTOS.get(n) if imagenet else None)
            for n in EVAL_PHOTOS
            if n in available_photos()
        ]
    picked = sample_directory(eval_dir, limit)
    return [EvalImage(str(p.path), p.path.read_bytes(), resolve_label(p.label, labels)) for p in picked]


def compare(
    fp32_scores: np.ndarray,
    build_scores: np.ndarray,
    labels: Sequence[int | None],
    output: str = "logits",
    precision: str = "int8",
) -> dict[str, Any]:
    """How far the build's answers are from FP32's: `output` says whether the rows are logits or probabilities;
    `precision` names the build's accuracy key."""
    p = probabilities(fp32_scores.astype(np.float64), output)
    q = probabilities(build_scores.astype(np.float64), output)
    top5_p, top5_q = np.argsort(-p, 1)[:, :5], np.argsort(-q, 1)[:, :5]
    kl = np.sum(p * (np.log(p + 1e-12) - np.log(q + 1e-12)), axis=1)
    out: dict[str, Any] = {
        "images": len(p),
        "top1_agreement": float(np.mean(p.argmax(1) == q.argmax(1))) if len(p) else 0.0,
        "top1_agree_count": int(np.sum(p.argmax(1) == q.argmax(1))),
        "top5_overlap": float(np.mean([len(set(a) & set(b)) / 5 for a, b in zip(top5_p, top5_q, strict=True)]))
        if len(p)
        else 0.0,
        "mean_kl_divergence": float(kl.mean()) if len(p) else 0.0,
        "mean_abs_top1_prob_delta": float(np.mean(np.abs(p.max(1) - q.max(1)))) if len(p) else 0.0,
        # In the model's own output (logits or probabilities): an FP16 build's top-1 rarely moves, this does.
        "max_abs_score_delta": float(np.max(np.abs(fp32_scores.astype(np.float64) - build_scores))) if len(p) else 0.0,
    }
    known = [i for i, y in enumerate(labels) if y is not None]
    if known:
        y = np.array([labels[i] for i in known])
        out["labelled_images"] = len(known)
        out["fp32_top1_accuracy"] = float(np.mean(p[known].argmax(1) == y))
        out[f"{precision}_top1_accuracy"] = float(np.mean(q[known].argmax(1) == y))
    return out


def qdq_as_written(path: Path, opts: RuntimeOptions) -> OrtEngine:
    """The CPU EP computing a QDQ graph as written: each Q/DQ rounds and clamps, the layers between run in FP32.

    That is the arithmetic of TensorRT's explicit quantization (its INT8 kernels accumulate in INT32: the
    same values up to summation order), so it tells what the TensorRT artifact computes without a GPU.
    ORT's own fused CPU kernels do not: on x86 CPUs without VNNI (AVX2, AVX-512 before Cascade Lake)
    VPMADDUBSW saturates their 16-bit pair sums (oneDNN "Nuances of int8 computations"; onnxruntime
    PR #12088), far more often with sign-flipped S8 activations than with ReLU-range U8 ones. The report
    shows that path's agreement separately.
    """
    return OrtEngine(path, opts, cpu_choice({DISABLE_QDQ_FUSION: "1"}))


def time_batches(runner: OrtEngine, batch_sizes: Sequence[int], budget_s: float = 1.5) -> list[dict[str, Any]]:
    rows = []
    for n in batch_sizes:
        x = runner.dummy_batch(n)
        for _ in range(2):  # warm-up: first runs allocate and pick kernels
            runner.logits(x)
        times: list[float] = []
        deadline = time.perf_counter() + budget_s
        while len(times) < 5 or (time.perf_counter() < deadline and len(times) < 200):
            t0 = time.perf_counter()
            runner.logits(x)
            times.append(time.perf_counter() - t0)
        ms = np.array(times) * 1000
        rows.append(
            {
                "batch": n,
                "runs": len(times),
                "p50_ms": float(np.percentile(ms, 50)),
                "p99_ms": float(np.percentile(ms, 99)),
                "images_per_s": float(n / np.median(times)),
            }
        )
    return rows


# What a build is judged by, per target: the path that serves it, and for INT8 the other one beside it.
EVALUATED_AS = {
    "cpu": f"{CPU}, fused QDQ kernels (what a CPU replica runs)",
    "tensorrt": f"{CPU}, {DISABLE_QDQ_FUSION}=1 (Q/DQ computed as written, as TensorRT computes it)",
    "fp16-cuda": f"{CUDA}, its FP16 kernels (what a GPU replica without TensorRT runs)",
    "fp16-cpu": f"{CPU} (no usable {CUDA} here): FP32 arithmetic on the FP16-rounded weights, activations in FP32 "
    "(ORT's CPU EP casts the graph onto its float kernels), not the GPU's FP16 kernels",
}
OTHER_PATH = {
    "cpu": "Q/DQ computed as written (no fused kernels)",
    "tensorrt": "ORT's fused S8S8 CPU kernels",
}


@dataclass(frozen=True)
class Judge:
    """The engine a build is judged on, in words, and for INT8 the other path beside it."""

    engine: OrtEngine
    evaluated_as: str
    other: OrtEngine | None = None

    def other_path(self, target: Target, fp32_top1: np.ndarray, x: np.ndarray) -> tuple[dict[str, Any] | None, Any]:
        """The other path's entry in the report and its top-1 per image (None without one)."""
        if self.other is None:
            return None, None
        top1 = self.other.logits(x).argmax(1)
        return {"name": OTHER_PATH[target], "top1_agree_count": int(np.sum(fp32_top1 == top1))}, top1


def judge(target: Target, served: Path, opts: RuntimeOptions) -> Judge:
    """What judges the build at `served` for `target`: the kernels that will serve it, where this machine has them."""
    if target == "fp16":
        return fp16_judge(served, opts)
    fused, written = cpu_engine(str(served), opts), qdq_as_written(served, opts)
    if target == "cpu":
        return Judge(fused, EVALUATED_AS["cpu"], written)
    return Judge(written, EVALUATED_AS[target], fused)


def fp16_judge(served: Path, opts: RuntimeOptions) -> Judge:
    """The CUDA EP's FP16 kernels when that provider is usable here (and takes the graph), else the CPU EP."""
    if CUDA in usable_providers():
        engine = onnxruntime_engine(str(served), replace(opts, prefer_gpu=True))
        if engine.active_provider == CUDA:
            return Judge(engine, EVALUATED_AS["fp16-cuda"])
    return Judge(cpu_engine(str(served), opts), EVALUATED_AS["fp16-cpu"])


def build_report(
    fp32: Path,
    build: Path,
    model: ModelDeclaration,
    target: Target = "cpu",
    calibration: Sequence[bytes] = (),
    eval_dir: Path | None = None,
    threads: int | None = None,
    batch_sizes: Sequence[int] = BATCH_SIZES,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """FP32 against its build, both served as `model` declares (the prologue folded in, pixels prepared by
    the Preprocessor's own function): agreement on the evaluation set and on the calibration images, and for
    the cpu target the speed of both on this machine's CPU EP (a TensorRT or FP16 build's speed belongs to a GPU).
    The build's keys are its precision's: "int8", or "fp16" for the fp16 target (`precision` says which)."""
    threads = threads or (os.cpu_count() or 1)
    opts = RuntimeOptions(threads=threads, prefer_gpu=False)
    name = precision_of_target(target)
    served = {k: served_model(p, model.preprocess).path for k, p in (("fp32", fp32), (name, build))}
    prepare = Preparation(model, read_graph(fp32))
    labels = model.labels(prepare.graph.classes)
    fp32_engine, judged = cpu_engine(str(served["fp32"]), opts), judge(target, served[name], opts)
    images = eval_images(eval_dir, labels)
    x = prepare.pixels([im.data for im in images])
    scores = {"fp32": fp32_engine.logits(x), name: judged.engine.logits(x)}
    probs = {k: probabilities(v.astype(np.float64), model.output) for k, v in scores.items()}
    other, other_top1 = judged.other_path(target, probs["fp32"].argmax(1), x)
    per_image = [
        {
            "image": im.name,
            "label": im.label,
            **{f"{k}_top1": int(probs[k][i].argmax()) for k in ("fp32", name)},
            **{f"{k}_top1_label": labels[int(probs[k][i].argmax())] for k in ("fp32", name)},
            **{f"{k}_top1_prob": float(probs[k][i].max()) for k in ("fp32", name)},
            **({"other_path_top1": int(other_top1[i])} if other_top1 is not None else {}),
        }
        for i, im in enumerate(images)
    ]
    summary = fp16_summary(fp32, build) if name == "fp16" else graph_summary(build)
    report: dict[str, Any] = {
        "machine": {"platform": platform.platform(), "processor": platform.processor(), "cpus": os.cpu_count()},
        "threads": threads,
        "provider": fp32_engine.active_provider,
        "model": model.model_dump(),
        "target": target,
        "precision": name,
        "evaluated_as": judged.evaluated_as,
        "eval_set": str(eval_dir) if eval_dir else "sample photographs (scikit-image, matplotlib)",
        "models": {"fp32": graph_summary(fp32), name: summary},
        "quality": compare(scores["fp32"], scores[name], [im.label for im in images], model.output, name),
        **({"other_path": other} if other is not None else {}),
        "per_image": per_image,
    }
    if calibration:
        xc = prepare.pixels(calibration)
        report["calibration_quality"] = compare(
            fp32_engine.logits(xc), judged.engine.logits(xc), [None] * len(calibration), model.output, name
        )
    if target == "cpu":
        speed = {"fp32": time_batches(fp32_engine, batch_sizes), "int8": time_batches(judged.engine, batch_sizes)}
        report["latency"] = speed
        report["int8_speedup_by_batch"] = {
            str(a["batch"]): a["p50_ms"] / b["p50_ms"] for a, b in zip(speed["fp32"], speed["int8"], strict=True)
        }
    return report | (extra or {})


def precision_of_target(target: Target) -> str:
    """The build's precision for a target: "fp16" for fp16, "int8" for the quantization targets."""
    return "fp16" if target == "fp16" else "int8"


def to_markdown(r: dict[str, Any]) -> str:
    m, q = r["models"], r["quality"]
    name, p = r["model"]["name"], r.get("precision", "int8")
    big = p.upper()
    lines = [
        f"{name}: {Path(m['fp32']['file']).name} against its {big} build {Path(m[p]['file']).name} "
        f"(target {r['target']})",
        "",
        f"| | FP32 | {big} |",
        "|---|---|---|",
        f"| file size | {m['fp32']['bytes'] / 1e6:.1f} MB | {m[p]['bytes'] / 1e6:.1f} MB |",
        *(_fp16_rows(m[p]) if p == "fp16" else _int8_rows(m[p])),
        "",
        f"Evaluation on {q['images']} images ({r['eval_set']}), {big} on {r['evaluated_as']}:",
        "",
        "| metric | value |",
        "|---|---|",
        f"| top-1 agreement {big} vs FP32 | {q['top1_agreement']:.3f} ({q['top1_agree_count']}/{q['images']}) |",
    ]
    if "other_path" in r:
        lines.append(
            f"| top-1 agreement, {r['other_path']['name']} | {r['other_path']['top1_agree_count']}/{q['images']} |"
        )
    lines += [
        f"| top-5 overlap | {q['top5_overlap']:.3f} |",
        f"| mean KL(FP32 ‖ {big}) | {q['mean_kl_divergence']:.4f} |",
        f"| mean abs top-1 probability delta | {q['mean_abs_top1_prob_delta']:.4f} |",
    ]
    if "max_abs_score_delta" in q:
        lines.append(f"| largest abs difference in the {r['model']['output']} | {q['max_abs_score_delta']:.4f} |")
    if "fp32_top1_accuracy" in q:
        lines.append(
            f"| top-1 accuracy FP32 / {big} ({q['labelled_images']} labelled) "
            f"| {q['fp32_top1_accuracy']:.3f} / {q[f'{p}_top1_accuracy']:.3f} |"
        )
    if "calibration_quality" in r:
        c = r["calibration_quality"]
        lines.append(
            f"| top-1 agreement on the {c['images']} calibration images | {c['top1_agreement']:.3f} "
            f"({c['top1_agree_count']}/{c['images']}) |"
        )
    return "\n".join(lines + _speed_lines(r)) + "\n"


def _int8_rows(b: dict[str, Any]) -> list[str]:
    return [
        f"| QuantizeLinear / DequantizeLinear | - | {b['quantize_linear']} / {b['dequantize_linear']} |",
        f"| op types left in FP32 | - | {_op_counts(b['fp32_op_types'])} |",
        f"| layers whose weights can overflow U8S8 kernels (x86 without VNNI) | - "
        f"| {b.get('u8s8_overflow_layers', '?')} |",
    ]


def _fp16_rows(b: dict[str, Any]) -> list[str]:
    c = b["clamped_weights"]
    return [
        f"| FP16 weights | - | {b['float16_weights']:,} |",
        f"| op types kept in FP32 | - | {_op_counts(b['fp32_op_types'])} |",
        f"| weights outside FP16's normal range | - | {c['total']:,} of {c['values']:,}, in {c['in_tensors']} of "
        f"{c['tensors']} tensors: {c['above_max']:,} above ±65504 (clamped to it), {c['subnormal']:,} subnormal "
        f"(below 6.1e-05: fewer significant bits), {c['below_min']:,} below 6e-08 (raised to ±6e-08) |",
    ]


def _speed_lines(r: dict[str, Any]) -> list[str]:
    """The CPU latency table of a cpu build; for the others, where their speed is measured."""
    if r["target"] == "tensorrt":
        return ["", "Speed: a TensorRT build's belongs to TensorRT on a GPU (benchmarks/gpu_check.py), not here."]
    if r["target"] == "fp16":
        return [
            "",
            "Speed: an FP16 build's belongs to a GPU's FP16 kernels (benchmarks/gpu_check.py measures it there), "
            "not here: ONNX Runtime's CPU EP runs it on its FP32 kernels.",
        ]
    lines = [
        "",
        f"Latency on {r['provider']}, {r['threads']} threads ({r['machine']['cpus']} CPUs):",
        "",
        "| batch | FP32 p50 ms | FP32 p99 ms | FP32 img/s | INT8 p50 ms | INT8 p99 ms | INT8 img/s | INT8 speed-up |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for a, b in zip(r["latency"]["fp32"], r["latency"]["int8"], strict=True):
        lines.append(
            f"| {a['batch']} | {a['p50_ms']:.1f} | {a['p99_ms']:.1f} | {a['images_per_s']:.0f} "
            f"| {b['p50_ms']:.1f} | {b['p99_ms']:.1f} | {b['images_per_s']:.0f} "
            f"| {r['int8_speedup_by_batch'][str(a['batch'])]:.2f}× |"  # noqa: RUF001 - the sign is meant
        )
    return lines


def _op_counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{k}×{v}" for k, v in counts.items()) or "none"  # noqa: RUF001 - the sign is meant


def report_paths(build: Path) -> tuple[Path, Path]:
    """Where a build's report goes: beside it, <name>.report.json and .md."""
    stem = build.with_suffix("")
    return stem.with_name(stem.name + ".report.json"), stem.with_name(stem.name + ".report.md")


def write_report(report: dict[str, Any], json_path: Path, md_path: Path) -> None:
    json_path.write_text(json.dumps(report, indent=2) + "\n")
    md_path.write_text(to_markdown(report))
