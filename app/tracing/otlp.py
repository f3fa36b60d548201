"""OpenTelemetry's OTLP span exporters (HTTP and gRPC, the SDK's own: endpoint, headers, TLS, compression, retries and
timeouts as their OTEL_* variables say), with the span encoding done here: the same ExportTraceServiceRequest, field
for field, as the SDK's `encode_spans` (a unit test holds the two equal), built about three times faster.

The SDK's encoder makes each attribute's KeyValue and AnyValue as separate messages and copies them into their parent;
this one fills the request's fields in place, and hashes a resource (the SDK serialises its attributes to JSON for
that) once per resource in a batch instead of once per span. Exporting spans, not making them, was most of what
tracing every request cost (docs/performance.md "Tracing").
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry.exporter.otlp.proto.common._internal import _encode_value
from opentelemetry.exporter.otlp.proto.common._internal.trace_encoder import _SPAN_KIND_MAP
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as SdkGrpcExporter
from opentelemetry.exporter.otlp.proto.http._common import RequestPayloadTooLargeError, _is_request_too_large
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as SdkHttpExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import SpanFlags
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.semconv.attributes.http_attributes import HTTP_RESPONSE_STATUS_CODE

logger = logging.getLogger(__name__)

_HAS_IS_REMOTE = SpanFlags.SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK
_IS_REMOTE = SpanFlags.SPAN_FLAGS_CONTEXT_IS_REMOTE_MASK


def _value(out: Any, value: Any) -> None:
    """`value` into an AnyValue message, as the SDK's `_encode_value` encodes it (its own code for the rare kinds)."""
    if isinstance(value, bool):  # before int: a bool is an int
        out.bool_value = value
    elif isinstance(value, str):
        out.string_value = value
    elif isinstance(value, int):
        out.int_value = value
    elif isinstance(value, float):
        out.double_value = value
    elif isinstance(value, (list, tuple)):
        values = out.array_value.values
        for v in value:
            _value(values.add(), v)
        if not value:
            out.array_value.SetInParent()
    elif value is None:
        out.SetInParent()  # an empty AnyValue, as the SDK's
    else:  # bytes, a mapping, another sequence; an unknown type raises, as the SDK's does
        out.CopyFrom(_encode_value(value))


def _attributes(out: Any, attributes: Mapping[str, Any] | None) -> None:
    """Each attribute as a KeyValue appended to `out`; one that cannot be encoded is left out and logged."""
    for key, value in (attributes or {}).items():
        kv = out.add(key=key)
        try:
            _value(kv.value, value)
        except Exception as e:
            del out[-1]
            logger.exception("Failed to encode key %s: %s", key, e)


def _flags(parent: Any) -> int:
    return _HAS_IS_REMOTE | _IS_REMOTE if parent is not None and parent.is_remote else _HAS_IS_REMOTE


def _span(out: Any, span: ReadableSpan) -> None:
    ctx = span.get_span_context()
    assert ctx is not None, "an ended span has its context"
    out.trace_id = ctx.trace_id.to_bytes(16, "big")
    out.span_id = ctx.span_id.to_bytes(8, "big")
    if ctx.trace_state:
        out.trace_state = ",".join(f"{k}={v}" for k, v in ctx.trace_state.items())
    parent = span.parent
    if parent is not None:
        out.parent_span_id = parent.span_id.to_bytes(8, "big")
    out.name = span.name
    out.kind = _SPAN_KIND_MAP[span.kind]
    out.start_time_unix_nano = span.start_time or 0
    out.end_time_unix_nano = span.end_time or 0
    _attributes(out.attributes, span.attributes)
    for event in span.events:
        e = out.events.add(name=event.name, time_unix_nano=event.timestamp)
        _attributes(e.attributes, event.attributes)
        e.dropped_attributes_count = event.dropped_attributes
    for link in span.links:
        lc = link.context
        pl = out.links.add(trace_id=lc.trace_id.to_bytes(16, "big"), span_id=lc.span_id.to_bytes(8, "big"))
        _attributes(pl.attributes, link.attributes)
        pl.dropped_attributes_count = link.dropped_attributes
        pl.flags = _flags(lc)
    status = span.status
    if status is not None:
        out.status.code = status.status_code.value
        if status.description:
            out.status.message = status.description
        out.status.SetInParent()
    out.dropped_attributes_count = span.dropped_attributes
    out.dropped_events_count = span.dropped_events
    out.dropped_links_count = span.dropped_links
    out.flags = _flags(parent)


