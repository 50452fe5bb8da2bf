"""Statistics of comparisons paired by seed: per-seed ratios, their decomposition, paired tests.

MEASUREMENT.md ("Time to target loss"): one seed fixes the data order and the initial weights
shared by all routers, so runs are **paired by seed**. A comparison is the per-seed ratio
treat/base, summarised by its geometric mean with a Student-t interval on the log ratios (n − 1
degrees of freedom); losses are compared by a paired t-test. A run that never reaches the target
is not dropped: its pair is shown as a bound (right-censored, as in time-to-event data), counted,
and left out of the interval. Time ratio = steps ratio × per-step time ratio exactly in logs, so
:func:`decompose` reports both factors.

A percentile bootstrap needs at least :data:`MIN_BOOTSTRAP` values: over 3 values nearly every
resample's statistic lies between their min and max, so the "interval" is [min, max]. Few seeds
therefore get the t-interval; :mod:`harness.stats.bootstrap` is for the many pairs of interleaved
step timing. Pure numpy/scipy.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats as _st

#: Default coverage of every interval.
CONF = 0.95


#: No percentile bootstrap below this many values (over 3 it returns [min, max]).
MIN_BOOTSTRAP = 5


STATUSES = ("ok", "not_converged", "diverged", "missing")


@dataclass(frozen=True)
class Obs:
    """One side of a pair for one seed.

    ``value``: the measured value (e.g. time to target, s), ``None`` when not reached.
    ``status``: ``ok``, ``not_converged``, ``diverged`` or ``missing`` (error/oom/skipped runs,
    or absent). ``bound``: for ``not_converged``, the run's total (the true value is > bound).

    Raises:
        ValueError: an unknown ``status``.
    """

    value: float | None
    status: str = "ok"
    bound: float | None = None

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"Obs.status must be one of {', '.join(STATUSES)}, "
                             f"got {self.status!r}")


@dataclass(frozen=True)
class RatioSummary:
    """Per-seed ratios treat/base and their geometric mean with a t-interval on the logs.

    ``n``: pairs inside the interval (both sides ok); ``seeds``: pairs considered; ``gmean``
    (nan when n == 0), ``lo``, ``hi`` (nan when n < 2) at coverage ``conf``; ``per_seed``: seed ->
    float ratio, a bound string (``"> 1.23"``, ``"< 0.80"``), ``"n/a"`` (both censored),
    ``"diverged"`` or ``"missing"``; ``censored``, ``diverged``, ``missing``: pairs of each kind,
    all left out of the interval (n + censored + diverged + missing == seeds).
    """

    n: int
    seeds: int
    gmean: float
    lo: float
    hi: float
    conf: float
    per_seed: dict
    censored: int
    diverged: int
    missing: int


@dataclass(frozen=True)
class Decomposition:
    """Time ratio = steps ratio × per-step time ratio, each with its own interval."""

    time: RatioSummary
    steps: RatioSummary
    step_time: RatioSummary


@dataclass(frozen=True)
class PairedTest:
    """A paired t-test of treat − base (``scipy.stats.ttest_rel``) with Welch's test beside it."""

    n: int
    mean_treat: float
    mean_base: float
    mean_diff: float
    lo: float
    hi: float
    t: float
    p: float
    welch_p: float
    conf: float


def check_conf(conf: float) -> None:
    """Check a coverage ``conf`` of an interval.

    Raises:
        ValueError: ``conf`` outside (0, 1).
    """
    if not 0 < conf < 1:
        raise ValueError(f"conf must be in (0, 1), got {conf}")


