"""The v1 response bodies as typed models: the source of the OpenAPI document's schemas (`app.http.openapi`).

Pure: no Ray, no Starlette. The v1 handlers (`app.http.v1`) build the classification and health replies from
these models; the other bodies are built as dicts, and tests/test_openapi_live.py checks every real reply against
the schemas made from the models.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from app.config import Limits
from app.config.speed_gate import SpeedGateVerdict
from app.errors import STATUS
from app.rollout.spec import RolloutSpec
from app.served_model.declaration import ModelDeclaration


class _Body(BaseModel):
    """A closed JSON object: a field the handler does not send is a drift the schema must catch."""

    model_config = ConfigDict(extra="forbid")


# -- errors ------------------------------------------------------------------------------


class ErrorDetail(_Body):
    code: str = Field(
        description="machine-readable; the status follows from it (the error table in docs/api.md)",
        json_schema_extra={"enum": list(STATUS)},
    )
    message: str = Field(description="for people; may change between releases")

    @field_validator("code")
    @classmethod
    def _known(cls, code: str) -> str:
        if code not in STATUS:
            raise ValueError(f"unknown error code {code!r}")
        return code


class ErrorBody(_Body):
    """Every v1 error: `{"error": {"code", "message"}}`."""

    error: ErrorDetail


class NotReadyBody(ErrorBody):
    """GET /readyz when a variant is not loaded and warmed: the error, and each variant's readiness."""

    variants: dict[str, bool] = Field(description="variant -> loaded and warmed up")


# -- classification ----------------------------------------------------------------------


class Prediction(_Body):
    class_id: int = Field(ge=0, description="index into the model's labels")
    label: str
    score: float = Field(ge=0, le=1, description="softmax probability, rounded to 6 digits")


class EntryTimings(_Body):
    """Where one image's time went, in milliseconds (batch_size: images in the Classifier call it rode in)."""

    preprocess: float
    queue: float
    inference: float
    escalation: float | None = Field(None, description="a cascade's second stage (its `then`), when one answered")
    batch_size: int = Field(ge=0)


class RequestTimings(EntryTimings):
    """A request's timings: receive (the body arriving) and total on top of the image's. Also in Server-Timing."""

    receive: float
    total: float


class CascadeReply(_Body):
    """How a cascade answered this image: `first`'s answer, or `then`'s when first's margin was below the threshold."""

    escalated: bool = Field(description="true: `then` answered; false: `first`'s answer stands")
    margin: float = Field(ge=0, le=1, description="first's top-1 minus top-2 probability")
    threshold: float = Field(ge=0, le=1, description="the threshold in force (margin auto: as fitted)")
    first: str
    then: str
    escalation_failed: str | None = Field(
        None, description="present when the image was meant to go on but `then` could not answer (its error code)"
    )


class _Classification(_Body):
    request_id: str = Field(description="as in X-Request-Id; a batch entry's is `<request_id>-<position>`")
    variant: str = Field(description="the variant that answered (also the X-Model-Variant response header)")
    model: str
    predictions: list[Prediction] = Field(description="top_k classes, best first")
    routing: Literal["weighted", "sticky", "override"] = Field(description="why the request went to its variant")
    failover: bool = Field(False, description="present (true) only when another variant answered for a down one")
    cascade: CascadeReply | None = Field(None, description="present only when a cascade answered")


class ClassifyResponse(_Classification):
    """POST /v1/classify: the image's top classes."""

    timings_ms: RequestTimings


class BatchEntry(_Classification):
    """One image of a batch that was classified."""

    timings_ms: EntryTimings


class BatchEntryError(ErrorBody):
    """One image of a batch that failed (400, 413 or 415 codes); the others are unaffected."""

    status: int = Field(description="the status this error would have had on /v1/classify")


class BatchResponse(_Body):
    """POST /v1/classify/batch: one entry per `file` part, in order."""

    request_id: str
    variant: str
    results: list[BatchEntry | BatchEntryError]
    timings_ms: RequestTimings


# -- health --------------------------------------------------------------------------------


class Health(_Body):
    status: Literal["ok"]


class Ready(_Body):
    status: Literal["ready"]
    variants: dict[str, bool] = Field(description="variant -> loaded and warmed up (all true here)")


# -- A/B evidence --------------------------------------------------------------------------


