"""The service's dashboard twice from one definition: Grafana (PromQL) and matplotlib (from saved scrapes).

PANELS below is the only description of the panels. `grafana_dashboard()` turns it into PromQL
(k8s/monitoring/grafana-dashboard.json is its output, and a test keeps the file in step), and
`evaluate()` computes the same expressions over scrapes of Ray's metrics export taken every few seconds,
so a local run and a production Grafana show the same quantities:

- rate(x[w]) / increase: per raw series, the sum of its increases inside the window (a counter that drops
  is taken as reset), divided by the time between the window's first and last scrape. Prometheus also
  extrapolates to the window's edges; with scrapes every few seconds the difference is small.
- histogram_quantile: Prometheus's algorithm (linear interpolation inside the bucket, +Inf answers the
  highest finite bound, no observations answer nothing).

    python -m benchmarks.dashboard --metrics-url http://127.0.0.1:8280/metrics --every 5 --minutes 10 \\
        --out benchmarks/results/scrapes.json        # scrape while something else drives load; renders too
    python -m benchmarks.dashboard --render scrapes.json --out panels.png   # or a soak result JSON
    python -m benchmarks.dashboard --grafana k8s/monitoring/grafana-dashboard.json   # regenerate the JSON

benchmarks.soak records scrapes itself with --metrics-url and renders <result>-dashboard.png.
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import itertools
import json
import math
import re
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.report import pyplot

# --------------------------------------------------------------------------- the panels

RATE_WINDOW = "1m"  # request and error rates, batch size over time
QUANTILE_WINDOW = "5m"  # latency quantiles and agreement: more observations per point, steadier lines
APP = ("application", "=~", "$application")
VARIANT = ("variant", "=~", "$variant")
VARIABLES = ("application", "variant")  # Grafana template variables; "all" (.*) when rendering locally

Matcher = tuple[str, str, str]  # (label, one of = != =~ !~, value or $variable)


@dataclass(frozen=True)
class Query:
    """One PromQL expression of a fixed shape.

    kind:
      rate      sum by (by) (rate(metric{match}[window]))
      ratio     rate(metric{match + num}) / rate(metric{match + den}), both summed by (by)
      quantile  histogram_quantile(q, sum by (le, by) (rate(metric_bucket{match}[window])))
      mean      rate(metric_sum) / rate(metric_count), summed by (by)
      gauge     sum by (by) (metric{match})
      share     sum by (le, by) (increase(metric_bucket{match}[$__range])) / the same of metric_count: each bucket's
                cumulative share over the whole range (Grafana's heatmap format turns it into per-bucket shares)
    """

    kind: str
    metric: str
    by: tuple[str, ...]
    legend: str
    match: tuple[Matcher, ...] = (APP,)
    window: str = RATE_WINDOW
    q: float | None = None
    num: tuple[Matcher, ...] = ()
    den: tuple[Matcher, ...] = ()
    style: str = "-"  # matplotlib line style; Grafana dashes the same queries
    positive: bool = False  # keep only values > 0 (PromQL: `... > 0`), e.g. stale zero gauges
    # label_replace(x, target, "$1", source, regex) on the raw series before summing: (target, source, regex)
    relabel: tuple[str, str, str] | None = None

    def promql(self) -> str:
        expr = self._promql()
        return f"{expr} > 0" if self.positive else expr

    def _promql(self) -> str:
        by = ", ".join(self.by)
        if self.kind == "rate":
            return f"sum by ({by}) (rate({self.metric}{_sel(self.match)}[{self.window}]))"
        if self.kind == "ratio":
            num = f"sum by ({by}) (rate({self.metric}{_sel(self.match + self.num)}[{self.window}]))"
            den = f"sum by ({by}) (rate({self.metric}{_sel(self.match + self.den)}[{self.window}]))"
            return f"{num} / {den}"
        if self.kind == "quantile":
            inner = f"sum by (le, {by}) (rate({self.metric}_bucket{_sel(self.match)}[{self.window}]))"
            return f"histogram_quantile({self.q}, {inner})"
        if self.kind == "mean":
            part = "sum by ({by}) (rate({m}{sel}[{w}]))"
            num = part.format(by=by, m=self.metric + "_sum", sel=_sel(self.match), w=self.window)
            den = part.format(by=by, m=self.metric + "_count", sel=_sel(self.match), w=self.window)
            return f"{num} / {den}"
        if self.kind == "gauge":
            inner = f"{self.metric}{_sel(self.match)}"
            if self.relabel:
                target, source, regex = self.relabel
                inner = f'label_replace({inner}, "{target}", "$1", "{source}", "{regex}")'
            return f"sum by ({by}) ({inner})"
        if self.kind == "share":
            part = f"sum by (le, {by}) (increase({self.metric}_bucket{_sel(self.match)}[$__range]))"
            total = f"sum by ({by}) (increase({self.metric}_count{_sel(self.match)}[$__range]))"
            return f"{part} / ignoring(le) group_left {total}"
        raise ValueError(f"unknown query kind {self.kind!r}")

    def series_names(self) -> set[str]:
        """The exported series this query reads."""
        if self.kind == "quantile":
            return {self.metric + "_bucket"}
        if self.kind == "share":
            return {self.metric + "_bucket", self.metric + "_count"}
        if self.kind == "mean":
            return {self.metric + "_sum", self.metric + "_count"}
        return {self.metric}


@dataclass(frozen=True)
class Panel:
    title: str
    unit: str  # a Grafana unit id
    queries: tuple[Query, ...]
    kind: str = "timeseries"  # or "share": bars of a distribution over the whole range
    description: str = ""
    log_y: bool = False


def _stage_quantile(q: float) -> Query:
    return Query(
        "quantile",
        "ray_app_stage_latency_ms",
        ("stage", "variant"),
        "{{variant}} {{stage}}",
        (APP, VARIANT),
        QUANTILE_WINDOW,
        q=q,
    )


PANELS: tuple[Panel, ...] = (
    Panel(
        "Requests/s by variant and status",
        "reqps",
        (
            Query(
                "rate",
                "ray_app_requests_total",
                ("variant", "status"),
                "{{variant}} {{status}}",
                (APP, VARIANT),
            ),
        ),
        description="Every answer of the Router, counted once, by the variant that served it and the HTTP status.",
    ),
    Panel(
        "Errors/s: non-2xx by variant; error codes",
        "reqps",
        (
            Query(
                "rate",
                "ray_app_requests_total",
                ("variant", "status"),
                "{{variant}} {{status}}",
                (APP, VARIANT, ("status", "!~", "2..")),
            ),
            Query("rate", "ray_app_errors_total", ("code",), "code {{code}}", (APP,), style="--"),
        ),
        description="Non-2xx answers by variant and status, and error responses by their JSON error code.",
    ),
    Panel(
        "Latency p50 per stage and variant",
        "ms",
        (_stage_quantile(0.5),),
        description=f"histogram_quantile over rate(...[{QUANTILE_WINDOW}]) of the Router's per-stage histogram.",
        log_y=True,
    ),
    Panel(
        "Latency p99 per stage and variant",
        "ms",
        (_stage_quantile(0.99),),
        description=f"histogram_quantile over rate(...[{QUANTILE_WINDOW}]) of the Router's per-stage histogram.",
        log_y=True,
    ),
    Panel(
        "Batch size per variant: mean, p50, p99",
        "short",
        (
            Query("mean", "ray_app_batch_size", ("variant",), "{{variant}} mean", (APP, VARIANT)),
            Query("quantile", "ray_app_batch_size", ("variant",), "{{variant}} p50", (APP, VARIANT), q=0.5, style=":"),
            Query(
                "quantile", "ray_app_batch_size", ("variant",), "{{variant}} p99", (APP, VARIANT), q=0.99, style="--"
            ),
        ),
        description="Images per ONNX Runtime call (bucket bounds are powers of two, so quantiles are coarse).",
    ),
    Panel(
        "Batch size distribution over the time range",
        "percentunit",
        (Query("share", "ray_app_batch_size", ("variant",), "{{le}}", (APP, VARIANT)),),
        kind="share",
        description="Share of ONNX Runtime calls per batch-size bucket (upper bound), per variant.",
    ),
    Panel(
        "Shadow agreement rate (top-1)",
        "percentunit",
        (
            Query(
                "ratio",
                "ray_app_shadow_total",
                ("pair",),
                "{{pair}}",
                (APP,),
                QUANTILE_WINDOW,
                num=(("outcome", "=", "agree"),),
                den=(("outcome", "=~", "agree|disagree"),),
            ),
        ),
        description="agree / (agree + disagree) of shadow comparisons; dropped and failed shadows are not counted.",
    ),
    Panel(
        "Shadow comparisons/s by outcome",
        "reqps",
        (Query("rate", "ray_app_shadow_total", ("pair", "outcome"), "{{pair}} {{outcome}}"),),
        description="agree/disagree are compared images; dropped (too many shadows in flight) and failed are not.",
    ),
    Panel(
        "Replicas per deployment (healthy; autoscaling target dashed)",
        "short",
        (
            Query("gauge", "ray_serve_deployment_replica_healthy", ("deployment",), "{{deployment}} healthy"),
            Query(
                "gauge", "ray_serve_autoscaling_target_replicas", ("deployment",), "{{deployment}} target", style="--"
            ),
        ),
        description="Ray Serve's own gauges, exported by the controller.",
    ),
    Panel(
        "Serve replica memory (RSS per deployment and node)",
        "decmbytes",
        (
            Query(
                "gauge",
                "ray_component_rss_mb",
                ("deployment", "ip"),
                "{{deployment}} {{ip}}",
                (("Component", "=~", "ray::ServeReplica:($application):.*"),),
                positive=True,
                # The process title is "ray::ServeReplica:<app>:<deployment>", plus ".<method>" while one runs;
                # titles no longer current stay exported as 0, so summing per deployment counts each process once.
                relabel=("deployment", "Component", "ray::ServeReplica:[^:]+:([^.]+).*"),
            ),
        ),
        description="Ray's per-process memory gauge (by process title), summed over a node's replicas of a deployment.",
    ),
)


def _sel(match: Sequence[Matcher]) -> str:
    return "{" + ", ".join(f'{label}{op}"{value}"' for label, op, value in match) + "}" if match else ""


def metric_names(panels: Sequence[Panel] = PANELS) -> set[str]:
    """Every exported series (with suffixes such as _bucket) the panels read."""
    return {name for p in panels for q in p.queries for name in q.series_names()}


# --------------------------------------------------------------------------- scraping

SAMPLE_RE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>.*)\})?\s+(?P<value>\S+)(?:\s+\d+)?$")
LABEL_RE = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
# Labels Ray adds to every series that no panel groups by; dropping them keeps the scrapes small
# (ray_component_* keep Component: it is the process title there).
DROP_LABELS = frozenset(
    {
        "Component",
        "NodeAddress",
        "SessionName",
        "Version",
        "WorkerId",
        "otel_scope_name",
        "otel_scope_schema_url",
        "otel_scope_version",
    }
)

Sample = tuple[str, dict[str, str], float]


def parse_prometheus(text: str, keep: Iterable[str] | None = None) -> list[Sample]:
    """(name, labels, value) of each sample in Prometheus text format; only names in `keep` when given."""
    wanted = set(keep) if keep is not None else None
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = SAMPLE_RE.match(line)
        if not m or (wanted is not None and m["name"] not in wanted):
            continue
        try:
            value = float(m["value"])
        except ValueError:
            continue
        drop = DROP_LABELS - {"Component"} if m["name"].startswith("ray_component_") else DROP_LABELS
        labels = {k: v for k, v in LABEL_RE.findall(m["labels"] or "") if k not in drop}
        out.append((m["name"], labels, value))
    return out


def scrape(url: str, keep: Iterable[str] | None = None, timeout_s: float = 5.0) -> dict[str, Any]:
    """One scrape: {"t": unix time, "samples": [[name, labels, value], ...]} (samples empty on failure)."""
    import httpx

    t = time.time()
    try:
        text = httpx.get(url, timeout=timeout_s).text
    except httpx.HTTPError as e:
        return {"t": t, "samples": [], "error": f"{type(e).__name__}: {e}"}
    return {"t": t, "samples": [list(s) for s in parse_prometheus(text, keep if keep is not None else metric_names())]}


class Scraper:
    """Scrapes `url` every `every_s` seconds on a thread until stop(); the scrapes are in .scrapes."""

    def __init__(self, url: str, every_s: float = 5.0, keep: Iterable[str] | None = None) -> None:
        self.url, self.every_s = url, every_s
        self.keep = set(keep) if keep is not None else metric_names()
        self.scrapes: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="metrics-scraper", daemon=True)

    def _run(self) -> None:
        next_at = time.monotonic()
        while not self._stop.is_set():
            self.scrapes.append(scrape(self.url, self.keep))
            next_at += self.every_s
            self._stop.wait(max(0.0, next_at - time.monotonic()))

    def start(self) -> Scraper:
        self._thread.start()
        return self

    def stop(self) -> list[dict[str, Any]]:
        self._stop.set()
        self._thread.join(timeout=30)
        return self.scrapes


# --------------------------------------------------------------------------- evaluation

Labels = tuple[tuple[str, str], ...]
Series = dict[Labels, list[tuple[float, float]]]  # labels -> [(t, value)], t ascending


def window_seconds(window: str) -> float:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([smh])", window)
    if not m:
        raise ValueError(f"not a PromQL duration this renderer understands: {window!r}")
    return float(m[1]) * {"s": 1, "m": 60, "h": 3600}[m[2]]


def _matches(labels: dict[str, str], match: Sequence[Matcher], variables: dict[str, str]) -> bool:
    for label, op, raw in match:
        value = re.sub(r"\$(\w+)", lambda m: variables.get(m[1], ".*"), raw)
        have = labels.get(label, "")
        if op == "=":
            ok = have == value
        elif op == "!=":
            ok = have != value
        elif op == "=~":
            ok = re.fullmatch(value, have) is not None  # PromQL regexes are anchored
        elif op == "!~":
            ok = re.fullmatch(value, have) is None
        else:
            raise ValueError(f"unknown matcher {op!r}")
        if not ok:
            return False
    return True


def index(scrapes: Sequence[dict[str, Any]]) -> tuple[list[float], dict[str, Series]]:
    """Scrape times, and per metric name each series' (t, value) points."""
    times = []
    by_name: dict[str, Series] = defaultdict(lambda: defaultdict(list))
    for s in sorted(scrapes, key=lambda s: s["t"]):
        if not s["samples"]:
            continue  # a failed scrape is a gap, not zeros
        t = float(s["t"])
        times.append(t)
        for name, labels, value in s["samples"]:
            by_name[name][tuple(sorted(labels.items()))].append((t, float(value)))
    return times, by_name


def increase(points: Sequence[tuple[float, float]]) -> float:
    """How much a counter went up across `points`, a drop being a reset (the new value is all increase)."""
    total = 0.0
    for (_, a), (_, b) in itertools.pairwise(points):
        total += b - a if b >= a else b
    return total


def rate_at(points: Sequence[tuple[float, float]], t: float, window_s: float) -> float | None:
    """rate(x[window]) at t: increase over the points in (t - window, t] per second; None under two points."""
    lo = bisect.bisect_right(points, t - window_s, key=lambda p: p[0])
    hi = bisect.bisect_right(points, t, key=lambda p: p[0])
    inside = points[lo:hi]
    if len(inside) < 2 or inside[-1][0] <= inside[0][0]:
        return None
    return increase(inside) / (inside[-1][0] - inside[0][0])


def label_replace(labels: Labels, relabel: tuple[str, str, str] | None) -> Labels:
    """PromQL label_replace(x, target, "$1", source, regex): anchored regex; no match leaves the labels as they are."""
    if relabel is None:
        return labels
    target, source, regex = relabel
    d = dict(labels)
    m = re.fullmatch(regex, d.get(source, ""))
    if m is None:
        return labels
    d[target] = m.group(1)
    return tuple(sorted(d.items()))


def _group(labels: Labels, by: Sequence[str]) -> Labels:
    d = dict(labels)
    return tuple((k, d.get(k, "")) for k in by)


def summed_rates(
    series: Series, match: Sequence[Matcher], by: Sequence[str], t: float, window_s: float, variables: dict[str, str]
) -> dict[Labels, float]:
    """sum by (by) (rate(series{match}[window])) at t."""
    out: dict[Labels, float] = defaultdict(float)
    for labels, points in series.items():
        if not _matches(dict(labels), match, variables):
            continue
        r = rate_at(points, t, window_s)
        if r is not None:
            out[_group(labels, by)] += r
    return dict(out)


def _le(value: str) -> float:
    return math.inf if value in ("+Inf", "Inf", "inf") else float(value)


def histogram_quantile(q: float, buckets: Sequence[tuple[float, float]]) -> float | None:
    """Prometheus's histogram_quantile over (upper bound, cumulative count) pairs, +Inf included.

    None when there are no observations (Prometheus: no value) or no +Inf bucket; q outside [0, 1] gives
    -Inf/+Inf as in Prometheus.
    """
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    b = sorted(buckets)
    if len(b) < 2 or not math.isinf(b[-1][0]):
        return None
    counts = []
    running = 0.0
    for _, c in b:  # counts must not fall with le (Prometheus fixes such scrape skew the same way)
        running = max(running, c)
        counts.append(running)
    total = counts[-1]
    if total <= 0:
        return None
    rank = q * total
    i = next(i for i, c in enumerate(counts) if c >= rank)
    if i == len(b) - 1:
        return b[-2][0]  # in the +Inf bucket: the highest finite bound
    upper = b[i][0]
    lower = b[i - 1][0] if i > 0 else 0.0
    below = counts[i - 1] if i > 0 else 0.0
    if i == 0 and upper <= 0:
        return upper
    in_bucket = counts[i] - below
    if in_bucket <= 0:
        return upper
    return lower + (upper - lower) * (rank - below) / in_bucket


def _legend(template: str, labels: Labels) -> str:
    d = dict(labels)
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: d.get(m[1], ""), template).strip() or "value"