def log_t_interval(ratios: Sequence[float], conf: float = CONF) -> tuple[float, float, float]:
    """(geometric mean, lo, hi) of positive ratios.

    The interval is mean(log r) ± t_{(1+conf)/2, n−1} · sd(log r)/√n (sd with n − 1), exp-ed
    back: Student's one-sample t-interval applied to the logs, so it is symmetric in log space and
    the ratio base/treat gets exactly the reciprocal interval. ``n == 1`` → ``(r, nan, nan)``;
    ``n == 0`` → all nan.

    Raises:
        ValueError: a ratio <= 0 or non-finite, or ``conf`` outside (0, 1).
    """
    check_conf(conf)
    r = np.asarray(ratios, dtype=float).ravel()
    if not (np.isfinite(r) & (r > 0)).all():
        raise ValueError(f"ratios must be finite and > 0, got {r.tolist()}")
    nan = float("nan")
    if r.size == 0:
        return nan, nan, nan
    logs = np.log(r)
    m = float(logs.mean())
    if r.size == 1:
        return math.exp(m), nan, nan
    h = float(_st.t.ppf((1 + conf) / 2, r.size - 1)) * float(logs.std(ddof=1)) / math.sqrt(r.size)
    return math.exp(m), math.exp(m - h), math.exp(m + h)


_MISSING = Obs(None, "missing")


def _bad(t: str, b: str) -> str | None:
    """The per-seed entry of a pair that cannot enter an interval, from its two statuses; None when
    both are ok. Diverged is a finding about a router, so it wins over missing."""
    if "diverged" in (t, b):
        return "diverged"
    if "missing" in (t, b):
        return "missing"
    if "not_converged" in (t, b):
        return "n/a"
    return None


def _positive(x: float | None, what: str, seed: int) -> float:
    if x is None or not math.isfinite(x) or x <= 0:
        raise ValueError(f"seed {seed}: {what} must be finite and > 0, got {x!r}")
    return float(x)


def _entry(t: Obs, b: Obs, seed: int) -> float | str:
    """Per-seed entry of :func:`paired_ratio` (see there)."""
    bad = _bad(t.status, b.status)
    if bad is None:
        return _positive(t.value, "treat value", seed) / _positive(b.value, "base value", seed)
    if bad == "n/a" and b.status == "ok":  # the treat run needs more than its whole budget
        lower = _positive(t.bound, "treat bound", seed) / _positive(b.value, "base value", seed)
        return f"> {lower:.3g}"
    if bad == "n/a" and t.status == "ok":
        upper = _positive(t.value, "treat value", seed) / _positive(b.bound, "base bound", seed)
        return f"< {upper:.3g}"
    return bad


def _summary(per_seed: dict, conf: float) -> RatioSummary:
    ratios = [v for v in per_seed.values() if not isinstance(v, str)]
    kinds = [v for v in per_seed.values() if isinstance(v, str)]
    diverged, missing = kinds.count("diverged"), kinds.count("missing")
    gmean, lo, hi = log_t_interval(ratios, conf)
    return RatioSummary(n=len(ratios), seeds=len(per_seed), gmean=gmean, lo=lo, hi=hi, conf=conf,
                        per_seed=per_seed, censored=len(kinds) - diverged - missing,
                        diverged=diverged, missing=missing)


def paired_ratio(treat: Mapping[int, Obs], base: Mapping[int, Obs],
                 conf: float = CONF) -> RatioSummary:
    """Per-seed ratio treat/base over the seeds present in either mapping (sorted).

    Both ok → the ratio, inside the interval (:func:`log_t_interval`). treat not converged, base
    ok → ``"> {treat.bound/base.value:.3g}"`` (the true ratio is above it); base not converged,
    treat ok → ``"< {treat.value/base.bound:.3g}"``; both not converged → ``"n/a"``; each of these
    counts as censored. Any side diverged → ``"diverged"``; else any side missing or absent →
    ``"missing"``. Values are in any unit shared by both sides (e.g. s to target).

    Raises:
        ValueError: an ok side whose value (or a not-converged side whose bound, when it is
            needed) is missing, non-finite or <= 0, naming the seed; ``conf`` outside (0, 1).
    """
    per_seed = {s: _entry(treat.get(s, _MISSING), base.get(s, _MISSING), s)
                for s in sorted(set(treat) | set(base))}
    return _summary(per_seed, conf)


def _run_status(time: Obs, steps: Obs) -> str:
    """One run's status over its time and steps: the worst of the two."""
    for status in ("diverged", "missing", "not_converged"):
        if status in (time.status, steps.status):
            return status
    return "ok"


