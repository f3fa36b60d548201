# Ray annotates tag_keys as Tuple[str] (exactly one element); any length works at run time.
# mypy: disable-error-code="arg-type"
"""The service's Prometheus metrics, through ray.serve.metrics (exported on Ray's metrics port).

Serve adds `deployment`, `replica` and `application` tags to each, and each carries `model`, the declared
model's name (`args.model.name`). Bucket
boundaries are chosen for this workload and written down here:

- latency (ms): 1 .. 10,000 in roughly 2x steps, denser between 5 and 200 ms where a
  CPU request (5-60 ms) and a GPU batch (2-30 ms) live; 10 s is the default deadline.
- batch size: powers of two up to 256, the largest max_batch_size the config allows.
- input bytes: 1 kB .. 10 MiB (the default body limit); a phone JPEG is 1-5 MB.
- input pixels: 10 k .. 40 M (the default pixel limit); 224x224 = 50 k, 1080p = 2 M, 12 MP photos.
- |delta p| of the top-1 probability between variants: 0.001 .. 0.5; INT8 usually stays under 0.05.
"""

from __future__ import annotations

import os
import threading
import time
from typing import TYPE_CHECKING, Any

from ray.serve.metrics import Counter, Gauge, Histogram

if TYPE_CHECKING:
    from app.runtime.startup import StartupReport

LATENCY_MS = [1.0, 2, 3, 5, 7.5, 10, 15, 20, 30, 50, 75, 100, 150, 200, 300, 500, 1000, 2000, 5000, 10000]
BATCH_SIZES = [1.0, 2, 4, 8, 16, 32, 64, 128, 256]
INPUT_BYTES = [1e3, 1e4, 3e4, 1e5, 3e5, 1e6, 3e6, 1e7]
INPUT_PIXELS = [1e4, 5e4, 1e5, 3e5, 1e6, 2e6, 5e6, 1.2e7, 4e7]
ABS_DP = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5]


def name_model(holder: object, model: str) -> None:
    """Every metric of `holder` carries `model` (the declared model's name) as its `model` tag."""
    for metric in vars(holder).values():
        if isinstance(metric, Counter | Gauge | Histogram):
            metric.set_default_tags({"model": model})


STAGES = ("receive", "preprocess", "queue", "inference", "escalation", "total")  # escalation: a cascade's 2nd


