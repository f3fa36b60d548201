"""The app's spans on the request path, as children of Ray Serve's (`ray.serve.get_trace_context`'s context).

`ENABLED` is this process's switch, set where Serve set tracing up (`app.serve.tracing`); while it is False each
function returns at once (a shared null context manager, None): tracing off costs an attribute read per call site.

Times: the app measures with `time.perf_counter`; a span recorded after the fact (`record`: a wait in a queue, a
batch) converts those to the epoch nanoseconds OpenTelemetry keeps. Attributes follow OpenTelemetry's semantic
conventions where one exists (HTTP server, RPC, error.type); the app's own are under `app.`.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

ENABLED = False
NULL: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
TRACER = "app"  # the instrumentation scope of every span the app makes

_tracer: Any = None


def enable(tracer: Any = None) -> None:
    """Turn the app's spans on in this process (Serve has set its TracerProvider up here); `tracer`: another
    provider's (the unit tests' in-memory one), else the global provider's."""
    global ENABLED, _tracer
    from opentelemetry import trace

    _tracer = tracer if tracer is not None else trace.get_tracer(TRACER)
    ENABLED = True


def disable() -> None:
    global ENABLED, _tracer
    ENABLED, _tracer = False, None


def epoch_ns(perf: float) -> int:
    """A `time.perf_counter()` reading as OpenTelemetry's time (nanoseconds since the epoch)."""
    return time.time_ns() - int((time.perf_counter() - perf) * 1e9)


def current() -> Any:
    """This flow's OpenTelemetry context, to carry across a hand-off (a queue, a task); None when off."""
    if not ENABLED:
        return None
    from opentelemetry import context

    return context.get_current()


def attach(ctx: Any) -> None:
    """Make a carried context the current one in this (fresh) contextvars context, for good: a detached task's."""
    from opentelemetry import context

    context.attach(ctx)


def _span_of(ctx: Any) -> Any:
    from opentelemetry import trace

    return trace.get_current_span(ctx)


def is_sampled(ctx: Any) -> bool:
    """Whether a carried context's span is recorded (sampled)."""
    return ctx is not None and bool(_span_of(ctx).get_span_context().trace_flags.sampled)


def incoming(traceparent: str | None, tracestate: str | None = None) -> Any:
    """The parent of the Router's span for a request: Serve's span (current) where it already continues the caller's
    trace or the caller sent none; the caller's `traceparent` where Serve's span is not in it (Serve's proxy does not
    trace, or a process in front of it started a trace of its own), so the caller's trace and sampling decision
    stand."""
    from opentelemetry import context
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    here = context.get_current()
    if not traceparent:
        return here
    serve = _span_of(here).get_span_context()
    if serve.is_valid and traceparent[3:35] == f"{serve.trace_id:032x}":  # Serve's span continues it: no parsing
        return here
    carrier = {"traceparent": traceparent} | ({"tracestate": tracestate} if tracestate else {})
    theirs = TraceContextTextMapPropagator().extract(carrier)
    caller = _span_of(theirs).get_span_context()
    if not caller.is_valid:  # a malformed traceparent is ignored, as the W3C spec says
        return here
    return here if serve.is_valid and serve.trace_id == caller.trace_id else theirs


def start(name: str, parent: Any, kind: str = "INTERNAL", attributes: Mapping[str, Any] | None = None) -> Any:
    """A span started under `parent` (a context), not made current (`use` does); None when off."""
    if not ENABLED:
        return None
    from opentelemetry.trace import SpanKind

    return _tracer.start_span(name, context=parent, kind=SpanKind[kind], attributes=attributes)


def use(span: Any) -> contextlib.AbstractContextManager[Any]:
    """`with use(span):` the span is the current one in the block (not ended by it)."""
    if span is None:
        return NULL
    from opentelemetry import trace

    return _within(trace.set_span_in_context(span))


@contextlib.contextmanager
def _within(ctx: Any) -> Iterator[None]:
    from opentelemetry import context

    token = context.attach(ctx)
    try:
        yield
    finally:
        context.detach(token)


