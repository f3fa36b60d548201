"""The app's Server-Timing header, read back: where a request's time went on the server.

The Router sets it on every 200 (app/http/replies.py: `name;dur=ms` per entry of the reply's timings_ms): `receive`
(the body arriving), `preprocess` (decode), `queue` (waiting for a Classifier batch), `inference`, `escalation` (a
cascade's second stage, when one answered) and `total` (arrival to reply). What `total` holds beyond the stages is
the serving path between them (the Router's own work, the hops): reported as `other`, so a slow stage is named by
evidence, not by guess.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Sequence
from typing import Any

from benchmarks.stats import percentile

STAGES = ("receive", "preprocess", "queue", "inference", "escalation")  # app.serve.metrics.STAGES, less total
TOTAL, OTHER = "total", "other"
# One entry: a name, then `;key=value` parameters, a value a token or a quoted string (which may hold commas).
_ENTRY = re.compile(r'\s*([^;,\s]+)((?:\s*;\s*[^=;,\s]+\s*(?:=\s*(?:"(?:[^"\\]|\\.)*"|[^;,\s]*))?)*)\s*(?:,|$)')
_PARAM = re.compile(r'\s*;\s*([^=;,\s]+)\s*(?:=\s*("(?:[^"\\]|\\.)*"|[^;,\s]*))?')


def parse(header: str | None) -> dict[str, float]:
    """`a;dur=1.5, b;desc="x, y";dur=2` -> {"a": 1.5, "b": 2.0}: each entry's `dur` in ms; entries without a
    numeric dur are left out."""
    out: dict[str, float] = {}
    pos, text = 0, (header or "").strip()
    while pos < len(text):
        m = _ENTRY.match(text, pos)
        if m is None or m.end() == pos:
            break
        pos = m.end()
        for key, value in _PARAM.findall(m[2]):
            if key.lower() == "dur":
                with contextlib.suppress(ValueError):
                    out[m[1]] = float(value.strip('"'))
    return out


def with_other(timings: dict[str, float]) -> dict[str, float]:
    """The timings and `other`: total less every stage (never below 0: the stages are rounded to µs)."""
    if TOTAL not in timings:
        return dict(timings)
    return {**timings, OTHER: round(max(0.0, timings[TOTAL] - sum(timings.get(s, 0.0) for s in STAGES)), 3)}


def summarise(samples: Sequence[dict[str, float]]) -> dict[str, dict[str, Any]]:
    """Per entry (each stage, total and other) over the requests: p50, p99, mean and how many carried it."""
    rows = [with_other(s) for s in samples]
    names = [n for n in (TOTAL, *STAGES, OTHER) if any(n in r for r in rows)]
    names += sorted({n for r in rows for n in r} - set(names))  # an entry the app adds later, shown all the same
    out = {}
    for name in names:
        values = [r[name] for r in rows if name in r]
        out[name] = {
            "p50_ms": percentile(values, 50),
            "p99_ms": percentile(values, 99),
            "mean_ms": sum(values) / len(values),
            "n": len(values),
        }
    return out


def slowest_stage(summary: dict[str, dict[str, Any]]) -> tuple[str, float] | None:
    """The stage (or `other`) with the largest p50: what a request's server time is mostly made of."""
    parts = [(n, summary[n]["p50_ms"]) for n in (*STAGES, OTHER) if n in summary and summary[n]["p50_ms"] is not None]
    return max(parts, key=lambda p: p[1]) if parts else None