class RouterMetrics:
    def __init__(self, model: str) -> None:
        self.requests = Counter(
            "app_requests_total",
            "HTTP requests by endpoint, variant and status code",
            tag_keys=("endpoint", "variant", "status", "model"),
        )
        self.errors = Counter(
            "app_errors_total", "Error responses by error code", tag_keys=("endpoint", "code", "model")
        )
        self.cancelled = Counter(
            "app_cancelled_total", "Requests whose client went away before the answer", tag_keys=("model",)
        )
        self.stage_ms = Histogram(
            "app_stage_latency_ms",
            "Per-stage latency of successful requests (ms)",
            boundaries=LATENCY_MS,
            tag_keys=("stage", "variant", "model"),
        )
        self.input_bytes = Histogram(
            "app_input_bytes", "Size of each image received", boundaries=INPUT_BYTES, tag_keys=("model",)
        )
        self.input_pixels = Histogram(
            "app_input_pixels",
            "Width x height of each image (from its header)",
            boundaries=INPUT_PIXELS,
            tag_keys=("model",),
        )
        self.shadow = Counter(
            "app_shadow_total",
            "Shadow comparisons by outcome (agree, disagree, dropped, failed)",
            tag_keys=("pair", "outcome", "model"),
        )
        self.shadow_abs_dp = Histogram(
            "app_shadow_abs_top1_prob_delta",
            "|delta top-1 probability| between the two variants",
            boundaries=ABS_DP,
            tag_keys=("pair", "model"),
        )

        self.cascade = Counter(
            "app_cascade_images_total",
            "Images answered by a cascade, by outcome: kept (first's answer), escalated (then's), escalation_failed",
            tag_keys=("cascade", "outcome", "model"),
        )
        self.cascade_threshold = Gauge(
            "app_cascade_threshold",
            "A cascade's margin threshold in force (auto: as fitted)",
            tag_keys=("cascade", "model"),
        )
        self.front_active = Gauge(
            "app_admission_front_active",
            "1 for each HAProxy whose requests carried the admission front within the last minute, 0 once it stops",
            tag_keys=("haproxy", "model"),
        )
        self.without_front = Counter(
            "app_requests_without_front_total",
            "HTTP requests that reached this Router without passing the admission front (direct, or it failed open)",
            tag_keys=("model",),
        )
        self.held = HeldGauges()
        name_model(self, model)

    # The HTTP layer's Metrics port, with the pipeline's below.
    def entry_error(self, endpoint: str, code: str) -> None:
        self.errors.inc(tags={"endpoint": endpoint, "code": code})

    def request_cancelled(self) -> None:
        self.cancelled.inc()

    def body_received(self, size: int) -> None:
        self.input_bytes.observe(size)

    def observe_pixels(self, pixels: list[int]) -> None:
        """Each image's width x height, from its header (before any decode)."""
        for n in pixels:
            self.input_pixels.observe(n)

    def admission_front(self, active: dict[str, bool], without: int) -> None:
        """Once a second: each HAProxy's front, and the requests since the last call that came without one."""
        self.held.replace(self.front_active, [({"haproxy": host}, 1 if on else 0) for host, on in active.items()])
        if without:
            self.without_front.inc(without)

    # The pipeline's PipelineMetrics port.
    def cascade_images(self, cascade: str, outcome: str, n: int) -> None:
        self.cascade.inc(n, tags={"cascade": cascade, "outcome": outcome})

    def cascade_thresholds(self, thresholds: dict[str, float]) -> None:
        if thresholds:
            self.held.replace(self.cascade_threshold, [({"cascade": c}, t) for c, t in thresholds.items()])

    def shadow_outcome(self, pair: str, outcome: str, n: int = 1) -> None:
        self.shadow.inc(n, tags={"pair": pair, "outcome": outcome})

    def shadow_delta(self, pair: str, abs_dp: float) -> None:
        self.shadow_abs_dp.observe(abs_dp, tags={"pair": pair})

    def error(self, endpoint: str, code: str, status: int, variant: str = "none") -> None:
        self.requests.inc(tags={"endpoint": endpoint, "variant": variant, "status": str(status)})
        self.errors.inc(tags={"endpoint": endpoint, "code": code})

    def success(self, endpoint: str, variant: str, timings: dict[str, float]) -> None:
        self.requests.inc(tags={"endpoint": endpoint, "variant": variant, "status": "200"})
        for stage in STAGES:
            if stage in timings:
                self.stage_ms.observe(timings[stage], tags={"stage": stage, "variant": variant})


class HeldGauges:
    """Gauges that state a fact (the engine, its measured speed), re-set on a timer so the series never lapses.

    Ray exports a user gauge only in the report interval after it was set, and its agent drops a gauge
    series not refreshed within two report intervals (ray/_private/telemetry/open_telemetry_metric_recorder.py,
    `_resolve_gauge_ttl_seconds`): a value set once at start-up, or every 10 s by the health check against a
    10 s report interval, disappears from some scrapes. Re-setting every third of an interval keeps it in all.
    """

    def __init__(self, period_s: float | None = None) -> None:
        raw_ms = os.environ.get("RAY_metrics_report_interval_ms", "10000")  # noqa: SIM112 (Ray spells it so)
        interval_s = max(1.0, float(raw_ms) / 1000)
        self.period_s = period_s if period_s is not None else interval_s / 3
        self._values: dict[tuple[int, tuple[tuple[str, str], ...]], tuple[Gauge, float]] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def replace(self, gauge: Gauge, series: list[tuple[dict[str, str], float]]) -> None:
        """`gauge`'s series are now these (any other it held lapses within two report intervals)."""
        with self._lock:
            self._values = {k: v for k, v in self._values.items() if k[0] != id(gauge)}
            for tags, value in series:
                self._values[(id(gauge), tuple(sorted(tags.items())))] = (gauge, value)
            if self._thread is None:
                self._thread = threading.Thread(target=self._refresh_forever, name="held-gauges", daemon=True)
                self._thread.start()
        for tags, value in series:
            gauge.set(value, tags=tags)

    def refresh(self) -> None:
        with self._lock:
            held = list(self._values.items())
        for (_, tags), (gauge, value) in held:
            gauge.set(value, tags=dict(tags))

    def _refresh_forever(self) -> None:
        while True:  # the thread lives as long as the replica process
            time.sleep(self.period_s)  # a period, not a wait for anything
            self.refresh()


