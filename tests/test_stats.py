"""harness.stats (seeds, bootstrap, curves) against answers computed independently: textbook formulas written out here, and
published results (Student's sleep data, as R's ``t.test`` reports it)."""

from __future__ import annotations

import math

import pytest

from harness.stats import bootstrap, curves, seeds
from harness.stats.seeds import Obs

NC = "not_converged"
#: t_{0.975, 2}; for 2 dof the quantile is closed-form: (2p − 1)/√(2p(1 − p)).
T975_2 = 4.302652729749464


def hand_log_t(ratios, t_crit):
    logs = [math.log(r) for r in ratios]
    n = len(logs)
    m = sum(logs) / n
    sd = math.sqrt(sum((x - m) ** 2 for x in logs) / (n - 1))
    h = t_crit * sd / math.sqrt(n)
    return math.exp(m), math.exp(m - h), math.exp(m + h)


def ok(v):
    return Obs(v)


# --- log_t_interval --------------------------------------------------------------------------

def test_log_t_interval_three_ratios():
    assert T975_2 == pytest.approx((2 * 0.975 - 1) / math.sqrt(2 * 0.975 * 0.025), rel=1e-15)
    got = seeds.log_t_interval([1.1, 0.9, 1.0])
    want = hand_log_t([1.1, 0.9, 1.0], T975_2)
    assert got == pytest.approx(want, rel=1e-12)
    assert got[0] == pytest.approx((1.1 * 0.9 * 1.0) ** (1 / 3), rel=1e-12)
    # the reciprocal ratios give the reciprocal interval
    inv = seeds.log_t_interval([1 / 1.1, 1 / 0.9, 1.0])
    assert inv == pytest.approx((1 / got[0], 1 / got[2], 1 / got[1]), rel=1e-12)


def test_log_t_interval_edges():
    g, lo, hi = seeds.log_t_interval([1.3])
    assert g == pytest.approx(1.3) and math.isnan(lo) and math.isnan(hi)
    assert all(math.isnan(x) for x in seeds.log_t_interval([]))
    for bad in ([1.0, 0.0], [1.0, -2.0], [1.0, float("nan")], [float("inf")]):
        with pytest.raises(ValueError, match="> 0"):
            seeds.log_t_interval(bad)
    with pytest.raises(ValueError, match="conf"):
        seeds.log_t_interval([1.0, 2.0], conf=1.0)


# --- paired_ratio ----------------------------------------------------------------------------

def test_paired_ratio_censored_diverged_missing():
    treat = {1: ok(12.0), 2: Obs(None, NC, 20.0), 3: ok(10.0), 4: ok(8.0), 5: Obs(None, "diverged"),
             6: Obs(None, "missing"), 7: Obs(None, NC, 30.0)}
    base = {1: ok(10.0), 2: ok(16.0), 3: Obs(None, NC, 12.5), 4: ok(8.0), 5: ok(9.0),
            6: ok(7.0), 7: Obs(None, NC, 25.0), 8: ok(5.0)}
    s = seeds.paired_ratio(treat, base)
    assert s.per_seed == {1: pytest.approx(1.2), 2: "> 1.25", 3: "< 0.8", 4: 1.0, 5: "diverged",
                          6: "missing", 7: "n/a", 8: "missing"}
    assert list(s.per_seed) == [1, 2, 3, 4, 5, 6, 7, 8]
    assert (s.n, s.seeds, s.censored, s.diverged, s.missing) == (2, 8, 3, 1, 2)
    assert s.gmean == pytest.approx(math.sqrt(1.2 * 1.0), rel=1e-12)
    # two ratios: t_{0.975,1} = tan(π(0.975 − 1/2))
    want = hand_log_t([1.2, 1.0], math.tan(math.pi * 0.475))
    assert (s.gmean, s.lo, s.hi) == pytest.approx(want, rel=1e-10)
    assert s.conf == 0.95


def test_paired_ratio_no_pairs_and_errors():
    s = seeds.paired_ratio({1: Obs(None, NC, 5.0)}, {1: Obs(None, "diverged")})
    assert s.per_seed == {1: "diverged"} and s.n == 0 and math.isnan(s.gmean)
    with pytest.raises(ValueError, match="seed 3"):
        seeds.paired_ratio({3: ok(None)}, {3: ok(1.0)})
    with pytest.raises(ValueError, match="seed 2: treat bound"):
        seeds.paired_ratio({2: Obs(None, NC)}, {2: ok(1.0)})
    with pytest.raises(ValueError, match="status"):
        Obs(1.0, "oom")


# --- decompose -------------------------------------------------------------------------------

def test_decompose_identity_and_own_intervals():
    tt = {1: ok(100.0), 2: ok(90.0), 3: ok(120.0), 4: Obs(None, NC, 150.0), 5: ok(80.0)}
    ts = {1: ok(1000.0), 2: ok(1000.0), 3: ok(1100.0), 4: Obs(None, NC, 1500.0)}
    bt = {1: ok(110.0), 2: ok(100.0), 3: ok(105.0), 4: ok(100.0), 5: ok(85.0)}
    bs = {1: ok(1200.0), 2: ok(900.0), 3: ok(1000.0), 4: ok(1000.0), 5: ok(950.0)}
    d = seeds.decompose(tt, ts, bt, bs)
    for s in (1, 2, 3):
        assert d.time.per_seed[s] == pytest.approx(tt[s].value / bt[s].value, rel=1e-15)
        assert d.steps.per_seed[s] == pytest.approx(ts[s].value / bs[s].value, rel=1e-15)
        step_ratio = (tt[s].value / ts[s].value) / (bt[s].value / bs[s].value)
        assert d.step_time.per_seed[s] == pytest.approx(step_ratio, rel=1e-15)
        assert d.time.per_seed[s] == pytest.approx(d.steps.per_seed[s] * d.step_time.per_seed[s],
                                                   rel=1e-12)
    assert d.time.gmean == pytest.approx(d.steps.gmean * d.step_time.gmean, rel=1e-12)
    for summary, num, den in ((d.time, tt, bt), (d.steps, ts, bs)):
        want = hand_log_t([num[s].value / den[s].value for s in (1, 2, 3)], T975_2)
        assert (summary.gmean, summary.lo, summary.hi) == pytest.approx(want, rel=1e-12)
    assert d.time.lo != pytest.approx(d.steps.lo * d.step_time.lo)
    # seed 4: treat censored in both; seed 5: time ok but treat's steps absent
    assert d.time.per_seed[4] == "> 1.5" and d.steps.per_seed[4] == "> 1.5"
    assert d.step_time.per_seed[4] == "n/a"
    assert d.time.per_seed[5] == d.steps.per_seed[5] == d.step_time.per_seed[5] == "missing"
    for summary in (d.time, d.steps, d.step_time):
        assert (summary.n, summary.seeds, summary.censored, summary.missing) == (3, 5, 1, 1)


