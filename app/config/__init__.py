"""Typed configuration: the application's build arguments and each deployment's user_config.

Build arguments (`AppArgs`) fix what the app is made of: the variants and
their model files, the device policy, the input limits. They change only with
a redeploy that restarts replicas. `RouterConfig` and `ClassifierConfig` are
user_configs: Serve hands them to `reconfigure` on running replicas, so A/B
weights and batch settings change live, without a restart.

Every model rejects unknown fields, so a misspelt key fails at deploy naming
the field instead of being silently ignored.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from app.models import BUILTIN_MODEL, default_files, is_builtin_file
from app.models.declaration import ModelDeclaration

if TYPE_CHECKING:
    from app.front.haproxy_config import Front
    from app.models.graph import GraphIO
    from app.runtime.measure import SpeedGate
    from app.runtime.plan import RuntimeOptions


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class VariantArgs(_Strict):
    """One servable build of the model, bound as its own Classifier deployment."""

    model_path: str = Field(description="ONNX file; a relative path is relative to the working directory")
    description: str = Field("", description="shown in GET /v1/models")
    precision: Literal["fp32", "int8"] = Field(
        "fp32", description="what the file holds; int8 turns on TensorRT's INT8 mode and the slow-INT8 check"
    )
    engine: Literal["auto", "tensorrt", "cuda", "openvino", "cpu"] = Field(
        "auto",
        description="auto: TensorRT then CUDA on a GPU replica; on a CPU replica OpenVINO or ONNX Runtime's "
        "CPU EP, whichever measures faster at warm-up. Any other value insists on that engine",
    )
    fp16: bool = Field(False, description="let TensorRT use FP16 kernels too (TensorRT only)")
    allow_slow_int8: bool = Field(
        False, description="serve an INT8 variant on the CUDA EP without TensorRT (slower than FP32 there)"
    )


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


class SpeedGateArgs(_Strict):
    """Each variant other than `baseline` must be `min_speedup` times as fast as it, measured on its own node."""

    baseline: str = Field(description="the variant the others are compared with (e.g. fp32)")
    min_speedup: float = Field(1.2, gt=0, description="variant img/s / baseline img/s at max_batch_size")
    action: Literal["warn", "fail"] = Field(
        "warn",
        description="warn: a log line, a metric and a flag in /v1/models; fail: the slower variant's replicas fail",
    )


class Limits(_Strict):
    """Input limits, all checked before any expensive work."""

    max_body_bytes: int = Field(10 * 1024 * 1024, gt=0, description="request body limit (413 beyond)")
    max_pixels: int = Field(40_000_000, gt=0, description="width x height limit, read from the header (413)")
    max_batch_files: int = Field(64, gt=0, le=1024, description="images in one /v1/classify/batch request (413)")
    max_top_k: int = Field(20, gt=0, le=1000, description="largest top_k a request may ask for (422)")
    default_top_k: int = Field(5, gt=0, description="top_k when the request gives none")
    max_decode_bytes: int = Field(
        512 * 1024 * 1024,
        gt=0,
        description="decode budget per image: the memory decoding and converting it may take, estimated from "
        "the header (pixels x channels x bytes per sample, plus OpenCV's copy and buffers and the uint8 "
        "conversion) before the decoder runs (413 decode_budget_exceeded beyond). The default 512 MiB fits "
        "every 8-bit image up to max_pixels' 40 MP in any accepted format (worst: 8-bit RGBA, 320 MB; a GIF, "
        "360 MB) and a 40 MP 16-bit RGB one (480 MB); a 12 MP JPEG costs ~5 MB (reduced decode), ~40 MB if "
        "progressive. It refuses a 40 MP 16-bit RGBA (640 MB) or float32 RGBA image (1.3 GB; 2.5 GB before "
        "the band-wise conversion), which pixels and body size alone let through",
    )
    max_json_bytes: int = Field(
        4 * 1024 * 1024,
        gt=0,
        description="a V2 request's JSON (the whole body, or the header before binary tensor data), after "
        "decompression (413 beyond). JSON tensors are an inefficient encoding: one 224x224x3 UINT8 image is "
        "150,528 numbers, ~0.52-0.55 MB of tritonclient JSON (~3.6x its binary size) and ~28 ms of CPU to parse, "
        "so max_batch_files (64) such images would be ~35 MB, past max_body_bytes even before this limit. 4 MiB "
        "takes ~7 JSON images, or ~3 MB of base64 image files; send batches as binary tensor data "
        "(tritonclient's default), which this limit does not touch",
    )
    max_inflate_ratio: float = Field(
        32.0,
        gt=1,
        description="a compressed (gzip/deflate) body may inflate to at most this many times its size, unless it "
        "inflates to 1 MiB or less (413 beyond). tritonclient-compressed requests of real photographs inflate "
        "1.0-1.9x (binary tensors, encoded files), up to 2x (base64 JSON) and 4.8x (JSON pixels); only "
        "near-uniform images go further (a blank 224x224 image: 500-800x)",
    )
    max_url_bytes: int = Field(
        8192, gt=0, description="the request target, path and query (414 beyond, when the request reaches the Router)"
    )
    preprocessor_memory_bytes: int = Field(
        1024 * 1024 * 1024,
        gt=0,
        description="ceiling per decoding replica (the Preprocessor, or the Router with decode_in: router) on the "
        "decode budgets of the decodes in flight at once (nor are there more of them than the replica's whole CPUs, "
        "at least one); arrivals wait for room. At least "
        "max_decode_bytes. The replica's own baseline (Python, Ray, OpenCV) comes on top",
    )

    @model_validator(mode="after")
    def _default_within_max(self) -> Limits:
        if self.default_top_k > self.max_top_k:
            raise ValueError(f"default_top_k ({self.default_top_k}) exceeds max_top_k ({self.max_top_k})")
        if self.max_json_bytes > self.max_body_bytes:
            raise ValueError(
                f"max_json_bytes ({self.max_json_bytes}) exceeds max_body_bytes ({self.max_body_bytes}): JSON, the "
                "costlier encoding, may not be allowed more than binary"
            )
        if self.max_decode_bytes > self.preprocessor_memory_bytes:
            raise ValueError(
                f"max_decode_bytes ({self.max_decode_bytes}) exceeds preprocessor_memory_bytes "
                f"({self.preprocessor_memory_bytes}): an image within the budget could never be decoded"
            )
        return self


class FrontArgs(_Strict):
    """The admission front (app/front/): what HAProxy does before a request reaches a Router. Delivered to HAProxy
    as APP_FRONT_* variables by `make serve`, the tests, the benchmarks and the RayService renderer (`python -m
    app.front env CONFIG` for any other launcher); each Router checks that its requests came through a front
    with these limits (/v1/models)."""

    maxconn_per_replica: int = Field(
        128,
        ge=1,
        le=100_000,
        description="requests HAProxy lets into one Router replica at once (per HAProxy); the rest wait in its queue, "
        "which costs no CPU. Keep it within the Router's max_in_flight + max_slow_bodies",
    )
    queue_timeout_s: float = Field(
        4.0,
        ge=0.001,
        le=3600,
        description="a request still waiting in HAProxy's queue after this gets the JSON 503 + Retry-After from "
        "HAProxy (the wait paces clients that resend at once); keep it under the Router's inference_timeout_s",
    )
    max_queued: int = Field(
        0,
        ge=0,
        le=10_000_000,
        description="> 0: a request that finds this many waiting for its application: 503 at once",
    )
    max_per_client: int = Field(
        32,
        ge=0,
        le=100_000,
        description="requests one client named by client_header may have in flight at this HAProxy (waiting for its "
        "body, queued or at a Router); beyond, held for Retry-After, then JSON 429 + Retry-After. 0: no bound",
    )
    client_header: str = Field(
        "X-User-Id",
        pattern=r"^[A-Za-z0-9][A-Za-z0-9-]{0,63}$",
        description="the request header that names a client (the Router's sticky header)",
    )
    max_per_address: int = Field(
        0,
        ge=0,
        le=100_000,
        description="the same bound per source address, for requests that name no client. 0 (off) unless HAProxy sees "
        "clients' own addresses: on one machine every client is 127.0.0.1, behind a load balancer the balancer",
    )
    head_timeout_s: float = Field(
        5.0, ge=0.001, le=3600, description="the request's head must arrive whole within this (HAProxy's 408 beyond)"
    )
    body_timeout_s: float = Field(
        5.0,
        ge=0.001,
        le=3600,
        description="the body, or its first buffer_bytes, must arrive within this after the head, before the request "
        "takes any place at a Router (JSON 408 beyond): slow bodies cost HAProxy a buffer, not a Router's place",
    )
    buffer_bytes: int = Field(
        65536,
        ge=16384,
        le=16 << 20,
        description="HAProxy's buffer (tune.bufsize): what it holds of each body before passing it on; a larger body "
        "goes on once it is full and meets the Router's own body deadline. Each waiting request holds one",
    )

    def limits(self, limits: Limits | None = None) -> Front:
        """The front's limits; with the app's `limits`, its body limit too (refused by HAProxy from the header)."""
        from dataclasses import replace

        from app.front.haproxy_config import Front

        front = Front(**self.model_dump())
        return replace(front, max_body_bytes=limits.max_body_bytes) if limits is not None else front


class CaptureArgs(_Strict):
    """Opt-in: keep the images on which a cascade's two variants disagree, as a calibration set for the next build.

    The encoded images as received (no V2 pixel tensors), one file each under `dir`/<cascade>, with a .json
    beside it (both answers, the margin); `python -m app.models quantize --calibration-dir` reads the
    directory as it is. Bounded in count, bytes and age; the oldest go first. They are user data:
    docs/ab-rollout-cascade.md ("Cascade") says what that means."""

    enabled: bool = Field(False, description="keep the disagreements (off unless asked for)")
    dir: str = Field("captures", description="where; a relative path is relative to the working directory")
    max_images: int = Field(1000, gt=0, le=1_000_000, description="images kept per cascade and Router; oldest go")
    max_bytes: int = Field(256 * 1024 * 1024, gt=0, description="their bytes per cascade and Router; oldest go")
    retention_s: float = Field(7 * 86400, gt=0, description="an image older than this is deleted")


class CascadeArgs(_Strict):
    """A routable variant made of two: every image on `first`, the uncertain ones again on `then`."""

    first: str = Field(description="the variant every image runs on (e.g. int8)")
    then: str = Field(description="the variant an image goes on to when first's top-1 margin is below the threshold")
    margin: float | Literal["auto"] = Field(
        "auto",
        description="the threshold on first's top-1 minus top-2 probability, in [0, 1] (0: never escalate, 1: "
        "always); auto: fitted from the A/B shadows' comparisons of first with then, to reach target_agreement "
        "with the fewest escalations",
    )
    target_agreement: float = Field(0.995, gt=0, le=1, description="auto: top-1 agreement with `then` to reach")
    min_samples: int = Field(
        1000, gt=0, description="auto: comparisons needed before a fit; until then default_margin stands"
    )
    default_margin: float = Field(
        0.5, ge=0, le=1, description="auto: the threshold until min_samples comparisons (conservative: escalates more)"
    )
    description: str = Field("", description="shown in GET /v1/models")
    capture: CaptureArgs = Field(default_factory=CaptureArgs)

    @field_validator("margin")
    @classmethod
    def _margin_in_range(cls, v: float | str) -> float | str:
        if not isinstance(v, str) and not 0.0 <= v <= 1.0:
            raise ValueError(f"margin must be in [0, 1] or auto, got {v}")
        return v


CASCADE_NAME = re.compile(r"^[A-Za-z0-9_-]+>[A-Za-z0-9_-]+$")  # int8>fp32; two of one pair: int8>fp32-all


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
    decode_in: Literal["preprocessor", "router"] = Field(
        "preprocessor",
        description="where images are decoded. preprocessor: a deployment of its own (decode scales apart from the "
        "ingress; a crash in a decoder costs one retried call, not a Router and every request it holds). router: in "
        "each Router replica, under the same DecodeBudget (no Preprocessor deployment): one handle call per request "
        "fewer: measured here at c=1, p50 a third lower (46.9 -> 29.8 ms) and 36.6 against 49.4 CPU-ms per image, "
        "at c=32 within the noise (docs/performance.md)",
    )
    cascades: dict[str, CascadeArgs] = Field(
        default_factory=dict,
        description='name ("int8>fp32") -> a cascade: routable like a variant (weights, the override header, '
        'shadows, rollouts), no deployment of its own (docs/ab-rollout-cascade.md "Cascade")',
    )
    tensorrt: TensorRTArgs = Field(default_factory=TensorRTArgs)
    speed_gate: SpeedGateArgs | None = Field(None, description="refuse or flag variants not faster than a baseline")

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
        """Relative model paths are relative to the directory `serve run` / `serve deploy` was started in."""
        return Path(path).absolute()

    def may_use_tensorrt(self, variant: str) -> bool:
        return self.device != "cpu" and self.variants[variant].engine in ("auto", "tensorrt")

    def runtime_options(self, variant: str, gpu: bool, threads: int, streams: int) -> RuntimeOptions:
        """How `variant` runs in a replica that was (`gpu`) or was not granted a GPU."""
        from app.runtime.plan import RuntimeOptions, TensorRTOptions

        v = self.variants[variant]
        trt = self.tensorrt
        return RuntimeOptions(
            threads=threads,
            streams=streams,
            engine=v.engine,
            precision=v.precision,
            fp16=v.fp16,
            prefer_gpu=self.device == "cuda" or (self.device == "auto" and gpu),
            require_gpu=self.require_gpu,
            allow_slow_int8=v.allow_slow_int8,
            gpu_mem_limit_bytes=self.gpu_mem_limit_bytes,
            tensorrt=TensorRTOptions(
                cache_dir=trt.resolved_cache_dir(),
                max_batch_size=trt.max_batch_size,
                workspace_bytes=trt.workspace_bytes,
                builder_optimization_level=trt.builder_optimization_level,
                timing_cache=trt.timing_cache,
            ),
        )

    def speed_gate_for(
        self, variant: str, gpu: bool, threads: int, streams: int, chosen_engine: str
    ) -> tuple[SpeedGate, str, RuntimeOptions] | None:
        """The gate `variant` must pass, the baseline's model file and how to run it; None if not gated.

        The baseline runs on the engine family `variant` chose on this node (its own `engine` where that
        is not auto), so the comparison is of the models, and the start pays for one measurement only.
        """
        from dataclasses import replace

        from app.runtime.measure import SpeedGate

        gate = self.speed_gate
        if gate is None or gate.baseline == variant:
            return None
        opts = self.runtime_options(gate.baseline, gpu, threads, streams)
        if opts.engine == "auto":
            opts = replace(opts, engine=chosen_engine)
        path = str(self.resolved_path(self.variants[gate.baseline].model_path))
        return SpeedGate(gate.baseline, gate.min_speedup, gate.action), path, opts

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

    def check_graphs(self) -> list[Path]:
        """The declaration against the graph of each variant whose file is on this machine, and the variants against
        each other (one model: one input, one set of classes); ValueError naming the field. The files checked."""
        from app.models.graph import GraphError, read_graph

        checked: list[Path] = []
        first: tuple[str, GraphIO] | None = None
        labels = self.model.label_count()
        for name, v in sorted(self.variants.items()):
            path = self.resolved_path(v.model_path)
            if not path.is_file():
                continue
            where = f"variants.{name}.model_path: {path}"
            try:
                graph = read_graph(path)
            except GraphError as e:
                raise ValueError(f"{where}: {e}") from None
            self.model.check_against(graph, labels, where)
            if first is not None and _io(graph) != _io(first[1]):
                raise ValueError(
                    f"{where}: its graph takes {graph.describe_input()} with {graph.classes} classes, "
                    f"variants.{first[0]}'s {first[1].describe_input()} with {first[1].classes}: the variants of one "
                    "model share its declaration, so they must take the same input and give the same classes"
                )
            first = first or (name, graph)
            checked.append(path)
        return checked

    def is_default_model(self, path: Path) -> bool:
        files = default_files(path.parent)
        return path in (files.fp32, files.int8, files.int8_trt)


def _io(graph: GraphIO) -> tuple[object, ...]:
    return (graph.input_shape[1:], graph.dtype, graph.layout, graph.classes)


class RouterConfig(_Strict):
    """The Router's user_config: the A/B policy and per-request deadlines (all live)."""

    weights: dict[str, float] = Field(description="variant -> relative weight; need not sum to 1")
    sticky_header: str = Field("X-User-Id", description="requests with this header always get the same variant")
    override_header: str = Field("X-Model-Variant", description="header that names a variant explicitly")
    allow_override: bool = Field(True, description="honour the override header (403 when false)")
    failover: bool = Field(True, description="serve from another variant when the chosen one is down")
    inference_timeout_s: float = Field(
        10.0,
        gt=0,
        description="deadline per request, from when its body has arrived (503 beyond); the body has its own, "
        "body_timeout_s",
    )
    shadow_fraction: float = Field(0.0, ge=0, le=1, description="share of requests also run on the other variant")
    max_shadow_in_flight: int = Field(8, ge=0, description="shadow runs in flight per Router; beyond, dropped")
    coalesce_max: int = Field(
        16,
        gt=0,
        le=256,
        description="images sent down the chain together, from concurrent requests of any protocol (1: one call each)",
    )
    max_groups_in_flight: int = Field(
        2, gt=0, le=64, description="groups per variant in flight at once; arrivals meanwhile form the next group"
    )
    max_in_flight: int = Field(
        192,
        gt=0,
        description="requests in flight per Router replica, counted once their body has arrived; beyond, an "
        "immediate JSON 503 (load shedding)",
    )
    max_queue_wait_s: float | None = Field(
        None,
        ge=0,
        description="beyond max_in_flight, a request waits for a slot (FIFO) if the wait it can expect at the "
        "measured rate of finishing requests fits in this, else it gets an immediate JSON 503; the wait counts "
        "toward inference_timeout_s, which must leave room for the work (default: half of it). 0: no queue, "
        "refuse at once. A waiting request costs no CPU; a refused one that its client resends at once costs "
        "as much as a small request",
    )
    max_queued: int = Field(512, ge=0, description="requests waiting for a slot per Router replica (503 beyond)")
    max_queued_per_user: int | None = Field(
        None,
        ge=0,
        description="of those, how many one user (the sticky header, X-User-Id) may hold, so one client cannot "
        "take the whole queue (default: a quarter of max_queued; 0: no cap). Requests without the header are "
        "not capped: through HAProxy the Router cannot tell connections apart",
    )
    max_refusals_per_s: float = Field(
        100,
        ge=0,
        description="503 overloaded replies per second per Router replica sent at once; beyond, each waits its "
        "turn (at most inference_timeout_s), so clients that resend at once cannot spend the replicas' CPU on "
        "refusals (each costs about what a small request does). 0: never paced",
    )
    max_queued_mib: float = Field(
        256, gt=0, description="body bytes held by the waiting requests per Router replica (503 beyond)"
    )
    body_timeout_s: float = Field(
        5.0,
        gt=0,
        le=60,
        description="the whole body must arrive within this, from when the Router starts reading it (408 "
        "body_timeout beyond): a total, not an inactivity timeout, so one byte a second does not reset it. "
        "10 MiB in 5 s needs 2 MB/s",
    )
    slow_body_after_s: float = Field(
        0.5,
        ge=0,
        description="a body still arriving after this is slow and needs one of max_slow_bodies slots; bodies "
        "that arrive sooner (every client that sends its body right after its headers) need none",
    )
    max_slow_bodies: int = Field(
        32,
        gt=0,
        description="slow bodies arriving at once per Router replica, apart from max_in_flight; a body that "
        "becomes slow with all taken gets 408 body_timeout at once. Requests whose bodies are arriving still "
        "count toward the Router's max_ongoing_requests (Serve's own cap): keep max_in_flight + max_queued + this "
        "within it",
    )
    admin_token_env: str | None = Field(
        "APP_ADMIN_TOKEN",
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        description="the environment variable holding the admin token that POST /v1/ab/reset needs as "
        "`Authorization: Bearer <token>` (the token itself never goes in a config)",
    )
    allow_unauthenticated_admin: bool = Field(
        False,
        description="with no admin token in the environment, let anyone call the admin endpoints (local use "
        "only); false: they answer 403. A configured token is required either way",
    )

    @property
    def queued_per_user(self) -> int:
        return max(1, self.max_queued // 4) if self.max_queued_per_user is None else self.max_queued_per_user

    @property
    def queue_wait_s(self) -> float:
        return self.inference_timeout_s / 2 if self.max_queue_wait_s is None else self.max_queue_wait_s

    @model_validator(mode="after")
    def _queue_leaves_time_for_work(self) -> RouterConfig:
        if self.max_queue_wait_s is not None and self.max_queue_wait_s >= self.inference_timeout_s:
            raise ValueError(
                f"max_queue_wait_s ({self.max_queue_wait_s}) must be below inference_timeout_s "
                f"({self.inference_timeout_s}): the wait counts toward the deadline, and the work needs time too"
            )
        return self

    def max_ongoing_needed(self) -> int:
        """What Serve's max_ongoing_requests must allow the Router: in flight, waiting, and slow bodies."""
        queue = self.max_queued if self.queue_wait_s > 0 else 0
        return self.max_in_flight + queue * (2 if self.max_refusals_per_s > 0 else 1) + self.max_slow_bodies

    @field_validator("weights")
    @classmethod
    def _weights_valid(cls, w: dict[str, float]) -> dict[str, float]:
        negative = {k: v for k, v in w.items() if v < 0}
        if negative:
            raise ValueError(f"weights must be >= 0, got {negative}")
        if not w or sum(w.values()) <= 0:
            raise ValueError(f"at least one weight must be positive, got {w}")
        return w


class ClassifierConfig(_Strict):
    """A Classifier's user_config: dynamic batching, changed live through reconfigure."""

    max_batch_size: int = Field(16, gt=0, le=256, description="images per ONNX Runtime call")
    batch_wait_timeout_s: float = Field(0.003, ge=0, le=1, description="how long a partial batch waits to fill")
    max_concurrent_batches: int = Field(1, gt=0, le=8, description="batches in flight per replica")
    warmup: bool = Field(True, description="run every batch size once at start so first requests are not slow")
    profile_batches: int = Field(0, ge=0, le=1000, description="profile the next N batches with ONNX Runtime")
    profile_dir: str = Field("/tmp/app-profiles", description="where profiling traces are written")

    def check_against(self, max_ongoing_requests: int) -> None:
        """Batches can only fill if a replica accepts enough requests at once."""
        needed = self.max_batch_size * self.max_concurrent_batches
        if max_ongoing_requests < needed:
            raise ValueError(
                f"user_config.max_batch_size ({self.max_batch_size}) x max_concurrent_batches "
                f"({self.max_concurrent_batches}) = {needed} exceeds max_ongoing_requests ({max_ongoing_requests}): "
                "batches could never fill; raise max_ongoing_requests or lower max_batch_size"
            )


def router_deployment_name() -> str:
    return "Router"


def classifier_deployment_name(variant: str) -> str:
    return f"Classifier_{variant}"


def validate_serve_config(cfg: dict, app_index: int = 0) -> AppArgs:
    """Check a whole Serve config file the way a deploy would, plus what only the file can show.

    Serve validates each user_config only when a replica runs `reconfigure`; this
    finds the same mistakes (and batch sizes that cannot fill) before any deploy.
    Errors name the field as `deployments[<name>].user_config.<field>`.
    """
    app_cfg = cfg["applications"][app_index]
    args = AppArgs.model_validate(app_cfg.get("args") or {})
    deployments = {d["name"]: d for d in app_cfg.get("deployments", [])}

    def field(name: str, model: type[BaseModel]) -> BaseModel:
        try:
            return model.model_validate(deployments.get(name, {}).get("user_config") or {})
        except ValueError as e:
            raise ValueError(f"deployments[{name}].user_config: {e}") from e

    if args.decode_in == "router" and "Preprocessor" in deployments:
        raise ValueError(
            "deployments[Preprocessor]: args.decode_in is router, so the application has no Preprocessor deployment "
            "(the Router decodes; give it the CPUs instead)"
        )
    router = field(router_deployment_name(), RouterConfig)
    assert isinstance(router, RouterConfig)
    router_ongoing = deployments.get(router_deployment_name(), {}).get("max_ongoing_requests")
    if router_ongoing is not None and int(router_ongoing) < router.max_ongoing_needed():
        raise ValueError(
            f"deployments[Router].max_ongoing_requests ({router_ongoing}) is below max_in_flight + max_queued "
            f"(x2 with paced refusals) + max_slow_bodies ({router.max_ongoing_needed()}): Serve would queue or "
            "refuse (with its own text 503) the requests the Router means to hold or answer"
        )
    if args.front.queue_timeout_s >= router.inference_timeout_s:
        raise ValueError(
            f"args.front.queue_timeout_s ({args.front.queue_timeout_s}) must be below deployments[Router].user_config."
            f"inference_timeout_s ({router.inference_timeout_s}): a request waits at most the two together"
        )
    if router_ongoing is not None and args.front.maxconn_per_replica > int(router_ongoing):
        raise ValueError(
            f"args.front.maxconn_per_replica ({args.front.maxconn_per_replica}) exceeds deployments[Router]."
            f"max_ongoing_requests ({router_ongoing}): Serve would refuse what the front lets in"
        )
    unknown = sorted(set(router.weights) - set(args.routable))
    if unknown:
        raise ValueError(f"deployments[Router].user_config.weights: unknown variants or cascades {unknown}")
    for variant in args.variants:
        name = classifier_deployment_name(variant)
        c = field(name, ClassifierConfig)
        assert isinstance(c, ClassifierConfig)
        max_ongoing = deployments.get(name, {}).get("max_ongoing_requests")
        problems = args.batching_problems(variant, c, None if max_ongoing is None else int(max_ongoing))
        if problems:
            raise ValueError(f"deployments[{name}]: {'; '.join(problems)}")
    return args


# The environment of every Ray process that runs Serve (docs/performance.md). Read by `make serve`,
# the benchmarks, the tests and the RayService renderer, so the laptop, CI and Kubernetes agree.
SERVE_ENV = Path(__file__).resolve().parents[2] / "configs" / "serve.env"
_ENV_LINE = re.compile(r"([A-Z_][A-Z0-9_]*)=([^\s'\"#]*)")


def read_serve_env(path: Path = SERVE_ENV) -> dict[str, str]:
    """KEY=VALUE lines (blank lines and `#` comments skipped); anything else is an error naming the line.

    Deliberately narrower than a shell or dotenv file: no quotes, spaces, expansion or `export`, so
    `make` (`set -a; . file`), Python and the Kubernetes manifest all read the same values.
    """
    return parse_serve_env(Path(path).read_text(), str(path))


def parse_serve_env(text: str, source: str) -> dict[str, str]:
    """`read_serve_env` on text already read; errors name `source` and the line."""
    env: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = _ENV_LINE.fullmatch(line)
        if m is None:
            raise ValueError(f"{source}:{number}: expected KEY=VALUE (no quotes or spaces), got {raw!r}")
        if m[1] in env:
            raise ValueError(f"{source}:{number}: {m[1]} is set twice")
        if m[1].startswith("APP_FRONT_"):
            raise ValueError(
                f"{source}:{number}: {m[1]} is the admission front's, set in the app config (args.front), from which "
                "`make serve`, the tests and the RayService renderer hand it to HAProxy"
            )
        env[m[1]] = m[2]
    return env


def private_haproxy_env(port: int) -> dict[str, str]:
    """HAProxy's files and its own stats/metrics ports for one Serve instance on this machine.

    They default to fixed values (/tmp/haproxy-serve, 8404, 9101), so two HAProxy-fronted Serve
    instances at once (a test session beside `make serve`, a benchmark target beside a soak) would
    fight over them. Files go to a fresh short directory under /tmp (HAProxy puts its admin socket
    in a 56-character subdirectory and refuses socket paths over 97 bytes); stats and metrics to
    port+91 and port+92 of the instance's HTTP port.
    """
    import tempfile

    hap = Path(tempfile.mkdtemp(prefix="hap-", dir="/tmp"))
    return {
        "RAY_SERVE_HAPROXY_CONFIG_FILE_LOC": str(hap / "haproxy.cfg"),
        "RAY_SERVE_HAPROXY_SOCKET_PATH": str(hap / "admin.sock"),
        "RAY_SERVE_HAPROXY_SERVER_STATE_BASE": str(hap),
        "RAY_SERVE_HAPROXY_SERVER_STATE_FILE": str(hap / "server-state"),
        "RAY_SERVE_HAPROXY_STATS_PORT": str(port + 91),
        "RAY_SERVE_HAPROXY_METRICS_PORT": str(port + 92),
    }


def front_binary() -> str | None:
    """`app-haproxy` (the admission front, app/front/) of this Python's environment, if installed."""
    import shutil
    import sys

    return shutil.which("app-haproxy", path=str(Path(sys.executable).parent))


def with_front(env: dict[str, str]) -> dict[str, str]:
    """`env` with Serve's HAProxy binary set to the admission front, where HAProxy is on and none is named."""
    if env.get("RAY_SERVE_ENABLE_HA_PROXY") != "1" or env.get("RAY_SERVE_HAPROXY_BINARY_PATH"):
        return env
    binary = front_binary()
    return env if binary is None else {**env, "RAY_SERVE_HAPROXY_BINARY_PATH": binary}


def private_serve_env(
    port: int, env: dict[str, str] | None = None, front: bool = True, config: dict[str, Any] | None = None
) -> dict[str, str]:
    """`env` (default: configs/serve.env) made private to the Serve instance on HTTP port `port`.

    Replicas' own HTTP (direct ingress) and gRPC ports come from fixed ranges (30000-31000,
    40000-41000) and are bound with SO_REUSEPORT, so a second Serve instance on this machine (a test
    session beside `make serve`, or a Ray cluster left running) binds the same ports and the kernel
    splits one instance's traffic between both: half the requests answered by the other app. Each
    instance therefore gets its own ranges, derived from its port (HTTP port+20000 .. +20, gRPC
    port+21000 .. +50; instances whose ports are 50 or more apart never overlap), its own fallback
    proxy ports (port+93, +94), and, when the
    environment turns HAProxy on, its own HAProxy files and ports (`private_haproxy_env`) and, unless
    `front` is False (the benchmarks' Serve peers, as Ray ships them), the admission front (`with_front`) with the
    limits of `config`'s args.front (default: configs/local.yaml's) as APP_FRONT_* variables.
    """
    out = read_serve_env() if env is None else dict(env)
    out.update(
        {
            "RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT": str(port + 20000),
            "RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT": str(port + 20020),
            "RAY_SERVE_DIRECT_INGRESS_MIN_GRPC_PORT": str(port + 21000),
            "RAY_SERVE_DIRECT_INGRESS_MAX_GRPC_PORT": str(port + 21050),
            # With HAProxy, Serve keeps a fallback proxy (127.0.0.1:8500 / 9500 by default, SO_REUSEPORT) for
            # when no Router is up: shared, it let another instance answer this one's requests while starting.
            "RAY_SERVE_FALLBACK_PROXY_HTTP_PORT": str(port + 93),
            "RAY_SERVE_FALLBACK_PROXY_GRPC_PORT": str(port + 94),
        }
    )
    if out.get("RAY_SERVE_ENABLE_HA_PROXY") == "1":
        out.update(private_haproxy_env(port))
        if not front:  # HAProxy itself, even where the caller's environment names the front
            from app.front import real_haproxy

            out["RAY_SERVE_HAPROXY_BINARY_PATH"] = real_haproxy()
        else:  # the front's limits: the config's args.front, under any the caller set itself
            import yaml

            from app.front import config_env

            served = config if config is not None else yaml.safe_load((SERVE_ENV.parent / "local.yaml").read_text())
            out = {**config_env(served), **out}
    return with_front(out) if front else out


def main(argv: list[str] | None = None) -> int:
    """python -m app.config FILE...: validate Serve config files without deploying them."""
    import sys

    import yaml

    status = 0
    for path in argv if argv is not None else sys.argv[1:]:
        if path.endswith(".env"):
            try:
                print(f"{path}: ok ({', '.join(read_serve_env(Path(path))) or 'empty'})")
            except ValueError as e:
                print(e, file=sys.stderr)
                status = 1
            continue
        with open(path) as f:
            cfg = yaml.safe_load(f)
        try:
            checked = validate_serve_config(cfg).check_graphs()
            if checked:
                print(f"{path}: ok (the model declaration checked against {', '.join(map(str, checked))})")
            else:
                print(f"{path}: ok (no model file here: each Classifier checks the declaration against its graph)")
        except ValueError as e:
            print(f"{path}: {e}", file=sys.stderr)
            status = 1
    return status
