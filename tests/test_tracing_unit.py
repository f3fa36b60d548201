"""The app's spans without Ray: OpenTelemetry's SDK with its in-memory exporter stands in for Serve's provider.

What is checked here is the span tree the app's code makes: tracing off builds nothing; the Router's parent (Serve's
span, or the caller's traceparent); a coalesced group's span under its first recorded request, linked to every
request's, with its downstream calls under it and each request's queue wait linked back; a Classifier batch's span
linked to every request's, each request's batch-queue span linked to it; the bounded export queue (drops counted,
never a blocked span end); the OTEL_* parsing; the Router's server span on a 5xx and a 4xx (its parts on fake handles);
a decode call's one span.
The served path across processes, and the OTLP wire formats, are tests/test_tracing.py's.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased
from opentelemetry.trace import StatusCode

from app.imaging.opencv import cv2
from app.pipeline.routing import Choice
from app.serve import batch_trace
from app.serve.batch_decoder import Item
from app.tracing import export, otlp, spans
from tests.test_pipeline_unit import FakeBackend, _perf_is_loop_time, pipeline, run, until
from tests.test_request_walk_unit import classify, router

CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"


@dataclass
class Traced:
    provider: TracerProvider
    exporter: InMemorySpanExporter

    def finished(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())

    def named(self, name: str) -> list[ReadableSpan]:
        return [s for s in self.finished() if s.name == name]


@pytest.fixture
def traced() -> Iterator[Traced]:
    provider = TracerProvider(sampler=ParentBased(ALWAYS_ON))  # Serve's ParentBasedTraceIdRatio at ratio 1
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    spans.enable(provider.get_tracer(spans.TRACER))
    try:
        yield Traced(provider, exporter)
    finally:
        spans.disable()


def request_span(t: Traced, name: str = "request") -> Any:
    """A request's span, current until the returned token is detached."""
    s = t.provider.get_tracer("test").start_span(name)
    return s, otel_context.attach(trace.set_span_in_context(s))


# --------------------------------------------------------------------------- off


def test_off_every_call_returns_at_once_and_builds_nothing() -> None:
    assert not spans.ENABLED
    assert spans.span("x", {"a": 1}) is spans.NULL and spans.use(None) is spans.NULL
    assert spans.current() is None and spans.start("x", None) is None
    assert spans.record("x", 0.0, 1.0) is None and spans.traceparent(None) is None and spans.trace_id() == ""
    spans.annotate({"a": 1})  # nothing to annotate: no error either
    spans.name_route("GET", "/x")


# --------------------------------------------------------------------------- the Router's parent


def test_the_callers_traceparent_is_the_parent_where_serve_has_no_span_in_its_trace(traced: Traced) -> None:
    header = f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"
    parent = spans.incoming(header, "vendor=1")
    span = spans.start("POST /v1/classify", parent, "SERVER")
    span.end()
    (done,) = traced.finished()
    assert f"{done.context.trace_id:032x}" == CALLER_TRACE and f"{done.parent.span_id:016x}" == CALLER_SPAN
    assert done.kind is trace.SpanKind.SERVER and done.parent.is_remote
    assert spans.traceparent(span) == f"00-{CALLER_TRACE}-{done.context.span_id:016x}-01"

    # Serve's span already continues the caller's trace: the Router's span is its child, not its sibling.
    serve_span = traced.provider.get_tracer("serve").start_span("replica_handle_request", context=parent)
    token = otel_context.attach(trace.set_span_in_context(serve_span))
    try:
        assert trace.get_current_span(spans.incoming(header)) is serve_span
        assert trace.get_current_span(spans.incoming(None)) is serve_span  # no header: Serve's
        assert trace.get_current_span(spans.incoming("00-zz-not-hex-01")) is serve_span  # malformed: ignored
    finally:
        otel_context.detach(token)


def test_an_unsampled_caller_gets_no_traceparent_back(traced: Traced) -> None:
    span = spans.start("GET /", spans.incoming(f"00-{CALLER_TRACE}-{CALLER_SPAN}-00"), "SERVER")
    assert not span.is_recording() and spans.traceparent(span) is None
    span.end()
    assert traced.finished() == []


def test_the_log_lines_trace_field_names_a_recorded_request(traced: Traced) -> None:
    from app.http.v1 import _trace_field

    assert _trace_field() == ""  # no current span
    s, token = request_span(traced)
    try:
        assert _trace_field() == f" trace_id={s.get_span_context().trace_id:032x}"
    finally:
        otel_context.detach(token)


