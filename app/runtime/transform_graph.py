"""A model's declared transform (`app.imaging.transform`) as an ONNX graph, for images decoded on the GPU.

nvImageCodec hands over uint8 RGB [H, W, 3]; the graph makes of it what `Transform.apply` makes of the same image
decoded by OpenCV (BGR): uint8 [1, height, width, C] in the declared channel order. ONNX Runtime runs it on the CUDA EP
on a GPU node and on the CPU EP anywhere else (tests/test_transform_graph_unit.py compares it with the CPU path).

    image -> (shorter side: Slice to the middle MAX_ASPECT short sides) -> per plane: Slice, Squeeze, Cast float [h, w]
          -> linear, cubic: Resize to the computed size, then Slice the centre crop
             area:          MatMul(MatMul(Wh, plane), Ww^T), only the crop's rows and columns of the resampling matrices
          -> Concat in the declared order (or Mul, Sum by BT.601 luma: GRAY) -> Round, Clip, Cast uint8 -> Unsqueeze

The sizes are computed in the graph exactly as the CPU path computes them: the longer side becomes
floor(s * long / short) (integer Div; the same as Python's int(s * long / short) at any image size OpenCV decodes),
the crop starts at round((side - crop) / 2) (ONNX Round and Python's round both round half to even), an image whose
sides are more than MAX_ASPECT apart keeps the middle MAX_ASPECT short sides of its long side.

Interpolation, against cv2.resize's (half-pixel centres, replicated border, no antialiasing):
  linear -> Resize linear, half_pixel, antialias 0.
  cubic  -> Resize cubic, half_pixel, cubic_coeff_a -0.75 (OpenCV's), exclude_outside 0 (replicated border).
  area   -> no Resize mode matches INTER_AREA, a box filter. On the sample photographs shrunk to 1/2, 1/2.3 and
            224 x 224, Resize linear with antialias 1 (a triangle filter twice the cell) was up to 2.3 grey levels off
            per pixel on average (0.06-2.3 over 30 cases), cubic with antialias 1 up to 1.9, without antialias up to
            5.1. So area is computed as OpenCV defines it: output pixel i averages the input over [i n/m, (i+1) n/m],
            each input pixel weighted by its overlap; a matrix per axis built in the graph (Range, Min, Max, Relu),
            applied by two MatMuls. Enlarging, the CPU path resizes area declarations bilinearly (cv2.INTER_AREA would
            repeat pixels): then the matrices hold the bilinear weights (the triangle kernel at the clamped half-pixel
            source coordinate), chosen by Where.
OpenCV resamples uint8 with fixed-point weights (11 bits) and rounds each result; the graph resamples in float32 and
rounds once, so single pixels differ by one grey level (GRAY: the CPU path rounds the resized BGR, then the grey).
On the CUDA EP, TF32 MatMuls (the provider option use_tf32) may flip the rounding of area pixels: pass use_tf32=0.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from app.imaging.transform import MAX_ASPECT, Transform

INPUT = "image"
OUTPUT = "pixels"
MIN_OPSET = 18  # ReduceMin takes its axes as an input from opset 18 on
_LUMA_RGB = (0.299, 0.587, 0.114)  # ITU-R BT.601, what OpenCV's COLOR_BGR2GRAY computes (in fixed point)
# linear and cubic as cv2.resize computes them (see above); area is resampling matrices
_RESIZE: dict[str, Any] = {"coordinate_transformation_mode": "half_pixel", "cubic_coeff_a": -0.75, "exclude_outside": 0}

Provider = str | tuple[str, dict[str, Any]]


class _Graph:
    """Nodes and constants, each output named after its op."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.constants: list[onnx.TensorProto] = []

    def _name(self, kind: str) -> str:
        return f"{kind}_{len(self.nodes) + len(self.constants)}"

    def op(self, op_type: str, *inputs: str, **attrs: Any) -> str:
        out = self._name(op_type.lower())
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], **attrs))
        return out

    def i64(self, value: Any) -> str:
        return self._const(np.asarray(value, np.int64))

    def f32(self, value: Any) -> str:
        return self._const(np.asarray(value, np.float32))

    def _const(self, value: np.ndarray) -> str:
        name = self._name("const")
        self.constants.append(numpy_helper.from_array(value, name))
        return name

    def height_width(self, image: str) -> str:
        """int64 [2]: the first two dimensions of `image`."""
        return self.op("Slice", self.op("Shape", image), self.i64([0]), self.i64([2]))

    def at(self, vector: str, i: int) -> str:
        """The scalar vector[i]."""
        return self.op("Gather", vector, self.i64(i), axis=0)

    def to_float(self, value: str) -> str:
        return self.op("Cast", value, to=TensorProto.FLOAT)


