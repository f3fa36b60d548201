"""Tables and pictures of benchmark results: Markdown for humans, PNG (matplotlib, Agg) for trends."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any


def fmt(value: Any, digits: int = 1) -> str:
    """A table cell: numbers rounded, None as 'n/a', dicts as k=v lists, pipes escaped."""
    if value is None:
        return "n/a"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if not math.isfinite(value):
            return "n/a"
        return f"{value:.{digits}f}"
    if isinstance(value, dict):
        return ", ".join(f"{k}={fmt(v, digits)}" for k, v in value.items()) or "-"
    return str(value).replace("|", "\\|").replace("\n", " ")


def markdown_table(headers: Sequence[str], rows: Iterable[Sequence[Any]], digits: int = 1) -> str:
    """A GitHub-flavoured Markdown table; every row must have one cell per header."""
    head = [fmt(h) for h in headers]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for row in rows:
        if len(row) != len(head):
            raise ValueError(f"row has {len(row)} cells, the table {len(head)} columns: {row!r}")
        lines.append("| " + " | ".join(fmt(c, digits) for c in row) + " |")
    return "\n".join(lines) + "\n"


STEP_HEADERS = (
    "load",
    "img/req",
    "variant",
    "requests",
    "req/s",
    "img/s",
    "p50 ms",
    "p90 ms",
    "p99 ms",
    "max ms",
    "errors",
    "served by",
    "median batch",
)


def step_row(step: dict[str, Any]) -> list[Any]:
    lat = step["latency_ms"]
    load = f"c={step['concurrency']}" if step["mode"] == "closed" else f"{step['rate']:g}/s open"
    return [
        load,
        step["images_per_request"],
        step.get("variant") or "(server)",
        step["requests"],
        step["throughput_rps"],
        step["images_per_s"],
        lat["p50_ms"],
        lat["p90_ms"],
        lat["p99_ms"],
        lat["max_ms"],
        step["errors"] or "-",
        step["variants"] or "-",
        step["median_batch_size"],
    ]


def steps_table(steps: Sequence[dict[str, Any]]) -> str:
    return markdown_table(STEP_HEADERS, [step_row(s) for s in steps])


def write_json(path: Path, data: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str) + "\n")
    tmp.replace(path)
    return path


def pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_service(series: dict[str, list[dict[str, Any]]], throughput_png: Path, p99_png: Path, title: str) -> None:
    """Closed-loop steps of every target: throughput vs concurrency, and p99 latency vs throughput."""
    plt = pyplot()
    for path, (xkey, ykey, xlabel, ylabel, logx) in {
        throughput_png: ("concurrency", "throughput_rps", "concurrent requests (closed loop)", "requests/s", True),
        p99_png: ("throughput_rps", "p99_ms", "throughput (requests/s)", "p99 latency (ms)", False),
    }.items():
        fig, ax = plt.subplots(figsize=(7.5, 4.8))
        for name, steps in series.items():
            pts = []
            for step in steps:
                x, y = step.get(xkey), step.get(ykey, step["latency_ms"].get(ykey))
                if step["mode"] == "closed" and x is not None and y is not None:
                    pts.append((x, y, f"c={step['concurrency']}"))
            if not pts:
                continue
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=name)
            if xkey != "concurrency":  # say which load each point was
                for x, y, label in pts:
                    ax.annotate(label, (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7, alpha=0.8)
        if logx:
            ax.set_xscale("log", base=2)
            ticks = sorted({s["concurrency"] for steps in series.values() for s in steps if "concurrency" in s})
            ax.set_xticks(ticks, [str(t) for t in ticks])
        if ykey == "p99_ms":
            ax.set_yscale("log")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_title(title, fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
        if ax.get_lines():
            ax.legend(fontsize=8)
        fig.tight_layout()
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=120)
        plt.close(fig)
