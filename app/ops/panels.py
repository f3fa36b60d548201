"""The service's dashboard: one list of panels (title, unit, PromQL), drawn by Grafana and by the soak.

k8s/monitoring/grafana-dashboard.json is generated from PANELS (`python -m app.ops.panels --write`; a test keeps it
in step) and `python -m benchmarks.soak` draws the same expressions from a local Prometheus's query API.
Grafana's variables ($application, $model, $variant, $__range) are the only parts a local query fills in.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

GRAFANA = Path(__file__).resolve().parents[2] / "k8s" / "monitoring" / "grafana-dashboard.json"
APP = 'application=~"$application"'  # the rollout's and Serve's own metrics carry no model tag
MODEL = APP + ', model=~"$model"'  # the app's metrics carry the declared model's name (`app.serve.metrics`)
SEL = "{" + MODEL + ', variant=~"$variant"}'


@dataclass(frozen=True)
class Target:
    expr: str
    legend: str  # Grafana's legendFormat: {{label}} is the series' label value
    dashed: bool = False


@dataclass(frozen=True)
class Panel:
    title: str
    unit: str  # a Grafana unit id
    targets: tuple[Target, ...]
    description: str = ""
    log_y: bool = False
    share: bool = False  # bars of a distribution over the whole range (an instant query over $__range)


def _quantile(q: float, metric: str, by: str, window: str) -> str:
    return f"histogram_quantile({q}, sum by (le, {by}) (rate({metric}_bucket{SEL}[{window}])))"


def _rate(metric: str, by: str, sel: str = SEL, window: str = "1m") -> str:
    return f"sum by ({by}) (rate({metric}{sel}[{window}]))"


_STAGE = "{{variant}} {{stage}}"
_STAGE_HELP = "histogram_quantile over rate(...[5m]) of the Router's per-stage histogram."
_SHADOW = "ray_app_shadow_total{" + MODEL
_BATCH = "(increase(ray_app_batch_size_%s" + SEL + "[$__range]))"
PANELS: tuple[Panel, ...] = (
    Panel(
        "Requests/s by variant and status",
        "reqps",
        (Target(_rate("ray_app_requests_total", "variant, status"), "{{variant}} {{status}}"),),
        "Every answer of the Router, counted once, by the variant that served it and the HTTP status.",
    ),
    Panel(
        "Errors/s: non-2xx by variant; error codes",
        "reqps",
        (
            Target(
                _rate("ray_app_requests_total", "variant, status", SEL[:-1] + ', status!~"2.."}'),
                "{{variant}} {{status}}",
            ),
            Target(_rate("ray_app_errors_total", "code", "{" + MODEL + "}"), "code {{code}}", dashed=True),
        ),
        "Non-2xx answers by variant and status, and error responses by their JSON error code.",
    ),
    *(
        Panel(
            f"Latency p{round(q * 100)} per stage and variant",
            "ms",
            (Target(_quantile(q, "ray_app_stage_latency_ms", "stage, variant", "5m"), _STAGE),),
            _STAGE_HELP,
            log_y=True,
        )
        for q in (0.5, 0.99)
    ),
    Panel(
        "Batch size per variant: mean, p50, p99",
        "short",
        (
            Target(
                f"{_rate('ray_app_batch_images_total', 'variant')} / {_rate('ray_app_batches_total', 'variant')}",
                "{{variant}} mean",
            ),
            Target(_quantile(0.5, "ray_app_batch_size", "variant", "1m"), "{{variant}} p50", dashed=True),
            Target(_quantile(0.99, "ray_app_batch_size", "variant", "1m"), "{{variant}} p99", dashed=True),
        ),
        "Images per ONNX Runtime call (bucket bounds are powers of two, so quantiles are coarse).",
    ),
    Panel(
        "Batch size distribution over the time range",
        "percentunit",
        (
            Target(
                f"sum by (le, variant) {_BATCH % 'bucket'} / ignoring(le) group_left "
                f"sum by (variant) {_BATCH % 'count'}",
                "{{le}}",
            ),
        ),
        "Share of ONNX Runtime calls per batch-size bucket (upper bound), per variant.",
        share=True,
    ),
    Panel(
        "Shadow agreement rate (top-1)",
        "percentunit",
        (
            Target(
                f'sum by (pair) (rate({_SHADOW}, outcome="agree"}}[5m])) / '
                f'sum by (pair) (rate({_SHADOW}, outcome=~"agree|disagree"}}[5m]))',
                "{{pair}}",
            ),
        ),
        "agree / (agree + disagree) of shadow comparisons; dropped and failed shadows are not counted.",
    ),
    Panel(
        "Shadow comparisons/s by outcome",
        "reqps",
        (Target(_rate("ray_app_shadow_total", "pair, outcome", "{" + MODEL + "}"), "{{pair}} {{outcome}}"),),
        "agree/disagree are compared images; dropped (too many shadows in flight) and failed are not.",
    ),
    Panel(
        "Rollout: candidate weight and agreement bounds (%)",
        "percent",
        (
            Target(f"max(ray_app_rollout_candidate_weight{{{APP}}})", "candidate weight"),
            Target(f"100 * max by (end) (ray_app_rollout_agreement_bound{{{APP}}})", "agreement {{end}} bound"),
            Target(
                f"25 * max(ray_app_rollout_state{{{APP}}})",
                "state x25 (1 running, 2 promoted, 3 rolled back)",
                dashed=True,
            ),
        ),
        "The rollout controller (POST /v1/rollout): the candidate's weight now, the anytime-valid 95% bounds of its "
        "top-1 agreement in the current step, and its state.",
    ),
    Panel(
        "Replicas per deployment (healthy; autoscaling target dashed)",
        "short",
        (
            Target(f"sum by (deployment) (ray_serve_deployment_replica_healthy{{{APP}}})", "{{deployment}} healthy"),
            Target(
                f"sum by (deployment) (ray_serve_autoscaling_target_replicas{{{APP}}})",
                "{{deployment}} target",
                dashed=True,
            ),
        ),
        "Ray Serve's own gauges, exported by the controller.",
    ),
    Panel(
        "Serve replica memory (RSS per deployment and node)",
        "decmbytes",
        (
            # The process title is "ray::ServeReplica:<app>:<deployment>", plus ".<method>" while one runs;
            # titles no longer current stay exported as 0, so `> 0` counts each process once.
            Target(
                'sum by (deployment, ip) (label_replace(ray_component_rss_mb{Component=~"ray::ServeReplica:'
                '($application):.*"}, "deployment", "$1", "Component", "ray::ServeReplica:[^:]+:([^.]+).*")) > 0',
                "{{deployment}} {{ip}}",
            ),
        ),
        "Ray's per-process memory gauge (by process title), summed over a node's replicas of a deployment.",
    ),
)

# --------------------------------------------------------------------------- Grafana

DATASOURCE = {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}


def _variable(name: str, query: str) -> dict[str, Any]:
    current = {"selected": True, "text": ["All"], "value": ["$__all"]}
    return {"name": name, "label": name, "type": "query", "datasource": DATASOURCE, "definition": query} | {
        "query": query, "refresh": 2, "multi": True, "includeAll": True, "allValue": ".*", "current": current,
        "sort": 1, "options": [],
    }  # fmt: skip


def _grafana_panel(panel: Panel, i: int) -> dict[str, Any]:
    targets: list[dict[str, Any]] = []
    for t in panel.targets:
        target: dict[str, Any] = {"refId": chr(ord("A") + len(targets)), "datasource": DATASOURCE, "expr": t.expr}
        if panel.share:
            target |= {"format": "heatmap", "instant": True, "range": False, "legendFormat": t.legend}
        else:
            target |= {"legendFormat": t.legend, "range": True}
        targets.append(target)
    out: dict[str, Any] = {"id": i + 1, "title": panel.title, "description": panel.description}
    out |= {"datasource": DATASOURCE, "gridPos": {"h": 9, "w": 12, "x": (i % 2) * 12, "y": (i // 2) * 9}}
    out["targets"] = targets
    if panel.share:
        reduce = {"calcs": ["lastNotNull"], "fields": "", "values": False}
        return out | {
            "type": "bargauge", "repeat": "variant", "repeatDirection": "h", "maxPerRow": 2,
            "fieldConfig": {"defaults": {"unit": panel.unit, "min": 0}, "overrides": []},
            "options": {"orientation": "vertical", "displayMode": "basic", "showUnfilled": False,
                        "reduceOptions": reduce},
            "title": panel.title + " ($variant)",
        }  # fmt: skip
    defaults: dict[str, Any] = {"unit": panel.unit, "custom": {"lineWidth": 1, "fillOpacity": 0}}
    if panel.log_y:
        defaults["custom"]["scaleDistribution"] = {"type": "log", "log": 10}
    if panel.unit == "percentunit":
        defaults |= {"min": 0, "max": 1}
    dash = [{"id": "custom.lineStyle", "value": {"fill": "dash", "dash": [10, 10]}}]
    dashed = [
        {"matcher": {"id": "byFrameRefID", "options": g["refId"]}, "properties": dash}
        for g, t in zip(targets, panel.targets, strict=True)
        if t.dashed
    ]
    legend = {"displayMode": "table", "placement": "bottom", "calcs": ["mean", "max", "lastNotNull"]}
    return out | {
        "type": "timeseries",
        "fieldConfig": {"defaults": defaults, "overrides": dashed},
        "options": {"legend": legend, "tooltip": {"mode": "multi", "sort": "desc"}},
    }


def grafana_json(panels: tuple[Panel, ...] = PANELS) -> str:
    """The Grafana dashboard (schemaVersion 39) for PANELS; the data source is the DS_PROMETHEUS variable."""
    datasource = {"name": "DS_PROMETHEUS", "label": "Prometheus", "type": "datasource", "query": "prometheus"}
    doc = {
        "title": "Image classifier on Ray Serve: $model",
        "uid": "image-classifier-serve",
        "description": "Generated by `python -m app.ops.panels --write` from app/ops/panels.py; "
        "`python -m benchmarks.soak` draws the same queries from a local Prometheus.",
        "tags": ["ray-serve", "image-classifier"],
        "editable": True, "graphTooltip": 1, "schemaVersion": 39, "version": 1,
        "time": {"from": "now-1h", "to": "now"}, "refresh": "30s", "timezone": "browser",
        "annotations": {"list": []}, "links": [],
        "templating": {"list": [
            datasource | {"current": {}, "hide": 0, "refresh": 1, "options": []},
            _variable("application", "label_values(ray_app_requests_total, application)"),
            _variable("model", 'label_values(ray_app_requests_total{application=~"$application"}, model)'),
            _variable("variant", "label_values(ray_app_requests_total{" + MODEL + "}, variant)"),
        ]},
        "panels": [_grafana_panel(p, i) for i, p in enumerate(panels)],
    }  # fmt: skip
    return json.dumps(doc, indent=2) + "\n"


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        GRAFANA.write_text(grafana_json())
        print(f"wrote {GRAFANA}")
    elif not sys.argv[1:]:
        sys.stdout.write(grafana_json())
    else:
        sys.exit("usage: python -m app.ops.panels [--write]  (the dashboard JSON to stdout, or into k8s/monitoring)")
