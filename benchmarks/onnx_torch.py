"""The served ONNX graph run by PyTorch, node by node: the torch-fp32 and torch-fp16 targets of benchmarks/gpu_check.py.

The model is an ONNX file built without torch (app/models/), so there is no torch module to load. This is a small
interpreter instead: each ONNX node becomes the torch op that computes the same thing, with the file's own weights,
in the graph's order; nothing is re-exported, renamed or fused. It covers the operators EfficientNet-Lite uses
(Cast/Sub/Mul/Transpose prologue, Conv, Clip as ReLU6, Add, GlobalAveragePool, Flatten, Gemm) and a few of their
plain relatives; a graph with any other operator is refused by name (UnsupportedGraph), never run approximately.
Benchmarks only: the service does not import torch (tests/test_layering.py).

    module = load(path).to(device)          # FP32
    half = load(path).to(device).half().to(memory_format=torch.channels_last)   # FP16, NHWC kernels
    logits = module(torch.from_numpy(uint8_nhwc_batch).to(device))
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch
import torch.nn.functional as F
from onnx import numpy_helper

_FLOAT = onnx.TensorProto.FLOAT


class UnsupportedGraph(ValueError):
    """The graph uses an operator, attribute or shape this interpreter does not run exactly."""


def _attrs(node: onnx.NodeProto) -> dict[str, Any]:
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


class OnnxModule(torch.nn.Module):
    """An ONNX graph as a torch module: its initializers are the module's parameters (so .half(), .to(device) and
    channels_last apply to them), its nodes run in order in forward()."""

    def __init__(self, model: onnx.ModelProto) -> None:
        super().__init__()
        graph = model.graph
        self.input_name = graph.input[0].name
        tensor_type = graph.input[0].type.tensor_type
        self.input_shape = tuple(d.dim_value for d in tensor_type.shape.dim[1:])  # after the batch dimension
        self.input_dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor_type.elem_type)
        self.output_name = graph.output[0].name
        self._param_name: dict[str, str] = {}
        self.constants: dict[str, np.ndarray] = {}
        for init in graph.initializer:
            array = numpy_helper.to_array(init)
            self.constants[init.name] = array
            attr = f"p{len(self._param_name)}"
            self._param_name[init.name] = attr
            tensor = torch.from_numpy(array.copy())
            # Parameters, not buffers: Module.to(memory_format=channels_last) converts parameters and buffers alike,
            # and parameters are what state_dict users expect; no gradients are ever taken.
            self.register_parameter(attr, torch.nn.Parameter(tensor, requires_grad=False))
        unknown = sorted({n.op_type for n in graph.node if n.op_type not in _OPS})
        if unknown:
            raise UnsupportedGraph(f"operators not covered by benchmarks/onnx_torch.py: {', '.join(unknown)}")
        self.steps: list[tuple[Callable[..., torch.Tensor], list[str], str, dict[str, Any]]] = []
        for node in graph.node:
            if len(node.output) != 1:
                raise UnsupportedGraph(f"{node.op_type} {node.name}: {len(node.output)} outputs")
            attrs = _attrs(node)
            _check(node, attrs, self.constants)
            self.steps.append((_OPS[node.op_type], list(node.input), node.output[0], attrs))
        self.nodes = [f"{n.op_type} {n.name}" for n in graph.node]

    def value(self, name: str, env: dict[str, torch.Tensor]) -> torch.Tensor:
        if name in env:
            return env[name]
        return getattr(self, self._param_name[name])

    def dummy_batch(self, n: int) -> np.ndarray:
        """n images of mid grey in the graph's input layout, as OrtEngine.dummy_batch makes them."""
        return np.full((n, *self.input_shape), 127, dtype=self.input_dtype)

    @property
    def float_dtype(self) -> torch.dtype:
        """The dtype the graph's float tensors take: FP32, or FP16 after .half()."""
        return next((p.dtype for p in self.parameters() if p.is_floating_point()), torch.float32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        env: dict[str, torch.Tensor] = {self.input_name: x}
        for op, inputs, output, attrs in self.steps:
            env[output] = op(self, [self.value(i, env) if i else None for i in inputs], attrs)
        return env[self.output_name]


def load(path: str | Path) -> OnnxModule:
    """The ONNX file at `path` as an OnnxModule in eval mode on the CPU, FP32."""
    return OnnxModule(onnx.load(str(path))).eval()


# --------------------------------------------------------------------------- the operators

Args = list[Any]


def _check(node: onnx.NodeProto, attrs: dict[str, Any], constants: dict[str, np.ndarray]) -> None:
    """Refuse what the op functions below do not compute exactly as ONNX defines it."""
    where = f"{node.op_type} {node.name}"
    if node.op_type == "Cast" and attrs.get("to") != _FLOAT:
        raise UnsupportedGraph(f"{where}: Cast to {attrs.get('to')} (only to FLOAT)")
    if node.op_type == "Conv":
        if attrs.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
            raise UnsupportedGraph(f"{where}: auto_pad")
        if len(attrs.get("kernel_shape", [0, 0])) != 2:
            raise UnsupportedGraph(f"{where}: not a 2-D convolution")
    if node.op_type == "Clip" and any(i and i not in constants for i in node.input[1:]):
        raise UnsupportedGraph(f"{where}: min/max not constant")
    if node.op_type == "Gemm" and attrs.get("transA", 0):
        raise UnsupportedGraph(f"{where}: transA")
    if node.op_type == "Flatten" and attrs.get("axis", 1) != 1:
        raise UnsupportedGraph(f"{where}: axis {attrs['axis']}")


def _cast(m: OnnxModule, a: Args, attrs: dict[str, Any]) -> torch.Tensor:
    return a[0].to(m.float_dtype)  # FLOAT: the module's float type (FP16 after .half(), as the whole graph then is)


def _conv(m: OnnxModule, a: Args, attrs: dict[str, Any]) -> torch.Tensor:
    x, w, b = a[0], a[1], a[2] if len(a) > 2 else None
    top, left, bottom, right = attrs.get("pads", [0, 0, 0, 0])
    stride, dilation = attrs.get("strides", [1, 1]), attrs.get("dilations", [1, 1])
    if (top, left) != (bottom, right):  # TF-style "same" padding: more after than before; pad first, exactly
        x, padding = F.pad(x, (left, right, top, bottom)), [0, 0]
    else:
        padding = [top, left]
    return F.conv2d(x, w, b, stride=stride, padding=padding, dilation=dilation, groups=attrs.get("group", 1))


def _clip(m: OnnxModule, a: Args, attrs: dict[str, Any]) -> torch.Tensor:
    lo, hi = a[1], a[2] if len(a) > 2 else None
    return torch.clamp(a[0], None if lo is None else lo.to(a[0].dtype), None if hi is None else hi.to(a[0].dtype))


def _gemm(m: OnnxModule, a: Args, attrs: dict[str, Any]) -> torch.Tensor:
    x, w, c = a[0], a[1], a[2] if len(a) > 2 else None
    w = w if attrs.get("transB", 0) else w.t()
    y = F.linear(x, w) * attrs.get("alpha", 1.0)
    return y if c is None else y + c * attrs.get("beta", 1.0)


def _reduce_mean(m: OnnxModule, a: Args, attrs: dict[str, Any]) -> torch.Tensor:
    axes = attrs.get("axes") or (a[1].tolist() if len(a) > 1 and a[1] is not None else list(range(a[0].dim())))
    return a[0].mean(dim=axes, keepdim=bool(attrs.get("keepdims", 1)))


_OPS: dict[str, Callable[[OnnxModule, Args, dict[str, Any]], torch.Tensor]] = {
    "Cast": _cast,
    "Sub": lambda m, a, attrs: a[0] - a[1],
    "Mul": lambda m, a, attrs: a[0] * a[1],
    "Add": lambda m, a, attrs: a[0] + a[1],
    "Div": lambda m, a, attrs: a[0] / a[1],
    "Transpose": lambda m, a, attrs: a[0].permute(*attrs["perm"]),
    "Conv": _conv,
    "Clip": _clip,
    "Relu": lambda m, a, attrs: F.relu(a[0]),
    "GlobalAveragePool": lambda m, a, attrs: a[0].mean(dim=(2, 3), keepdim=True),
    "ReduceMean": _reduce_mean,
    "Flatten": lambda m, a, attrs: torch.flatten(a[0], 1),
    "Gemm": _gemm,
    "MatMul": lambda m, a, attrs: torch.matmul(a[0], a[1]),
}