def evaluate(
    query: Query, scrapes: Sequence[dict[str, Any]], variables: dict[str, str] | None = None
) -> dict[str, list[tuple[float, float]]]:
    """A time-series query at every scrape: legend -> [(unix time, value)], like a Grafana range query."""
    variables = variables or {}
    times, data = index(scrapes)
    w = window_seconds(query.window)
    out: dict[str, list[tuple[float, float]]] = defaultdict(list)

    def put(group: Labels, t: float, value: float | None) -> None:
        if value is not None and math.isfinite(value) and (value > 0 or not query.positive):
            out[_legend(query.legend, group)].append((t, value))

    for t in times:
        if query.kind == "rate":
            rates = summed_rates(data.get(query.metric, {}), query.match, query.by, t, w, variables)
            for group, value in rates.items():
                put(group, t, value)
        elif query.kind in ("ratio", "mean"):
            if query.kind == "ratio":
                series = data.get(query.metric, {})
                num = summed_rates(series, query.match + query.num, query.by, t, w, variables)
                den = summed_rates(series, query.match + query.den, query.by, t, w, variables)
            else:
                num = summed_rates(data.get(query.metric + "_sum", {}), query.match, query.by, t, w, variables)
                den = summed_rates(data.get(query.metric + "_count", {}), query.match, query.by, t, w, variables)
            for group, d in den.items():
                if d > 0 and group in num:
                    put(group, t, num[group] / d)
        elif query.kind == "quantile":
            by = ("le", *query.by)
            buckets = summed_rates(data.get(query.metric + "_bucket", {}), query.match, by, t, w, variables)
            groups: dict[Labels, list[tuple[float, float]]] = defaultdict(list)
            for group, value in buckets.items():
                groups[group[1:]].append((_le(group[0][1]), value))
            assert query.q is not None
            for group, pairs in groups.items():
                put(group, t, histogram_quantile(query.q, pairs))
        elif query.kind == "gauge":
            sums: dict[Labels, float] = defaultdict(float)
            for labels, points in data.get(query.metric, {}).items():
                if _matches(dict(labels), query.match, variables):
                    i = bisect.bisect_right(points, t, key=lambda p: p[0])
                    if i and points[i - 1][0] == t:  # present in this scrape
                        sums[_group(label_replace(labels, query.relabel), query.by)] += points[i - 1][1]
            for group, value in sums.items():
                put(group, t, value)
        else:
            raise ValueError(f"{query.kind!r} is not a time-series query")
    return {k: sorted(v) for k, v in sorted(out.items())}


