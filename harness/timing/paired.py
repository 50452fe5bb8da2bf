"""Paired rounds: variants interleaved in one process (MEASUREMENT.md, "Timing").

A comparison (router vs ``prenorm``, compile vs eager) interleaves the variants in one process and
reports the ratio per pair with a bootstrap confidence interval
(:func:`harness.stats.bootstrap.bootstrap_ratio_ci`); run order alone shifted one public comparison
by 10–13 % (csarofeen/pytorch#2242). Round ``i`` calls every variant once; index ``i`` of each
variant's times is pair ``i``, so slow drift of the machine (clocks, other tenants, thermal state)
hits both sides of a pair alike and cancels in their ratio. ``ABBA`` order reverses the calls
every round, so neither side always runs first.

The interval covers the noise *within one run*: it resamples that run's pairs and knows nothing of
drift *between* runs on a shared machine. Agreement between runs is shown as a figure
(``reports/paired.py``), never asserted by a test. Which cases form a group and how its rows are
written is the sweep's (:mod:`harness.sweep.plan`, :mod:`harness.sweep.timed`).
"""

from __future__ import annotations

from typing import Callable

import torch

from .timer import synchronize, time_steps

#: ``ABBA``: the order reverses every round (A B, B A, A B, …), so neither side always runs first;
#: ``ABAB``: the same order every round.
ORDERS = ("ABBA", "ABAB")


#: What the timed steps found in the caches: no L2 flush between steps, so each timed step runs
#: right after another step (of another variant when paired). Recorded in the manifest.
CACHE_STATE = "warm"


def round_order(names: list[str], i: int, order: str = "ABBA") -> list[str]:
    """The call order of round ``i``: ``names``, reversed on odd rounds under ``ABBA``.

    Raises:
        ValueError: unknown ``order``.
    """
    if order not in ORDERS:
        raise ValueError(f"--pair-order must be one of {', '.join(ORDERS)}, got {order!r}")
    return list(reversed(names)) if order == "ABBA" and i % 2 else list(names)


def time_paired(steps: dict[str, Callable[[], object]], device: torch.device, repeats: int,
                order: str = "ABBA", warmup_rounds: int = 0,
                first_round: int = 0) -> dict[str, list[float]]:
    """Time the ``steps`` interleaved: ``repeats`` rounds, each calling every step once.

    Each call is timed exactly as :func:`harness.timing.timer.time_steps` times one step (CUDA events
    and a wait on the end event on CUDA, ``perf_counter_ns`` on CPU), so paired and unpaired
    times mean the same thing; no host sync happens inside a timed call.

    Args:
        steps: variant name -> zero-argument step; dict order is the ``A B …`` order.
        device: where the steps run.
        repeats: rounds (pairs) kept.
        order: ``"ABBA"`` or ``"ABAB"`` (see :data:`ORDERS`).
        warmup_rounds: untimed rounds first (forward order).
        first_round: index of the first timed round, for the order (a caller timing one round
            per call, as the pytest-benchmark suite does, passes its round count so ABBA holds
            across calls).

    Returns:
        name -> ``repeats`` durations in ms; index ``i`` of every list is round ``i``.

    Raises:
        ValueError: unknown ``order`` or ``repeats < 1``.
    """
    names = list(steps)
    round_order(names, 0, order)  # validates the order before anything runs
    if repeats < 1:
        raise ValueError(f"--repeats must be >= 1, got {repeats}")
    for _ in range(warmup_rounds):
        for name in names:
            try:
                steps[name]()
            except Exception as exc:
                blame(exc, name)
                raise
        synchronize(device)
    out: dict[str, list[float]] = {name: [] for name in names}
    name = names[0] if names else None
    try:
        for i in range(first_round, first_round + repeats):
            for name in round_order(names, i, order):
                out[name].append(time_steps(steps[name], device, 1)[0])
    except Exception as exc:
        blame(exc, name)
        raise
    return out


#: The attribute of an exception that names the step whose call raised it (:func:`blame`).
FAILED_STEP = "routerbench_failed_step"


def blame(exc: BaseException, name: str | None) -> None:
    """Name ``name`` as the step whose call raised ``exc`` (kept: the innermost caller knows best),
    so that the sweep can pin a device error on its case (:func:`failed_step`)."""
    if name is not None and getattr(exc, FAILED_STEP, None) is None:
        try:
            setattr(exc, FAILED_STEP, name)
        except AttributeError:  # an exception type without a __dict__
            pass


def failed_step(exc: BaseException) -> str | None:
    """The step :func:`blame` named for ``exc``, or None."""
    return getattr(exc, FAILED_STEP, None)