def within(ctx: Any) -> contextlib.AbstractContextManager[Any]:
    """`with within(ctx):` a carried context (`current()`'s) is the current one in the block."""
    return NULL if ctx is None else _within(ctx)


def span(
    name: str, attributes: Mapping[str, Any] | None = None, parent: Any = None, links: Sequence[Any] = ()
) -> contextlib.AbstractContextManager[Any]:
    """`with span(name) as s:` a child of the current span (or of `parent`, a context), current in the block and ended
    after it; an exception leaving it sets its error status. `s` is None when off."""
    if not ENABLED:
        return NULL
    return _tracer.start_as_current_span(name, context=parent, attributes=attributes, links=_links(links))


def record(
    name: str,
    start_perf: float,
    end_perf: float,
    attributes: Mapping[str, Any] | None = None,
    parent: Any = None,
    links: Sequence[Any] = (),
) -> Any:
    """A span of a time already past (perf_counter readings), under `parent` (a context; None: the current one),
    linked to `links` (contexts or spans); returned ended, or None when off."""
    if not ENABLED:
        return None
    s = _tracer.start_span(
        name, context=parent, attributes=attributes, links=_links(links), start_time=epoch_ns(start_perf)
    )
    s.end(end_time=epoch_ns(end_perf))
    return s


def waits(name: str, waiters: Iterable[tuple[Any, float, Any]], until: float, lead: Any, shared: Any) -> None:
    """Each waiter's wait for a shared span (a group's, a batch's) as a span of the waiter's own trace, from when it
    started waiting (perf_counter) `until`, linked to `shared`; waiters are (context, since, attributes). Not the
    lead's (`shared`'s parent): its trace has the shared span itself, its wait the gap before it."""
    for trace, since, attributes in waiters:
        if trace is not lead:
            record(name, since, until, attributes, parent=trace, links=[shared])


def _links(items: Iterable[Any]) -> list[Any]:
    """Links to each span (or a context's span) that is valid, once each."""
    from opentelemetry.trace import Link, Span

    out, seen = [], set()
    for item in items:
        if item is None:
            continue
        sc = (item if isinstance(item, Span) else _span_of(item)).get_span_context()
        if sc.is_valid and (sc.trace_id, sc.span_id) not in seen:
            seen.add((sc.trace_id, sc.span_id))
            out.append(Link(sc))
    return out


def first_sampled(contexts: Iterable[Any]) -> Any:
    """The first of the carried contexts whose span is recorded: a shared span's parent (None: none is)."""
    return next((c for c in contexts if is_sampled(c)), None)


def annotate(attributes: Mapping[str, Any], s: Any = None) -> None:
    """Attributes on `s` (None: the current span); nothing when off or not recording."""
    if not ENABLED:
        return
    target = s if s is not None else _span_of(None)
    if target.is_recording():
        target.set_attributes({k: v for k, v in attributes.items() if v is not None})


def name_route(method: str, route: str) -> None:
    """The current (server) span named `{method} {route}` with http.route, once the route is known."""
    if not ENABLED:
        return
    s = _span_of(None)
    if s.is_recording():
        s.update_name(f"{method} {route}")
        s.set_attribute("http.route", route)


def fail(s: Any, description: str) -> None:
    """`s`'s status: error, with a description."""
    if s is None:
        return
    from opentelemetry.trace import Status, StatusCode

    s.set_status(Status(StatusCode.ERROR, description))


def traceparent(s: Any) -> str | None:
    """The W3C traceparent naming `s` when it is recorded (for a reply header): a response, a log line and a trace find
    each other by it. None when off or not sampled."""
    if s is None:
        return None
    sc = s.get_span_context()
    if not sc.trace_flags.sampled:
        return None
    return f"00-{sc.trace_id:032x}-{sc.span_id:016x}-{int(sc.trace_flags):02x}"


def trace_id(s: Any = None) -> str:
    """The trace id of `s` (None: the current span) in hex when recorded, else ""."""
    if not ENABLED:
        return ""
    sc = (s if s is not None else _span_of(None)).get_span_context()
    return f"{sc.trace_id:032x}" if sc.trace_flags.sampled else ""
