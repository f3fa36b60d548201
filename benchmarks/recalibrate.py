"""Does the calibration capture pay? INT8 rebuilt on the images it got wrong, against the default build.

    python -m benchmarks.recalibrate            # benchmarks/cascade.py's 360 images, a few minutes
    python -m benchmarks.recalibrate --quick    # 8 variations per photograph

The cascade's capture (app/pipeline/capture.py) keeps the images on which INT8 and FP32 disagree, as a directory
`python -m app.models quantize --calibration-dir` reads. Here that loop runs offline on the varied corpus: the
fit half's disagreements (what the capture would have kept from that traffic) calibrate new INT8 builds
(`app.toolchain.quantize.quantize`, minmax, as the default build), and every build is read on the held-out half:
- default: the shipped INT8 (64 random crops of the sample photographs);
- captured: the disagreements alone;
- default + captured: both sets;
- traffic: the whole fit half (what calibrating on the served traffic, not only its failures, gives).
For each: top-1 agreement with FP32, the `auto` threshold fitted on the fit half (target 0.995) and the share it
escalates on the held-out half. All on ORT's CPU EP, one thread. Writes
benchmarks/results/<stamp>-<host>-recalibrate.{json,md,png}.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from app.imaging.preprocess import preprocess
from app.pipeline.cascade_rule import MarginEvidence, curve, fit_threshold, margin
from app.runtime import open_engine, softmax, top_k
from app.runtime.plan import RuntimeOptions
from app.served_model import builtin_transform
from app.toolchain.quantize import QuantizeOptions, quantize
from app.toolchain.samples import augmented_samples
from benchmarks.cascade import BATCH, TARGET, corpus, corpus_main
from benchmarks.environment import REPO
from benchmarks.report import markdown_table, pyplot, save_figure


def probabilities(model: Path, precision: str, pixels: np.ndarray) -> np.ndarray:
    opts = RuntimeOptions(prefer_gpu=False, threads=1, engine="cpu", precision=precision)
    engine = open_engine(precision, str(model), opts).engine
    logits = np.concatenate([engine.logits(pixels[i : i + BATCH]) for i in range(0, len(pixels), BATCH)])
    return softmax(logits)


def judge(int8: np.ndarray, fp32_top1: np.ndarray, fit: slice, held: slice) -> dict[str, Any]:
    """Agreement on the held-out half, and `auto` fitted on the fit half then read on the held-out half."""
    first = [top_k(row, 2) for row in int8]
    margins = np.array([margin(t) for t in first])
    agreed = np.array([t[0][0] for t in first]) == fp32_top1
    evidence = MarginEvidence.of(zip(margins[fit].tolist(), agreed[fit].tolist(), strict=True))
    chosen = fit_threshold(evidence, TARGET, min_samples=50, default=0.5)
    held_curve = curve(MarginEvidence.of(zip(margins[held].tolist(), agreed[held].tolist(), strict=True)))
    at = next(p for p in held_curve if abs(p.threshold - chosen.threshold) < 1e-9)
    return {
        "agreement": round(float(np.mean(agreed[held])), 4),
        "auto": chosen.threshold,
        "cascade_agreement": round(at.agreement, 4),
        "escalated": round(at.escalation, 4),
    }


def run(per_photo: int, models: Path = REPO / "models") -> dict[str, Any]:
    images = corpus(per_photo)
    pixels = np.stack([preprocess(data, builtin_transform()) for _, data in images])
    fit, held = slice(0, None, 2), slice(1, None, 2)
    fp32_model, default_int8 = models / "efficientnet_lite0-fp32.onnx", models / "efficientnet_lite0-int8.onnx"
    fp32_top1 = probabilities(fp32_model, "fp32", pixels).argmax(axis=1)
    default_probs = probabilities(default_int8, "int8", pixels)
    wrong = default_probs.argmax(axis=1) != fp32_top1
    fit_idx = list(range(len(images)))[fit]
    captured = [images[i][1] for i in fit_idx if wrong[i]]  # what the capture keeps from the fit half's traffic
    sets = {
        "captured": captured,
        "default + captured": augmented_samples(64, 0) + captured,
        "traffic": [images[i][1] for i in fit_idx],
    }
    builds = {"default": {"calibration_images": 64, **judge(default_probs, fp32_top1, fit, held)}}
    with tempfile.TemporaryDirectory(prefix="recalibrate-") as tmp:
        for name, calibration in sets.items():
            out = Path(tmp) / f"{name.replace(' ', '')}.onnx"
            quantize(fp32_model, out, calibration, QuantizeOptions())
            probs = probabilities(out, "int8", pixels)
            builds[name] = {"calibration_images": len(calibration), **judge(probs, fp32_top1, fit, held)}
            print(name, builds[name], file=sys.stderr, flush=True)
    return {"images": len(images), "per_photo": per_photo, "disagreements_in_fit_half": len(captured), "builds": builds}


def to_markdown(r: dict[str, Any]) -> str:
    rows = [
        [name, b["calibration_images"], b["agreement"], f"{b['auto']:.2f}", b["cascade_agreement"], b["escalated"]]
        for name, b in r["builds"].items()
    ]
    head = ["INT8 build", "calibration images", "agreement with FP32", "auto", "cascade agreement", "escalated"]
    return (
        f"# INT8 recalibrated on its disagreements: {r['images']} images, "
        f"{r['disagreements_in_fit_half']} disagreements in the fit half\n\n"
        f"Read on the held-out half ({r['images'] // 2} images); auto fitted on the fit half, target {TARGET}.\n\n"
        + markdown_table(head, rows, digits=3)
        + "\n"
    )


def plot(r: dict[str, Any], png: Path) -> Path:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 4))
    names = list(r["builds"])
    x = np.arange(len(names))
    agree = [r["builds"][n]["agreement"] for n in names]
    escalated = [r["builds"][n]["escalated"] for n in names]
    b1 = ax.bar(x - 0.2, agree, 0.4, label="INT8 agreement with FP32")
    b2 = ax.bar(x + 0.2, escalated, 0.4, label="escalated by the cascade at auto")
    ax.bar_label(b1, fmt="%.3f", fontsize=8)
    ax.bar_label(b2, fmt="%.2f", fontsize=8)
    ax.set_xticks(x, names)
    ax.set_ylim(0, 1.05)
    ax.set_title(f"INT8 builds on {r['images'] // 2} held-out images")
    ax.legend(fontsize=8)
    return save_figure(fig, png)


def main(argv: list[str] | None = None) -> int:
    return corpus_main(argv, __doc__, 8, "recalibrate", run, to_markdown, plot)


if __name__ == "__main__":
    sys.exit(main())
