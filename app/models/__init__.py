"""Build the default model, quantize it to INT8, and report what INT8 costs and buys.

    python -m app.models build      # FP32 ONNX from the ImageNet weights, plus labels
    python -m app.models quantize   # INT8 by post-training static quantization, then the report
    python -m app.models report     # the quality and speed report for an FP32/INT8 pair
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

MODEL_NAME = "efficientnet_lite0"


def model_dir() -> Path:
    """Where models live: $APP_MODEL_DIR, else ./models of the working directory."""
    return Path(os.environ.get("APP_MODEL_DIR", "models")).absolute()


@dataclass(frozen=True)
class ModelFiles:
    root: Path

    @property
    def fp32(self) -> Path:
        return self.root / f"{MODEL_NAME}-fp32.onnx"

    @property
    def int8(self) -> Path:
        return self.root / f"{MODEL_NAME}-int8.onnx"

    @property
    def labels(self) -> Path:
        return self.root / f"{MODEL_NAME}-labels.txt"

    @property
    def report_json(self) -> Path:
        return self.root / f"{MODEL_NAME}-report.json"

    @property
    def report_md(self) -> Path:
        return self.root / f"{MODEL_NAME}-report.md"


def default_files(root: Path | None = None) -> ModelFiles:
    return ModelFiles(root or model_dir())