class LatencyQuantiles(_Body):
    p50: float | None
    p99: float | None


class VariantEvidence(_Body):
    requests: int = Field(ge=0)
    errors: int = Field(ge=0)
    error_rate: float | None = Field(description="null before the first request")
    latency_ms: LatencyQuantiles


class PairEvidence(_Body):
    """Shadow comparisons of two variants on the same images."""

    shadowed: int = Field(ge=0)
    dropped: int = Field(ge=0, description="shadow runs skipped under load or failed; never compared")
    top1_agreement: float | None
    top1_agreement_ci95: tuple[float, float] | None = Field(description="95% Wilson interval")
    mean_top5_overlap: float | None
    mean_abs_top1_prob_delta: float | None


class CurvePoint(_Body):
    threshold: float
    agreement: float = Field(description="top-1 agreement with `then` at this threshold, as measured")
    agreement_low: float = Field(description="its lower bound (the kept images' disagreement at its 95% Wilson top)")
    escalation: float = Field(description="the share of images that would go on to `then`")


class CascadeFit(_Body):
    threshold: float
    fitted: bool = Field(description="false: fewer than min_samples comparisons, default_margin stands")
    samples: int
    expected: CurvePoint | None
    reason: str


class CaptureInfo(_Body):
    """The calibration capture's directory on this Router's node (AppArgs cascades.<name>.capture)."""

    dir: str
    images: int
    bytes: int
    max_images: int
    max_bytes: int
    retention_s: float
    written: int
    dropped: int
    duplicates: int
    unknown_format: int
    errors: int


class _CascadeBase(_Body):
    first: str
    then: str
    margin: float | Literal["auto"]
    threshold: float = Field(description="in force now")
    problem: str | None = Field(None, description="why it cannot escalate (first's answers stand), if it cannot")
    target_agreement: float | None = None
    min_samples: int | None = None
    default_margin: float | None = None
    fit: CascadeFit | None = None


class EvidenceCount(_Body):
    comparisons: int
    disagreements: int


class CascadeSummary(_CascadeBase):
    evidence: EvidenceCount
    curve: list[CurvePoint] = Field(description="thresholds 0.00 .. 1.00 (empty with no evidence)")


class CascadeInfo(_CascadeBase):
    weight: float
    traffic_fraction: float
    description: str
    capture: CaptureInfo | None = None


class VariantServing(_Body):
    """What a variant's replica really runs, beside its evidence: the evidence is about this build."""

    precision: Literal["fp32", "fp16", "int8"] | None = Field(description="what runs (null: no answer)")
    requested_precision: Literal["fp32", "fp16", "int8"] | None
    engine: str | None
    execution_provider: str | None
    fallback_reason: str | None = Field(description="why the declared fallback serves, while it does")


class ABSummary(_Body):
    """GET /v1/ab/summary: the A/B evidence of every Router since `since`."""

    model: str | None = Field(None, description="the declared model's name (GET /v1/ab/summary)")
    serving: dict[str, VariantServing] | None = Field(
        None, description="variant -> what its replica runs (GET /v1/ab/summary; not in POST /v1/ab/reset's before)"
    )
    since: float = Field(description="Unix time of the start or the last reset")
    variants: dict[str, VariantEvidence]
    pairs: dict[str, PairEvidence] = Field(description='key "a|b", the two variant names sorted')
    cascades: dict[str, CascadeSummary] | None = Field(
        None, description="each cascade's threshold, its fit and the curve it was fitted on (only with cascades)"
    )


class ABReset(_Body):
    """POST /v1/ab/reset: the counters are zeroed; `before` is the summary as it was."""

    reset: Literal[True]
    before: ABSummary


# -- /v1/models ------------------------------------------------------------------------------


class Throughput(_Body):
    batch: int
    parallel: int = Field(description="calls in flight at once")
    ms: float = Field(description="median wall time of one round")
    img_per_s: float


# `speed_gate`: SpeedGateVerdict, the very record the engines' speed gate (`judge`) makes.


class FallbackInfo(_Body):
    """The variant's declared fallback, serving instead of the build it requested."""

    requested_precision: Literal["fp32", "fp16", "int8"]
    requested_model_file: str = Field(description="the build the variant asked for (its served copy)")
    precision: Literal["fp32", "fp16", "int8"] = Field(description="what runs")
    model_file: str = Field(description="the fallback's model file")
    reason: str = Field(description='why, e.g. "TensorRT not loadable: libnvinfer.so.10"')


