"""Span processors from the standard OTEL_* variables: OTEL_TRACES_EXPORTER (`otlp`, the default; `console`; `none`:
spans made and sampled, trace ids in replies and log lines, nothing sent), OTLP over HTTP (`http/protobuf`, the
default) or gRPC (OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL), each behind a bounded queue. The exporters read their own
endpoint, headers, timeout and certificate variables; the resource reads OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES.

The queue: OpenTelemetry's BatchSpanProcessor exports on a thread of its own; `BoundedSpanProcessor` in front of it
counts the spans it holds, and at OTEL_BSP_MAX_QUEUE_SIZE (2048) a span that ends is dropped and counted, never waited
for: a slow or absent collector costs spans, not requests. A failed export counts its spans too.

The sampler: Serve builds each process's TracerProvider with `ParentBasedTraceIdRatio` at its own ratio. Where
OTEL_TRACES_SAMPLER is set, `provider_from_env` sets the provider first, from the OTEL_* variables; OpenTelemetry keeps
a process's first provider, so Serve's spans and the app's use that sampler. A caller's decision stands under either.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter, SpanExportResult

PROTOCOLS = ("http/protobuf", "grpc")
EXPORTERS = ("otlp", "console", "none")
DEFAULT_MAX_QUEUE = 2048  # OpenTelemetry's default for OTEL_BSP_MAX_QUEUE_SIZE
OnDrop = Callable[[int, str], None]  # (spans, reason: queue_full | export_failed)
OnExport = Callable[[int], None]  # spans the exporter accepted
_OVERRIDE_WARNING = "Overriding of current TracerProvider is not allowed"


def protocol(env: Mapping[str, str]) -> str:
    """The OTLP protocol the variables ask for; an unknown one is an error naming the variable."""
    name = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
    if not env.get(name):
        name = "OTEL_EXPORTER_OTLP_PROTOCOL"
    value = (env.get(name) or "http/protobuf").strip().lower()
    if value not in PROTOCOLS:
        raise ValueError(f"{name}={value!r}: this service exports traces over {' or '.join(PROTOCOLS)}")
    return value


def exporters(env: Mapping[str, str]) -> list[str]:
    """The exporters OTEL_TRACES_EXPORTER names (comma-separated; `otlp` when unset); `none` is none of them. An
    unknown name is an error naming the variable (a misspelt exporter must not mean spans silently sent nowhere)."""
    raw = env.get("OTEL_TRACES_EXPORTER") or "otlp"
    names = list(dict.fromkeys(n.strip().lower() for n in raw.split(",") if n.strip()))
    unknown = [n for n in names if n not in EXPORTERS]
    if unknown or not names or ("none" in names and len(names) > 1):
        raise ValueError(f"OTEL_TRACES_EXPORTER={raw!r}: one or more of otlp, console; or none alone")
    return [] if names == ["none"] else names


def exporter(env: Mapping[str, str]) -> SpanExporter:
    """The OTLP span exporter for `protocol(env)` (`app.tracing.otlp`'s: the SDK's, encoding faster); it reads its
    endpoint, headers and timeout itself."""
    from app.tracing import otlp

    return otlp.GrpcExporter() if protocol(env) == "grpc" else otlp.HttpExporter()


def _int_env(name: str, default: int, env: Mapping[str, str] | None = None) -> int:
    raw = (os.environ if env is None else env).get(name, "")
    try:
        value = int(raw) if raw else default
    except ValueError:
        raise ValueError(f"{name}={raw!r}: not an integer") from None
    if value < 1:
        raise ValueError(f"{name}={value}: must be at least 1")
    return value


def max_queue(env: Mapping[str, str]) -> int:
    """The spans a process holds for export at most (OTEL_BSP_MAX_QUEUE_SIZE, 2048)."""
    return _int_env("OTEL_BSP_MAX_QUEUE_SIZE", DEFAULT_MAX_QUEUE, env)


class _Released(SpanExporter):
    """The exporter, telling the gate how many spans left the queue (and how many an export failed)."""

    def __init__(self, inner: SpanExporter, gate: BoundedSpanProcessor) -> None:
        self.inner, self.gate = inner, gate

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.gate.release(len(spans))
        try:
            result = self.inner.export(spans)
        except Exception:
            result = SpanExportResult.FAILURE
        if result is not SpanExportResult.SUCCESS:
            self.gate.dropped(len(spans), "export_failed")
        else:
            self.gate.accepted(len(spans))
        return result

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)


class BoundedSpanProcessor(SpanProcessor):
    """A BatchSpanProcessor that never holds more than `limit` spans: the one that would exceed it is dropped and
    counted (`on_drop`), so the processor neither blocks a request nor grows without bound."""

    def __init__(
        self, inner: SpanExporter, limit: int, on_drop: OnDrop, on_export: OnExport | None = None, **batch: Any
    ) -> None:
        self.limit, self.exporter = limit, inner
        self.on_drop, self.on_export = on_drop, on_export
        self.held = 0
        self.exported = 0
        self.drops: dict[str, int] = {}
        self._lock = threading.Lock()
        # The export batch fits the queue (OpenTelemetry refuses a larger one): OTEL_BSP_MAX_EXPORT_BATCH_SIZE, 512.
        batch.setdefault("max_export_batch_size", min(_int_env("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 512), limit))
        self._batch = BatchSpanProcessor(_Released(inner, self), max_queue_size=limit, **batch)

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        pass

    def on_end(self, span: ReadableSpan) -> None:
        if span.context is None or not span.context.trace_flags.sampled:
            return
        with self._lock:
            full = self.held >= self.limit
            if not full:
                self.held += 1
        if full:
            self.dropped(1, "queue_full")
            return
        self._batch.on_end(span)

    def release(self, n: int) -> None:
        with self._lock:
            self.held = max(0, self.held - n)

    def dropped(self, n: int, reason: str) -> None:
        with self._lock:
            self.drops[reason] = self.drops.get(reason, 0) + n
        _count(self.on_drop, n, reason)

    def accepted(self, n: int) -> None:
        with self._lock:
            self.exported += n
        if self.on_export is not None:
            _count(self.on_export, n)

    def shutdown(self) -> None:
        self._batch.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self._batch.force_flush(timeout_millis)


def _count(metric: Callable[..., None], *args: Any) -> None:
    try:
        metric(*args)
    except Exception:  # a metric that cannot be recorded must not fail a span's end or an export
        logging.getLogger(__name__).debug("span count not recorded", exc_info=True)


def processors(
    on_drop: OnDrop, on_export: OnExport | None = None, env: Mapping[str, str] | None = None
) -> list[BoundedSpanProcessor]:
    """Each exporter the variables name, behind a bounded queue of its own (OTEL_BSP_SCHEDULE_DELAY and
    OTEL_BSP_MAX_EXPORT_BATCH_SIZE are read by the BatchSpanProcessor itself); none for `none`."""
    env = os.environ if env is None else env
    made: dict[str, Callable[[], SpanExporter]] = {"otlp": lambda: exporter(env), "console": ConsoleSpanExporter}
    return [BoundedSpanProcessor(made[name](), max_queue(env), on_drop, on_export) for name in exporters(env)]


class _DropOverrideWarning(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return _OVERRIDE_WARNING not in record.getMessage()


def provider_from_env(env: Mapping[str, str] | None = None) -> bool:
    """Where OTEL_TRACES_SAMPLER is set, this process's TracerProvider from the OTEL_* variables (sampler, resource),
    set before Serve sets its own (which OpenTelemetry then ignores, with a warning this filters out). True if set."""
    env = os.environ if env is None else env
    if not env.get("OTEL_TRACES_SAMPLER"):
        return False
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider

    trace.set_tracer_provider(TracerProvider())  # sampler: OTEL_TRACES_SAMPLER(_ARG); resource: OTEL_SERVICE_NAME...
    logging.getLogger("opentelemetry.trace").addFilter(_DropOverrideWarning())
    return True
