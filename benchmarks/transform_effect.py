"""What a model's own evaluation transform changes against squashing every image to the input size.

    python -m benchmarks.transform_effect            # benchmarks/cascade.py's 360 varied images, about a minute
    python -m benchmarks.transform_effect --quick    # 4 variations per photograph

Two models, each as its config declares it: the built-in EfficientNet-Lite0 (configs/local.yaml: shorter side 256,
centre 224, bicubic) and the Lite1 example (configs/examples/efficientnet-lite1.yaml: 274, 240, bicubic; its files
under models/, made by the commands at the top of that file). For each, on the varied images:
- how many FP32 top-1 answers the declared transform changes against "squash" (the whole image to the input size
  with area interpolation, what every model got before the declaration);
- INT8's top-1 agreement with FP32, each way calibrated and served with its own transform (an INT8 build
  calibrated on squashed images is made here, in a temporary directory, like the shipped one otherwise);
- the decode's CPU time per image (app.imaging.preprocess.preprocess, one thread), each way.
Writes benchmarks/results/<stamp>-<host>-transform-effect.{json,md,png}.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from app.config import AppArgs
from app.runtime.plan import RuntimeOptions, cpu_choice
from app.runtime.select import build
from app.served_model.declaration import ModelDeclaration
from app.served_model.graph import read_graph
from app.served_model.model_io import Preparation
from app.served_model.prologue import served_model
from app.toolchain.quantize import QuantizeOptions, quantize
from app.toolchain.samples import augmented_samples
from benchmarks.cascade import BATCH, corpus, corpus_main
from benchmarks.environment import REPO
from benchmarks.report import markdown_table, pyplot, save_figure

CONFIGS = {"efficientnet_lite0": "configs/local.yaml", "efficientnet_lite1": "configs/examples/efficientnet-lite1.yaml"}
ONE_THREAD = RuntimeOptions(threads=1, prefer_gpu=False)


def declared(config: str) -> tuple[ModelDeclaration, Path, Path]:
    args = AppArgs.model_validate(yaml.safe_load((REPO / config).read_text())["applications"][0]["args"])
    fp32, int8 = (Path(REPO / args.variants[v].model_path) for v in ("fp32", "int8"))
    for path in (fp32, int8):
        if not path.is_file():
            sys.exit(f"{path} missing: `make models`, and for Lite1 the commands at the top of {config}")
    return args.model, fp32, int8


def squashed(model: ModelDeclaration) -> ModelDeclaration:
    """The same declaration with the old geometry: the whole image to the input size, area interpolation."""
    prep = model.preprocess.model_copy(update={"resize_shorter": None, "crop": None, "interpolation": "area"})
    return model.model_copy(update={"preprocess": prep})


def top1(model: ModelDeclaration, path: Path, pixels: np.ndarray) -> np.ndarray:
    engine = build(str(served_model(path, model.preprocess).path), ONE_THREAD, cpu_choice())
    return np.concatenate([engine.logits(pixels[i : i + BATCH]) for i in range(0, len(pixels), BATCH)]).argmax(1)


def decode_ms(prepare: Preparation, images: list[bytes]) -> float:
    prepare.pixels(images[:4])  # warm
    t0 = time.process_time()
    prepare.pixels(images)
    return (time.process_time() - t0) * 1000 / len(images)


def run(per_photo: int) -> dict[str, Any]:
    images = [data for _, data in corpus(per_photo)]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, config in CONFIGS.items():
            model, fp32, int8 = declared(config)
            graph = read_graph(fp32)
            ways = {"declared": model, "squash": squashed(model)}
            squash_int8 = Path(tmp) / f"{name}-int8-squash.onnx"
            quantize(fp32, squash_int8, augmented_samples(64, 0), QuantizeOptions(), ways["squash"])
            builds = {"declared": int8, "squash": squash_int8}
            answers = {}
            for way, m in ways.items():
                prepare = Preparation(m, graph)
                pixels = prepare.pixels(images)
                answers[way] = top1(m, fp32, pixels)
                rows.append(
                    {
                        "model": name,
                        "transform": way,
                        "geometry": prepare.transform.to_dict(),
                        "int8_agreement": round(float(np.mean(top1(m, builds[way], pixels) == answers[way])), 3),
                        "decode_ms": round(decode_ms(prepare, images), 3),
                    }
                )
                print(rows[-1], flush=True)
            changed = float(np.mean(answers["declared"] != answers["squash"]))
            for r in rows[-2:]:
                r["fp32_top1_changed_by_the_declared_transform"] = round(changed, 3)
    return {"images": len(images), "per_photo": per_photo, "rows": rows}


def to_markdown(r: dict[str, Any]) -> str:
    table = markdown_table(
        ["model", "transform", "FP32 top-1 changed vs squash", "INT8 agreement with FP32", "decode CPU ms/img"],
        [
            [
                x["model"],
                f"{x['transform']} ({_geometry(x['geometry'])})",
                f"{x['fp32_top1_changed_by_the_declared_transform']:.3f}",
                f"{x['int8_agreement']:.3f}",
                x["decode_ms"],
            ]
            for x in r["rows"]
        ],
        digits=3,
    )
    return f"# The declared transform against squash: {r['images']} varied images\n\n{table}\n"


def _geometry(g: dict[str, Any]) -> str:
    if g["resize_shorter"] is None:
        return f"squash to {g['height']}, {g['interpolation']}"
    return f"shorter side {g['resize_shorter']}, centre {g['height']}, {g['interpolation']}"


def plot(r: dict[str, Any], png: Path) -> Path:
    plt = pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    labels = [f"{x['model']}\n{x['transform']}" for x in r["rows"]]
    colors = ["tab:green" if x["transform"] == "declared" else "tab:grey" for x in r["rows"]]
    a.barh(labels, [x["int8_agreement"] for x in r["rows"]], color=colors)
    a.set_xlim(0, 1)
    a.set_xlabel(f"INT8 top-1 agreement with FP32 ({r['images']} varied images)")
    b.barh(labels, [x["decode_ms"] for x in r["rows"]], color=colors)
    b.set_xlabel("decode CPU ms per image (one thread)")
    fig.suptitle("Each model's declared transform (green) against squash (grey)")
    return save_figure(fig, png)


def main(argv: list[str] | None = None) -> int:
    return corpus_main(argv, __doc__, 4, "transform-effect", run, to_markdown, plot)


if __name__ == "__main__":
    sys.exit(main())