class CudaGraphs(_Body):
    """CUDA graphs on a GPU engine; absent on a CPU engine or with cuda_graphs off."""

    enabled: bool
    active: bool = Field(description="some batch sizes replay a captured graph")
    off: str | None = Field(None, description="why none is used although asked for")
    slots: int | None = Field(None, description="batch slots, each a thread with a graph session per bucket")
    buckets_captured: list[int] | None = None
    graph_batch_sizes: str | None = Field(None, description='the batch sizes graphs serve, e.g. "1-8, 13-16"')
    replay_ms: dict[str, float] | None = Field(None, description="bucket -> median ms of a replay, copies included")
    plain_ms: dict[str, float] | None = Field(None, description="batch size -> median ms of a plain run")
    slots_without_graphs: dict[str, str] | None = Field(None, description="slot -> why it serves plain")
    prepared: bool | None = Field(None, description="captured, checked and decided (at the replica's start)")
    prepare_s: float | None = Field(None, description="seconds the captures, checks and timings took at start")


class Batching(_Body):
    max_batch_size: int
    batch_wait_timeout_s: float
    max_concurrent_batches: int


class GraphInput(_Body):
    name: str
    shape: list[int] = Field(description="-1 for a symbolic dimension (the batch)")
    dtype: Literal["uint8", "float32", "float16"]
    layout: Literal["NCHW", "NHWC"]


class GraphOutput(_Body):
    name: str
    shape: list[int] = Field(description="-1 for a symbolic dimension (the batch)")
    classes: int | None


class GraphInfo(_Body):
    """The model's own graph, as its file declares it."""

    input: GraphInput
    output: GraphOutput


class PixelsInfo(_Body):
    """What the Classifier takes: the Preprocessor's output, and the V2 `image` input."""

    dtype: Literal["uint8"]
    shape: list[int] = Field(description="[-1, H, W, C]")
    order: Literal["RGB", "BGR", "GRAY"]


class TransformInfo(_Body):
    """The Preprocessor's half of the declaration at the graph's size."""

    height: int
    width: int
    channels: int
    resize_shorter: int | None
    interpolation: Literal["area", "linear", "cubic"]
    color: Literal["RGB", "BGR", "GRAY"]


class NormalisationInfo(_Body):
    scale: float
    mean: list[float]
    std: list[float]


class PrologueInfo(_Body):
    """The ops folded in front of the graph at load: y = x * scale - shift."""

    steps: list[str]
    scale: list[float] | None
    shift: list[float] | None


class InputSpec(_Body):
    size: tuple[int, int] = Field(description="[height, width]")
    channels: int
    classes: int | None
    pixels: PixelsInfo
    graph: GraphInfo
    transform: TransformInfo
    normalisation: NormalisationInfo
    output: Literal["logits", "probabilities"]
    file: str = Field(description="the variant's model file")
    served_file: str = Field(description="the file the engine loads: the model file, or its copy with the prologue")
    prologue: PrologueInfo


class OpenVinoInfo(_Body):
    version: str
    streams: int
    threads: int


class Profiling(_Body):
    active: bool
    batches_left: int
    last: dict[str, Any] | None = Field(description="the last profile's trace file and summary")
    refused: str | None = Field(None, description="present when this replica cannot profile")


class DeviceBatchInfo(_Body):
    """decode_in: gpu: whether a batch's pixels stay on the device for the engine."""

    active: bool = Field(
        description="true: the transform writes each image into the engine's input buffer and the engine reads it "
        "there (only the logits reach the host); false: the host mode, the pixels go through host memory"
    )
    off: str | None = Field(None, description="present when not active: why (the engine, or the start-up check)")


class GpuDecodeInfo(_Body):
    """decode_in: gpu: this Classifier replica's decoder and where its images were decoded, counted since start."""

    where: Literal["gpu"]
    decoder: str = Field(description="nvimgcodec (the GPU's JPEG decoders), or the host stand-in of the tests")
    images: dict[str, int] = Field(
        description="hardware, hybrid (the GPU's decoders), cpu (the CPU path), failed (refused or undecodable), "
        "fallback and transform_fallback (meant for the GPU, decoded by the CPU path), device_errors (whole GPU calls)"
    )
    device_batch: DeviceBatchInfo | None = Field(None, description="whether the device mode serves, or why not")


