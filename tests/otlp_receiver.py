"""OTLP receivers for the tracing tests and benchmarks.tracing_cost: what a collector's `otlp` receiver does, over
HTTP (POST /v1/traces, protobuf) and over gRPC (opentelemetry.proto.collector.trace.v1.TraceService/Export), decoding
the wire format into plain records. The collector itself cannot be installed here; these take the exporters' real
requests. `hold()` stalls both (each export waits until `release()`), as a collector that stopped answering does.
"""

from __future__ import annotations

import contextlib
import gzip
import http.server
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as svc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc as svc_grpc
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

HOLD_LIMIT_S = 60.0  # a held export goes on by itself after this: a failed test never hangs an exporter for good


def poll_until(predicate: Callable[[], Any], timeout_s: float, what: str = "") -> Any:
    """Poll `predicate` until it returns something truthy; fail at the deadline (no sleep stands in for an event)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if got := predicate():
            return got
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what or predicate}")


def _value(v: AnyValue) -> Any:
    which = v.WhichOneof("value")
    if which == "array_value":
        return [_value(x) for x in v.array_value.values]
    return getattr(v, which) if which else None


@dataclass
class Span:
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    kind: int
    attributes: dict[str, Any]
    resource: dict[str, Any]
    links: list[tuple[str, str]]  # (trace id, span id), hex
    status: int  # 0 unset, 1 ok, 2 error
    start_ns: int
    end_ns: int
    via: str  # the receiver that took it: http | grpc


@dataclass
class Spans:
    """Every span received, by either receiver."""

    spans: list[Span] = field(default_factory=list)
    requests: dict[str, int] = field(default_factory=lambda: {"http": 0, "grpc": 0})
    lock: threading.Lock = field(default_factory=threading.Lock)
    flowing: threading.Event = field(default_factory=threading.Event)  # cleared: every export waits (hold)
    keep: bool = True  # False: spans are counted, not kept (a benchmark's long run)
    count: int = 0
    by_trace: Counter[str] = field(default_factory=Counter)  # spans received by trace id (hex)

    def take(self, request: svc.ExportTraceServiceRequest, via: str) -> None:
        self.flowing.wait(HOLD_LIMIT_S)
        if not self.keep:
            ids = Counter(s.trace_id for rs in request.resource_spans for ss in rs.scope_spans for s in ss.spans)
            with self.lock:
                self.count += ids.total()
                self.requests[via] += 1
                for tid, n in ids.items():
                    self.by_trace[tid.hex()] += n
            return
        got = []
        for rs in request.resource_spans:
            resource = {a.key: _value(a.value) for a in rs.resource.attributes}
            for ss in rs.scope_spans:
                for s in ss.spans:
                    got.append(
                        Span(
                            s.name,
                            s.trace_id.hex(),
                            s.span_id.hex(),
                            s.parent_span_id.hex(),
                            s.kind,
                            {a.key: _value(a.value) for a in s.attributes},
                            resource,
                            [(link.trace_id.hex(), link.span_id.hex()) for link in s.links],
                            s.status.code,
                            s.start_time_unix_nano,
                            s.end_time_unix_nano,
                            via,
                        )
                    )
        with self.lock:
            self.spans.extend(got)
            self.by_trace.update(s.trace_id for s in got)
            self.count += len(got)
            self.requests[via] += 1

    def of_trace(self, trace_id: str) -> list[Span]:
        with self.lock:
            return [s for s in self.spans if s.trace_id == trace_id]

    def where(self, predicate: Callable[[Span], bool]) -> list[Span]:
        with self.lock:
            return [s for s in self.spans if predicate(s)]

    def wait_for(self, predicate: Callable[[list[Span]], bool], trace_id: str, timeout_s: float = 60) -> list[Span]:
        """The trace's spans once `predicate` holds of them (exports arrive in batches, from several processes)."""
        return poll_until(lambda: (t := self.of_trace(trace_id)) and predicate(t) and t, timeout_s, what=trace_id)


class _Handler(http.server.BaseHTTPRequestHandler):
    sink: Spans

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("content-length") or 0))
        if self.headers.get("content-encoding") == "gzip":
            body = gzip.decompress(body)
        if self.path != "/v1/traces" or self.headers.get("content-type") != "application/x-protobuf":
            self.send_error(415 if self.path == "/v1/traces" else 404)
            return
        self.sink.take(svc.ExportTraceServiceRequest.FromString(body), "http")
        reply = svc.ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", str(len(reply)))
        self.end_headers()
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # its process stopped while the export waited
            self.wfile.write(reply)

    def log_message(self, *args: Any) -> None:
        pass


class _Servicer(svc_grpc.TraceServiceServicer):
    def __init__(self, sink: Spans) -> None:
        self.sink = sink

    def Export(self, request: svc.ExportTraceServiceRequest, context: Any) -> svc.ExportTraceServiceResponse:
        self.sink.take(request, "grpc")
        return svc.ExportTraceServiceResponse()


class Receivers:
    """Both receivers on 127.0.0.1, on free ports, into one `Spans`; `with Receivers() as r:` r.http_url, r.grpc_url."""

    def __init__(self) -> None:
        self.sink = Spans()
        self.sink.flowing.set()
        handler = type("Handler", (_Handler,), {"sink": self.sink})
        self._http = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._grpc = grpc.server(futures.ThreadPoolExecutor(4))
        svc_grpc.add_TraceServiceServicer_to_server(_Servicer(self.sink), self._grpc)
        grpc_port = self._grpc.add_insecure_port("127.0.0.1:0")
        self.http_url = f"http://127.0.0.1:{self._http.server_address[1]}"
        self.grpc_url = f"http://127.0.0.1:{grpc_port}"
        self._thread = threading.Thread(target=self._http.serve_forever, daemon=True)

    def __enter__(self) -> Receivers:
        self._thread.start()
        self._grpc.start()
        return self

    def hold(self) -> None:
        """Every export from now on waits (until `release`, or HOLD_LIMIT_S): a collector that stalls."""
        self.sink.flowing.clear()

    def release(self) -> None:
        self.sink.flowing.set()

    def __exit__(self, *exc: object) -> None:
        self.release()
        self._http.shutdown()
        self._http.server_close()
        self._grpc.stop(None)
