"""ONNX Runtime's profiler output, summarised: which operators cost the most, which run most often."""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any


def summarize_profile(trace_path: str, top: int = 10) -> dict[str, list[dict[str, Any]]]:
    """ONNX Runtime's Chrome-trace JSON -> the `top` most expensive and most frequent operators."""
    with open(trace_path) as f:
        events = json.load(f)
    total_us: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    for ev in events:
        if ev.get("cat") != "Node" or not str(ev.get("name", "")).endswith("_kernel_time"):
            continue
        op = ev.get("args", {}).get("op_name", "?")
        total_us[op] += float(ev.get("dur", 0))
        calls[op] += 1
    expensive = sorted(total_us, key=lambda op: -total_us[op])[:top]
    frequent = sorted(calls, key=lambda op: -calls[op])[:top]
    return {
        "most_expensive": [
            {"op": op, "total_ms": round(total_us[op] / 1000, 3), "calls": calls[op]} for op in expensive
        ],
        "most_frequent": [{"op": op, "calls": calls[op], "total_ms": round(total_us[op] / 1000, 3)} for op in frequent],
    }
