"""app.served_model.u8s8: INT8 weights that ONNX Runtime's U8S8 kernels cannot overflow (no Ray, tiny graphs).

The overflow itself needs an x86 CPU without VNNI (this machine and CI's: AMD EPYC, AVX2): there the fused
kernel of the graph before `limit_pairs` is far from the graph computed as written, and after it the two
agree. On a VNNI CPU both agree and the test still checks the second half.
"""

from __future__ import annotations

import copy

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from app.runtime.select import x86_without_vnni
from app.served_model.u8s8 import LANE, MAX_ACTIVATION, PAIR_LIMIT, limit_pairs, pair_problems, pair_sums

CIN, COUT = 16, 8
X_SCALE, Y_SCALE = 6 / 255, 0.05


def qdq_conv(
    weights: np.ndarray, w_scale: np.ndarray, group: int = 1, bias: np.ndarray | None = None
) -> onnx.ModelProto:
    """x -> Q(u8) -> DQ -> Conv(DQ(int8 per-channel weights), DQ(int32 bias)) -> Q(u8) -> DQ -> y."""
    cout = weights.shape[0]
    cin = weights.shape[1] * group
    inits = [
        numpy_helper.from_array(np.array(X_SCALE, np.float32), "xs"),
        numpy_helper.from_array(np.array(0, np.uint8), "xz"),
        numpy_helper.from_array(weights.astype(np.int8), "w_q"),
        numpy_helper.from_array(w_scale.astype(np.float32), "w_s"),
        numpy_helper.from_array(np.zeros(cout, np.int8), "w_z"),
        numpy_helper.from_array(np.array(Y_SCALE, np.float32), "ys"),
        numpy_helper.from_array(np.array(128, np.uint8), "yz"),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["x_q"]),
        helper.make_node("DequantizeLinear", ["x_q", "xs", "xz"], ["x_dq"]),
        helper.make_node("DequantizeLinear", ["w_q", "w_s", "w_z"], ["w"], axis=0),
    ]
    conv_inputs = ["x_dq", "w"]
    if bias is not None:
        b_scale = (X_SCALE * w_scale).astype(np.float32)
        inits += [
            numpy_helper.from_array(np.round(bias / b_scale).astype(np.int32), "b_q"),
            numpy_helper.from_array(b_scale, "b_s"),
            numpy_helper.from_array(np.zeros(cout, np.int32), "b_z"),
        ]
        nodes.append(helper.make_node("DequantizeLinear", ["b_q", "b_s", "b_z"], ["b"], axis=0))
        conv_inputs.append("b")
    nodes += [
        helper.make_node("Conv", conv_inputs, ["c"], group=group, name="conv"),
        helper.make_node("QuantizeLinear", ["c", "ys", "yz"], ["y_q"]),
        helper.make_node("DequantizeLinear", ["y_q", "ys", "yz"], ["y"]),
    ]
    k = weights.shape[2]
    graph = helper.make_graph(
        nodes,
        "qdq_conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, cin, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, cout, 9 - k, 9 - k])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def run(model: onnx.ModelProto, x: np.ndarray, fused: bool) -> np.ndarray:
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    if not fused:
        so.add_session_config_entry("session.disable_quant_qdq", "1")  # every Q/DQ computed as written
    s = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return s.run(None, {"x": x})[0]


def dequantized(model: onnx.ModelProto) -> np.ndarray:
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    return inits["w_q"].astype(np.float64) * inits["w_s"].reshape(-1, 1, 1, 1)


@pytest.fixture
def saturating() -> tuple[onnx.ModelProto, np.ndarray]:
    """Weights whose adjacent pairs reach 2 x 127 and activations at the top of the u8 range."""
    rng = np.random.default_rng(0)
    w = rng.integers(-40, 41, (COUT, CIN, 1, 1))
    w[:, 0:2] = 127  # a same-sign pair of 254 in every channel: 255 * 254 overflows 32,767
    w[1, 4:6, 0, 0] = [-120, -110]
    x = np.full((1, CIN, 8, 8), 6.0, np.float32)  # u8 255 everywhere
    x[..., ::2, :] = rng.uniform(0, 6, (1, CIN, 4, 8))
    return qdq_conv(w, np.full(COUT, 0.01), bias=rng.normal(0, 0.5, COUT)), x


def test_pair_sums_count_same_sign_neighbours_only():
    q = np.array([[[[100]], [[60]], [[-127]], [[-5]]], [[[100]], [[-100]], [[100]], [[-100]]]])  # (2, 4, 1, 1)
    assert pair_sums(q, "Conv").tolist() == [160, 100]  # 100 + 60; opposite signs cannot overflow: max |w|
    gemm = np.array([[50, 50, 50], [-90, -90, 0]])  # Gemm transB=1: (N, K)
    assert pair_sums(gemm, "Gemm", out_axis=0).tolist() == [100, 180]
    assert pair_sums(gemm.T, "Gemm", out_axis=1).tolist() == [100, 180]


def test_pair_sums_take_both_layouts_of_a_spatial_kernel():
    q = np.zeros((1, 2, 2, 2), np.int64)
    q[0, 0, 0, 0], q[0, 1, 0, 0] = 100, 100  # neighbours only in the (kh, kw, cin) order
    assert pair_sums(q, "Conv").tolist() == [200]


def test_limit_pairs_bounds_every_pair_and_keeps_the_function(saturating):
    model, x = saturating
    before = dequantized(model)
    assert pair_problems(model) == ["conv: a weight pair sums to 254"]
    fit = limit_pairs(model)
    assert (fit.layers, fit.rescaled_layers, fit.channels, fit.rescaled_channels) == (1, 1, COUT, COUT)
    assert pair_problems(model) == []
    q = numpy_helper.to_array(next(i for i in model.graph.initializer if i.name == "w_q"))
    assert pair_sums(q, "Conv").max() <= PAIR_LIMIT + 1 and MAX_ACTIVATION * (PAIR_LIMIT + 1) <= LANE
    after = dequantized(model)
    scale = numpy_helper.to_array(next(i for i in model.graph.initializer if i.name == "w_s"))
    # The same weights on a coarser grid: within half a new step of the old values.
    assert np.all(np.abs(after - before) <= scale.reshape(-1, 1, 1, 1) / 2 + 1e-9)
    # The int32 bias keeps the scale QLinearConv reads it at (input scale x weight scale) and its value.
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    np.testing.assert_allclose(inits["b_s"], X_SCALE * inits["w_s"], rtol=1e-6)
    reference = run(model, x, fused=False)
    assert np.abs(run(model, x, fused=True) - reference).max() <= Y_SCALE + 1e-6  # one output step at most


def test_without_the_limit_the_fused_kernel_overflows_where_the_cpu_lacks_vnni(saturating):
    model, x = saturating
    fused, written = run(model, x, fused=True), run(model, x, fused=False)
    limited = model.__deepcopy__()
    limit_pairs(limited)
    assert np.abs(run(limited, x, fused=True) - run(limited, x, fused=False)).max() <= Y_SCALE + 1e-6
    if not x86_without_vnni():
        pytest.skip("a VNNI CPU accumulates in 32 bits: nothing overflows here")
    # x86 without VNNI: 255 x (127 + 127) saturates the kernel's 16-bit pair sum.
    assert np.abs(fused - written).max() > 10 * Y_SCALE


def test_depthwise_layers_and_small_weights_are_left_alone():
    depthwise = qdq_conv(np.full((CIN, 1, 3, 3), 127), np.full(CIN, 0.01), group=CIN)
    assert pair_problems(depthwise) == [] and limit_pairs(depthwise).layers == 0
    small = qdq_conv(np.full((COUT, CIN, 1, 1), 60), np.full(COUT, 0.01))
    before = small.SerializeToString()
    fit = limit_pairs(small)
    assert (fit.layers, fit.rescaled_channels) == (1, 0) and small.SerializeToString() == before


def _model(nodes: list, inits: list, x_shape: list[int], y_shape: list[int]) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, y_shape)],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def _t(name: str, value: np.ndarray) -> onnx.TensorProto:
    return numpy_helper.from_array(value, name)


