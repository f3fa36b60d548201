"""The confidence cascade measured offline: INT8 first, FP32 where INT8's top-1 margin is small.

    python -m benchmarks.cascade            # 360 images, about a minute
    python -m benchmarks.cascade --quick    # 4 variations per photograph
    python -m benchmarks.cascade --engine cpu   # both on ORT's CPU EP (auto may pick OpenVINO for INT8)

A corpus with variety: every sample photograph under random crops, rotations, blur, noise and JPEG quality
(deterministic). Each image is decoded as the service decodes it (`app.imaging.preprocess`) and run through both
variants on the engines a CPU replica would pick (`app.runtime.open_engine`, engine auto, one thread). Half the
images (every other one) are the evidence `app.pipeline.cascade_rule.fit_threshold` fits the `auto` threshold from, as
live shadow comparisons would be; the other half is where every figure is read:
- for thresholds 0 to 1: agreement of the cascade's top-1 with FP32's, and the share of images escalated;
- throughput on one core, measured: decode + INT8 on batches of 16, and FP32 on each batch's escalated images,
  against decode + INT8 alone and decode + FP32 alone, at thresholds 0, `auto` and 1 (and, for the curve, the
  same per-image costs applied to every threshold).
Writes benchmarks/results/<stamp>-<host>-cascade.{json,md,png}.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from app.imaging.opencv import cv2  # the service's OpenCV settings (its pixel guard) before the library loads
from app.imaging.preprocess import preprocess
from app.pipeline.cascade_rule import MarginEvidence, curve, escalate, fit_threshold, margin
from app.runtime import open_engine, softmax, top_k
from app.runtime.plan import RuntimeOptions
from app.served_model import builtin_transform
from app.toolchain.samples import available_photos, sample_bytes
from benchmarks.environment import REPO, RESULTS_DIR, host_name, print_environment, stamp
from benchmarks.report import markdown_table, pyplot, save_figure, write_report

BATCH = 16
TARGET = 0.995  # the `auto` threshold's target agreement with FP32 (the default target_agreement)
GOAL = {"agreement": 0.99, "speedup": 1.3}  # the targets at the threshold auto picks


def variation(src: np.ndarray, rng: np.random.Generator) -> bytes:
    """One JPEG of `src` (BGR): a crop of 40-100% of its area, a rotation within 25 degrees, maybe blur, maybe
    noise, a JPEG quality from 25 to 95."""
    h, w = src.shape[:2]
    area = rng.uniform(0.4, 1.0)
    aspect = rng.uniform(0.75, 1.33)
    ch, cw = min(h, int(h * np.sqrt(area / aspect))), min(w, int(w * np.sqrt(area * aspect)))
    y, x = int(rng.integers(0, h - ch + 1)), int(rng.integers(0, w - cw + 1))
    img = src[y : y + ch, x : x + cw]
    angle = rng.uniform(-25, 25) if rng.random() < 0.6 else 0.0
    if angle:
        m = cv2.getRotationMatrix2D((cw / 2, ch / 2), angle, 1.0)
        img = cv2.warpAffine(img, m, (cw, ch), borderMode=cv2.BORDER_REFLECT)
    if rng.random() < 0.4:
        img = cv2.GaussianBlur(img, (0, 0), rng.uniform(0.8, 3.0))
    if rng.random() < 0.4:
        noisy = img.astype(np.float32) + rng.normal(0, rng.uniform(4, 20), img.shape).astype(np.float32)
        img = np.clip(noisy, 0, 255).astype(np.uint8)
    ok, buf = cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_QUALITY, int(rng.integers(25, 96))])
    assert ok
    return buf.tobytes()


# The sample photographs of things ImageNet has classes for. Left out: hubble_deep_field, immunohistochemistry,
# retina and color (a star field, a stained tissue slide, a fundus image, a colour chart): no class fits them,
# FP32 itself answers near-ties there, and agreement on them measures noise, not the cascade.
PHOTOS = ("grace_hopper", "chelsea", "coffee", "astronaut", "rocket", "motorcycle_left")


def corpus(per_photo: int, seed: int = 0) -> list[tuple[str, bytes]]:
    out = []
    for photo in [p for p in PHOTOS if p in available_photos()]:
        src = cv2.imdecode(np.frombuffer(sample_bytes(photo), np.uint8), cv2.IMREAD_COLOR)
        rng = np.random.default_rng([seed, sum(photo.encode())])
        out += [(photo, variation(src, rng)) for _ in range(per_photo)]
    return out


def cpu_s(fn: Any, *args: Any) -> tuple[Any, float]:
    t0 = time.process_time()
    out = fn(*args)
    return out, time.process_time() - t0


def run(per_photo: int, models: Path = REPO / "models", engine: str = "auto") -> dict[str, Any]:
    images = corpus(per_photo)
    pixels, decode_s = cpu_s(lambda: np.stack([preprocess(data, builtin_transform()) for _, data in images]))
    opts = {"prefer_gpu": False, "threads": 1, "engine": engine}
    engines = {
        v: open_engine(v, str(models / f"efficientnet_lite0-{v}.onnx"), RuntimeOptions(**opts, precision=v))
        for v in ("int8", "fp32")
    }
    names = {v: o.engine.name for v, o in engines.items()}
    for o in engines.values():
        o.engine.logits(o.engine.dummy_batch(BATCH))  # first-call allocations out of the timings
    probs, infer_s = {}, {}
    for v, o in engines.items():
        batches = [pixels[i : i + BATCH] for i in range(0, len(pixels), BATCH)]
        logits, infer_s[v] = cpu_s(lambda e=o.engine, bs=batches: np.concatenate([e.logits(b) for b in bs]))
        probs[v] = softmax(logits)
    first = [top_k(row, 2) for row in probs["int8"]]
    fp32_top1 = probs["fp32"].argmax(axis=1)
    margins = np.array([margin(t) for t in first])
    agreed = np.array([t[0][0] for t in first]) == fp32_top1
    fit_half, eval_half = slice(0, None, 2), slice(1, None, 2)
    evidence = MarginEvidence.of(zip(margins[fit_half].tolist(), agreed[fit_half].tolist(), strict=True))
    fit = fit_threshold(evidence, TARGET, min_samples=50, default=0.5)
    n = len(images)
    cost_ms = {  # CPU ms per image, one thread, batches of 16
        "decode": decode_s * 1000 / n,
        "int8": infer_s["int8"] * 1000 / n,
        "fp32": infer_s["fp32"] * 1000 / n,
    }
    eval_m, eval_ok = margins[eval_half], agreed[eval_half]
    held_out = curve(MarginEvidence.of(zip(eval_m.tolist(), eval_ok.tolist(), strict=True)))
    fp32_alone = cost_ms["decode"] + cost_ms["fp32"]
    points = [
        {
            "threshold": p.threshold,
            "agreement": p.agreement,
            "escalation": p.escalation,
            "speedup": fp32_alone / (cost_ms["decode"] + cost_ms["int8"] + p.escalation * cost_ms["fp32"]),
        }
        for p in held_out
    ]
    measured = measure(pixels[eval_half], engines, eval_m, cost_ms["decode"], [0.0, fit.threshold, 1.0])
    at_auto = next(p for p in points if abs(p["threshold"] - fit.threshold) < 1e-9)
    return {
        "images": n,
        "photos": [p for p in PHOTOS if p in available_photos()],
        "per_photo": per_photo,
        "engines": names,
        "cost_ms_per_image": {k: round(v, 3) for k, v in cost_ms.items()},
        "agreement_int8_alone": float(np.mean(eval_ok)),
        "fit": {**fit.to_dict(), "target": TARGET, "evidence_curve": [p.to_dict() for p in curve(evidence)]},
        "curve": points,
        "at_auto": at_auto,
        "measured": measured,
        "goal": GOAL,
    }


def measure(
    pixels: np.ndarray, engines: dict[str, Any], margins: np.ndarray, decode_ms: float, thresholds: list[float]
) -> list[dict[str, Any]]:
    """Images/s on one core (decode included, from its measured cost): INT8 alone, FP32 alone, and the cascade
    at each threshold (INT8 on every batch of 16, FP32 on that batch's escalated images)."""
    int8, fp32 = engines["int8"].engine, engines["fp32"].engine
    batches = [(pixels[i : i + BATCH], margins[i : i + BATCH]) for i in range(0, len(pixels), BATCH)]

    def alone(e: Any) -> float:
        _, s = cpu_s(lambda: [e.logits(b) for b, _ in batches])
        return s

    def cascade(t: float) -> float:
        def go() -> None:
            for b, m in batches:
                int8.logits(b)
                rows = [i for i, x in enumerate(m) if escalate(x, t)]
                if rows:
                    fp32.logits(b[rows])

        return cpu_s(go)[1]

    n = len(pixels)
    rate = lambda s: round(n / (s + decode_ms * n / 1000), 1)  # noqa: E731
    out = [
        {"what": "int8 alone", "img_per_s": rate(alone(int8))},
        {"what": "fp32 alone", "img_per_s": rate(alone(fp32))},
    ]
    for t in thresholds:
        out.append({"what": f"cascade at {t:.2f}", "threshold": t, "img_per_s": rate(cascade(t))})
    base = out[1]["img_per_s"]
    for row in out:
        row["vs_fp32"] = round(row["img_per_s"] / base, 3)
    return out


def to_markdown(r: dict[str, Any]) -> str:
    fit, auto = r["fit"], r["at_auto"]
    lines = [
        f"# Cascade int8>fp32, offline: {r['images']} images ({r['per_photo']} per photograph)\n",
        f"Engines: {r['engines']}; CPU ms per image (one thread, batches of {BATCH}): {r['cost_ms_per_image']}.",
        f"INT8 alone agrees with FP32 on {r['agreement_int8_alone']:.3f} of the evaluation half.",
        f"`auto` (target {fit['target']}, fitted on the other half, {fit['samples']} comparisons): threshold "
        f"**{fit['threshold']:.2f}** -> agreement {auto['agreement']:.3f}, escalation {auto['escalation']:.3f}, "
        f"throughput {auto['speedup']:.2f}x FP32 from the per-image costs.\n",
        markdown_table(
            ["measured", "img/s (one core)", "vs FP32 alone"],
            [[m["what"], m["img_per_s"], f"{m['vs_fp32']:.2f}x"] for m in r["measured"]],
        ),
        "",
        markdown_table(
            ["threshold", "agreement with FP32", "escalated", "throughput vs FP32"],
            [
                [f"{p['threshold']:.2f}", f"{p['agreement']:.3f}", f"{p['escalation']:.3f}", f"{p['speedup']:.2f}x"]
                for p in r["curve"]
                if round(p["threshold"] * 100) % 5 == 0 or p is auto
            ],
        ),
    ]
    return "\n".join(lines) + "\n"


def plot(r: dict[str, Any], png: Path) -> Path:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    t = [p["threshold"] for p in r["curve"]]
    ax.plot(t, [p["agreement"] for p in r["curve"]], label="agreement with FP32")
    ax.plot(t, [p["escalation"] for p in r["curve"]], label="share escalated to FP32")
    ax2 = ax.twinx()
    ax2.plot(t, [p["speedup"] for p in r["curve"]], color="tab:green", linestyle="--", label="throughput vs FP32")
    ax2.set_ylabel("throughput vs FP32 alone (per-image costs)")
    auto = r["fit"]["threshold"]
    ax.axvline(auto, color="grey", linestyle=":", label=f"auto: {auto:.2f}")
    ax.axhline(GOAL["agreement"], color="tab:blue", linewidth=0.5)
    ax2.axhline(GOAL["speedup"], color="tab:green", linewidth=0.5)
    ax.set_xlabel("margin threshold (INT8 top-1 minus top-2 probability)")
    ax.set_ylim(0, 1.02)
    ax.set_title(f"int8>fp32 cascade, {r['images']} images (evaluation half)")
    handles = ax.get_legend_handles_labels()[0] + ax2.get_legend_handles_labels()[0]
    ax.legend(handles=handles, fontsize=8, loc="center right")
    return save_figure(fig, png)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--per-photo", type=int, default=60, help="variations of each sample photograph")
    ap.add_argument("--quick", action="store_true", help="4 variations per photograph")
    ap.add_argument(
        "--engine",
        default="auto",
        choices=["auto", "cpu", "openvino"],
        help="both variants' engine; auto (a replica's choice) measures both and may pick either for INT8",
    )
    ap.add_argument("--out-dir", type=Path, default=RESULTS_DIR)
    args = ap.parse_args(argv)
    env = print_environment()
    result = {"environment": env, **run(4 if args.quick else args.per_photo, engine=args.engine)}
    save(result, args.out_dir / f"{stamp()}-{host_name()}-cascade", to_markdown, plot)
    return 0


def corpus_main(
    argv: list[str] | None, doc: str | None, quick: int, name: str, runner: Any, markdown: Any, plotter: Any
) -> int:
    """The command line of a benchmark over this corpus: --per-photo, --quick (`quick` per photograph), --out-dir;
    `runner(per_photo)` measures, and the result is saved as <stamp>-<host>-<name>.{json,md,png}."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--per-photo", type=int, default=60, help="variations of each sample photograph")
    ap.add_argument("--quick", action="store_true", help=f"{quick} variations per photograph")
    ap.add_argument("--out-dir", type=Path, default=RESULTS_DIR)
    args = ap.parse_args(argv)
    env = print_environment()
    result = {"environment": env, **runner(quick if args.quick else args.per_photo)}
    save(result, args.out_dir / f"{stamp()}-{host_name()}-{name}", markdown, plotter)
    return 0


def save(result: dict[str, Any], stem: Path, markdown: Any, plotter: Any) -> None:
    """<stem>.json, .md (printed too) and .png."""
    stem.parent.mkdir(parents=True, exist_ok=True)
    md = markdown(result)
    print(md, write_report(stem, result, md), sep="\n")
    plotter(result, Path(f"{stem}.png"))


if __name__ == "__main__":
    sys.exit(main())
