"""What INT8 costs in accuracy and buys in speed, measured on this machine.

The TensorRT INT8 artifact (symmetric S8S8, app.models.quantize target tensorrt) gets its own section:
its agreement with FP32 and its graph, measured on ONNX Runtime's CPU EP. Its speed belongs to TensorRT
on a GPU, not here.
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

from app.models.calibration import sample_directory
from app.models.samples import EVAL_PHOTOS, available_photos, sample_bytes
from app.models.u8s8 import pair_problems
from app.preprocess import preprocess
from app.runtime import CPU, OrtEngine, RuntimeOptions, cpu_engine, softmax
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
    if eval_dir is None:
        return [EvalImage(n, sample_bytes(n), EVAL_PHOTOS.get(n)) for n in EVAL_PHOTOS if n in available_photos()]
    picked = sample_directory(eval_dir, limit)
    return [EvalImage(str(p.path), p.path.read_bytes(), resolve_label(p.label, labels)) for p in picked]


def compare(fp32_logits: np.ndarray, int8_logits: np.ndarray, labels: Sequence[int | None]) -> dict[str, Any]:
    p, q = softmax(fp32_logits.astype(np.float64)), softmax(int8_logits.astype(np.float64))
    top5_p, top5_q = np.argsort(-p, 1)[:, :5], np.argsort(-q, 1)[:, :5]
    kl = np.sum(p * (np.log(p + 1e-12) - np.log(q + 1e-12)), axis=1)
    out: dict[str, Any] = {
        "images": len(p),
        "top1_agreement": float(np.mean(p.argmax(1) == q.argmax(1))),
        "top1_agree_count": int(np.sum(p.argmax(1) == q.argmax(1))),
        "top5_overlap": float(np.mean([len(set(a) & set(b)) / 5 for a, b in zip(top5_p, top5_q, strict=True)])),
        "mean_kl_divergence": float(kl.mean()),
        "mean_abs_top1_prob_delta": float(np.mean(np.abs(p.max(1) - q.max(1)))),
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
    ORT's own fused S8S8 CPU kernels do not: on x86 CPUs without VNNI (AVX2, AVX-512 before Cascade Lake)
    VPMADDUBSW saturates their 16-bit pair sums (oneDNN "Nuances of int8 computations"; onnxruntime
    PR #12088), far more often with sign-flipped S8 activations than with ReLU-range U8 ones. The report
    shows that path's agreement separately.
    """
    return OrtEngine(path, opts, cpu_choice({DISABLE_QDQ_FUSION: "1"}))


def tensorrt_section(
    fp32_logits: np.ndarray,
    trt: Path,
    x: np.ndarray,
    images: Sequence[EvalImage],
    labels: Sequence[str],
    opts: RuntimeOptions,
) -> dict[str, Any]:
    """Agreement of the TensorRT artifact with FP32: as TensorRT computes it, and through ORT's CPU kernels."""
    written = qdq_as_written(trt, opts).logits(x)
    fused = cpu_engine(str(trt), opts).logits(x)
    p, q = softmax(fp32_logits.astype(np.float64)), softmax(written.astype(np.float64))
    return {
        "evaluated_as": f"{CPU}, {DISABLE_QDQ_FUSION}=1 (Q/DQ computed as written, as TensorRT does)",
        "quality": compare(fp32_logits, written, [im.label for im in images]),
        "cpu_kernels_top1_agree_count": int(np.sum(fp32_logits.argmax(1) == fused.argmax(1))),
        "per_image": [
            {
                "image": im.name,
                "label": im.label,
                "fp32_top1": int(p[i].argmax()),
                "fp32_top1_prob": float(p[i].max()),
                "trt_top1": int(q[i].argmax()),
                "trt_top1_label": labels[int(q[i].argmax())],
                "trt_top1_prob": float(q[i].max()),
                "cpu_kernels_top1": int(fused[i].argmax()),
            }
            for i, im in enumerate(images)
        ],
    }


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