class ClassifierMetrics:
    def __init__(self, model: str) -> None:
        self.held = HeldGauges()
        self.batch_size = Histogram(
            "app_batch_size", "Images per ONNX Runtime call", boundaries=BATCH_SIZES, tag_keys=("variant", "model")
        )
        # The mean batch size from exact counts: Ray exports a histogram's _sum estimated from its buckets.
        self.batch_images = Counter(
            "app_batch_images_total", "Images sent to the engine", tag_keys=("variant", "model")
        )
        self.batches = Counter("app_batches_total", "Engine calls (batches)", tag_keys=("variant", "model"))
        self.batch_ms = Histogram(
            "app_batch_inference_ms",
            "ONNX Runtime time per batch (ms)",
            boundaries=LATENCY_MS,
            tag_keys=("variant", "model"),
        )
        self.provider = Gauge(
            "app_execution_provider",
            "1 for the execution provider really active in this replica, with the precision it really runs",
            tag_keys=("variant", "provider", "requested", "precision", "model"),
        )
        self.fallback = Gauge(
            "app_variant_fallback",
            "1 while this replica serves its variant's declared fallback, not the build it requested (why: reason)",
            tag_keys=("variant", "requested_precision", "precision", "reason", "model"),
        )
        self.measured = Gauge(
            "app_engine_images_per_second",
            "Throughput this replica measured on its own engine at warm-up",
            tag_keys=("variant", "engine", "batch", "model"),
        )
        self.speed_gate = Gauge(
            "app_speed_gate_passed",
            "1 if this variant met speed_gate.min_speedup against its baseline on this node, else 0",
            tag_keys=("variant", "baseline", "model"),
        )
        self.speedup = Gauge(
            "app_speed_gate_speedup",
            "This variant's img/s divided by the baseline's, measured on this node at warm-up",
            tag_keys=("variant", "baseline", "model"),
        )
        self.decoded = Counter(
            "app_decoded_images_total",
            "decode_in: gpu: images of this Classifier's batches by where they were decoded (hardware, hybrid: the "
            "GPU's decoders; cpu: the CPU path; failed: refused or undecodable; fallback, transform_fallback: meant "
            "for the GPU, decoded by the CPU path; device_errors: whole GPU decode calls that failed)",
            tag_keys=("variant", "where", "model"),
        )
        self.version = Gauge(
            "app_model_version",
            "1 for the model version this replica serves (sha256: its file's digest, uri: where it came from)",
            tag_keys=("variant", "sha256", "uri", "model"),
        )
        self.releases = Counter(
            "app_model_releases_total",
            "Releases in place by outcome: switched (the new version serves), failed (the old one still serves)",
            tag_keys=("variant", "outcome", "model"),
        )
        self.cache_bytes = Gauge("app_model_cache_bytes", "Bytes in the node's model cache", tag_keys=("model",))
        self.cache_entry = Gauge(
            "app_model_cache_entry_bytes",
            "Each file in the node's model cache: its size (sha256, uri; in_use: a replica holds it)",
            tag_keys=("sha256", "uri", "in_use", "model"),
        )
        self.cache_last_used = Gauge(
            "app_model_cache_entry_last_used_seconds",
            "Each file in the node's model cache: when a replica last fetched it (Unix time)",
            tag_keys=("sha256", "uri", "model"),
        )
        name_model(self, model)

    def record_version(self, variant: str, sha256: str, uri: str) -> None:
        self.held.replace(self.version, [({"variant": variant, "sha256": sha256, "uri": uri[:200]}, 1)])

    def record_release(self, variant: str, outcome: str) -> None:
        self.releases.inc(tags={"variant": variant, "outcome": outcome})

    def record_cache(self, cache: dict[str, Any]) -> None:
        """The node's cache as `ModelFiles.describe` says it: what it holds, as of this replica's last look."""
        self.held.replace(self.cache_bytes, [({}, cache["bytes"])])
        entries = cache["entries"]
        self.held.replace(
            self.cache_entry,
            [
                ({"sha256": e["sha256"], "uri": e["uri"][:200], "in_use": str(e["in_use"]).lower()}, e["size"])
                for e in entries
            ],
        )
        self.held.replace(
            self.cache_last_used, [({"sha256": e["sha256"], "uri": e["uri"][:200]}, e["last_used"]) for e in entries]
        )

    def record_decode(self, variant: str, counts: dict[str, int]) -> None:
        for where, n in counts.items():
            if n > 0:
                self.decoded.inc(n, tags={"variant": variant, "where": where})

    def record_start(self, variant: str, report: StartupReport) -> None:
        """The replica's start-up measurement and, if gated, the speed gate's verdict."""
        self.held.replace(
            self.measured,
            [
                ({"variant": variant, "engine": report.engine, "batch": batch.removeprefix("batch_")}, t.img_per_s)
                for batch, t in report.measured.items()
            ],
        )
        if report.gate is not None:
            tags = {"variant": variant, "baseline": report.gate.baseline}
            self.held.replace(self.speed_gate, [(tags, 1 if report.gate.passed else 0)])
            self.held.replace(self.speedup, [(tags, report.gate.speedup)])

    def record_batch(self, variant: str, images: int, inference_ms: float) -> None:
        tags = {"variant": variant}
        self.batch_size.observe(images, tags=tags)
        self.batch_images.inc(images, tags=tags)
        self.batches.inc(tags=tags)
        self.batch_ms.observe(inference_ms, tags=tags)

    def record_provider(self, variant: str, provider: str, requested: list[str], precision: str) -> None:
        tags = {"variant": variant, "provider": provider, "requested": ",".join(requested), "precision": precision}
        self.held.replace(self.provider, [(tags, 1)])

    def record_fallback(self, variant: str, serving: dict[str, str] | None) -> None:
        """The fallback in force (`Serving.describe()`), or none: its series lapses (HeldGauges.replace)."""
        if serving is None:
            self.held.replace(self.fallback, [])
            return
        tags = {"variant": variant, "reason": serving["reason"][:200]}
        tags |= {"requested_precision": serving["requested_precision"], "precision": serving["precision"]}
        self.held.replace(self.fallback, [(tags, 1)])


