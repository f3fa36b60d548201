"""A user's own model (docs/model.md): where its normalisation runs, and its INT8 against its FP32.

    python -m benchmarks.own_model            # benchmarks/cascade.py's 360 varied images, about three minutes
    python -m benchmarks.own_model --quick    # 4 variations per photograph

The model is configs/examples/efficientnet-lite1.yaml's: EfficientNet-Lite1 at 240 px exported as PyTorch users
export it (float32 NCHW, (x - 127) / 128 outside the graph), and its INT8 build by `python -m app.models quantize`
(both under models/, made by the commands at the top of that file). Every image is prepared as that config
declares (app.served_model.model_io.Preparation: the Preprocessor's own `preprocess`, shorter side 274, centre 240,
bicubic).

1. Where the normalisation runs, per engine a CPU replica may pick (ORT's CPU EP, OpenVINO), FP32 and INT8, one
   thread, batches of 16, CPU time per image, the ways alternating round by round:
   - folded: the served graph (app/served_model/prologue.py), fed the uint8 batch the Preprocessor sends (what serves):
     Transpose, Cast, then the per-channel affine as a 1x1 depthwise Conv;
   - folded as Mul, Sub: the same with the affine as two elementwise ops (what the served graph's prologue does not
     do);
   - numpy: the Classifier normalising the uint8 batch in numpy (app.served_model.prologue.normalise), then the graph;
   - none: the graph fed floats already normalised: the floor, what a float32 wire would need (4x the bytes).
2. INT8 against FP32 on the varied images: top-1 agreement (served graphs, through each engine), and images/s on
   one core as served (the folded way's CPU time above).

Writes benchmarks/results/<stamp>-<host>-own-model.{json,md,png}.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from app.config import AppArgs
from app.runtime.openvino_engine import openvino_available
from app.runtime.plan import EngineChoice, RuntimeOptions, cpu_choice
from app.runtime.select import build
from app.served_model.graph import read_graph
from app.served_model.model_io import Preparation
from app.served_model.prologue import PIXELS, normalise, served_model
from benchmarks.cascade import BATCH, corpus, corpus_main
from benchmarks.environment import REPO
from benchmarks.report import markdown_table, pyplot, save_figure

CONFIG = REPO / "configs" / "examples" / "efficientnet-lite1.yaml"
ONE_THREAD = RuntimeOptions(threads=1, prefer_gpu=False)
ROUNDS = 9  # the median of this many rounds over the timing batches


def declared() -> tuple[Any, dict[str, Path]]:
    import yaml

    args = AppArgs.model_validate(yaml.safe_load(CONFIG.read_text())["applications"][0]["args"])
    files = {v: args.resolved_path(a.model_path) for v, a in args.variants.items()}
    missing = [str(p) for p in files.values() if not p.is_file()]
    if missing:
        sys.exit(f"{', '.join(missing)} missing: run the commands at the top of {CONFIG.relative_to(REPO)}")
    return args.model, files


def cpu_ms_per_image(ways: dict[str, tuple[Any, list[np.ndarray]]]) -> dict[str, float]:
    """Each way's CPU time per image: the median over ROUNDS rounds, the ways alternating within each round so that
    the machine's drift (another tenant, the clock) falls on all of them alike; a first call warms each up."""
    for fn, batches in ways.values():
        fn(batches[0])
    runs: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(ROUNDS):
        for name, (fn, batches) in ways.items():
            t0 = time.process_time()
            for b in batches:
                fn(b)
            runs[name].append((time.process_time() - t0) * 1000 / sum(len(b) for b in batches))
    return {name: round(float(np.median(r)), 3) for name, r in runs.items()}


def elementwise_copy(served: Path, out: Path) -> Path:
    """The served graph with its affine Conv written as Mul and Sub (the same arithmetic, per channel)."""
    model = onnx.load(str(served))
    g = model.graph
    conv = next(n for n in g.node if n.op_type == "Conv" and n.name.startswith(PIXELS))
    inits = {i.name: i for i in g.initializer}
    a = numpy_helper.to_array(inits[conv.input[1]]).reshape(-1, 1, 1)
    b = -numpy_helper.to_array(inits[conv.input[2]]).reshape(-1, 1, 1)
    g.initializer.extend([numpy_helper.from_array(a, "ew.a"), numpy_helper.from_array(b, "ew.b")])
    at = list(g.node).index(conv)
    g.node.remove(conv)
    g.node.insert(at, helper.make_node("Sub", ["ew.ax", "ew.b"], [conv.output[0]]))
    g.node.insert(at, helper.make_node("Mul", [conv.input[0], "ew.a"], ["ew.ax"]))
    onnx.save(model, str(out))
    return out


def engines() -> dict[str, EngineChoice]:
    out = {"ORT CPU EP": cpu_choice()}
    if openvino_available():
        out["OpenVINO"] = EngineChoice("openvino")
    return out