# --- paired_t --------------------------------------------------------------------------------

#: Student's sleep data (Cushny & Peebles): extra hours of sleep under two drugs, same 10 patients.
SLEEP_1 = [0.7, -1.6, -0.2, -1.2, -0.1, 3.4, 3.7, 0.8, 0.0, 2.0]
SLEEP_2 = [1.9, 0.8, 1.1, 0.1, -0.1, 4.4, 5.5, 1.6, 4.6, 3.4]


def test_paired_t_sleep_data():
    treat, base = dict(enumerate(SLEEP_2)), dict(enumerate(SLEEP_1))
    base[10], treat[11] = 1.0, 2.0  # unpaired seeds are ignored
    treat[12], base[12] = float("nan"), 1.0
    r = seeds.paired_t(treat, base)
    assert r.n == 10
    assert (r.mean_treat, r.mean_base, r.mean_diff) == pytest.approx((2.33, 0.75, 1.58))
    # R: t.test(extra ~ group, data = sleep, paired = TRUE) -> t = 4.0621, df = 9,
    # p-value = 0.002833, 95 % CI 0.7001142 2.4598858; Welch: p-value = 0.07939
    assert r.t == pytest.approx(4.0621, abs=1e-4)
    assert r.p == pytest.approx(0.002833, abs=1e-6)
    assert (r.lo, r.hi) == pytest.approx((0.7001142, 2.4598858), abs=1e-7)
    assert r.welch_p == pytest.approx(0.07939, abs=1e-5)
    # the hand formula: t = mean(d) / (sd(d)/√n)
    d = [a - b for a, b in zip(SLEEP_2, SLEEP_1)]
    m = sum(d) / 10
    sd = math.sqrt(sum((x - m) ** 2 for x in d) / 9)
    assert r.t == pytest.approx(m / (sd / math.sqrt(10)), rel=1e-12)


def test_paired_t_few_pairs():
    r = seeds.paired_t({1: 2.0}, {1: 1.5})
    assert r.n == 1 and r.mean_diff == 0.5
    assert all(math.isnan(x) for x in (r.lo, r.hi, r.t, r.p, r.welch_p))
    r = seeds.paired_t({}, {1: 1.0})
    assert r.n == 0 and math.isnan(r.mean_diff)


def test_perplexity_change():
    assert seeds.perplexity_change(3.01, 3.0) == pytest.approx(1.0050167084168, rel=1e-9)
    assert seeds.perplexity_change(3.0, 3.0) == 0.0


# --- crossing and value_at -------------------------------------------------------------------

def test_crossing_interpolates_between_evaluations():
    c = curves.crossing([0, 10, 20], [0.0, 1.0, 2.0], [3.0, 2.0, 1.0], 1.5)
    assert c == {"time": 1.5, "steps": 15.0, "time_eval": 2.0, "steps_eval": 20, "index": 2}
    c = curves.crossing([0, 10, 20], [0.0, 1.0, 3.0], [3.0, 2.0, 1.0], 1.75)  # f = 0.25
    assert (c["time"], c["steps"]) == pytest.approx((1.5, 12.5))


def test_crossing_first_eval_and_none():
    c = curves.crossing([0, 10], [0.0, 1.0], [1.0, 0.5], 1.2)
    assert c == {"time": 0.0, "steps": 0.0, "time_eval": 0.0, "steps_eval": 0, "index": 0}
    assert curves.crossing([0, 10], [0.0, 1.0], [3.0, 2.0], 1.5) is None
    assert curves.crossing([0, 10], [0.0, 1.0], [float("nan"), float("nan")], 1.5) is None
    with pytest.raises(ValueError, match="equally long"):
        curves.crossing([0, 10], [0.0], [3.0, 2.0], 1.5)


def test_value_at():
    xs, ys = [0.0, 10.0, 20.0], [4.0, 3.0, 1.0]
    assert curves.value_at(xs, ys, 5.0) == 3.5
    assert curves.value_at(xs, ys, 15.0) == 2.0
    assert curves.value_at(xs, ys, 20.0) == 1.0
    assert math.isnan(curves.value_at(xs, ys, 20.5))
    assert math.isnan(curves.value_at(xs, ys, -1.0))
    assert math.isnan(curves.value_at([], [], 0.0))


def test_the_bootstrap_needs_the_same_minimum_as_every_percentile_interval():
    assert bootstrap.MIN_PAIRS_FOR_CI == seeds.MIN_BOOTSTRAP == 5
    assert all(math.isnan(x) for x in bootstrap.bootstrap_ratio_ci([1.0] * 4, [1.1] * 4)[1:])