def decompose(treat_time: Mapping[int, Obs], treat_steps: Mapping[int, Obs],
              base_time: Mapping[int, Obs], base_steps: Mapping[int, Obs],
              conf: float = CONF) -> Decomposition:
    """Split the time-to-target ratio into steps to target and time per step.

    Args are mappings seed -> :class:`Obs` of time to target (s) and steps to target of both
    sides. A seed enters all three summaries only when both sides are ok in both time and steps;
    then its step-time ratio is (t_time/t_steps)/(b_time/b_steps), so time ratio = steps ratio ×
    step-time ratio per seed and, the logs being additive, for the geometric means (to rounding).
    The three intervals are each computed on their own log ratios, so they differ. Other seeds
    show their own pair's entry in time and steps (bound, ``diverged``, ``missing``), or, where
    that pair is ok, the entry of the runs' worst status; step time shows ``"n/a"`` for a
    censored pair (a run's mean step time bounds nothing).

    Raises:
        ValueError: as :func:`paired_ratio`.
    """
    maps = (treat_time, treat_steps, base_time, base_steps)
    time, steps, step_time = {}, {}, {}
    for s in sorted(set().union(*maps)):
        tt, ts, bt, bs = (m.get(s, _MISSING) for m in maps)
        e_time, e_steps = _entry(tt, bt, s), _entry(ts, bs, s)
        bad = _bad(_run_status(tt, ts), _run_status(bt, bs))
        if bad is None:
            time[s], steps[s] = e_time, e_steps
            step_time[s] = (tt.value / ts.value) / (bt.value / bs.value)
        else:
            time[s] = e_time if isinstance(e_time, str) else bad
            steps[s] = e_steps if isinstance(e_steps, str) else bad
            step_time[s] = bad
    return Decomposition(_summary(time, conf), _summary(steps, conf), _summary(step_time, conf))


def paired_t(treat: Mapping[int, float], base: Mapping[int, float],
             conf: float = CONF) -> PairedTest:
    """Paired t-test of treat − base (e.g. validation losses, nats) over seeds.

    Only seeds present with finite values (not None) on both sides are paired. ``lo``/``hi``: mean
    difference ± t_{(1+conf)/2, n−1} · sd/√n; ``t``/``p``: ``scipy.stats.ttest_rel`` (two-sided;
    zero variance gives what scipy gives: inf and 0, or nan); ``welch_p``: secondary,
    ``scipy.stats.ttest_ind(equal_var=False)`` over the same values, which ignores the pairing.
    Means are nan when n == 0; the interval and tests are nan when n < 2.

    Raises:
        ValueError: ``conf`` outside (0, 1).
    """
    check_conf(conf)

    def finite(x: float | None) -> bool:
        return x is not None and math.isfinite(x)

    seeds = sorted(s for s in set(treat) & set(base) if finite(treat[s]) and finite(base[s]))
    a = np.array([treat[s] for s in seeds], dtype=float)
    b = np.array([base[s] for s in seeds], dtype=float)
    nan = float("nan")
    means = (float(a.mean()), float(b.mean()), float((a - b).mean())) if seeds else (nan,) * 3
    lo = hi = t = p = welch_p = nan
    if len(seeds) >= 2:
        d = a - b
        h = float(_st.t.ppf((1 + conf) / 2, d.size - 1)) * float(d.std(ddof=1)) / math.sqrt(d.size)
        lo, hi = means[2] - h, means[2] + h
        with warnings.catch_warnings():  # zero variance: scipy warns and returns inf or nan
            warnings.simplefilter("ignore", RuntimeWarning)
            rel = _st.ttest_rel(a, b)
            welch_p = float(_st.ttest_ind(a, b, equal_var=False).pvalue)
        t, p = float(rel.statistic), float(rel.pvalue)
    return PairedTest(len(seeds), *means, lo, hi, t, p, welch_p, conf)


def perplexity_change(loss_treat: float, loss_base: float) -> float:
    """% change of perplexity from base to treat, 100·(exp(treat − base) − 1); losses in nats."""
    return 100.0 * math.expm1(loss_treat - loss_base)
