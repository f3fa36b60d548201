"""What a Classifier serves for its variant: the served graph, the image transform and the labels, made once from
the model declaration (`args.model`) and the variant's graph, and refused, naming the field, when they disagree."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from app.errors import ServiceError
from app.imaging.preprocess import preprocess
from app.imaging.transform import Transform
from app.served_model.declaration import ModelDeclaration
from app.served_model.graph import GraphError, GraphIO, read_graph
from app.served_model.outputs import probabilities
from app.served_model.prologue import ServedModel, normalise, served_model


def transform_for(model: ModelDeclaration, graph: GraphIO) -> Transform:
    """The Preprocessor's half of the declaration, at the graph's input size."""
    p = model.preprocess
    return Transform(graph.height, graph.width, graph.channels, p.resize_shorter, p.interpolation, p.color)


def transform_of(model: ModelDeclaration, files: Sequence[tuple[str, Path]]) -> Transform | None:
    """The model's transform from the first of `files` (field, path) on this machine; None where none is. One for every
    variant: the variants of a model take the same input (`app.served_model.check`)."""
    for _, path in files:
        if path.is_file():
            return transform_for(model, read_graph(path))
    return None


def check_transform(expected: dict[str, Any] | None, actual: Transform, where: str) -> None:
    """ValueError when the transform the deploy read from its copy of the model's files (`expected`, the Router's,
    None: none was read) is not `actual`, the one this node's file gives: the nodes hold different files under one
    path, and every request would be decoded to a shape the model refuses."""
    read = Transform.from_dict(expected) if expected is not None else None
    if read is not None and read != actual:
        raise ValueError(
            f"{where}: this node's model file wants {transform_said(actual)}, but the deploy read "
            f"{transform_said(read)} from its own copy: the nodes' model files differ"
        )


def transform_said(t: Transform) -> str:
    return f"{t.height}x{t.width}x{t.channels} {t.color} (shorter side {t.resize_shorter}, {t.interpolation})"


@dataclass(frozen=True)
class ModelIO:
    served: ServedModel
    transform: Transform
    labels: list[str]
    output: str  # logits | probabilities

    @property
    def graph(self) -> GraphIO:
        return self.served.graph

    def probabilities(self, scores: np.ndarray) -> np.ndarray:
        return probabilities(scores, self.output)

    def checked(self, array: np.ndarray) -> np.ndarray:
        """`array` if it is a batch of this model's pixels (uint8 [N, H, W, C]); else invalid_parameter (422)."""
        want = self.transform.shape
        if array.ndim != 4 or tuple(array.shape[1:]) != want or array.dtype != np.uint8:
            raise ServiceError(
                "invalid_parameter",
                f"pixels must be uint8 [N, {', '.join(map(str, want))}], got {array.dtype} {array.shape}",
            )
        return array

    def describe(self, model: ModelDeclaration) -> dict[str, Any]:
        """`describe()["input"]` of a Classifier: what it takes, what its graph takes, and what lies between."""
        g, t = self.graph, self.transform
        mean, std = model.preprocess.per_channel(g.channels)
        return {
            "size": [g.height, g.width],
            "channels": g.channels,
            "classes": g.classes,
            "pixels": {"dtype": "uint8", "shape": [-1, *t.shape], "order": t.color},
            "graph": g.describe(),
            "transform": t.to_dict(),
            "normalisation": {"scale": model.preprocess.scale, "mean": mean, "std": std},
            "output": self.output,
            **self.served.describe(),
        }


def model_io(model: ModelDeclaration, path: Path, where: str) -> ModelIO:
    """The ModelIO of the model file at `path` (a variant's, named `where` in errors); ValueError naming the field."""
    try:
        served = served_model(path, model.preprocess)
    except FileNotFoundError:
        raise ValueError(f"{where}: model file not found: {path}") from None
    except GraphError as e:
        raise ValueError(f"{where}: {e}") from None
    model.check_against(served.graph, model.label_count(), where)
    try:
        labels = model.labels(served.graph.classes)
    except FileNotFoundError as e:
        raise ValueError(str(e)) from None
    return ModelIO(served, transform_for(model, served.graph), labels, model.output)


@dataclass(frozen=True)
class Preparation:
    """Encoded images -> the graph's own input, exactly as served: `preprocess` with the model's transform (what the
    Preprocessor runs), then the prologue's arithmetic (what the served graph computes in front of the model).
    Calibration feeds the unwrapped graph with it; the INT8 build then sees the values it is served."""

    model: ModelDeclaration
    graph: GraphIO

    @property
    def transform(self) -> Transform:
        return transform_for(self.model, self.graph)

    def pixels(self, images: Sequence[bytes]) -> np.ndarray:
        """uint8 [N, H, W, C]: what the Preprocessor sends a Classifier."""
        t = self.transform
        return np.stack([preprocess(b, t) for b in images]) if images else np.zeros((0, *t.shape), np.uint8)

    def __call__(self, images: Sequence[bytes]) -> np.ndarray:
        return normalise(self.pixels(images), self.model.preprocess, self.graph)
