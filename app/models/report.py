"""What INT8 costs in accuracy and buys in speed, measured on this machine.

One report per INT8 build, for any model, served as its declaration says (app/models/declaration.py). A cpu build
is judged through ONNX Runtime's fused CPU kernels (what serves it) and timed against FP32; a TensorRT build
(symmetric S8S8, app.models.quantize target tensorrt) is judged with Q/DQ computed as written, which is
TensorRT's arithmetic; its speed belongs to TensorRT on a GPU, not here.
"""

from __future__ import annotations

import json
import os
import platform
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from app.models.declaration import ModelDeclaration
from app.models.graph import read_graph
from app.models.model_io import Preparation
from app.models import Target
from app.models.calibration import sample_directory
from app.models.prologue import served_model
from app.models.samples import EVAL_PHOTOS, available_photos, sample_bytes
from app.models.u8s8 import pair_problems
from app.runtime import CPU, OrtEngine, RuntimeOptions, cpu_engine
from app.runtime.outputs import probabilities
from app.runtime.plan import cpu_choice

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
    fp32_scores: np.ndarray, int8_scores: np.ndarray, labels: Sequence[int | None], output: str = "logits"
) -> dict[str, Any]:
    """How far INT8's answers are from FP32's: `output` says whether the rows are logits or probabilities."""
    p = probabilities(fp32_scores.astype(np.float64), output)
    q = probabilities(int8_scores.astype(np.float64), output)
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
    }
    known = [i for i, y in enumerate(labels) if y is not None]
    if known:
        y = np.array([labels[i] for i in known])
        out["labelled_images"] = len(known)
        out["fp32_top1_accuracy"] = float(np.mean(p[known].argmax(1) == y))
        out["int8_top1_accuracy"] = float(np.mean(q[known].argmax(1) == y))
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


# What the INT8 build is judged by, per target: the path that serves it, and the other one beside it.
EVALUATED_AS = {
    "cpu": f"{CPU}, fused QDQ kernels (what a CPU replica runs)",
    "tensorrt": f"{CPU}, {DISABLE_QDQ_FUSION}=1 (Q/DQ computed as written, as TensorRT computes it)",
}
OTHER_PATH = {
    "cpu": "Q/DQ computed as written (no fused kernels)",
    "tensorrt": "ORT's fused S8S8 CPU kernels",
}


