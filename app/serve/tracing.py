"""Tracing in a Serve process: the exporter hook Serve calls, and the app's spans turned on where Serve traces.

Turned on by Serve's own switch, in every process of the cluster (the proxy's and each replica's):

    RAY_SERVE_TRACING_EXPORTER_IMPORT_PATH=app.serve.tracing:span_processors

or the Serve config's `tracing_config: {enabled: true, exporter_import_path: app.serve.tracing:span_processors}`.
Serve calls `span_processors` (no arguments) when it sets tracing up in a process; the OTLP exporter and its queue are
`app.tracing.export`'s. Spans a full queue drops, or a failed export loses, are counted in
`app_trace_spans_dropped_total{reason}`; exported ones in `app_trace_spans_exported_total`.
"""

from __future__ import annotations

import threading
from typing import Any

from ray.util.metrics import Counter

from app.serve.serve_internals import tracing_enabled
from app.tracing import export, spans

_lock = threading.Lock()
_counters: dict[str, Counter] = {}


def _counter(name: str, description: str, tags: tuple[str, ...] = ()) -> Counter:
    with _lock:  # made on first use: Serve calls the hook before this process's replica is up
        if name not in _counters:
            _counters[name] = Counter(name, description, tag_keys=tags)
        return _counters[name]


def _dropped(n: int, reason: str) -> None:
    _counter("app_trace_spans_dropped_total", "Spans dropped before export, by reason", ("reason",)).inc(
        n, tags={"reason": reason}
    )


def _exported(n: int) -> None:
    _counter("app_trace_spans_exported_total", "Spans the OTLP exporter accepted").inc(n)


def span_processors() -> list[Any]:
    """Serve's exporter hook (RAY_SERVE_TRACING_EXPORTER_IMPORT_PATH): a bounded processor per exporter the OTEL_*
    variables name (OTLP by default; none for OTEL_TRACES_EXPORTER=none); where OTEL_TRACES_SAMPLER is set, this
    process's provider is made from them first."""
    export.provider_from_env()
    return export.processors(_dropped, _exported)


def turn_on_here() -> bool:
    """The app's spans on in this replica where Serve traces here (each deployment's constructor calls it)."""
    if tracing_enabled():
        spans.enable()
        return True
    return False
