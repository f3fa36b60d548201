"""app.toolchain.qdq_placement on graphs built by hand: which Add is residual and which input its Conv branch, and the
pass that takes the Q/DQ pair off that branch (computing the same thing, with one rounding fewer). No Ray."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from app.toolchain.qdq_placement import ResidualAdd, float_conv_branches, placement_problems, residual_adds
from app.toolchain.quantize import tensorrt_problems

C = 4  # channels
SHAPE = [1, C, 6, 6]


def _model(nodes: list[onnx.NodeProto], out: str = "y", extra: list[onnx.TensorProto] = ()) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(np.array(0.05, np.float32), "s"),
        numpy_helper.from_array(np.array(0, np.int8), "z"),
        numpy_helper.from_array(np.full(C, 0.5, np.float32), "bias"),
        *[
            numpy_helper.from_array(rng.uniform(-0.5, 0.5, (C, C, 1, 1)).astype(np.float32), f"w{k}")
            for k in range(1, 4)
        ],
        *extra,
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, SHAPE)],
        [helper.make_tensor_value_info(out, TensorProto.FLOAT, SHAPE)],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)  # ORT 1.31 reads <= 13


def conv(x: str, w: str, y: str) -> onnx.NodeProto:
    return helper.make_node("Conv", [x, w, "bias"], [y], name=f"conv_{y}")


def qdq(x: str, tag: str) -> list[onnx.NodeProto]:
    """A dedicated Q -> DQ pair on `x`, its output named x_dq_<tag>."""
    return [
        helper.make_node("QuantizeLinear", [x, "s", "z"], [f"{x}_q_{tag}"], name=f"q_{x}_{tag}"),
        helper.make_node("DequantizeLinear", [f"{x}_q_{tag}", "s", "z"], [f"{x}_dq_{tag}"], name=f"dq_{x}_{tag}"),
    ]


def mbconv_block(branch_pair: bool) -> onnx.ModelProto:
    """x -> Conv -> Relu -> Conv (project) -> Add(., x), quantized as ONNX Runtime writes it for TensorRT: a pair in
    front of each Conv and of each Add input (on the Conv branch only when `branch_pair`)."""
    h = "h_dq_add" if branch_pair else "h"
    nodes = [
        *qdq("x", "c1"),
        conv("x_dq_c1", "w1", "a"),
        helper.make_node("Relu", ["a"], ["r"], name="relu"),
        *qdq("r", "c2"),
        conv("r_dq_c2", "w2", "h"),
        *(qdq("h", "add") if branch_pair else []),
        *qdq("x", "add"),
        helper.make_node("Add", [h, "x_dq_add"], ["y"], name="residual"),
    ]
    return _model(nodes)


def run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    opts = ort.SessionOptions()
    opts.add_session_config_entry("session.disable_quant_qdq", "1")  # Q/DQ computed as written
    session = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


def test_the_pass_takes_the_pair_off_the_conv_branch_only():
    before = mbconv_block(branch_pair=True)
    assert residual_adds(before) == [ResidualAdd("residual", branch=0, skip=1, conv="conv_h")]
    assert placement_problems(before) == [
        "residual: its Conv branch (conv_h) arrives through DequantizeLinear, not straight from the Conv"
    ]
    after = onnx.ModelProto()
    after.CopyFrom(before)
    assert float_conv_branches(after) == 1
    onnx.checker.check_model(after)
    add = next(n for n in after.graph.node if n.op_type == "Add")
    assert list(add.input) == ["h", "x_dq_add"]  # the Conv's output itself; the skip keeps its pair
    assert not any(n.name in ("q_h_add", "dq_h_add") for n in after.graph.node)
    assert len(after.graph.node) == len(before.graph.node) - 2
    assert placement_problems(after) == [] and tensorrt_problems(after) == []
    assert after.SerializeToString() == mbconv_block(branch_pair=False).SerializeToString()
    assert float_conv_branches(after) == 0  # nothing more to take off
    # the same arithmetic, less one rounding of the branch: closer to the float block
    x = np.random.default_rng(1).uniform(-2, 2, SHAPE).astype(np.float32)
    exact = run(strip_qdq(before), x)
    assert np.abs(run(after, x) - exact).mean() < np.abs(run(before, x) - exact).mean()


def strip_qdq(model: onnx.ModelProto) -> onnx.ModelProto:
    """The float graph under the Q/DQ pairs."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    source = {n.output[0]: n.input[0] for n in model.graph.node if n.op_type in ("QuantizeLinear", "DequantizeLinear")}
    del out.graph.node[:]
    for node in model.graph.node:
        if node.op_type in ("QuantizeLinear", "DequantizeLinear"):
            continue
        copy = onnx.NodeProto()
        copy.CopyFrom(node)
        for k, name in enumerate(copy.input):
            while name in source:
                name = source[name]
            copy.input[k] = name
        out.graph.node.append(copy)
    return out


def test_the_skip_is_read_from_the_graph_not_the_input_order():
    nodes = [
        conv("x", "w1", "a"),
        helper.make_node("Relu", ["a"], ["r"], name="relu"),
        conv("r", "w2", "h"),
        helper.make_node("Add", ["x", "h"], ["y"], name="residual"),
    ]
    assert residual_adds(_model(nodes)) == [ResidualAdd("residual", branch=1, skip=0, conv="conv_h")]


def test_a_downsampling_block_fuses_into_its_longer_branch():
    """ResNet's projection shortcut: both inputs come from a Conv; the skip is the shorter way back to x."""
    nodes = [
        conv("x", "w1", "a"),
        helper.make_node("Relu", ["a"], ["r"], name="relu"),
        conv("r", "w2", "h"),
        conv("x", "w3", "shortcut"),
        helper.make_node("Add", ["shortcut", "h"], ["y"], name="residual"),
    ]
    assert residual_adds(_model(nodes)) == [ResidualAdd("residual", branch=1, skip=0, conv="conv_h")]


def test_adds_that_are_not_residual_are_left_alone():
    bias = numpy_helper.from_array(np.ones(SHAPE, np.float32), "c")
    cases = {
        # a constant added: a bias, not a skip connection
        "constant": [conv("x", "w1", "h"), helper.make_node("Add", ["h", "c"], ["y"], name="add")],
        # two Convs of x, as long as each other: neither input is the skip
        "siblings": [conv("x", "w1", "a"), conv("x", "w2", "b"), helper.make_node("Add", ["a", "b"], ["y"])],
        # the branch's Conv output is read elsewhere too: it must be written out anyway, nothing to fuse
        "shared": [
            conv("x", "w1", "h"),
            helper.make_node("Add", ["h", "x"], ["s"], name="add"),
            helper.make_node("Add", ["s", "h"], ["y"], name="add2"),
        ],
        # the longer input ends in a Relu, not a Conv
        "no conv": [
            conv("x", "w1", "a"),
            helper.make_node("Relu", ["a"], ["r"], name="relu"),
            helper.make_node("Add", ["r", "x"], ["y"], name="add"),
        ],
    }
    for case, nodes in cases.items():
        model = _model(nodes, extra=[bias])
        assert residual_adds(model) == [], case
        assert float_conv_branches(model) == 0 and placement_problems(model) == [], case
