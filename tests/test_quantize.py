"""The INT8 models (QDQ, per-channel weights, agreement with FP32; the TensorRT one's Q/DQ rules) and the report."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from app.imaging.preprocess import preprocess
from app.runtime import OrtEngine, RuntimeOptions, cpu_engine, open_engine
from app.runtime.select import x86_without_vnni
from app.served_model import ModelFiles
from app.served_model.graph import read_graph
from app.served_model.u8s8 import pair_problems
from app.toolchain import report as report_module
from app.toolchain.qdq_placement import placement_problems
from app.toolchain.quantize import QuantizeOptions, builtin_model, quantize, tensorrt_problems
from app.toolchain.report import (
    BATCH_SIZES,
    build_report,
    compare,
    graph_summary,
    qdq_as_written,
    report_paths,
    resolve_label,
    time_batches,
    to_markdown,
)
from app.toolchain.samples import EVAL_PHOTOS, augmented_samples, available_photos, sample_bytes

LIGHT = RuntimeOptions(threads=1, prefer_gpu=False)


@pytest.fixture(scope="module")
def int8_graph(model_files) -> onnx.ModelProto:
    return onnx.load(str(model_files.int8))


@pytest.fixture(scope="module")
def trt_model(model_files: ModelFiles) -> Path:
    """The TensorRT INT8 next to the default models, built once like them (`make models` builds it too), and again
    when the one there predates the residual Adds' Q/DQ placement (app.toolchain.qdq_placement)."""
    path = model_files.int8_trt
    if not path.is_file() or placement_problems(onnx.load(str(path))):
        quantize(model_files.fp32, path, augmented_samples(64, 0), QuantizeOptions(target="tensorrt"))
    return path


@pytest.fixture(scope="module")
def trt_graph(trt_model) -> onnx.ModelProto:
    return onnx.load(str(trt_model))


@pytest.fixture(scope="module")
def runners(model_files) -> dict[str, OrtEngine]:
    return {"fp32": cpu_engine(model_files.fp32, LIGHT), "int8": cpu_engine(model_files.int8, LIGHT)}


def test_int8_graph_has_qdq_nodes(int8_graph):
    ops = [n.op_type for n in int8_graph.graph.node]
    assert ops.count("QuantizeLinear") > 0 and ops.count("DequantizeLinear") > ops.count("QuantizeLinear")
    assert ops.count("Conv") == 49
    onnx.checker.check_model(int8_graph)


def test_int8_weights_are_per_channel_symmetric_int8(int8_graph):
    g = int8_graph.graph
    inits = {i.name: numpy_helper.to_array(i) for i in g.initializer}
    producer = {o: n for n in g.node for o in n.output}
    convs = [n for n in g.node if n.op_type == "Conv"]
    for conv in convs:
        dq = producer[conv.input[1]]
        assert dq.op_type == "DequantizeLinear", conv.name
        w, scale, zero = (inits[i] for i in dq.input)
        assert w.dtype == np.int8 and w.ndim == 4, conv.name
        assert scale.ndim == 1 and scale.shape == (w.shape[0],), conv.name  # one scale per output channel
        assert (scale > 0).all(), conv.name
        assert zero.dtype == np.int8 and not zero.any(), conv.name  # symmetric weights
        axis = next((a.i for a in dq.attribute if a.name == "axis"), 1)
        assert axis == 0, conv.name
    # activations: uint8, asymmetric (per-tensor scalars)
    qs = [n for n in g.node if n.op_type == "QuantizeLinear"]
    assert qs and all(inits[q.input[2]].dtype == np.uint8 and inits[q.input[1]].ndim == 0 for q in qs)


def _eval_batch() -> np.ndarray:
    names = [n for n in EVAL_PHOTOS if n in available_photos()]
    assert names == list(EVAL_PHOTOS), "the five sample photographs ship with scikit-image and matplotlib"
    return np.stack([preprocess(sample_bytes(n)) for n in names])


def test_int8_agrees_with_fp32_on_the_sample_photographs(runners):
    x = _eval_batch()
    fp32, int8 = runners["fp32"].logits(x), runners["int8"].logits(x)
    assert int8.shape == fp32.shape == (5, 1000) and int8.dtype == np.float32
    agree = int(np.sum(fp32.argmax(1) == int8.argmax(1)))
    assert agree >= 4, f"INT8 agrees with FP32 on {agree}/5 photographs"
    labelled = [(i, y) for i, y in enumerate(EVAL_PHOTOS.values()) if y is not None]
    assert [int(fp32[i].argmax()) for i, _ in labelled] == [y for _, y in labelled]
    assert not np.allclose(fp32, int8)  # it really is a different model


