"""Timing until a paired ratio is precise: the stopping rule of ``--precision-target``
(MEASUREMENT.md, "Timing to a precision target").

A group is timed in interleaved rounds and **looked at** only at pre-set pair counts, the
:class:`LookSchedule` (even counts, so every look follows whole ABBA cycles; fixed before the
first timed round from ``--min-pairs``, ``--max-rounds`` and the rounds the group's budget allows
at the pace of its untimed warm-up round, never from the ratios). At each look every paired ratio
gets the **distribution-free interval of its median** (:func:`median_interval`: two order
statistics of the per-pair ratios, binomial with p = ½) at the corrected level ``1 − α/K`` for
the ``K`` looks of the schedule. Timing stops at the first look where every ratio's relative
half-width is within the target (``precise``), when the next look would not fit in the budget
(``budget``), or at the last look (``max_rounds``).

Why it stays valid under optional stopping: each look's interval covers the true median ratio
with probability ≥ 1 − α/K whatever the distribution of the ratios, so by the union bound all K
cover at once with probability ≥ 1 − α, and therefore so does the one reported, at whichever
look the rule stopped; the interval reported, gated and compared with the target is that look's.
The price: each look's interval is wider than a fixed-n 95 % interval by z(α/2K)/z(α/2) (about
1.3–1.4 for K = 4–10), so the rule needs about (z(α/2K)/z(α/2))² more pairs than a fixed design
that knew the spread in advance (:func:`fixed_n_pairs`), plus the overshoot of the look grid.
Caveat: the guarantee holds for exchangeable pairs (i.i.d. pair ratios); drift of the machine and
autocorrelation of real timings are not covered (pairing removes what drift the two sides share,
not the rest). Pure numpy/scipy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import stats as _st

from .bootstrap import bootstrap_ratio_ci

#: Overall miss probability of the rule's intervals (nominal coverage 0.95).
ALPHA = 0.05
#: Each look comes at about this many times the pairs of the one before (rounded up to even).
LOOK_GROWTH = 1.5
#: Why timing stopped: a fixed number of rounds; the target reached; the budget spent; the last look.
STOP_REASONS = ("fixed", "precise", "budget", "max_rounds")
#: |median − limit| below this share of the limit cannot be settled by more pairs (:func:`pairs_needed`).
UNSETTLED_REL = 0.01


def median_interval(ratios, conf: float) -> tuple[float, float, float]:
    """The median of ``ratios`` with its distribution-free order-statistic interval.

    The interval is ``[r_(l), r_(n+1−l)]`` of the sorted values, with the largest ``l`` such that
    P(Binomial(n, ½) ≤ l − 1) ≤ (1 − conf)/2: for i.i.d. values of a continuous distribution it
    covers the true median with probability ≥ ``conf`` (e.g. Hollander, Wolfe & Chicken,
    "Nonparametric Statistical Methods", 3rd ed., §3.6).

    Args:
        ratios: per-pair ratios (any positive numbers), ``(n,)``.
        conf: coverage in (0, 1).

    Returns:
        ``(median, lo, hi)``; the bounds are NaN when ``n`` is too small for ``conf`` (even
        ``[min, max]`` covers with probability only 1 − 2·½ⁿ).

    Raises:
        ValueError: empty input or ``conf`` outside (0, 1).
    """
    r = np.sort(np.asarray(ratios, dtype=float))
    if r.ndim != 1 or r.size == 0:
        raise ValueError("median_interval needs a non-empty list of ratios")
    if not 0 < conf < 1:
        raise ValueError(f"conf must be in (0, 1), got {conf}")
    n = r.size
    med = float(np.median(r))
    # l − 1 = the largest k with P(Bin ≤ k) ≤ α/2; binom.ppf gives the smallest k with cdf ≥ α/2
    k = int(_st.binom.ppf((1 - conf) / 2, n, 0.5))
    if _st.binom.cdf(k, n, 0.5) > (1 - conf) / 2:
        k -= 1
    if k < 0:
        return med, float("nan"), float("nan")
    return med, float(r[k]), float(r[n - 1 - k])


def half_width_rel(med: float, lo: float, hi: float) -> float:
    """Relative half-width (hi − lo) / (2 · median) of an interval (NaN without bounds)."""
    if not (med > 0) or lo != lo or hi != hi:
        return float("nan")
    return (hi - lo) / (2 * med)


@dataclass(frozen=True)
class LookSchedule:
    """The pre-set looks of one timing: pair counts ``looks`` (even, increasing) and the level of
    each look's interval, ``1 − alpha / K`` with K = ``len(looks)``.

    Build it with :meth:`make`; ``looks[-1]`` is the last round the rule may time.
    """

    looks: tuple[int, ...]
    alpha: float = ALPHA

    @property
    def conf(self) -> float:
        """The level of every look's interval (Bonferroni over the K looks)."""
        return 1 - self.alpha / len(self.looks)

    @classmethod
    def make(cls, min_pairs: int, max_rounds: int, growth: float = LOOK_GROWTH,
             alpha: float = ALPHA) -> "LookSchedule":
        """Looks at ``min_pairs`` (rounded up to even), then about ``growth`` times the last, up to
        ``max_rounds`` (rounded down to even; the last look). Leading looks too small to give an
        interval at the level are dropped (with 10 looks at α = 0.05 the first needs 9 pairs).

        Raises:
            ValueError: ``min_pairs < 2``, ``max_rounds < min_pairs``, ``growth <= 1`` or
                ``alpha`` outside (0, 1).
        """
        first = min_pairs + min_pairs % 2
        last = max_rounds - max_rounds % 2
        if min_pairs < 2 or last < first:
            raise ValueError(f"need 2 <= --min-pairs <= --max-rounds (even), got {min_pairs} and {max_rounds}")
        if growth <= 1 or not 0 < alpha < 1:
            raise ValueError(f"need growth > 1 and alpha in (0, 1), got {growth} and {alpha}")
        looks = [first]
        while looks[-1] < last:
            nxt = math.ceil(looks[-1] * growth)
            looks.append(min(last, nxt + nxt % 2))
        # a look too small for its level has no interval (even [min, max] covers only 1 − 2·½ⁿ):
        # it could never stop the timing, so it is dropped and its share of α goes to the others
        while len(looks) > 1 and 2 * 0.5 ** looks[0] > alpha / len(looks):
            looks.pop(0)
        return cls(tuple(looks), alpha)

    def interval(self, ratios) -> tuple[float, float, float]:
        """:func:`median_interval` at this schedule's level."""
        return median_interval(ratios, self.conf)


