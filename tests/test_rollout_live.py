"""The rollout controller on the real app (configs/local.yaml, real models, real HTTP): a candidate promoted on
live shadow evidence, one rolled back on latency, a second rollout refused, abort, a controller replica killed
mid-rollout that resumes at the same step, and a killed Router whose replacement routes by the rollout's weights.
Steps, samples and times are shrunk; the rules are those of tests/test_rollout_unit.py, unchanged."""

from __future__ import annotations

import itertools
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import onnx
import pytest
import ray
from onnx import TensorProto, helper, numpy_helper

from app.served_model import ModelFiles
from app.toolchain.samples import sample_bytes
from tests.conftest import ServeDeployer, deployment, load_config, local_config, wait_until

pytestmark = pytest.mark.slow

PHOTOS = [sample_bytes(p) for p in ("chelsea", "coffee")]  # both variants give these the same top-1
CONFIG_WEIGHTS = next(d for d in load_config("local.yaml")["applications"][0]["deployments"] if d["name"] == "Router")[
    "user_config"
]["weights"]
FAST = {"candidate": "int8", "baseline": "fp32", "min_samples": 25, "step_min_s": 1, "min_agreement": 0.5}


def state(app: ServeDeployer) -> dict[str, Any]:
    r = httpx.get(app.url + "/v1/rollout", timeout=30)
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def fractions(app: ServeDeployer) -> dict[str, float]:
    variants = httpx.get(app.url + "/v1/models", timeout=30).json()["variants"]
    return {v: info["traffic_fraction"] for v, info in variants.items() if info["traffic_fraction"] > 0}


@pytest.fixture
def traffic(local_app: ServeDeployer) -> Iterator[None]:
    """Single-image requests, a few at a time, for as long as the test runs (the evidence the rollout reads)."""
    stop = threading.Event()

    def send() -> None:
        with httpx.Client(timeout=30) as client:
            for image in itertools.cycle(PHOTOS):
                if stop.is_set():
                    return
                try:
                    client.post(local_app.url + "/v1/classify", content=image, headers={"Content-Type": "image/jpeg"})
                except httpx.HTTPError:  # a replica killed by the test, until Serve replaces it
                    stop.wait(0.2)

    workers = [threading.Thread(target=send, daemon=True) for _ in range(3)]
    for w in workers:
        w.start()
    yield
    stop.set()
    for w in workers:
        w.join(timeout=60)


@pytest.fixture(autouse=True)
def back_to_the_config(local_app: ServeDeployer) -> Iterator[None]:
    """Afterwards the Routers route by configs/local.yaml again: a finished rollout's weights stay until a deploy
    or another rollout's abort, so a throwaway rollout is started and aborted."""
    yield
    if state(local_app)["state"] == "running":
        httpx.post(local_app.url + "/v1/rollout/abort", timeout=30)
    spec = {**FAST, "steps": [1, 100], "step_min_s": 3600}
    assert httpx.post(local_app.url + "/v1/rollout", json=spec, timeout=30).status_code == 202
    assert httpx.post(local_app.url + "/v1/rollout/abort", timeout=30).json()["state"] == "aborted"
    wait_until(lambda: fractions(local_app) == {"fp32": 0.5, "int8": 0.5}, 30, 0.5, "the config's weights again")


def finished(app: ServeDeployer) -> dict[str, Any] | None:
    s = state(app)
    return s if s["state"] != "running" else None


