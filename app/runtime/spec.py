"""What a served graph expects and returns, read from the engine, never assumed."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


class ModelLoadError(RuntimeError):
    """A model file is missing, corrupt, or could not be placed where it must run."""


@dataclass(frozen=True)
class ModelSpec:
    input_name: str
    input_shape: tuple[int | str | None, ...]
    input_dtype: str  # ONNX Runtime's spelling, e.g. "tensor(uint8)", whatever the engine
    output_names: tuple[str, ...]
    height: int
    width: int
    layout: str  # "NHWC" or "NCHW"
    channels: int = 3

    def sample_shape(self) -> tuple[int, int, int]:
        """One image's shape (no batch dimension)."""
        if self.layout == "NHWC":
            return (self.height, self.width, self.channels)
        return (self.channels, self.height, self.width)

    def batch_shape(self, n: int) -> tuple[int, ...]:
        return (n, *self.sample_shape())

    def describe(self) -> dict[str, Any]:
        return {
            "input": {"name": self.input_name, "shape": list(self.input_shape), "dtype": self.input_dtype},
            "outputs": list(self.output_names),
            "layout": self.layout,
            "size": [self.height, self.width],
        }


def spec_from_io(inputs: Sequence[tuple[str, tuple[Any, ...], str]], outputs: Sequence[str]) -> ModelSpec:
    """`inputs`: (name, shape with symbolic dims as str/None, ORT type string) of each graph input."""
    if len(inputs) != 1:
        raise ModelLoadError(f"expected a model with one image input, found {[i[0] for i in inputs]}")
    name, raw_shape, dtype = inputs[0]
    shape = tuple(d if isinstance(d, int) else None for d in raw_shape)
    if len(shape) != 4:
        raise ModelLoadError(f"input {name!r} has shape {list(raw_shape)}; an image batch needs 4 dimensions")
    if shape[1] in (1, 3) and shape[3] not in (1, 3):  # the rule of app.served_model.graph, which reads the file
        layout, (c, h, w) = "NCHW", shape[1:]
    else:
        layout, (h, w, c) = "NHWC", shape[1:]
    if not isinstance(h, int) or not isinstance(w, int) or c not in (1, 3):
        raise ModelLoadError(f"input {name!r} needs a fixed spatial size and 1 or 3 channels, has {list(raw_shape)}")
    assert isinstance(c, int)
    return ModelSpec(name, tuple(raw_shape), dtype, tuple(outputs), h, w, layout, c)


def read_onnx_input(path: str) -> tuple[str, tuple[int, ...]] | None:
    """(input name, one image's shape) from the ONNX file's graph, without an inference engine.

    None when the graph does not have exactly one 4-D image input with a fixed image size.
    """
    import onnx

    model = onnx.load(path, load_external_data=False)
    initializers = {i.name for i in model.graph.initializer}
    inputs = [i for i in model.graph.input if i.name not in initializers]
    if len(inputs) != 1:
        return None
    dims = inputs[0].type.tensor_type.shape.dim
    sample = tuple(d.dim_value for d in dims[1:])
    if len(sample) != 3 or not all(sample):
        return None
    return inputs[0].name, sample