def build_report(
    fp32: Path,
    int8: Path,
    model: ModelDeclaration,
    target: Target = "cpu",
    calibration: Sequence[bytes] = (),
    eval_dir: Path | None = None,
    threads: int | None = None,
    batch_sizes: Sequence[int] = BATCH_SIZES,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """FP32 against its INT8 build, both served as `model` declares (the prologue folded in, pixels prepared by
    the Preprocessor's own function): agreement on the evaluation set and on the calibration images, and for
    the cpu target the speed of both on this machine's CPU EP (a TensorRT build's speed belongs to a GPU)."""
    threads = threads or (os.cpu_count() or 1)
    opts = RuntimeOptions(threads=threads, prefer_gpu=False)
    served = {k: served_model(p, model.preprocess).path for k, p in (("fp32", fp32), ("int8", int8))}
    prepare = Preparation(model, read_graph(fp32))
    labels = model.labels(prepare.graph.classes)
    fp32_engine, fused = cpu_engine(str(served["fp32"]), opts), cpu_engine(str(served["int8"]), opts)
    written = qdq_as_written(served["int8"], opts)
    judged, other = (fused, written) if target == "cpu" else (written, fused)
    images = eval_images(eval_dir, labels)
    x = prepare.pixels([im.data for im in images])
    scores = {"fp32": fp32_engine.logits(x), "int8": judged.logits(x)}
    alt = other.logits(x)
    probs = {k: probabilities(v.astype(np.float64), model.output) for k, v in scores.items()}
    per_image = [
        {
            "image": im.name,
            "label": im.label,
            **{f"{k}_top1": int(probs[k][i].argmax()) for k in ("fp32", "int8")},
            **{f"{k}_top1_label": labels[int(probs[k][i].argmax())] for k in ("fp32", "int8")},
            **{f"{k}_top1_prob": float(probs[k][i].max()) for k in ("fp32", "int8")},
            "other_path_top1": int(alt[i].argmax()),
        }
        for i, im in enumerate(images)
    ]
    report: dict[str, Any] = {
        "machine": {"platform": platform.platform(), "processor": platform.processor(), "cpus": os.cpu_count()},
        "threads": threads,
        "provider": fp32_engine.active_provider,
        "model": model.model_dump(),
        "target": target,
        "evaluated_as": EVALUATED_AS[target],
        "eval_set": str(eval_dir) if eval_dir else "sample photographs (scikit-image, matplotlib)",
        "models": {"fp32": graph_summary(fp32), "int8": graph_summary(int8)},
        "quality": compare(scores["fp32"], scores["int8"], [im.label for im in images], model.output),
        "other_path": {
            "name": OTHER_PATH[target],
            "top1_agree_count": int(np.sum(probs["fp32"].argmax(1) == alt.argmax(1))),
        },
        "per_image": per_image,
    }
    if calibration:
        xc = prepare.pixels(calibration)
        report["calibration_quality"] = compare(
            fp32_engine.logits(xc), judged.logits(xc), [None] * len(calibration), model.output
        )
    if target == "cpu":
        speed = {"fp32": time_batches(fp32_engine, batch_sizes), "int8": time_batches(fused, batch_sizes)}
        report["latency"] = speed
        report["int8_speedup_by_batch"] = {
            str(a["batch"]): a["p50_ms"] / b["p50_ms"] for a, b in zip(speed["fp32"], speed["int8"], strict=True)
        }
    return report | (extra or {})


def to_markdown(r: dict[str, Any]) -> str:
    m, q = r["models"], r["quality"]
    name = r["model"]["name"]
    int8_file = Path(m["int8"]["file"]).name
    lines = [
        f"{name}: {Path(m['fp32']['file']).name} against its INT8 build {int8_file} (target {r['target']})",
        "",
        "| | FP32 | INT8 |",
        "|---|---|---|",
        f"| file size | {m['fp32']['bytes'] / 1e6:.1f} MB | {m['int8']['bytes'] / 1e6:.1f} MB |",
        "| QuantizeLinear / DequantizeLinear | - "
        f"| {m['int8']['quantize_linear']} / {m['int8']['dequantize_linear']} |",
        f"| op types left in FP32 | - | {_op_counts(m['int8']['fp32_op_types'])} |",
        f"| layers whose weights can overflow U8S8 kernels (x86 without VNNI) | - "
        f"| {m['int8'].get('u8s8_overflow_layers', '?')} |",
        "",
        f"Evaluation on {q['images']} images ({r['eval_set']}), INT8 on {r['evaluated_as']}:",
        "",
        "| metric | value |",
        "|---|---|",
        f"| top-1 agreement INT8 vs FP32 | {q['top1_agreement']:.3f} ({q['top1_agree_count']}/{q['images']}) |",
        f"| top-1 agreement, {r['other_path']['name']} | {r['other_path']['top1_agree_count']}/{q['images']} |",
        f"| top-5 overlap | {q['top5_overlap']:.3f} |",
        f"| mean KL(FP32 ‖ INT8) | {q['mean_kl_divergence']:.4f} |",
        f"| mean abs top-1 probability delta | {q['mean_abs_top1_prob_delta']:.4f} |",
    ]
    if "fp32_top1_accuracy" in q:
        lines.append(
            f"| top-1 accuracy FP32 / INT8 ({q['labelled_images']} labelled) "
            f"| {q['fp32_top1_accuracy']:.3f} / {q['int8_top1_accuracy']:.3f} |"
        )
    if "calibration_quality" in r:
        c = r["calibration_quality"]
        lines.append(
            f"| top-1 agreement on the {c['images']} calibration images | {c['top1_agreement']:.3f} "
            f"({c['top1_agree_count']}/{c['images']}) |"
        )
    if "latency" in r:
        lines += [
            "",
            f"Latency on {r['provider']}, {r['threads']} threads ({r['machine']['cpus']} CPUs):",
            "",
            "| batch | FP32 p50 ms | FP32 p99 ms | FP32 img/s | INT8 p50 ms | INT8 p99 ms | INT8 img/s "
            "| INT8 speed-up |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for a, b in zip(r["latency"]["fp32"], r["latency"]["int8"], strict=True):
            lines.append(
                f"| {a['batch']} | {a['p50_ms']:.1f} | {a['p99_ms']:.1f} | {a['images_per_s']:.0f} "
                f"| {b['p50_ms']:.1f} | {b['p99_ms']:.1f} | {b['images_per_s']:.0f} "
                f"| {r['int8_speedup_by_batch'][str(a['batch'])]:.2f}× |"  # noqa: RUF001 - the sign is meant
            )
    else:
        lines += ["", "Speed: a TensorRT build's belongs to TensorRT on a GPU (benchmarks/gpu_check.py), not here."]
    return "\n".join(lines) + "\n"


def _op_counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{k}×{v}" for k, v in counts.items()) or "none"  # noqa: RUF001 - the sign is meant


def report_paths(int8: Path) -> tuple[Path, Path]:
    """Where an INT8 build's report goes: beside it, <name>.report.json and .md."""
    stem = int8.with_suffix("")
    return stem.with_name(stem.name + ".report.json"), stem.with_name(stem.name + ".report.md")


def write_report(report: dict[str, Any], json_path: Path, md_path: Path) -> None:
    json_path.write_text(json.dumps(report, indent=2) + "\n")
    md_path.write_text(to_markdown(report))