def test_a_candidate_that_agrees_is_promoted_step_by_step(local_app: ServeDeployer, traffic: None) -> None:
    # p99 within 3x: the gate under test here is agreement; two cores shared by both variants make p99 noisy
    r = httpx.post(local_app.url + "/v1/rollout", json={**FAST, "steps": [50, 100], "max_p99_ratio": 3.0}, timeout=30)
    assert r.status_code == 202 and r.json()["state"] == "running", r.text
    wait_until(lambda: fractions(local_app) == {"fp32": 0.5, "int8": 0.5}, 30, 0.5, "the first step's weights")
    done = wait_until(lambda: finished(local_app), 240, 1.0, "the rollout to finish")
    assert done["state"] == "promoted", done
    print(json.dumps(done, indent=1))  # docs/ab-rollout-cascade.md's worked example
    steps = done["steps"]
    assert [s["weight"] for s in steps] == [50.0, 100.0] and all(s["decision"] == "advance" for s in steps)
    assert all(s["samples"] >= FAST["min_samples"] and s["ci"][0] >= FAST["min_agreement"] for s in steps)
    assert done["user_config"] == {"weights": {"fp32": 0.0, "int8": 100.0, "int8>fp32": 0.0}}  # local.yaml's cascade
    wait_until(lambda: fractions(local_app) == {"int8": 1.0}, 30, 0.5, "every Router at the end")


def test_a_dry_run_decides_and_leaves_the_weights_alone(local_app: ServeDeployer, traffic: None) -> None:
    spec = {**FAST, "steps": [50, 100], "max_p99_ratio": 3.0, "dry_run": True}
    assert httpx.post(local_app.url + "/v1/rollout", json=spec, timeout=30).status_code == 202
    seen = []

    def decided() -> dict[str, Any] | None:
        seen.append(fractions(local_app))
        return finished(local_app)

    done = wait_until(decided, 240, 1.0, "the dry run's decisions")
    assert done["state"] == "promoted" and [s["decision"] for s in done["steps"]] == ["advance", "advance"]
    assert done["weights"] == CONFIG_WEIGHTS and "user_config" not in done
    assert all(f == {"fp32": 0.5, "int8": 0.5} for f in seen), seen  # the weights never moved


def test_one_rollout_at_a_time_and_abort_restores_the_start(local_app: ServeDeployer) -> None:
    spec = {**FAST, "steps": [10, 100], "step_min_s": 3600}
    assert httpx.post(local_app.url + "/v1/rollout", json=spec, timeout=30).status_code == 202
    wait_until(lambda: fractions(local_app) == {"fp32": 0.9, "int8": 0.1}, 30, 0.5, "the first step's weights")
    again = httpx.post(local_app.url + "/v1/rollout", json=spec, timeout=30)
    assert again.status_code == 409 and again.json()["error"]["code"] == "conflict"
    bad = httpx.post(local_app.url + "/v1/rollout", json={"candidate": "int4", "baseline": "fp32"}, timeout=30)
    assert bad.status_code == 409  # still one at a time, before the spec is even read
    aborted = httpx.post(local_app.url + "/v1/rollout/abort", timeout=30).json()
    assert aborted["state"] == "aborted" and aborted["weights"] == CONFIG_WEIGHTS
    wait_until(lambda: fractions(local_app) == {"fp32": 0.5, "int8": 0.5}, 30, 0.5, "the starting weights")
    unknown = httpx.post(local_app.url + "/v1/rollout", json={"candidate": "int4", "baseline": "fp32"}, timeout=30)
    assert unknown.status_code == 422 and unknown.json()["error"]["code"] == "unknown_variant"
    missing = httpx.post(local_app.url + "/v1/rollout", json={"candidate": "int8"}, timeout=30)
    assert missing.status_code == 422 and "baseline" in missing.json()["error"]["message"]


def test_a_killed_controller_resumes_at_the_same_step(local_app: ServeDeployer, traffic: None) -> None:
    spec = {**FAST, "steps": [10, 50, 100], "step_min_s": 3600}  # holds at its first step: nothing moves on
    assert httpx.post(local_app.url + "/v1/rollout", json=spec, timeout=30).status_code == 202
    wait_until(lambda: state(local_app)["steps"] and state(local_app)["steps"][-1]["samples"] > 5, 60, 0.5, "evidence")
    before = state(local_app)
    kill("#RolloutController#")
    after = wait_until(lambda: state(local_app), 90, 1.0, "a new controller replica")
    assert after["rollout"] == before["rollout"] and after["step"] == before["step"] == 0
    assert after["state"] == "running" and after["spec"] == before["spec"]
    # the evidence collected so far was kept: the step's samples only grow
    wait_until(lambda: state(local_app)["steps"][-1]["samples"] >= before["steps"][-1]["samples"], 30, 0.5, "samples")


