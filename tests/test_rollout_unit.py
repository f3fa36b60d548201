"""The canary ramp's statistics and rules, pure (no Ray): the anytime-valid bounds against the Wilson interval
re-checked at every n, the issue's 1,000-rollout simulation, `decide`'s gates and the `Rollout` state machine."""

from __future__ import annotations

import ast
import json
from collections.abc import Callable
from functools import cache
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from app.pipeline.abstats import ABStats, PairStats, wilson_interval
from app.rollout.bounds import agreement_bounds, proportion_bounds, quantile_lower_rank
from app.rollout.decide import decide
from app.rollout.evidence import LedgerCounts, StepEvidence, VariantCounts
from app.rollout.spec import RolloutSpec
from app.rollout.state import Rollout

Bounds = Callable[[int, int], tuple[float, float]]


def wilson(s: int, n: int) -> tuple[float, float]:
    return wilson_interval(s, n) or (0.0, 1.0)


def acceptance(bounds: Bounds, p: float, n_max: int) -> tuple[np.ndarray, np.ndarray]:
    """For n = 1..n_max, the range [smin, smax] of success counts whose interval contains p (lo and hi are
    nondecreasing in s, so it is a range), walked from n - 1's so each n costs a few calls."""
    smin, smax = np.zeros(n_max + 1, np.int64), np.zeros(n_max + 1, np.int64)
    a = b = 0
    for n in range(1, n_max + 1):
        a = min(a, n)
        while a > 0 and bounds(a - 1, n)[1] >= p:
            a -= 1
        while bounds(a, n)[1] < p:
            a += 1
        b = min(b + 1, n)
        while b < n and bounds(b + 1, n)[0] <= p:
            b += 1
        while bounds(b, n)[0] > p:
            b -= 1
        smin[n], smax[n] = a, b
    return smin[1:], smax[1:]


def ever_excluded(bounds: Bounds, p: float, sequences: int, n_max: int, seed: int) -> float:
    """The fraction of Bernoulli(p) sequences whose interval, checked at every n up to n_max, ever misses p."""
    successes = np.cumsum(np.random.default_rng(seed).random((sequences, n_max)) < p, axis=1, dtype=np.int32)
    smin, smax = acceptance(bounds, p, n_max)
    return float(((successes < smin) | (successes > smax)).any(axis=1).mean())


# --------------------------------------------------------------------------- the bounds


@pytest.mark.slow
def test_the_confidence_sequence_covers_uniformly_over_time_and_a_rechecked_wilson_interval_does_not() -> None:
    ours = ever_excluded(agreement_bounds, 0.95, 2000, 2000, seed=1)
    theirs = ever_excluded(wilson, 0.95, 2000, 2000, seed=1)
    print(f"ever excluded p=0.95 over n=1..2000: beta-mixture CS {ours:.2%}, Wilson re-checked {theirs:.2%}")
    assert ours <= 0.05
    assert theirs > 0.05  # the same check fails a fixed-n interval: the test can fail


def test_the_coverage_does_not_rest_on_the_prior_being_centred_on_the_truth() -> None:
    for p in (0.8, 0.99):
        assert ever_excluded(agreement_bounds, p, 500, 1000, seed=2) <= 0.05