def _inits(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}


@pytest.mark.parametrize("shared_bias", [False, True], ids=["own-biases", "one-bias"])
def test_weights_shared_by_two_convs_are_rescaled_once_with_their_biases(shared_bias):
    """One weight initializer, two Convs with biases of their own or one bias between them (a module applied
    twice): every bias follows the one rescale, once."""
    w = np.full((COUT, CIN, 1, 1), 20)
    w[:, 0:2] = 127
    scale = np.full(COUT, 0.01, np.float32)
    inits = [
        _t("xs", np.array(X_SCALE, np.float32)),
        _t("xz", np.array(0, np.uint8)),
        _t("w_q", w.astype(np.int8)),
        _t("w_s", scale),
        _t("ys", np.array(Y_SCALE, np.float32)),
        _t("yz", np.array(128, np.uint8)),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["x_q"]),
        helper.make_node("DequantizeLinear", ["x_q", "xs", "xz"], ["x_dq"]),
        helper.make_node("DequantizeLinear", ["w_q", "w_s"], ["w"], axis=0),
    ]
    biases = (0.3,) if shared_bias else (0.3, -0.7)
    for i, b in enumerate(biases):
        inits += [_t(f"b{i}_q", np.full(COUT, round(b / (X_SCALE * 0.01)), np.int32)), _t(f"b{i}_s", X_SCALE * scale)]
        nodes.append(helper.make_node("DequantizeLinear", [f"b{i}_q", f"b{i}_s"], [f"b{i}"], axis=0))
    for i in range(2):
        nodes.append(helper.make_node("Conv", ["x_dq", "w", f"b{0 if shared_bias else i}"], [f"c{i}"], name=f"conv{i}"))
    nodes += [
        helper.make_node("Add", ["c0", "c1"], ["c"]),
        helper.make_node("QuantizeLinear", ["c", "ys", "yz"], ["y_q"]),
        helper.make_node("DequantizeLinear", ["y_q", "ys", "yz"], ["y"]),
    ]
    model = _model(nodes, inits, [1, CIN, 8, 8], [1, COUT, 8, 8])
    fit = limit_pairs(model)
    assert (fit.layers, fit.rescaled_layers, fit.rescaled_channels, fit.skipped) == (2, 2, COUT, ())
    got = _inits(model)
    for i in range(len(biases)):
        np.testing.assert_allclose(got[f"b{i}_s"], X_SCALE * got["w_s"], rtol=1e-6)  # rescaled once, not twice
        np.testing.assert_allclose(got[f"b{i}_q"] * got[f"b{i}_s"], biases[i], atol=X_SCALE * got["w_s"].max())
    assert limit_pairs(model).rescaled_layers == 0 and pair_problems(model) == []  # idempotent
    x = np.full((1, CIN, 8, 8), 6.0, np.float32)
    assert np.abs(run(model, x, fused=True) - run(model, x, fused=False)).max() <= 2 * Y_SCALE + 1e-6