def test_a_killed_router_is_replaced_by_one_that_routes_by_the_rollouts_weights(
    local_app: ServeDeployer, traffic: None
) -> None:
    spec = {**FAST, "steps": [10, 50, 100], "step_min_s": 3600}  # holds at 10%: the weights the new Router needs
    assert httpx.post(local_app.url + "/v1/rollout", json=spec, timeout=30).status_code == 202
    wait_until(lambda: fractions(local_app) == {"fp32": 0.9, "int8": 0.1}, 30, 0.5, "the first step's weights")
    wait_until(lambda: state(local_app)["steps"][-1]["samples"] > 5, 60, 0.5, "evidence")
    before = state(local_app)
    old = router_actor()
    kill("#Router#")
    seen: list[dict[str, float]] = []

    def replaced() -> bool:  # every answer of the new Router, from its first, routes by the rollout's weights
        if router_actor() in (None, old):
            return False
        try:
            seen.append(fractions(local_app))
        except httpx.HTTPError:  # HAProxy still pointing at the dead replica, or the new one not listening yet
            return False
        return len(seen) >= 3

    wait_until(replaced, 120, 0.2, "a new Router replica answering")
    assert all(f == {"fp32": 0.9, "int8": 0.1} for f in seen), seen
    after = state(local_app)
    assert after["rollout"] == before["rollout"] and after["state"] == "running" and after["step"] == 0
    # the step's evidence goes on from where it was (what the dead Router had not flushed, at most ~1 s, is lost)
    wait_until(lambda: state(local_app)["steps"][-1]["samples"] > before["steps"][-1]["samples"], 60, 0.5, "samples")


def actor_names(deployment_mark: str) -> list[str]:
    """The live replica actors of a deployment (its name between '#' marks)."""
    return [a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if deployment_mark in a["name"]]


def router_actor() -> str | None:
    names = actor_names("#Router#")
    return names[0] if len(names) == 1 else None


def kill(deployment_mark: str) -> None:
    (name,) = actor_names(deployment_mark)
    ray.kill(ray.get_actor(name, namespace="serve"), no_restart=True)


