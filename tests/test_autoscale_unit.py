"""benchmarks/autoscale.py without Ray: the fitted config, the step schedule and the reaction times it reports."""

from __future__ import annotations

from typing import Any

import pytest

from app.config import validate_serve_config
from app.served_model import ModelFiles
from benchmarks.autoscale import (
    DEPLOYMENTS,
    FITTED,
    NODES,
    autoscaler_view,
    per_second,
    prod_on_one_machine,
    reactions,
    schedule,
)
from benchmarks.load import Sample
from tests.conftest import load_config


def test_the_fitted_config_keeps_prods_policies_within_what_the_nodes_hold(model_files: ModelFiles) -> None:
    cfg = prod_on_one_machine(model_files, downscale_delay_s=30)
    validate_serve_config(cfg)
    prod = {d["name"]: d for d in load_config("prod.yaml")["applications"][0]["deployments"]}
    deployments = {d["name"]: d for d in cfg["applications"][0]["deployments"]}
    assert set(deployments) == set(DEPLOYMENTS)
    cpu = {"cpu_pool": NODES[0]["num_cpus"], "gpu": NODES[1]["num_cpus"]}
    gpus_used = 0.0
    for name, d in deployments.items():
        auto, theirs = d["autoscaling_config"], prod[name]["autoscaling_config"]
        assert (auto["min_replicas"], auto["max_replicas"]) == FITTED[name]
        assert auto["upscale_delay_s"] == theirs["upscale_delay_s"], name
        # the target keeps its ratio to what it is measured against, as that shrinks to fit
        if name.startswith("Classifier_"):  # prod: one group per batch slot
            assert theirs["target_ongoing_requests"] == prod[name]["user_config"]["max_concurrent_batches"], name
            assert auto["target_ongoing_requests"] == d["user_config"]["max_concurrent_batches"], name
        elif name == "Router":
            ratio = theirs["target_ongoing_requests"] / prod[name]["user_config"]["max_in_flight"]
            assert auto["target_ongoing_requests"] == round(ratio * d["user_config"]["max_in_flight"]), name
        else:
            assert auto["target_ongoing_requests"] == theirs["target_ongoing_requests"], name
        assert auto["downscale_delay_s"] == 30
        opts = d["ray_actor_options"]
        pool = "cpu_pool" if "cpu_pool" in (opts.get("resources") or {}) else "gpu"
        cpu[pool] -= opts["num_cpus"] * auto["max_replicas"]
        gpus_used += opts.get("num_gpus", 0) * auto["max_replicas"]
    assert min(cpu.values()) >= 0, cpu  # every replica at max_replicas has a place
    assert gpus_used <= NODES[1]["num_gpus"]


def test_fixed_replicas_pin_min_and_max(model_files: ModelFiles) -> None:
    cfg = prod_on_one_machine(model_files, fixed={"Preprocessor": 2})
    autos = {d["name"]: d["autoscaling_config"] for d in cfg["applications"][0]["deployments"]}
    assert (autos["Preprocessor"]["min_replicas"], autos["Preprocessor"]["max_replicas"]) == (2, 2)
    assert all((a["min_replicas"], a["max_replicas"]) == (1, 1) for n, a in autos.items() if n != "Preprocessor")


def test_the_schedule_lays_the_segments_end_to_end_at_their_rates() -> None:
    offsets = schedule([("steady", 10.0, 20.0), ("step", 40.0, 20.0), ("idle", 0.0, 5.0)])
    assert offsets == sorted(offsets) and offsets[-1] < 40.0
    first = sum(1 for t in offsets if t < 20.0)
    second = sum(1 for t in offsets if 20.0 <= t < 40.0)
    assert first == pytest.approx(200, rel=0.25) and second == pytest.approx(800, rel=0.15)


def test_per_second_counts_by_arrival_and_takes_latency_of_successes_only() -> None:
    samples = [Sample(0.1, 0.2, 200), Sample(0.5, 0.4, 200), Sample(0.9, 0.01, 503), Sample(1.5, 5.0, "timeout")]
    rows = per_second(samples, 2.0)
    assert rows[0] == {"t": 0, "sent": 3, "ok": 2, "shed_503": 1, "other": 0, "p50_ms": 300.0, "p99_ms": 398.0}
    assert rows[1]["other"] == 1 and rows[1]["p50_ms"] is None
    assert rows[2]["sent"] == 0


def row(t: float, **running: int) -> dict[str, Any]:
    return {"t": t, **{n: {"running": running.get(n, FITTED[n][0]), "starting": 0} for n in DEPLOYMENTS}}


def test_reactions_time_the_first_replica_added_in_the_step_and_the_last_removed_after_the_load() -> None:
    segments = [("steady", 5.0, 10.0), ("step", 20.0, 10.0), ("back", 5.0, 10.0)]
    # load from t=2: step 12..22, load ends at 32
    timeline = [row(t) for t in (3, 8, 12, 14)] + [row(17, Preprocessor=2), row(20, Preprocessor=3)]
    timeline += [row(33, Preprocessor=3), row(50, Preprocessor=2), row(60), row(61)]
    r = reactions(timeline, segments, load_t0=2.0)
    assert r["Preprocessor"] == {"before_step": 1, "peak": 3, "scale_up_s": 5.0, "back_to_min_s": 18.0}
    assert r["Router"] == {"before_step": 1, "peak": 1, "scale_up_s": None, "back_to_min_s": 0.0}


def test_a_deployment_still_above_its_minimum_at_the_end_has_no_time_back() -> None:
    segments = [("steady", 5.0, 10.0), ("step", 20.0, 10.0), ("back", 5.0, 10.0)]
    timeline = [row(1), row(15, Router=2), row(40, Router=2)]
    assert reactions(timeline, segments, load_t0=0.0)["Router"]["back_to_min_s"] is None


SCRAPE = """\
# HELP ray_serve_autoscaling_total_requests Total requests the autoscaler counts.
# TYPE ray_serve_autoscaling_total_requests gauge
ray_serve_autoscaling_total_requests{application="classifier",deployment="Router",SessionName="s"} 37.5
ray_serve_autoscaling_total_requests{application="other",deployment="Router",SessionName="s"} 99.0
# HELP ray_serve_autoscaling_desired_replicas Replicas the autoscaler wants.
# TYPE ray_serve_autoscaling_desired_replicas gauge
ray_serve_autoscaling_desired_replicas{application="classifier",deployment="Router",SessionName="s"} 2.0
ray_serve_autoscaling_desired_replicas{application="classifier",deployment="Preprocessor",SessionName="s"} 1.0
# HELP ray_serve_deployment_queued_queries Something else.
# TYPE ray_serve_deployment_queued_queries gauge
ray_serve_deployment_queued_queries{application="classifier",deployment="Router"} 5.0
"""


def test_the_autoscalers_view_is_read_from_a_scrape_for_this_application_only() -> None:
    assert autoscaler_view(SCRAPE) == {"Router": {"ongoing": 37.5, "desired": 2.0}, "Preprocessor": {"desired": 1.0}}
