"""The rollout controller's logic and the ledger's board, pure: fake ports, a fake clock, the real rules."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest

from app.errors import ServiceError
from app.pipeline.abstats import ABStats
from app.rollout.board import RolloutBoard, config_id
from app.rollout.controller import SHADOW_FLOOR, RolloutService

VARIANTS = ["fp32", "int8"]
CONFIG = {"weights": {"fp32": 1.0, "int8": 1.0}, "shadow_fraction": 0.0}
START_PERCENT = {"fp32": 50.0, "int8": 50.0}  # the config's split, as the controller reports every weight
FAST = {"candidate": "int8", "baseline": "fp32", "steps": [50, 100], "min_samples": 20, "step_min_s": 2}


class FakeLedger:
    """The ledger's board and counts; Routers poll it as app/http/policy.py does."""

    def __init__(self) -> None:
        self.board = RolloutBoard()
        self.stats = ABStats()
        self.since = 1.0
        self.saved: dict[str, Any] | None = None
        self.cid = config_id(CONFIG)
        self.board.poll(self.cid, CONFIG["weights"])

    async def snapshot(self) -> dict[str, Any]:
        return {"stats": self.stats, "since": self.since, **self.board.seen()}

    async def set_override(self, override: dict[str, Any] | None) -> None:
        self.board.set(override)

    async def load(self) -> dict[str, Any] | None:
        return self.saved

    async def save(self, state: dict[str, Any]) -> None:
        self.saved = state

    def traffic(self, n: int, agree: float, rng: random.Random, candidate_ms: float = 10.0) -> None:
        """n requests split by the Routers' weights now, each shadowed."""
        override = self.board.poll(self.cid, CONFIG["weights"])
        weights = override["weights"] if override else CONFIG["weights"]
        share = weights["int8"] / (weights["int8"] + weights["fp32"])
        for _ in range(n):
            variant = "int8" if rng.random() < share else "fp32"
            self.stats.record_request(variant, candidate_ms if variant == "int8" else 10.0, ok=True)
            self.stats.record_shadow(variant, "fp32" if variant == "int8" else "int8", rng.random() < agree, 1.0, 0.0)


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def ticks(service: RolloutService, ledger: FakeLedger, agree: float, seconds: int, **kw: Any) -> None:
    rng = random.Random(0)
    for t in range(seconds):
        ledger.traffic(40, agree, rng, **kw)
        run(service.tick(now=100.0 + t))
        if service.rollout is not None and service.rollout.state != "running":
            return


def test_a_good_candidate_is_promoted_and_its_weights_stay_until_a_deploy() -> None:
    ledger = FakeLedger()
    service = RolloutService(ledger, VARIANTS)
    state = run(service.start(FAST, now=99.0))
    assert state["state"] == "running" and state["weights"] == {"fp32": 50.0, "int8": 50.0}
    assert ledger.board.poll(ledger.cid, CONFIG["weights"])["weights"]["int8"] == 50.0  # the Routers see it
    ticks(service, ledger, agree=1.0, seconds=200)
    done = service.describe()
    assert done["state"] == "promoted" and [s["decision"] for s in done["steps"]] == ["advance", "advance"]
    assert done["user_config"] == {"weights": {"fp32": 0.0, "int8": 100.0}}
    assert ledger.board.poll(ledger.cid, CONFIG["weights"])["weights"] == {"fp32": 0.0, "int8": 100.0}
    assert ledger.board.poll("a-new-deploy", {"fp32": 1, "int8": 0}) is None  # a deploy wins over the final weights


def test_a_slower_candidate_is_rolled_back_to_weight_zero() -> None:
    ledger = FakeLedger()
    service = RolloutService(ledger, VARIANTS)
    run(service.start({**FAST, "max_p99_ratio": 1.2}, now=99.0))
    ticks(service, ledger, agree=1.0, seconds=200, candidate_ms=40.0)
    done = service.describe()
    assert done["state"] == "rolled_back" and "p99" in done["reason"]
    assert done["weights"] == {"fp32": 100.0, "int8": 0.0}
    assert ledger.board.poll(ledger.cid, CONFIG["weights"])["weights"]["int8"] == 0.0


def test_a_second_rollout_is_a_conflict_and_abort_restores_the_start() -> None:
    ledger = FakeLedger()
    service = RolloutService(ledger, VARIANTS)
    run(service.start(FAST, now=99.0))
    with pytest.raises(ServiceError) as e:
        run(service.start(FAST, now=99.5))
    assert e.value.code == "conflict" and e.value.status == 409
    aborted = run(service.abort())
    assert aborted["state"] == "aborted" and aborted["weights"] == START_PERCENT
    assert ledger.board.poll(ledger.cid, CONFIG["weights"]) is None  # the Routers' own config again
    with pytest.raises(ServiceError) as e:
        run(service.abort())
    assert e.value.code == "conflict"