def run(per_photo: int) -> dict[str, Any]:
    model, files = declared()
    graph = read_graph(files["fp32"])
    prepare = Preparation(model, graph)
    images = [data for _, data in corpus(per_photo)]
    pixels = prepare.pixels(images)
    batches = [pixels[i : i + BATCH] for i in range(0, min(len(pixels), 8 * BATCH), BATCH)]
    floats = [normalise(b, model.preprocess, graph) for b in batches]
    where, answers, rates = [], {}, {}
    tmp = Path(tempfile.mkdtemp(prefix="own-model-"))
    for variant, path in files.items():
        served = str(served_model(path, model.preprocess).path)
        elementwise = str(elementwise_copy(Path(served), tmp / f"{variant}-mul-sub.onnx"))
        for name, choice in engines().items():
            wrapped, raw = build(served, ONE_THREAD, choice), build(str(path), ONE_THREAD, choice)
            mul_sub = build(elementwise, ONE_THREAD, choice)
            ms = cpu_ms_per_image(
                {
                    "folded": (wrapped.logits, batches),
                    "mul_sub": (mul_sub.logits, batches),
                    "numpy": (lambda b, e=raw: e.logits(normalise(b, model.preprocess, graph)), batches),
                    "none": (raw.logits, floats),
                }
            )
            where.append({"variant": variant, "engine": name, **ms})
            print(where[-1], flush=True)
            rates[(variant, name)] = 1000 / ms["folded"]  # as served, from the alternating rounds
            scores = np.concatenate([wrapped.logits(pixels[i : i + BATCH]) for i in range(0, len(pixels), BATCH)])
            answers[(variant, name)] = scores.argmax(axis=1)
    reference = answers[("fp32", "ORT CPU EP")]
    int8 = [
        {
            "variant": v,
            "engine": e,
            "agreement": round(float(np.mean(top1 == reference)), 3),
            "img_per_s": round(rates[(v, e)], 1),
            "vs_fp32": round(rates[(v, e)] / rates[("fp32", e)], 2),
        }
        for (v, e), top1 in answers.items()
    ]
    bytes_per_image = {
        "uint8 (served)": int(np.prod(prepare.transform.shape)),
        "float32": 4 * int(np.prod(prepare.transform.shape)),
    }
    return {
        "model": model.model_dump(),
        "graph": graph.describe(),
        "images": len(pixels),
        "per_photo": per_photo,
        "batch": BATCH,
        "wire_bytes_per_image": bytes_per_image,
        "where_normalisation_runs": where,
        "int8_vs_fp32": int8,
    }


def to_markdown(r: dict[str, Any]) -> str:
    where = markdown_table(
        [
            "variant",
            "engine",
            "folded: Conv (served) ms/img",
            "folded: Mul, Sub",
            "numpy in the Classifier",
            "floor (pre-normalised)",
        ],
        [
            [x["variant"], x["engine"], x["folded"], x["mul_sub"], x["numpy"], x["none"]]
            for x in r["where_normalisation_runs"]
        ],
        digits=3,
    )
    int8 = markdown_table(
        ["variant", "engine", "top-1 agreement with FP32 (ORT)", "img/s, one core", "vs FP32 on that engine"],
        [
            [x["variant"], x["engine"], f"{x['agreement']:.3f}", x["img_per_s"], f"{x['vs_fp32']:.2f}x"]
            for x in r["int8_vs_fp32"]
        ],
    )
    wire = ", ".join(f"{k} {v:,} B" for k, v in r["wire_bytes_per_image"].items())
    return (
        f"# {r['model']['name']}: {r['images']} varied images, batches of {r['batch']}, one thread\n\n"
        f"Where the normalisation runs (CPU ms per image; wire per image: {wire}):\n\n{where}\n\n"
        f"INT8 against FP32, each served graph through each engine:\n\n{int8}\n"
    )


def plot(r: dict[str, Any], png: Path) -> Path:
    plt = pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.5))
    rows = r["where_normalisation_runs"]
    labels = [f"{x['variant']}, {x['engine']}" for x in rows]
    y = np.arange(len(rows))
    ways = (("none", "tab:grey"), ("folded", "tab:green"), ("mul_sub", "tab:red"), ("numpy", "tab:orange"))
    for i, (key, color) in enumerate(ways):
        a.barh(y + (i - 1.5) * 0.2, [x[key] for x in rows], height=0.2, color=color, label=key)
    a.set_yticks(y, labels)
    a.set_xlabel("CPU ms per image (batch of 16, one thread)")
    a.legend(fontsize=8, title="normalisation")
    a.set_title("Where the normalisation runs")
    q = [x for x in r["int8_vs_fp32"] if x["variant"] != "fp32"]
    b.barh([x["engine"] for x in q], [x["vs_fp32"] for x in q], color="tab:blue")
    for i, x in enumerate(q):
        b.text(x["vs_fp32"], i, f"  {x['vs_fp32']:.2f}x, agreement {x['agreement']:.3f}", va="center", fontsize=8)
    b.axvline(1.0, color="grey", linestyle=":")
    b.set_xlim(0, max(x["vs_fp32"] for x in q) * 1.8)
    b.set_xlabel("INT8 img/s / FP32 img/s (one core)")
    b.set_title(f"INT8 against FP32 on {r['images']} varied images")
    fig.suptitle(f"{r['model']['name']}, served as declared (configs/examples/efficientnet-lite1.yaml)")
    return save_figure(fig, png)


def main(argv: list[str] | None = None) -> int:
    return corpus_main(argv, __doc__, 4, "own-model", run, to_markdown, plot)


if __name__ == "__main__":
    sys.exit(main())
