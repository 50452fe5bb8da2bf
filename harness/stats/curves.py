"""Reading an evaluation curve: the first crossing of a target loss, interpolated linearly between
the two evaluations around it (MEASUREMENT.md, "Time to target loss"), and the value of a curve
at a point. Pure numpy.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


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
