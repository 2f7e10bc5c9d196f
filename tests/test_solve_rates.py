"""Notebook 07's statistics: the Wilson interval and Fisher's exact test against known values
(textbook examples, and SciPy's implementations where SciPy is installed)."""

import math

import pytest

from mha_course.lessons.solve_rates import fisher_exact, wilson_interval


def test_wilson_interval_known_values():
    # Newcombe (1998), Statistics in Medicine 17:857, Table I, example (a): 81 of 263 -> 0.2553 to 0.3662
    low, high = wilson_interval(81, 263)
    assert (round(low, 4), round(high, 4)) == (0.2553, 0.3662)
    # 0 of n: the lower end is 0 and the upper end z²/(n + z²) (here 1.96² / (20 + 1.96²))
    z2 = 1.959963984540054**2
    assert wilson_interval(0, 20) == (0.0, pytest.approx(z2 / (20 + z2), abs=1e-12))
    assert wilson_interval(20, 20) == (pytest.approx(20 / (20 + z2), abs=1e-12), 1.0)


@pytest.mark.parametrize("k, n", [(0, 5), (3, 5), (7, 20), (10, 20), (19, 20), (20, 20)])
def test_wilson_interval_equals_scipy(k, n):
    stats = pytest.importorskip("scipy.stats")
    ref = stats.binomtest(k, n).proportion_ci(confidence_level=0.95, method="wilson")
    low, high = wilson_interval(k, n)
    assert math.isclose(low, ref.low, abs_tol=1e-12) and math.isclose(high, ref.high, abs_tol=1e-12)
    assert low <= k / n <= high


def test_wilson_interval_narrows_with_more_runs_and_lower_confidence():
    width = [b - a for a, b in (wilson_interval(n // 2, n) for n in (10, 20, 40, 80))]
    assert width == sorted(width, reverse=True)
    a90, b90 = wilson_interval(7, 20, confidence=0.90)
    a95, b95 = wilson_interval(7, 20)
    assert a95 < a90 < b90 < b95


def test_fisher_exact_known_values():
    # Fisher's tea-tasting experiment: 3 of 4 cups right against 1 of 4, two-sided p = 34/70
    assert fisher_exact(3, 4, 1, 4) == pytest.approx(34 / 70, abs=1e-12)
    assert fisher_exact(5, 10, 5, 10) == pytest.approx(1.0)
    # the most extreme split of 20 and 20 runs: 2 / C(40, 20)
    assert fisher_exact(0, 20, 20, 20) == pytest.approx(2 / math.comb(40, 20), rel=1e-9)


@pytest.mark.parametrize(
    "k1, n1, k2, n2", [(1, 5, 3, 5), (5, 20, 12, 20), (4, 20, 10, 20), (0, 20, 7, 20), (3, 7, 9, 11)]
)
def test_fisher_exact_equals_scipy(k1, n1, k2, n2):
    stats = pytest.importorskip("scipy.stats")
    ref = stats.fisher_exact([[k1, n1 - k1], [k2, n2 - k2]]).pvalue
    assert fisher_exact(k1, n1, k2, n2) == pytest.approx(ref, rel=1e-9)
    assert fisher_exact(k2, n2, k1, n1) == pytest.approx(ref, rel=1e-9)


@pytest.mark.parametrize(
    "call, error, words",
    [
        (lambda: wilson_interval(5, 4), ValueError, "k=5, n=4"),
        (lambda: wilson_interval(0, 0), ValueError, "n >= 1"),
        (lambda: wilson_interval(2.0, 4), TypeError, "k must be an int"),
        (lambda: wilson_interval(2, 4, confidence=95), ValueError, "confidence"),
        (lambda: fisher_exact(1, 4, -1, 4), ValueError, "k=-1"),
    ],
)
def test_bad_counts_are_named(call, error, words):
    with pytest.raises(error, match=words):
        call()


def test_fisher_power_matches_a_simulation_and_holds_its_level():
    import random

    from mha_course.lessons import solve_rates as sr

    rng, hits, trials = random.Random(0), 0, 4000
    for _ in range(trials):  # draw two binomial samples of 20 runs, count how often the test says "supported"
        k1 = sum(rng.random() < 0.7 for _ in range(20))
        k2 = sum(rng.random() < 0.9 for _ in range(20))
        hits += sr.fisher_exact(k1, 20, k2, 20) < 0.05
    assert abs(sr.fisher_power(0.7, 0.9, 20) - hits / trials) < 0.03  # ≈ 0.24, a 3-σ band of the simulation
    assert sr.fisher_power(0.5, 0.5, 20) <= 0.05  # no difference: the test rejects at most at its level
    assert sr.fisher_power(0.05, 0.95, 20) > 0.99
    assert sr.fisher_power(0.7, 0.9, 80) > sr.fisher_power(0.7, 0.9, 20)
    with pytest.raises(ValueError, match="p1"):
        sr.fisher_power(1.5, 0.5, 20)
