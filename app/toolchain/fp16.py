"""The FP16 build of an FP32 model: what a GPU node without TensorRT serves in place of an INT8 build.

ONNX Runtime's CUDA EP has FP16 kernels and no INT8 ones (`app.runtime.plan`), so on such a node an FP16 copy of
the FP32 model is the fast build. It is converted by onnxruntime.transformers.float16 with the graph's IO types
kept: the image still goes in as the graph declares it (uint8, or float32 behind the served prologue,
`app.served_model.prologue`) and the scores come out float32, so nothing outside the file changes.

What stays FP32 (the converter inserts Casts around it): float16.DEFAULT_OP_BLOCK_LIST (ops without FP16 kernels
or whose float inputs are indices and ranges), plus FP32_OPS below, the ops whose FP16 results overflow 65504 or
lose their range: exponentials and powers, reciprocals and logarithms of small values, sums over many elements.
A chain of kept ops is left in FP32 end to end (no FP16 rounding between two of them).

Weights outside FP16's normal range are counted, not hidden: above 65504 they are clamped to it; below the
smallest normal (6.1e-5) FP16 holds them as subnormals with fewer significant bits, and below its smallest
subnormal (6e-8) the converter raises them to it (it never flushes a weight to zero or changes its sign).

Offline tooling, like app.toolchain.quantize: it uses onnxruntime.transformers directly.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper
from onnxruntime.transformers.float16 import DEFAULT_OP_BLOCK_LIST, convert_float_to_float16

from app.served_model import atomic_write
from app.served_model.graph import graph_io_of

# Beyond the converter's own block list: ops whose FP16 result overflows (exp(x) past x = 11.1, x**2 past 256,
# 1/x below 1.5e-5, a sum of many terms) or loses its range (log of what FP16 rounds to 0). Softmax and LogSoftmax
# exponentiate and sum; ReduceMean is a sum before it is a mean.
FP32_OPS: tuple[str, ...] = (
    "Exp",
    "Log",
    "Pow",
    "Reciprocal",
    "Softmax",
    "LogSoftmax",
    "ReduceSum",
    "ReduceSumSquare",
    "ReduceMean",
    "ReduceProd",
    "ReduceL1",
    "ReduceL2",
    "ReduceLogSum",
    "ReduceLogSumExp",
)
# The converter's bounds: FP16's largest finite value and its smallest subnormal (float16.py's defaults).
MAX_FINITE = 65504.0
MIN_POSITIVE = 5.96e-08
SMALLEST_NORMAL = float(np.finfo(np.float16).tiny)  # 6.1035e-05
# Ops that carry a quantized graph: such a file is an INT8 build, not an FP32 model.
QUANTIZED_OPS = {
    "QuantizeLinear",
    "DequantizeLinear",
    "DynamicQuantizeLinear",
    "QLinearConv",
    "QLinearMatMul",
    "ConvInteger",
    "MatMulInteger",
}


class NotFloat32Error(ValueError):
    """The model given to the fp16 target is not an FP32 model (an INT8 build, or FP16 already)."""


@dataclass(frozen=True)
class Fp16Options:
    keep_fp32: Sequence[str] = ()  # op types kept FP32 besides DEFAULT_OP_BLOCK_LIST and FP32_OPS
    exclude_nodes: Sequence[str] = ()  # node names kept FP32

    @property
    def op_block_list(self) -> list[str]:
        return sorted({*DEFAULT_OP_BLOCK_LIST, *FP32_OPS, *self.keep_fp32})


@dataclass(frozen=True)
class Clamped:
    """The FP32 weights (initializers and Constant tensors) that FP16 cannot hold as they are."""

    tensors: int  # weight tensors converted to FP16
    values: int  # their values
    above_max: int  # |w| > 65504: clamped to +-65504
    subnormal: int  # 6e-8 <= |w| < 6.1e-5: FP16 subnormals, fewer significant bits
    below_min: int  # 0 < |w| < 6e-8: raised to +-6e-8
    in_tensors: int  # tensors holding any of the above

    @property
    def total(self) -> int:
        """Outside FP16's normal range: above its largest finite value or below its smallest positive normal."""
        return self.above_max + self.subnormal + self.below_min

    def to_dict(self) -> dict[str, int]:
        return {
            "total": self.total,
            "above_max": self.above_max,
            "subnormal": self.subnormal,
            "below_min": self.below_min,
            "in_tensors": self.in_tensors,
            "tensors": self.tensors,
            "values": self.values,
        }


