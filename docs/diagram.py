"""The architecture picture of the README and docs/architecture.md: `python docs/diagram.py` writes
docs/architecture.png (matplotlib, no other tool). Left: a request's way through the deployments; right: the
packages of app/ in their import layers (pyproject.toml [tool.importlinter])."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

OUT = Path(__file__).resolve().parent / "architecture.png"
# name: (x, y, width, height, title, detail, colour)
BOXES = {
    "client": (0.2, 4.6, 2.2, 0.9, "clients", "HTTP /v1, V2 REST, V2 gRPC", "#f0f0f0"),
    "front": (
        0.2, 3.0, 2.2, 1.2, "HAProxy + the front",
        "whole requests, a share per\nclient, per-Router limit,\ntimed queue", "#fde0dd",
    ),
    "router": (
        3.0, 2.6, 2.8, 2.0, "Router (CPU)",
        "http: read, check, route (A/B)\npipeline: admission, coalescing,\nfailover, shadow, cascade\n"
        "(decode_in: router: decodes too)", "#e0ecf4",
    ),
    "pre": (6.4, 3.9, 2.4, 1.0, "Preprocessor (CPU)", "decode to the model's\ngeometry, uint8", "#e5f5e0"),
    "int8": (6.4, 2.5, 2.4, 1.0, "Classifier_int8", "@serve.batch on TensorRT, CUDA,\nOpenVINO or ORT CPU", "#fff7bc"),
    "fp32": (6.4, 1.1, 2.4, 1.0, "Classifier_fp32", "the same class, the FP32 file", "#fff7bc"),
    "ledger": (3.0, 0.8, 2.8, 1.0, "ABLedger, RolloutController", "A/B counts,\nrollouts", "#efedf5"),
}  # fmt: skip
ARROWS = [("client", "front"), ("front", "router"), ("router", "pre"), ("router", "int8"), ("router", "fp32"),
          ("router", "ledger")]  # fmt: skip
LAYERS = [  # top imports below, never up (import-linter's layers contract); the tools (app.ops) sit above them all
    ("app.main", "Serve's entry point: build_app"),
    ("app.serve", "deployments, replicas, handles, metrics, Serve's private API"),
    ("app.http", "route table, v1, V2, gRPC, docs, replies"),
    ("app.protocol : pipeline : rollout", "the Open Inference Protocol; what happens to an image; rollouts"),
    ("app.toolchain", "build, quantize, report models (offline)"),
    ("app.runtime | front", "engines; the admission front (HAProxy)"),
    ("app.config", "settings and their validation"),
    ("app.served_model | request", "the served model's contract; request limits"),
    ("app.imaging", "decode, the declared geometry"),
    ("app.errors", "one table of errors"),
]


def anchor(name: str, toward: str) -> tuple[float, float]:
    """Where an arrow leaves box `name` for box `toward`: the side that faces it."""
    x, y, w, h = BOXES[name][:4]
    tx, ty, tw, th = BOXES[toward][:4]
    if tx >= x + w:  # to the right
        return x + w, min(max(ty + th / 2, y + 0.15), y + h - 0.15)
    if tx + tw <= x:
        return x, y + h / 2
    return x + w / 2, (y if ty < y else y + h)  # below or above


def main() -> Path:
    fig, (flow, layers) = plt.subplots(1, 2, figsize=(14, 5.6), gridspec_kw={"width_ratios": [9, 5]})
    for x, y, w, h, title, detail, colour in BOXES.values():
        flow.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.05", fc=colour, ec="#555555"))
        flow.text(x + w / 2, y + h - 0.22, title, ha="center", va="center", fontsize=10, weight="bold")
        flow.text(x + w / 2, y + (h - 0.35) / 2, detail, ha="center", va="center", fontsize=7.5)
    for a, b in ARROWS:
        start, end = anchor(a, b), anchor(b, a)
        arrow = FancyArrowPatch(start, end, arrowstyle="-|>", mutation_scale=14, color="#333333", shrinkA=4, shrinkB=4)
        flow.add_patch(arrow)
    flow.set(xlim=(0, 9), ylim=(0.5, 5.8), title="a request's way (Serve deployments)")
    flow.axis("off")
    for i, (package, what) in enumerate(LAYERS):
        y = len(LAYERS) - i - 1
        box = FancyBboxPatch((0.1, y + 0.1), 4.8, 0.8, boxstyle="round,pad=0.02", fc="#f7f7f7", ec="#777777")
        layers.add_patch(box)
        layers.text(0.3, y + 0.62, package, va="center", fontsize=8.5, family="monospace", weight="bold")
        layers.text(0.3, y + 0.32, what, va="center", fontsize=7.5)
    layers.set(xlim=(0, 5), ylim=(0, len(LAYERS)), title="app/ in layers: each imports only those below it")
    layers.axis("off")
    fig.tight_layout()
    fig.savefig(OUT, dpi=100)
    return OUT


if __name__ == "__main__":
    print(main())