def distribution(
    query: Query, scrapes: Sequence[dict[str, Any]], variables: dict[str, str] | None = None
) -> dict[str, list[tuple[float, float]]]:
    """A 'share' query: per group, [(bucket upper bound, share of observations)] over the whole range."""
    variables = variables or {}
    _, data = index(scrapes)
    totals: dict[Labels, dict[float, float]] = defaultdict(lambda: defaultdict(float))
    for labels, points in data.get(query.metric + "_bucket", {}).items():
        d = dict(labels)
        if _matches(d, query.match, variables):
            totals[_group(labels, query.by)][_le(d.get("le", "+Inf"))] += increase(points)
    out = {}
    for group, cumulative in totals.items():
        bounds = sorted(cumulative)
        per_bucket, prev = [], 0.0
        for le in bounds:
            c = max(cumulative[le], prev)
            per_bucket.append((le, c - prev))
            prev = c
        total = sum(n for _, n in per_bucket)
        if total > 0:
            out[_legend("{{" + "}} {{".join(query.by) + "}}", group)] = [(le, n / total) for le, n in per_bucket]
    return dict(sorted(out.items()))


# --------------------------------------------------------------------------- matplotlib

UNIT_LABELS = {"reqps": "per second", "ms": "ms", "short": "", "percentunit": "share", "decmbytes": "MB"}


