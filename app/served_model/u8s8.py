"""INT8 weights that ONNX Runtime's U8S8 CPU kernels cannot overflow on x86 without VNNI.

On x86-64 with AVX2 (and AVX-512 before VNNI: every AMD Zen up to Zen 3, Intel before Cascade Lake), ONNX
Runtime's fused U8S8 kernels (QLinearConv, QGemm, MatMulInteger) multiply with VPMADDUBSW: two adjacent
u8 x s8 products are summed into a *saturating 16-bit* lane before the 32-bit accumulation. With
activations up to 255 and per-channel weights up to 127, a pair reaches 2 * 255 * 127 = 64,770 against
the lane's 32,767, and the layer's output is silently wrong (onnxruntime's session option
`session.x64quantprecision` documents the overflow; its fix, U8U8 kernels, costs most of INT8's speed-up:
1.10-1.23x FP32 against 1.54x, measured below). Measured on an AMD EPYC Zen 3 (family 25) with this repository's
EfficientNet-Lite0: INT8 agreed with FP32 on 0.78 of 360 varied images through the fused kernels, 0.94 with
the same Q/DQ graph computed as written (`python -m benchmarks.int8_kernels`).

`limit_pairs` rescales, per output channel, the weights of every layer those kernels run wherever two
weights the kernel can pair (adjacent along the reduction axis: ORT's packing order for a convolution, and
ONNX's own to be safe) sum past 128 in magnitude with the same sign (255 * 128 = 32,640 fits the lane;
255 * 129 does not), to at most 127 before rounding. The channel's scale grows by the same factor (and the
int32 bias scale of every node using the weights with it, as QLinearConv requires), so the graph computes
the same function on a coarser grid in those channels: on that machine the fused kernels then agree with
FP32 on 0.91 of the same images at the same speed. A pair of opposite signs cannot overflow
(|255 * w| <= 32,385), and depthwise convolutions are left alone (ORT widens to 16 bits first). Weights a
rescale would change the function of (quantized along another axis, a non-zero zero point, read through
two scales, a scale or bias shared with other weights) are left as they are and named in `PairFit.skipped`;
`pair_problems` still counts them, and a CPU replica runs such a model on ORT's U8U8 kernels (`app.runtime.select`).

VNNI CPUs (AVX-512 VNNI, AVX-VNNI) accumulate in 32 bits and never overflowed; there the rescaling costs a
little precision for nothing (`python -m app.models quantize --no-pair-limit` for a fleet of such CPUs).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

LANE = 32767
MAX_ACTIVATION = 255
SAFE_SUM = LANE // MAX_ACTIVATION  # 128: |w_k| + |w_k+1| up to this cannot overflow the lane
PAIR_LIMIT = SAFE_SUM - 1  # what a rescale aims at: its rounding may add one, never past SAFE_SUM


@dataclass(frozen=True)
class PairFit:
    layers: int  # layers the fused U8S8 kernels would run (weights through a DequantizeLinear of int8)
    rescaled_layers: int
    channels: int
    rescaled_channels: int
    skipped: tuple[str, ...] = ()  # weights that can overflow but could not be rescaled safely, and why

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "skipped": list(self.skipped)}


@dataclass
class _Weights:
    """One int8 weight initializer and every node that computes with it."""

    op_type: str
    q: onnx.TensorProto
    scale: onnx.TensorProto
    out_axis: int  # the output-channel axis of `q`
    nodes: list[onnx.NodeProto] = field(default_factory=list)
    biases: list[tuple[onnx.TensorProto, onnx.TensorProto]] = field(default_factory=list)  # int32 values, scale
    problem: str = ""  # why a rescale would change the function (empty: it would not)

    @property
    def label(self) -> str:
        return ", ".join(n.name or n.op_type for n in self.nodes)


def _attr(node: onnx.NodeProto, name: str, default: int) -> int:
    return next((a.i for a in node.attribute if a.name == name), default)


def _out_axis(node: onnx.NodeProto, dims: Sequence[int]) -> int | None:
    """The output-channel axis of a weight the U8S8 kernels run; None for a depthwise Conv (ORT widens those
    to 16 bits first) and for anything else."""
    if node.op_type == "Conv":
        group = _attr(node, "group", 1)
        return None if group > 1 and dims[1] == 1 and dims[0] == group else 0
    if node.op_type == "Gemm":
        return 0 if _attr(node, "transB", 0) else 1
    return len(dims) - 1 if node.op_type == "MatMul" else None


def _weights(model: onnx.ModelProto) -> list[_Weights]:
    """Conv (not depthwise), Gemm and MatMul weights that are a DequantizeLinear of an int8 initializer, one entry
    per initializer however many nodes share it, with what would make a rescale unsafe."""
    inits = {i.name: i for i in model.graph.initializer}
    producer = {out: n for n in model.graph.node for out in n.output}
    found: dict[str, _Weights] = {}
    owners: dict[str, set[str]] = {}  # scale and bias initializer -> the weights using them
    for node in model.graph.node:
        dq = producer.get(node.input[1]) if len(node.input) > 1 else None
        if dq is None or dq.op_type != "DequantizeLinear" or not {*dq.input[:2]} <= inits.keys():
            continue
        q = inits[dq.input[0]]
        axis = _out_axis(node, q.dims)
        if q.data_type != onnx.TensorProto.INT8 or axis is None:
            continue
        w = found.setdefault(q.name, _Weights(node.op_type, q, inits[dq.input[1]], axis))
        w.nodes.append(node)
        owners.setdefault(dq.input[1], set()).add(q.name)
        scale_size = int(np.prod(w.scale.dims))
        dq_axis = _attr(dq, "axis", 1) % max(len(q.dims), 1)
        zero = numpy_helper.to_array(inits[dq.input[2]]) if len(dq.input) > 2 and dq.input[2] in inits else None
        if axis != w.out_axis or node.op_type != w.op_type:
            w.problem = "shared by nodes that read it along different axes"
        elif dq.input[1] != w.scale.name:
            w.problem = "read through more than one scale"
        elif scale_size > 1 and dq_axis != axis:
            w.problem = f"quantized per axis {dq_axis}, not per output channel ({axis})"
        elif zero is not None and zero.any():
            w.problem = "a non-zero weight zero point"
        bdq = producer.get(node.input[2]) if node.op_type != "MatMul" and len(node.input) > 2 else None
        if bdq is not None and bdq.op_type == "DequantizeLinear" and {*bdq.input[:2]} <= inits.keys():
            pair = (inits[bdq.input[0]], inits[bdq.input[1]])
            if all(pair[0].name != b.name or pair[1].name != s.name for b, s in w.biases):
                w.biases.append(pair)  # a bias shared by the nodes sharing the weights: rescaled once
            owners.setdefault(bdq.input[0], set()).add(q.name)
            owners.setdefault(bdq.input[1], set()).add(q.name)
            if scale_size > 1 and int(np.prod(inits[bdq.input[1]].dims)) != scale_size:
                w.problem = "a bias scale that is not per output channel"
    for w in found.values():
        names = [t.name for pair in w.biases for t in pair]
        if not w.problem and (len(names) != len(set(names)) or any(len(owners[n]) > 1 for n in [w.scale.name, *names])):
            w.problem = "a scale or bias shared with other weights or biases"
    return list(found.values())


def _reduction_rows(q: np.ndarray, op_type: str, out_axis: int) -> list[np.ndarray]:
    """The weights as (output channel, reduction) matrices: a convolution's in ORT's packing order (kh, kw, cin:
    QLinearConv's ReorderFilter) and, to be safe for other engines, in ONNX's own (cin, kh, kw)."""
    if op_type == "Conv":
        rows = [q.reshape(q.shape[0], -1)]  # (cin, kh, kw)
        if q.ndim > 2 and int(np.prod(q.shape[2:])) > 1:
            rows.append(np.moveaxis(q, 1, -1).reshape(q.shape[0], -1))  # (kh, kw, cin)
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


def limit_pairs(model: onnx.ModelProto) -> PairFit:
    """Rescale, in place, every channel whose weight pairs could overflow a 16-bit lane (module docstring).

    Idempotent: a channel is rescaled only where a pair sums past SAFE_SUM, to at most SAFE_SUM."""
    groups = _weights(model)
    rescaled_layers = channels = rescaled_channels = 0
    skipped = []
    for w in groups:
        q = numpy_helper.to_array(w.q).astype(np.int64)
        scale = numpy_helper.to_array(w.scale)
        sums = pair_sums(q, w.op_type, w.out_axis)
        channels += sums.size
        if sums.max(initial=0) <= SAFE_SUM:
            continue
        if w.problem:
            skipped.append(f"{w.label}: {w.problem}")
            continue
        factor = np.where(sums > SAFE_SUM, PAIR_LIMIT / np.maximum(sums, 1), 1.0)  # per output channel, <= 1
        if scale.size == 1:
            factor = np.full_like(factor, factor.min())
        shape = [1] * q.ndim
        shape[w.out_axis] = -1
        new_q = np.clip(np.round(q * factor.reshape(shape)), -PAIR_LIMIT, PAIR_LIMIT)
        assert (pair_sums(new_q, w.op_type, w.out_axis) <= SAFE_SUM).all()
        per = factor if scale.size > 1 else factor[:1].reshape(scale.shape)
        w.q.CopyFrom(numpy_helper.from_array(new_q.astype(np.int8), w.q.name))
        w.scale.CopyFrom(numpy_helper.from_array((scale / per).astype(scale.dtype), w.scale.name))
        for values, bias_scale in w.biases:
            # QLinearConv reads an int32 bias at input scale * weight scale: each bias follows the weights.
            b, bs = numpy_helper.to_array(values), numpy_helper.to_array(bias_scale)
            f = per.reshape(bs.shape) if per.size == bs.size else per.reshape(-1)[0]
            values.CopyFrom(numpy_helper.from_array(np.round(b * f).astype(b.dtype), values.name))
            bias_scale.CopyFrom(numpy_helper.from_array((bs / f).astype(bs.dtype), bias_scale.name))
        rescaled_layers += len(w.nodes)
        rescaled_channels += int((factor < 1).sum())
    layers = sum(len(w.nodes) for w in groups)
    return PairFit(layers, rescaled_layers, channels, rescaled_channels, tuple(skipped))


def pair_problems(model: onnx.ModelProto) -> list[str]:
    """The layers whose weights could overflow a U8S8 kernel's 16-bit lane (empty: none can)."""
    out = []
    for w in _weights(model):
        worst = int(pair_sums(numpy_helper.to_array(w.q), w.op_type, w.out_axis).max(initial=0))
        if worst > SAFE_SUM:
            out.append(f"{w.label}: a weight pair sums to {worst}")
    return out
