"""configs/prod.yaml on a local multi-node cluster: a head with no CPUs, a CPU node advertising
`cpu_pool`, and a node that declares one GPU.

No real GPU exists here. The GPU node only *declares* `num_gpus=1` (a Ray resource, not a
device), so this checks placement and what a replica does when it was granted a GPU that
ONNX Runtime cannot use: it must fall back to CPU and say so, or refuse to start with
`require_gpu`. The head keeps the GCS's tables in a real Redis (GCS fault tolerance, as the RayService
does), and one test kills the GCS under load, with a rollout running. Run separately from the session
cluster: `pytest -m cluster`.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import copy
import functools
import json
import random
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import numpy as np
import pytest
import ray
from ray import serve
from ray.cluster_utils import Cluster

from app.front.haproxy_config import REFUSAL
from app.imaging.opencv import cv2
from app.serve.serve_internals import serve_client
from app.served_model import ModelFiles
from app.toolchain.samples import sample_bytes
from benchmarks.autoscale import prod_on_one_machine, replica_counts
from benchmarks.stats import percentile
from tests.conftest import driver_handle, use_serve_env, wait_until
from tests.hostile import cv_encode, jpeg_with_size, pattern_image
from tests.redis_server import Redis, redis_server

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

PORT = 18100
URL = f"http://127.0.0.1:{PORT}"
IMAGE = sample_bytes("chelsea")


@pytest.fixture(scope="module")
def cluster(model_files: ModelFiles, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    if ray.is_initialized():
        serve.shutdown()
        ray.shutdown()
    # configs/serve.env for this module's Ray: every node's processes inherit it (nodes are added in tests too); this
    # process's environment is restored once the module is done.
    with (
        use_serve_env(PORT),
        redis_server(tmp_path_factory.mktemp("redis")) as redis,
        pytest.MonkeyPatch.context() as env,
    ):
        # GCS fault tolerance, as the RayService runs it: the head's GCS keeps its tables in Redis (RAY_REDIS_ADDRESS
        # is read when the head node starts), so a restarted GCS finds the cluster, its actors and Serve's state.
        env.setenv("RAY_REDIS_ADDRESS", redis.address)
        c = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "redis_password": redis.password})
        env.delenv("RAY_REDIS_ADDRESS")
        yield from _serving(c, model_files, redis)


def _serving(c: Cluster, model_files: ModelFiles, redis: Redis) -> Iterator[dict[str, Any]]:
    cpu = c.add_node(num_cpus=4, resources={"cpu_pool": 100})
    gpu = c.add_node(num_cpus=2, num_gpus=1)
    ray.init(address=c.address, namespace="serve", log_to_driver=False)
    serve.start(http_options={"host": "127.0.0.1", "port": PORT}, proxy_location="HeadOnly")
    client = serve_client()
    cfg = prod_on_one_machine(model_files, fixed={"Preprocessor": 2})
    deploy(cfg, client)
    wait_until(lambda: httpx.get(URL + "/readyz", timeout=5).status_code == 200, 240, 0.5, "prod app ready")
    yield {"cluster": c, "cpu": cpu, "gpu": gpu, "client": client, "cfg": cfg, "redis": redis}
    serve.shutdown()
    ray.shutdown()
    c.shutdown()


def node_ids_of(deployment: str, calls: int = 24) -> set[str]:
    handle = driver_handle(deployment)
    return {handle.describe.remote().result(timeout_s=30)["node_id"] for _ in range(calls)}


def test_classifiers_land_on_the_gpu_node_and_cpu_work_does_not(cluster: dict[str, Any]) -> None:
    gpu_id, cpu_id = cluster["gpu"].node_id, cluster["cpu"].node_id
    assert node_ids_of("Classifier_int8") == {gpu_id}
    assert node_ids_of("Classifier_fp32") == {gpu_id}
    assert node_ids_of("Preprocessor") == {cpu_id}


def test_a_granted_gpu_that_onnx_runtime_cannot_use_is_reported_as_cpu_fallback(cluster: dict[str, Any]) -> None:
    models = httpx.get(URL + "/v1/models", timeout=10).json()["variants"]
    for v in models.values():
        # ONNX Runtime lists the TensorRT and CUDA providers (built into the wheel), but their libraries do
        # not load here: the plan says so and serves on a CPU engine rather than failing at the first batch.
        assert v["gpu_granted"] is True and v["on_gpu"] is False
        assert v["fell_back_to_cpu"] is True and "no GPU execution provider is usable" in v["plan_note"]
        assert v["engine"] in ("openvino", "cpu")


def test_prod_config_serves_end_to_end(cluster: dict[str, Any]) -> None:
    # prod.yaml refuses the override header, so the weights (5% int8) decide.
    r = httpx.post(
        URL + "/v1/classify",
        content=sample_bytes("rocket"),
        headers={"Content-Type": "image/jpeg", "X-Model-Variant": "int8"},
        timeout=30,
    )
    assert r.status_code == 403
    r = httpx.post(
        URL + "/v1/classify", content=sample_bytes("rocket"), headers={"Content-Type": "image/jpeg"}, timeout=30
    )
    assert r.status_code == 200, r.text
    assert r.json()["predictions"][0]["class_id"] == 657  # missile, by either variant


# --------------------------------------------------------------------------- faults


@dataclass
class Outcome:
    t: float  # seconds since the run started
    status: int
    latency: float
    code: str
    retry_after: str | None
    failover: bool
    message: str = ""  # an error's message: who refused it, and why


# What an answer that ran into a timeout looks like: Serve's request_timeout_s (408), the front's server timeout
# (504), or the client's own (aiohttp's ClientTimeout: no answer at all).
def timed_out(o: Outcome) -> bool:
    return o.status in (408, 504) or (o.status == 0 and "Timeout" in o.code)


# The load generator is aiohttp, not httpx: at several hundred requests/s on two shared cores,
# httpx's own per-request CPU and its connection-pool queue would be measured instead of the server.
def _session(connections: int = 64) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(
        URL,
        connector=aiohttp.TCPConnector(limit=connections),
        timeout=aiohttp.ClientTimeout(total=30),
    )


async def _one(client: aiohttp.ClientSession, t0: float, out: list[Outcome], start: float | None = None) -> None:
    """One classify request; latency from `start` (its scheduled time, if given) to the last byte."""
    start = time.perf_counter() if start is None else start
    try:
        async with client.post("/v1/classify", data=IMAGE, headers={"Content-Type": "image/png"}) as r:
            raw = await r.read()
            status = r.status
            body = json.loads(raw) if r.headers.get("content-type", "").startswith("application/json") else {}
            error = body.get("error", {}) if status != 200 else {}
            out.append(
                Outcome(
                    start - t0,
                    status,
                    time.perf_counter() - start,
                    error.get("code", ""),
                    r.headers.get("retry-after"),
                    bool(body.get("failover")),
                    error.get("message", ""),
                )
            )
    except (aiohttp.ClientError, asyncio.TimeoutError) as e:
        out.append(Outcome(start - t0, 0, time.perf_counter() - start, type(e).__name__, None, False))


async def closed_loop(
    seconds: float, concurrency: int, out: list[Outcome], stop: threading.Event | None = None
) -> None:
    """`concurrency` clients sending one request after another for `seconds`, or until `stop` is set."""
    t0 = time.perf_counter()
    async with _session(concurrency) as client:

        async def worker() -> None:
            while time.perf_counter() - t0 < seconds and not (stop is not None and stop.is_set()):
                await _one(client, t0, out)

        await asyncio.gather(*(worker() for _ in range(concurrency)))


async def open_loop(rate: float, seconds: float, out: list[Outcome]) -> None:
    """Poisson arrivals at `rate`/s for `seconds`, whatever the server does (bounded count).

    Latency counts from each request's scheduled time, so a client falling behind its schedule shows
    up as latency instead of hiding it; the connection limit is far above what a healthy server needs.
    """
    rng = random.Random(11)
    t0 = time.perf_counter()
    async with _session(2000) as client:
        tasks, next_at = [], 0.0
        while next_at < seconds and len(tasks) < int(rate * seconds * 2):
            delay = t0 + next_at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)  # the arrival schedule, not synchronisation
            tasks.append(asyncio.create_task(_one(client, t0, out, t0 + next_at)))
            next_at += rng.expovariate(rate)
        await asyncio.gather(*tasks)


def in_thread(coro_fn: Any, *args: Any) -> threading.Thread:
    th = threading.Thread(target=lambda: asyncio.run(coro_fn(*args)), daemon=True)
    th.start()
    return th


def replica_of(deployment: str) -> str:
    handle = driver_handle(deployment)
    return handle.describe.remote().result(timeout_s=60)["replica_id"]


def kill_replica(deployment: str, replica_id: str) -> None:
    actor = ray.get_actor(f"SERVE_REPLICA::classifier#{deployment}#{replica_id}", namespace="serve")
    ray.kill(actor, no_restart=True)


def replica_rss_mb() -> dict[str, float]:
    """Resident memory of every Serve replica process on this machine, by process title."""
    out = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            title = (proc / "cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
            if title.startswith("ray::ServeReplica"):
                rss = next(line for line in (proc / "status").read_text().splitlines() if line.startswith("VmRSS"))
                out[f"{title}#{proc.name}"] = int(rss.split()[1]) / 1024
        except (OSError, StopIteration):
            continue
    return out


def test_a_classifier_replica_killed_under_load_is_replaced_and_requests_survive(cluster: dict[str, Any]) -> None:
    old = replica_of("Classifier_fp32")
    out: list[Outcome] = []
    load = in_thread(closed_loop, 25.0, 4, out)
    wait_until(lambda: len(out) >= 20, 30, 0.2, "steady load running")
    killed_at = time.monotonic()
    kill_replica("Classifier_fp32", old)
    # Replaced: the event waited for (its deadline a polling timeout; how soon is Serve's, on this machine's cores).
    new = wait_until(lambda: (r := replica_of("Classifier_fp32")) != old and r, 60, 0.5, "replacement replica")
    replaced_while_loaded = load.is_alive()
    load.join(60)
    ok = sum(o.status == 200 for o in out)
    t_kill = killed_at - (time.monotonic() - time.perf_counter()) - out[0].t  # roughly, on the load's clock
    failed = [(round(o.t, 2), round(o.latency, 2), o.code) for o in out if o.status != 200]
    assert ok / len(out) >= 0.99, (collections.Counter((o.status, o.code) for o in out), failed, t_kill)
    assert not [o for o in out if timed_out(o)], failed  # every request answered, none left to a timeout
    assert new != old and replaced_while_loaded
    # while fp32 was down, its share was served by int8 and said so
    assert any(o.failover for o in out)


def test_losing_the_gpu_node_gives_fast_503s_and_a_new_gpu_node_recovers(cluster: dict[str, Any]) -> None:
    c: Cluster = cluster["cluster"]
    c.remove_node(cluster["gpu"])
    # Every Classifier is gone with the node: once the Router notices, it refuses at once, a JSON 503 saying no
    # replica is there (variant_unavailable), instead of sending the request on and waiting out its deadline
    # (inference_timeout): no request is held for a replica that does not exist.
    probe = wait_until(lambda: (o := asyncio.run(_probe())).status == 503 and o, 60, 0.5, "503 after node loss")
    wait_until(lambda: asyncio.run(_probe()).code == "variant_unavailable", 60, 0.5, f"the Router noticing: {probe}")
    out: list[Outcome] = []
    asyncio.run(closed_loop(5.0, 4, out))
    assert {(o.status, o.code) for o in out} == {(503, "variant_unavailable")}, collections.Counter(
        (o.status, o.code) for o in out
    )
    assert all(o.retry_after for o in out)
    # A new GPU node joins: Serve places the pending replicas there, no redeploy.
    # Ray's local test cluster once lost a freshly added raylet to a silent kill 2 s after it registered (a CI run;
    # its dashboard agent logged "Raylet is terminated. Termination is unexpected", raylet.err stayed empty, no OOM).
    # That is the harness's node, not the app: such a node is replaced once, and the app must recover on the next.
    for attempt in (1, 2):
        cluster["gpu"] = node = c.add_node(num_cpus=2, num_gpus=1)
        wait_until(functools.partial(_served_or_dead, node.node_id), 180, 1.0, "recovery on the new GPU node")
        if node_alive(node.node_id):
            break
        print(f"the new GPU node's raylet died on attempt {attempt}; adding another")
        c.remove_node(node, allow_graceful=False)
    assert asyncio.run(_probe()).status == 200
    assert node_ids_of("Classifier_fp32", 6) == {cluster["gpu"].node_id}


def _served_or_dead(node_id: str) -> bool:
    return not node_alive(node_id) or asyncio.run(_probe()).status == 200


def node_alive(node_id: str) -> bool:
    return any(n["NodeID"] == node_id and n["Alive"] for n in ray.nodes())


async def _probe() -> Outcome:
    out: list[Outcome] = []
    async with _session(1) as client:
        await _one(client, time.perf_counter(), out)
    return out[0]


def test_overload_at_four_times_capacity_sheds_in_the_fronts_time_and_stays_healthy(cluster: dict[str, Any]) -> None:
    wait_until(lambda: httpx.get(URL + "/readyz", timeout=5).status_code == 200, 120, 1.0, "ready")
    sat: list[Outcome] = []
    asyncio.run(closed_loop(6.0, 16, sat))
    capacity = sum(o.status == 200 for o in sat if o.t > 1.0) / 5.0  # req/s, saturated, after 1 s of warm-up
    assert capacity > 0, collections.Counter((o.status, o.code) for o in sat)  # the load's size: 4x this
    memory_before = sum(replica_rss_mb().values())
    out: list[Outcome] = []
    asyncio.run(open_loop(4 * capacity, 20.0, out))
    by = collections.Counter((o.status, o.code) for o in out)
    shed = [o.latency for o in out if o.status == 503]
    served = [o.latency for o in out if o.status == 200]
    print(f"capacity {capacity:.1f} req/s, sent {len(out)}: {dict(by)}")
    if shed and served:
        print(f"503 s: p50 {percentile(shed, 50):.3f} p99 {percentile(shed, 99):.3f} max {max(shed):.3f}")
        print(f"200 s: p50 {percentile(served, 50):.3f} p99 {percentile(served, 99):.3f} max {max(served):.3f}")
    # Only served requests and the documented 503 overloaded: no dropped connection, no other 5xx, and no
    # inference_timeout: nothing admitted was held past the Router's deadline.
    assert set(by) <= {(200, ""), (503, "overloaded")}, by
    assert by[(503, "overloaded")] > 0 and by[(200, "")] > 0, by
    assert all(o.retry_after == "1" for o in out if o.status == 503)
    assert not [o for o in out if timed_out(o)]  # every request answered, none left to Serve's request timeout
    # Every refusal is admission's, before the deadline: with the admission front (configs/serve.env,
    # docs/reliability.md "Overload") the excess waits in HAProxy's queue, at no CPU, and what no Router took within
    # APP_FRONT_QUEUE_TIMEOUT_S is refused then, by HAProxy (its `timeout queue`: tests/test_front_unit.py); a Router
    # refuses what it cannot serve in time at arrival, or at its queue's wait budget (max_queue_wait_s, under the
    # deadline). None is an inference_timeout (above): nothing was refused at or past its deadline. How the refusals
    # split between the two depends on the machine's speed, so only printed. (Behind the front, below its limit, the
    # Router's own admission and paced refusals are tested in tests/test_hostile_http.py.)
    refusers = collections.Counter("front" if o.message == REFUSAL else "router" for o in out if o.status == 503)
    print(f"503s by refuser: {dict(refusers)}")
    # ...while accepted requests keep flowing: in every 2 s of the (seeded) arrival schedule, some were served.
    starved = [w for w in range(0, 20, 2) if not any(o.status == 200 for o in out if w <= o.t < w + 2)]
    assert not starved, (starved, by)
    memory_after = sum(replica_rss_mb().values())
    assert memory_after - memory_before < 300, (memory_before, memory_after)  # queues are bounded
    assert httpx.get(URL + "/readyz", timeout=10).status_code == 200
    assert asyncio.run(_probe()).status == 200


# --------------------------------------------------------------------------- autoscaling


def app_running() -> bool:
    return bool(serve.status().applications["classifier"].status == "RUNNING")


def running_replicas(deployment: str) -> int:
    return replica_counts(serve.status().applications["classifier"].deployments[deployment])["running"]


def deploy(cfg: dict[str, Any], client: Any) -> None:
    from ray.serve.schema import ServeDeploySchema

    client.deploy_apps(ServeDeploySchema.model_validate({"applications": cfg["applications"]}))


def test_sustained_load_adds_a_router_within_the_upscale_delay_and_idleness_removes_it(
    cluster: dict[str, Any],
) -> None:
    """prod.yaml's Router policy, its delays and look-back shortened to fit a test: the controller adds an ingress
    replica (HAProxy learns of it) while the load lasts and removes it once the load has been gone for
    downscale_delay_s; no request is lost while the ingress changes under it."""
    wait_until(lambda: httpx.get(URL + "/readyz", timeout=5).status_code == 200, 120, 1.0, "ready")
    cfg = copy.deepcopy(cluster["cfg"])
    router = next(d for d in cfg["applications"][0]["deployments"] if d["name"] == "Router")
    policy = {"min_replicas": 1, "max_replicas": 2, "target_ongoing_requests": 4, "look_back_period_s": 2.0}
    policy |= {"upscale_delay_s": 3.0, "downscale_delay_s": 8.0}
    router["autoscaling_config"] = dict(router["autoscaling_config"], **policy)
    deploy(cfg, cluster["client"])  # an autoscaling_config change is applied in place: no replica restarts
    try:
        wait_until(lambda: running_replicas("Router") == 1, 60, 0.5, "one Router while idle")

        # The policy the controller runs is the test's, delays included (how long it waits is Serve's to keep): an
        # event waited for, as the controller applies a config after deploy_apps returns.
        running: dict[str, Any] = {}

        def applied() -> bool:
            router = serve_client().get_serve_details()["applications"]["classifier"]["deployments"]["Router"]
            running.clear()
            running.update(router["deployment_config"]["autoscaling_config"])
            return policy.items() <= running.items()

        try:
            wait_until(applied, 60, 0.5, "the test's autoscaling policy applied")
        except AssertionError as e:
            raise AssertionError(f"{e}; the controller runs {running}") from None
        out: list[Outcome] = []
        stop = threading.Event()
        load = in_thread(closed_loop, 150.0, 16, out, stop)  # 16 in flight: 4x the target on one replica, till stopped
        try:
            up = wait_until(lambda: (n := running_replicas("Router")) > 1 and n, 90, 0.25, "scale-up under load")
            under_load = []  # the Routers running while the load goes on: kept, not removed under it
            for _ in range(8):
                under_load.append(running_replicas("Router"))
                load.join(0.5)  # the sampling interval
            assert load.is_alive(), "the load ended before the Router was added and sampled"
        finally:
            stop.set()  # the load's end: the event the scale-down follows
            load.join(60)
        wait_until(lambda: running_replicas("Router") == 1, 120, 0.5, "scale-down after the load")
        by = collections.Counter((o.status, o.code) for o in out)
        print(f"Routers: {up} under load, then {under_load} while it went on; back to 1 once idle; {dict(by)}")
        assert min(under_load) > 1, under_load  # added while the load lasted, removed only after it
        assert set(by) <= {(200, ""), (503, "overloaded")}, by  # nothing lost while the ingress changed
        assert by[(200, "")] >= 0.95 * len(out), by
    finally:
        deploy(cluster["cfg"], cluster["client"])
        wait_until(lambda: running_replicas("Router") == 1 and app_running(), 120, 0.5, "the test's policy back")


# --------------------------------------------------------------------------- the head's GCS


def serve_state() -> dict[str, Any]:
    """The application's status, each deployment's, and the names of the live replica actors."""
    app = serve.status().applications["classifier"]
    names = ray.util.list_named_actors(all_namespaces=True)
    return {
        "status": str(app.status),
        "deployments": {n: str(d.status) for n, d in app.deployments.items()},
        "replicas": sorted(a["name"] for a in names if a["name"].startswith("SERVE_REPLICA::")),
    }


def ledger() -> dict[str, Any]:
    r = httpx.get(URL + "/v1/ab/summary", timeout=30)
    assert r.status_code == 200, r.text
    return r.json()


GCS_OUTAGE_S = 10.0


def test_the_gcs_killed_under_load_and_restarted_from_redis_loses_no_request_and_no_state(
    cluster: dict[str, Any],
) -> None:
    wait_until(lambda: httpx.get(URL + "/readyz", timeout=5).status_code == 200, 120, 1.0, "ready")
    wait_until(app_running, 120, 0.5, "the application RUNNING")
    redis = cluster["redis"]
    assert redis.keys() > 0  # the GCS's tables are in Redis
    before, counts_before = serve_state(), ledger()
    # A rollout running across the outage (started through the controller's handle: prod.yaml's admin routes need a
    # token this cluster's Routers do not have). It holds at its first step whatever the evidence says (gates wide
    # open: this test is about its state, which is in the GCS's KV).
    controller = driver_handle("RolloutController", "classifier")
    gates = {"min_agreement": 0.01, "max_p99_ratio": 1000.0, "max_error_rate_delta": 1.0}
    spec = {"candidate": "int8", "baseline": "fp32", "steps": [10, 100], "step_min_s": 3600, **gates}
    rollout = wait_until(lambda: controller.start.remote(spec).result(timeout_s=30), 30, 1.0, "a rollout started")
    assert rollout["state"] == "running" and rollout["step"] == 0
    try:
        _gcs_outage(cluster, before, counts_before, rollout)
    finally:
        with contextlib.suppress(Exception):  # the next test must not inherit a rollout's weights
            controller.abort.remote().result(timeout_s=30)


def _gcs_outage(cluster: dict[str, Any], before: dict[str, Any], counts_before: dict[str, Any], rollout: Any) -> None:
    head = cluster["cluster"].head_node
    out: list[Outcome] = []
    t_load = time.perf_counter()  # the load's own clock (Outcome.t) starts here, within a millisecond
    load = in_thread(closed_loop, GCS_OUTAGE_S + 25.0, 4, out)
    wait_until(lambda: len(out) >= 20 and time.perf_counter() - t_load >= 5, 30, 0.2, "steady load running")
    # The head's dashboard goes with the GCS, as when the head Pod is lost (left up, it spins on the lost GCS: on
    # the head's own cores on Kubernetes, on the service's here). This test's own driver stays connected, and spins
    # too: most of a core of these two, so requests/s drop while the GCS is down; a disconnected driver is worse,
    # as Serve's threads in this process then re-initialise Ray on their own and abort the process.
    t_kill = time.perf_counter()
    head.kill_gcs_server()
    head.kill_dashboard()
    # The GCS stays down for GCS_OUTAGE_S (a schedule), and at least 20 requests must be served meanwhile.
    down_from = t_kill - t_load
    wait_until(
        lambda: time.perf_counter() - t_kill >= GCS_OUTAGE_S and sum(o.t > down_from for o in out) >= 20,
        GCS_OUTAGE_S + 30,
        0.2,
        "requests served while the GCS is down",
    )
    served_down = [o for o in out if o.t > down_from]
    head.start_gcs_server()
    t_back = time.perf_counter()
    head.start_api_server(include_dashboard=None, raise_on_failure=False)
    wait_until(app_running, 60, 0.5, "GCS back")
    back_s = time.perf_counter() - t_back
    load.join(90)
    by = collections.Counter((o.status, o.code) for o in out)
    ok = by[(200, "")]
    up_again = t_back - t_load
    rates = [sum(1 for o in out if a <= o.t < b) / (b - a) for a, b in ((0, down_from), (down_from, up_again))]
    rates.append(sum(1 for o in out if o.t >= up_again) / (max(o.t for o in out) - up_again))
    print(
        f"GCS down {t_back - t_kill:.1f} s, back in {back_s:.1f} s; {len(out)} requests: {dict(by)}; "
        f"{sum(o.status == 200 for o in served_down)} of {len(served_down)} served while down "
        f"(requests/s before, during, after: {', '.join(f'{r:.1f}' for r in rates)}); "
        f"latency p50 {percentile([o.latency for o in out], 50):.3f} max {max(o.latency for o in out):.3f} s"
    )
    assert ok / len(out) >= 0.99, by
    assert all(o.status == 200 for o in served_down), collections.Counter((o.status, o.code) for o in served_down)
    assert not [o for o in out if timed_out(o)], by  # every request answered, none left to a timeout
    # Nothing restarted and nothing was forgotten: the same replicas, the A/B counts only grew.
    assert serve_state() == before
    counts = ledger()
    assert counts["since"] == counts_before["since"]
    served = sum(v["requests"] for v in counts["variants"].values())
    assert served >= sum(v["requests"] for v in counts_before["variants"].values()) + ok, (counts_before, counts)
    # The controller's own state is in the GCS's KV store, hence in Redis: killed now, the controller restarts and
    # recovers the application from it, without touching a replica.
    ray.kill(ray.get_actor("SERVE_CONTROLLER_ACTOR", namespace="serve"), no_restart=False)
    wait_until(lambda: serve_state() == before, 90, 1.0, "controller recovered its applications")
    assert asyncio.run(_probe()).status == 200
    # The rollout's state came back with the GCS: a new rollout controller replica reads it from the KV and
    # resumes the same rollout at the same step.
    (name,) = [n for n in serve_state()["replicas"] if "#RolloutController#" in n]
    ray.kill(ray.get_actor(name, namespace="serve"), no_restart=True)
    resumed = wait_until(lambda: name not in serve_state()["replicas"] and rollout_now(), 90, 1.0, "a new controller")
    assert resumed["rollout"] == rollout["rollout"] and resumed["state"] == "running" and resumed["step"] == 0


def rollout_now() -> dict[str, Any] | None:
    r = httpx.get(URL + "/v1/rollout", timeout=30)
    return r.json() if r.status_code == 200 else None


# --------------------------------------------------------------------------- last: prod's shape with decode_in: gpu
# (its deploy restarts every replica, and nothing after it needs them as they were)

JPEG = cv_encode(".jpg", pattern_image(60, 80))
BROKEN = JPEG[: len(JPEG) // 2]  # its header passes, its scan does not decode (tests/test_gpu_decode_unit.py)


def _batch_answers(variant: str = "fp32") -> tuple[str, list[dict[str, Any]]]:
    """/v1/classify/batch of a JPEG photograph, a truncated JPEG, a PNG photograph, a pixel bomb and another JPEG, as
    `variant` answers it: the variant, and per image its top-1 or its error code and status. prod.yaml's weights send
    5% to INT8 and refuse the override header, and INT8's two best classes for the photograph tie (282 and 285 to the
    last digit), so the request is sent again until `variant` answers: a comparison of two answers is of one model."""
    chelsea = cv2.imdecode(np.frombuffer(sample_bytes("chelsea"), np.uint8), cv2.IMREAD_COLOR)
    jpeg = cv2.imencode(".jpg", chelsea, [cv2.IMWRITE_JPEG_QUALITY, 95])[1].tobytes()
    files = [
        ("file", ("chelsea.jpg", jpeg, "image/jpeg")),
        ("file", ("broken.jpg", BROKEN, "image/jpeg")),
        ("file", ("coffee.png", sample_bytes("coffee"), "image/png")),
        ("file", ("bomb.jpg", jpeg_with_size(60_000, 60_000), "image/jpeg")),
        ("file", ("rocket.jpg", sample_bytes("rocket"), "image/jpeg")),
    ]  # fmt: skip

    def answered() -> httpx.Response | None:
        r = httpx.post(URL + "/v1/classify/batch", files=files, timeout=60)
        assert r.status_code == 200, r.text
        return r if r.headers["x-model-variant"] == variant else None

    r = wait_until(answered, 120, 0.0, f"{variant} to answer")
    results = r.json()["results"]
    answers = [
        {"top1": x["predictions"][0]["class_id"]} if "predictions" in x else {"error": x["error"]["code"]}
        for x in results
    ]
    return r.headers["x-model-variant"], [
        a | {"status": x.get("status")} for a, x in zip(answers, results, strict=True)
    ]


def test_prod_with_gpu_decoding_serves_as_before_with_its_routers_one_per_node(cluster: dict[str, Any]) -> None:
    """prod.yaml's shape on this cluster, changed to `decode_in: gpu` (no Preprocessor; each Classifier's batch decodes,
    nvImageCodec stood in for by the host decoder, APP_GPU_DECODER=standin, the transform graph on the CPU EP) and with
    prod.yaml's `max_replicas_per_node: 1` on two Routers, a second cpu_pool node added:
    - the two Routers land on two Ray nodes, never both in the one a node loss takes (docs/kubernetes.md);
    - the same request answers as it did with the Preprocessors (top-1 282, 967, 657; 400 and 413 where they were);
    - /v1/models says where each image was decoded: the answering Classifier decoded two JPEGs on the "device", the PNG
      by the CPU path, and the truncated JPEG failed there after the device declined it (the bomb never left the
      Router: its header check refuses it)."""
    import yaml

    prod = yaml.safe_load((Path(__file__).resolve().parent.parent / "configs" / "prod.yaml").read_text())
    cap = next(d for d in prod["applications"][0]["deployments"] if d["name"] == "Router")["max_replicas_per_node"]
    _, on_cpu = _batch_answers()
    second = cluster["cluster"].add_node(num_cpus=1, resources={"cpu_pool": 100})
    cfg = copy.deepcopy(cluster["cfg"])
    app = cfg["applications"][0]
    app["args"]["decode_in"] = "gpu"
    app["deployments"] = [d for d in app["deployments"] if d["name"] != "Preprocessor"]
    for v in app["args"]["variants"].values():  # ONNX Runtime's CPU EP: it reads the decoded batch in place
        v["engine"] = "cpu"
    for d in app["deployments"]:
        if d["name"].startswith("Classifier_"):
            standin = {"env_vars": {"APP_GPU_DECODER": "standin"}}
            d["ray_actor_options"] = {**d["ray_actor_options"], "runtime_env": standin}
        if d["name"] == "Router":
            d["max_replicas_per_node"] = cap
            d["autoscaling_config"] = dict(d["autoscaling_config"], min_replicas=2, max_replicas=2)
    deploy(cfg, cluster["client"])

    def placed() -> list[str]:
        details = serve_client().get_serve_details()["applications"]["classifier"]["deployments"]["Router"]
        running = [r["node_id"] for r in details["replicas"] if r["state"] == "RUNNING"]
        return running if len(running) == 2 else []

    nodes = wait_until(placed, 180, 0.5, "two Routers running")
    assert cap == 1 and len(set(nodes)) == 2 and second.node_id in nodes, (nodes, second.node_id)
    wait_until(lambda: app_running() and httpx.get(URL + "/readyz", timeout=5).status_code == 200, 180, 0.5, "ready")
    variant, on_gpu = _batch_answers()
    assert on_gpu == on_cpu
    assert [a.get("top1") for a in on_gpu] == [282, None, 967, None, 657]
    assert [a["status"] for a in on_gpu if "error" in a] == [400, 413]
    models = httpx.get(URL + "/v1/models", timeout=10).json()
    assert models["decode"]["where"] == "gpu"
    decoded = models["variants"][variant]["gpu_decode"]
    images = decoded["images"]
    assert decoded["decoder"] == "standin", decoded
    assert (images["hardware"], images["cpu"], images["failed"], images["fallback"]) == (2, 1, 1, 1), images
    assert images["device_errors"] == images["transform_fallback"] == 0, images
    # the device mode (app/runtime/device_batch.py): ONNX Runtime's CPU EP read the decoded rows in place
    assert models["variants"][variant]["engine"] == "cpu", models["variants"][variant]
    assert decoded["device_batch"] == {"active": True}, decoded
