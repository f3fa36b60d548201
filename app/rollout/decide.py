"""The canary ramp's rules: `decide` advances, holds or rolls back one step on its evidence. The request is
`app.rollout.spec`, the evidence `app.rollout.evidence`, the state machine that a controller ticks about once a
second and persists between ticks `app.rollout.state`.

Evidence is per step: the controller passes the ledger's cumulative counts (`LedgerCounts`) and the Rollout
subtracts the counts it saw when the step began, so each step is judged on traffic at its own weight only.

The gates, and why each is safe to re-check every second:
- agreement: the anytime-valid sequence of `app.rollout.bounds`. Advance needs its lower end >= min_agreement
  (and min_samples comparisons); rollback needs its upper end < min_agreement, at any n (it is valid at any n).
- latency: advance needs the candidate's p99 <= max_p99_ratio x the baseline's (point estimates). Rollback needs
  the candidate's *lower* anytime bound on its p99 (an order statistic, `quantile_lower_rank`) above that limit,
  so a noisy p99 from a few hundred requests never rolls back on its own.
- errors: advance needs the candidate's error rate <= the baseline's + max_error_rate_delta (point estimates:
  an upper bound within 0.1% of zero would need ~13,000 error-free requests at every step). Rollback needs the
  candidate's lower anytime bound on its error rate to exceed the baseline's rate + the delta.
- enough samples: neither latency nor error rules act (either way) before each variant has min_samples requests
  in the step (successful ones, for latency). The baseline has the larger share until the last step; at 100%
  it serves nothing, so the baseline numbers of the last step with min_samples baseline requests stand in.
Each bound uses alpha = 0.05. Each step's agreement is tested afresh, so a false promotion needs every step's
sequence to clear a threshold the truth is below.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from app.rollout.bounds import ALPHA, agreement_bounds, proportion_bounds
from app.rollout.evidence import StepEvidence
from app.rollout.spec import Decision, RolloutSpec


@dataclass(frozen=True)
class StepDecision:
    decision: Decision
    reason: str
    samples: int
    agreement: float | None
    ci: tuple[float, float]
    p99_ratio: float | None
    error_rate_delta: float | None


def decide(
    spec: RolloutSpec, ev: StepEvidence, step_started_at: float, now: float, *, alpha: float = ALPHA
) -> StepDecision:
    """Advance, hold or roll back, on this step's evidence (the rules: this module's docstring)."""
    m, n = spec.min_samples, ev.comparisons
    lo, hi = agreement_bounds(ev.agreements, n, alpha, centre=spec.min_agreement)
    cand, base = ev.candidate, ev.baseline
    p99_c, p99_b = cand.p99(), base.p99()
    ratio = p99_c / p99_b if p99_c is not None and p99_b else None
    err_c, err_b = cand.error_rate(), base.error_rate()
    delta = err_c - err_b if err_c is not None and err_b is not None else None

    def out(decision: Decision, reason: str) -> StepDecision:
        agreement = ev.agreements / n if n else None
        return StepDecision(decision, reason, n, agreement, (lo, hi), ratio, delta)

    if hi < spec.min_agreement:
        return out("rollback", f"top-1 agreement upper bound {hi:.4f} < {spec.min_agreement}")
    timed = cand.timed >= m and base.timed >= m
    limit_ms = spec.max_p99_ratio * p99_b if p99_b is not None else math.inf
    p99_floor = cand.p99_lower(alpha) if timed else None
    if p99_floor is not None and p99_floor > limit_ms:
        return out("rollback", f"candidate p99 lower bound {p99_floor} ms > {spec.max_p99_ratio} x {p99_b} ms")
    counted = cand.requests >= m and base.requests >= m
    if counted and err_b is not None:
        err_floor = proportion_bounds(cand.errors, cand.requests, alpha)[0]
        if err_floor - err_b > spec.max_error_rate_delta:
            return out("rollback", f"candidate error rate lower bound {err_floor:.5f} > {err_b:.5f} + delta")

    waiting = []
    if n < m:
        waiting.append(f"{n}/{m} comparisons")
    elif lo < spec.min_agreement:
        waiting.append(f"agreement lower bound {lo:.4f} < {spec.min_agreement}")
    if not timed:
        waiting.append(f"latency samples {cand.timed}/{m} candidate, {base.timed}/{m} baseline")
    elif ratio is None or ratio > spec.max_p99_ratio:
        waiting.append(f"p99 ratio {'none' if ratio is None else f'{ratio:.3f}'} > {spec.max_p99_ratio}")
    if not counted:
        waiting.append(f"requests {cand.requests}/{m} candidate, {base.requests}/{m} baseline")
    elif delta is None or delta > spec.max_error_rate_delta:
        waiting.append(f"error rate delta {'none' if delta is None else f'{delta:.5f}'} > {spec.max_error_rate_delta}")
    if now - step_started_at < spec.step_min_s:
        waiting.append(f"{now - step_started_at:.0f}/{spec.step_min_s:.0f} s")
    return out("hold", "waiting: " + "; ".join(waiting)) if waiting else out("advance", "every gate passed")
