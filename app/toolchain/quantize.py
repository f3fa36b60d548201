"""Post-training static quantization to INT8 (QDQ, per-channel symmetric QInt8 weights), for one of two targets.

cpu       QUInt8 activations (asymmetric): ONNX Runtime's CPU kernels; Clip/Relu fold into the ranges. The
          weights are then rescaled so that those kernels cannot overflow on x86 without VNNI
          (app.served_model.u8s8; off with pair_limit=False).
tensorrt  QInt8 activations, symmetric (zero point 0), as TensorRT's explicit quantization requires: FP32
          biases (TensorRT quantizes them itself; an int32 bias DequantizeLinear is not accepted), one Q/DQ
          pair per consumer (TensorRT cannot share a pair between nodes), Q/DQ only in front of the layers
          TensorRT runs in INT8 (onnx-tensorrt operator docs; NVIDIA's Q/DQ placement recommendations), and
          at each residual Add only on the skip input, the Conv branch left in float so that TensorRT fuses
          the Add into that Conv (TensorRT developer guide, "Q/DQ Layer-Placement Recommendations": quantize
          the residual input; app.toolchain.qdq_placement).

Offline tooling: like the report, it uses onnxruntime.quantization directly;
serving code reaches ONNX Runtime only through app.runtime.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper
from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static
from onnxruntime.quantization.shape_inference import quant_pre_process

from app.served_model import BUILTIN_MODEL, Int8Target, atomic_write
from app.served_model.declaration import ModelDeclaration
from app.served_model.graph import read_graph
from app.served_model.model_io import Preparation
from app.served_model.u8s8 import PairFit, limit_pairs
from app.toolchain.calibration import ImageCalibrationReader
from app.toolchain.qdq_placement import float_conv_branches, placement_problems

METHODS = {
    "minmax": CalibrationMethod.MinMax,
    "percentile": CalibrationMethod.Percentile,
    "entropy": CalibrationMethod.Entropy,
}

# Per-axis QuantizeLinear/DequantizeLinear (per-channel weights) exist from opset 13; onnx-tensorrt needs it too.
MIN_TENSORRT_OPSET = 13


@dataclass(frozen=True)
class TargetProfile:
    """What differs between targets; everything else (format, calibration, per-channel weights) is shared."""

    activation_type: QuantType
    op_types: tuple[str, ...] | None  # the target's default; None: every op type ONNX Runtime can quantize
    extra_options: dict[str, Any] = field(default_factory=dict)


PROFILES: dict[Int8Target, TargetProfile] = {
    "cpu": TargetProfile(QuantType.QUInt8, None, {"ActivationSymmetric": False, "WeightSymmetric": True}),
    "tensorrt": TargetProfile(
        QuantType.QInt8,
        # Conv/Gemm/MatMul run in INT8. Add is quantized here only for its skip input and its output: the pair
        # ONNX Runtime also puts on the Conv branch is taken off afterwards (float_conv_branches), since with it
        # TensorRT cannot fuse the Add into that Conv. The input normalisation (Cast/Sub/Mul of the uint8 image)
        # stays FP32, quantized once in front of the stem Conv.
        ("Conv", "Gemm", "MatMul", "Add"),
        {
            "ActivationSymmetric": True,
            "WeightSymmetric": True,
            "QuantizeBias": False,
            "DedicatedQDQPair": True,
            # No Q/DQ on a Conv's own output: it would quantize the pre-ReLU6 range (steps 2-17x coarser here
            # than ReLU6's 6/127; agreement with FP32 fell from 4/5 to 3/5 sample photographs). The Q of the
            # next layer's input, after the Clip, is what TensorRT fuses into Conv+ReLU6 with an INT8 output.
            "OpTypesToExcludeOutputQuantization": ["Conv", "Gemm", "MatMul"],
        },
    ),
}


@dataclass(frozen=True)
class QuantizeOptions:
    method: str = "minmax"
    op_types: Sequence[str] | None = None  # None: the target's default (see PROFILES)
    exclude_nodes: Sequence[str] = ()
    per_channel: bool = True
    target: Int8Target = "cpu"  # FP16 is no quantization: app.toolchain.fp16
    pair_limit: bool = True  # cpu target: weights the U8S8 kernels cannot overflow (app.served_model.u8s8)


def default_opset(model_path: Path) -> int:
    model = onnx.load(str(model_path), load_external_data=False)
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)


def tensorrt_problems(model: onnx.ModelProto) -> list[str]:
    """Why TensorRT's explicit quantization would refuse or mis-read this QDQ graph (empty: it would not).

    TensorRT: opset >= 13, INT8 zero points that are 0 (symmetric only), no INT32 DequantizeLinear (it
    quantizes biases itself), weights in [-127, 127], and a Q/DQ pair of its own for every consumer
    (each QuantizeLinear feeds exactly one DequantizeLinear, each DequantizeLinear exactly one node).
    """
    problems = []
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    if opset < MIN_TENSORRT_OPSET:
        problems.append(f"opset {opset} < {MIN_TENSORRT_OPSET}")
    inits = {i.name: i for i in model.graph.initializer}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in model.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    for node in model.graph.node:
        if node.op_type not in ("QuantizeLinear", "DequantizeLinear"):
            continue
        if len(node.input) < 3 or node.input[2] not in inits:
            problems.append(f"{node.name}: no constant zero point (QuantizeLinear then means uint8)")
        else:
            zero = numpy_helper.to_array(inits[node.input[2]])
            if zero.dtype != np.int8 or zero.any():
                problems.append(f"{node.name}: zero point {zero.dtype} {zero.ravel()[:4].tolist()}, not int8 0")
        if node.op_type == "DequantizeLinear" and node.input[0] in inits:
            data = numpy_helper.to_array(inits[node.input[0]])
            if data.dtype == np.int32:
                problems.append(f"{node.name}: dequantizes int32 (a quantized bias)")
            elif data.dtype == np.int8 and data.size and data.min() < -127:
                problems.append(f"{node.name}: int8 weights reach -128 (TensorRT's weight range is [-127, 127])")
        if node.op_type == "QuantizeLinear":
            users = consumers.get(node.output[0], [])
            if [u.op_type for u in users] != ["DequantizeLinear"]:
                problems.append(f"{node.name}: feeds {[u.op_type for u in users]}, not one DequantizeLinear")
        elif len(consumers.get(node.output[0], [])) > 1:
            problems.append(f"{node.name}: shared by {len(consumers[node.output[0]])} nodes")
    return problems


def builtin_model() -> ModelDeclaration:
    """The built-in model's declaration (the one configs/local.yaml spells out)."""
    return ModelDeclaration.model_validate(BUILTIN_MODEL)


