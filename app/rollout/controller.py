"""The rollout controller's logic, over ports: start, tick about once a second, abort; persisted after every change.

Pure asyncio with its I/O passed in (`Ports`), so it is tested without Ray; `app.serve.deployments`'s
RolloutController runs it on Serve's handles and Ray's internal KV (in the GCS: with GCS fault tolerance
it survives a restart of the head, and a restarted controller replica resumes at the same step).

Weights reach the Routers through the ledger's board (`app.rollout.board`): every tick pushes the override
(the step's weights, and a floor under the shadow fraction so the step can collect `min_samples` comparisons
in about `step_min_s`), so a restarted ledger has it again within a second. A promoted or rolled-back rollout
leaves its final weights in force until the Routers' user_config is deployed again (`user_config` in `get()`
is the block to paste); an aborted one, or one interrupted by such a deploy, clears them at once.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Protocol

from pydantic import ValidationError

from app.errors import ServiceError
from app.rollout.evidence import LedgerCounts
from app.rollout.spec import RolloutSpec
from app.rollout.state import Rollout

logger = logging.getLogger("ray.serve")
SHADOW_FLOOR = (0.05, 0.5)  # the shadow fraction a running rollout asks for, at least and at most


class Ports(Protocol):
    async def snapshot(self) -> dict[str, Any]:
        """The ledger's `snapshot()`: stats, since, config_id, weights, config_changed."""
        ...

    async def set_override(self, override: dict[str, Any] | None) -> None: ...

    async def load(self) -> dict[str, Any] | None: ...

    async def save(self, state: dict[str, Any]) -> None: ...


def _spec(body: Any, variants: list[str]) -> RolloutSpec:
    try:
        spec = RolloutSpec.model_validate(body)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "body"
        raise ServiceError("invalid_parameter", f"{where}: {first['msg']}") from None
    unknown = sorted({spec.candidate, spec.baseline} - set(variants))
    if unknown:
        raise ServiceError("unknown_variant", f"unknown variants {unknown}; deployed: {sorted(variants)}")
    return spec


