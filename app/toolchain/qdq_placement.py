"""Q/DQ placement at residual Adds for TensorRT: the skip input quantized, the Conv branch left in float.

TensorRT fuses a residual Add into the Conv whose output it sums (one Conv kernel with an element-wise-add
epilogue) when that Conv's output reaches the Add unquantized and only the other input, the skip (residual)
connection, carries a Q/DQ pair: the Conv then reads the INT8 skip tensor itself, and the Q in front of the next
layer fuses into the same kernel as its INT8 output. A Q/DQ pair on the Conv branch as well makes the Conv write
INT8 and leaves the Add a kernel of its own. NVIDIA: TensorRT developer guide, "Working with Quantized Types",
Q/DQ Layer-Placement Recommendations (quantize the residual input of a residual connection; the precision of that
input decides the precision of the fused Conv's output); TensorRT Model Optimizer's ONNX PTQ places Q/DQ the same
way (modelopt.onnx.quantization.graph_utils: build_non_residual_input_map, remove_partial_input_qdq; PR #425
"Q/DQ nodes were being added to all inputs of Add nodes, whereas it should only be added in the residual branch").

onnxruntime.quantization (1.31) cannot say so: in QDQ format an Add is quantized by QDQOperatorBase, which marks
every input (and the output) for Q/DQ, and neither an extra option nor TensorQuantOverrides (a tensor's scale,
zero point or type, never "leave it float") spares one input. So, like Model Optimizer, app.toolchain.quantize
quantizes the Adds whole and this pass then takes the pair off each residual Add's Conv branch.

Which input is the branch is read from the graph, as Model Optimizer does: an Add of two activations is residual
when one input comes from a Conv (through at most a Q/DQ pair) that feeds nothing else, by the longer path back to
where the two inputs meet (in EfficientNet-Lite the skip tensor is itself that meeting point: the block's input).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import onnx


@dataclass(frozen=True)
class ResidualAdd:
    """A residual Add (by name) and which of its two inputs is the Conv branch and which the skip."""

    node: str
    branch: int
    skip: int
    conv: str  # the Conv the Add fuses into


class _Graph:
    """Producers and consumers of one graph's tensors, with Q -> DQ pairs seen through."""

    def __init__(self, model: onnx.ModelProto) -> None:
        g = model.graph
        self.constants = {i.name for i in g.initializer} | {
            o for n in g.node if n.op_type == "Constant" for o in n.output
        }
        self.producer = {o: n for n in g.node for o in n.output}
        self.consumers: dict[str, list[onnx.NodeProto]] = {}
        for node in g.node:
            for name in node.input:
                self.consumers.setdefault(name, []).append(node)
        self.outputs = {o.name for o in g.output}

    def source(self, tensor: str) -> str:
        """The tensor a DQ(Q(tensor)) chain starts from (the tensor itself when it is not one)."""
        while (dq := self.producer.get(tensor)) is not None and dq.op_type == "DequantizeLinear":
            q = self.producer.get(dq.input[0])
            if q is None or q.op_type != "QuantizeLinear":
                break  # a weight's DequantizeLinear: the int8 initializer is the source
            tensor = q.input[0]
        return tensor

    def users(self, tensor: str) -> list[onnx.NodeProto]:
        """The nodes that read `tensor`, through any Q -> DQ pairs in front of them."""
        found = []
        for node in self.consumers.get(tensor, []):
            if node.op_type == "QuantizeLinear":
                for dq in self.consumers.get(node.output[0], []):
                    found += self.users(dq.output[0]) if dq.op_type == "DequantizeLinear" else [dq]
            else:
                found.append(node)
        return found

    def ancestors(self, tensor: str) -> dict[str, int]:
        """Every activation `tensor` is computed from, with the number of layers (not Q/DQ) in between."""
        start = self.source(tensor)
        depth = {start: 0}
        queue = deque([start])
        while queue:
            t = queue.popleft()
            node = self.producer.get(t)
            if node is None:
                continue
            for name in node.input:
                if name and name not in self.constants and (s := self.source(name)) not in depth:
                    depth[s] = depth[t] + 1
                    queue.append(s)
        return depth

    def residual(self, add: onnx.NodeProto) -> ResidualAdd | None:
        if add.op_type != "Add" or len(add.input) != 2:
            return None
        sources = [self.source(i) for i in add.input]
        if any(s in self.constants for s in sources) or sources[0] == sources[1]:
            return None
        up = [self.ancestors(i) for i in add.input]
        common = set(up[0]) & set(up[1])
        if not common:
            return None
        meet = min(common, key=lambda t: (up[0][t] + up[1][t], t))
        if up[0][meet] == up[1][meet]:
            return None  # two branches of the same length: no input is the skip
        branch = 0 if up[0][meet] > up[1][meet] else 1
        conv = self.producer.get(sources[branch])
        if conv is None or conv.op_type != "Conv" or sources[branch] in self.outputs:
            return None
        if [u.output[0] for u in self.users(sources[branch])] != [add.output[0]]:
            return None  # the Conv's output is needed elsewhere too: no fusion to make room for
        return ResidualAdd(add.name, branch, 1 - branch, conv.name)