def quantize(
    fp32: Path,
    int8: Path,
    calibration: Sequence[bytes],
    opts: QuantizeOptions,
    model: ModelDeclaration | None = None,
) -> PairFit | None:
    """Write the INT8 build of `fp32`, calibrated on `calibration` prepared exactly as `model` declares and serves
    (model_io.Preparation; default: the built-in model's declaration). For the cpu target with `pair_limit`, say what
    the U8S8 pair limit rescaled."""
    if opts.method not in METHODS:
        raise ValueError(f"calibration method {opts.method!r} is not one of {sorted(METHODS)}")
    if opts.target not in PROFILES:
        raise ValueError(f"quantization target {opts.target!r} is not one of {list(PROFILES)}")
    if opts.target == "tensorrt" and (opset := default_opset(fp32)) < MIN_TENSORRT_OPSET:
        raise ValueError(f"{fp32} is opset {opset}; the tensorrt target needs opset >= {MIN_TENSORRT_OPSET}")
    profile = PROFILES[opts.target]
    op_types = list(opts.op_types) if opts.op_types else profile.op_types
    graph = read_graph(fp32)
    prepare = Preparation(model or builtin_model(), graph)
    reader = ImageCalibrationReader(calibration, graph.input_name, prepare=prepare)
    extra = dict(profile.extra_options)
    if opts.method == "percentile":
        extra["CalibPercentile"] = 99.999
    with tempfile.TemporaryDirectory() as tmp:
        prepared = Path(tmp) / "prepared.onnx"
        # ONNX shape inference and ORT's graph clean-up, so every tensor the quantizer sees has a type.
        # Symbolic shape inference (it needs sympy) adds nothing here: only the batch dimension is dynamic.
        quant_pre_process(str(fp32), str(prepared), skip_symbolic_shape=True)
        out = Path(tmp) / "int8.onnx"
        quantize_static(
            str(prepared),
            str(out),
            reader,
            quant_format=QuantFormat.QDQ,
            activation_type=profile.activation_type,
            weight_type=QuantType.QInt8,
            per_channel=opts.per_channel,
            calibrate_method=METHODS[opts.method],
            op_types_to_quantize=list(op_types) if op_types else None,
            nodes_to_exclude=list(opts.exclude_nodes) or None,
            extra_options=extra,
        )
        data, fit = out.read_bytes(), None
        if opts.target == "tensorrt":
            qdq = onnx.load_from_string(data)
            float_conv_branches(qdq)
            # onnxruntime.quantization's options and the pass above decide the graph: check what they produced.
            if problems := tensorrt_problems(qdq) + placement_problems(qdq):
                raise RuntimeError(f"the TensorRT INT8 would not build as intended: {'; '.join(problems[:5])}")
            data = qdq.SerializeToString()
        if opts.target == "cpu" and opts.pair_limit:
            model = onnx.load_from_string(data)
            fit = limit_pairs(model)
            data = model.SerializeToString()
        atomic_write(int8, data)
    return fit
