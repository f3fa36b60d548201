"""INT8 through the CPU kernels that run it: does the fused arithmetic compute what the graph says?

    python -m benchmarks.int8_kernels            # benchmarks/cascade.py's 360 images, about two minutes
    python -m benchmarks.int8_kernels --quick    # 4 variations per photograph

Two INT8 builds from the same calibration set (the CLI's default: 64 crops of the sample photographs):
- shipped: `python -m app.models quantize` as it is, weight pairs limited for U8S8 kernels (app/served_model/u8s8.py);
- as calibrated: the same with `--no-pair-limit` (built here, in a temporary directory).
Each runs four ways on the varied corpus, one thread, batches of 16:
- ORT CPU EP, fused: what a CPU replica runs (U8S8 kernels: VPMADDUBSW on x86 without VNNI);
- ORT CPU EP, Q/DQ as written (`session.disable_quant_qdq`): the graph's own arithmetic, layers in FP32;
- ORT CPU EP, `session.x64quantprecision=1`: ORT's documented fix, U8U8 kernels;
- OpenVINO (when installed): the other engine a CPU replica may pick.
For each: top-1 agreement with FP32 (ORT CPU EP) and images/s on one core (CPU time, inference only).
Writes benchmarks/results/<stamp>-<host>-int8-kernels.{json,md,png}.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from app.imaging.preprocess import preprocess
from app.runtime.openvino_engine import openvino_available
from app.runtime.plan import PRECISE_U8S8, EngineChoice, RuntimeOptions, cpu_choice
from app.runtime.select import build
from app.served_model import builtin_transform
from app.served_model.u8s8 import pair_problems
from app.toolchain.quantize import QuantizeOptions, quantize
from app.toolchain.report import DISABLE_QDQ_FUSION
from app.toolchain.samples import augmented_samples
from benchmarks.cascade import BATCH, corpus, corpus_main
from benchmarks.environment import REPO
from benchmarks.report import markdown_table, pyplot, save_figure

MODELS = REPO / "models"
ONE_THREAD = RuntimeOptions(threads=1, prefer_gpu=False)
WAYS = {
    "ORT fused": {},
    "ORT Q/DQ as written": {DISABLE_QDQ_FUSION: "1"},
    "ORT x64quantprecision": {PRECISE_U8S8: "1"},
}


def timed(engine: Any, pixels: np.ndarray) -> tuple[np.ndarray, float]:
    """Top-1 of every image and images/s on one core (CPU time)."""
    engine.logits(pixels[:BATCH])  # first-call allocations out of the timing
    t0 = time.process_time()
    logits = np.concatenate([engine.logits(pixels[i : i + BATCH]) for i in range(0, len(pixels), BATCH)])
    return logits.argmax(axis=1), len(pixels) / max(time.process_time() - t0, 1e-9)


def run(per_photo: int) -> dict[str, Any]:
    pixels = np.stack([preprocess(data, builtin_transform()) for _, data in corpus(per_photo)])
    reference, fp32_rate = timed(build(str(MODELS / "efficientnet_lite0-fp32.onnx"), ONE_THREAD, cpu_choice()), pixels)
    rows = [{"build": "FP32", "way": "ORT fused", "agreement": 1.0, "img_per_s": round(fp32_rate, 1)}]
    with tempfile.TemporaryDirectory() as tmp:
        unlimited = Path(tmp) / "int8-as-calibrated.onnx"
        quantize(
            MODELS / "efficientnet_lite0-fp32.onnx",
            unlimited,
            augmented_samples(64, 0),
            QuantizeOptions(pair_limit=False),
        )
        builds = {"shipped (pair-limited)": MODELS / "efficientnet_lite0-int8.onnx", "as calibrated": unlimited}
        overflow = {}
        for kind, path in builds.items():
            overflow[kind] = len(pair_problems(onnx.load(str(path))))
            # Built directly: a replica's plan moves overflowing weights to U8U8 and refuses OpenVINO for them.
            choices = {way: cpu_choice(cfg) for way, cfg in WAYS.items()}
            if openvino_available():
                choices["OpenVINO"] = EngineChoice("openvino")
            engines = {way: build(str(path), ONE_THREAD, choice) for way, choice in choices.items()}
            for way, engine in engines.items():
                top1, rate = timed(engine, pixels)
                rows.append(
                    {
                        "build": kind,
                        "way": way,
                        "agreement": round(float(np.mean(top1 == reference)), 3),
                        "img_per_s": round(rate, 1),
                        "vs_fp32": round(rate / fp32_rate, 2),
                    }
                )
                print(rows[-1], flush=True)
    return {"images": len(pixels), "per_photo": per_photo, "overflowing_layers": overflow, "rows": rows}


def to_markdown(r: dict[str, Any]) -> str:
    return (
        "\n".join(
            [
                f"# INT8 through the CPU kernels: {r['images']} varied images, agreement with FP32 (ORT CPU EP)\n",
                f"Layers whose weight pairs can overflow U8S8 kernels (no VNNI): {r['overflowing_layers']}.\n",
                markdown_table(
                    ["INT8 build", "run by", "top-1 agreement with FP32", "img/s, one core", "vs FP32"],
                    [
                        [x["build"], x["way"], f"{x['agreement']:.3f}", x["img_per_s"], f"{x.get('vs_fp32', 1.0):.2f}x"]
                        for x in r["rows"]
                    ],
                ),
            ]
        )
        + "\n"
    )


def plot(r: dict[str, Any], png: Path) -> Path:
    plt = pyplot()
    rows = [x for x in r["rows"] if x["build"] != "FP32"]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.5), sharey=True)
    labels = [f"{x['build']}\n{x['way']}" for x in rows]
    colors = ["tab:green" if x["build"].startswith("shipped") else "tab:red" for x in rows]
    a.barh(labels, [x["agreement"] for x in rows], color=colors)
    a.set_xlim(0, 1)
    a.set_xlabel(f"top-1 agreement with FP32 ({r['images']} varied images)")
    b.barh(labels, [x["img_per_s"] for x in rows], color=colors)
    fp32 = r["rows"][0]["img_per_s"]
    b.axvline(fp32, color="grey", linestyle=":", label=f"FP32, ORT: {fp32} img/s")
    b.set_xlabel("images/s, one core (inference only)")
    b.legend(fontsize=8)
    fig.suptitle("INT8 through the CPU kernels: green = weight pairs limited for U8S8, red = as calibrated")
    return save_figure(fig, png)


def main(argv: list[str] | None = None) -> int:
    return corpus_main(argv, __doc__, 4, "int8-kernels", run, to_markdown, plot)


if __name__ == "__main__":
    sys.exit(main())