def render(
    scrapes: Sequence[dict[str, Any]],
    out: Path,
    title: str = "",
    variables: dict[str, str] | None = None,
    panels: Sequence[Panel] = PANELS,
) -> Path:
    """Every panel into one PNG, two per row, time in seconds since the first scrape."""
    plt = pyplot()
    ok = [s for s in scrapes if s.get("samples")]
    t0 = min((s["t"] for s in ok), default=0.0)
    cols = 2
    rows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(14, 3.6 * rows), squeeze=False)
    for ax, panel in zip(axes.flat, panels, strict=False):
        drawn = False
        if panel.kind == "share":
            dist = distribution(panel.queries[0], ok, variables)
            bounds = sorted({le for pts in dist.values() for le, _ in pts})
            width = 0.8 / max(1, len(dist))
            for i, (name, pts) in enumerate(dist.items()):
                shares = dict(pts)
                xs = [j + i * width for j in range(len(bounds))]
                ax.bar(xs, [shares.get(b, 0.0) for b in bounds], width=width, label=name)
                drawn = True
            ax.set_xticks(
                [j + width * (len(dist) - 1) / 2 for j in range(len(bounds))],
                ["+Inf" if math.isinf(b) else f"≤{b:g}" for b in bounds],
                fontsize=7,
            )
            ax.set_ylabel("share of batches")
        else:
            for query in panel.queries:
                for name, pts in evaluate(query, ok, variables).items():
                    ax.plot([t - t0 for t, _ in pts], [v for _, v in pts], query.style, label=name, linewidth=1.2)
                    drawn = True
            ax.set_xlabel("s since first scrape")
            ax.set_ylabel(UNIT_LABELS.get(panel.unit, panel.unit))
            if panel.log_y and drawn:
                ax.set_yscale("log")
            elif drawn:
                ax.set_ylim(bottom=0)
            if panel.unit == "percentunit" and drawn:
                ax.set_ylim(0, 1.02)
        ax.set_title(panel.title, fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
        if drawn:
            ax.legend(fontsize=6, ncol=2 if len(ax.get_legend_handles_labels()[0]) > 6 else 1)
        else:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes, color="grey")
    for ax in list(axes.flat)[len(panels) :]:
        ax.set_visible(False)
    span = (max(s["t"] for s in ok) - t0) if ok else 0
    fig.suptitle(f"{title} ({len(ok)} scrapes over {span:.0f} s; same queries as the Grafana dashboard)", fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.98))
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