def _geometry(g: _Graph, t: Transform) -> tuple[str, str, str]:
    """(the image to resample, the size it is resampled to, the crop's offset in the resampled image): uint8 HWC and
    two int64 [2], as `Transform.apply` computes them."""
    if t.resize_shorter is None:
        return INPUT, g.i64([t.height, t.width]), g.i64([0, 0])
    hw = g.height_width(INPUT)
    short = g.op("ReduceMin", hw, g.i64([0]), keepdims=1)
    keep = g.op("Min", hw, g.op("Mul", short, g.i64([MAX_ASPECT])))
    start = g.op("Div", g.op("Sub", hw, keep), g.i64([2]))
    cut = g.op("Slice", INPUT, start, g.op("Add", start, keep), g.i64([0, 1]))
    new = g.op("Div", g.op("Mul", keep, g.i64([t.resize_shorter])), short)
    spare = g.to_float(g.op("Sub", new, g.i64([t.height, t.width])))
    offset = g.op("Cast", g.op("Round", g.op("Div", spare, g.f32([2.0]))), to=TensorProto.INT64)
    return cut, new, offset


def _resampling_matrix(g: _Graph, n: str, m: str, first: str, count: int, enlarge: str) -> str:
    """float [count, n]: rows first .. first + count of the matrix that takes an axis of n pixels to m, area (each
    output pixel the overlap-weighted mean of the input over its cell) or, where `enlarge`, bilinear (half-pixel
    centres)."""
    nf, mf, start = g.to_float(n), g.to_float(m), g.to_float(first)
    scale = g.op("Div", nf, mf)
    out = g.op("Unsqueeze", g.op("Range", start, g.op("Add", start, g.f32(count)), g.f32(1.0)), g.i64([1]))
    src = g.op("Unsqueeze", g.op("Range", g.f32(0.0), nf, g.f32(1.0)), g.i64([0]))
    low = g.op("Mul", out, scale)
    high = g.op("Add", low, scale)
    overlap = g.op("Sub", g.op("Min", g.op("Add", src, g.f32(1.0)), high), g.op("Max", src, low))
    area = g.op("Div", g.op("Relu", overlap), scale)
    centre = g.op("Sub", g.op("Mul", g.op("Add", out, g.f32(0.5)), scale), g.f32(0.5))
    centre = g.op("Min", g.op("Max", centre, g.f32(0.0)), g.op("Sub", nf, g.f32(1.0)))
    linear = g.op("Relu", g.op("Sub", g.f32(1.0), g.op("Abs", g.op("Sub", src, centre))))
    return g.op("Where", enlarge, linear, area)


def _planes(g: _Graph, t: Transform, image: str, new: str, offset: str) -> list[str]:
    """uint8 HWC `image` -> its R, G and B planes, float [height, width] each: resampled to `new`, the crop at
    `offset`. One plane at a time, never NCHW: ONNX Runtime's transpose optimizer would move a Transpose round a Resize
    to cancel the output's, and its CPU kernel resamples NHWC cubically only when enlarging."""
    hw = g.height_width(image)
    if t.interpolation == "area":
        larger = g.op("Greater", new, hw)
        enlarge = g.op("Or", g.at(larger, 0), g.at(larger, 1))
        rows = _resampling_matrix(g, g.at(hw, 0), g.at(new, 0), g.at(offset, 0), t.height, enlarge)
        cols = _resampling_matrix(g, g.at(hw, 1), g.at(new, 1), g.at(offset, 1), t.width, enlarge)
        cols = g.op("Transpose", cols, perm=[1, 0])
    planes = []
    for c in range(3):
        plane = g.op("Squeeze", g.op("Slice", image, g.i64([c]), g.i64([c + 1]), g.i64([2])), g.i64([2]))
        plane = g.to_float(plane)
        if t.interpolation == "area":
            planes.append(g.op("MatMul", g.op("MatMul", rows, plane), cols))
            continue
        resized = g.op("Resize", plane, "", "", new, mode=t.interpolation, **_RESIZE)
        end = g.op("Add", offset, g.i64([t.height, t.width]))
        planes.append(g.op("Slice", resized, offset, end, g.i64([0, 1])))
    return planes


