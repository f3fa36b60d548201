"""The served graph (app/served_model/prologue.py) and what an ONNX graph says of itself (app/served_model/graph.py).

Small graphs made here with onnx.helper stand for every kind of classifier a user brings: float32 NCHW (a PyTorch
export), float32 NHWC (a TensorFlow export), float16, uint8 NCHW, uint8 NHWC with its normalisation inside (the
built-in), one channel, an [N, C, 1, 1] output. Each served copy is run on uint8 pixels and compared with the
user's own graph run on the same pixels normalised by hand, in float64: no Ray, real ONNX Runtime sessions.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from app.served_model.declaration import PreprocessDeclaration
from app.served_model.graph import GraphError, graph_io_of, read_graph
from app.served_model.prologue import PIXELS, normalise, prologue_for, served_model

H, W, CLASSES = 6, 5, 4
ONNX_TYPE = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16, "uint8": TensorProto.UINT8}


def classifier(
    dtype: str = "float32",
    layout: str = "NCHW",
    channels: int = 3,
    spatial_output: bool = False,
    input_name: str = "input",
    extra_tensor: str | None = None,
) -> onnx.ModelProto:
    """input -> Cast float32 -> (Transpose to NCHW) -> Flatten -> MatMul -> logits [N, CLASSES] (or [N, C, 1, 1])."""
    rng = np.random.default_rng(0)
    shape = ["N", channels, H, W] if layout == "NCHW" else ["N", H, W, channels]
    nodes = [helper.make_node("Cast", [input_name], ["x32"], to=TensorProto.FLOAT)]
    x = "x32"
    if layout == "NHWC":
        nodes.append(helper.make_node("Transpose", [x], ["nchw"], perm=[0, 3, 1, 2]))
        x = "nchw"
    weights = rng.normal(size=(channels * H * W, CLASSES)).astype(np.float32) / 10
    nodes += [
        helper.make_node("Flatten", [x], ["flat"], axis=1),
        helper.make_node("MatMul", ["flat", "w"], ["scores"]),
    ]
    out_shape: list[Any] = ["N", CLASSES]
    if spatial_output:
        nodes.append(helper.make_node("Reshape", ["scores", "to4d"], ["logits"]))
        out_shape = ["N", CLASSES, 1, 1]
    else:
        nodes.append(helper.make_node("Identity", ["scores"], ["logits"]))
    inits = [numpy_helper.from_array(weights, "w"), numpy_helper.from_array(np.array([-1, CLASSES, 1, 1]), "to4d")]
    if extra_tensor:  # a tensor of the user's own named like the prologue's input
        nodes.insert(0, helper.make_node("Identity", ["w"], [extra_tensor]))
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(input_name, ONNX_TYPE[dtype], shape)],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, out_shape)],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def save(model: onnx.ModelProto, path: Path) -> Path:
    onnx.save(model, str(path))
    return path


def pixels(channels: int = 3, n: int = 3) -> np.ndarray:
    return np.random.default_rng(1).integers(0, 256, (n, H, W, channels), dtype=np.uint8)


def by_hand(x: np.ndarray, prep: PreprocessDeclaration, dtype: str, layout: str) -> np.ndarray:
    """(x * scale - mean) / std per channel, in float64, then the graph's layout and dtype."""
    c = x.shape[-1]
    mean, std = prep.per_channel(c)
    y = (x.astype(np.float64) * prep.scale - np.array(mean)) / np.array(std)
    if layout == "NCHW":
        y = y.transpose(0, 3, 1, 2)
    return y.astype(np.float16 if dtype == "float16" else np.uint8 if dtype == "uint8" else np.float32)


def run(path: Path, feed: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: feed})[0]


