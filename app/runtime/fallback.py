"""A variant's declared fallback: what it serves when its own build cannot run on this node, and saying so.

An INT8 build is faster than FP32 on a GPU only through TensorRT: ONNX Runtime's CUDA EP has no INT8 kernels for
QDQ graphs (plan.py), so a GPU node where TensorRT does not load refuses the variant. A stock Ray GPU image has no
TensorRT. With `fallback:` declared on the variant (an FP16 build of the same FP32 model, say), the replica serves
that build instead, and the plan, the replica's description (/v1/models), its metrics' labels, the A/B summary and
its start-up log all name what runs and why ("int8 requested, fp16 serving: TensorRT not loadable:
libnvinfer.so.10"). Only that refusal falls back: a missing file, a broken model or a GPU that is not there stay
the errors they are, and without a declared fallback the refusal stays, with its reason.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from app.runtime.plan import TENSORRT, RuntimeOptions
from app.runtime.spec import ModelLoadError


class NeedsTensorRT(ModelLoadError):
    """The requested build runs as intended only on TensorRT, and TensorRT is not usable here; `reason` says why
    in one line (what a fallback reports)."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class Build:
    """One servable file of a variant and how to run it."""

    path: str
    opts: RuntimeOptions


@dataclass(frozen=True)
class Serving:
    """What a variant really runs when it is not the build it asked for."""

    requested_precision: str
    requested_path: str
    precision: str
    path: str
    reason: str

    def line(self, variant: str) -> str:
        return f"Classifier_{variant}: {self.requested_precision} requested, {self.precision} serving: {self.reason}"

    def describe(self) -> dict[str, Any]:
        return {
            "requested_precision": self.requested_precision,
            "requested_model_file": self.requested_path,
            "precision": self.precision,
            "model_file": self.path,
            "reason": self.reason,
        }


def tensorrt_absence(available: Sequence[str], listed: bool = False) -> str:
    """Why TensorRT is not among `available`, in one line. `listed`: `available` was given by hand (the plan
    command's --available), not read off this machine."""
    if TENSORRT in available:
        return "TensorRT is usable here"
    if listed:
        return f"{TENSORRT} not among the providers given (--available)"
    import onnxruntime as ort

    from app.runtime.ort_engine import missing_libraries

    if TENSORRT not in ort.get_available_providers():
        return f"this ONNX Runtime build ({ort.__version__}) has no {TENSORRT}"
    missing = missing_libraries(TENSORRT)
    return f"TensorRT not loadable: {', '.join(missing)}" if missing else f"{TENSORRT} not usable here"


def tensorrt_failed(error: Exception) -> str:
    """The one-line reason of a TensorRT EP that loaded but failed to build or load the engine."""
    first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return f"TensorRT failed: {first[:300]}"


def fallback_failed(variant: str, refused: Exception, fallback: Build, error: Exception) -> ModelLoadError:
    return ModelLoadError(
        f"{refused}; variant {variant!r} declares fallback {fallback.opts.precision} ({fallback.path}), which failed "
        f"too: {error}"
    )
