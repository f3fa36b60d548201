"""The FP16 build (app/toolchain/fp16.py, `quantize --target fp16`) and its report: IO types kept, weights FP16, what
must stay FP32 stays FP32, clamped weights counted, INT8 and FP16 inputs refused, the served prologue still fits,
and the report judged where this machine can. Pure unit tests: no Ray; real ONNX Runtime sessions on the CPU."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.transformers.float16 import DEFAULT_OP_BLOCK_LIST

from app.imaging.preprocess import preprocess
from app.models.cli import main
from app.runtime import CPU, CUDA, usable_providers
from app.served_model import TARGETS, ModelFiles, builtin_transform, is_builtin_file
from app.served_model.declaration import PreprocessDeclaration
from app.served_model.graph import graph_io_of, read_graph
from app.served_model.prologue import served_model
from app.toolchain.fp16 import (
    FP32_OPS,
    Clamped,
    Fp16Options,
    NotFloat32Error,
    clamped,
    convert,
    float32_ops,
    precision_of,
    to_fp16,
)
from app.toolchain.quantize import QuantizeOptions, quantize
from app.toolchain.report import report_paths
from app.toolchain.samples import EVAL_PHOTOS, sample_bytes

REPO = Path(__file__).resolve().parent.parent
LOCAL = REPO / "configs" / "local.yaml"
FLOAT_TYPES = (TensorProto.FLOAT, TensorProto.FLOAT16)
Built = tuple[Path, Clamped]  # the built-in model's FP16 build, and what it clamped
Reported = tuple[Path, int, dict[str, Any]]  # an FP16 build by the CLI, its exit status, its report
Capsys = pytest.CaptureFixture[str]


@pytest.fixture(scope="module")
def built(model_files: ModelFiles, tmp_path_factory: pytest.TempPathFactory) -> Built:
    """The built-in FP32 model converted with the defaults, into a directory of its own."""
    out = ModelFiles(tmp_path_factory.mktemp("fp16")).fp16
    return out, convert(model_files.fp32, out)


def _session(model: onnx.ModelProto | Path) -> ort.InferenceSession:
    data = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
    return ort.InferenceSession(data, providers=["CPUExecutionProvider"])


def _tiny(nodes: list[onnx.NodeProto], inits: list[np.ndarray], out: str = "probs") -> onnx.ModelProto:
    """A float32 NCHW [N, 3, 8, 8] graph of `nodes`, initializers named w0, w1, ... in order."""
    graph = helper.make_graph(
        nodes,
        "tiny",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 3, 8, 8])],
        [helper.make_tensor_value_info(out, TensorProto.FLOAT, ["N", 4])],
        [numpy_helper.from_array(a, f"w{i}") for i, a in enumerate(inits)],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def _conv_mean_softmax(weight: np.ndarray) -> onnx.ModelProto:
    """Conv (FP16) -> ReduceMean -> Softmax (both kept FP32) -> probabilities."""
    return _tiny(
        [
            helper.make_node("Conv", ["input", "w0"], ["c"], name="conv", pads=[1, 1, 1, 1]),
            helper.make_node("ReduceMean", ["c"], ["r"], name="mean", axes=[2, 3], keepdims=0),
            helper.make_node("Softmax", ["r"], ["probs"], name="softmax", axis=1),
        ],
        [weight],
    )


# ---------------------------------------------------------------------------------------------
# The built-in model


def test_the_builtin_build_keeps_its_io_and_holds_its_weights_in_fp16(model_files: ModelFiles, built: Built) -> None:
    path, _ = built
    fp32, fp16 = onnx.load(str(model_files.fp32)), onnx.load(str(path))
    onnx.checker.check_model(fp16, full_check=True)
    assert graph_io_of(fp16) == graph_io_of(fp32)  # uint8 NHWC 'image' in, [N, 1000] 'logits' out
    assert read_graph(path).dtype == "uint8" and fp16.graph.output[0].type.tensor_type.elem_type == TensorProto.FLOAT
    floats = Counter(t.data_type for t in fp16.graph.initializer if t.data_type in FLOAT_TYPES)
    assert floats == {TensorProto.FLOAT16: len(fp32.graph.initializer)}  # every weight, nothing left in FP32
    assert float32_ops(fp16) == {} and precision_of(fp16) == "fp16" and precision_of(fp32) == "fp32"
    assert 0.45 < path.stat().st_size / model_files.fp32.stat().st_size < 0.55
    assert [n.op_type for n in fp16.graph.node].count("Conv") == 49
    assert is_builtin_file(model_files.fp16) and model_files.fp16.name == "efficientnet_lite0-fp16.onnx"
    assert "fp16" in TARGETS


def test_the_builtin_normalisation_is_exact_in_fp16(built: Built) -> None:
    """The graph's own prologue, Cast -> Sub 127 -> Mul 1/128, now runs in FP16: every pixel value gives exactly
    what FP32 gives (integers to 2048 are exact in FP16, and 1/128 is a power of two)."""
    fp16 = onnx.load(str(built[0]))
    cast, sub, mul = fp16.graph.node[:3]
    assert (cast.op_type, sub.op_type, mul.op_type) == ("Cast", "Sub", "Mul")
    assert cast.attribute[0].i == TensorProto.FLOAT16
    inits = {t.name: numpy_helper.to_array(t) for t in fp16.graph.initializer}
    mean, scale = inits[sub.input[1]], inits[mul.input[1]]
    assert mean.dtype == scale.dtype == np.float16
    x = np.arange(256, dtype=np.uint8)
    half = (x.astype(np.float16) - mean) * scale
    assert half.dtype == np.float16
    np.testing.assert_array_equal(half.astype(np.float32), (x.astype(np.float32) - 127) / 128)


def test_the_cpu_ep_runs_an_fp16_build_as_fp32_on_fp16_rounded_weights(model_files: ModelFiles, built: Built) -> None:
    """What the report says when it judges on the CPU EP: ORT casts the FP16 graph onto its float kernels and drops
    the Casts between them, so the activations stay FP32 and only the weights' rounding shows (not the GPU's)."""
    fp32 = onnx.load(str(model_files.fp32))
    for t in fp32.graph.initializer:
        t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float16).astype(np.float32), t.name))
    x = np.stack([preprocess(sample_bytes(n), builtin_transform()) for n in EVAL_PHOTOS])
    half = _session(built[0]).run(None, {"image": x})[0]
    rounded = _session(fp32).run(None, {"image": x})[0]
    exact = _session(model_files.fp32).run(None, {"image": x})[0]
    assert np.abs(half - rounded).max() < 1e-4 < np.abs(half - exact).max()


def test_the_builtin_weights_outside_fp16s_normal_range_are_counted(model_files: ModelFiles, built: Built) -> None:
    _, counted = built
    fp32 = onnx.load(str(model_files.fp32))
    w = np.abs(np.concatenate([numpy_helper.to_array(t).ravel() for t in fp32.graph.initializer]))
    assert counted.values == w.size and counted.tensors == len(fp32.graph.initializer)
    assert counted.above_max == 0 and counted.total == int(np.sum((w > 0) & (w < 2.0**-14)))
    assert counted.below_min == int(np.sum((w > 0) & (w < 5.96e-08))) and counted.subnormal > 0
    assert counted.to_dict()["total"] == counted.above_max + counted.subnormal + counted.below_min


def test_keep_fp32_and_exclude_nodes_keep_those_nodes_in_fp32(model_files: ModelFiles) -> None:
    fp32 = onnx.load(str(model_files.fp32))
    opts = Fp16Options(keep_fp32=["GlobalAveragePool"], exclude_nodes=["_conv_stem.out"])
    fp16 = to_fp16(fp32, opts)
    assert float32_ops(fp16) == {"Conv": 1, "GlobalAveragePool": 1}
    types = {t.name: t.data_type for t in fp16.graph.initializer}
    assert types["_conv_stem.w"] == TensorProto.FLOAT and types["_blocks.0._depthwise_conv.w"] == TensorProto.FLOAT16
    assert {"GlobalAveragePool", *FP32_OPS, *DEFAULT_OP_BLOCK_LIST} == set(opts.op_block_list)
    assert clamped(fp32, fp16).tensors == len(fp32.graph.initializer) - 2  # the stem's weight and bias stay FP32
    assert all(t.data_type == TensorProto.FLOAT for t in fp32.graph.initializer)  # the FP32 model is left as it was


# ---------------------------------------------------------------------------------------------
# Graphs made here


def test_the_ops_whose_fp16_results_overflow_stay_fp32_end_to_end() -> None:
    """ReduceMean and Softmax are kept FP32 by default, and the value between them is never rounded to FP16."""
    weight = np.random.default_rng(0).normal(size=(4, 3, 3, 3)).astype(np.float32)
    model = _conv_mean_softmax(weight)
    fp16 = to_fp16(model)
    assert float32_ops(fp16) == {"ReduceMean": 1, "Softmax": 1}
    producer = {o: n for n in fp16.graph.node for o in n.output}
    softmax = next(n for n in fp16.graph.node if n.op_type == "Softmax")
    upstream = producer[softmax.input[0]]  # what the converter cast FP32 -> FP16 -> FP32 now reads the FP32 mean
    assert upstream.op_type == "Identity" and producer[upstream.input[0]].op_type == "ReduceMean"
    assert [n.op_type for n in fp16.graph.node if n.op_type == "Cast"] == ["Cast", "Cast"]  # input in, Conv out
    assert fp16.graph.output[0].type.tensor_type.elem_type == TensorProto.FLOAT
    x = np.random.default_rng(1).normal(size=(2, 3, 8, 8)).astype(np.float32)
    got, want = _session(fp16).run(None, {"input": x})[0], _session(model).run(None, {"input": x})[0]
    assert got.dtype == np.float32 and np.allclose(got, want, atol=2e-3)


def test_clamped_weights_are_counted_on_a_graph_made_to_have_them() -> None:
    weight = np.full((4, 3, 3, 3), 0.5, np.float32)
    weight.flat[:6] = [1e6, -7e4, 1e-9, 1e-6, -3e-5, 0.0]  # 2 above 65504, 1 below 6e-8, 2 subnormal, a zero
    model = _conv_mean_softmax(weight)
    fp16 = to_fp16(model)
    counted = clamped(model, fp16)
    assert (counted.above_max, counted.subnormal, counted.below_min, counted.total) == (2, 2, 1, 5)
    assert (counted.tensors, counted.in_tensors, counted.values) == (1, 1, weight.size)
    stored = numpy_helper.to_array(fp16.graph.initializer[0]).ravel()
    assert stored.dtype == np.float16 and stored[0] == 65504 and stored[1] == -65504 and stored[5] == 0
    assert stored[2] > 0 and stored[4] < 0  # raised to FP16's smallest subnormal, never flushed or sign-flipped
    # a weight only an FP32-kept node reads stays FP32 and is not counted
    kept = clamped(model, to_fp16(model, Fp16Options(exclude_nodes=["conv"])))
    assert kept.tensors == kept.total == 0


def test_an_int8_or_fp16_model_is_not_converted(model_files: ModelFiles, built: Built) -> None:
    with pytest.raises(NotFloat32Error, match="is FP16 already"):
        to_fp16(onnx.load(str(built[0])))
    assert precision_of(onnx.load(str(model_files.int8))) == "int8"
    with pytest.raises(ValueError, match=r"quantization target 'fp16' is not one of \['cpu', 'tensorrt'\]"):
        quantize(model_files.fp32, Path("unused.onnx"), [], QuantizeOptions(target="fp16"))  # type: ignore[arg-type]


def test_a_declared_normalisation_is_still_folded_in_front_of_an_fp16_build(tmp_path: Path) -> None:
    """A float32 NCHW export with its ImageNet normalisation declared: the FP16 build still takes float32, so the
    served prologue (Transpose, Cast, the normalising Conv) runs in FP32 and feeds it as it feeds the FP32 model."""
    rng = np.random.default_rng(2)
    model = _tiny(
        [
            helper.make_node("Conv", ["input", "w0"], ["c"], name="conv", pads=[1, 1, 1, 1]),
            helper.make_node("GlobalAveragePool", ["c"], ["pool"], name="pool"),
            helper.make_node("Flatten", ["pool"], ["logits"], name="flat", axis=1),
        ],
        [rng.normal(size=(4, 3, 3, 3)).astype(np.float32)],
        out="logits",
    )
    fp32, fp16 = tmp_path / "m-fp32.onnx", tmp_path / "m-fp16.onnx"
    onnx.save(model, str(fp32))
    convert(fp32, fp16)
    prep = PreprocessDeclaration(scale=1 / 255, mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])
    served = {p: served_model(p, prep, cache=tmp_path / "served") for p in (fp32, fp16)}
    assert served[fp16].graph.dtype == "float32" and served[fp16].graph.input_name == "input"
    assert served[fp16].prologue.steps == served[fp32].prologue.steps == ["Transpose", "Cast", "Conv"]
    pixels = rng.integers(0, 256, size=(3, 8, 8, 3), dtype=np.uint8)
    got, want = (_session(served[p].path).run(None, {"pixels": pixels})[0] for p in (fp16, fp32))
    assert got.dtype == np.float32 and got.shape == (3, 4) and np.allclose(got, want, atol=1e-2)


# ---------------------------------------------------------------------------------------------
# The command line and the report


def _quantize_fp16(fp32: Path, out: Path, *extra: str) -> list[str]:
    return ["quantize", "--model", str(fp32), "--config", str(LOCAL), "--output", str(out), "--target", "fp16", *extra]


def test_an_int8_model_is_refused_by_the_real_entry_point(model_files: ModelFiles, tmp_path: Path) -> None:
    out = tmp_path / "x.onnx"
    result = subprocess.run(
        [sys.executable, "-m", "app.models", *_quantize_fp16(model_files.int8, out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines() == [
        f"error: {model_files.int8} is an INT8 (quantized) build: the fp16 target converts an FP32 model"
    ]
    assert not out.exists()


def test_an_fp16_model_is_refused_in_one_line(built: Built, tmp_path: Path, capsys: Capsys) -> None:
    assert main(_quantize_fp16(built[0], tmp_path / "x.onnx")) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and "is FP16 already" in err
    assert not (tmp_path / "x.onnx").exists()


def test_keep_fp32_is_for_the_fp16_target_only(model_files: ModelFiles, tmp_path: Path, capsys: Capsys) -> None:
    args = ["quantize", "--model", str(model_files.fp32), "--config", str(LOCAL), "--output", str(tmp_path / "x")]
    assert main([*args, "--keep-fp32", "Softmax"]) == 2
    assert "--keep-fp32 is for --target fp16" in capsys.readouterr().err


@pytest.fixture(scope="module")
def reported(model_files: ModelFiles, tmp_path_factory: pytest.TempPathFactory) -> Reported:
    """`quantize --target fp16` through the CLI, calibration flags given and unused: exit status and report."""
    out = tmp_path_factory.mktemp("cli") / "my-fp16.onnx"
    missing = str(out.parent / "no-such-dir")  # fp16 reads no calibration images: not even checked
    status = main(_quantize_fp16(model_files.fp32, out, "--calibration-dir", missing, "--keep-fp32", "Exp"))
    return out, status, json.loads(report_paths(out)[0].read_text())


def test_the_fp16_report_has_the_int8_reports_fields_for_fp16(model_files: ModelFiles, reported: Reported) -> None:
    out, status, r = reported
    assert status == 0 and out.is_file()
    assert report_paths(out)[0].name == "my-fp16.report.json"
    assert r["target"] == r["precision"] == "fp16" and set(r["models"]) == {"fp32", "fp16"}
    judged_on = CUDA if CUDA in usable_providers() else CPU
    assert r["evaluated_as"].startswith(judged_on) and "FP16" in r["evaluated_as"]
    b = r["models"]["fp16"]
    assert b["bytes"] < 0.55 * r["models"]["fp32"]["bytes"] and b["fp32_op_types"] == {}
    c = b["clamped_weights"]
    assert c["above_max"] == 0 and c["total"] == c["subnormal"] + c["below_min"] > 0
    assert b["float16_weights"] == c["values"] == 4631004
    q = r["quality"]
    assert q["images"] == 5 and q["top1_agreement"] >= 0.9 and q["top1_agreement"] == q["top1_agree_count"] / 5
    assert 0 < q["max_abs_score_delta"] < 0.5 and q["fp16_top1_accuracy"] == q["fp32_top1_accuracy"]
    assert {"fp16_top1", "fp32_top1"} <= set(r["per_image"][0]) and "other_path_top1" not in r["per_image"][0]
    assert "latency" not in r and "calibration_quality" not in r and "other_path" not in r
    assert "Exp" in r["conversion"]["keep_fp32"] and r["conversion"]["target"] == "fp16"
    md = report_paths(out)[1].read_text()
    assert md.startswith("efficientnet_lite0: efficientnet_lite0-fp32.onnx against its FP16 build my-fp16.onnx")
    assert "| | FP32 | FP16 |" in md and "| top-1 agreement FP16 vs FP32 |" in md
    assert "| op types kept in FP32 | - | none |" in md
    assert f"{c['total']:,} of {c['values']:,}" in md and "benchmarks/gpu_check.py" in md and "INT8" not in md


def test_report_takes_the_fp16_build_and_gates_on_min_agreement(
    model_files: ModelFiles, reported: Reported, capsys: Capsys
) -> None:
    out, _, _ = reported
    args = ["report", "--model", str(model_files.fp32), "--build", str(out), "--config", str(LOCAL)]
    assert main([*args, "--min-agreement", "1.01"]) == 1  # the target read from the file: fp16
    captured = capsys.readouterr()
    assert "FP16 top-1 agreement with FP32 is 1.000, below --min-agreement 1.010" in captured.err
    assert "| top-1 agreement FP16 vs FP32 | 1.000 (5/5) |" in captured.out
    assert main([*args, "--target", "cpu"]) == 2
    assert f"the build {out} is FP16, not one for --target cpu" in capsys.readouterr().err
