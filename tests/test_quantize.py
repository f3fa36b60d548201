"""The INT8 model (QDQ, per-channel weights, agreement with FP32) and the quality/speed report."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from app.models import report as report_module
from app.models.quantize import QuantizeOptions, input_name, quantize
from app.models.report import (
    BATCH_SIZES,
    build_report,
    compare,
    graph_summary,
    resolve_label,
    time_batches,
    to_markdown,
)
from app.models.samples import EVAL_PHOTOS, available_photos, sample_bytes
from app.preprocess import preprocess
from app.runtime import ModelRunner, RuntimeOptions

LIGHT = RuntimeOptions(threads=1, prefer_gpu=False)


@pytest.fixture(scope="module")
def int8_graph(model_files) -> onnx.ModelProto:
    return onnx.load(str(model_files.int8))


@pytest.fixture(scope="module")
def runners(model_files) -> dict[str, ModelRunner]:
    return {"fp32": ModelRunner(model_files.fp32, LIGHT), "int8": ModelRunner(model_files.int8, LIGHT)}


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


def test_quantize_rejects_an_unknown_calibration_method(model_files, tmp_path):
    with pytest.raises(ValueError, match="calibration method"):
        quantize(model_files.fp32, tmp_path / "x.onnx", [], QuantizeOptions(method="kmeans"))
    assert not (tmp_path / "x.onnx").exists()
    assert input_name(model_files.fp32) == "image"


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
    labels = model_files.labels.read_text().splitlines()
    assert len(labels) == 1000 and labels[285] == "Egyptian cat"
    r = build_report(model_files.fp32, model_files.int8, labels, threads=1, extra={"calibration": {"x": 1}})
    assert {"machine", "threads", "provider", "eval_set", "models", "quality", "per_image", "latency"} <= set(r)
    assert r["threads"] == 1 and r["provider"] == "CPUExecutionProvider" and r["calibration"] == {"x": 1}
    assert r["machine"]["cpus"] >= 1
    # the models: Q/DQ only in INT8, Conv computed in FP32 only in the FP32 model
    fp32, int8 = r["models"]["fp32"], r["models"]["int8"]
    assert fp32["quantize_linear"] == fp32["dequantize_linear"] == 0
    assert int8["quantize_linear"] > 0 and int8["dequantize_linear"] > 0
    assert fp32["fp32_op_types"]["Conv"] == 49 and "Conv" not in int8["fp32_op_types"]
    assert int8["bytes"] < fp32["bytes"] / 3
    # quality on the five sample photographs
    q = r["quality"]
    assert q["images"] == 5 and q["top1_agree_count"] >= 4 and q["top1_agreement"] == q["top1_agree_count"] / 5
    assert q["labelled_images"] == 3 and q["fp32_top1_accuracy"] == 1.0
    assert 0 <= q["top5_overlap"] <= 1 and q["mean_kl_divergence"] >= 0 and q["mean_abs_top1_prob_delta"] >= 0
    chelsea = next(p for p in r["per_image"] if p["image"] == "chelsea")
    assert chelsea["label"] == chelsea["fp32_top1"] == 285 and chelsea["fp32_top1_label"] == "Egyptian cat"
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
    report_module.write_report(r, tmp_path / "r.json", tmp_path / "r.md")
    assert json.loads((tmp_path / "r.json").read_text()) == json.loads(json.dumps(r))
    assert (tmp_path / "r.md").read_text() == md


def test_graph_summary_counts(model_files):
    fp32, int8 = graph_summary(model_files.fp32), graph_summary(model_files.int8)
    assert fp32["quantize_linear"] == 0 and fp32["dequantize_linear"] == 0
    assert int8["quantize_linear"] > 0 and int8["dequantize_linear"] > 0
    assert fp32["bytes"] == model_files.fp32.stat().st_size
