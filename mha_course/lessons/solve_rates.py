"""How sure is a solve rate? Intervals and a two-sample test for "k of n runs solved" (notebook 07).

A training run either solves the task or not, so k solved runs of n are a binomial sample of
the configuration's true solve rate. With 20 runs the rate is known only roughly: 10 of 20 is
compatible with anything from about 0.3 to 0.7. The notebook reports every rate with its
interval and compares configurations with a test, so that it claims only the differences the
runs support.

* :func:`wilson_interval` — the Wilson score interval (Wilson 1927): the rates p for which the
  normal test of "k of n" against p does not reject. Unlike the textbook p̂ ± z·√(p̂(1-p̂)/n), it
  stays inside [0, 1] and is not empty at 0 of n or n of n.
* :func:`fisher_exact` — Fisher's exact test of "both configurations have the same solve rate",
  two-sided: the probability, given the total number of solved runs, of a split between the two
  configurations at most as likely as the one observed.
* :func:`fisher_power` — how often that test, at n runs each, would call a true difference
  between two rates supported: a "not supported" from a test of low power says little.
"""

from __future__ import annotations

import math
from statistics import NormalDist

__all__ = ["wilson_interval", "fisher_exact", "fisher_power"]


def _counts(k: int, n: int) -> None:
    for name, v in (("k", k), ("n", n)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"{name} must be an int (a count of runs), got {type(v).__name__}")
    if n < 1 or not 0 <= k <= n:
        raise ValueError(f"need 0 <= k <= n and n >= 1 (k solved runs of n), got k={k}, n={n}")


def wilson_interval(k: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """(low, high): the Wilson score interval for a rate observed as ``k`` successes in ``n`` trials."""
    _counts(k, n)
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    z = NormalDist().inv_cdf(0.5 + confidence / 2)  # 1.96 for 95 %
    p = k / n
    denominator = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z / denominator * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)


def fisher_exact(k1: int, n1: int, k2: int, n2: int) -> float:
    """Two-sided p-value of Fisher's exact test: k1 of n1 against k2 of n2 successes."""
    _counts(k1, n1)
    _counts(k2, n2)
    total = k1 + k2

    def probability(a: int) -> float:  # a successes in the first sample, given the total
        return math.comb(n1, a) * math.comb(n2, total - a) / math.comb(n1 + n2, total)

    observed = probability(k1)
    splits = range(max(0, total - n2), min(n1, total) + 1)
    return min(1.0, sum(p for p in map(probability, splits) if p <= observed * (1 + 1e-9)))


def fisher_power(p1: float, p2: float, n: int, alpha: float = 0.05) -> float:
    """The power of :func:`fisher_exact` at level ``alpha`` with ``n`` runs per configuration when the
    true solve rates are ``p1`` and ``p2``: the probability, summed exactly over every pair of
    outcomes (k1, k2) of two binomial samples, that the test gives p < alpha."""
    for name, p in (("p1", p1), ("p2", p2)):
        if not 0 <= p <= 1:
            raise ValueError(f"{name} must be a rate in [0, 1], got {p}")
    _counts(0, n)
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")

    def binomial(k: int, p: float) -> float:
        return math.comb(n, k) * p**k * (1 - p) ** (n - k)

    return sum(
        binomial(k1, p1) * binomial(k2, p2)
        for k1 in range(n + 1)
        for k2 in range(n + 1)
        if fisher_exact(k1, n, k2, n) < alpha
    )
