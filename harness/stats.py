"""Statistics of paired comparisons: per-seed ratios, paired tests, crossings of a target loss.

Shared by the training report and the CI gate, so both read the same numbers; pure numpy/scipy.

MEASUREMENT.md ("Time to target loss"): one seed fixes the data order and the initial weights
shared by all routers, so runs are **paired by seed**. A comparison is the per-seed ratio
treat/base, summarised by its geometric mean with a Student-t interval on the log ratios (n − 1
degrees of freedom); losses are compared by a paired t-test. A run that never reaches the target
is not dropped: its pair is shown as a bound (right-censored, as in time-to-event data), counted,
and left out of the interval. Time ratio = steps ratio × per-step time ratio exactly in logs, so
:func:`decompose` reports both factors.

A percentile bootstrap needs at least :data:`MIN_BOOTSTRAP` values: over 3 values nearly every
resample's statistic lies between their min and max, so the "interval" is [min, max]. Few seeds
therefore get the t-interval; :func:`bootstrap_ratio_ci` is for the many pairs of interleaved
step timing (``harness.paired``).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats as _st

__all__ = ["CONF", "MIN_BOOTSTRAP", "MIN_PAIRS_FOR_CI", "Decomposition", "Obs", "PairedTest",
           "RatioSummary", "bootstrap_ratio_ci", "bootstrap_ratio_of_ratios", "crossing",
           "decompose", "log_t_interval",
           "paired_ratio", "paired_t", "perplexity_change", "value_at"]

#: Default coverage of every interval.
CONF = 0.95
#: No percentile bootstrap below this many values (over 3 it returns [min, max]).
MIN_BOOTSTRAP = 5
#: Fewer pairs than this give no bootstrap interval (``--repeats`` sets the number of pairs).
MIN_PAIRS_FOR_CI = MIN_BOOTSTRAP

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


def _check_conf(conf: float) -> None:
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
    _check_conf(conf)
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
    _check_conf(conf)

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


def crossing(steps: Sequence[float], times: Sequence[float], losses: Sequence[float],
             target: float) -> dict | None:
    """First crossing of ``target`` by an evaluation curve.

    Args:
        steps: step of each evaluation, increasing (the first may be step 0).
        times: training clock at each evaluation, s (evaluation itself off the clock).
        losses: validation loss at each evaluation, nats.
        target: the target loss.

    Returns:
        None when no evaluation has loss <= target. Else, with i the first such evaluation,
        ``time`` and ``steps`` interpolated linearly on the loss between evaluation i − 1 and i
        (f = (L_prev − target)/(L_prev − L_i), time = t_prev + f·(t_i − t_prev), same for
        steps): the clock's resolution is the evaluation cadence, and this is the crossing
        MEASUREMENT.md declares. When i == 0, L_prev == L_i or L_prev is not finite, evaluation
        i's own values. Also ``time_eval``/``steps_eval`` (evaluation i's raw values) and
        ``index`` (i).

    Raises:
        ValueError: sequences of unequal length.
    """
    if not len(steps) == len(times) == len(losses):
        raise ValueError(f"steps, times and losses must be equally long, got "
                         f"{len(steps)}, {len(times)}, {len(losses)}")
    i = next((k for k, loss in enumerate(losses) if loss <= target), None)
    if i is None:
        return None
    time, step = float(times[i]), float(steps[i])
    if i > 0 and math.isfinite(losses[i - 1]) and losses[i - 1] != losses[i]:
        f = (losses[i - 1] - target) / (losses[i - 1] - losses[i])
        time = times[i - 1] + f * (times[i] - times[i - 1])
        step = steps[i - 1] + f * (steps[i] - steps[i - 1])
    return {"time": float(time), "steps": float(step), "time_eval": times[i],
            "steps_eval": steps[i], "index": i}


def value_at(xs: Sequence[float], ys: Sequence[float], x: float) -> float:
    """y at ``x`` by linear interpolation on increasing ``xs`` (``numpy.interp`` inside the range),
    e.g. the loss reached at a fixed token budget; nan when ``x`` lies outside
    [xs[0], xs[-1]] or ``xs`` is empty (no extrapolation).

    Raises:
        ValueError: ``xs`` and ``ys`` of unequal length.
    """
    if len(xs) != len(ys):
        raise ValueError(f"xs and ys must be equally long, got {len(xs)} and {len(ys)}")
    if len(xs) == 0 or not xs[0] <= x <= xs[-1]:
        return float("nan")
    return float(np.interp(x, xs, ys))


def bootstrap_ratio_ci(a: list[float], b: list[float], n_boot: int = 2000, conf: float = 0.95,
                       seed: int = 0) -> tuple[float, float, float]:
    """Median per-pair ratio ``b_i / a_i`` with a percentile-bootstrap interval over pairs.

    Pairs are resampled with replacement (a seeded ``numpy`` Generator), the median ratio is taken
    of each resample, and the interval is the ``(1 − conf)/2`` and ``(1 + conf)/2`` percentiles
    of those medians (Efron & Tibshirani 1993, "An Introduction to the Bootstrap", ch. 13). It
    covers the noise within this one run, not drift between runs.

    Args:
        a: baseline times (e.g. prenorm), one per pair.
        b: compared times, same pairs in the same order.
        n_boot: bootstrap resamples.
        conf: coverage of the interval, in (0, 1).
        seed: seed of the resampling.

    Returns:
        ``(median_ratio, lo, hi)``; with fewer than :data:`MIN_PAIRS_FOR_CI` pairs the bounds
        are NaN (a bootstrap of 3 pairs only spans their min and max, which is no interval).

    Raises:
        ValueError: empty or unequal lengths, a non-positive baseline time, or ``conf`` outside
            (0, 1).
    """
    a_, b_ = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a_.ndim != 1 or a_.shape != b_.shape or a_.size == 0:
        raise ValueError(f"need two equally long, non-empty lists of pairs, got {a_.size} and {b_.size}")
    if not (a_ > 0).all():
        raise ValueError("baseline times must be positive")
    _check_conf(conf)
    r = b_ / a_
    stat = float(np.median(r))
    if r.size < MIN_PAIRS_FOR_CI:
        return stat, float("nan"), float("nan")
    idx = np.random.default_rng(seed).integers(0, r.size, size=(n_boot, r.size))
    boots = np.median(r[idx], axis=1)
    lo, hi = np.percentile(boots, [50 * (1 - conf), 50 * (1 + conf)])
    return stat, float(lo), float(hi)


def bootstrap_ratio_of_ratios(a1: list[float], b1: list[float], a2: list[float], b2: list[float],
                              n_boot: int = 2000, conf: float = 0.95,
                              seed: int = 0) -> tuple[float, float, float]:
    """How much a paired ratio grew from one run to another: ``median(b1/a1) / median(b2/a2)``,
    with a percentile-bootstrap interval.

    Each run's pairs are resampled with replacement independently (the two runs share no pairs:
    round ``i`` of one run has nothing to do with round ``i`` of the other), the statistic is taken
    of every joint resample, and the interval is its ``(1 − conf)/2`` and ``(1 + conf)/2``
    percentiles, as in :func:`bootstrap_ratio_ci`. Example: a router at 1.32× prenorm now and 1.20×
    in the baseline grew 1.10 (10 %); this is the ratio of the two step-time ratios, not of the
    overhead percentages (32 % / 20 %), which is unstable when an overhead is near zero.

    Args:
        a1, b1: this run's pairs: baseline times (e.g. prenorm) and compared times, same order.
        a2, b2: the reference run's pairs, likewise (any number of pairs).
        n_boot: bootstrap resamples.
        conf: coverage of the interval, in (0, 1).
        seed: seed of the resampling.

    Returns:
        ``(growth, lo, hi)``; the bounds are NaN unless both runs have at least
        :data:`MIN_PAIRS_FOR_CI` pairs.

    Raises:
        ValueError: empty or unequal lengths within a run, a non-positive time, or ``conf``
            outside (0, 1).
    """
    _check_conf(conf)
    ratios = []
    for which, (a, b) in (("first", (a1, b1)), ("second", (a2, b2))):
        a_, b_ = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
        if a_.ndim != 1 or a_.shape != b_.shape or a_.size == 0:
            raise ValueError(f"{which} run: need two equally long, non-empty lists of pairs, "
                             f"got {a_.size} and {b_.size}")
        if not ((a_ > 0).all() and (b_ > 0).all()):
            raise ValueError(f"{which} run: times must be positive")
        ratios.append(b_ / a_)
    r1, r2 = ratios
    stat = float(np.median(r1) / np.median(r2))
    if min(r1.size, r2.size) < MIN_PAIRS_FOR_CI:
        return stat, float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    boots = (np.median(r1[rng.integers(0, r1.size, size=(n_boot, r1.size))], axis=1)
             / np.median(r2[rng.integers(0, r2.size, size=(n_boot, r2.size))], axis=1))
    lo, hi = np.percentile(boots, [50 * (1 - conf), 50 * (1 + conf)])
    return stat, float(lo), float(hi)