def test_bad_specs_are_refused_with_the_field_named() -> None:
    service = RolloutService(FakeLedger(), VARIANTS)
    for body, code, where in [
        ({"candidate": "int8", "baseline": "fp32", "steps": [50, 20, 100]}, "invalid_parameter", "steps"),
        ({"candidate": "int8"}, "invalid_parameter", "baseline"),
        ({"candidate": "int4", "baseline": "fp32"}, "unknown_variant", "int4"),
        ({"candidate": "int8", "baseline": "fp32", "surprise": 1}, "invalid_parameter", "surprise"),
    ]:
        with pytest.raises(ServiceError) as e:
            run(service.start(body))
        assert e.value.code == code and where in e.value.message, (body, e.value.message)


def test_dry_run_decides_but_never_moves_the_weights() -> None:
    ledger = FakeLedger()
    service = RolloutService(ledger, VARIANTS)
    run(service.start({**FAST, "dry_run": True}, now=99.0))
    ticks(service, ledger, agree=1.0, seconds=2)
    override = ledger.board.poll(ledger.cid, CONFIG["weights"])
    assert override["weights"] == START_PERCENT and override["shadow_fraction"] >= SHADOW_FLOOR[0]
    ticks(service, ledger, agree=1.0, seconds=200)
    done = service.describe()
    assert [s["decision"] for s in done["steps"]] == ["advance", "advance"]  # decided and recorded
    assert done["weights"] == START_PERCENT and "user_config" not in done
    assert ledger.board.poll(ledger.cid, CONFIG["weights"])["weights"] == START_PERCENT


def test_a_deploy_during_the_rollout_aborts_it() -> None:
    ledger = FakeLedger()
    service = RolloutService(ledger, VARIANTS)
    run(service.start(FAST, now=99.0))
    assert ledger.board.poll("redeployed", {"fp32": 3.0, "int8": 1.0}) is None  # a Router with the new config
    run(service.tick(now=101.0))
    state = service.describe()
    assert state["state"] == "aborted" and "deployed again" in state["reason"]
    assert ledger.board.poll("redeployed", {"fp32": 3.0, "int8": 1.0}) is None


def test_a_restarted_controller_resumes_at_the_same_step_with_its_evidence() -> None:
    ledger = FakeLedger()
    service = RolloutService(ledger, VARIANTS)
    run(service.start({**FAST, "steps": [10, 50, 100], "step_min_s": 3}, now=99.0))
    ticks(service, ledger, agree=1.0, seconds=8)
    before = service.describe()
    assert before["state"] == "running" and before["step"] >= 1
    again = RolloutService(ledger, VARIANTS)
    run(again.restore())
    assert again.describe() == before
    ticks(again, ledger, agree=1.0, seconds=200)
    assert again.describe()["state"] == "promoted"


def test_the_shadow_floor_asks_for_min_samples_within_step_min_s() -> None:
    ledger = FakeLedger()
    service = RolloutService(ledger, VARIANTS)
    run(service.start({**FAST, "min_samples": 400, "step_min_s": 10}, now=99.0))
    ticks(service, ledger, agree=1.0, seconds=3)  # 40 requests a second
    assert service.shadow_floor() == SHADOW_FLOOR[1]  # 400 comparisons in 10 s at 40/s: all it may ask, 0.5
    quiet = RolloutService(FakeLedger(), VARIANTS)
    assert quiet.shadow_floor() == SHADOW_FLOOR[0]


def test_the_relaying_routers_config_starts_it_before_any_router_has_polled() -> None:
    ledger = FakeLedger()
    ledger.board = RolloutBoard()  # a fresh ledger: no Router has polled yet
    service = RolloutService(ledger, VARIANTS)
    with pytest.raises(ServiceError) as e:
        run(service.start(FAST))
    assert e.value.code == "not_ready" and e.value.status == 503
    state = run(service.start(FAST, {"config_id": ledger.cid, "weights": CONFIG["weights"]}, now=99.0))
    assert state["state"] == "running" and ledger.board.poll(ledger.cid, CONFIG["weights"])["weights"]["int8"] == 50


def test_a_pair_without_traffic_is_refused_and_the_override_names_the_pair_to_shadow() -> None:
    ledger = FakeLedger()
    ledger.board.poll(ledger.cid, {"fp32": 0.0, "int8": 0.0, "mobilenet": 1.0})
    service = RolloutService(ledger, [*VARIANTS, "mobilenet"])
    with pytest.raises(ServiceError) as e:
        run(service.start(FAST, now=99.0))
    assert e.value.code == "conflict" and "carries no traffic" in e.value.message and service.rollout is None
    ledger.board.poll(ledger.cid, {"fp32": 0.0, "int8": 1.0})  # after a promotion: nothing left to move
    with pytest.raises(ServiceError) as e:
        run(service.start(FAST, now=99.0))
    assert e.value.code == "conflict" and "baseline fp32 carries no traffic" in e.value.message
    ledger.board.poll(ledger.cid, CONFIG["weights"])
    run(service.start(FAST, now=99.0))
    assert ledger.board.poll(ledger.cid, CONFIG["weights"])["pair"] == ["int8", "fp32"]
    run(service.abort())
    assert ledger.board.poll(ledger.cid, CONFIG["weights"]) is None
