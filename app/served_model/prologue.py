"""The served graph: a copy of a model's graph that takes uint8 pixels, with its declared normalisation inside.

A Classifier receives uint8 [N, H, W, C] (4x fewer bytes than float32 in the object store) in the channel
order the model declares. Whatever else the graph wants is added in front of it, once, at load:

    NCHW graph:  pixels uint8 [N, H, W, C] -> Transpose (to NCHW, still uint8) -> Cast float32
                     -> Conv 1x1, one group per channel, weight a, bias -b -> (Cast float16) -> the graph's input
    NHWC graph:  pixels -> Cast float32 -> Mul a -> Sub b -> (Cast float16) -> the graph's input

with a = scale / std and b = mean / std per channel, so y = x * a - b = (x * scale - mean) / std. Each step
is there only if needed: the built-in model (uint8 NHWC, normalisation already inside) is served as it is.
Why a Conv rather than Mul and Sub on NCHW (measured, docs/model.md "Serve your own model"): the engines re-lay
the input for their first convolution, and ONNX Runtime's layout pass moves the Transpose behind the
arithmetic, so a per-channel Mul and Sub end up broadcasting over an innermost axis of 3: on EfficientNet-
Lite1's INT8 build that cost ~1.1 ms per image on one core, a quarter of the model, where the 1x1 depthwise
Conv costs ~0.1, and OpenVINO and ONNX Runtime's FP32 kernels run it as fast as the elementwise pair. An
output of [N, C, 1, 1] is flattened to [N, C].

The served file is written once per model file and declaration, content-addressed, under
$APP_SERVED_MODEL_DIR (default: <tmp>/app-served-models), atomically, so replicas on one node share it.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from app.served_model import atomic_write
from app.served_model.declaration import PreprocessDeclaration
from app.served_model.graph import GraphIO, graph_io_of

PIXELS = "pixels"  # the served graph's input
# protobuf's own limit on one message; a larger model keeps its weights in an external data file.
_PROTOBUF_LIMIT = 2**31 - 1


@dataclass(frozen=True)
class Prologue:
    """What goes in front of (and behind) one graph; `steps` names each op, in order, for /v1/models."""

    transpose: bool
    cast: str | None  # "float32" when the graph takes floats
    scale: np.ndarray | None  # a, per channel (None with shift None: no arithmetic)
    shift: np.ndarray | None  # b, per channel
    half: bool  # a final Cast to float16
    flatten: bool  # the first output is [N, C, 1, 1]

    @property
    def affine(self) -> bool:
        return self.scale is not None or self.shift is not None

    @property
    def steps(self) -> list[str]:
        arithmetic = ["Conv"] if self.transpose else ["Mul", "Sub"]
        names = [
            ("Transpose", self.transpose),
            ("Cast", self.cast is not None),
            *((op, self.affine) for op in arithmetic),
            ("Cast(float16)", self.half),
            ("Flatten", self.flatten),
        ]
        return [n for n, on in names if on]

    def describe(self) -> dict[str, Any]:
        return {
            "steps": self.steps,
            "scale": None if self.scale is None else [float(v) for v in self.scale],
            "shift": None if self.shift is None else [float(v) for v in self.shift],
        }


def prologue_for(prep: PreprocessDeclaration, graph: GraphIO) -> Prologue:
    """The ops `graph` needs in front of it to take uint8 [N, H, W, C] pixels normalised as `prep` declares."""
    mean, std = prep.per_channel(graph.channels)
    a = np.array([prep.scale / s for s in std], np.float32)
    b = np.array([m / s for m, s in zip(mean, std, strict=True)], np.float32)
    floats = graph.dtype != "uint8"
    affine = floats and (np.any(a != 1.0) or np.any(b != 0.0))
    return Prologue(
        transpose=graph.layout == "NCHW",
        cast="float32" if floats else None,
        scale=a if affine else None,
        shift=b if affine else None,
        half=graph.dtype == "float16",
        flatten=len(graph.output_shape) > 2,
    )


def normalise(pixels: np.ndarray, prep: PreprocessDeclaration, graph: GraphIO) -> np.ndarray:
    """What the prologue computes, in numpy: uint8 [N, H, W, C] -> the graph's own input (calibration, the report).

    x * a - b is computed exactly (float64 holds the product of an 8-bit pixel and a float32 exactly) and rounded
    once to float32, as a fused multiply-add would: the INT8 build is calibrated on the values it is served, to
    float32's last bit (tests/test_prologue.py compares the two)."""
    p = prologue_for(prep, graph)
    x: np.ndarray = pixels.transpose(0, 3, 1, 2) if p.transpose else pixels
    if p.cast is None:
        return np.ascontiguousarray(x)
    if p.scale is None or p.shift is None:
        y = x.astype(np.float32)
    else:
        shape = (-1, 1, 1) if p.transpose else (-1,)
        a, b = p.scale.astype(np.float64).reshape(shape), p.shift.astype(np.float64).reshape(shape)
        y = (x * a - b).astype(np.float32)
    return np.ascontiguousarray(y.astype(np.float16) if p.half else y)