def build_report(
    fp32: Path,
    int8: Path,
    labels: Sequence[str],
    eval_dir: Path | None = None,
    threads: int | None = None,
    batch_sizes: Sequence[int] = BATCH_SIZES,
    extra: dict[str, Any] | None = None,
    int8_trt: Path | None = None,
) -> dict[str, Any]:
    threads = threads or (os.cpu_count() or 1)
    opts = RuntimeOptions(threads=threads, prefer_gpu=False)
    runners = {"fp32": cpu_engine(str(fp32), opts), "int8": cpu_engine(str(int8), opts)}
    images = eval_images(eval_dir, labels)
    x = np.stack([preprocess(im.data, runners["fp32"].spec.height) for im in images])
    logits = {k: r.logits(x) for k, r in runners.items()}
    as_written = qdq_as_written(int8, opts).logits(x)
    probs = {k: softmax(v.astype(np.float64)) for k, v in logits.items()}
    per_image = [
        {
            "image": im.name,
            "label": im.label,
            "fp32_top1": int(logits["fp32"][i].argmax()),
            "int8_top1": int(logits["int8"][i].argmax()),
            "fp32_top1_label": labels[int(logits["fp32"][i].argmax())],
            "int8_top1_label": labels[int(logits["int8"][i].argmax())],
            "fp32_top1_prob": float(probs["fp32"][i].max()),
            "int8_top1_prob": float(probs["int8"][i].max()),
        }
        for i, im in enumerate(images)
    ]
    speed = {k: time_batches(r, batch_sizes) for k, r in runners.items()}
    speedup = {
        str(a["batch"]): a["p50_ms"] / b["p50_ms"] for a, b in zip(speed["fp32"], speed["int8"], strict=True)
    }
    models = {"fp32": graph_summary(fp32), "int8": graph_summary(int8)}
    tensorrt: dict[str, Any] = {}
    if int8_trt is not None:
        models["int8_trt"] = graph_summary(int8_trt)
        tensorrt["tensorrt"] = tensorrt_section(logits["fp32"], int8_trt, x, images, labels, opts)
    return {
        "machine": {"platform": platform.platform(), "processor": platform.processor(), "cpus": os.cpu_count()},
        "threads": threads,
        "provider": runners["fp32"].active_provider,
        "eval_set": str(eval_dir) if eval_dir else "sample photographs (scikit-image, matplotlib)",
        "models": models,
        "quality": compare(logits["fp32"], logits["int8"], [im.label for im in images]),
        # The same graph with every Q/DQ computed as written: the fused kernels should match it.
        "int8_as_written_top1_agree_count": int(np.sum(logits["fp32"].argmax(1) == as_written.argmax(1))),
        "per_image": per_image,
        "latency": speed,
        "int8_speedup_by_batch": speedup,
        **tensorrt,
        **(extra or {}),
    }


def to_markdown(r: dict[str, Any]) -> str:
    m, q = r["models"], r["quality"]
    lines = [
        "| | FP32 | INT8 |",
        "|---|---|---|",
        f"| file size | {m['fp32']['bytes'] / 1e6:.1f} MB | {m['int8']['bytes'] / 1e6:.1f} MB |",
        "| QuantizeLinear / DequantizeLinear | - "
        f"| {m['int8']['quantize_linear']} / {m['int8']['dequantize_linear']} |",
        f"| op types left in FP32 | - | {_op_counts(m['int8']['fp32_op_types'])} |",
        f"| layers whose weights can overflow U8S8 kernels (x86 without VNNI) | - "
        f"| {m['int8'].get('u8s8_overflow_layers', '?')} |",
        "",
        f"Evaluation on {q['images']} images ({r['eval_set']}):",
        "",
        "| metric | value |",
        "|---|---|",
        f"| top-1 agreement INT8 vs FP32 | {q['top1_agreement']:.3f} ({q['top1_agree_count']}/{q['images']}) |",
        f"| top-1 agreement, Q/DQ computed as written (no fused kernels) "
        f"| {r.get('int8_as_written_top1_agree_count', '?')}/{q['images']} |",
        f"| top-5 overlap | {q['top5_overlap']:.3f} |",
        f"| mean KL(FP32 ‖ INT8) | {q['mean_kl_divergence']:.4f} |",
        f"| mean abs top-1 probability delta | {q['mean_abs_top1_prob_delta']:.4f} |",
    ]
    if "fp32_top1_accuracy" in q:
        lines.append(f"| top-1 accuracy FP32 / INT8 ({q['labelled_images']} labelled) "
                     f"| {q['fp32_top1_accuracy']:.3f} / {q['int8_top1_accuracy']:.3f} |")
    lines += [
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
    if "tensorrt" in r:
        lines += ["", *_tensorrt_markdown(m["int8_trt"], r["tensorrt"], r["eval_set"])]
    return "\n".join(lines) + "\n"


def _op_counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{k}×{v}" for k, v in counts.items()) or "none"  # noqa: RUF001 - the sign is meant


def _tensorrt_markdown(m: dict[str, Any], t: dict[str, Any], eval_set: str) -> list[str]:
    q = t["quality"]
    lines = [
        f"TensorRT INT8 ({Path(m['file']).name}: symmetric S8S8 for TensorRT's explicit quantization) on "
        f"{q['images']} images ({eval_set}), on {t['evaluated_as']}:",
        "",
        "| | TensorRT INT8 |",
        "|---|---|",
        f"| file size | {m['bytes'] / 1e6:.1f} MB |",
        f"| QuantizeLinear / DequantizeLinear | {m['quantize_linear']} / {m['dequantize_linear']} |",
        f"| op types left in FP32 | {_op_counts(m['fp32_op_types'])} |",
        f"| top-1 agreement with FP32 | {q['top1_agreement']:.3f} ({q['top1_agree_count']}/{q['images']}) |",
        f"| top-5 overlap | {q['top5_overlap']:.3f} |",
        f"| mean KL(FP32 ‖ TensorRT INT8) | {q['mean_kl_divergence']:.4f} |",
    ]
    if "int8_top1_accuracy" in q:
        lines.append(f"| top-1 accuracy ({q['labelled_images']} labelled) | {q['int8_top1_accuracy']:.3f} |")
    fused = t["cpu_kernels_top1_agree_count"]
    lines.append(f"| top-1 agreement through ORT's fused S8S8 CPU kernels | {fused}/{q['images']} |")
    return lines


def write_report(report: dict[str, Any], json_path: Path, md_path: Path) -> None:
    json_path.write_text(json.dumps(report, indent=2) + "\n")
    md_path.write_text(to_markdown(report))