def precision_of(model: onnx.ModelProto) -> str:
    """The precision of a model file: int8 (a quantized graph), fp16 (FP16 weights or input), fp32 (FP32 weights),
    else none. The fp16 target accepts fp32 only; `report` takes an fp16 file for an FP16 build."""
    if any(n.op_type in QUANTIZED_OPS for n in model.graph.node):
        return "int8"
    types = {t.data_type for _, t in _weights(model.graph)}
    types |= {i.type.tensor_type.elem_type for i in model.graph.input}
    if TensorProto.FLOAT16 in types:
        return "fp16"
    return "fp32" if TensorProto.FLOAT in types else "none"


def check_float32(model: onnx.ModelProto, source: str) -> None:
    """NotFloat32Error, one line, unless `model` is an FP32 model the fp16 target can convert."""
    found = precision_of(model)
    if found != "fp32":
        what = {"int8": "an INT8 (quantized) build", "fp16": "FP16 already", "none": "without float32 weights"}[found]
        raise NotFloat32Error(f"{source} is {what}: the fp16 target converts an FP32 model")


def to_fp16(model: onnx.ModelProto, opts: Fp16Options = Fp16Options()) -> onnx.ModelProto:
    """The FP16 copy of `model` (left unchanged), IO types kept, checked by onnx.checker and against `model`'s IO."""
    check_float32(model, "the model")
    converted = convert_float_to_float16(
        model,
        min_positive_val=MIN_POSITIVE,
        max_finite_val=MAX_FINITE,
        keep_io_types=True,
        op_block_list=opts.op_block_list,
        node_block_list=list(opts.exclude_nodes),
    )
    _keep_fp32_chains(converted.graph)
    _sort_topologically(converted.graph)
    onnx.checker.check_model(converted, full_check=True)
    _check_io_kept(model, converted)
    return converted


def convert(fp32: Path, out: Path, opts: Fp16Options = Fp16Options()) -> Clamped:
    """Write the FP16 build of the model at `fp32` to `out` atomically; what it clamped."""
    model = onnx.load(str(fp32))
    check_float32(model, str(fp32))
    converted = to_fp16(model, opts)
    atomic_write(out, converted.SerializeToString())
    return clamped(model, converted)


def clamped(fp32: onnx.ModelProto, fp16: onnx.ModelProto) -> Clamped:
    """Count the FP32 weights of `fp32` that became FP16 in `fp16` (same names) and lie outside FP16's range."""
    converted = {key for key, t in _weights(fp16.graph) if t.data_type == TensorProto.FLOAT16}
    counts, tensors, values, hit = Counter[str](), 0, 0, 0
    for key, tensor in _weights(fp32.graph):
        if key not in converted or tensor.data_type != TensorProto.FLOAT:
            continue
        w = np.abs(numpy_helper.to_array(tensor).astype(np.float64)).ravel()
        bands = {
            "above_max": int(np.sum(np.isfinite(w) & (w > MAX_FINITE))),
            "subnormal": int(np.sum((w >= MIN_POSITIVE) & (w < SMALLEST_NORMAL))),
            "below_min": int(np.sum((w > 0) & (w < MIN_POSITIVE))),
        }
        counts.update(bands)
        tensors, values, hit = tensors + 1, values + w.size, hit + (sum(bands.values()) > 0)
    return Clamped(tensors, values, counts["above_max"], counts["subnormal"], counts["below_min"], hit)


def float32_ops(model: onnx.ModelProto) -> Counter[str]:
    """Op types that compute in FP32 in an FP16 build: nodes with a float32 input (the converter's Casts and the
    Identities of _keep_fp32_chains only carry values, and are not counted)."""
    inferred = onnx.shape_inference.infer_shapes(model)
    g = inferred.graph
    types = {v.name: v.type.tensor_type.elem_type for v in (*g.input, *g.output, *g.value_info)}
    types |= {t.name: t.data_type for t in g.initializer}
    return Counter(
        n.op_type
        for n in g.node
        if n.op_type not in ("Cast", "Identity") and any(types.get(i) == TensorProto.FLOAT for i in n.input)
    )


def _weights(graph: onnx.GraphProto, prefix: str = "") -> Iterator[tuple[str, TensorProto]]:
    """Every weight tensor: initializers and Constant values, in subgraphs too, keyed by where they are."""
    for t in graph.initializer:
        yield prefix + t.name, t
    for node in graph.node:
        for attr in node.attribute:
            if node.op_type == "Constant" and attr.type == onnx.AttributeProto.TENSOR:
                yield f"{prefix}{node.name}/{node.output[0]}", attr.t
            for sub in (attr.g, *attr.graphs) if attr.type in _GRAPH_ATTRS else ():
                yield from _weights(sub, f"{prefix}{node.name}/{attr.name}/")


_GRAPH_ATTRS = {onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS}


