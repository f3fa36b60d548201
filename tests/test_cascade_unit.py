"""The cascade's rule and threshold fitting (app/pipeline/cascade_rule.py), pure: no Ray, no engines."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from app.pipeline.cascade_rule import BUCKETS, MarginEvidence, curve, escalate, fit_threshold, margin


def test_margin_is_top1_minus_top2_and_the_threshold_bounds_are_all_and_nothing() -> None:
    assert margin([(3, 0.7), (9, 0.2), (1, 0.1)]) == pytest.approx(0.5)
    assert margin([(3, 1.0)]) == 1.0 and margin([]) == 0.0
    assert not any(escalate(m, 0.0) for m in (0.0, 0.3, 1.0))  # threshold 0: nothing goes on
    assert all(escalate(m, 1.0) for m in (0.0, 0.3, 1.0))  # threshold 1: everything, a sure 1.0 too
    assert escalate(0.09, 0.1) and not escalate(0.1, 0.1)


def synthetic(n: int, seed: int = 0) -> MarginEvidence:
    """`first` disagrees with `then` only below margin 0.3: half the time below 0.1, a fifth of the time in
    [0.1, 0.3); margins uniform. So escalating below 0.3 reaches full agreement, and nothing less does."""
    rng = random.Random(seed)
    ev = MarginEvidence()
    for _ in range(n):
        m = rng.random()
        p_disagree = 0.5 if m < 0.1 else 0.2 if m < 0.3 else 0.0
        ev.add(m, rng.random() >= p_disagree)
    return ev


def test_auto_picks_the_threshold_the_evidence_calls_for() -> None:
    ev = synthetic(20_000)
    fit = fit_threshold(ev, target=0.995, min_samples=500, default=0.5)
    assert fit.fitted and fit.samples == 20_000
    # Agreement is 1 - 0.2 * (0.3 - t) at t in [0.1, 0.3]: 0.995 needs t >= 0.275.
    assert 0.27 <= fit.threshold <= 0.29, fit
    assert fit.expected is not None and fit.expected.agreement >= 0.995 > fit.expected.agreement_low
    assert fit.expected.escalation == pytest.approx(fit.threshold, abs=0.02)  # margins are uniform
    looser = fit_threshold(ev, target=0.97, min_samples=500, default=0.5)
    assert 0.1 <= looser.threshold < fit.threshold  # a lower target escalates less


def test_too_little_evidence_keeps_the_default_and_an_unreachable_target_escalates_everything() -> None:
    few = synthetic(100)
    fit = fit_threshold(few, target=0.995, min_samples=500, default=0.5)
    assert not fit.fitted and fit.threshold == 0.5 and "500" in fit.reason
    always_wrong = MarginEvidence.of([(0.999, False)] * 300 + [(0.5, True)] * 300)  # sure of itself, and wrong
    unreachable = fit_threshold(always_wrong, 0.99, 100, 0.5)
    assert unreachable.threshold == 1.0 and "no threshold below 1" in unreachable.reason


def test_the_curve_runs_from_first_alone_to_then_alone() -> None:
    ev = MarginEvidence.of([(0.05, False), (0.05, True), (0.5, True), (0.95, True)])
    points = curve(ev)
    assert len(points) == BUCKETS + 1
    assert points[0].threshold == 0.0 and points[0].agreement == 0.75 and points[0].escalation == 0.0
    assert points[-1].agreement == 1.0 and points[-1].agreement_low == 1.0 and points[-1].escalation == 1.0
    at = {p.threshold: p for p in points}
    assert at[0.06].agreement == 1.0 and at[0.06].escalation == 0.5
    assert all(a.agreement <= b.agreement and a.escalation <= b.escalation for a, b in itertools.pairwise(points))
    assert curve(MarginEvidence()) == []


def test_evidence_merges_and_round_trips() -> None:
    a, b = synthetic(300, 1), synthetic(200, 2)
    merged = MarginEvidence.from_dict(a.to_dict())
    merged.merge(b)
    assert merged.n == 500 and merged == MarginEvidence.from_dict(merged.to_dict())
    with pytest.raises(ValueError):
        MarginEvidence.from_dict({"agree": [0], "disagree": [0]})


def test_the_curve_and_the_rule_draw_the_line_in_the_same_place() -> None:
    # Margins at and next to every bound k/100, where m * 100 rounds across it (0.29 * 100 = 28.999...)
    edges = [x for k in range(101) for x in (k / 100, math.nextafter(k / 100, 0.0), math.nextafter(k / 100, 1.0))]
    edges = [m for m in edges if 0.0 <= m <= 1.0]
    points = curve(MarginEvidence.of((m, True) for m in edges))
    for p in points:
        assert p.escalation * len(edges) == pytest.approx(sum(escalate(m, p.threshold) for m in edges)), p