def _dq_layer(op: str, w: np.ndarray, scale: np.ndarray, **dq: int) -> onnx.ModelProto:
    """x -> op(x, DQ(w)) with the weight DQ's attributes as given; Gemm takes transB=1."""
    attrs = {"transB": 1} if op == "Gemm" else {}
    zp = [_t("w_z", np.zeros(scale.shape, np.int8) + dq.pop("zero", 0))] if "zero" in dq else []
    nodes = [
        helper.make_node("DequantizeLinear", ["w_q", "w_s"] + (["w_z"] if zp else []), ["w"], **dq),
        helper.make_node(op, ["x", "w"], ["y"], name="layer", **attrs),
    ]
    return _model(nodes, [_t("w_q", w.astype(np.int8)), _t("w_s", scale.astype(np.float32)), *zp], [1, 4], [1, 4])


def test_gemm_and_matmul_weights_pair_along_their_reduction_axis():
    w = np.array([[100, 100, 1, 1], [1, 1, 1, 1], [60, 60, 60, 60], [-127, -127, 0, 0]])  # (N, K)
    gemm = _dq_layer("Gemm", w, np.full(4, 0.01), axis=0)
    matmul = _dq_layer("MatMul", w.T, np.full(4, 0.01), axis=1)  # (K, N), per output column
    for model, axis in ((gemm, 0), (matmul, 1)):
        before = _inits(model)
        fit = limit_pairs(model)
        assert (fit.rescaled_layers, fit.rescaled_channels) == (1, 2)  # rows 0 (200) and 3 (254)
        after = _inits(model)
        sums = pair_sums(after["w_q"], model.graph.node[1].op_type, axis)
        assert sums.max() <= 128 and pair_problems(model) == []
        old = before["w_q"] * np.expand_dims(before["w_s"], 1 - axis)
        new = after["w_q"] * np.expand_dims(after["w_s"], 1 - axis)
        assert np.all(np.abs(new - old) <= np.expand_dims(after["w_s"], 1 - axis) / 2 + 1e-9)
        # Channels 1 (2) and 2 (120) are within the lane: untouched.
        np.testing.assert_array_equal(after["w_q"].take([1, 2], axis=axis), before["w_q"].take([1, 2], axis=axis))