ROLLOUT_STATES = ("idle", "running", "promoted", "rolled_back", "aborted")


class RolloutMetrics:
    """The rollout controller's gauges: state (its index in ROLLOUT_STATES), step, the candidate's weight, and the
    agreement bounds of the latest tick."""

    def __init__(self) -> None:
        self.state = Gauge("app_rollout_state", description="0 idle, 1 running, 2 promoted, 3 rolled_back, 4 aborted")
        self.step = Gauge("app_rollout_step", description="index of the rollout's current step")
        self.weight = Gauge("app_rollout_candidate_weight", description="the candidate's weight now, percent")
        self.bound = Gauge("app_rollout_agreement_bound", description="top-1 agreement bounds", tag_keys=("end",))

    def observe(self, described: dict[str, object]) -> None:
        state = str(described.get("state", "idle"))
        self.state.set(ROLLOUT_STATES.index(state) if state in ROLLOUT_STATES else 0)
        step = described.get("step")
        self.step.set(float(step) if isinstance(step, int) else 0.0)
        spec, weights = described.get("spec"), described.get("weights")
        if isinstance(spec, dict) and isinstance(weights, dict):
            self.weight.set(float(weights.get(spec["candidate"], 0.0)))
        steps = described.get("steps")
        if isinstance(steps, list) and steps:
            lo, hi = steps[-1]["ci"]
            self.bound.set(lo, tags={"end": "lower"})
            self.bound.set(hi, tags={"end": "upper"})
