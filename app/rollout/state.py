"""The ramp's state machine (`Rollout`) and its step records: what `GET /v1/rollout` will report and what a
restarted controller resumes from (`to_dict` / `from_dict`)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any, get_args

from app.rollout.decide import StepDecision, decide
from app.rollout.evidence import LedgerCounts, StepEvidence, VariantCounts
from app.rollout.spec import Decision, RolloutSpec, State


def _r6(x: float | None) -> float | None:
    return None if x is None else round(x, 6)


@dataclass(frozen=True)
class StepRecord:
    """What the rollout reports for a step (JSON via `to_dict`; numbers rounded to 6 places when made, so the
    JSON round trip is exact); `reason` says which gate decided."""

    weight: float
    samples: int
    agreement: float | None
    ci: tuple[float, float]
    p99_ratio: float | None
    error_rate_delta: float | None
    decision: Decision
    at: str
    reason: str = ""

    @classmethod
    def of(cls, weight: float, d: StepDecision, now: float) -> StepRecord:
        at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))
        ci = (round(d.ci[0], 6), round(d.ci[1], 6))
        agreement, ratio, delta = _r6(d.agreement), _r6(d.p99_ratio), _r6(d.error_rate_delta)
        return cls(weight, d.samples, agreement, ci, ratio, delta, d.decision, at, d.reason)

    def to_dict(self) -> dict[str, Any]:
        return {
            "weight": self.weight,
            "samples": self.samples,
            "agreement": self.agreement,
            "ci": list(self.ci),
            "p99_ratio": self.p99_ratio,
            "error_rate_delta": self.error_rate_delta,
            "decision": self.decision,
            "at": self.at,
            "reason": self.reason,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> StepRecord:
        lo, hi = d["ci"]
        return cls(
            float(d["weight"]),
            int(d["samples"]),
            d["agreement"],
            (float(lo), float(hi)),
            d["p99_ratio"],
            d["error_rate_delta"],
            d["decision"],
            str(d["at"]),
            str(d.get("reason", "")),
        )


@dataclass
class Rollout:
    """The ramp's state. `tick` once a second with the ledger's cumulative counts; apply `weights()` after each.

    A step's evidence starts at its first tick (`start`), not at the tick that moved to it, so the second or so
    in which Routers still route by the old weights is not counted at the new weight. `history` keeps the records
    that ended a step; `last` is the latest tick's."""

    spec: RolloutSpec
    start_weights: dict[str, float]
    state: State = "running"
    reason: str = ""
    step: int = 0
    step_started_at: float | None = None
    start: LedgerCounts | None = None
    reference: VariantCounts | None = None  # the baseline's numbers of the last step where it had min_samples
    history: list[StepRecord] = field(default_factory=list)
    last: StepRecord | None = None

    @property
    def weight(self) -> float:
        return self.spec.steps[self.step]

    def weights(self) -> dict[str, float]:
        """The weights the Router should have now, in percent of all traffic (the starting ones under dry_run or
        after abort). The step's weight is the candidate's percentage of the traffic the pair had at the start
        (all of it with two variants); any other variant keeps its own share."""
        total = sum(self.start_weights.values())
        if total <= 0:  # no split to speak of (only a hand-made saved state): leave the Routers as they are
            return dict(self.start_weights)
        percent = {v: round(w * 100.0 / total, 6) for v, w in self.start_weights.items()}
        if self.spec.dry_run or self.state == "aborted":
            return percent
        cand, base = self.spec.candidate, self.spec.baseline
        pair = self.pair_share * 100.0 / total
        w = 0.0 if self.state == "rolled_back" else self.weight
        return {**percent, cand: round(pair * w / 100.0, 6), base: round(pair * (100.0 - w) / 100.0, 6)}

    @property
    def pair_share(self) -> float:
        """The weight the candidate and the baseline had together at the start (the traffic the ramp moves)."""
        return self.start_weights.get(self.spec.candidate, 0.0) + self.start_weights.get(self.spec.baseline, 0.0)

    def step_evidence(self, counts: LedgerCounts, now: float) -> StepEvidence:
        """This step's evidence, starting the step's clock and snapshot at its first tick and after a ledger reset
        (everything the reset ledger holds then was counted within the step)."""
        if self.start is None or self.step_started_at is None:
            self.start, self.step_started_at = counts, now
        ev = counts.minus(self.start)
        if ev is None:
            self.start = LedgerCounts(since=counts.since)
            ev = counts.minus(self.start)
            assert ev is not None
        if ev.baseline.requests < self.spec.min_samples and self.reference is not None:
            ev = replace(ev, baseline=self.reference)
        return ev

    def tick(self, counts: LedgerCounts, now: float) -> StepRecord | None:
        """Decide on this step's evidence and move; the step's record, or None once the rollout has ended."""
        if self.state != "running":
            return None
        ev = self.step_evidence(counts, now)
        assert self.step_started_at is not None
        d = decide(self.spec, ev, self.step_started_at, now)
        record = self.last = StepRecord.of(self.weight, d, now)
        if d.decision == "rollback":
            self.history.append(record)
            self.state, self.reason = "rolled_back", d.reason
        elif d.decision == "advance":
            self.history.append(record)
            own = counts.baseline.minus(self.start.baseline) if self.start is not None else None
            if own is not None and own.requests >= self.spec.min_samples:
                self.reference = own  # the baseline's own numbers, for the steps where it serves too little
            if self.step + 1 == len(self.spec.steps):
                self.state, self.reason = "promoted", f"{self.spec.candidate} passed every step"
            else:
                self.step += 1
                self.start = self.step_started_at = None
                self.reason = f"advanced to {self.weight}%"
        return record

    def abort(self, reason: str = "aborted by request") -> bool:
        """Stop a running rollout and go back to the starting weights; False if it had already ended."""
        if self.state != "running":
            return False
        if self.last is not None and self.last not in self.history:
            self.history.append(self.last)
        self.state, self.reason = "aborted", reason
        return True

    def to_dict(self) -> dict[str, Any]:
        return {
            "spec": self.spec.model_dump(mode="json"),
            "start_weights": dict(self.start_weights),
            "state": self.state,
            "reason": self.reason,
            "step": self.step,
            "weight": self.weight,
            "weights": self.weights(),
            "step_started_at": self.step_started_at,
            "start": self.start.to_dict() if self.start else None,
            "reference": self.reference.to_dict() if self.reference else None,
            "history": [r.to_dict() for r in self.history],
            "last": self.last.to_dict() if self.last else None,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Rollout:
        if d["state"] not in get_args(State):
            raise ValueError(f"unknown rollout state {d['state']!r}")
        return cls(
            spec=RolloutSpec.model_validate(d["spec"]),
            start_weights={k: float(v) for k, v in d["start_weights"].items()},
            state=d["state"],
            reason=d["reason"],
            step=int(d["step"]),
            step_started_at=d["step_started_at"],
            start=LedgerCounts.from_dict(d["start"]) if d["start"] else None,
            reference=VariantCounts.from_dict(d["reference"]) if d["reference"] else None,
            history=[StepRecord.from_dict(r) for r in d["history"]],
            last=StepRecord.from_dict(d["last"]) if d["last"] else None,
        )