def constant_model(path: Path, class_id: int) -> Path:
    """An ONNX classifier with the built-in model's contract (uint8 [N, 224, 224, 3] -> float32 logits [N, 1000])
    whose top-1 is always `class_id`: the candidate that disagrees with everything."""
    image = helper.make_tensor_value_info("image", TensorProto.UINT8, ["N", 224, 224, 3])
    logits = helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 1000])
    bias = np.zeros((1, 1000), np.float32)
    bias[0, class_id] = 10.0
    nodes = [
        helper.make_node("Cast", ["image"], ["x"], to=TensorProto.FLOAT),
        helper.make_node("ReduceMean", ["x"], ["m"], axes=[1, 2, 3], keepdims=0),  # [N]: ties rows to the batch
        helper.make_node("Unsqueeze", ["m", "one"], ["m1"]),  # [N, 1]
        helper.make_node("Mul", ["m1", "zero"], ["z"]),  # [N, 1000] of zeros
        helper.make_node("Add", ["z", "bias"], ["logits"]),
    ]
    inits = [
        numpy_helper.from_array(np.array([1], np.int64), "one"),
        numpy_helper.from_array(np.zeros((1, 1000), np.float32), "zero"),
        numpy_helper.from_array(bias, "bias"),
    ]
    graph = helper.make_graph(nodes, "constant", [image], [logits], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    onnx.checker.check_model(model)
    onnx.save(model, path)
    return path


def slow_model(source: Path, path: Path, matmuls: int) -> Path:
    """`source` with a branch that costs `matmuls` 1000x1000 matrix products per image and adds zero to the logits:
    the same answers, slower. The candidate a latency gate must stop."""
    model = onnx.load(source)
    graph = model.graph
    (out,) = graph.output
    for node in graph.node:  # the model's own output now feeds the last Add
        node.output[:] = ["raw_logits" if o == out.name else o for o in node.output]
    w = numpy_helper.from_array(np.full((1000, 1000), 1e-3, np.float32), "slow_w")
    seed = numpy_helper.from_array(np.ones((1, 1000), np.float32), "slow_seed")
    zero = numpy_helper.from_array(np.zeros((1,), np.float32), "slow_zero")
    nodes = [helper.make_node("Mul", ["raw_logits", "slow_zero"], ["h0"])]  # [N, 1000] zeros tied to the batch
    nodes.append(helper.make_node("Add", ["h0", "slow_seed"], ["h1"]))
    for i in range(1, matmuls + 1):
        nodes.append(helper.make_node("MatMul", [f"h{i}", "slow_w"], [f"h{i + 1}"]))
    nodes.append(helper.make_node("Mul", [f"h{matmuls + 1}", "slow_zero"], ["nothing"]))
    nodes.append(helper.make_node("Add", ["raw_logits", "nothing"], [out.name]))
    graph.node.extend(nodes)
    graph.initializer.extend([w, seed, zero])
    onnx.save(model, path)
    return path


@pytest.fixture(scope="module")
def extra_variants(
    local_app: ServeDeployer, model_files: ModelFiles, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[None]:
    """configs/local.yaml with two more variants, deployed once for the last tests of this module and restored
    after them: `bad`, whose top-1 is always class 7, and `slow`, FP32's answers at several times its cost."""
    tmp = tmp_path_factory.mktemp("variants")
    cfg = local_config(model_files)
    variants = cfg["applications"][0]["args"]["variants"]
    common = {"precision": "fp32", "engine": "cpu"}
    variants["bad"] = {"model_path": str(constant_model(tmp / "bad.onnx", 7)), "description": "always 7", **common}
    slow = slow_model(model_files.fp32, tmp / "slow.onnx", 400)
    variants["slow"] = {"model_path": str(slow), "description": "FP32, slowed", **common}
    for name in ("bad", "slow"):  # deployed like FP32's Classifier (its user_config makes a replica ready)
        cfg["applications"][0]["deployments"].append(
            {**deployment(cfg, "Classifier_fp32"), "name": f"Classifier_{name}"}
        )
    local_app.deploy(cfg)
    try:
        yield
    finally:
        local_app.deploy(local_config(model_files))


def test_a_candidate_that_disagrees_is_rolled_back_within_its_first_step(
    local_app: ServeDeployer, extra_variants: None, traffic: None
) -> None:
    spec = {**FAST, "candidate": "bad", "baseline": "fp32", "steps": [50, 100], "min_agreement": 0.95}
    assert httpx.post(local_app.url + "/v1/rollout", json=spec, timeout=30).status_code == 202
    done = wait_until(lambda: finished(local_app), 240, 1.0, "the rollback")
    assert done["state"] == "rolled_back" and "agreement upper bound" in done["reason"], done
    (step,) = done["steps"]  # within the first step
    assert step["weight"] == 50.0 and step["decision"] == "rollback" and step["ci"][1] < 0.95
    assert done["weights"]["bad"] == 0.0


def test_a_slower_candidate_is_rolled_back_on_latency(
    local_app: ServeDeployer, extra_variants: None, traffic: None
) -> None:
    spec = {**FAST, "candidate": "slow", "baseline": "fp32", "steps": [50, 100]}  # max_p99_ratio: 1.2
    assert httpx.post(local_app.url + "/v1/rollout", json=spec, timeout=30).status_code == 202
    done = wait_until(lambda: finished(local_app), 240, 1.0, "the rollback")
    # Rolled back by the latency rule (its reason: the candidate's p99 lower bound over max_p99_ratio x the
    # baseline's; app/rollout/decide.py, its arithmetic tests/test_rollout_controller_unit.py's), in the first step.
    assert done["state"] == "rolled_back" and "candidate p99 lower bound" in done["reason"], done
    (step,) = done["steps"]
    assert step["weight"] == 50.0 and step["decision"] == "rollback" and step["p99_ratio"] is not None, step
    assert done["weights"]["slow"] == 0.0