def test_bounds_are_sane() -> None:
    assert agreement_bounds(0, 0) == (0.0, 1.0)
    for n in (1, 10, 100, 1000):
        for s in sorted({0, n // 2, (95 * n) // 100, n}):
            lo, hi = agreement_bounds(s, n)
            assert 0.0 <= lo <= s / n <= hi <= 1.0
    widths = [(lambda b: b[1] - b[0])(agreement_bounds(round(0.95 * n), n)) for n in (100, 400, 1600, 6400, 25600)]
    assert widths == sorted(widths, reverse=True) and widths[-1] < 0.01
    prev = (0.0, 0.0)
    for s in range(301):  # nondecreasing in s: the order-statistic argument of quantile_lower_rank rests on it
        cur = agreement_bounds(s, 300)
        assert cur[0] >= prev[0] and cur[1] >= prev[1]
        prev = cur
    with pytest.raises(ValueError):
        proportion_bounds(5, 4)


def test_the_p99_lower_bound_holds_uniformly_over_time() -> None:
    """X_(j) <= the true p99 exactly when at least j of the first n samples lie at or below it: Bernoulli(0.99)."""
    n_max = 2000
    below = np.cumsum(np.random.default_rng(3).random((1000, n_max)) < 0.99, axis=1, dtype=np.int32)
    ranks = np.array([quantile_lower_rank(0.99, n) for n in range(1, n_max + 1)])
    assert ranks[99] > 0 and ranks[-1] > 0.97 * n_max  # informative from 100 samples on
    assert float((below < ranks).any(axis=1).mean()) <= 0.05


# --------------------------------------------------------------------------- the issue's simulation

# 50 successful requests of a healthy variant. Sub-millisecond, so the histograms stay a few bins long and cheap
# to subtract 100,000 times; where they lie does not matter here, both variants share them.
UNIT_MS = [0.15] * 30 + [0.2] * 15 + [0.3] * 5


def simulate(true_agreement: float, rollouts: int, seed: int) -> dict[str, int]:
    """Spec defaults but step_min_s = 10 ticks of 1 s; each tick brings 50 shadow comparisons and 5,000 requests
    split by the step's weight, both variants equally fast and error-free: agreement alone decides."""
    spec = RolloutSpec(candidate="int8", baseline="fp32", step_min_s=10)
    unit = VariantCounts.of(UNIT_MS).latency

    @cache  # the same cumulative counts recur in every rollout
    def healthy(units: int) -> VariantCounts:
        return VariantCounts(50 * units, 0, tuple(c * units for c in unit))

    rng = np.random.default_rng(seed)
    outcomes = {"promoted": 0, "rolled_back": 0, "running": 0}
    for _ in range(rollouts):
        r = Rollout(spec, {"int8": 0.0, "fp32": 100.0})
        shadowed = agree = cand_units = base_units = 0
        agreements = rng.binomial(50, true_agreement, size=2000).tolist()
        for t, k in enumerate(agreements):
            if r.state != "running":
                break
            w = r.weights()["int8"]
            shadowed, agree = shadowed + 50, agree + k
            cand_units, base_units = cand_units + round(w), base_units + round(100 - w)
            r.tick(LedgerCounts(shadowed, agree, healthy(cand_units), healthy(base_units)), float(t))
        outcomes[r.state] += 1
    return outcomes


@pytest.mark.slow
def test_a_candidate_below_the_threshold_is_rarely_promoted_and_one_above_it_usually_is() -> None:
    worse = simulate(0.93, 1000, seed=11)
    better = simulate(0.97, 1000, seed=12)
    print(f"1,000 rollouts each: true agreement 0.93 -> {worse}; 0.97 -> {better}")
    assert worse["promoted"] < 50
    assert better["promoted"] > 900


# --------------------------------------------------------------------------- decide()

SPEC = RolloutSpec(candidate="int8", baseline="fp32")
FAST = VariantCounts.of([10.0] * 600)


def evidence(n: int = 2000, agree: int = 1990, cand: VariantCounts = FAST, base: VariantCounts = FAST) -> StepEvidence:
    return StepEvidence(n, agree, cand, base)


def test_decide_advances_when_every_gate_passes() -> None:
    d = decide(SPEC, evidence(), step_started_at=0.0, now=60.0)
    assert d.decision == "advance", d.reason
    assert d.samples == 2000 and d.agreement == pytest.approx(0.995) and d.ci[0] >= 0.95
    assert d.p99_ratio == 1.0 and d.error_rate_delta == 0.0


def test_decide_holds_until_step_min_s_and_min_samples() -> None:
    d = decide(SPEC, evidence(), step_started_at=0.0, now=59.0)
    assert d.decision == "hold" and "59/60 s" in d.reason
    d = decide(SPEC, evidence(n=400, agree=400), step_started_at=0.0, now=600.0)
    assert d.decision == "hold" and "400/500 comparisons" in d.reason
    d = decide(SPEC, evidence(n=600, agree=580), step_started_at=0.0, now=600.0)  # 0.967: not yet shown
    assert d.decision == "hold" and "agreement lower bound" in d.reason and d.ci[0] < 0.95 < d.ci[1]


def test_decide_rolls_back_at_once_when_the_upper_bound_falls_below_min_agreement() -> None:
    d = decide(SPEC, evidence(n=2000, agree=1800), step_started_at=0.0, now=1.0)  # before step_min_s too
    assert d.decision == "rollback" and d.ci[1] < 0.95 and "upper bound" in d.reason
    assert decide(SPEC, evidence(n=30, agree=15), 0.0, 1.0).decision == "rollback"  # anytime-valid at small n


def test_decide_latency_gate() -> None:
    slow = VariantCounts.of([20.0] * 600)
    d = decide(SPEC, evidence(cand=slow), 0.0, 60.0)
    assert d.decision == "rollback" and "p99" in d.reason and d.p99_ratio == pytest.approx(2.0, rel=0.1)
    # p99 1.3x the baseline's, but carried by 10 of 600 requests: not shown beyond noise, so hold, not rollback
    tail = VariantCounts.of([10.0] * 590 + [13.0] * 10)
    d = decide(SPEC, evidence(cand=tail), 0.0, 60.0)
    assert d.decision == "hold" and "p99 ratio" in d.reason and d.p99_ratio == pytest.approx(1.3, rel=0.1)
    # too few candidate requests to judge its latency at all: hold
    d = decide(SPEC, evidence(cand=VariantCounts.of([20.0] * 100)), 0.0, 60.0)
    assert d.decision == "hold" and "latency samples 100/500" in d.reason


def test_decide_error_rate_gate() -> None:
    failing = VariantCounts.of([10.0] * 570, errors=30)  # 5% against 0%
    d = decide(SPEC, evidence(cand=failing), 0.0, 60.0)
    assert d.decision == "rollback" and "error rate" in d.reason and d.error_rate_delta == pytest.approx(0.05)
    one = VariantCounts.of([10.0] * 599, errors=1)  # 0.17% against 0%: over the delta, but not shown
    d = decide(SPEC, evidence(cand=one), 0.0, 60.0)
    assert d.decision == "hold" and "error rate delta" in d.reason
    base = VariantCounts.of([10.0] * 9990, errors=10)  # 0.1% baseline: 0.17% is within 0.1% of it
    assert decide(SPEC, evidence(cand=one, base=base), 0.0, 60.0).decision == "advance"


# --------------------------------------------------------------------------- Rollout

START = {"int8": 0.0, "fp32": 100.0}


class Ledger:
    """Cumulative counts, as the ABLedger would hold them, fed by ticks at a Rollout's current weights."""

    def __init__(self) -> None:
        self.stats = ABStats()

    def serve(
        self, weights: dict[str, float], requests: int, shadows: int, agree: float, slow_int8: float = 1.0
    ) -> None:
        delta = ABStats()
        for name, w in weights.items():
            ms = 10.0 * (slow_int8 if name == "int8" else 1.0)
            delta.record_request(name, ms, ok=True)  # one, then scaled: tens of thousands of calls would be slow
            v = delta.variants[name]
            n = round(requests * w / 100)
            v.requests, v.latency.counts = n, [c * n for c in v.latency.counts]
        pair = delta.pairs["fp32|int8"] = PairStats()
        pair.shadowed, pair.top1_agree = shadows, round(agree * shadows)
        self.stats.merge(delta)

    def counts(self) -> LedgerCounts:
        return LedgerCounts.from_abstats(self.stats, "int8", "fp32")


def run(r: Rollout, ledger: Ledger, ticks: int, t0: float, agree: float = 1.0, **kw: float) -> float:
    t = t0
    for _ in range(ticks):
        ledger.serve(r.weights(), 60_000, 600, agree, **kw)
        r.tick(ledger.counts(), t)
        t += 61.0
    return t


def test_a_good_candidate_advances_through_every_step_to_promoted() -> None:
    r, ledger = Rollout(SPEC, START), Ledger()
    seen = []
    t = 0.0
    while r.state == "running" and t < 100 * 61:
        seen.append(r.weight)
        t = run(r, ledger, 1, t)
    assert r.state == "promoted" and r.weights() == {"int8": 100.0, "fp32": 0.0}
    assert sorted(set(seen)) == [1.0, 5.0, 25.0, 50.0, 100.0]
    assert [h.weight for h in r.history] == [1.0, 5.0, 25.0, 50.0, 100.0]
    assert all(h.decision == "advance" for h in r.history)
    assert r.reference is not None  # the last step judged latency against the 50% step's baseline
    assert r.tick(ledger.counts(), t) is None


def test_a_slow_candidate_is_rolled_back_to_weight_zero() -> None:
    r, ledger = Rollout(SPEC, START), Ledger()
    run(r, ledger, 10, 0.0, slow_int8=2.0)
    assert r.state == "rolled_back" and "p99" in r.reason
    assert r.weights() == {"int8": 0.0, "fp32": 100.0}
    assert r.history[-1].decision == "rollback" and r.history[-1].weight == 1.0


def test_abort_restores_the_starting_weights_and_dry_run_never_moves_them() -> None:
    start = {"int8": 10.0, "fp32": 90.0}
    r, ledger = Rollout(SPEC, start), Ledger()
    run(r, ledger, 4, 0.0)
    assert r.step > 0 and r.weights() != start
    assert r.abort() and r.state == "aborted" and r.weights() == start
    assert not r.abort()
    dry = Rollout(SPEC.model_copy(update={"dry_run": True}), START)
    dry.step = 2
    assert dry.weights() == START


def test_a_restarted_controller_resumes_at_the_same_step_with_the_evidence_so_far() -> None:
    r, ledger = Rollout(SPEC, START), Ledger()
    t = run(r, ledger, 5, 0.0)  # two steps passed; the fifth tick began step 2 (its snapshot)
    ledger.serve(r.weights(), 60_000, 600, 1.0)  # evidence of step 2 before the restart
    restored = Rollout.from_dict(json.loads(json.dumps(r.to_dict())))
    assert restored == r and restored.step == 2 and restored.weights() == {"int8": 25.0, "fp32": 75.0}
    ledger.serve(r.weights(), 60_000, 600, 1.0)  # and after it
    a, b = r.tick(ledger.counts(), t), restored.tick(ledger.counts(), t)
    assert a == b and a is not None and a.samples == 1200  # none lost in the restart


def test_a_ledger_reset_restarts_the_step_evidence_instead_of_going_negative() -> None:
    r, ledger = Rollout(SPEC, START), Ledger()
    run(r, ledger, 1, 0.0)
    ledger.stats = ABStats()  # ABLedger.reset
    ledger.serve(r.weights(), 60_000, 100, 1.0)
    record = r.tick(ledger.counts(), 61.0)
    assert record is not None and record.samples == 100


def test_ledger_counts_from_abstats_and_the_record_is_json() -> None:
    stats = ABStats()
    stats.record_request("int8", 5.0, ok=True)
    stats.record_request("int8", 0.0, ok=False)
    stats.record_shadow("fp32", "int8", True, 1.0, 0.0)
    stats.record_shadow("int8", "fp32", False, 0.6, 0.1)
    c = LedgerCounts.from_abstats(stats, "int8", "fp32")
    assert (c.shadowed, c.agree, c.candidate.requests, c.candidate.errors, c.candidate.timed) == (2, 1, 2, 1, 1)
    assert c.baseline == VariantCounts()
    r = Rollout(SPEC, START)
    record = r.tick(c, 1_700_000_000.0)
    assert record is not None
    d = json.loads(json.dumps(record.to_dict()))
    assert set(d) >= {"weight", "samples", "agreement", "ci", "p99_ratio", "error_rate_delta", "decision", "at"}
    assert d["at"] == "2023-11-14T22:13:20Z" and d["decision"] == "hold"


@pytest.mark.parametrize(
    "bad",
    [
        {"steps": [5, 1, 100]},
        {"steps": [1, 5, 50]},
        {"steps": [0, 100]},
        {"steps": []},
        {"candidate": "fp32"},
        {"min_agreement": 1.0},
        {"min_samples": 0},
        {"shadow": 0.1},
    ],
)
def test_the_spec_rejects_nonsense(bad: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        RolloutSpec.model_validate({"candidate": "int8", "baseline": "fp32", **bad})


def test_the_spec_defaults_are_the_issues() -> None:
    assert RolloutSpec(candidate="int8", baseline="fp32").model_dump() == {
        "candidate": "int8",
        "baseline": "fp32",
        "steps": [1, 5, 25, 50, 100],
        "min_samples": 500,
        "min_agreement": 0.95,
        "max_p99_ratio": 1.2,
        "max_error_rate_delta": 0.001,
        "step_min_s": 60,
        "dry_run": False,
    }


def test_the_rollout_package_imports_neither_ray_nor_starlette() -> None:
    for path in (Path(__file__).resolve().parent.parent / "app" / "rollout").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            names += [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
            assert not [m for m in names if m.split(".")[0] in ("ray", "starlette")], path


def test_with_a_third_variant_the_step_is_the_candidates_share_of_the_pairs_traffic() -> None:
    start = {"int8": 0.0, "fp32": 60.0, "mobilenet": 40.0}
    r = Rollout(SPEC, start)
    for step, want in [(0, {"int8": 0.6, "fp32": 59.4}), (2, {"int8": 15.0, "fp32": 45.0}), (4, {"int8": 60.0})]:
        r.step = step
        w = r.weights()
        assert w["mobilenet"] == 40.0 and sum(w.values()) == pytest.approx(100.0)  # the bystander keeps its share
        assert w["int8"] / sum(w.values()) == pytest.approx(SPEC.steps[step] / 100 * 0.6)
        assert {k: w[k] for k in want} == pytest.approx(want)
    r.state = "rolled_back"
    assert r.weights() == {"int8": 0.0, "fp32": 60.0, "mobilenet": 40.0}
    r.state = "aborted"
    raw = Rollout(SPEC, {"int8": 0.0, "fp32": 3.0, "mobilenet": 2.0})
    raw.state = "aborted"
    assert raw.weights() == {"int8": 0.0, "fp32": 60.0, "mobilenet": 40.0}  # in percent in every state
    assert Rollout(SPEC, {"int8": 0.0, "fp32": 0.0}).weights() == {"int8": 0.0, "fp32": 0.0}  # no split: as it was