def test_cpu_int8_weights_cannot_overflow_the_u8s8_kernels(int8_graph):
    assert pair_problems(int8_graph) == []


def test_the_fused_cpu_kernels_compute_what_the_int8_graph_says(model_files, runners):
    """On x86 without VNNI (this machine, CI) the U8S8 kernels overflowed on the unlimited weights: mean |logit
    difference| from the graph computed as written was 0.31, with the pair limit it is 0.033."""
    x = _eval_batch()
    fused, written = runners["int8"].logits(x), qdq_as_written(model_files.int8, LIGHT).logits(x)
    assert np.abs(fused - written).mean() < 0.1
    assert fused.argmax(1).tolist() == written.argmax(1).tolist()


def test_quantize_without_the_pair_limit_keeps_the_calibrated_weights(model_files, tmp_path):
    out = tmp_path / "int8.onnx"
    assert quantize(model_files.fp32, out, augmented_samples(4, 0), QuantizeOptions(pair_limit=False)) is None
    assert len(pair_problems(onnx.load(str(out)))) > 0  # EfficientNet-Lite0's weights do pair past 128
    # A replica given such a model on x86 without VNNI runs it on ORT's U8U8 kernels: right answers, slower.
    opened = open_engine("int8", str(out), RuntimeOptions(threads=1, prefer_gpu=False, precision="int8"))
    x = _eval_batch()
    written = qdq_as_written(out, LIGHT).logits(x)
    if x86_without_vnni():
        assert opened.engine.name == "cpu" and "U8U8" in opened.plan.note
        assert np.abs(opened.engine.logits(x) - written).mean() < 0.1
    else:
        assert "U8U8" not in opened.plan.note


def test_quantize_rejects_an_unknown_calibration_method(model_files, tmp_path):
    with pytest.raises(ValueError, match="calibration method"):
        quantize(model_files.fp32, tmp_path / "x.onnx", [], QuantizeOptions(method="kmeans"))
    assert not (tmp_path / "x.onnx").exists()
    assert read_graph(model_files.fp32).input_name == "image"


# ---------------------------------------------------------------------------------------------
# The TensorRT INT8: symmetric S8S8, FP32 biases, a Q/DQ pair per consumer


def test_tensorrt_artifact_passes_the_tensorrt_rules(trt_graph):
    onnx.checker.check_model(trt_graph)
    assert tensorrt_problems(trt_graph) == [] and placement_problems(trt_graph) == []
    g = trt_graph.graph
    assert next(o.version for o in trt_graph.opset_import if o.domain in ("", "ai.onnx")) >= 13
    inits = {i.name: numpy_helper.to_array(i) for i in g.initializer}
    producer = {o: n for n in g.node for o in n.output}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for n in g.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    # spelled out here too, so the rules do not rest on tensorrt_problems alone
    qdq = [n for n in g.node if n.op_type in ("QuantizeLinear", "DequantizeLinear")]
    assert qdq and all(inits[n.input[2]].dtype == np.int8 and not inits[n.input[2]].any() for n in qdq)
    assert not any(n.input[0] in inits and inits[n.input[0]].dtype == np.int32 for n in qdq)
    for q in (n for n in qdq if n.op_type == "QuantizeLinear"):
        assert [c.op_type for c in consumers[q.output[0]]] == ["DequantizeLinear"], q.name
    # every Conv and the Gemm take INT8 activations and per-channel INT8 weights; their biases stay FP32
    for node in (n for n in g.node if n.op_type in ("Conv", "Gemm")):
        x, w = producer[node.input[0]], producer[node.input[1]]
        assert x.op_type == w.op_type == "DequantizeLinear", node.name
        assert producer[x.input[0]].op_type == "QuantizeLinear", node.name
        weights, scale = inits[w.input[0]], inits[w.input[1]]
        assert weights.dtype == np.int8 and weights.min() >= -127 and scale.ndim == 1, node.name
        assert inits[node.input[2]].dtype == np.float32, node.name
    assert sum(n.op_type == "Conv" for n in g.node) == 49
    # the uint8 image's normalisation stays FP32: the first Q/DQ sits in front of the stem Conv
    dq_outputs = {n.output[0] for n in qdq if n.op_type == "DequantizeLinear"}
    normalisation = [n for n in g.node if n.op_type in ("Cast", "Sub", "Mul")]
    assert len(normalisation) == 3 and not any(i in dq_outputs for n in normalisation for i in n.input)


