"""The model declaration (`args.model`): what the served classifier is called, what its output means, and how
an image becomes its input. Shared by every variant (FP32, INT8, ...) of that model.

What the graph itself says (input name, layout, dtype, size, channels; output classes) is read from the
graph, never declared; `check_against` refuses a declaration that contradicts it, naming the field. The
preprocessing is the model's own evaluation transform: serving it with another one changes answers.

    y = (x * scale - mean) / std     per channel, x the uint8 pixel in the graph's channel order

The geometry (decode, resize, crop, channel order) runs in the Preprocessor (`app.imaging.transform`); the
arithmetic, the layout and the dtype are folded into a copy of the graph at load (`app.served_model.prologue`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from app.served_model.graph import GraphIO
from app.served_model.labels import imagenet_labels
from app.served_model.source import ModelUri, Sha256, is_remote, local_part


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PreprocessDeclaration(_Strict):
    """How an image becomes the graph's input: geometry, channel order, normalisation."""

    resize_shorter: int | None = Field(
        None,
        gt=0,
        le=16384,
        description="resize so the shorter side is this many pixels, keeping the aspect ratio, then crop to the "
        "graph's input size; omit to squash the whole image to the input size",
    )
    crop: Literal["center"] | None = Field(
        None,
        description="center: crop the middle of the resized image to the graph's input size (needs resize_shorter)",
    )
    interpolation: Literal["area", "linear", "cubic"] = Field(
        "area",
        description="area: averages when shrinking (no aliasing; bilinear when enlarging); linear: bilinear; cubic: "
        "bicubic (what TensorFlow's and PIL's evaluation transforms use)",
    )
    color: Literal["RGB", "BGR", "GRAY"] = Field(
        "RGB", description="the channel order the graph expects; GRAY for a one-channel input"
    )
    scale: float = Field(1.0, gt=0, description="x * scale first (1/255 = 0.00392156862745098 for [0, 1] pixels)")
    mean: list[float] = Field(
        default_factory=lambda: [0.0],
        min_length=1,
        max_length=3,
        description="subtracted after scale, per channel in the graph's channel order (one value: every channel)",
    )
    std: list[float] = Field(
        default_factory=lambda: [1.0],
        min_length=1,
        max_length=3,
        description="divides after the mean, per channel (one value: every channel); never 0",
    )

    @field_validator("std")
    @classmethod
    def _std_nonzero(cls, v: list[float]) -> list[float]:
        if any(s == 0 for s in v):
            raise ValueError(f"std must not be 0, got {v}")
        return v

    @model_validator(mode="after")
    def _crop_after_resize(self) -> PreprocessDeclaration:
        if self.crop is not None and self.resize_shorter is None:
            raise ValueError(
                "crop: center crops after resize_shorter; set resize_shorter (e.g. 256 for a 224-pixel input) or "
                "remove crop to squash the image to the input size"
            )
        if self.resize_shorter is not None and self.crop is None:
            raise ValueError(
                f"resize_shorter ({self.resize_shorter}) keeps the aspect ratio, so the image must then be cut to "
                "the input size: add crop: center"
            )
        if len(self.mean) > 1 and len(self.std) > 1 and len(self.mean) != len(self.std):
            raise ValueError(f"mean has {len(self.mean)} values and std {len(self.std)}")
        return self

    @property
    def is_identity(self) -> bool:
        """No arithmetic: the pixel values reach the graph as they are."""
        return self.scale == 1.0 and set(self.mean) == {0.0} and set(self.std) == {1.0}

    def per_channel(self, channels: int) -> tuple[list[float], list[float]]:
        """(mean, std), each `channels` long (a single value applies to every channel)."""
        mean = self.mean * channels if len(self.mean) == 1 else list(self.mean)
        std = self.std * channels if len(self.std) == 1 else list(self.std)
        return mean, std


MODEL_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.]{0,63}$"


