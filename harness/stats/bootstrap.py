"""Percentile-bootstrap intervals of the per-pair ratios of interleaved step timing
(MEASUREMENT.md, "Timing"): a router's median ratio to prenorm over the rounds of one group, and
the ratio of two such ratios (a router's growth against a baseline run). They cover the noise
within one run, not drift between runs. Pure numpy.
"""

from __future__ import annotations

import numpy as np

from .seeds import MIN_BOOTSTRAP, check_conf

#: Fewer pairs than this give no bootstrap interval (``--repeats`` sets the number of pairs).
MIN_PAIRS_FOR_CI = MIN_BOOTSTRAP


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
    check_conf(conf)
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
                              seed: int = 0, joint: bool = False) -> tuple[float, float, float]:
    """How much a paired ratio grew from one run to another: ``median(b1/a1) / median(b2/a2)``,
    with a percentile-bootstrap interval.

    Each run's pairs are resampled with replacement independently (the two runs share no pairs:
    round ``i`` of one run has nothing to do with round ``i`` of the other), the statistic is taken
    of every joint resample, and the interval is its ``(1 − conf)/2`` and ``(1 + conf)/2``
    percentiles, as in :func:`bootstrap_ratio_ci`. Example: a router at 1.32× prenorm now and 1.20×
    in the baseline grew 1.10 (10 %); this is the ratio of the two step-time ratios, not of the
    overhead percentages (32 % / 20 %), which is unstable when an overhead is near zero.

    With ``joint``, the two ratios come from the same rounds (two variants timed in one paired
    group: round ``i`` of each is the same round), and the rounds are resampled together, which
    keeps what they share (a slow round slows both); the lengths must then be equal.

    Args:
        a1, b1: this run's pairs: baseline times (e.g. prenorm) and compared times, same order.
        a2, b2: the reference run's pairs, likewise (any number of pairs; as many with ``joint``).
        n_boot: bootstrap resamples.
        conf: coverage of the interval, in (0, 1).
        seed: seed of the resampling.
        joint: resample the rounds of both together (the same rounds, above).

    Returns:
        ``(growth, lo, hi)``; the bounds are NaN unless both runs have at least
        :data:`MIN_PAIRS_FOR_CI` pairs.

    Raises:
        ValueError: empty or unequal lengths within a run (or, with ``joint``, between the two),
            a non-positive time, or ``conf`` outside (0, 1).
    """
    check_conf(conf)
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
    if joint and r1.size != r2.size:
        raise ValueError(f"joint: the two share their rounds, so need as many pairs, got {r1.size} and {r2.size}")
    stat = float(np.median(r1) / np.median(r2))
    if min(r1.size, r2.size) < MIN_PAIRS_FOR_CI:
        return stat, float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    i1 = rng.integers(0, r1.size, size=(n_boot, r1.size))
    i2 = i1 if joint else rng.integers(0, r2.size, size=(n_boot, r2.size))
    boots = np.median(r1[i1], axis=1) / np.median(r2[i2], axis=1)
    lo, hi = np.percentile(boots, [50 * (1 - conf), 50 * (1 + conf)])
    return stat, float(lo), float(hi)
