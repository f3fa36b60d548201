"""Post-training static quantization to INT8 (QDQ, QUInt8 activations, QInt8 per-channel weights).

Offline tooling: like the report, it uses onnxruntime.quantization directly;
serving code reaches ONNX Runtime only through app.runtime.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import onnx
from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static
from onnxruntime.quantization.shape_inference import quant_pre_process

from app.models.build import atomic_write
from app.models.calibration import ImageCalibrationReader

METHODS = {
    "minmax": CalibrationMethod.MinMax,
    "percentile": CalibrationMethod.Percentile,
    "entropy": CalibrationMethod.Entropy,
}


@dataclass(frozen=True)
class QuantizeOptions:
    method: str = "minmax"
    op_types: Sequence[str] | None = None  # None: every op type ONNX Runtime can quantize
    exclude_nodes: Sequence[str] = ()
    per_channel: bool = True


def input_name(model_path: Path) -> str:
    model = onnx.load(str(model_path), load_external_data=False)
    inits = {i.name for i in model.graph.initializer}
    return next(i.name for i in model.graph.input if i.name not in inits)


def quantize(fp32: Path, int8: Path, calibration: Sequence[bytes], opts: QuantizeOptions, size: int = 224) -> None:
    if opts.method not in METHODS:
        raise ValueError(f"calibration method {opts.method!r} is not one of {sorted(METHODS)}")
    reader = ImageCalibrationReader(calibration, input_name(fp32), size=size)
    extra = {"ActivationSymmetric": False, "WeightSymmetric": True}
    if opts.method == "percentile":
        extra["CalibPercentile"] = 99.999  # type: ignore[assignment]
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
            activation_type=QuantType.QUInt8,
            weight_type=QuantType.QInt8,
            per_channel=opts.per_channel,
            calibrate_method=METHODS[opts.method],
            op_types_to_quantize=list(opts.op_types) if opts.op_types else None,
            nodes_to_exclude=list(opts.exclude_nodes) or None,
            extra_options=extra,
        )
        atomic_write(int8, out.read_bytes())
