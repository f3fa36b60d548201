"""The A/B policy, pure: weights, a sticky hash of a user id, and an explicit override.

No Ray and no HTTP here: the Router hands in what it read from the request and
gets back which variant serves it and why.
"""

from __future__ import annotations

import bisect
import hashlib
import random
from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from itertools import accumulate

from app.errors import ServiceError


@dataclass(frozen=True)
class Choice:
    variant: str
    reason: str  # "override" | "sticky" | "weighted" | "failover"


def sticky_point(user_id: str) -> float:
    """A stable point in [0, 1) for a user id: the same on every replica, host and restart."""
    digest = hashlib.blake2b(user_id.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


class WeightedSplit:
    """Maps a point in [0, 1) to a variant in proportion to the weights.

    Variants are laid out in name order, so a given point (a given user) maps
    to the same variant for as long as the weights stand, on every replica.
    """

    def __init__(self, weights: Mapping[str, float]) -> None:
        names = sorted(name for name, w in weights.items() if w > 0)
        if not names:
            raise ValueError(f"no variant has a positive weight: {dict(weights)}")
        total = sum(weights[n] for n in names)
        self.variants = names
        self.fractions = {n: weights[n] / total for n in names}
        self._bounds = list(accumulate(weights[n] / total for n in names))
        self._bounds[-1] = 1.0  # no float gap at the top

    def pick(self, point: float) -> str:
        return self.variants[min(bisect.bisect_right(self._bounds, point), len(self.variants) - 1)]


def choose_variant(
    split: WeightedSplit,
    known: Mapping[str, object] | AbstractSet[str],
    user_id: str | None,
    override: str | None,
    allow_override: bool,
    rng: random.Random | None = None,
) -> Choice:
    """Override first (when allowed), then the sticky user id, then a weighted random draw."""
    if override:
        if not allow_override:
            raise ServiceError("override_forbidden", "choosing a variant by header is disabled on this service")
        if override not in known:
            raise ServiceError("unknown_variant", f"unknown variant {override!r}; known: {sorted(known)}")
        return Choice(override, "override")
    if user_id:
        return Choice(split.pick(sticky_point(user_id)), "sticky")
    return Choice(split.pick((rng or random).random()), "weighted")


def failover_order(chosen: str, known: list[str], split: WeightedSplit) -> list[str]:
    """Other variants to try when `chosen` is down: weighted ones first, by weight, then the rest."""
    others = [v for v in known if v != chosen]
    return sorted(others, key=lambda v: (-split.fractions.get(v, 0.0), v))


class VariantHealth:
    """Which variants can take a request now, so a dead variant costs a fast 503 or a failover, not a wait.

    Two signals: a replica failure seen on the request path marks the variant down for
    `hold_s` (renewed by every further failure), and the controller's count of RUNNING
    replicas (polled by the Router) marks it down while it has none. Either clears by itself:
    the hold expires, and the count comes back when Serve has replaced the replicas.
    """

    # Serve's controller health-checks replicas every 10 s by default, so it can take that long to
    # stop counting a dead replica as RUNNING; a failure seen on the request path bridges the gap.
    def __init__(self, hold_s: float = 10.0) -> None:
        self.hold_s = hold_s
        self.down_until: dict[str, float] = {}
        self.running: dict[str, int] = {}
        self.routable: dict[str, int] = {}  # replicas the Router's own handle can reach (None: unknown)

    def mark_failed(self, variant: str, now: float) -> None:
        self.down_until[variant] = now + self.hold_s

    def set_running(self, counts: Mapping[str, int]) -> None:
        self.running = dict(counts)

    def recently_troubled(self, now: float, quiet_s: float) -> bool:
        """A failure within quiet_s, or a variant the controller last saw with no replica."""
        last = max(self.down_until.values(), default=float("-inf")) - self.hold_s
        return now - last < quiet_s or any(n == 0 for n in self.running.values())

    def set_routable(self, counts: Mapping[str, int | None]) -> None:
        self.routable = {v: n for v, n in counts.items() if n is not None}

    def has_replicas(self, variant: str) -> bool:
        return self.running.get(variant, 1) > 0 and self.routable.get(variant, 1) > 0

    def available(self, variant: str, now: float) -> bool:
        return self.has_replicas(variant) and self.down_until.get(variant, 0.0) <= now


def candidates(
    choice: Choice, known: list[str], split: WeightedSplit, failover: bool, health: VariantHealth, now: float
) -> list[str]:
    """Variants to try, in order: the chosen one if it is up, then (with failover) the others that are up.

    A recent failure only steers traffic away when another variant can take it; with no
    alternative, a variant is still tried unless the controller says it has no replica at all.
    A forced choice (override header, or a V2 model name) never fails over.
    """
    order = [choice.variant]
    if failover and choice.reason not in ("override", "model"):
        order += failover_order(choice.variant, known, split)
    healthy = [v for v in order if health.available(v, now)]
    return healthy or [v for v in order if health.has_replicas(v)]