class ModelDeclaration(_Strict):
    """One classifier: its name everywhere, its labels, what its output is, and its own preprocessing."""

    name: str = Field(
        pattern=MODEL_NAME_PATTERN,
        description="in replies, /v1/models, the V2 model names (<name>, <name>-<variant>), metrics; letters, digits, "
        "'_' and '.' (V2 appends '-<variant>')",
    )
    labels_path: ModelUri | None = Field(
        None,
        description="one label per line, as many as the output has classes; default: the ImageNet-1k labels when "
        'the output has 1000 classes, else "class_<i>". A path (relative to the working directory), file://, or '
        "s3://, gs://, https:// (fetched by each Classifier, as model_path)",
    )
    labels_sha256: Sha256 = Field(None, description="the labels file's SHA-256, checked as a model file's")
    output: Literal["logits", "probabilities"] = Field(
        "logits",
        description="logits: the service applies softmax; probabilities: the graph already did, used as they are",
    )
    preprocess: PreprocessDeclaration = Field(default_factory=PreprocessDeclaration)

    def check_against(self, graph: GraphIO, labels: int | None = None, where: str = "") -> None:
        """Raise ValueError naming the field when this declaration contradicts `graph` (or `labels` lines)."""
        problems = self.problems(graph, labels)
        if problems:
            raise ValueError(f"{problems[0]}{f' ({where})' if where else ''}")

    def problems(self, graph: GraphIO, labels: int | None = None) -> list[str]:
        p, out = self.preprocess, []
        seen = f"the graph's input {graph.describe_input()}"
        for field in ("mean", "std"):
            values = getattr(p, field)
            if len(values) not in (1, graph.channels):
                out.append(
                    f"model.preprocess.{field}: {len(values)} values for {seen} with {graph.channels} channel(s)"
                )
        if graph.channels == 1 and p.color != "GRAY":
            out.append(f"model.preprocess.color: {p.color} for {seen}, which has one channel: use GRAY")
        if graph.channels == 3 and p.color == "GRAY":
            out.append(f"model.preprocess.color: GRAY for {seen}, which has 3 channels: RGB or BGR")
        if graph.dtype == "uint8" and not p.is_identity:
            out.append(
                f"model.preprocess.scale/mean/std: {seen} takes uint8 pixels, so any normalisation is inside the "
                "graph; leave scale 1, mean [0], std [1]"
            )
        need = max(graph.height, graph.width)
        if p.resize_shorter is not None and p.resize_shorter < need:
            out.append(
                f"model.preprocess.resize_shorter: {p.resize_shorter} is smaller than {seen}: the centre crop of "
                f"{graph.height}x{graph.width} needs a shorter side of at least {need}"
            )
        if labels is not None and graph.classes is not None and labels != graph.classes:
            out.append(f"model.labels_path: {labels} labels for a graph output of {graph.classes} classes")
        return out

    def label_count(self) -> int | None:
        """Lines of `labels_path` when it is readable here (None: no file declared, a remote one, or not on this
        machine)."""
        if self.labels_path is None or is_remote(self.labels_path) or not Path(local_part(self.labels_path)).is_file():
            return None
        return len(Path(local_part(self.labels_path)).read_text("utf-8").splitlines())

    def labels(self, classes: int | None) -> list[str]:
        """One label per class: `labels_path`'s lines, else ImageNet-1k's for 1000 classes, else "class_<i>".

        FileNotFoundError when `labels_path` is not here (a remote one is fetched first, `app.runtime.model_files`);
        ValueError (naming the field) when it has another count."""
        if self.labels_path is not None:
            path = Path(local_part(self.labels_path)).absolute()
            if not path.is_file():
                raise FileNotFoundError(f"model.labels_path: labels file not found: {path}")
            lines = path.read_text("utf-8").splitlines()
            if classes is not None and len(lines) != classes:
                raise ValueError(
                    f"model.labels_path: {len(lines)} labels in {path} for a graph output of {classes} classes"
                )
            return lines
        if classes == 1000:
            return imagenet_labels()
        return [f"class_{i}" for i in range(classes or 0)]
