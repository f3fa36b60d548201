"""Hostile load (the issue "Hostile load"): while a probe sends normal images, each attack class runs for a while
and the service must survive it.

configs/local.yaml on its own Ray instance and port (18300), driven by benchmarks.hostile_load (which also runs it
against any app on this machine for longer: `python -m benchmarks.hostile_load --url ... --attack all`). Each
attack class runs HOSTILE_LOAD_SECONDS (default 8 s, to keep CI lean; the issue's figure is 30 s) with the issue's
numbers of attackers: 16 clients, 200 slow-body connections, 200 connections trickling a head that never ends.
Per class, the "Done when": the probe's success
>= 99% (its p99 < 3 s too, but that speed figure is the benchmark's to judge, not asserted here); no replica killed
or replaced; the decoding replica's peak RSS under its idle RSS plus
Limits.preprocessor_memory_bytes (local.yaml decodes in the Router, which gets 300 MB more for what it holds
besides), every other replica within 300 MB of where the phase started; every answer to
an attack request a JSON 4xx or 503 (slow bodies: closed, or answered 400/408/413/503).

Marked `cluster` (it starts and stops its own Ray, like tests/test_cluster.py), so it runs in the second pytest
process of `make test`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import ray
from ray import serve

from app.config import Limits
from app.front.haproxy_config import Front
from app.serve.serve_internals import serve_client
from app.served_model import ModelFiles
from benchmarks import hostile_load
from benchmarks.procs import is_raylet, proc_table
from tests.conftest import APP_NAME, local_config, use_serve_env, wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

PORT = 18300
URL = f"http://127.0.0.1:{PORT}"
SECONDS = float(os.environ.get("HOSTILE_LOAD_SECONDS", "8"))


def own_raylet() -> int | None:
    """The raylet this test process started (ray.init's children), if /proc shows one."""
    table = proc_table()
    return next((pid for pid, p in table.items() if is_raylet(p) and p.ppid == os.getpid()), None)


def replica_actors() -> set[str]:
    """This Ray instance's live Serve replica actors, "<deployment>#<replica id>" (Ray's own view, beside the pids)."""
    prefix = f"SERVE_REPLICA::{APP_NAME}#"
    names = ray.util.list_named_actors(all_namespaces=True)
    return {n["name"][len(prefix) :] for n in names if n["name"].startswith(prefix)}


def deployments_healthy() -> bool:
    st = serve.status().applications.get(APP_NAME)
    if st is not None and st.status == "DEPLOY_FAILED":
        raise AssertionError(f"deploy failed: {st.message}")
    return st is not None and st.status == "RUNNING" and all(d.status == "HEALTHY" for d in st.deployments.values())


@pytest.fixture(scope="module")
def attacked(model_files: ModelFiles, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    if ray.is_initialized():
        serve.shutdown()
        ray.shutdown()
    # HAProxy in front, as make serve runs it; private HAProxy files and replica ports. In this process's environment
    # while Ray starts (its processes keep it), restored at once.
    with use_serve_env(PORT):
        # Logical CPUs above the 2 real cores: local.yaml's fractional shares must all fit (as tests/conftest.py).
        ray.init(num_cpus=6, include_dashboard=False, namespace="serve", log_to_driver=False)
    from ray.serve.schema import ServeDeploySchema

    cfg = local_config(model_files)
    cfg["http_options"]["port"] = PORT
    # The speed gate times FP32 beside INT8 at start: a CPU-minute on 2 cores that this test does not need.
    cfg["applications"][0]["args"].pop("speed_gate", None)
    serve.start(http_options={"host": "127.0.0.1", "port": PORT}, proxy_location="HeadOnly")
    client = serve_client()
    client.deploy_apps(ServeDeploySchema.model_validate({"applications": cfg["applications"]}))
    # Every replica constructed (warm-up and self-measurement done), then ready through HAProxy.
    wait_until(deployments_healthy, 240, 0.5, "every deployment HEALTHY")
    wait_until(lambda: httpx.get(URL + "/readyz", timeout=5).status_code == 200, 60, 0.5, "local app ready")
    jpeg = hostile_load.probe_images()[0]
    for _ in range(6):  # first requests pay one-off costs (handles, first batches): not the attack's doing
        r = httpx.post(URL + "/v1/classify", content=jpeg, headers={"Content-Type": "image/jpeg"}, timeout=30)
        assert r.status_code == 200, r.text
    router = httpx.get(URL + "/v1/models", timeout=10).json()["router_replica_id"]
    assert f"Router#{router}" in replica_actors(), (router, replica_actors())  # the app on PORT is ours
    target = hostile_load.attach(URL)
    if target.raylet_pid is None:  # found from the port's listener; else the raylet ray.init started here
        raylet = own_raylet()
        assert raylet is not None, target.notes
        target = hostile_load.attach(URL, raylet)
    decoder = hostile_load.decoder_of(URL)  # local.yaml: the Router decodes (decode_in: router)
    assert any(k.startswith(decoder + "[") for k in target.idle_mb), (decoder, target.idle_mb)
    limits = Limits.model_validate(cfg["applications"][0]["args"].get("limits", {}))
    settings = hostile_load.Settings(
        duration_s=SECONDS,
        clients=16,
        connections=200,
        preprocessor_memory_mb=limits.preprocessor_memory_bytes / hostile_load.MB,
        decoder=decoder,
    )
    state: dict[str, Any] = {"target": target, "settings": settings, "phases": []}
    yield state
    out = tmp_path_factory.mktemp("hostile_load") / "hostile_load.json"
    result = {"url": URL, "idle_mb": target.idle_mb, "settings": settings, "phases": state["phases"]}
    out.write_text(json.dumps(result, default=str, indent=1))
    if state["phases"]:
        print("\n" + hostile_load.summary_table(result) + hostile_load.memory_table(result) + f"(all figures: {out})")
    serve.shutdown()
    ray.shutdown()


def attack(state: dict[str, Any], name: str) -> dict[str, Any]:
    actors_before = replica_actors()
    phase = hostile_load.run_phase(state["target"], name, state["settings"])
    # The test's verdict is the benchmark's "Done when" but its one speed figure, the probe's p99 under
    # max_p99_s: judged by `python -m benchmarks.hostile_load` (exit 1), not here, where a shared 2-core runner
    # makes any latency bound a flake. Every behaviour stays: probe success >= min_success (normal requests
    # answered, none lost or timed out), every attack answer a JSON 4xx/503 (or an end), no replica replaced,
    # memory within its bounds. The benchmark's own verdict, p99 included, is printed beside it.
    phase["benchmark_failures"] = phase["failures"]
    phase["failures"] = hostile_load.phase_failures(phase, dataclasses.replace(state["settings"], max_p99_s=math.inf))
    actors_after = replica_actors()
    if actors_after != actors_before:  # Ray's view of the same question as the pids' and /v1/models'
        phase["failures"].append(f"replica actors changed: {sorted(actors_before)} -> {sorted(actors_after)}")
    state["phases"].append(phase)
    print(f"\n{name}: {hostile_load.phase_line(phase)}; the benchmark's verdict: {phase['benchmark_failures'] or 'ok'}")
    print(json.dumps({k: phase[k] for k in ("probe", "attack_summary", "replicas")}, indent=1, default=str))
    fields = ("idle_mb", "start_mb", "peak_mb", "limit_mb")
    print(json.dumps({k: {f: m.get(f) for f in fields} for k, m in phase["memory"].items()}))
    return phase


def test_memory_bombs_from_16_clients_are_refused_and_normal_requests_keep_flowing(attacked: dict[str, Any]) -> None:
    phase = attack(attacked, "bombs")
    by_kind = phase["attack_summary"]["by_kind"]
    # The bombs reached the decode budget, on /v1 and as V2 BYTES inputs alike (not only shed with 503s).
    for kind in ("tiff_v1", "png_v1", "tiff_v2", "png_v2"):
        assert any(k.startswith("413") for k in by_kind.get(kind, {})), by_kind
    assert not phase["failures"], phase["failures"]


def test_compressed_json_bombs_from_16_clients_are_refused_and_normal_requests_keep_flowing(
    attacked: dict[str, Any],
) -> None:
    phase = attack(attacked, "gzip")
    statuses = phase["attack_summary"]["statuses"]
    assert any(k.startswith(("400", "413")) for k in statuses), statuses  # refused as a request, not only shed
    assert not phase["failures"], phase["failures"]


def test_slow_bodies_on_200_connections_do_not_starve_normal_requests(attacked: dict[str, Any]) -> None:
    phase = attack(attacked, "slow")
    assert phase["attack_summary"]["opened"] >= 200, phase["attack_summary"]
    assert not phase["failures"], phase["failures"]


def test_trickled_heads_on_200_connections_do_not_starve_normal_requests(attacked: dict[str, Any]) -> None:
    """Slowloris: heads that never end. The front's `timeout http-request` ends each at head_timeout_s (HAProxy's
    408); none of them ever reaches a Router (the probe keeps its rate and latency)."""
    phase = attack(attacked, "slowhead")
    summary = phase["attack_summary"]
    assert summary["opened"] >= 200, summary
    if Front().head_timeout_s + 1 < SECONDS:
        # ended by the front's deadline, as a 408 (a few may still be connecting when it comes)
        assert sum(n for k, n in summary["statuses"].items() if k.startswith("408")) >= 180, summary
    assert not phase["failures"], phase["failures"]


def test_the_figures_are_written(attacked: dict[str, Any], tmp_path: Path) -> None:
    """The driver's own outputs from this run's phases: the table and the PNG (the CLI writes them to results/)."""
    if not attacked["phases"]:
        pytest.skip("no phase ran")
    result = {
        "url": URL,
        "idle_mb": attacked["target"].idle_mb,
        "settings": dataclasses.asdict(attacked["settings"]),
        "phases": attacked["phases"],
    }
    assert hostile_load.summary_table(result).count("\n") == 2 + len(attacked["phases"])
    assert hostile_load.plot(result, tmp_path / "hostile.png").stat().st_size > 10_000