def test_weights_a_rescale_would_change_are_left_alone_and_still_reported():
    w = np.array([[100, 100, 1, 1]] * 4)
    square = w.T.copy()  # (K, N) with K == N: sizes alone cannot tell the axes apart
    two_scales = _dq_layer("Gemm", w, np.full(4, 0.01), axis=0)
    two_scales.graph.initializer.append(_t("w_s2", np.full(4, 0.02, np.float32)))
    two_scales.graph.node.extend(
        [
            helper.make_node("DequantizeLinear", ["w_q", "w_s2"], ["w2"], axis=0),
            helper.make_node("Gemm", ["x", "w2"], ["y2"], name="layer2", transB=1),
        ]
    )
    cases = {
        "quantized per axis 0, not per output channel (1)": _dq_layer("MatMul", square, np.full(4, 0.01), axis=0),
        "a non-zero weight zero point": _dq_layer("Gemm", w, np.full(4, 0.01), axis=0, zero=3),
        "read through more than one scale": two_scales,
    }
    for why, model in cases.items():
        before = model.SerializeToString()
        fit = limit_pairs(model)
        label = "layer, layer2" if model is two_scales else "layer"
        assert fit.skipped == (f"{label}: {why}",) and fit.rescaled_layers == 0
        assert model.SerializeToString() == before and pair_problems(model) == [f"{label}: a weight pair sums to 200"]


def test_a_conv_with_a_channel_multiplier_runs_on_the_gemm_path_and_is_limited():
    multiplied = qdq_conv(np.full((2 * CIN, 1, 3, 3), 127), np.full(2 * CIN, 0.01), group=CIN)
    assert pair_problems(multiplied) != [] and limit_pairs(multiplied).rescaled_channels == 2 * CIN


def test_a_replica_judges_the_model_file_it_is_given(saturating, tmp_path):
    from app.runtime.select import u8s8_overflows_here

    model, _ = saturating
    inline, external = tmp_path / "inline.onnx", tmp_path / "external.onnx"
    onnx.save(model, str(inline))
    onnx.save(copy.deepcopy(model), str(external), save_as_external_data=True, location="w.bin", size_threshold=0)
    assert u8s8_overflows_here(str(inline)) is u8s8_overflows_here(str(external)) is x86_without_vnni()
    assert u8s8_overflows_here(str(tmp_path / "missing.onnx")) is False  # loading it says so, with the variant
    (tmp_path / "junk.onnx").write_bytes(b"not a model")
    assert u8s8_overflows_here(str(tmp_path / "junk.onnx")) is False
    limit_pairs(model)
    onnx.save(model, str(inline))
    assert u8s8_overflows_here(str(inline)) is False