def test_tensorrt_residual_adds_quantize_only_the_skip_input(model_files, trt_graph):
    """NVIDIA's Q/DQ placement for residual connections: at each residual Add only the skip input carries a Q/DQ
    pair and the block's project Conv feeds the Add in float, so that TensorRT fuses the Add into that Conv (with
    a pair on both inputs it cannot; docs/engines.md). Read from the graphs alone, not from app.toolchain.qdq_placement.
    """
    fp32 = onnx.load(str(model_files.fp32)).graph
    fp32_producer = {o: n for n in fp32.node for o in n.output}
    fp32_readers = Counter(i for n in fp32.node for i in n.input)
    weights = {i.name for i in fp32.initializer}
    # EfficientNet-Lite0's residual Adds: 16 MBConv blocks, 9 of them keep shape and add their input back
    fp32_adds = [n for n in fp32.node if n.op_type == "Add" and not weights & set(n.input)]
    assert len(fp32_adds) == 9
    g = trt_graph.graph
    producer = {o: n for n in g.node for o in n.output}
    adds = {n.name: n for n in g.node if n.op_type == "Add"}
    assert len(adds) == len(fp32_adds)
    for fp32_add in fp32_adds:
        # the Conv branch is read by the Add alone; the skip, the block's input, by the block's first Conv too
        (branch,) = [i for i in fp32_add.input if fp32_readers[i] == 1]
        (skip,) = [i for i in fp32_add.input if fp32_readers[i] > 1]
        assert fp32_producer[branch].op_type == "Conv", fp32_add.name
        add = adds[fp32_add.name]
        assert sorted(producer[i].op_type for i in add.input) == ["Conv", "DequantizeLinear"], add.name
        assert branch in add.input and producer[branch].op_type == "Conv", add.name  # no Q/DQ in between
        (dq,) = [producer[i] for i in add.input if producer[i].op_type == "DequantizeLinear"]
        q = producer[dq.input[0]]
        assert q.op_type == "QuantizeLinear" and q.input[0] == skip, add.name
        # its output stays INT8 for what reads it next (the next block's Conv, the next residual Add)
        readers = [n for n in g.node if add.output[0] in n.input]
        assert readers and all(n.op_type == "QuantizeLinear" for n in readers), add.name
    # and the Conv outputs that feed an Add are quantized nowhere
    conv_outputs = {b for a in adds.values() for b in a.input if producer[b].op_type == "Conv"}
    assert len(conv_outputs) == 9
    assert not any(n.op_type == "QuantizeLinear" and n.input[0] in conv_outputs for n in g.node)


def test_cpu_artifact_fails_the_tensorrt_rules(int8_graph):
    """The check can fail: the CPU INT8 (uint8 activations, int32 biases, shared pairs) breaks three rules."""
    problems = tensorrt_problems(int8_graph)
    assert any("zero point uint8" in p for p in problems)
    assert any("dequantizes int32" in p for p in problems)
    assert any("shared by 2 nodes" in p for p in problems)


def test_tensorrt_problems_names_each_rule():
    """Q feeding a Relu, DQ of int32, opset 12, a -128 weight: each caught, on a graph built by hand."""
    from onnx import TensorProto, helper

    init = [
        numpy_helper.from_array(np.array(0.1, np.float32), "s"),
        numpy_helper.from_array(np.array(0, np.int8), "z"),
        numpy_helper.from_array(np.array([1, 2], np.int32), "b"),
        numpy_helper.from_array(np.array(0, np.int32), "z32"),
        numpy_helper.from_array(np.array([-128, 5], np.int8), "w"),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"], name="q"),
        helper.make_node("Relu", ["xq"], ["r"], name="relu"),
        helper.make_node("DequantizeLinear", ["b", "s", "z32"], ["bf"], name="dq_bias"),
        helper.make_node("DequantizeLinear", ["w", "s", "z"], ["wf"], name="dq_w"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, [2]) for o in ("bf", "wf")],
        init,
    )
    problems = tensorrt_problems(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 12)]))
    assert problems[0] == "opset 12 < 13"
    assert any(p.startswith("q: feeds ['Relu']") for p in problems)
    assert any(p.startswith("dq_bias: dequantizes int32") for p in problems)
    assert any(p.startswith("dq_bias: zero point int32") for p in problems)
    assert any(p.startswith("dq_w: int8 weights reach -128") for p in problems)


def test_tensorrt_artifact_agrees_with_fp32_on_the_sample_photographs(trt_model, runners):
    x = _eval_batch()
    fp32 = runners["fp32"].logits(x)
    trt = qdq_as_written(trt_model, LIGHT).logits(x)
    assert trt.shape == fp32.shape == (5, 1000) and trt.dtype == np.float32
    agree = int(np.sum(fp32.argmax(1) == trt.argmax(1)))
    assert agree >= 4, f"the TensorRT INT8 agrees with FP32 on {agree}/5 photographs"
    assert not np.allclose(fp32, trt)