def fixed_n_pairs(sigma_log: float, half_width: float, conf: float = 1 - ALPHA) -> float:
    """Pairs a fixed-n design needs for the median ratio's interval to reach ``half_width``
    (relative) when the log per-pair ratios have standard deviation ``sigma_log``: the median's
    asymptotic standard error is √(π/2) · σ / √n for normal logs, so
    n = (z · √(π/2) · σ / h)² (z: the two-sided normal quantile of ``conf``)."""
    z = _st.norm.ppf(0.5 + conf / 2)
    return (z * math.sqrt(math.pi / 2) * sigma_log / half_width) ** 2


def pairs_needed(n: int, half_width: float, median: float, limit: float) -> float | None:
    """More pairs that would let an interval of relative half-width ``half_width`` (at ``n``
    pairs, around ``median``) clear ``limit``, at the observed spread: the half-width shrinks as
    1/√n, so n_more = n · (h / |median − limit|)² − n with h the absolute half-width.

    Returns:
        the pairs to add (≥ 0), or None when |median − limit| < :data:`UNSETTLED_REL` of the
        limit: no number of pairs settles it.
    """
    gap = abs(median - limit)
    if gap < UNSETTLED_REL * abs(limit):
        return None
    h = half_width * median
    return max(0.0, n * (h / gap) ** 2 - n)


def ratio_interval(a, b, conf: float | None, n_boot: int = 2000, seed: int = 0,
                   boot_conf: float = 1 - ALPHA) -> tuple[float, float, float]:
    """The median per-pair ratio ``b_i / a_i`` of paired times with its interval: the stopping
    rule's (:func:`median_interval` at ``conf``, the level recorded in the rows' ``ci_conf``) when
    a rule timed them, else the percentile bootstrap at ``boot_conf`` (95 %) of fixed rounds
    (:func:`harness.stats.bootstrap.bootstrap_ratio_ci`). The reports and the gate use this one
    function, so the interval they show and gate is the one the timing stopped on.

    Raises:
        ValueError: as :func:`harness.stats.bootstrap.bootstrap_ratio_ci` (unequal lengths,
            a non-positive baseline time).
    """
    if conf is None or conf != conf:
        return bootstrap_ratio_ci(a, b, n_boot=n_boot, conf=boot_conf, seed=seed)
    a_, b_ = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a_.shape != b_.shape or a_.size == 0 or not (a_ > 0).all():
        raise ValueError(f"need two equally long, non-empty lists of pairs with positive baseline times, "
                         f"got {a_.size} and {b_.size}")
    return median_interval(b_ / a_, conf)