# --------------------------------------------------------------------------- the coalesced group


class SeenBackend(FakeBackend):
    """The FakeBackend, noting the span current when each downstream call is made (what Serve's handle carries)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[Any] = []

    def preprocess(self, images: list[bytes], *rest: Any) -> Any:
        self.seen.append(trace.get_current_span())
        return super().preprocess(images, *rest)

    def classify(self, variant: str, *rest: Any) -> Any:
        self.seen.append(trace.get_current_span())
        return super().classify(variant, *rest)


def test_a_coalesced_group_is_one_span_under_its_first_request_linked_to_all_and_their_waits_link_back(
    traced: Traced,
) -> None:
    requests: list[Any] = []

    async def one(p: Any, image: bytes, name: str) -> Any:
        s, token = request_span(traced, name)
        requests.append(s)
        try:
            return await p.classify(Choice("fp32", "weighted"), [image], 5, asyncio.get_running_loop().time())
        finally:
            otel_context.detach(token)
            s.end()

    async def go() -> None:
        backend = SeenBackend()
        p = pipeline(backend, max_groups_in_flight=1, coalesce_max=16)
        backend.gates["fp32"] = asyncio.Event()
        first = asyncio.ensure_future(one(p, b"\x01", "a"))
        await until(lambda: len(backend.groups) == 1)
        later = [asyncio.ensure_future(one(p, bytes([i]), n)) for i, n in ((2, "b"), (3, "c"))]
        await until(lambda: p.coalescer.waiting(("fp32", False, False)) == 2)
        backend.gates["fp32"].set()
        await asyncio.gather(first, *later)
        (shared,) = traced.named("coalesced group")  # a's group of one is no span: its calls are a's children
        assert shared.attributes["app.group.requests"] == 2
        a, b, c = requests
        assert [s.get_span_context().span_id for s in backend.seen[:2]] == [a.get_span_context().span_id] * 2
        assert shared.parent.span_id == b.get_span_context().span_id  # the first request of the group
        assert {link.context.span_id for link in shared.links} == {s.get_span_context().span_id for s in (b, c)}
        assert shared.attributes["app.variant"] == "fp32" and shared.attributes["app.group.images"] == 2
        # The group's downstream calls were made under the group's span (Serve's handle carries the current one).
        assert [s.get_span_context().span_id for s in backend.seen[2:]] == [shared.context.span_id] * 2
        # The other request's wait: in its own trace, linked to the group's span (b's trace has the group itself).
        waits = {w.parent.span_id: w for w in traced.named("router queue")}
        assert set(waits) == {c.get_span_context().span_id}
        w = waits[c.get_span_context().span_id]
        assert w.context.trace_id == c.get_span_context().trace_id
        assert [link.context.span_id for link in w.links] == [shared.context.span_id]

    with _perf_is_loop_time():
        run(go())


def test_a_group_of_requests_none_of_which_is_recorded_makes_no_span(traced: Traced) -> None:
    async def go() -> None:
        p = pipeline(FakeBackend())
        token = otel_context.attach(spans.incoming(f"00-{CALLER_TRACE}-{CALLER_SPAN}-00"))
        try:
            await p.classify(Choice("fp32", "weighted"), [b"\x01"], 5, asyncio.get_running_loop().time())
        finally:
            otel_context.detach(token)

    with _perf_is_loop_time():
        run(go())
    assert traced.finished() == []


def test_a_shadow_run_is_a_child_of_the_group_that_started_it(traced: Traced) -> None:
    async def go() -> None:
        backend = FakeBackend()
        p = pipeline(backend, shadow_fraction=1.0)
        s, token = request_span(traced)
        try:
            await p.classify(Choice("fp32", "weighted"), [b"\x01"], 5, asyncio.get_running_loop().time())
        finally:
            otel_context.detach(token)
        await until(lambda: bool(traced.named("shadow")))
        (shadow,) = traced.named("shadow")  # the group of one request is that request: the shadow its child
        assert shadow.parent.span_id == s.get_span_context().span_id
        assert shadow.attributes["app.shadow.variant"] == "int8" and traced.named("coalesced group") == []

    with _perf_is_loop_time():
        run(go())


# --------------------------------------------------------------------------- the Classifier's batch


class StandInEngine:
    """What batch_trace reads of an engine (select.Engine's name, provider, rows and CUDA graph bucket)."""

    name, active_provider = "onnxruntime", "CUDAExecutionProvider"

    def rows_for(self, n: int) -> int:
        return -(-n // 8) * 8

    def graph_bucket(self, n: int) -> int | None:
        return 4 if n <= 4 else None


def test_a_batch_is_one_span_linked_to_every_request_and_each_requests_wait_links_to_it(traced: Traced) -> None:
    (a, ta), (b, tb) = request_span(traced, "a"), request_span(traced, "b")
    otel_context.detach(tb)
    otel_context.detach(ta)
    unsampled = spans.incoming(f"00-{CALLER_TRACE}-{CALLER_SPAN}-00")
    items = [
        Item(np.zeros((1, 2, 2, 3), np.uint8), 1.0, trace=unsampled),
        Item(np.zeros((2, 2, 2, 3), np.uint8), 1.5, trace=trace.set_span_in_context(a)),
        Item(np.zeros((3, 2, 2, 3), np.uint8), 2.0, trace=trace.set_span_in_context(b)),
    ]
    batch_trace.record(items, "int8", StandInEngine(), ("lite0", "ab" * 32), (2.5, 2.6, 3.0), 6)
    (batch,) = traced.named("classifier batch")
    assert batch.parent.span_id == a.get_span_context().span_id  # the first recorded request's
    linked = {link.context.span_id for link in batch.links}
    assert {a.get_span_context().span_id, b.get_span_context().span_id, int(CALLER_SPAN, 16)} == linked
    attrs = batch.attributes
    assert attrs["app.batch.images"] == 6 and attrs["app.batch.requests"] == 3 and attrs["app.batch.rows"] == 8
    assert attrs["app.batch.cuda_graph"] is False and attrs["app.execution_provider"] == "CUDAExecutionProvider"
    assert attrs["app.model.sha256"] == "ab" * 32 and attrs["app.batch.decode_ms"] == pytest.approx(100.0)
    assert (batch.end_time - batch.start_time) == pytest.approx(0.5e9, rel=1e-3)
    (queued,) = traced.named("batch queue")  # b's: a's trace has the batch itself, the unsampled one's is not kept
    assert queued.parent.span_id == b.get_span_context().span_id
    assert [link.context.span_id for link in queued.links] == [batch.context.span_id]

    traced.exporter.clear()
    batch_trace.record(items[1:2], "int8", StandInEngine(), ("lite0", None), (2.5, 2.5, 3.0), 3)
    (small,) = traced.named("classifier batch")
    assert small.attributes["app.batch.cuda_graph"] is True and small.attributes["app.batch.rows"] == 4


def test_a_batch_of_unrecorded_requests_makes_no_span(traced: Traced) -> None:
    unsampled = spans.incoming(f"00-{CALLER_TRACE}-{CALLER_SPAN}-00")
    batch_trace.record([Item(None, 1.0, [b"x"], trace=unsampled)], "int8", StandInEngine(), ("m", None), (2, 2, 3), 1)
    assert traced.finished() == []


# --------------------------------------------------------------------------- export


class HeldExporter(SpanExporter):
    """Takes spans; its first export waits until `go` is set (a collector that stalls)."""

    def __init__(self, fail: bool = False) -> None:
        self.go = threading.Event()
        self.exporting = threading.Event()
        self.got: list[str] = []
        self.fail = fail

    def export(self, batch: Sequence[ReadableSpan]) -> SpanExportResult:
        self.exporting.set()
        self.go.wait(30)
        self.got += [s.name for s in batch]
        return SpanExportResult.FAILURE if self.fail else SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


def test_a_stalled_collector_costs_spans_counted_as_dropped_never_a_blocked_span_end() -> None:
    held = HeldExporter()
    counted: list[tuple[int, str]] = []
    proc = export.BoundedSpanProcessor(held, 4, lambda n, why: counted.append((n, why)), schedule_delay_millis=10)
    provider = TracerProvider(sampler=ALWAYS_ON)
    provider.add_span_processor(proc)
    tracer = provider.get_tracer("test")
    tracer.start_span("first").end()
    assert held.exporting.wait(10)  # the exporter holds the first span and stalls
    for i in range(50):  # every end returns while the exporter is stalled: this loop finishing is the check
        tracer.start_span(f"s{i}").end()
    assert proc.held <= 4 and proc.drops["queue_full"] >= 46 - 4
    assert sum(n for n, why in counted if why == "queue_full") == proc.drops["queue_full"]
    held.go.set()
    assert proc.force_flush(10_000)
    assert proc.exported == len(held.got) == 51 - proc.drops["queue_full"]
    provider.shutdown()


def test_a_failed_export_counts_its_spans() -> None:
    failing = HeldExporter(fail=True)
    failing.go.set()
    proc = export.BoundedSpanProcessor(failing, 16, lambda n, why: None, schedule_delay_millis=10)
    provider = TracerProvider(sampler=ALWAYS_ON)
    provider.add_span_processor(proc)
    for i in range(3):
        provider.get_tracer("test").start_span(f"s{i}").end()
    proc.force_flush(10_000)
    assert proc.drops == {"export_failed": 3} and proc.exported == 0 and proc.held == 0
    provider.shutdown()


def test_the_protocol_and_queue_come_from_the_standard_variables() -> None:
    assert export.protocol({}) == "http/protobuf"
    assert export.protocol({"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}) == "grpc"
    both = {"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf"}
    assert export.protocol(both) == "http/protobuf"  # the signal's own variable wins
    with pytest.raises(ValueError, match="OTEL_EXPORTER_OTLP_PROTOCOL='http/json'"):
        export.protocol({"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"})
    assert export.max_queue({}) == 2048 and export.max_queue({"OTEL_BSP_MAX_QUEUE_SIZE": "10"}) == 10
    with pytest.raises(ValueError, match="OTEL_BSP_MAX_QUEUE_SIZE"):
        export.max_queue({"OTEL_BSP_MAX_QUEUE_SIZE": "lots"})
    grpc_exporter = export.exporter({"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"})
    http_exporter = export.exporter({})
    assert isinstance(grpc_exporter, otlp.GrpcExporter) and isinstance(http_exporter, otlp.HttpExporter)
    grpc_exporter.shutdown()
    http_exporter.shutdown()
    assert export.provider_from_env({}) is False  # no OTEL_TRACES_SAMPLER: Serve's provider and ratio stand


def test_the_exporters_come_from_otel_traces_exporter() -> None:
    assert export.exporters({}) == ["otlp"]
    assert export.exporters({"OTEL_TRACES_EXPORTER": "none"}) == []
    assert export.exporters({"OTEL_TRACES_EXPORTER": "OTLP, console,otlp"}) == ["otlp", "console"]
    for bad in ("jaeger", "none,otlp", " , "):  # a misspelt one is an error, not spans sent nowhere
        with pytest.raises(ValueError, match="OTEL_TRACES_EXPORTER"):
            export.exporters({"OTEL_TRACES_EXPORTER": bad})
    assert export.processors(lambda n, why: None, env={"OTEL_TRACES_EXPORTER": "none"}) == []
    made = export.processors(lambda n, why: None, env={"OTEL_TRACES_EXPORTER": "console,otlp"})
    assert [type(p.exporter).__name__ for p in made] == ["ConsoleSpanExporter", "HttpExporter"]
    assert all(p.limit == 2048 for p in made)
    for p in made:
        p.shutdown()


def test_a_cascades_second_stage_is_a_child_of_the_group_and_says_what_it_escalated(traced: Traced) -> None:
    from tests.test_cascade_serving_unit import CASCADE, VALUES, CascadeBackend, cascade_pipeline, classify

    s, token = request_span(traced)
    try:
        classify(cascade_pipeline(CascadeBackend(), margin=1.0), VALUES)  # margin 1: every image goes on to `then`
    finally:
        otel_context.detach(token)
        s.end()
    (second,) = traced.named("cascade second stage")  # a group of one request: its stages are the request's
    assert second.parent.span_id == s.get_span_context().span_id
    assert second.attributes["app.cascade"] == CASCADE and second.attributes["app.cascade.then"] == "fp32"
    assert second.attributes["app.cascade.escalated"] == len(VALUES)


def test_the_benchmarks_rendered_trace_is_the_tree_with_processes_and_links() -> None:
    from benchmarks.tracing_cost import render
    from tests.otlp_receiver import Span

    def span(name: str, sid: str, parent: str, pid: int, start: int, **attrs: Any) -> Span:
        links = attrs.pop("links", [])
        return Span(name, "t" * 32, sid, parent, 1, attrs, {"process.pid": pid}, links, 0, start, start + 2_000_000, "")

    spans = [
        span("replica_handle_request Router __call__", "a" * 16, "c" * 16, 1, 0, deployment="Router"),
        span("POST /v1/classify", "b" * 16, "a" * 16, 1, 1, **{"app.variant": "int8"}),
        span("replica_handle_request Classifier_int8 __call__", "d" * 16, "b" * 16, 2, 2, deployment="Classifier_int8"),
        span("batch queue", "e" * 16, "d" * 16, 2, 3, links=[("t" * 32, "f" * 16)]),
    ]
    lines = render(spans)
    assert [line.strip().split("  ")[0] for line in lines] == [s.name for s in spans]
    assert lines[1].startswith("  POST /v1/classify  2.0 ms  [Router]") and "variant=int8" in lines[1]
    assert lines[3].startswith("      batch queue") and "[Classifier_int8]" in lines[3]
    assert lines[3].endswith("-> linked to ffffffff")


# --------------------------------------------------------------------------- the Router's server span


def test_the_server_spans_status_is_an_error_on_a_5xx_and_left_unset_on_a_4xx(traced: Traced) -> None:
    """The Router's parts as the app assembles them, on fake handles: a Classifier that keeps failing answers 503 (the
    server's fault: the span's status is an error), an undecodable image 400 (the client's: status unset, as
    OpenTelemetry's HTTP conventions say for a server span); both carry the code in http.response.status_code and the
    service's error code in error.type, and the reply's traceparent names the span."""
    backend = FakeBackend(("fp32",))
    app = router(backend)
    jpeg = cv2.imencode(".jpg", np.full((64, 64, 3), 128, np.uint8))[1].tobytes()
    assert asyncio.run(classify(app, jpeg)).status_code == 200
    backend.failing["fp32"] = 100  # every call from now on: the replica was lost
    failed = asyncio.run(classify(app, jpeg))
    bad = asyncio.run(classify(app, b"not an image"))
    assert failed.status_code >= 500 and bad.status_code == 400
    ok_span, failed_span, bad_span = traced.named("POST /v1/classify")
    assert ok_span.status.status_code is StatusCode.UNSET and "error.type" not in ok_span.attributes
    assert failed_span.status.status_code is StatusCode.ERROR
    assert failed_span.attributes["http.response.status_code"] == failed.status_code
    assert failed_span.attributes["error.type"] and failed_span.kind.name == "SERVER"
    assert bad_span.status.status_code is StatusCode.UNSET
    assert bad_span.attributes["http.response.status_code"] == 400 and bad_span.attributes["error.type"]
    for reply, span in ((failed, failed_span), (bad, bad_span)):
        assert reply.headers["traceparent"] == spans.traceparent(span)


# --------------------------------------------------------------------------- the decode call


def test_a_decode_call_is_one_span_with_each_images_facts_in_order(traced: Traced) -> None:
    """One image: a `decode` span with its format, pixels and bytes (an error status where it was refused); several:
    one `preprocess` span whose attributes hold the same per image as arrays, a refused image's error code in its
    place, and no span per image."""
    from app.config import Limits
    from app.serve.preprocessor import Decoder

    decoder = Decoder(Limits())
    png = cv2.imencode(".png", np.full((30, 40, 3), 9, np.uint8))[1].tobytes()
    jpeg = cv2.imencode(".jpg", np.full((20, 10, 3), 9, np.uint8))[1].tobytes()
    asyncio.run(decoder.many([png], 32))
    refused = asyncio.run(decoder.many([b"not an image"], 32))
    several = asyncio.run(decoder.many([jpeg, b"not an image", png], 32))
    assert list(refused.errors) == [0] and several.positions == [0, 2]

    one, bad = traced.named("decode")
    assert one.attributes["app.image.format"] == "png" and one.attributes["app.image.pixels"] == 30 * 40
    assert one.attributes["app.image.bytes"] == len(png) and one.status.status_code is StatusCode.UNSET
    assert bad.status.status_code is StatusCode.ERROR and bad.attributes["error.type"] == refused.errors[0].code
    (call,) = traced.named("preprocess")
    assert call.attributes["app.images"] == 3
    assert list(call.attributes["app.image.format"]) == ["jpeg", "", "png"]
    assert list(call.attributes["app.image.pixels"]) == [200, 0, 1200]
    assert list(call.attributes["app.image.bytes"]) == [len(jpeg), 12, len(png)]
    assert list(call.attributes["app.image.error"]) == ["", several.errors[1].code, ""]
    assert len(call.attributes["app.image.decode_ms"]) == 3
    assert len(traced.named("decode")) == 2  # the call of three made no span per image
    decoder.executor.shutdown()
