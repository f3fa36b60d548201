"""Anytime-valid confidence bounds for a proportion: the beta-mixture confidence sequence.

Why not the Wilson interval (`app.pipeline.abstats`): it covers the true p with 95% probability at one sample size
fixed in advance. A rollout re-reads the evidence every second and acts the first time the interval clears the
threshold; the chance that a fixed-n interval misses p at *some* look grows towards 1 with the number of looks
(law of the iterated logarithm). Re-checked at every n up to 2,000, the Wilson interval misses p = 0.95 in half
of the sequences and this sequence in under 3% (tests/test_rollout_unit.py): with Wilson, a candidate slightly
worse than the threshold would be promoted far more often than 5% of the time.

The bound here. For S successes in n Bernoulli trials and a Beta(a, b) mixing distribution fixed in advance,

    M_n(p) = B(a + S, b + n - S) / B(a, b) / (p^S (1 - p)^(n - S))

is the beta-binomial mixture's likelihood ratio against Bernoulli(p) (equivalently the prior-to-posterior density
ratio at p). If p is the truth, M_n(p) is a nonnegative martingale with mean 1, so by Ville's inequality
P(M_n(p) >= 1/alpha for some n) <= alpha, and C_n = {p : M_n(p) < 1/alpha} contains the true p at every n at once
with probability >= 1 - alpha: a confidence sequence. It is valid at any data-dependent stopping time, which is
how the controller uses it. log M_n(p) is convex in p with its minimum at p_hat = S/n, where M_n <= 1 (a
mixture's likelihood never exceeds the maximum likelihood), so C_n is an interval around p_hat; each end is found
by bisection. Sources: Robbins (1970), "Statistical methods related to the law of the iterated logarithm",
Ann. Math. Statist. 41(5); Lai (1976), "On confidence sequences", Ann. Statist. 4(2); the general method of
mixtures in Howard, Ramdas, McAuliffe & Sekhon (2021), "Time-uniform, nonparametric, nonasymptotic confidence
sequences", Ann. Statist. 49(2); the prior-posterior-ratio view in Waudby-Smith & Ramdas (2020), "Confidence
sequences for sampling without replacement", NeurIPS.

The prior. Any Beta(a, b) chosen before the data gives a valid sequence; it only moves where the interval is
tightest. `agreement_bounds` centres it on the agreement the gate asks for, with the weight of 50 observations
(Beta(47.5, 2.5) for 0.95): at a true agreement of 0.97 the lower bound clears 0.95 after ~900 comparisons
against ~1,500 with a uniform prior, and at 0.93 the upper bound falls below 0.95 after ~1,300 against ~1,900.
A candidate far from the centre (agreement 0.5) is still rejected within ~20 comparisons.
"""

from __future__ import annotations

import math
from functools import lru_cache

ALPHA = 0.05  # two-sided: P(the sequence ever misses p) <= 5%
PRIOR_STRENGTH = 50.0  # the agreement prior weighs as much as 50 comparisons
_BISECTIONS = 40  # 2^-40 ~ 1e-12: far below any threshold's meaning


def _log_beta(a: float, b: float) -> float:
    return math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b)


def _log_ratio(p: float, successes: int, failures: int, log_mixture: float) -> float:
    """log M_n(p), given log B(a + S, b + F) - log B(a, b)."""
    out = log_mixture
    if successes:
        out -= successes * math.log(p)
    if failures:
        out -= failures * math.log1p(-p)
    return out


@lru_cache(maxsize=65536)
def proportion_bounds(
    successes: int, n: int, alpha: float = ALPHA, a: float = 1.0, b: float = 1.0
) -> tuple[float, float]:
    """The beta(a, b)-mixture confidence sequence for a proportion at (successes, n): valid at every n at once.

    Rounded outwards (each end is the last bisection point known to be outside the set). Cached: the controller
    asks again every second, mostly with the same counts."""
    if not 0 <= successes <= n:
        raise ValueError(f"need 0 <= successes <= n, got {successes}, {n}")
    if n == 0:
        return 0.0, 1.0
    failures = n - successes
    log_mixture = _log_beta(a + successes, b + failures) - _log_beta(a, b)
    threshold = math.log(1 / alpha)
    p_hat = successes / n

    def edge(out: float) -> float:
        """The set's end between p_hat (inside: log M <= 0) and `out` (log M -> +inf): the last point outside."""
        inside = p_hat
        for _ in range(_BISECTIONS):
            mid = (out + inside) / 2
            if _log_ratio(mid, successes, failures, log_mixture) >= threshold:
                out = mid
            else:
                inside = mid
        return out

    return (edge(0.0) if successes else 0.0), (edge(1.0) if failures else 1.0)


def agreement_bounds(
    successes: int, n: int, alpha: float = ALPHA, *, centre: float = 0.95, strength: float = PRIOR_STRENGTH
) -> tuple[float, float]:
    """(lo, hi) containing the true top-1 agreement at every n simultaneously with probability >= 1 - alpha.

    n = 0 gives (0.0, 1.0). `centre` should be the min_agreement being tested (fixed before the data)."""
    if not 0 < centre < 1:
        raise ValueError(f"centre must be in (0, 1), got {centre}")
    return proportion_bounds(successes, n, alpha, centre * strength, (1 - centre) * strength)


def _excluded_above(q: float, k: int, n: int, alpha: float, a: float, b: float) -> bool:
    """Whether the sequence at (k, n) lies wholly below q (its upper end < q), tested at q directly."""
    if k >= q * n:
        return False
    return _log_ratio(q, k, n - k, _log_beta(a + k, b + n - k) - _log_beta(a, b)) >= math.log(1 / alpha)


@lru_cache(maxsize=4096)
def quantile_lower_rank(q: float, n: int, alpha: float = ALPHA, strength: float = PRIOR_STRENGTH) -> int:
    """A 1-based rank j with X_(j) <= the true q-quantile for every n at once, with probability >= 1 - alpha;
    0 when n is too small for any.

    Distribution-free, by the order-statistic argument: the count of observations at or below the true quantile
    is Bernoulli(q) data, covered by the sequence above (prior centred on q). Where the sequence at count k lies
    wholly below q, at most k observations can be at or below the quantile on the covering event, so
    X_(k+1) <= quantile. j = 1 + the largest such k (found by bisection: the test is monotone in k)."""
    a, b = q * strength, (1 - q) * strength
    if n == 0 or not _excluded_above(q, 0, n, alpha, a, b):
        return 0
    good, bad = 0, math.ceil(q * n)  # _excluded_above holds at `good`, fails at `bad` (k >= q n)
    while bad - good > 1:
        mid = (good + bad) // 2
        if _excluded_above(q, mid, n, alpha, a, b):
            good = mid
        else:
            bad = mid
    return min(good + 1, n)
