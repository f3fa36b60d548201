"""The FP32 EfficientNet-Lite0 ONNX graph: TF SAME padding, BN folding, structure, and its predictions."""

from __future__ import annotations

import math
from collections import Counter

import cv2
import numpy as np
import onnx
import onnxruntime as ort
import pytest
import skimage.data

from app.runtime import softmax
from app.toolchain import efficientnet
from app.toolchain.efficientnet import Stage, build_model, fold_batchnorm, same_pads
from tests.test_weights import ARCH, CLASSES, HEAD, STEM


@pytest.mark.parametrize(
    ("size", "kernel", "stride", "pads"),
    [
        (224, 3, 2, (0, 1)),  # the stem: TF puts the odd pixel after, PyTorch's symmetric padding would not
        (56, 5, 2, (1, 2)),
        (112, 3, 2, (0, 1)),
        (225, 3, 2, (1, 1)),  # odd input: symmetric after all
        (112, 3, 1, (1, 1)),
        (14, 5, 1, (2, 2)),
        (7, 1, 1, (0, 0)),
        (7, 1, 2, (0, 0)),
    ],
)
def test_same_pads_tensorflow_semantics(size, kernel, stride, pads):
    assert same_pads(size, kernel, stride) == pads


@pytest.mark.parametrize("kernel", [1, 3, 5])
@pytest.mark.parametrize("stride", [1, 2])
def test_same_pads_keeps_ceil_size_and_puts_the_extra_pixel_after(kernel, stride):
    for size in range(1, 80):
        before, after = same_pads(size, kernel, stride)
        assert after - before in (0, 1)
        assert (size + before + after - kernel) // stride + 1 == math.ceil(size / stride)
        if stride == 1:
            assert before == after == (kernel - 1) // 2


def test_architecture_constants():
    table = [(s.repeats, s.kernel, s.stride, s.expand, s.out_channels) for s in efficientnet.STAGES]
    assert table == list(ARCH)  # the independent transcription the weights tests check shapes against
    assert (efficientnet.STEM_CHANNELS, efficientnet.HEAD_CHANNELS, efficientnet.NUM_CLASSES) == (STEM, HEAD, CLASSES)
    assert isinstance(efficientnet.STAGES[0], Stage)


def test_fold_batchnorm_equals_conv_then_batchnorm():
    rng = np.random.default_rng(0)
    w = rng.normal(size=(4, 3, 1, 1)).astype(np.float32)
    sd = {
        "bn.weight": rng.normal(size=4).astype(np.float32),
        "bn.bias": rng.normal(size=4).astype(np.float32),
        "bn.running_mean": rng.normal(size=4).astype(np.float32),
        "bn.running_var": np.array([0.0, 0.5, 1.0, 4.0], np.float32),  # a dead channel too
    }
    x = rng.normal(size=(3, 10)).astype(np.float32)
    conv = w[:, :, 0, 0] @ x
    bn = (conv - sd["bn.running_mean"][:, None]) / np.sqrt(sd["bn.running_var"][:, None] + 1e-3)
    bn = bn * sd["bn.weight"][:, None] + sd["bn.bias"][:, None]
    fw, fb = fold_batchnorm(w, sd, "bn")
    assert fw.dtype == fb.dtype == np.float32 and fw.shape == w.shape and fb.shape == (4,)
    np.testing.assert_allclose(fw[:, :, 0, 0] @ x + fb[:, None], bn, rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def fp32_graph(model_files) -> onnx.ModelProto:
    return onnx.load(str(model_files.fp32))


@pytest.fixture(scope="module")
def session(model_files) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1  # keep off the cores other test tiers use
    so.log_severity_level = 3
    return ort.InferenceSession(str(model_files.fp32), sess_options=so, providers=["CPUExecutionProvider"])


def _dims(value_info: onnx.ValueInfoProto) -> list[int | str]:
    return [d.dim_param or d.dim_value for d in value_info.type.tensor_type.shape.dim]


def test_graph_structure(fp32_graph):
    g = fp32_graph.graph
    ops = Counter(n.op_type for n in g.node)
    assert ops["Conv"] == 1 + 2 + 15 * 3 + 1  # stem, block 0 (no expansion), 15 expanded blocks, head
    assert ops["Clip"] == 1 + 1 + 15 * 2 + 1  # ReLU6 after every conv but the projections
    assert ops["Add"] == 9  # residuals: stride 1 with equal in/out channels
    assert ops["Gemm"] == ops["GlobalAveragePool"] == ops["Transpose"] == 1
    assert "BatchNormalization" not in ops  # folded
    stem = next(n for n in g.node if n.op_type == "Conv")
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in stem.attribute}
    assert attrs["pads"] == [0, 0, 1, 1] and attrs["strides"] == [2, 2] and attrs["kernel_shape"] == [3, 3]
    assert {o.domain: o.version for o in fp32_graph.opset_import}[""] == efficientnet.OPSET
    assert fp32_graph.ir_version == efficientnet.IR_VERSION
    onnx.checker.check_model(fp32_graph)


