"""A/B statistics, pure: merging, quantiles, the Wilson interval."""

from __future__ import annotations

import random

import pytest

from app.pipeline.abstats import ABStats, LatencyHistogram, compare_top, wilson_interval


def test_wilson_interval_known_values() -> None:
    lo, hi = wilson_interval(81, 100)  # type: ignore[misc]
    assert lo == pytest.approx(0.7222, abs=1e-3) and hi == pytest.approx(0.8749, abs=1e-3)
    lo, hi = wilson_interval(0, 10)  # type: ignore[misc]
    assert lo == 0.0 and 0.25 < hi < 0.35  # never a zero-width interval at the edge
    assert wilson_interval(0, 0) is None


def test_histogram_quantiles_within_five_percent() -> None:
    rng = random.Random(3)
    values = sorted(rng.lognormvariate(3, 0.6) for _ in range(20000))
    h = LatencyHistogram()
    for v in values:
        h.add(v)
    for q in (0.5, 0.99):
        exact = values[int(q * (len(values) - 1))]
        assert h.quantile(q) == pytest.approx(exact, rel=0.05)
    assert LatencyHistogram().quantile(0.5) is None


def test_merge_equals_recording_in_one_place() -> None:
    rng = random.Random(5)
    events = [(rng.choice(["int8", "fp32"]), rng.uniform(1, 100), rng.random() > 0.1) for _ in range(3000)]
    one, a, b = ABStats(), ABStats(), ABStats()
    for i, (v, ms, ok) in enumerate(events):
        one.record_request(v, ms, ok)
        (a if i % 2 else b).record_request(v, ms, ok)
        if i % 3 == 0:
            one.record_shadow(v, "x", i % 5 != 0, 0.8, 0.01)
            (a if i % 2 else b).record_shadow(v, "x", i % 5 != 0, 0.8, 0.01)
    merged = ABStats()
    merged.merge(a)
    merged.merge(b)
    assert merged.summary() == one.summary()


def test_summary_shape_and_pair_key_is_order_free() -> None:
    s = ABStats()
    s.record_shadow("int8", "fp32", True, 1.0, 0.02)
    s.record_shadow("fp32", "int8", False, 0.6, 0.10)
    s.record_dropped_shadow("int8", "fp32")
    pair = s.summary()["pairs"]["fp32|int8"]
    assert pair["shadowed"] == 2 and pair["dropped"] == 1
    assert pair["top1_agreement"] == 0.5 and pair["mean_top5_overlap"] == 0.8
    assert pair["mean_abs_top1_prob_delta"] == pytest.approx(0.06)
    lo, hi = pair["top1_agreement_ci95"]
    assert lo < 0.5 < hi


def test_compare_top() -> None:
    a = [(1, 0.6), (2, 0.2), (3, 0.1), (4, 0.05), (5, 0.01)]
    b = [(1, 0.5), (3, 0.2), (2, 0.1), (9, 0.05), (8, 0.01)]
    agree, overlap, dp = compare_top(a, b)
    assert agree and overlap == pytest.approx(0.6) and dp == pytest.approx(0.1)
