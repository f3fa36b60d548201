"""The A/B policy, pure (no Ray)."""

from __future__ import annotations

import random

import pytest

from app.errors import ServiceError
from app.pipeline.routing import WeightedSplit, choose_variant, failover_order, sticky_point

KNOWN = {"int8", "fp32"}


def test_split_follows_weights() -> None:
    split = WeightedSplit({"int8": 30, "fp32": 70})
    rng = random.Random(7)
    picks = [choose_variant(split, KNOWN, None, None, True, rng).variant for _ in range(20000)]
    assert abs(picks.count("int8") / len(picks) - 0.30) < 0.015


def test_zero_weight_variant_never_chosen_by_weight_but_can_be_forced() -> None:
    split = WeightedSplit({"int8": 0, "fp32": 1})
    rng = random.Random(1)
    assert {choose_variant(split, KNOWN, None, None, True, rng).variant for _ in range(500)} == {"fp32"}
    assert choose_variant(split, KNOWN, None, "int8", True).variant == "int8"


def test_weights_need_a_positive_entry() -> None:
    with pytest.raises(ValueError, match="positive"):
        WeightedSplit({"int8": 0, "fp32": 0})


def test_sticky_point_is_stable_and_uniform() -> None:
    assert sticky_point("alice") == sticky_point("alice")
    points = [sticky_point(f"user-{i}") for i in range(10000)]
    assert all(0 <= p < 1 for p in points)
    assert abs(sum(p < 0.3 for p in points) / len(points) - 0.3) < 0.02


def test_sticky_user_keeps_variant_while_weights_stand() -> None:
    split = WeightedSplit({"int8": 50, "fp32": 50})
    for user in (f"u{i}" for i in range(200)):
        first = choose_variant(split, KNOWN, user, None, True, random.Random()).variant
        assert all(choose_variant(split, KNOWN, user, None, True, random.Random()).variant == first for _ in range(5))


def test_ramping_int8_up_only_moves_users_towards_int8() -> None:
    # Variants are laid out by name (fp32 first), so growing int8's share moves the boundary one way:
    # a user already on int8 at 5% stays on int8 at 50%.
    low, high = WeightedSplit({"int8": 5, "fp32": 95}), WeightedSplit({"int8": 50, "fp32": 50})
    users = [f"user-{i}" for i in range(2000)]
    on_int8_low = {u for u in users if choose_variant(low, KNOWN, u, None, True).variant == "int8"}
    on_int8_high = {u for u in users if choose_variant(high, KNOWN, u, None, True).variant == "int8"}
    assert on_int8_low <= on_int8_high
    assert 0.03 < len(on_int8_low) / len(users) < 0.07


def test_override_rules() -> None:
    split = WeightedSplit({"int8": 1, "fp32": 1})
    assert choose_variant(split, KNOWN, "alice", "fp32", True).reason == "override"
    with pytest.raises(ServiceError) as e:
        choose_variant(split, KNOWN, None, "fp32", False)
    assert e.value.code == "override_forbidden" and e.value.status == 403
    with pytest.raises(ServiceError) as e:
        choose_variant(split, KNOWN, None, "fp16", True)
    assert e.value.code == "unknown_variant" and e.value.status == 422


def test_failover_order_prefers_weighted_variants() -> None:
    split = WeightedSplit({"a": 1, "b": 3, "c": 0})
    assert failover_order("a", ["a", "b", "c"], split) == ["b", "c"]
    assert failover_order("b", ["a", "b", "c"], split) == ["a", "c"]


def test_health_hold_expires_and_running_count_gates() -> None:
    from app.pipeline.routing import VariantHealth

    h = VariantHealth(hold_s=2.0)
    assert h.available("int8", 0.0)  # unknown counts are assumed up until the first poll
    h.mark_failed("int8", 10.0)
    assert not h.available("int8", 11.0) and h.available("int8", 12.1)
    h.set_running({"int8": 0, "fp32": 1})
    assert not h.available("int8", 100.0) and h.available("fp32", 100.0)


def test_candidates_skip_down_variants_and_never_fail_over_a_forced_choice() -> None:
    from app.pipeline.routing import Choice, VariantHealth, candidates

    split = WeightedSplit({"int8": 1, "fp32": 3})
    h = VariantHealth()
    known = ["fp32", "int8"]
    assert candidates(Choice("int8", "weighted"), known, split, True, h, 0) == ["int8", "fp32"]
    assert candidates(Choice("int8", "weighted"), known, split, False, h, 0) == ["int8"]
    h.set_running({"int8": 0, "fp32": 1})
    assert candidates(Choice("int8", "sticky"), known, split, True, h, 0) == ["fp32"]
    assert candidates(Choice("int8", "override"), known, split, True, h, 0) == []
    assert candidates(Choice("int8", "model"), known, split, True, h, 0) == []
    # a recent failure with no alternative: still tried (other replicas may serve it)
    h.set_running({"int8": 1, "fp32": 1})
    h.mark_failed("int8", 0.0)
    assert candidates(Choice("int8", "override"), known, split, True, h, 1.0) == ["int8"]
    assert candidates(Choice("int8", "weighted"), known, split, True, h, 1.0) == ["fp32"]


def test_a_handle_with_no_routable_replica_means_down_at_once() -> None:
    from app.pipeline.routing import Choice, VariantHealth, candidates

    split = WeightedSplit({"int8": 1, "fp32": 1})
    h = VariantHealth()
    h.set_routable({"int8": 0, "fp32": None})
    assert not h.has_replicas("int8") and h.has_replicas("fp32")
    assert candidates(Choice("int8", "override"), ["fp32", "int8"], split, True, h, 0) == []
