"""The stopping rule of --precision-target (harness/stats/sequential.py): its interval's coverage
under optional stopping, against a planted naive rule, and the pairs it takes (simulated pairs,
no model; MEASUREMENT.md, "Timing to a precision target")."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from harness.stats.sequential import (LookSchedule, fixed_n_pairs, half_width_rel, median_interval, pairs_needed,
                                      ratio_interval)

RHO, SIGMA, TARGET, RUNS = 1.08, 0.05, 0.03, 1000


def _rule(r: np.ndarray, sched: LookSchedule) -> tuple[float, float, int, str]:
    """The rule of harness.sweep.timed.time_rounds on one run's pairs (no budget)."""
    for n in sched.looks:
        med, lo, hi = sched.interval(r[:n])
        if half_width_rel(med, lo, hi) <= TARGET:
            return lo, hi, n, "precise"
    return lo, hi, n, "max_rounds"


def _naive(R: np.ndarray, rng, n_min: int = 5, boot: int = 500) -> tuple[np.ndarray, np.ndarray]:
    """The planted naive rule: a 95 % percentile bootstrap of the median ratio peeked after every
    round from n_min, stopping at the first round within the target. Returns (covered, stop)."""
    runs, n_max = R.shape
    alive = np.ones(runs, bool)
    covered, stop = np.zeros(runs, bool), np.full(runs, n_max)
    for n in range(n_min, n_max + 1):
        idx = np.flatnonzero(alive)
        if not idx.size:
            break
        x = R[idx, :n]
        meds = np.median(x[:, rng.integers(0, n, size=(boot, n))], axis=2)
        lo, hi = np.percentile(meds, [2.5, 97.5], axis=1)
        done = ((hi - lo) / (2 * np.median(x, axis=1)) <= TARGET) | (n == n_max)
        covered[idx[done]] = ((lo <= RHO) & (RHO <= hi))[done]
        stop[idx[done]] = n
        alive[idx[done]] = False
    return covered, stop


def test_rule_covers_under_optional_stopping_where_a_peeking_bootstrap_does_not():
    rng = np.random.default_rng(7)
    R = RHO * np.exp(rng.normal(0.0, SIGMA, size=(RUNS, 400)))  # i.i.d. log-normal pair ratios
    sched = LookSchedule.make(10, 400)
    got = [_rule(r, sched) for r in R]
    cover = np.mean([lo <= RHO <= hi for lo, hi, _, _ in got])
    stops = np.array([n for _, _, n, _ in got])
    assert cover >= 0.93, cover
    assert all(s in sched.looks and s % 2 == 0 for s in stops)  # looks after whole ABBA cycles only
    assert {why for *_, why in got} == {"precise"}
    # the median stop against a fixed-n design that knew the spread and used the same interval
    # (K looks at 1 − α/K): the fewest pairs whose median half-width is within the target; the
    # rule stops within 1.5× of it (the look grid's overshoot). Against the nominal 95 % design it
    # pays (z(α/2K) / z(α/2))² on top (about 2×), the price of validity under optional stopping.
    n_fixed = next(n for n in range(2, 400, 2)
                   if np.median([half_width_rel(*sched.interval(r[:n])) for r in R[:200]]) <= TARGET)
    assert np.median(stops) <= 1.5 * n_fixed, (np.median(stops), n_fixed)
    assert n_fixed > 1.5 * fixed_n_pairs(SIGMA, TARGET)  # the price, stated in MEASUREMENT.md
    penalty = (stats.norm.ppf(1 - sched.alpha / (2 * len(sched.looks))) / stats.norm.ppf(0.975)) ** 2
    assert fixed_n_pairs(SIGMA, TARGET, sched.conf) == pytest.approx(penalty * fixed_n_pairs(SIGMA, TARGET))
    covered, naive_stops = _naive(R[:, :60], np.random.default_rng(8))
    assert covered.mean() < 0.90, covered.mean()
    assert np.median(naive_stops) < np.median(stops)  # it stops early because it is too narrow


def test_median_interval_is_the_binomial_order_statistics():
    r = np.arange(1.0, 21.0)  # 20 values, median 10.5
    med, lo, hi = median_interval(r, 0.95)
    # P(Bin(20, 1/2) <= 5) = 0.0207 <= 0.025 < P(<= 6) = 0.0577: l − 1 = 5, so [x_(6), x_(15)]
    assert (med, lo, hi) == (10.5, 6.0, 15.0)
    assert stats.binom.cdf(5, 20, 0.5) <= 0.025 < stats.binom.cdf(6, 20, 0.5)
    # too few values for the level: no interval (even [min, max] covers only 1 − 2/2^n)
    assert math.isnan(median_interval(r[:5], 0.95)[1])
    assert median_interval(r[:6], 0.95)[1:] == (1.0, 6.0)  # 1 − 2/64 = 0.969 >= 0.95
    with pytest.raises(ValueError, match="conf"):
        median_interval(r, 1.0)


def test_exact_coverage_of_one_fixed_look():
    rng = np.random.default_rng(3)
    R = np.exp(rng.standard_t(3, size=(4000, 30)))  # heavy tails: the interval is distribution-free
    hits = [lo <= 1.0 <= hi for lo, hi in (median_interval(r, 0.9)[1:] for r in R)]
    exact = 1 - 2 * stats.binom.cdf(int(stats.binom.ppf(0.05, 30, 0.5)) - 1, 30, 0.5)
    assert np.mean(hits) == pytest.approx(exact, abs=0.02) and exact >= 0.9


def test_look_schedule():
    s = LookSchedule.make(10, 400)
    assert s.looks == (10, 16, 24, 36, 54, 82, 124, 186, 280, 400)
    assert s.conf == pytest.approx(1 - 0.05 / 10)
    assert LookSchedule.make(9, 31).looks == (10, 16, 24, 30)  # even at both ends
    assert LookSchedule.make(10, 10).looks == (10,) and LookSchedule.make(10, 10).conf == 0.95
    assert LookSchedule.make(4, 40).looks == (10, 16, 24, 36, 40)  # 4 and 6 pairs give no interval at α/7
    with pytest.raises(ValueError, match="min-pairs"):
        LookSchedule.make(12, 10)


def test_pairs_needed_and_the_unsettled_case():
    # ratio 1.04 ± 0.04 (h = 0.04/1.04 relative) at 10 pairs against a 1.06 limit: gap 0.02
    more = pairs_needed(10, 0.04 / 1.04, 1.04, 1.06)
    assert more == pytest.approx(10 * (0.04 / 0.02) ** 2 - 10)
    assert pairs_needed(10, 0.001, 1.04, 1.2) == 0.0  # already clear
    assert pairs_needed(10, 0.05, 1.049, 1.05) is None  # within 1 % of the limit


def test_ratio_interval_is_the_rules_or_the_bootstrap():
    a = [10.0] * 12
    b = [10.0 * (1 + 0.01 * i) for i in range(12)]
    med, lo, hi = ratio_interval(a, b, 0.99)
    assert (med, lo, hi) == median_interval(np.array(b) / 10.0, 0.99)
    boot = ratio_interval(a, b, None)
    assert boot[0] == med and boot[1:] != (lo, hi)
    with pytest.raises(ValueError):
        ratio_interval([1.0, 0.0], [1.0, 1.0], 0.9)