IMAGENET = PreprocessDeclaration(scale=1 / 255, mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])
CASES = {
    "pytorch float32 NCHW, ImageNet mean/std": ("float32", "NCHW", 3, IMAGENET, ["Transpose", "Cast", "Conv"]),
    "tensorflow float32 NHWC, [-1, 1]": (
        "float32",
        "NHWC",
        3,
        PreprocessDeclaration(scale=1 / 127.5, mean=[1.0], std=[1.0]),
        ["Cast", "Mul", "Sub"],
    ),
    "float16 NCHW, (x - 127) / 128": (
        "float16",
        "NCHW",
        3,
        PreprocessDeclaration(mean=[127], std=[128]),
        ["Transpose", "Cast", "Conv", "Cast(float16)"],
    ),
    "float32 NCHW, pixels as they are": ("float32", "NCHW", 3, PreprocessDeclaration(), ["Transpose", "Cast"]),
    "uint8 NCHW": ("uint8", "NCHW", 3, PreprocessDeclaration(), ["Transpose"]),
    "one channel float32 NCHW": (
        "float32",
        "NCHW",
        1,
        PreprocessDeclaration(color="GRAY", scale=1 / 255, mean=[0.1307], std=[0.3081]),
        ["Transpose", "Cast", "Conv"],
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_served_graph_on_uint8_pixels_is_the_users_graph_on_pixels_normalised_by_hand(
    tmp_path: Path, case: str
) -> None:
    dtype, layout, channels, prep, steps = CASES[case]
    source = save(classifier(dtype, layout, channels), tmp_path / "m.onnx")
    served = served_model(source, prep, tmp_path / "cache")
    assert served.prologue.steps == steps and served.source == source and served.path.parent == tmp_path / "cache"
    session = ort.InferenceSession(str(served.path), providers=["CPUExecutionProvider"])
    (inp,) = session.get_inputs()
    assert (inp.name, inp.type, inp.shape) == (PIXELS, "tensor(uint8)", ["N", H, W, channels])
    x = pixels(channels)
    want = run(source, by_hand(x, prep, dtype, layout))
    got = session.run(None, {PIXELS: x})[0]
    tolerance = 2e-2 if dtype == "float16" else 1e-5
    np.testing.assert_allclose(got, want, rtol=tolerance, atol=tolerance)
    # what calibration feeds the unwrapped graph is what the prologue computes, to float32's last bit or so
    np.testing.assert_allclose(run(source, normalise(x, prep, served.graph)), got, rtol=tolerance, atol=tolerance)


def test_a_graph_that_takes_uint8_nhwc_with_a_plain_output_is_served_as_it_is(tmp_path: Path) -> None:
    """The built-in model's case: no copy, no cost."""
    source = save(classifier("uint8", "NHWC"), tmp_path / "m.onnx")
    served = served_model(source, PreprocessDeclaration(), tmp_path / "cache")
    assert served.path == source and served.prologue.steps == [] and not (tmp_path / "cache").exists()


def test_a_spatial_output_is_flattened_to_one_row_per_image(tmp_path: Path) -> None:
    source = save(classifier(spatial_output=True), tmp_path / "m.onnx")
    served = served_model(source, PreprocessDeclaration(), tmp_path / "cache")
    assert served.prologue.steps[-1] == "Flatten" and served.graph.classes == CLASSES
    x = pixels()
    got = run(served.path, x)
    assert got.shape == (3, CLASSES)
    np.testing.assert_allclose(got, run(source, by_hand(x, PreprocessDeclaration(), "float32", "NCHW")).reshape(3, -1))


def test_the_prologues_names_never_clash_with_the_users(tmp_path: Path) -> None:
    source = save(classifier(input_name="pixels", extra_tensor="pixels_1"), tmp_path / "m.onnx")
    served = served_model(source, IMAGENET, tmp_path / "cache")
    model = onnx.load(str(served.path))
    onnx.checker.check_model(model, full_check=True)
    assert model.graph.input[0].name == "pixels_2"
    x = pixels()
    np.testing.assert_allclose(run(served.path, x), run(source, by_hand(x, IMAGENET, "float32", "NCHW")), atol=1e-5)


def test_the_served_copy_is_made_once_per_model_and_declaration(tmp_path: Path) -> None:
    source = save(classifier(), tmp_path / "m.onnx")
    first = served_model(source, IMAGENET, tmp_path / "cache")
    stamp = first.path.stat().st_mtime_ns
    again = served_model(source, IMAGENET, tmp_path / "cache")
    assert again.path == first.path and again.path.stat().st_mtime_ns == stamp  # reused, not rewritten
    other = served_model(source, PreprocessDeclaration(mean=[127], std=[128]), tmp_path / "cache")
    assert other.path != first.path  # another declaration, another copy
    save(classifier(channels=3, layout="NHWC"), source)  # the model file changes: its copy too
    assert served_model(source, IMAGENET, tmp_path / "cache").path not in (first.path, other.path)
    assert sorted(p.suffix for p in (tmp_path / "cache").iterdir()) == [".onnx"] * 3  # no temporaries left


def test_prologue_for_skips_the_arithmetic_that_would_change_nothing() -> None:
    graph = graph_io_of(classifier())
    p = prologue_for(PreprocessDeclaration(scale=1.0, mean=[0, 0, 0], std=[1, 1, 1]), graph)
    assert p.steps == ["Transpose", "Cast"] and p.scale is None and p.shift is None
    q = prologue_for(IMAGENET, graph)
    assert q.scale is not None and q.shift is not None
    np.testing.assert_allclose(q.scale, [1 / 255 / s for s in (0.229, 0.224, 0.225)], rtol=1e-6)
    np.testing.assert_allclose(
        q.shift, [m / s for m, s in zip((0.485, 0.456, 0.406), (0.229, 0.224, 0.225), strict=True)], rtol=1e-6
    )


# --------------------------------------------------------------------------- app/served_model/graph.py


def test_graph_io_reads_layout_size_channels_dtype_and_classes(tmp_path: Path) -> None:
    g = read_graph(save(classifier("float16", "NHWC", 1), tmp_path / "m.onnx"))
    assert (g.input_name, g.dtype, g.layout, g.height, g.width, g.channels, g.classes) == (
        "input",
        "float16",
        "NHWC",
        H,
        W,
        1,
        CLASSES,
    )
    assert g.describe_input() == f"'input' float16 [N, {H}, {W}, 1] NHWC"
    assert g.describe()["input"]["shape"] == [-1, H, W, 1] and g.describe()["output"]["classes"] == CLASSES
    assert graph_io_of(classifier(spatial_output=True)).classes == CLASSES


def _with_input(model: onnx.ModelProto, elem: int, shape: list[Any]) -> onnx.ModelProto:
    model.graph.input[0].CopyFrom(helper.make_tensor_value_info(model.graph.input[0].name, elem, shape))
    return model


@pytest.mark.parametrize(
    ("model", "says"),
    [
        (_with_input(classifier(), TensorProto.INT64, ["N", 3, H, W]), "uint8, float32 or float16 only"),
        (_with_input(classifier(), TensorProto.FLOAT, ["N", 3, H]), "4 dimensions"),
        (_with_input(classifier(), TensorProto.FLOAT, ["N", 5, H, W]), "no channel axis of 1 or 3"),
        (_with_input(classifier(), TensorProto.FLOAT, ["N", 3, "h", "w"]), "fixed height and width"),
    ],
)
def test_what_is_not_an_image_classifier_is_refused_saying_why(model: onnx.ModelProto, says: str) -> None:
    with pytest.raises(GraphError, match=says):
        graph_io_of(model)


def test_two_inputs_or_a_non_class_output_are_refused() -> None:
    two = classifier()
    two.graph.input.append(helper.make_tensor_value_info("mask", TensorProto.FLOAT, ["N", 1]))
    with pytest.raises(GraphError, match=r"one input, this graph has \['input', 'mask'\]"):
        graph_io_of(two)
    spatial = classifier()
    spatial.graph.output[0].CopyFrom(helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 4, 7, 7]))
    with pytest.raises(GraphError, match="class scores are"):
        graph_io_of(spatial)


def test_read_graph_names_a_missing_or_unreadable_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="model file not found"):
        read_graph(tmp_path / "none.onnx")
    (tmp_path / "bad.onnx").write_bytes(b"\x00not a protobuf\xff" * 10)
    with pytest.raises(GraphError, match="not a readable ONNX file"):
        read_graph(tmp_path / "bad.onnx")