class RolloutService:
    def __init__(self, ports: Ports, variants: list[str]) -> None:
        self.ports = ports
        self.variants = variants
        self.rollout: Rollout | None = None
        self.config_id: str | None = None
        self.generation = 0
        self._rate: tuple[float, int] | None = None  # (time, requests of the pair) at the rollout's first tick
        self._last: tuple[float, int] = (0.0, 0)  # and at the latest

    async def restore(self) -> None:
        """Resume what a previous replica left (nothing: idle)."""
        saved = await self.ports.load()
        if saved:
            rollout = Rollout.from_dict(saved["rollout"])
            self.generation = int(saved["generation"])
            missing = {rollout.spec.candidate, rollout.spec.baseline} - set(self.variants)
            if missing:  # the application was deployed without them: that rollout is over
                logger.warning("rollout %d dropped: variants %s are no longer deployed", self.generation, missing)
                return
            self.rollout, self.config_id = rollout, saved["config_id"]
            logger.info("rollout resumed: %s at step %d", self.rollout.state, self.rollout.step)

    async def start(self, body: Any, router: dict[str, Any] | None = None, now: float | None = None) -> dict[str, Any]:
        """`router`: the config of the Router relaying the request ({"config_id", "weights"}), the freshest there
        is; without it, the latest a Router reported to the ledger."""
        if self.rollout is not None and self.rollout.state == "running":
            raise ServiceError("conflict", "a rollout is already running: abort it first (POST /v1/rollout/abort)")
        spec = _spec(body, self.variants)
        seen = router if router and router.get("config_id") else await self.ports.snapshot()
        if seen["config_id"] is None:
            raise ServiceError("not_ready", "no Router has reported its configuration yet; retry in a second")
        named = set(seen["weights"]) | {spec.candidate, spec.baseline}  # what the config weighs, and the two
        start_weights = {v: float(seen["weights"].get(v, 0.0)) for v in self.variants if v in named}
        if start_weights.get(spec.baseline, 0.0) <= 0:
            raise ServiceError(
                "conflict",
                f"the baseline {spec.baseline} carries no traffic (weights {start_weights}): the ramp moves the "
                "baseline's share to the candidate step by step; give the baseline a weight first",
            )
        self.config_id, self.generation = seen["config_id"], self.generation + 1
        self.rollout, self._rate = Rollout(spec, start_weights), None
        logger.info("rollout %d started: %s", self.generation, spec.model_dump(mode="json"))
        await self.tick(now)
        return self.describe()

    async def abort(self, now: float | None = None) -> dict[str, Any]:
        if self.rollout is None or not self.rollout.abort():
            raise ServiceError("conflict", "no rollout is running")
        logger.info("rollout %d aborted by request at step %d", self.generation, self.rollout.step)
        await self._publish()
        return self.describe()

    async def tick(self, now: float | None = None) -> None:
        """Decide on the evidence so far (while running), then push the weights and save."""
        r = self.rollout
        if r is None:
            return
        now = time.time() if now is None else now
        if r.state == "running":
            snap = await self.ports.snapshot()
            if snap["config_changed"]:  # a Router reported another config while our weights were up
                r.abort("the Routers' user_config was deployed again during the rollout: the deploy wins")
                logger.warning("rollout %d aborted: %s", self.generation, r.reason)
            else:
                counts = LedgerCounts.from_abstats(snap["stats"], r.spec.candidate, r.spec.baseline, snap["since"])
                self._observe_rate(counts, now)
                record = r.tick(counts, now)
                if record is not None and record.decision != "hold":
                    logger.info(
                        "rollout %d step %s%%: %s (%s)",
                        self.generation,
                        record.weight,
                        record.decision,
                        record.to_dict(),
                    )
        await self._publish()

    def _observe_rate(self, counts: LedgerCounts, now: float) -> None:
        total = counts.candidate.requests + counts.baseline.requests
        self._rate = (now, total) if self._rate is None else self._rate
        self._last = (now, total)

    def shadow_floor(self) -> float:
        """The shadow fraction that collects min_samples comparisons in about step_min_s at the measured rate."""
        r = self.rollout
        lo, hi = SHADOW_FLOOR
        if r is None or self._rate is None:
            return lo
        (t0, n0), (t1, n1) = self._rate, self._last
        rate = (n1 - n0) / (t1 - t0) if t1 > t0 else 0.0
        if rate <= 0:
            return hi
        return min(hi, max(lo, r.spec.min_samples / (rate * max(1.0, r.spec.step_min_s))))

    def override(self) -> dict[str, Any] | None:
        r = self.rollout
        if r is None or r.state == "aborted":
            return None
        running = r.state == "running"
        return {
            "weights": r.weights(),
            "shadow_fraction": self.shadow_floor() if running else 0.0,
            "pair": [r.spec.candidate, r.spec.baseline] if running else None,  # whom the shadows compare
            "config_id": self.config_id,
            "generation": f"{self.generation}.{r.state}.{r.step}",
        }

    async def _publish(self) -> None:
        await self.ports.set_override(self.override())
        if self.rollout is not None:
            state = {"rollout": self.rollout.to_dict(), "config_id": self.config_id, "generation": self.generation}
            await self.ports.save(state)

    def describe(self) -> dict[str, Any]:
        """GET /v1/rollout."""
        r = self.rollout
        if r is None:
            return {"state": "idle", "step": None, "weights": None, "reason": "", "steps": []}
        steps = [rec.to_dict() for rec in r.history]
        if r.last is not None and r.last not in r.history:
            steps.append(r.last.to_dict())
        out: dict[str, Any] = {
            "state": r.state,
            "step": r.step,
            "weights": r.weights(),
            "reason": r.reason,
            "steps": steps,
            "spec": r.spec.model_dump(mode="json"),
            "rollout": self.generation,
        }
        if r.state in ("promoted", "rolled_back") and not r.spec.dry_run:
            out["user_config"] = {"weights": r.weights()}  # paste into the Router's user_config to keep it
        return out