def test_quantize_tensorrt_target_checks(model_files, tmp_path):
    with pytest.raises(ValueError, match="quantization target 'gpu'"):
        quantize(model_files.fp32, tmp_path / "x.onnx", [], QuantizeOptions(target="gpu"))  # type: ignore[arg-type]
    old = onnx.load(str(model_files.fp32))
    old.opset_import[0].version = 12  # what the check reads; the model is never run
    onnx.save(old, str(tmp_path / "old.onnx"))
    with pytest.raises(ValueError, match="opset 12; the tensorrt target needs opset >= 13"):
        quantize(tmp_path / "old.onnx", tmp_path / "x.onnx", [], QuantizeOptions(target="tensorrt"))
    assert not (tmp_path / "x.onnx").exists()
    assert ModelFiles(tmp_path).int8_for("tensorrt").name == "efficientnet_lite0-int8-trt.onnx"
    assert ModelFiles(tmp_path).int8_for("cpu") == ModelFiles(tmp_path).int8


# ---------------------------------------------------------------------------------------------
# The report


def test_compare_on_known_logits():
    a = np.array([[5.0, 1.0, 0.0, 0.0, 0.0, 0.0], [0.0, 4.0, 1.0, 0.0, 0.0, 0.0]])
    same = compare(a, a.copy(), [0, None])
    assert same["images"] == 2 and same["top1_agreement"] == 1.0 and same["top1_agree_count"] == 2
    assert same["top5_overlap"] == 1.0 and same["mean_kl_divergence"] == pytest.approx(0, abs=1e-9)
    assert same["labelled_images"] == 1 and same["fp32_top1_accuracy"] == same["int8_top1_accuracy"] == 1.0
    b = a.copy()
    b[1] = [0.0, 1.0, 4.0, 0.0, 0.0, 0.0]  # second image flips its top-1
    diff = compare(a, b, [None, 2])
    assert diff["top1_agreement"] == 0.5 and diff["top1_agree_count"] == 1
    assert diff["mean_kl_divergence"] > 0.5 and diff["mean_abs_top1_prob_delta"] == pytest.approx(0, abs=1e-9)
    assert diff["fp32_top1_accuracy"] == 0.0 and diff["int8_top1_accuracy"] == 1.0
    assert "labelled_images" not in compare(a, b, [None, None])


def test_resolve_label():
    labels = ["tench", "goldfish", "Egyptian cat"]
    assert resolve_label("2", labels) == 2
    assert resolve_label("egyptian_cat", labels) == 2 and resolve_label("Egyptian cat", labels) == 2
    assert resolve_label("dog", labels) is None and resolve_label(None, labels) is None


def test_time_batches_rows(runners):
    rows = time_batches(runners["int8"], (1, 2), budget_s=0.0)
    assert [r["batch"] for r in rows] == [1, 2]
    for r in rows:
        assert r["runs"] >= 5
        assert 0 < r["p50_ms"] <= r["p99_ms"]
        assert r["images_per_s"] > 0


def _fake_rows(runner, batch_sizes, budget_s=1.5):
    """Latency rows without spending seconds per batch size: fp32 p50 = 4 * batch ms, int8 = 2 * batch ms."""
    per_image = 4.0 if "fp32" in runner.path.name else 2.0
    return [
        {"batch": n, "runs": 5, "p50_ms": per_image * n, "p99_ms": per_image * n + 1, "images_per_s": 1000 / per_image}
        for n in batch_sizes
    ]


