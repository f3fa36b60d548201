"""Tables and pictures of benchmark results: Markdown for humans, PNG (matplotlib, Agg) for trends."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any


def fmt(value: Any, digits: int = 1) -> str:
    """A table cell: numbers rounded, None as 'n/a', dicts as k=v lists, pipes escaped."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "n/a"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    if isinstance(value, dict):
        return ", ".join(f"{k}={fmt(v, digits)}" for k, v in value.items()) or "-"
    return str(value).replace("|", "\\|").replace("\n", " ")


def markdown_table(headers: Sequence[str], rows: Iterable[Sequence[Any]], digits: int = 1) -> str:
    """A GitHub-flavoured Markdown table; every row must have one cell per header."""
    lines = ["| " + " | ".join(map(fmt, headers)) + " |", "|" + "---|" * len(headers)]
    for row in rows:
        if len(row) != len(headers):
            raise ValueError(f"row has {len(row)} cells, the table {len(headers)} columns: {row!r}")
        lines.append("| " + " | ".join(fmt(c, digits) for c in row) + " |")
    return "\n".join(lines) + "\n"


# The columns of a step table: keys of benchmarks.load's step dicts or of their latency_ms, and run.py's workload.
STEP_COLUMNS = "workload concurrency images_per_request variant requests throughput_rps images_per_s p50_ms p90_ms \
p99_ms max_ms errors variants median_batch_size"


def steps_table(steps: Sequence[dict[str, Any]]) -> str:
    """One row per load step."""
    rows = [[{**s, **s["latency_ms"]}.get(k) for k in STEP_COLUMNS.split()] for s in steps]
    return markdown_table([k.replace("_", " ") for k in STEP_COLUMNS.split()], rows)


def write_json(path: Path, data: Any) -> Path:
    """Written whole or not at all (a temporary file, then renamed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str) + "\n")
    tmp.replace(path)
    return path


def write_report(stem: Path, result: Any, markdown: str) -> str:
    """<stem>.json and <stem>.md (not Path.with_suffix: a host name in the stem may hold dots); a line saying so."""
    write_json(Path(f"{stem}.json"), result)
    Path(f"{stem}.md").write_text(markdown)
    return f"wrote {stem}.json and {stem}.md"


def pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, out: Path, dpi: int = 110) -> Path:
    """Laid out (with room for a suptitle, if any), written as PNG, closed."""
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.35 / fig.get_figheight() if fig.get_suptitle() else 1))
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=dpi)
    pyplot().close(fig)
    return out


LABELS = {"concurrency": "concurrent requests (closed loop)", "throughput_rps": "requests/s", "p99_ms": "p99 ms"}


def plot_service(series: dict[str, list[dict[str, Any]]], throughput_png: Path, p99_png: Path, title: str) -> None:
    """Closed-loop steps of every target: throughput vs concurrency, and p99 latency vs throughput."""
    for path, x, y in ((throughput_png, "concurrency", "throughput_rps"), (p99_png, "throughput_rps", "p99_ms")):
        fig, ax = pyplot().subplots(figsize=(7.5, 4.8))
        for name, steps in series.items():
            points = [(s[x], s[y], s["concurrency"]) for s in ({**s, **s["latency_ms"]} for s in steps)]
            points = [p for p in points if p[0] is not None and p[1] is not None]
            if points:
                ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=name)
            for px, py, c in points if x != "concurrency" else []:  # say which load each point was
                ax.annotate(f"c={c}", (px, py), textcoords="offset points", xytext=(4, 4), fontsize=7, alpha=0.8)
        if x == "concurrency":
            ticks = sorted({s["concurrency"] for steps in series.values() for s in steps})
            ax.set_xscale("log", base=2)
            ax.set_xticks(ticks, [str(t) for t in ticks])
        else:
            ax.set_yscale("log")
        ax.set(xlabel=LABELS[x], ylabel=LABELS[y])
        ax.set_title(title, fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
        if ax.get_lines():
            ax.legend(fontsize=8)
        save_figure(fig, path, dpi=120)
