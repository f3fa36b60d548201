"""The model as the service serves it: which files make the built-in model, its declaration (declaration.py), the
graph it is checked against (graph.py), how its inputs are prepared and its outputs read (model_io.py, prologue.py,
outputs.py), and what ONNX Runtime's INT8 kernels need of its weights (u8s8.py). Serving-time code: the offline
toolchain that builds, quantizes and reports on models is `app.toolchain` (`python -m app.models`)."""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from app.imaging.transform import Transform

MODEL_NAME = "efficientnet_lite0"

# The built-in model's declaration (declaration.py), as configs/local.yaml and prod.yaml spell it out:
# EfficientNet-Lite's published evaluation transform (tensorflow/tpu, models/official/efficientnet/
# preprocessing.py: the centre 224/256 of the shorter side, bicubic to 224), which is the same region at the same
# scale as "shorter side to 256, then the centre 224". Its normalisation, (x - 127) / 128, is inside the graph.
BUILTIN_MODEL: dict[str, Any] = {
    "name": MODEL_NAME,
    "preprocess": {"resize_shorter": 256, "crop": "center", "interpolation": "cubic", "color": "RGB"},
}

# What a build of the FP32 model is made for: INT8 for ONNX Runtime's CPU kernels or for TensorRT
# (app.toolchain.quantize), or FP16 for the CUDA EP's FP16 kernels on a GPU without TensorRT (app.toolchain.fp16).
Int8Target = Literal["cpu", "tensorrt"]
Target = Literal["cpu", "tensorrt", "fp16"]
INT8_TARGETS: tuple[Int8Target, ...] = ("cpu", "tensorrt")
TARGETS: tuple[Target, ...] = (*INT8_TARGETS, "fp16")


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
        """INT8 for TensorRT's explicit quantization (app.toolchain.quantize, target tensorrt)."""
        return self.root / f"{MODEL_NAME}-int8-trt.onnx"

    @property
    def fp16(self) -> Path:
        """FP16 for the CUDA EP (app.toolchain.fp16, target fp16): the int8 variant's fallback without TensorRT."""
        return self.root / f"{MODEL_NAME}-fp16.onnx"

    def int8_for(self, target: Int8Target) -> Path:
        return self.int8_trt if target == "tensorrt" else self.int8

    @property
    def labels(self) -> Path:
        return self.root / f"{MODEL_NAME}-labels.txt"


def default_files(root: Path | None = None) -> ModelFiles:
    return ModelFiles(root or model_dir())


def builtin_transform(size: int = 224) -> Transform:
    """The Preprocessor's half of the built-in declaration at its input size: what the app serves the built-in
    model, for tools and peers that prepare its images themselves."""
    from app.imaging.transform import Transform  # OpenCV: not loaded for the config's sake (app-haproxy, parse pool)

    p = BUILTIN_MODEL["preprocess"]
    return Transform(size, size, 3, p["resize_shorter"], p["interpolation"], p["color"])


def is_builtin_file(path: str | Path) -> bool:
    """Whether `path` names one of the built-in model's files (wherever they live)."""
    files = ModelFiles(Path(path).parent)
    return Path(path).name in (files.fp32.name, files.int8.name, files.int8_trt.name, files.fp16.name)


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