def test_build_report(model_files, monkeypatch, tmp_path):
    monkeypatch.setattr(report_module, "time_batches", _fake_rows)
    model = builtin_model()
    calibration = augmented_samples(3, 0)
    r = build_report(model_files.fp32, model_files.int8, model, "cpu", calibration, threads=1, extra={"x": 1})
    assert {"machine", "threads", "provider", "eval_set", "models", "quality", "per_image", "latency"} <= set(r)
    assert r["threads"] == 1 and r["provider"] == "CPUExecutionProvider" and r["x"] == 1
    assert r["machine"]["cpus"] >= 1 and r["model"]["name"] == "efficientnet_lite0" and r["target"] == "cpu"
    assert "fused QDQ kernels" in r["evaluated_as"] and r["other_path"]["name"].startswith("Q/DQ computed as written")
    # the models: Q/DQ only in INT8, Conv computed in FP32 only in the FP32 model
    fp32, int8 = r["models"]["fp32"], r["models"]["int8"]
    assert fp32["quantize_linear"] == fp32["dequantize_linear"] == 0
    assert int8["quantize_linear"] > 0 and int8["dequantize_linear"] > 0
    assert fp32["fp32_op_types"]["Conv"] == 49 and "Conv" not in int8["fp32_op_types"]
    assert int8["bytes"] < fp32["bytes"] / 3
    # quality on the five sample photographs, prepared as the declaration serves them
    q = r["quality"]
    assert q["images"] == 5 and q["top1_agree_count"] >= 4 and q["top1_agreement"] == q["top1_agree_count"] / 5
    assert q["labelled_images"] == 3
    labelled = [p for p in r["per_image"] if p["label"] is not None]
    assert q["fp32_top1_accuracy"] == sum(p["fp32_top1"] == p["label"] for p in labelled) / 3
    assert 0 <= q["top5_overlap"] <= 1 and q["mean_kl_divergence"] >= 0 and q["mean_abs_top1_prob_delta"] >= 0
    coffee = next(p for p in r["per_image"] if p["image"] == "coffee")
    assert coffee["label"] == coffee["fp32_top1"] == 967 and coffee["fp32_top1_label"] == "espresso"
    # the calibration images too
    assert r["calibration_quality"]["images"] == 3
    # latency for every batch size, speed-up = FP32 p50 / INT8 p50
    assert tuple(BATCH_SIZES) == (1, 8, 16, 32)
    for variant in ("fp32", "int8"):
        assert [row["batch"] for row in r["latency"][variant]] == [1, 8, 16, 32]
    assert r["int8_speedup_by_batch"] == {"1": 2.0, "8": 2.0, "16": 2.0, "32": 2.0}
    # every key to_markdown reads is there, and it renders one latency row per batch size
    md = to_markdown(r)
    for n in (1, 8, 16, 32):
        assert f"\n| {n} | {4.0 * n:.1f} |" in md
    assert f"({q['top1_agree_count']}/5)" in md and "top-1 accuracy FP32 / INT8 (3 labelled)" in md
    assert "on the 3 calibration images" in md and md.startswith("efficientnet_lite0: efficientnet_lite0-fp32.onnx")
    report_module.write_report(r, tmp_path / "r.json", tmp_path / "r.md")
    assert json.loads((tmp_path / "r.json").read_text()) == json.loads(json.dumps(r))
    assert (tmp_path / "r.md").read_text() == md
    assert [p.name for p in report_paths(tmp_path / "m-int8.onnx")] == ["m-int8.report.json", "m-int8.report.md"]


def test_build_report_of_the_tensorrt_artifact(model_files, trt_model, monkeypatch):
    monkeypatch.setattr(report_module, "time_batches", _fake_rows)
    r = build_report(model_files.fp32, trt_model, builtin_model(), "tensorrt", threads=1, batch_sizes=(1,))
    # judged as TensorRT computes it (Q/DQ as written); ORT's fused kernels beside it; no CPU timings
    assert (
        "session.disable_quant_qdq=1" in r["evaluated_as"] and r["other_path"]["name"] == "ORT's fused S8S8 CPU kernels"
    )
    assert "latency" not in r and "calibration_quality" not in r
    m = r["models"]["int8"]
    # 9 residual Adds, each without the Q/DQ pair on its Conv branch: 68 / 118 / 284 with it
    assert m["quantize_linear"] == 59 and m["dequantize_linear"] == 109 and m["nodes"] == 266
    assert "Conv" not in m["fp32_op_types"] and m["bytes"] < r["models"]["fp32"]["bytes"] / 3
    assert r["quality"]["images"] == 5 and r["quality"]["top1_agree_count"] >= 4
    assert [p["image"] for p in r["per_image"]] == list(EVAL_PHOTOS)
    assert all(0 < p["int8_top1_prob"] <= 1 and 0 < p["fp32_top1_prob"] <= 1 for p in r["per_image"])
    md = to_markdown(r)
    assert "against its INT8 build efficientnet_lite0-int8-trt.onnx (target tensorrt)" in md
    assert "| QuantizeLinear / DequantizeLinear | - | 59 / 109 |" in md
    assert "belongs to TensorRT on a GPU" in md and "ORT's fused S8S8 CPU kernels" in md
    assert json.loads(json.dumps(r)) == r


def test_graph_summary_counts(model_files):
    fp32, int8 = graph_summary(model_files.fp32), graph_summary(model_files.int8)
    assert fp32["quantize_linear"] == 0 and fp32["dequantize_linear"] == 0
    assert int8["quantize_linear"] > 0 and int8["dequantize_linear"] > 0
    assert fp32["bytes"] == model_files.fp32.stat().st_size