def _keep_fp32_chains(graph: onnx.GraphProto) -> None:
    """Between two kept ops the converter casts to FP16 and straight back: read the FP32 value instead.

    A Cast to FLOAT whose input is a Cast to FLOAT16 of a float32 tensor, read by nothing else, becomes an Identity of
    that tensor, and the FP16 Cast goes (the rounding it did was never wanted)."""
    producer = {o: n for n in graph.node for o in n.output}
    readers = Counter(i for n in graph.node for i in n.input)
    outputs = {o.name for o in graph.output}
    dead: set[str] = set()
    for node in graph.node:
        half = producer.get(node.input[0]) if node.op_type == "Cast" and node.input else None
        if _cast_to(node) != TensorProto.FLOAT or half is None or _cast_to(half) != TensorProto.FLOAT16:
            continue
        if readers[half.output[0]] != 1 or half.output[0] in outputs or not _is_float32(graph, half.input[0]):
            continue
        node.op_type, node.input[0] = "Identity", half.input[0]
        del node.attribute[:]
        dead.add(half.output[0])
    for field in (graph.node, graph.value_info):
        for i in reversed(range(len(field))):
            item = field[i]
            if (item.output[0] if isinstance(item, onnx.NodeProto) else item.name) in dead:
                del field[i]


def _cast_to(node: onnx.NodeProto) -> int | None:
    return next((a.i for a in node.attribute if a.name == "to"), None) if node.op_type == "Cast" else None


def _is_float32(graph: onnx.GraphProto, name: str) -> bool:
    """Whether the converter typed `name` float32 (its value_info, or a graph input kept float32)."""
    infos = (*graph.input, *graph.value_info)
    return any(v.name == name and v.type.tensor_type.elem_type == TensorProto.FLOAT for v in infos)


def _sort_topologically(graph: onnx.GraphProto) -> None:
    """The converter appends its Casts at the end; ONNX wants every node after the producers of what it reads.

    Each node in its own order, preceded by any producer not yet placed: the order is kept wherever it was right,
    and an appended Cast moves just in front of its first reader."""
    nodes = list(graph.node)
    producer = {o: i for i, n in enumerate(nodes) for o in n.output}
    placed: set[int] = set()
    order: list[int] = []
    for start in range(len(nodes)):
        path = [start]
        while path:
            i = path[-1]
            waiting = [producer[x] for x in _reads(nodes[i]) if producer.get(x, i) != i and producer[x] not in placed]
            if not waiting:
                if i not in placed:
                    placed.add(i)
                    order.append(i)
                path.pop()
            elif waiting[0] in path:
                raise RuntimeError(f"the FP16 graph has a cycle through node {nodes[waiting[0]].name!r}")
            else:
                path.append(waiting[0])
    sorted_nodes = [onnx.NodeProto.FromString(nodes[i].SerializeToString()) for i in order]
    del graph.node[:]
    graph.node.extend(sorted_nodes)


def _reads(node: onnx.NodeProto) -> Iterator[str]:
    """What `node` reads: its inputs, and the outer names its subgraphs read (If, Loop, Scan)."""
    yield from node.input
    for attr in node.attribute:
        for sub in (attr.g, *attr.graphs) if attr.type in _GRAPH_ATTRS else ():
            for inner in sub.node:
                yield from _reads(inner)


def _check_io_kept(fp32: onnx.ModelProto, fp16: onnx.ModelProto) -> None:
    """The build takes and gives what the FP32 model does (the served prologue and the Classifier rely on it)."""
    before, after = graph_io_of(fp32), graph_io_of(fp16)
    out_before = [o.type.tensor_type.elem_type for o in fp32.graph.output]
    out_after = [o.type.tensor_type.elem_type for o in fp16.graph.output]
    if (before.input_name, before.dtype, before.input_shape) != (after.input_name, after.dtype, after.input_shape):
        raise RuntimeError(f"the FP16 build takes {after.describe_input()}, the FP32 model {before.describe_input()}")
    if out_before != out_after:
        raise RuntimeError(f"the FP16 build's outputs are of ONNX types {out_after}, the FP32 model's {out_before}")


def describe(opts: Fp16Options) -> dict[str, Any]:
    """What the build was asked to keep in FP32 (the report's `conversion`)."""
    return {
        "target": "fp16",
        "keep_fp32": sorted({*FP32_OPS, *opts.keep_fp32}),
        "exclude": list(opts.exclude_nodes),
        "converter_block_list": "onnxruntime.transformers.float16.DEFAULT_OP_BLOCK_LIST",
        "min_positive_val": MIN_POSITIVE,
        "max_finite_val": MAX_FINITE,
    }