class _Names:
    """Fresh tensor and node names: none may clash with any name the user's graph already has."""

    def __init__(self, model: onnx.ModelProto) -> None:
        g = model.graph
        self.taken = {i.name for i in g.input} | {o.name for o in g.output} | {i.name for i in g.initializer}
        self.taken |= {t for n in g.node for t in (*n.input, *n.output, n.name)}

    def fresh(self, wanted: str) -> str:
        name, k = wanted, 0
        while name in self.taken:
            k += 1
            name = f"{wanted}_{k}"
        self.taken.add(name)
        return name


def with_prologue(model: onnx.ModelProto, prologue: Prologue, graph: GraphIO) -> onnx.ModelProto:
    """A copy of `model` that takes `pixels` uint8 [N, H, W, C] through `prologue` (and flattens its output)."""
    served = onnx.ModelProto()
    served.CopyFrom(model)
    g, names = served.graph, _Names(served)
    pixels = names.fresh(PIXELS)
    batch = graph.input_shape[0] if isinstance(graph.input_shape[0], int | str) else "N"
    nodes: list[onnx.NodeProto] = []
    x = pixels

    def step(op: str, *inputs: str, **attrs: Any) -> None:
        nonlocal x
        out = names.fresh(f"{pixels}.{op.lower()}")
        nodes.append(helper.make_node(op, [x, *inputs], [out], name=out, **attrs))
        x = out

    def const(name: str, value: np.ndarray) -> str:
        name = names.fresh(f"{pixels}.{name}")
        g.initializer.append(numpy_helper.from_array(value, name))
        return name

    if prologue.transpose:
        step("Transpose", perm=[0, 3, 1, 2])
    if prologue.cast is not None:
        step("Cast", to=TensorProto.FLOAT)
    if prologue.scale is not None and prologue.shift is not None:
        a, b = prologue.scale, prologue.shift
        if prologue.transpose:  # y = a * x + (-b), one 1x1 filter per channel
            c = len(a)
            step("Conv", const("scale", a.reshape(c, 1, 1, 1)), const("shift", -b), group=c, kernel_shape=[1, 1])
        else:
            step("Mul", const("scale", a))
            step("Sub", const("shift", b))
    if prologue.half:
        step("Cast", to=TensorProto.FLOAT16)
    if nodes:
        nodes[-1].output[0] = graph.input_name  # the last step feeds the graph's own input tensor
        g.input.remove(next(i for i in g.input if i.name == graph.input_name))
        dims = [batch, graph.height, graph.width, graph.channels]
        g.input.insert(0, helper.make_tensor_value_info(pixels, TensorProto.UINT8, dims))
        for node in reversed(nodes):
            g.node.insert(0, node)
    if prologue.flatten:
        out = g.output[0]
        flat = names.fresh(f"{out.name}.flat")
        g.node.append(helper.make_node("Flatten", [out.name], [flat], name=flat, axis=1))
        elem = out.type.tensor_type.elem_type
        g.output.remove(out)
        g.output.insert(0, helper.make_tensor_value_info(flat, elem, [batch, graph.classes or "C"]))
    return served


@dataclass(frozen=True)
class ServedModel:
    """A model file as a Classifier runs it: the served file, the graph it wraps, and what was added."""

    path: Path
    source: Path
    graph: GraphIO
    prologue: Prologue

    def describe(self) -> dict[str, Any]:
        return {"file": str(self.source), "served_file": str(self.path), "prologue": self.prologue.describe()}


def served_dir() -> Path:
    return Path(os.environ.get("APP_SERVED_MODEL_DIR") or Path(tempfile.gettempdir()) / "app-served-models")


def _digest(path: Path, prologue: Prologue) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    h.update(json.dumps(prologue.describe(), sort_keys=True).encode())
    return h.hexdigest()[:20]


def served_model(path: str | Path, prep: PreprocessDeclaration, cache: Path | None = None) -> ServedModel:
    """The file a Classifier loads for the model at `path` declared as `prep`: itself when it already takes uint8
    NHWC pixels and its output is [N, C], else its served copy (written once, then reused)."""
    source = Path(path)
    model = onnx.load(str(source), load_external_data=False)
    graph = graph_io_of(model, str(source))
    prologue = prologue_for(prep, graph)
    if not prologue.steps:
        return ServedModel(source, source, graph, prologue)
    cache = cache or served_dir()
    out = cache / f"{source.stem}.{_digest(source, prologue)}.onnx"
    if not out.is_file():
        full = onnx.load(str(source))  # with any external data, beside the source
        _write(with_prologue(full, prologue, graph), out)
    return ServedModel(out, source, graph, prologue)


def _write(model: onnx.ModelProto, out: Path) -> None:
    """Atomically: a temporary name in the same directory, then a rename (weights beside it past 2 GB)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    if model.ByteSize() < _PROTOBUF_LIMIT:
        atomic_write(out, model.SerializeToString())
        return
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        staged = Path(tmp) / out.name
        onnx.save_model(model, str(staged), save_as_external_data=True, location=out.name + ".data")
        os.replace(Path(tmp) / (out.name + ".data"), out.parent / (out.name + ".data"))
        os.replace(staged, out)
