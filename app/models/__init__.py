"""Build the default model, quantize it to INT8, and report what INT8 costs and buys.

    python -m app.models build      # FP32 ONNX from the ImageNet weights, plus labels
    python -m app.models quantize   # INT8 by post-training static quantization, then the report
    python -m app.models quantize --target tensorrt   # the symmetric S8S8 INT8 that TensorRT can build
    python -m app.models report     # the quality and speed report for an FP32/INT8 pair (and the TensorRT INT8)
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

MODEL_NAME = "efficientnet_lite0"

# What an INT8 model is quantized for (app.models.quantize): ONNX Runtime's CPU kernels, or TensorRT.
Target = Literal["cpu", "tensorrt"]
TARGETS: tuple[Target, ...] = ("cpu", "tensorrt")


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
    def int8_trt(self) -> Path:
        """INT8 for TensorRT's explicit quantization (app.models.quantize, target tensorrt)."""
        return self.root / f"{MODEL_NAME}-int8-trt.onnx"

    def int8_for(self, target: Target) -> Path:
        return self.int8_trt if target == "tensorrt" else self.int8

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
