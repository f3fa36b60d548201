"""`AppArgs`: the arguments of `app.main:build_app` (the `args:` block of a Serve config), and the variants,
TensorRT builds and speed gate it holds: settings and their validation. What turns them into engine options and
speed gates is `app.runtime.variants`; the check of the declaration against the model files, `app.served_model.check`.

Build arguments fix what the app is made of: the variants and their model files, the device policy, the input
limits. They change only with a redeploy that restarts replicas. The models it holds that have a module of their
own: `Limits` (limits.py), `FrontArgs` (front.py), `CascadeArgs` and `CaptureArgs` (cascade.py).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, field_validator, model_validator

from app.config.base import _Strict
from app.config.cascade import CASCADE_NAME, CascadeArgs
from app.config.front import FrontArgs
from app.config.limits import Limits
from app.config.model_cache import ModelCacheArgs
from app.served_model import BUILTIN_MODEL, default_files, is_builtin_file
from app.served_model.declaration import ModelDeclaration
from app.served_model.source import ModelUri, Sha256, is_remote, local_part

if TYPE_CHECKING:
    from app.config.classifier import ClassifierConfig


EngineName = Literal["auto", "tensorrt", "cuda", "openvino", "cpu"]
MODEL_PATH = (
    "ONNX file: a path (relative to the working directory), file://, or s3://, gs://, https:// (fetched into the "
    "node's model_cache by each Classifier)"
)
SHA256 = "the file's SHA-256 (64 hex digits): checked before the file is opened, a mismatch fails the replica"


class FallbackArgs(_Strict):
    """What an INT8 variant serves on a node where its own build would be refused: a GPU node without TensorRT, where
    INT8 on the CUDA EP is slower than FP32 (docs/engines.md "A variant's fallback"). Every report of the variant
    (the plan, /v1/models, the metrics' labels, the A/B summary, the start-up log) then names the fallback as what
    runs, and why."""

    precision: Literal["fp32", "fp16"] = Field(
        description="what the fallback file holds: fp16 (`python -m app.models quantize --target fp16`) or fp32"
    )
    model_path: ModelUri = Field(description=MODEL_PATH)
    sha256: Sha256 = Field(None, description=SHA256)
    engine: EngineName = Field("auto", description="as the variant's engine")


class VariantArgs(_Strict):
    """One servable build of the model, bound as its own Classifier deployment."""

    model_path: ModelUri = Field(description=MODEL_PATH)
    sha256: Sha256 = Field(None, description=SHA256)
    description: str = Field("", description="shown in GET /v1/models")
    precision: Literal["fp32", "fp16", "int8"] = Field(
        "fp32",
        description="what the file holds; int8 turns on TensorRT's INT8 mode and the slow-INT8 check, fp16 "
        "TensorRT's FP16 mode",
    )
    engine: EngineName = Field(
        "auto",
        description="auto: TensorRT then CUDA on a GPU replica; on a CPU replica OpenVINO or ONNX Runtime's "
        "CPU EP, whichever measures faster at warm-up. Any other value insists on that engine",
    )
    fp16: bool = Field(False, description="let TensorRT use FP16 kernels too (TensorRT only)")
    allow_slow_int8: bool = Field(
        False, description="serve an INT8 variant on the CUDA EP without TensorRT (slower than FP32 there)"
    )
    fallback: FallbackArgs | None = Field(
        None,
        description="int8 only: the build served instead where the INT8 build would be refused (a GPU node "
        "without TensorRT); without it that node refuses the variant, with its reason",
    )

    @model_validator(mode="after")
    def _fallback_for_int8(self) -> VariantArgs:
        if self.fallback is not None and self.precision != "int8":
            raise ValueError(
                f"fallback: only an int8 variant falls back (it is refused where TensorRT is not); this one is "
                f"{self.precision}"
            )
        return self


class TensorRTArgs(_Strict):
    """TensorRT engine builds: cached per model, ONNX Runtime, TensorRT and GPU, so only a node's first start builds."""

    cache_dir: str | None = Field(
        None, description="engines and timing caches; default $APP_TRT_CACHE_DIR, else /tmp/app-trt-cache"
    )
    max_batch_size: int = Field(
        64, gt=0, le=1024, description="the optimisation profile spans batch 1..this; max_batch_size may not exceed it"
    )
    workspace_bytes: int = Field(
        2 << 30, gt=0, description="TensorRT builder workspace (tactics that need more: skipped)"
    )
    builder_optimization_level: int = Field(
        3, ge=0, le=5, description="TensorRT's default 3; 4-5 search longer at build time for a few percent"
    )
    timing_cache: bool = Field(True, description="keep layer timings so a rebuild (new batch range) is fast")

    def resolved_cache_dir(self) -> str:
        return self.cache_dir or os.environ.get("APP_TRT_CACHE_DIR") or "/tmp/app-trt-cache"


class CudaGraphArgs(_Strict):
    """CUDA graphs on GPU replicas: each batch-size bucket captured once at start, in a session of its own per batch
    slot, and replayed for the batch sizes where that measured faster than a plain run (docs/engines.md "CUDA
    graphs")."""

    enabled: bool = Field(
        True,
        description="measured on an H200, FP32 on the CUDA EP: batch 1 0.53 ms replayed against 1.78 ms plain; a "
        "capture that fails leaves the replica serving without graphs, said in /v1/models",
    )
    buckets: list[int] = Field(
        [1, 2, 4, 8],
        min_length=1,
        description="batch sizes captured (a session and a graph each, per batch slot); a batch is padded up to the "
        "smallest bucket that holds it. From batch 16 up a replay measured no faster than a plain run there",
    )

    @field_validator("buckets")
    @classmethod
    def _positive(cls, v: list[int]) -> list[int]:
        if any(b < 1 for b in v):
            raise ValueError(f"buckets must be batch sizes >= 1, got {v}")
        return sorted(set(v))


class SpeedGateArgs(_Strict):
    """Each variant other than `baseline` must be `min_speedup` times as fast as it, measured on its own node."""

    baseline: str = Field(description="the variant the others are compared with (e.g. fp32)")
    min_speedup: float = Field(1.2, gt=0, description="variant img/s / baseline img/s at max_batch_size")
    action: Literal["warn", "fail"] = Field(
        "warn",
        description="warn: a log line, a metric and a flag in /v1/models (a column in `python -m app.batch score`'s "
        "Parquet); fail: the slower variant's replicas fail, and so does a batch job that scores it",
    )


class AppArgs(_Strict):
    """Arguments of `app.main:build_app` (the `args:` block of a Serve config)."""

    model: ModelDeclaration = Field(
        description="the model every variant is a build of: its name, labels, output and preprocessing (docs/model.md "
        '"Serve your own model"); omitted, the built-in model\'s, when every variant is a built-in file'
    )
    variants: dict[str, VariantArgs] = Field(
        default_factory=lambda: {
            "int8": VariantArgs(
                model_path=str(default_files().int8), description="INT8 QDQ, static PTQ", precision="int8"
            ),
            "fp32": VariantArgs(model_path=str(default_files().fp32), description="FP32 reference"),
        },
        description="variant name -> model; each becomes deployment Classifier_<name>",
    )
    build_default_models: bool = Field(
        True, description="build the built-in EfficientNet-Lite0 files if they are missing (local use)"
    )
    check_model_files: bool = Field(True, description="fail at deploy if a model file is missing on this node")
    device: Literal["auto", "cuda", "cpu"] = Field(
        "auto", description="auto: CUDA when the replica was granted a GPU, else CPU; cuda: always try CUDA"
    )
    require_gpu: bool = Field(False, description="a Classifier that ends up on CPU fails to start")
    gpu_mem_limit_bytes: int | None = Field(None, gt=0, description="ONNX Runtime CUDA arena limit per replica")
    intra_op_threads: int | None = Field(
        None, gt=0, le=256, description="ONNX Runtime threads per Classifier; default: the replica's num_cpus"
    )
    limits: Limits = Field(default_factory=Limits)
    front: FrontArgs = Field(default_factory=FrontArgs)
    decode_in: Literal["preprocessor", "router", "gpu"] = Field(
        "preprocessor",
        description="where images are decoded. preprocessor: a deployment of its own (decode scales apart from the "
        "ingress; a crash in a decoder costs one retried call, not a Router and every request it holds). router: in "
        "each Router replica, under the same DecodeBudget (no Preprocessor deployment): one handle call per request "
        "fewer: measured here at c=1, p50 a third lower (46.9 -> 29.8 ms) and 36.6 against 49.4 CPU-ms per image, "
        "at c=32 within the noise (docs/performance.md). gpu: in each Classifier's batch, JPEGs by the GPU's hardware "
        "decoders (nvImageCodec), the declared transform on the GPU, other images by the CPU path in the same batch "
        '(no Preprocessor deployment; every Classifier needs a GPU: docs/engines.md "JPEG on the GPU")',
    )
    cascades: dict[str, CascadeArgs] = Field(
        default_factory=dict,
        description='name ("int8>fp32") -> a cascade: routable like a variant (weights, the override header, '
        'shadows, rollouts), no deployment of its own (docs/ab-rollout-cascade.md "Cascade")',
    )
    tensorrt: TensorRTArgs = Field(default_factory=TensorRTArgs)
    cuda_graphs: CudaGraphArgs = Field(default_factory=CudaGraphArgs)
    speed_gate: SpeedGateArgs | None = Field(None, description="refuse or flag variants not faster than a baseline")
    model_cache: ModelCacheArgs = Field(default_factory=ModelCacheArgs)

    @model_validator(mode="before")
    @classmethod
    def _declared(cls, data: Any) -> Any:
        """The built-in model's declaration when every variant is one of its files; otherwise `model` is required."""
        if not isinstance(data, dict):
            return data
        for old, new in (("model_name", "model.name"), ("labels_path", "model.labels_path")):
            if old in data:
                raise ValueError(f'{old} is now {new}: the model declaration (docs/model.md "Serve your own model")')
        if "model" in data:
            return data
        variants = data.get("variants") or {}
        paths = [
            v.get("model_path") if isinstance(v, dict) else getattr(v, "model_path", None) for v in variants.values()
        ]
        own = [p for p in paths if not isinstance(p, str) or not is_builtin_file(p)]
        if own:
            raise ValueError(
                f"model: required for a variant that is not the built-in model ({own[0]}): its name, and how its "
                'images are prepared (model.preprocess), are part of the model (docs/model.md "Serve your own model")'
            )
        return {**data, "model": BUILTIN_MODEL}

    @model_validator(mode="after")
    def _gate_baseline_known(self) -> AppArgs:
        if self.speed_gate is not None and self.speed_gate.baseline not in self.variants:
            raise ValueError(
                f"speed_gate.baseline {self.speed_gate.baseline!r} is not a variant ({sorted(self.variants)})"
            )
        return self

    @model_validator(mode="after")
    def _cascades_known(self) -> AppArgs:
        for name, c in self.cascades.items():
            if not CASCADE_NAME.match(name) or not name.startswith(f"{c.first}>{c.then}"):
                raise ValueError(
                    f"cascade name {name!r}: '{c.first}>{c.then}', or that and a suffix of letters, digits, '-', '_'"
                )
            if name in self.variants:
                raise ValueError(f"cascade {name!r} has a variant's name")
            missing = sorted({c.first, c.then} - set(self.variants))
            if missing:
                raise ValueError(f"cascades[{name}]: {missing} not among the variants {sorted(self.variants)}")
            if c.first == c.then:
                raise ValueError(f"cascades[{name}]: first and then are both {c.first!r}")
        return self

    @property
    def routable(self) -> list[str]:
        """What a request can be routed to: the variants, then the cascades."""
        return [*sorted(self.variants), *sorted(self.cascades)]

    @field_validator("variants")
    @classmethod
    def _variant_names(cls, v: dict[str, VariantArgs]) -> dict[str, VariantArgs]:
        if not v:
            raise ValueError("at least one variant is required")
        for name in v:
            if not name.replace("_", "").replace("-", "").isalnum() or not name.isascii():
                raise ValueError(f"variant name {name!r} must be letters, digits, '-' or '_'")
        return v

    def resolved_path(self, path: str) -> Path:
        """Relative model paths are relative to the directory `serve run` / `serve deploy` was started in (a
        file:// URI is its path). Remote files have no path here: a Classifier fetches them
        (`app.runtime.model_files`)."""
        if is_remote(path):
            raise ValueError(f"{path}: a remote file has no local path until it is fetched")
        return Path(local_part(path)).absolute()

    def may_use_tensorrt(self, variant: str) -> bool:
        return self.device != "cpu" and self.variants[variant].engine in ("auto", "tensorrt")

    def batching_problems(self, variant: str, cfg: ClassifierConfig, max_ongoing: int | None) -> list[str]:
        """What is wrong with `variant`'s batching: batches that cannot fill, or exceed the TensorRT profile."""
        problems = []
        if max_ongoing is not None:
            try:
                cfg.check_against(max_ongoing)
            except ValueError as e:
                # Live, Serve runs reconfigure before it updates max_ongoing_requests in the replica's
                # context, so a deploy raising both would be judged against the old value there.
                problems.append(str(e))
        profile_max = self.tensorrt.max_batch_size
        if self.may_use_tensorrt(variant) and cfg.max_batch_size > profile_max:
            problems.append(
                f"user_config.max_batch_size ({cfg.max_batch_size}) exceeds args.tensorrt.max_batch_size "
                f"({profile_max}), the TensorRT profile's largest batch"
            )
        return problems

    def model_files(self) -> list[tuple[str, Path]]:
        """Each model file on this node's disk the variants name, with the field that names it: the variants', then
        their fallbacks' (remote ones are each Classifier's to fetch and check)."""
        return [(field, self.resolved_path(uri)) for field, uri, _ in self.model_sources() if not is_remote(uri)]

    def model_sources(self) -> list[tuple[str, str, str | None]]:
        """Each model file the variants name, as declared: (field, URI or path, sha256), the variants' then their
        fallbacks'. `model_files` is the local ones."""
        variants = sorted(self.variants.items())
        out = [(f"variants.{n}.model_path", v.model_path, v.sha256) for n, v in variants]
        out += [
            (f"variants.{n}.fallback.model_path", v.fallback.model_path, v.fallback.sha256)
            for n, v in variants
            if v.fallback
        ]
        return out

    def is_default_model(self, path: Path) -> bool:
        files = default_files(path.parent)
        return path in (files.fp32, files.int8, files.int8_trt, files.fp16)