# --------------------------------------------------------------------------- Grafana

DATASOURCE = {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}


def _variable(name: str, query: str) -> dict[str, Any]:
    return {
        "name": name,
        "label": name,
        "type": "query",
        "datasource": DATASOURCE,
        "definition": query,
        "query": query,
        "refresh": 2,  # on time range change
        "multi": True,
        "includeAll": True,
        "allValue": ".*",
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "sort": 1,
        "options": [],
    }


def _grafana_panel(panel: Panel, panel_id: int, x: int, y: int) -> dict[str, Any]:
    targets = []
    for i, query in enumerate(panel.queries):
        target = {"refId": chr(ord("A") + i), "datasource": DATASOURCE, "expr": query.promql()}
        if query.kind == "share":
            target.update(format="heatmap", instant=True, range=False, legendFormat="{{le}}")
        else:
            target.update(legendFormat=query.legend, range=True)
        targets.append(target)
    out: dict[str, Any] = {
        "id": panel_id,
        "title": panel.title,
        "description": panel.description,
        "datasource": DATASOURCE,
        "gridPos": {"h": 9, "w": 12, "x": x, "y": y},
        "targets": targets,
    }
    if panel.kind == "share":
        out.update(
            type="bargauge",
            repeat="variant",
            repeatDirection="h",
            maxPerRow=2,
            fieldConfig={"defaults": {"unit": panel.unit, "min": 0}, "overrides": []},
            options={
                "orientation": "vertical",
                "displayMode": "basic",
                "showUnfilled": False,
                "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            },
            title=panel.title + " ($variant)",
        )
    else:
        defaults: dict[str, Any] = {"unit": panel.unit, "custom": {"lineWidth": 1, "fillOpacity": 0}}
        if panel.log_y:
            defaults["custom"]["scaleDistribution"] = {"type": "log", "log": 10}
        if panel.unit == "percentunit":
            defaults.update(min=0, max=1)
        dashed = [
            {
                "matcher": {"id": "byFrameRefID", "options": t["refId"]},
                "properties": [{"id": "custom.lineStyle", "value": {"fill": "dash", "dash": [10, 10]}}],
            }
            for t, q in zip(targets, panel.queries, strict=True)
            if q.style != "-"
        ]
        out.update(
            type="timeseries",
            fieldConfig={"defaults": defaults, "overrides": dashed},
            options={
                "legend": {"displayMode": "table", "placement": "bottom", "calcs": ["mean", "max", "lastNotNull"]},
                "tooltip": {"mode": "multi", "sort": "desc"},
            },
        )
    return out


def grafana_dashboard(panels: Sequence[Panel] = PANELS) -> dict[str, Any]:
    """The Grafana dashboard (schemaVersion 39) for PANELS; the data source is the DS_PROMETHEUS variable."""
    grid = []
    for i, panel in enumerate(panels):
        grid.append(_grafana_panel(panel, i + 1, (i % 2) * 12, (i // 2) * 9))
    return {
        "title": "Image classifier on Ray Serve",
        "uid": "image-classifier-serve",
        "description": "Generated by `python -m benchmarks.dashboard --grafana`; benchmarks/dashboard.py renders the "
        "same queries locally from scrapes of Ray's metrics export.",
        "tags": ["ray-serve", "image-classifier"],
        "editable": True,
        "graphTooltip": 1,
        "schemaVersion": 39,
        "version": 1,
        "time": {"from": "now-1h", "to": "now"},
        "refresh": "30s",
        "timezone": "browser",
        "annotations": {"list": []},
        "links": [],
        "templating": {
            "list": [
                {
                    "name": "DS_PROMETHEUS",
                    "label": "Prometheus",
                    "type": "datasource",
                    "query": "prometheus",
                    "current": {},
                    "hide": 0,
                    "refresh": 1,
                    "options": [],
                },
                _variable("application", "label_values(ray_app_requests_total, application)"),
                _variable("variant", 'label_values(ray_app_requests_total{application=~"$application"}, variant)'),
            ]
        },
        "panels": grid,
    }


def grafana_json(panels: Sequence[Panel] = PANELS) -> str:
    return json.dumps(grafana_dashboard(panels), indent=2) + "\n"


# --------------------------------------------------------------------------- command line


def write_scrapes(path: Path, scrapes: Sequence[dict[str, Any]], title: str) -> Path:
    """A scrape file: {"title", "scrapes"}, compact (a 10-minute run at 5 s is ~5 MB)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps({"title": title, "scrapes": list(scrapes)}, separators=(",", ":")) + "\n")
    tmp.replace(path)
    return path


def load_scrapes(path: Path) -> tuple[list[dict[str, Any]], str]:
    """Scrapes from a scrape file, or from a soak result (which names its scrape file), and a title for them."""
    doc = json.loads(path.read_text())
    if isinstance(doc, list):
        return doc, path.name
    if "scrapes" not in doc and doc.get("scrapes_file"):
        scrapes, _ = load_scrapes(path.parent / doc["scrapes_file"])
        return scrapes, doc.get("title") or path.name
    return doc.get("scrapes", []), doc.get("title") or path.name


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--render", type=Path, help="scrapes JSON (or a soak result JSON) to render")
    parser.add_argument("--out", type=Path, help="PNG for --render; scrapes JSON when scraping")
    parser.add_argument("--metrics-url", help="scrape this Prometheus endpoint (loopback only)")
    parser.add_argument("--every", type=float, default=5.0, help="seconds between scrapes")
    parser.add_argument("--minutes", type=float, default=10.0, help="how long to scrape (Ctrl-C ends early)")
    parser.add_argument("--grafana", type=Path, help="write the Grafana dashboard JSON here")
    parser.add_argument("--application", default=".*", help="regex for $application when rendering")
    parser.add_argument("--variant", default=".*", help="regex for $variant when rendering")
    args = parser.parse_args(argv)
    variables = {"application": args.application, "variant": args.variant}
    if args.grafana:
        args.grafana.parent.mkdir(parents=True, exist_ok=True)
        args.grafana.write_text(grafana_json())
        print(f"wrote {args.grafana}")
    if args.render:
        scrapes, title = load_scrapes(args.render)
        out = render(scrapes, args.out or args.render.with_suffix(".png"), title, variables)
        print(f"wrote {out}")
    elif args.metrics_url:
        from benchmarks.environment import RESULTS_DIR, host_name, stamp
        from benchmarks.load import NonLoopbackURL, require_loopback

        try:
            require_loopback(args.metrics_url)
        except NonLoopbackURL as e:
            parser.exit(2, f"error: {e}\n")
        out = args.out or RESULTS_DIR / f"scrapes-{stamp()}-{host_name()}.json"
        scraper = Scraper(args.metrics_url, args.every).start()
        print(f"scraping {args.metrics_url} every {args.every:g} s for {args.minutes:g} min (Ctrl-C ends early)")
        with contextlib.suppress(KeyboardInterrupt):
            time.sleep(args.minutes * 60)
        scrapes = scraper.stop()
        write_scrapes(out, scrapes, f"scrapes of {args.metrics_url}")
        png = render(scrapes, out.with_suffix(".png"), f"scrapes of {args.metrics_url}", variables)
        print(f"wrote {out} and {png}")
    elif not args.grafana:
        parser.error("nothing to do: give --render, --metrics-url or --grafana")
    return 0


if __name__ == "__main__":
    sys.exit(main())