def transform_graph(t: Transform, opset: int = 18) -> onnx.ModelProto:
    """The ONNX graph of `t`: `image` uint8 [H, W, 3] RGB (any H, W) -> `pixels` uint8 [1, t.height, t.width,
    t.channels] in t.color's order, what `Transform.apply` makes of the same image in BGR."""
    if opset < MIN_OPSET:
        raise ValueError(f"the transform graph needs opset {MIN_OPSET} or later, got {opset}")
    g = _Graph()
    image, new, offset = _geometry(g, t)
    r, gr, b = _planes(g, t, image, new, offset)
    if t.color == "GRAY":
        weighted = [g.op("Mul", p, g.f32(w)) for p, w in zip((r, gr, b), _LUMA_RGB, strict=True)]
        channels = [g.op("Sum", *weighted)]
    else:
        channels = [r, gr, b] if t.color == "RGB" else [b, gr, r]
    y = g.op("Concat", *(g.op("Unsqueeze", p, g.i64([2])) for p in channels), axis=2)
    y = g.op("Cast", g.op("Clip", g.op("Round", y), g.f32(0.0), g.f32(255.0)), to=TensorProto.UINT8)
    g.nodes.append(helper.make_node("Unsqueeze", [y, g.i64([0])], [OUTPUT]))
    graph = helper.make_graph(
        g.nodes,
        f"transform_{t.height}x{t.width}_{t.interpolation}_{t.color}",
        [helper.make_tensor_value_info(INPUT, TensorProto.UINT8, ["height", "width", 3])],
        [helper.make_tensor_value_info(OUTPUT, TensorProto.UINT8, [1, t.height, t.width, t.channels])],
        g.constants,
    )
    opsets = [helper.make_opsetid("", opset)]
    model = helper.make_model(graph, opset_imports=opsets, producer_name="app.runtime.transform_graph")
    model.ir_version = helper.find_min_ir_version_for(opsets)  # what ONNX Runtime reads, not onnx's newest
    return model


class GraphTransform:
    """A Transform run by ONNX Runtime: RGB uint8 [H, W, 3] -> the model's pixels uint8 [1, height, width, C]."""

    def __init__(
        self,
        t: Transform,
        providers: Sequence[Provider] = ("CPUExecutionProvider",),
        options: ort.SessionOptions | None = None,
        opset: int = 18,
    ) -> None:
        self.transform = t
        self.model = transform_graph(t, opset)
        self.session = ort.InferenceSession(self.model.SerializeToString(), options, providers=list(providers))

    def __call__(self, rgb: np.ndarray) -> np.ndarray:
        out: np.ndarray = self.session.run([OUTPUT], {INPUT: _checked(rgb)})[0]
        return out

    def into(self, rgb: np.ndarray, ptr: int) -> None:
        """The pixels written to host memory at `ptr` (uint8 [1, height, width, C], a "cpu" DeviceBatch's row): the
        output bound by pointer, as CudaImageTransform.into binds a device row (the stand-in decoder's path)."""
        binding = self.session.io_binding()
        binding.bind_cpu_input(INPUT, _checked(rgb))
        binding.bind_output(OUTPUT, "cpu", 0, np.uint8, [1, *self.transform.shape], ptr)
        self.session.run_with_iobinding(binding)


def _checked(rgb: np.ndarray) -> np.ndarray:
    if rgb.dtype != np.uint8 or rgb.ndim != 3 or rgb.shape[2] != 3 or 0 in rgb.shape:
        raise ValueError(f"expected RGB uint8 [H, W, 3], got {rgb.dtype} {rgb.shape}")
    return np.ascontiguousarray(rgb)
