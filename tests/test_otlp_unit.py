"""app.tracing.otlp without Ray: its encoding against the SDK's own `encode_spans` (equal messages, equal bytes) over
every kind of field a span can hold, and its HTTP and gRPC exporters sending to the OTLP receivers the Ray-tier tests
use (tests.otlp_receiver decodes the wire format with OpenTelemetry's own protos).
"""

from __future__ import annotations

import logging

import pytest
from opentelemetry.attributes import BoundedAttributes
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.sdk.trace.sampling import ALWAYS_ON
from opentelemetry.sdk.util import BoundedList
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags, TraceState

from app.tracing import otlp
from tests.otlp_receiver import Receivers, Span, poll_until

SAMPLED = TraceFlags(TraceFlags.SAMPLED)


def context(trace_id: int, span_id: int, remote: bool = False, state: TraceState | None = None) -> SpanContext:
    return SpanContext(trace_id, span_id, is_remote=remote, trace_flags=SAMPLED, trace_state=state)


def odd_spans() -> list[ReadableSpan]:
    """Spans with every field the encoders fill, and values of every kind: two resources (equal ones as distinct
    objects too), scopes with and without version, attributes and schema, none; interleaved, so grouping is tested."""
    res_a = Resource({"service.name": "router", "process.pid": 7})
    res_a_again = Resource({"service.name": "router", "process.pid": 7})  # equal, not the same object
    res_b = Resource({"service.name": "classifier", "list": ("a", "b")}, schema_url="https://opentelemetry.io/s/1")
    scope_1 = InstrumentationScope("app", "1.0", "https://opentelemetry.io/s/2", {"scope.attr": True})
    scope_2 = InstrumentationScope("ray.serve")
    values = {
        "str": "s",
        "empty": "",
        "bool": False,
        "int": -(2**62),
        "float": 0.25,
        "bytes": b"\x00\xff",
        "strs": ("a", "", "c"),
        "ints": (1, 2, 3),
        "floats": [0.5, 1.5],
        "bools": (True, False),
        "none_in": ("x", None),
        "no_items": (),
        "map": {"k": 1, "n": {"deep": "v"}},
        "none": None,
        "bad": object(),  # neither can encode it: both leave it out (and log)
    }
    bounded = BoundedAttributes(2, {"kept": 1, "also": "x", "over": 3})  # one dropped
    events = BoundedList(1)
    events.extend([Event("dropped", timestamp=5), Event("kept", BoundedAttributes(1, {"e": 1, "f": 2}))])  # oldest out
    links = [
        Link(context(9, 10, remote=True), {"l": "x"}),
        Link(context(11, 12)),
    ]
    state = TraceState([("vendor", "v1"), ("other", "x")])
    return [
        ReadableSpan(
            "server",
            context(1, 2, state=state),
            parent=context(1, 99, remote=True),
            resource=res_a,
            attributes=values,
            events=events,
            links=links,
            kind=SpanKind.SERVER,
            status=Status(StatusCode.ERROR, "HTTP 503"),
            start_time=1_000,
            end_time=2_000,
            instrumentation_scope=scope_1,
        ),
        ReadableSpan("batch", context(3, 4), resource=res_b, attributes=bounded, instrumentation_scope=scope_2),
        ReadableSpan("child", context(1, 5), parent=context(1, 2), resource=res_a, instrumentation_scope=scope_2),
        ReadableSpan("again", context(1, 6), resource=res_a_again, kind=SpanKind.CLIENT, instrumentation_scope=scope_1),
        ReadableSpan("no scope", context(7, 8), resource=res_b, status=Status(StatusCode.OK), start_time=3),
        ReadableSpan("producer", context(7, 13), resource=res_b, kind=SpanKind.PRODUCER, instrumentation_scope=scope_1),
    ]


def test_the_encoding_equals_the_sdks_for_every_kind_of_field_and_value(caplog: pytest.LogCaptureFixture) -> None:
    spans = odd_spans()
    with caplog.at_level(logging.ERROR):
        theirs = encode_spans(spans)
        ours = otlp.encode(spans)
    assert ours == theirs
    assert ours.SerializeToString(deterministic=True) == theirs.SerializeToString(deterministic=True)
    assert len(ours.resource_spans) == 2  # equal resources are one group, as in the SDK's
    keys = [kv.key for kv in ours.resource_spans[0].scope_spans[0].spans[0].attributes]
    assert "bad" not in keys and "none" in keys
    assert sum("Failed to encode key bad" in r.getMessage() for r in caplog.records) == 2  # once each


def test_the_encoding_equals_the_sdks_for_spans_a_tracer_made() -> None:
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    memory = InMemorySpanExporter()
    provider = TracerProvider(sampler=ALWAYS_ON, resource=Resource.create({"service.name": "t"}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("app")
    with tracer.start_as_current_span("POST /v1/classify", kind=SpanKind.SERVER) as server:
        server.set_attributes({"http.response.status_code": 200, "app.image.pixels": [1, 2]})
        with tracer.start_as_current_span("decode", links=[Link(server.get_span_context(), {"why": "x"})]) as d:
            d.add_event("refused", {"error.type": "too_large"})
            d.set_status(Status(StatusCode.ERROR, "too_large"))
    spans = memory.get_finished_spans()
    assert otlp.encode(spans) == encode_spans(spans)
    assert otlp.encode([]) == encode_spans([])
    provider.shutdown()


def test_the_http_and_grpc_exporters_deliver_what_the_receiver_decodes() -> None:
    spans = odd_spans()
    with Receivers() as receivers:
        http = otlp.HttpExporter(endpoint=f"{receivers.http_url}/v1/traces")
        grpc = otlp.GrpcExporter(endpoint=receivers.grpc_url, insecure=True)
        assert http.export(spans) is SpanExportResult.SUCCESS
        assert grpc.export(spans) is SpanExportResult.SUCCESS

        def both() -> list[Span] | None:
            got = receivers.sink.where(lambda s: True)
            return got if len(got) >= 2 * len(spans) else None

        got = poll_until(both, 30, "the spans of both exports")
        by = {(s.via, s.name): s for s in got}
        for via in ("http", "grpc"):
            server = by[(via, "server")]
            assert server.attributes["strs"] == ["a", "", "c"] and server.attributes["bytes"] == b"\x00\xff"
            assert server.status == 2 and server.links == [(f"{9:032x}", f"{10:016x}"), (f"{11:032x}", f"{12:016x}")]
            assert server.resource == {"service.name": "router", "process.pid": 7}
            assert by[(via, "batch")].resource["list"] == ["a", "b"]
        too_small = otlp.HttpExporter(endpoint=f"{receivers.http_url}/v1/traces", max_request_size=64)
        assert too_small.export(spans) is SpanExportResult.FAILURE  # refused before sending, as the SDK's
        http.shutdown()
        assert http.export(spans) is SpanExportResult.FAILURE
        grpc.shutdown()
        too_small.shutdown()