class _VariantBase(_Body):
    deployment: str = Field(description="the Serve deployment, Classifier_<variant>")
    weight: float
    traffic_fraction: float = Field(ge=0, le=1)
    description: str


class ModelSource(_Body):
    """One file of the version a replica serves, as it was fetched."""

    field: str = Field(description="the config field that names it (variants.<v>.model_path, model.labels_path, ...)")
    uri: str = Field(description="where it came from: a path, file://, s3://, gs:// or https://")
    sha256: str = Field(description="its content's SHA-256 (checked against the config's pin where one is given)")
    bytes: int
    downloaded: bool = Field(description="false: the node's cache (or a local file) had it")
    fetch_s: float = Field(description="seconds the fetch and the digest check took")


class ServedVersion(_Body):
    version: str = Field(description="the variant's model file's sha256: the version serving")
    files: list[ModelSource] = Field(description="the variant's model first, then its fallback, baseline and labels")


class ReleaseTarget(_Body):
    uri: str
    sha256: str | None


class CacheEntry(_Body):
    sha256: str
    size: int = Field(description="bytes")
    uri: str = Field(description="where it was fetched from")
    last_used: float = Field(description="when a replica last fetched it, Unix time")
    in_use: bool = Field(description="a running replica holds it: never evicted")


class ModelCache(_Body):
    """The node's model cache, shared by its replicas: content-addressed, bounded by args.model_cache.max_bytes."""

    dir: str
    max_bytes: int | None
    bytes: int
    entries: list[CacheEntry] = Field(description="most recently used first")


class ModelVersion(_Body):
    """The model version this replica serves and how its last release went (a user_config's model_path)."""

    state: Literal["starting", "serving", "releasing", "failed"] = Field(
        description="failed: the last release was refused (error says why) and `serving` still serves"
    )
    serving: ServedVersion | None
    target: ReleaseTarget | None = Field(None, description="releasing or failed: the version asked for")
    error: str | None = Field(None, description="failed: one line naming the field, the URI and the reason")
    seconds: float | None = Field(None, description="failed: how long the refused release took")
    cache: ModelCache


class VariantInfo(_VariantBase):
    """A variant as its Classifier replica describes itself."""

    variant: str
    model: str = Field(description="the declared model's name")
    model_file: str = Field(description="the model file that runs (the fallback's when it serves), on this node")
    model_version: ModelVersion
    precision: Literal["fp32", "fp16", "int8"] = Field(description="what runs (the fallback's when it serves)")
    requested_precision: Literal["fp32", "fp16", "int8"] = Field(description="the variant's own build")
    fallback: FallbackInfo | None = Field(description="present while the declared fallback serves instead")
    engine: str = Field(description="the engine serving: cpu, cuda, tensorrt or openvino")
    execution_provider: str = Field(description="the provider really active")
    providers: list[str]
    requested_providers: list[str]
    nodes_per_provider: dict[str, int] | None = Field(None, description="ONNX Runtime only")
    cuda_graphs: CudaGraphs | None = Field(None, description="ONNX Runtime on a GPU only")
    openvino: OpenVinoInfo | None = Field(None, description="OpenVINO only")
    on_gpu: bool
    gpu_granted: bool
    fell_back_to_cpu: bool
    plan_note: str
    measured: dict[str, Throughput] = Field(description="throughput at start: batch_1 and batch_<max>")
    engine_candidates: dict[str, Throughput] | None = Field(None, description="engine auto: each engine measured")
    speed_gate: SpeedGateVerdict | None = Field(None, description="present when a speed gate applies")
    intra_op_threads: int
    num_cpus: float
    batching: Batching
    warmed_up_to: int
    gpu_decode: GpuDecodeInfo | None = Field(None, description="decode_in: gpu only: where this replica decoded")
    profiling: Profiling | None
    input: InputSpec
    replica_id: str
    node_id: str


class VariantUnreachable(_VariantBase):
    """A variant whose replica did not answer within 5 s."""

    error: str


class RoutingInfo(_Body):
    sticky_header: str
    override_header: str
    allow_override: bool
    failover: bool
    inference_timeout_s: float
    shadow_fraction: float


