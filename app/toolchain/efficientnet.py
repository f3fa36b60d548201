"""EfficientNet-Lite as an ONNX graph, written with onnx.helper from a numpy state dict.

The built-in model (Lite0) takes `image`: uint8 [N, 224, 224, 3] RGB and returns
`logits`: float32 [N, 1000]. Normalisation ((x - 127) / 128) and the NHWC -> NCHW
transpose live inside the graph, so clients and the Preprocessor ship uint8.
`Input.FLOAT_NCHW` writes the graph as a PyTorch user exports it instead: `input`
float32 [N, 3, S, S], normalisation left to whoever feeds it (the tests' second
model, Lite1 at 240 px). BatchNorm is folded into the convolutions; padding
reproduces TensorFlow's "SAME" (the odd pixel goes after), because the weights
were trained in TF.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

NUM_CLASSES = 1000
BN_EPS = 1e-3
STEM_CHANNELS = 32
HEAD_CHANNELS = 1280
OPSET = 17
# IR 8 pairs with opset 17; newer onnx writes a newer IR than older ONNX Runtime builds accept.
IR_VERSION = 8


@dataclass(frozen=True)
class Stage:
    repeats: int
    kernel: int
    stride: int
    expand: int
    out_channels: int


# (repeats, kernel, stride, expand, out) of EfficientNet-Lite0; no squeeze-excite.
STAGES: tuple[Stage, ...] = (
    Stage(1, 3, 1, 1, 16),
    Stage(2, 3, 2, 6, 24),
    Stage(2, 5, 2, 6, 40),
    Stage(3, 3, 2, 6, 80),
    Stage(3, 5, 1, 6, 112),
    Stage(4, 5, 2, 6, 192),
    Stage(1, 3, 1, 6, 320),
)


@dataclass(frozen=True)
class Lite:
    """One member of the family: Lite1-4 repeat Lite0's stages more (depth) at a larger input; Lite keeps the
    stem, the head and the first and last stages as they are (TF's efficientnet_lite_builder, fix_head_stem)."""

    name: str
    input_size: int
    depth: float

    def stages(self) -> tuple[Stage, ...]:
        last = len(STAGES) - 1
        return tuple(
            s
            if i in (0, last)
            else Stage(math.ceil(self.depth * s.repeats), s.kernel, s.stride, s.expand, s.out_channels)
            for i, s in enumerate(STAGES)
        )


LITE0 = Lite("efficientnet_lite0", 224, 1.0)
LITE1 = Lite("efficientnet_lite1", 240, 1.1)


class Input(enum.Enum):
    UINT8_NHWC = "uint8_nhwc"  # `image` uint8 [N, S, S, 3] RGB, (x - 127) / 128 inside the graph (the built-in)
    FLOAT_NCHW = "float_nchw"  # `input` float32 [N, 3, S, S], already normalised by the caller (a PyTorch export)


def same_pads(size: int, kernel: int, stride: int) -> tuple[int, int]:
    """TensorFlow SAME padding along one axis: (before, after), extra pixel after."""
    out = math.ceil(size / stride)
    total = max((out - 1) * stride + kernel - size, 0)
    return total // 2, total - total // 2


def fold_batchnorm(weight: np.ndarray, sd: Mapping[str, np.ndarray], bn: str) -> tuple[np.ndarray, np.ndarray]:
    scale = sd[f"{bn}.weight"] / np.sqrt(sd[f"{bn}.running_var"] + BN_EPS)
    folded_w = weight * scale.reshape(-1, *([1] * (weight.ndim - 1)))
    folded_b = sd[f"{bn}.bias"] - sd[f"{bn}.running_mean"] * scale
    return folded_w.astype(np.float32), folded_b.astype(np.float32)


class _GraphWriter:
    def __init__(self, sd: Mapping[str, np.ndarray], size: int) -> None:
        self.sd = sd
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.size = size  # spatial size of the current activation

    def const(self, name: str, value: np.ndarray) -> str:
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def node(self, op: str, inputs: list[str], output: str, **attrs: Any) -> str:
        self.nodes.append(helper.make_node(op, inputs, [output], name=output, **attrs))
        return output

    def conv_bn(self, x: str, conv: str, bn: str, stride: int, groups: int, relu6: bool) -> str:
        w, b = fold_batchnorm(self.sd[f"{conv}.weight"], self.sd, bn)
        k = w.shape[-1]
        before, after = same_pads(self.size, k, stride)
        y = self.node(
            "Conv",
            [x, self.const(f"{conv}.w", w), self.const(f"{conv}.b", b)],
            f"{conv}.out",
            kernel_shape=[k, k],
            strides=[stride, stride],
            pads=[before, before, after, after],
            group=groups,
        )
        self.size = math.ceil(self.size / stride)
        if relu6:
            y = self.node("Clip", [y, "relu6.min", "relu6.max"], f"{conv}.relu6")
        return y

    def mbconv(self, x: str, index: int, stage: Stage, stride: int, in_ch: int) -> str:
        p = f"_blocks.{index}"
        h = x
        if stage.expand != 1:
            h = self.conv_bn(h, f"{p}._expand_conv", f"{p}._bn0", 1, 1, relu6=True)
        channels = in_ch * stage.expand
        h = self.conv_bn(h, f"{p}._depthwise_conv", f"{p}._bn1", stride, channels, relu6=True)
        h = self.conv_bn(h, f"{p}._project_conv", f"{p}._bn2", 1, 1, relu6=False)
        if stride == 1 and in_ch == stage.out_channels:
            h = self.node("Add", [h, x], f"{p}.residual")
        return h


def build_model(sd: Mapping[str, np.ndarray], lite: Lite = LITE0, inputs: Input = Input.UINT8_NHWC) -> onnx.ModelProto:
    """Write the EfficientNet-Lite graph for the weights in `sd` (lukemelas naming)."""
    g = _GraphWriter(sd, lite.input_size)
    g.const("relu6.min", np.array(0.0, np.float32))
    g.const("relu6.max", np.array(6.0, np.float32))
    s = lite.input_size
    dims: list[str | int]
    if inputs is Input.UINT8_NHWC:
        name, elem, dims = "image", TensorProto.UINT8, ["N", s, s, 3]
        x = g.node("Cast", [name], "image.f32", to=TensorProto.FLOAT)
        x = g.node("Sub", [x, g.const("norm.mean", np.array(127.0, np.float32))], "image.centred")
        x = g.node("Mul", [x, g.const("norm.scale", np.array(1 / 128, np.float32))], "image.scaled")
        x = g.node("Transpose", [x], "image.nchw", perm=[0, 3, 1, 2])
        doc = "input uint8 NHWC RGB, normalisation in graph"
    else:
        name, elem, dims = "input", TensorProto.FLOAT, ["N", 3, s, s]
        x = name
        doc = "input float32 NCHW RGB, normalised outside the graph ((x - 127) / 128)"
    x = g.conv_bn(x, "_conv_stem", "_bn0", 2, 1, relu6=True)
    index, in_ch = 0, STEM_CHANNELS
    for stage in lite.stages():
        for r in range(stage.repeats):
            x = g.mbconv(x, index, stage, stage.stride if r == 0 else 1, in_ch)
            index, in_ch = index + 1, stage.out_channels
    if f"_blocks.{index}._project_conv.weight" in sd:
        raise ValueError(f"state dict has more than {index} blocks: not {lite.name}")
    x = g.conv_bn(x, "_conv_head", "_bn1", 1, 1, relu6=True)
    x = g.node("GlobalAveragePool", [x], "pool")
    x = g.node("Flatten", [x], "features", axis=1)
    g.node("Gemm", [x, g.const("_fc.w", sd["_fc.weight"]), g.const("_fc.b", sd["_fc.bias"])], "logits", transB=1)
    graph = helper.make_graph(
        g.nodes,
        lite.name,
        [helper.make_tensor_value_info(name, elem, dims)],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", NUM_CLASSES])],
        g.inits,
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="app.models", ir_version=IR_VERSION
    )
    model.doc_string = f"{lite.name}, ImageNet weights; {doc}"
    onnx.checker.check_model(model, full_check=True)
    return model