def test_input_and_output_names_dtypes_and_dynamic_batch(fp32_graph, session):
    (inp,), (out,) = fp32_graph.graph.input, fp32_graph.graph.output
    assert inp.name == "image" and inp.type.tensor_type.elem_type == onnx.TensorProto.UINT8
    assert out.name == "logits" and out.type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    assert _dims(inp) == ["N", 224, 224, 3] and _dims(out) == ["N", 1000]
    (si,), (so,) = session.get_inputs(), session.get_outputs()
    assert (si.name, si.type, si.shape) == ("image", "tensor(uint8)", ["N", 224, 224, 3])
    assert (so.name, so.type, so.shape) == ("logits", "tensor(float)", ["N", 1000])


def _photo(name: str) -> np.ndarray:
    return cv2.resize(getattr(skimage.data, name)(), (224, 224), interpolation=cv2.INTER_AREA)


@pytest.mark.parametrize(("photo", "label", "prob"), [("chelsea", 285, 0.78), ("coffee", 967, 0.90)])
def test_fp32_predictions_on_known_photographs(session, photo, label, prob):
    (logits,) = session.run(None, {"image": _photo(photo)[None]})
    assert logits.shape == (1, 1000) and logits.dtype == np.float32
    p = softmax(logits.astype(np.float64))[0]
    assert int(p.argmax()) == label
    assert abs(p[label] - prob) < 0.02


def test_batch_rows_equal_single_image_runs(session):
    batch = np.stack([_photo("chelsea"), _photo("coffee"), _photo("astronaut")])
    (logits3,) = session.run(None, {"image": batch})
    assert logits3.shape == (3, 1000)
    for i in range(3):
        (logits1,) = session.run(None, {"image": batch[i : i + 1]})
        np.testing.assert_allclose(logits3[i], logits1[0], atol=1e-4, rtol=0)
    assert not np.allclose(logits3[0], logits3[1], atol=1e-2)  # rows really are different images


def test_normalisation_and_layout_change_are_in_the_graph(fp32_graph, session):
    """Clients ship uint8 NHWC; (x - 127) / 128 and NHWC -> NCHW happen inside the graph."""
    g = fp32_graph.graph
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in g.initializer}
    first = g.node[:4]
    assert [n.op_type for n in first] == ["Cast", "Sub", "Mul", "Transpose"]
    assert first[0].input[0] == "image"
    assert float(inits[first[1].input[1]]) == 127.0 and float(inits[first[2].input[1]]) == 1 / 128
    assert list(onnx.helper.get_attribute_value(first[3].attribute[0])) == [0, 3, 1, 2]
    with pytest.raises(Exception, match=r"(?i)type"):
        session.run(None, {"image": np.zeros((1, 224, 224, 3), np.float32)})


def test_build_model_rejects_a_state_dict_with_extra_blocks():
    from app.toolchain.build import weights_path
    from app.toolchain.weights import load_legacy_state_dict

    sd = dict(load_legacy_state_dict(weights_path()))
    sd["_blocks.16._project_conv.weight"] = np.zeros((320, 1920, 1, 1), np.float32)
    with pytest.raises(ValueError, match="more than 16 blocks"):
        build_model(sd)
    del sd["_blocks.16._project_conv.weight"], sd["_blocks.15._project_conv.weight"]
    with pytest.raises(KeyError, match=r"_blocks\.15\._project_conv\.weight"):
        build_model(sd)


# --------------------------------------------------------------------------- Lite1, exported as PyTorch users do


def test_lite1_repeats_lite0s_stages_deeper_and_keeps_the_first_and_last() -> None:
    assert [s.repeats for s in efficientnet.LITE1.stages()] == [1, 3, 3, 4, 4, 5, 1]  # 21 blocks, as its weights
    assert efficientnet.LITE0.stages() == efficientnet.STAGES and efficientnet.LITE1.input_size == 240


def test_lite1_as_a_pytorch_export_takes_float_nchw_with_its_normalisation_outside(tmp_path) -> None:
    from app.toolchain.build import export_lite1

    export_lite1(tmp_path / "lite1.onnx")
    model = onnx.load(str(tmp_path / "lite1.onnx"))
    (inp,), (out,) = model.graph.input, model.graph.output
    assert inp.name == "input" and inp.type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    assert _dims(inp) == ["N", 3, 240, 240] and _dims(out) == ["N", 1000]
    assert model.graph.node[0].op_type == "Conv" and model.graph.node[0].input[0] == "input"  # nothing in front
    assert Counter(n.op_type for n in model.graph.node)["Conv"] == 1 + 2 + 20 * 3 + 1
    session = ort.InferenceSession(str(tmp_path / "lite1.onnx"), providers=["CPUExecutionProvider"])
    img = cv2.resize(skimage.data.coffee(), (240, 240), interpolation=cv2.INTER_AREA).astype(np.float32)
    x = ((img - 127.0) / 128.0).transpose(2, 0, 1)[None]
    p = softmax(session.run(None, {"input": x})[0].astype(np.float64))[0]
    assert int(p.argmax()) == 967 and p[967] > 0.4  # espresso: the weights are read right at 240 px too