class AdmissionInfo(_Body):
    in_flight: int
    waiting: int
    refused: int
    refusals_pacing: int
    finishing_per_s: float | None


class DecodeInfo(_Body):
    """Where images are decoded (AppArgs.decode_in); when in this Router, its decoder's state. gpu: each
    variant's `gpu_decode` says where its images were decoded."""

    where: Literal["preprocessor", "router", "gpu"]
    decode_slots: int | None = None
    decode_memory_bytes: int | None = None
    decode_bytes_in_flight: int | None = None
    decodes_waiting: int | None = None


class BodiesInfo(_Body):
    slow_now: int
    timed_out: int
    refused_slow: int


class ParsersInfo(_Body):
    started: int
    parsed: int


class FrontSeen(_Body):
    active: bool = Field(description="seen within the last minute")
    last_seen_s_ago: float
    limits: dict[str, str] = Field(description="as its X-App-Front header said")
    differs_from_config: list[str] = Field(description="the limits that are not this app's args.front")


class ServeEnvState(_Body):
    """configs/serve.env against the Router's environment (its node's: Ray copies no variable between nodes)."""

    file: str
    read: bool = Field(description="false: the file is not beside this install (its error says why)")
    error: str | None = None
    in_force: list[str] = Field(description="its settings set to its value")
    missing: list[str] = Field(description="its settings not set at all: Serve's defaults run instead")
    differs: dict[str, dict[str, str]] = Field(description="its settings set otherwise: {serve_env, set}")


class Ingress(_Body):
    """Which ingress Serve runs before this Router, as its environment says."""

    runs: Literal["haproxy+admission-front", "haproxy", "serve-python-proxy"] = Field(
        description="HAProxy with the admission front (app-haproxy), plain HAProxy, or Serve's Python proxy "
        "(RAY_SERVE_ENABLE_HA_PROXY unset: a cluster started without configs/serve.env)"
    )
    serve_env: ServeEnvState


class AdmissionFront(_Body):
    """The admission front as this Router's requests showed it: per HAProxy host."""

    in_place: bool = Field(description="some HAProxy's front was seen within the last minute")
    configured: dict[str, str] = Field(description="args.front, as the config says")
    haproxies: dict[str, FrontSeen]
    requests_without_front: int = Field(description="HTTP requests that came without it (direct, or it failed open)")


class ModelsResponse(_Body):
    """GET /v1/models: the variants, the A/B policy, the limits and this Router replica's counters."""

    model: str
    declaration: ModelDeclaration = Field(description="args.model as deployed")
    variants: dict[str, VariantInfo | VariantUnreachable]
    routing: RoutingInfo
    limits: Limits
    ingress: Ingress
    admission_front: AdmissionFront
    router_replica_id: str
    cancelled_requests: int
    admission: AdmissionInfo
    decode: DecodeInfo
    cascades: dict[str, CascadeInfo]
    bodies: BodiesInfo
    json_parsers: ParsersInfo


# -- /v1/rollout -----------------------------------------------------------------------------


class RolloutStep(_Body):
    """One step's record: its evidence and what was decided (the latest tick's, while the step runs)."""

    weight: float = Field(description="the candidate's weight at this step, percent")
    samples: int = Field(description="shadow comparisons in the step")
    agreement: float | None
    ci: list[float] = Field(min_length=2, max_length=2, description="anytime-valid 95% bounds of the agreement")
    p99_ratio: float | None = Field(description="candidate p99 / baseline p99")
    error_rate_delta: float | None = Field(description="candidate error rate - baseline's")
    decision: Literal["advance", "hold", "rollback"]
    at: str = Field(description="UTC, ISO 8601")
    reason: str = Field(description="which gate decided, or what the step waits for")


class RolloutState(_Body):
    """GET /v1/rollout (and the answer to starting or aborting one)."""

    model: str = Field(description="the declared model's name")
    state: Literal["idle", "running", "promoted", "rolled_back", "aborted"]
    step: int | None = Field(description="index into spec.steps")
    weights: dict[str, float] | None = Field(description="the weights the Routers route by now")
    reason: str
    steps: list[RolloutStep]
    spec: RolloutSpec | None = None
    rollout: int | None = Field(None, description="the rollout's number since the controller started")
    user_config: dict[str, dict[str, float]] | None = Field(
        None, description="once promoted or rolled back: the Router user_config block that keeps the final weights"
    )
