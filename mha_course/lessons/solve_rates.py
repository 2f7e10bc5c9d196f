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
"""

from __future__ import annotations

import math
from statistics import NormalDist

__all__ = ["wilson_interval", "fisher_exact"]


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
