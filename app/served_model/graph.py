"""What an image classifier's ONNX graph takes and gives, read from the file without an inference engine.

One image input (4-D: a batch, a fixed height and width, 1 or 3 channels, NCHW or NHWC; uint8, float32
or float16) and a first output of one row of class scores per image ([N, C], or [N, C, 1, 1]).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

# ONNX TensorProto element types the Classifier can feed (numpy's names).
DTYPES = {2: "uint8", 1: "float32", 10: "float16"}


class GraphError(ValueError):
    """The graph is not a classifier this service can serve; the message says what it has."""


@dataclass(frozen=True)
class GraphIO:
    input_name: str
    input_shape: tuple[int | str | None, ...]  # symbolic dims as their name (or None)
    dtype: str  # uint8 | float32 | float16
    layout: str  # NCHW | NHWC
    height: int
    width: int
    channels: int
    output_name: str
    output_shape: tuple[int | str | None, ...]
    classes: int | None  # None when the output's class dimension is symbolic

    def describe_input(self) -> str:
        dims = ", ".join("N" if i == 0 else str(d) for i, d in enumerate(self.input_shape))
        return f"'{self.input_name}' {self.dtype} [{dims}] {self.layout}"

    def describe(self) -> dict[str, Any]:
        return {
            "input": {
                "name": self.input_name,
                "shape": [d if isinstance(d, int) else -1 for d in self.input_shape],
                "dtype": self.dtype,
                "layout": self.layout,
            },
            "output": {
                "name": self.output_name,
                "shape": [d if isinstance(d, int) else -1 for d in self.output_shape],
                "classes": self.classes,
            },
        }


def _dims(value_info: Any) -> tuple[int | str | None, ...]:
    return tuple(
        d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in value_info.type.tensor_type.shape.dim
    )


def graph_io_of(model: Any, source: str = "the graph") -> GraphIO:
    """The GraphIO of a loaded `onnx.ModelProto`; GraphError naming what does not fit."""
    g = model.graph
    initializers = {i.name for i in g.initializer}
    inputs = [i for i in g.input if i.name not in initializers]
    if len(inputs) != 1:
        raise GraphError(f"{source}: an image classifier has one input, this graph has {[i.name for i in inputs]}")
    inp = inputs[0]
    elem = inp.type.tensor_type.elem_type
    if elem not in DTYPES:
        raise GraphError(f"{source}: input {inp.name!r} has ONNX element type {elem}; uint8, float32 or float16 only")
    shape = _dims(inp)
    if len(shape) != 4:
        raise GraphError(f"{source}: input {inp.name!r} has shape {list(shape)}; an image batch has 4 dimensions")
    if shape[1] in (1, 3) and shape[3] not in (1, 3):
        layout, (c, h, w) = "NCHW", shape[1:]
    elif shape[3] in (1, 3):
        layout, (h, w, c) = "NHWC", shape[1:]
    else:
        raise GraphError(f"{source}: input {inp.name!r} has shape {list(shape)}: no channel axis of 1 or 3")
    if not isinstance(h, int) or not isinstance(w, int) or h <= 0 or w <= 0:
        raise GraphError(f"{source}: input {inp.name!r} needs a fixed height and width, has {list(shape)}")
    if not g.output:
        raise GraphError(f"{source}: the graph has no output")
    out = g.output[0]
    out_shape = _dims(out)
    rest = out_shape[1:]
    if not rest or any(isinstance(d, int) and d != 1 for d in rest[1:]):
        raise GraphError(f"{source}: output {out.name!r} has shape {list(out_shape)}; class scores are [N, C]")
    classes = rest[0] if isinstance(rest[0], int) and rest[0] > 0 else None
    assert isinstance(c, int)
    return GraphIO(inp.name, shape, DTYPES[elem], layout, h, w, c, out.name, out_shape, classes)


def read_graph(path: str | Path) -> GraphIO:
    """The GraphIO of the ONNX file at `path` (its weights are not read)."""
    import onnx

    if not Path(path).is_file():
        raise FileNotFoundError(f"model file not found: {path}")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as e:
        raise GraphError(f"{path} is not a readable ONNX file: {str(e).splitlines()[0]}") from e
    return graph_io_of(model, str(path))
