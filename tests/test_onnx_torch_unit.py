"""benchmarks/onnx_torch.py: the served ONNX graph run by PyTorch computes what ONNX Runtime computes.

Needs torch (the gpu-check extra, in a venv of its own: docs/engines.md); skipped without it. Pure: no Ray, no GPU
(torch's CPU device).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from app.served_model import ModelFiles

torch = pytest.importorskip("torch", reason="torch is not installed: the gpu-check extra, in a venv of its own")
from benchmarks.onnx_torch import UnsupportedGraph, load  # noqa: E402  (imports torch)


def _ort(path: Path | str, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: x})[0]


def _torch(module: torch.nn.Module, x: np.ndarray) -> np.ndarray:
    with torch.inference_mode():
        return module(torch.from_numpy(x)).float().numpy()


def test_the_served_model_gives_onnx_runtimes_logits(model_files: ModelFiles) -> None:
    x = np.random.default_rng(35).integers(0, 256, (2, 224, 224, 3), dtype=np.uint8)
    module = load(model_files.fp32)
    reference = _ort(model_files.fp32, x)
    logits = _torch(module, x)
    assert logits.shape == reference.shape == (2, 1000)
    np.testing.assert_allclose(logits, reference, atol=1e-4, rtol=1e-4)
    assert len(module.nodes) == len(onnx.load(str(model_files.fp32)).graph.node)
    assert module.dummy_batch(3).shape == (3, 224, 224, 3) and module.dummy_batch(1).dtype == np.uint8


def test_fp16_makes_every_weight_half_and_the_convolutions_channels_last(model_files: ModelFiles) -> None:
    module = load(model_files.fp32).half().to(memory_format=torch.channels_last)
    assert module.float_dtype == torch.float16
    weights = [p for p in module.parameters() if p.dim() == 4]
    assert weights and all(p.dtype == torch.float16 for p in module.parameters() if p.is_floating_point())
    assert all(p.is_contiguous(memory_format=torch.channels_last) for p in weights)


def _graph(tmp_path: Path, nodes: list[onnx.NodeProto], inits: list[onnx.TensorProto], shape: list[int]) -> Path:
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    path = tmp_path / "g.onnx"
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)  # ORT 1.31 reads <= 13
    onnx.save(model, str(path))
    return path


def test_asymmetric_padding_strides_groups_and_the_gemm_match_onnx_runtime(tmp_path: Path) -> None:
    """The TF-style padding (more after than before) that EfficientNet-Lite's stride-2 convolutions use, a depthwise
    convolution, ReduceMean and a Gemm with alpha/beta: each exactly as ONNX Runtime computes it."""
    rng = np.random.default_rng(0)
    w1 = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    w2 = rng.standard_normal((4, 1, 3, 3)).astype(np.float32)
    fc = rng.standard_normal((4, 5)).astype(np.float32)
    inits = [numpy_helper.from_array(a, n) for a, n in ((w1, "w1"), (w2, "w2"), (fc, "fc"))]
    inits.append(numpy_helper.from_array(np.ones(5, np.float32), "c"))
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["a"], kernel_shape=[3, 3], pads=[0, 0, 1, 1], strides=[2, 2]),
        helper.make_node("Relu", ["a"], ["b"]),
        helper.make_node("Conv", ["b", "w2"], ["d"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], group=4),
        helper.make_node("ReduceMean", ["d"], ["e"], axes=[2, 3], keepdims=0),
        helper.make_node("Gemm", ["e", "fc", "c"], ["y"], alpha=0.5, beta=2.0),
    ]
    path = _graph(tmp_path, nodes, inits, [2, 3, 9, 9])
    x = rng.standard_normal((2, 3, 9, 9)).astype(np.float32)
    np.testing.assert_allclose(_torch(load(path), x), _ort(path, x), atol=1e-5, rtol=1e-5)


def test_an_operator_it_does_not_cover_is_refused_by_name(tmp_path: Path) -> None:
    path = _graph(tmp_path, [helper.make_node("Sigmoid", ["x"], ["y"])], [], [1, 3])
    with pytest.raises(UnsupportedGraph, match="Sigmoid"):
        load(path)
    path = _graph(tmp_path, [helper.make_node("Cast", ["x"], ["y"], to=TensorProto.INT64)], [], [1, 3])
    with pytest.raises(UnsupportedGraph, match="Cast to"):
        load(path)
