"""The Grafana dashboard's panels (app.ops.panels) drawn locally: a real Prometheus, started here as a child process
(Debian's `prometheus`), scrapes Ray's metrics export; after the run every panel's PromQL goes to its query API
and matplotlib draws the answers. Grafana's variables match everything; $__range is the run.
"""

from __future__ import annotations

import math
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import yaml

from app.ops.panels import PANELS
from benchmarks.report import pyplot, save_figure
from benchmarks.server_process import ServerProcess, ServerStartError, free_port

UNITS = {"reqps": "per second", "ms": "ms", "short": "", "percentunit": "share", "decmbytes": "MB"}


class Prometheus:
    """`prometheus` scraping `targets` ("host:port", path /metrics) every `every_s` s, on a free loopback port
    (.url); its config and data live in a temporary directory, removed at exit."""

    def __init__(self, targets: Sequence[str], every_s: float = 2.0) -> None:
        if (binary := shutil.which("prometheus")) is None:
            raise ServerStartError("`prometheus` not found: install Debian's prometheus (apt-get install prometheus)")
        addr = f"127.0.0.1:{free_port()}"
        self.url, self.dir = f"http://{addr}", Path(tempfile.mkdtemp(prefix="prometheus-"))
        every = f"{max(1, round(every_s * 1000))}ms"
        config = {
            "global": {"scrape_interval": every, "scrape_timeout": every, "evaluation_interval": every},
            "scrape_configs": [{"job_name": "ray", "static_configs": [{"targets": list(targets)}]}],
        }
        (yml := self.dir / "prometheus.yml").write_text(yaml.safe_dump(config))
        cmd = [binary, f"--config.file={yml}", f"--storage.tsdb.path={self.dir}/data", f"--web.listen-address={addr}"]
        self.server = ServerProcess("prometheus", cmd, self.dir / "prometheus.log")

    def __enter__(self) -> Prometheus:
        self.started = time.time()
        self.server.start()
        try:
            self.server.wait_ready(self.url + "/-/ready", 60)
        except BaseException:
            print(f"prometheus log:\n{self.server.log_tail(10)}", file=sys.stderr)
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.stop(grace_s=20)
        shutil.rmtree(self.dir, ignore_errors=True)

    def query(self, expr: str, **params: Any) -> list[dict[str, Any]]:
        """An instant query (or a range query, given start/end/step): Prometheus's result list."""
        path = "/api/v1/query_range" if "step" in params else "/api/v1/query"
        doc = httpx.get(self.url + path, params={"query": expr, **params}, timeout=30).json()
        if doc.get("status") != "success":
            raise RuntimeError(f"{expr}: {doc.get('error')}")
        return list(doc["data"]["result"])

    def wait_scrapes(self, n: int = 2, since: float | None = None, timeout_s: float = 30.0) -> int:
        """Until every target has been scraped `n` times since `since` (unix time; default: Prometheus's start);
        how many times the first one was."""
        since, deadline = self.started if since is None else since, time.monotonic() + timeout_s
        while True:
            window = max(1, math.ceil(time.time() - since))
            counts = [int(float(r["value"][1])) for r in self.query(f"count_over_time(up[{window}s])")]
            if counts and min(counts) >= n:
                return counts[0]
            if time.monotonic() > deadline:
                raise TimeoutError(f"Prometheus scraped {counts} times in {timeout_s:g} s, not {n}")
            time.sleep(0.2)


def local_expr(expr: str, range_s: float) -> str:
    """A Grafana expression for the query API: $application, $model and $variant match everything, $__range is the
    run."""
    expr = expr.replace("$__range", f"{max(1, math.ceil(range_s))}s").replace("$__rate_interval", "1m")
    return re.sub(r"\$(application|model|variant)\b", ".*", expr)


def legend(fmt: str, labels: dict[str, str]) -> str:
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m[1], ""), fmt).strip() or " ".join(labels.values())


def fetch(prom: Prometheus, start: float, end: float, step_s: float) -> list[Any]:
    """Every panel's series between two unix times: [{"title", "unit", "log_y", "share", "series": [{"name",
    "dashed", "points": [[x, y], ...]}]}], x in seconds since `start`; a share panel's points are (bucket upper
    bound, share of observations in that bucket) at `end`, one series per label set besides `le`."""
    out, step_s = [], max(step_s, (end - start) / 10_000)  # Prometheus answers at most 11,000 points a series
    for panel in PANELS:
        series: list[dict[str, Any]] = []
        out.append({"title": panel.title, "unit": panel.unit, "log_y": panel.log_y, "share": panel.share})
        out[-1]["series"] = series
        for t in panel.targets:
            expr = local_expr(t.expr, end - start)
            if not panel.share:
                for r in prom.query(expr, start=start, end=end, step=step_s):
                    pts = [[float(ts) - start, float(v)] for ts, v in r["values"] if math.isfinite(float(v))]
                    series.append({"name": legend(t.legend, r["metric"]), "dashed": t.dashed, "points": pts})
                continue
            cumulative: dict[str, list[tuple[float, float]]] = {}
            for r in prom.query(expr, time=end):
                le = float(r["metric"].pop("le"))
                cumulative.setdefault(legend("", r["metric"]), []).append((le, float(r["value"][1])))
            for name, pairs in sorted(cumulative.items()):
                pairs.sort()
                shares = [[le, c - (pairs[i - 1][1] if i else 0.0)] for i, (le, c) in enumerate(pairs)]
                series.append({"name": name, "dashed": False, "points": [p for p in shares if math.isfinite(p[1])]})
    return out


def render(panels: Sequence[dict[str, Any]], out: Path, title: str) -> Path:
    """The panels (as fetch returns them, plus any of the same shape) into one PNG, two per row."""
    rows = math.ceil(len(panels) / 2)
    fig, axes = pyplot().subplots(rows, 2, figsize=(14, 3.6 * rows), squeeze=False)
    for ax, panel in zip(axes.flat, panels, strict=False):
        for i, s in enumerate(panel["series"]):
            xs, ys = [p[0] for p in s["points"]], [p[1] for p in s["points"]]
            if panel["share"]:
                width = 0.8 / len(panel["series"])
                ax.bar([j + i * width for j in range(len(xs))], ys, width=width, label=s["name"])
                ax.set_xticks(range(len(xs)), ["+Inf" if math.isinf(x) else f"≤{x:g}" for x in xs], fontsize=7)
            else:
                ax.plot(xs, ys, "--" if s["dashed"] else "-", label=s["name"], linewidth=1.2)
        ax.set_xlabel("bucket (upper bound)" if panel["share"] else "s since the start")
        ax.set_ylabel(UNITS.get(panel["unit"], panel["unit"]))
        ax.set_title(panel["title"], fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
        if panel["series"]:
            ax.set_yscale("log" if panel.get("log_y") else "linear")
            ax.legend(fontsize=6, ncol=2 if len(panel["series"]) > 6 else 1)
        else:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes, color="grey")
    for ax in list(axes.flat)[len(panels) :]:
        ax.set_visible(False)
    fig.suptitle(title, fontsize=10)
    return save_figure(fig, out)