class _Groups:
    """Spans grouped as OTLP nests them (resource, then instrumentation scope) in order of first appearance; an object
    seen before is found by identity, so a resource is hashed (JSON, in the SDK) once per batch, not per span."""

    def __init__(self, request: ExportTraceServiceRequest) -> None:
        self.request = request
        self.resources: dict[Any, tuple[Any, dict[Any, Any]]] = {}  # resource -> (ResourceSpans, scope -> spans)
        self.by_id: dict[tuple[int, int], Any] = {}  # (id(resource), id(scope)) -> the spans field

    def spans_of(self, span: ReadableSpan) -> Any:
        resource, scope = span.resource, span.instrumentation_scope or None
        key = (id(resource), id(scope))
        found = self.by_id.get(key)
        if found is None:
            found = self.by_id[key] = self._spans(resource, scope)
        return found

    def _spans(self, resource: Any, scope: Any) -> Any:
        entry = self.resources.get(resource)
        if entry is None:
            rs = self.request.resource_spans.add()
            _attributes(rs.resource.attributes, resource.attributes)
            rs.resource.SetInParent()
            if resource.schema_url:
                rs.schema_url = resource.schema_url
            entry = self.resources[resource] = (rs, {})
        rs, scopes = entry
        spans = scopes.get(scope)
        if spans is None:
            ss = rs.scope_spans.add()
            ss.scope.SetInParent()
            if scope is not None:
                ss.scope.name = scope.name
                if scope.version:
                    ss.scope.version = scope.version
                _attributes(ss.scope.attributes, scope.attributes)
                if scope.schema_url:
                    ss.schema_url = scope.schema_url
            spans = scopes[scope] = ss.spans
        return spans


def encode(spans: Sequence[ReadableSpan]) -> ExportTraceServiceRequest:
    """The OTLP export request for these spans: equal to the SDK's `encode_spans(spans)`."""
    request = ExportTraceServiceRequest()
    groups = _Groups(request)
    for span in spans:
        _span(groups.spans_of(span).add(), span)
    return request


class HttpExporter(SdkHttpExporter):
    """The SDK's OTLP/HTTP (protobuf) span exporter with `encode`; its `export` otherwise step for step (metrics, the
    request size limit, the result)."""

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if self._shutdown:
            logger.warning("Exporter already shutdown, ignoring batch")
            return SpanExportResult.FAILURE
        with self._metrics.export_operation(len(spans)) as result:
            try:
                data = encode(spans).SerializePartialToString()
            except Exception as error:
                logger.error("Failed to encode span batch: %s", error)
                result.error = error
                return SpanExportResult.FAILURE
            if _is_request_too_large(data, self._max_request_size):
                size, limit = len(data), self._max_request_size
                logger.warning("Dropping span batch: %d bytes exceed max_request_size %d bytes", size, limit)
                result.error = RequestPayloadTooLargeError(f"span request of {size} bytes exceeds {limit}")
                return SpanExportResult.FAILURE
            sent = self._client.export(data)
            if not sent.success:
                result.error = sent.error
                code = sent.status_code
                result.error_attrs = {HTTP_RESPONSE_STATUS_CODE: code} if code is not None else None
                return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS


class GrpcExporter(SdkGrpcExporter):
    """The SDK's OTLP/gRPC span exporter with `encode` (its hook for the request message)."""

    def _translate_data(self, data: Sequence[ReadableSpan]) -> ExportTraceServiceRequest:
        return encode(data)