def residual_adds(model: onnx.ModelProto) -> list[ResidualAdd]:
    """The residual Adds of an FP32 or a QDQ graph, in graph order."""
    return [r for _, r in _residuals(model, _Graph(model))]


def _residuals(model: onnx.ModelProto, graph: _Graph) -> list[tuple[onnx.NodeProto, ResidualAdd]]:
    return [(node, r) for node in model.graph.node if (r := graph.residual(node)) is not None]


def float_conv_branches(model: onnx.ModelProto) -> int:
    """Take the Q/DQ pair off the Conv branch of every residual Add (in place); return how many were taken off.

    The Add then reads the Conv's output directly. A pair that other nodes still read stays (with
    DedicatedQDQPair none does), and so do the skip input's pair and the Add's output pairs.
    """
    graph = _Graph(model)
    bypassed: list[onnx.NodeProto] = []
    for add, r in _residuals(model, graph):
        dq = graph.producer.get(add.input[r.branch])
        if dq is None or dq.op_type != "DequantizeLinear":
            continue
        add.input[r.branch] = graph.source(add.input[r.branch])
        bypassed += [dq, graph.producer[dq.input[0]]]
    _remove_unread(model, bypassed)
    return len(bypassed) // 2


def _remove_unread(model: onnx.ModelProto, nodes: list[onnx.NodeProto]) -> None:
    """Remove those of `nodes` (a DQ before its Q) whose output nothing reads any more, with the initializers and
    value infos that only they used."""
    g = model.graph
    gone: set[str] = set()
    for node in nodes:
        read = {i for n in g.node for i in n.input} | {o.name for o in g.output}
        if node.output[0] not in read:
            gone |= {*node.input, *node.output}
            g.node.remove(node)
    read = {i for n in g.node for i in n.input} | {o.name for o in g.output}
    for init in [i for i in g.initializer if i.name in gone - read]:
        g.initializer.remove(init)
    for info in [v for v in g.value_info if v.name in gone - read]:
        g.value_info.remove(info)


def placement_problems(model: onnx.ModelProto) -> list[str]:
    """Why TensorRT could not fuse a residual Add of this graph into its Conv (empty: it could fuse every one).

    The Conv branch must reach the Add straight from the Conv, with no Q/DQ pair in between. The skip input
    carries its pair whenever Add is among the op types quantized (the tensorrt target's default); left out
    (--op-types, --exclude-nodes) it stays float, which TensorRT fuses too, with a float output.
    """
    graph = _Graph(model)
    problems = []
    for add, r in _residuals(model, graph):
        branch = graph.producer.get(add.input[r.branch])
        if branch is None or branch.name != r.conv:
            kind = branch.op_type if branch is not None else "a graph input"
            problems.append(f"{r.node}: its Conv branch ({r.conv}) arrives through {kind}, not straight from the Conv")
    return problems
