"""INT8 weights that ONNX Runtime's U8S8 CPU kernels cannot overflow on x86 without VNNI.

On x86-64 with AVX2 (and AVX-512 before VNNI: every AMD Zen up to Zen 3, Intel before Cascade Lake), ONNX
Runtime's fused U8S8 kernels (QLinearConv, QGemm, MatMulInteger) multiply with VPMADDUBSW: two adjacent
u8 x s8 products are summed into a *saturating 16-bit* lane before the 32-bit accumulation. With
activations up to 255 and per-channel weights up to 127, a pair reaches 2 * 255 * 127 = 64,770 against
the lane's 32,767, and the layer's output is silently wrong (onnxruntime's session option
`session.x64quantprecision` documents the overflow; its fix, U8U8 kernels, costs INT8 its speed-up).
Measured on an AMD EPYC Zen 3 with this repository's EfficientNet-Lite0: INT8 agreed with FP32 on 0.78
of 360 varied images through the fused kernels, 0.94 with the same Q/DQ graph computed as written.

`limit_pairs` rescales, per output channel, the weights of every layer those kernels run so that no two
weights the kernel can pair (adjacent along the reduction axis, in either layout ORT packs convolution
weights in) sum to more than 127 in magnitude with the same sign: 255 * 128 = 32,640 fits the lane. The
channel's scale grows by the same factor (and its int32 bias scale with it, as QLinearConv requires), so
the graph computes the same function with a coarser grid on those channels: on that machine the fused
kernels then agree with FP32 on 0.92 of the same images at the same speed. A pair of opposite signs cannot
overflow (|255 * w| <= 32,385), and depthwise convolutions are left alone (ORT widens to 16 bits first).

VNNI CPUs (AVX-512 VNNI, AVX-VNNI) accumulate in 32 bits and never overflowed; there the rescaling costs a
little precision for nothing (`python -m app.models quantize --no-pair-limit` for a fleet of such CPUs).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import numpy_helper

# |w_k| + |w_k+1| <= PAIR_LIMIT keeps 255 * (PAIR_LIMIT + 1) <= 32767 after the rounding of a rescale.
PAIR_LIMIT = 127
LANE = 32767
MAX_ACTIVATION = 255


@dataclass(frozen=True)
class PairFit:
    layers: int  # layers the fused U8S8 kernels would run (weights through a DequantizeLinear of int8)
    rescaled_layers: int
    channels: int
    rescaled_channels: int

    def to_dict(self) -> dict[str, int]:
        return {
            "layers": self.layers,
            "rescaled_layers": self.rescaled_layers,
            "channels": self.channels,
            "rescaled_channels": self.rescaled_channels,
        }


@dataclass
class _Layer:
    node: onnx.NodeProto
    weights: onnx.TensorProto  # int8
    scale: onnx.TensorProto
    out_axis: int  # the output-channel axis of `weights`
    bias: tuple[onnx.TensorProto, onnx.TensorProto] | None  # int32 values and their scale, if quantized


def _attr(node: onnx.NodeProto, name: str, default: int) -> int:
    return next((a.i for a in node.attribute if a.name == name), default)


def _layers(model: onnx.ModelProto) -> list[_Layer]:
    """Conv (not depthwise), Gemm and MatMul whose weight is a DequantizeLinear of an int8 initializer."""
    inits = {i.name: i for i in model.graph.initializer}
    producer = {out: n for n in model.graph.node for out in n.output}
    out = []
    for node in model.graph.node:
        if node.op_type not in ("Conv", "Gemm", "MatMul") or len(node.input) < 2:
            continue
        dq = producer.get(node.input[1])
        if dq is None or dq.op_type != "DequantizeLinear" or dq.input[0] not in inits or dq.input[1] not in inits:
            continue
        weights = inits[dq.input[0]]
        if weights.data_type != onnx.TensorProto.INT8:
            continue
        if node.op_type == "Conv":
            if _attr(node, "group", 1) > 1 and weights.dims[1] == 1:
                continue  # depthwise: ORT's kernel widens to 16 bits before multiplying
            out_axis = 0
        elif node.op_type == "Gemm":
            out_axis = 0 if _attr(node, "transB", 0) else 1
        else:
            out_axis = len(weights.dims) - 1
        bias = None
        bdq = producer.get(node.input[2]) if node.op_type != "MatMul" and len(node.input) > 2 else None
        if bdq is not None and bdq.op_type == "DequantizeLinear" and {*bdq.input[:2]} <= inits.keys():
            bias = (inits[bdq.input[0]], inits[bdq.input[1]])
        out.append(_Layer(node, weights, inits[dq.input[1]], out_axis, bias))
    return out


def _reduction_rows(q: np.ndarray, op_type: str, out_axis: int) -> list[np.ndarray]:
    """The weights as (output channel, reduction) matrices, in each order a kernel may pack the reduction."""
    if op_type == "Conv":
        rows = [q.reshape(q.shape[0], -1)]  # (cin, kh, kw): im2col order
        if q.ndim > 2 and int(np.prod(q.shape[2:])) > 1:
            rows.append(np.moveaxis(q, 1, -1).reshape(q.shape[0], -1))  # (kh, kw, cin): NHWC order
        return rows
    return [np.moveaxis(q, out_axis, 0).reshape(q.shape[out_axis], -1)]


def pair_sums(q: np.ndarray, op_type: str, out_axis: int = 0) -> np.ndarray:
    """Per output channel: the largest |w_k| + |w_k+1| over adjacent same-sign weights (or the largest |w|)."""
    best = np.zeros(q.shape[out_axis], dtype=np.int64)
    for rows in _reduction_rows(q.astype(np.int64), op_type, out_axis):
        best = np.maximum(best, np.abs(rows).max(axis=1, initial=0))
        if rows.shape[1] > 1:
            for same in (np.maximum(rows, 0), np.maximum(-rows, 0)):
                best = np.maximum(best, (same[:, :-1] + same[:, 1:]).max(axis=1))
    return best


def limit_pairs(model: onnx.ModelProto, limit: int = PAIR_LIMIT) -> PairFit:
    """Rescale, in place, every channel whose weight pairs could overflow a 16-bit lane (module docstring)."""
    layers = _layers(model)
    rescaled_layers = channels = rescaled_channels = 0
    for layer in layers:
        q = numpy_helper.to_array(layer.weights).astype(np.int64)
        scale = numpy_helper.to_array(layer.scale)
        sums = pair_sums(q, layer.node.op_type, layer.out_axis)
        channels += sums.size
        factor = np.minimum(1.0, limit / np.maximum(sums, 1))  # per output channel, <= 1
        if scale.size == 1:
            factor = np.full_like(factor, factor.min())
        elif scale.size != factor.size:
            continue  # per-axis along another axis: a per-channel rescale would change the function
        if (factor >= 1).all():
            continue
        shape = [1] * q.ndim
        shape[layer.out_axis] = -1
        new_q = np.clip(np.round(q * factor.reshape(shape)), -limit, limit)
        # Rounding can lift a pair by one: still within the lane (module docstring), and checked here.
        assert (pair_sums(new_q, layer.node.op_type, layer.out_axis) <= limit + 1).all()
        new_scale = scale / (factor if scale.size > 1 else factor[:1].reshape(scale.shape))
        layer.weights.CopyFrom(numpy_helper.from_array(new_q.astype(np.int8), layer.weights.name))
        layer.scale.CopyFrom(numpy_helper.from_array(new_scale.astype(scale.dtype), layer.scale.name))
        if layer.bias is not None:
            # QLinearConv reads an int32 bias at input scale * weight scale: the bias follows the weights.
            values, bias_scale = layer.bias
            b, bs = numpy_helper.to_array(values), numpy_helper.to_array(bias_scale)
            f = factor if bs.size > 1 else factor[:1].reshape(bs.shape)
            values.CopyFrom(numpy_helper.from_array(np.round(b * f).astype(b.dtype), values.name))
            bias_scale.CopyFrom(numpy_helper.from_array((bs / f).astype(bs.dtype), bias_scale.name))
        rescaled_layers += 1
        rescaled_channels += int((factor < 1).sum())
    return PairFit(len(layers), rescaled_layers, channels, rescaled_channels)


def pair_problems(model: onnx.ModelProto) -> list[str]:
    """The layers whose weights could overflow a U8S8 kernel's 16-bit lane (empty: none can)."""
    out = []
    for layer in _layers(model):
        q = numpy_helper.to_array(layer.weights)
        worst = int(pair_sums(q, layer.node.op_type, layer.out_axis).max(initial=0))
        if MAX_ACTIVATION * worst > LANE:
            out.append(f"{layer.node.name or layer.node.op_type}: a weight pair sums to {worst}")
    return out
