"""Timing a prepared group and writing what the timing found: the one timing step of ``routerbench
run`` and ``routerbench profile``, whose rows the pytest-benchmark suite writes through
:func:`record_attempt` too (DESIGN.md, "Layers"; MEASUREMENT.md, "Timing", "Noise on shared
machines").

:func:`time_group` times the warm steps of a group in interleaved rounds
(:func:`harness.timing.paired.time_paired`, prenorm first: it is the ``A`` of every pair) and
records each attempt with :func:`record_attempt`: ``step_time`` per round (``repeat`` = ``pair`` =
round; no ``pair`` when a single step was timed), the noise readings of
:mod:`harness.timing.noise`, and on CUDA the SM clock before and after. A noisy attempt is timed
again, its steps still held, within the re-measuring budget. A group is one unit of resume
(:mod:`harness.rundir.records`): its rows are recorded together or not at all.
"""

from __future__ import annotations

import time
import traceback
from dataclasses import dataclass, field
from typing import Callable

import torch

from harness.rundir.writer import StagingWriter
from harness.stats.bootstrap import MIN_PAIRS_FOR_CI, bootstrap_ratio_ci
from harness.step import backends
from harness.timing import noise, paired
from harness.timing.timer import time_steps
from routers import BASELINE

from .cases import Case
from .options import SweepOptions


def _error_text(exc: BaseException) -> str:
    if isinstance(exc, torch.cuda.OutOfMemoryError):
        return str(exc).splitlines()[0]
    last = traceback.extract_tb(exc.__traceback__)[-1]
    return f"{type(exc).__name__}: {exc} ({last.filename}:{last.lineno})"


def _fail(case: Case, w: StagingWriter, exc: BaseException) -> str:
    status = "oom" if isinstance(exc, torch.cuda.OutOfMemoryError) else "error"
    w.write(**case.columns(), metric="step_time", unit="ms", status=status, error=_error_text(exc))
    return status


def record_attempt(cases: dict[str, Case], times: dict[str, list[float]], w: StagingWriter, *,
                   attempt: int, base: str | None, readings: dict[str, float],
                   clocks: list[float | None]) -> dict[str, dict[str, float]]:
    """Write the rows of one timing attempt and return each case's noise readings.

    Args:
        cases: case key -> case, for every key of ``times``.
        times: case key -> step times in ms; index ``i`` is round ``i`` for every case.
        w: the writer of the unit.
        attempt: the attempt number (1, 2, …; the ``attempt`` column).
        base: the key every other case is paired with (its ``A``): rows get ``pair`` = round and
            each other case a ``ci_width_rel`` reading of its ratio to it; None: timed alone.
        readings: the machine's readings over the attempt (:class:`harness.timing.noise.Probe`).
        clocks: SM clock in MHz before and after the attempt (``None`` where unknown: CPU).

    Returns:
        case key -> readings written (the machine's, ``iqr_rel``, and ``ci_width_rel`` where a
        paired ratio of at least :data:`harness.stats.bootstrap.MIN_PAIRS_FOR_CI` pairs exists).
    """
    out = {}
    for k, ts in times.items():
        cols = cases[k].columns()
        for i, ms in enumerate(ts):
            w.write(**cols, metric="step_time", value=ms, unit="ms", repeat=i,
                    pair=i if base is not None else None, attempt=attempt)
        for i, mhz in enumerate(clocks):
            if mhz is not None:
                w.write(**cols, metric="sm_clock_mhz", value=mhz, unit="MHz", repeat=i, attempt=attempt)
        m = {**readings, "iqr_rel": noise.iqr_rel(ts)}
        if base is not None and k != base and base in times and len(ts) >= MIN_PAIRS_FOR_CI:
            med, lo, hi = bootstrap_ratio_ci(times[base], ts)
            m["ci_width_rel"] = (hi - lo) / med if med > 0 else float("nan")
        for metric, value in m.items():
            if value == value:  # not NaN
                w.write(**cols, metric=metric, value=value, unit=noise.UNITS[metric], attempt=attempt)
        out[k] = m
    return out


@dataclass
class GroupTiming:
    """What :func:`time_group` measured: each case's final status, and the step times (ms) of the
    last attempt of each case that timed ``ok`` (index ``i`` = round ``i`` where paired)."""

    status: dict[str, str] = field(default_factory=dict)
    times: dict[str, list[float]] = field(default_factory=dict)
    attempts: int = 0


def time_group(cases: list[Case], steps: dict[str, Callable[[], object]], device: torch.device,
               w: StagingWriter, opts: SweepOptions) -> GroupTiming:
    """Time the warm steps of a group interleaved and write their rows; re-time a noisy group.

    The group's prenorm goes first (it is the ``A`` of every pair), the others follow in the
    order given; one untimed interleaved round re-warms every step after the other cases' set-up.
    Each attempt's rows are :func:`record_attempt`'s. While an attempt is noisy
    (:func:`harness.timing.noise.noise_reasons` under ``opts.noise_thresholds``), the group is
    timed again, its steps still held, up to ``opts.max_attempts`` timings and while another
    attempt (as long as the last) fits in ``opts.remeasure_s`` seconds of re-measuring. If the
    interleaved timing fails, each step is timed alone (one attempt) so the failure lands on its
    case.

    Returns:
        the final status of each timed case (``ok``, ``error`` or ``oom``) and its last times.
    """
    by_key = {c.key: c for c in cases if c.key in steps}
    keys = sorted(by_key, key=lambda k: by_key[k].router != BASELINE)  # stable: prenorm first
    backend = "compile" if any(c.backend == "compile" for c in cases) else cases[0].backend
    spent = 0.0  # seconds spent re-measuring
    result = GroupTiming()
    for attempt in range(1, max(1, opts.max_attempts) + 1):
        t0 = time.perf_counter()
        clocks = [noise.sm_clock_mhz(device)]
        try:
            with noise.Probe() as probe, backends.recompile_guard(backend):
                times = paired.time_paired({k: steps[k] for k in keys}, device, opts.timing.repeats,
                                           opts.pair_order, warmup_rounds=1)
            together = len(keys) > 1
        except Exception:  # one broken step must not take the group down: find it by timing alone
            times, together, probe = {}, False, None
        clocks.append(noise.sm_clock_mhz(device))
        status: dict[str, str] = {}
        for k in keys:
            if k not in times:
                try:
                    with backends.recompile_guard(backend):
                        times[k] = time_steps(steps[k], device, opts.timing.repeats)
                except Exception as exc:  # noqa: BLE001 - recorded as the case's error row
                    status[k] = _fail(by_key[k], w, exc)
        timed = {k: times[k] for k in keys if k in times}
        readings = record_attempt(by_key, timed, w, attempt=attempt, base=keys[0] if together else None,
                                  readings=dict(probe.metrics(device)) if probe is not None else {},
                                  clocks=clocks)
        status.update({k: "ok" for k in timed})
        result = GroupTiming(status, timed, attempt)
        noisy = any(noise.noise_reasons(m, opts.noise_thresholds) for m in readings.values())
        last = time.perf_counter() - t0
        spent += last if attempt > 1 else 0.0
        # another attempt only when it fits in what is left of the budget (an attempt takes as
        # long as the last one did)
        if (probe is None or not noisy or attempt >= opts.max_attempts
                or spent + last > opts.remeasure_s):
            return result
    return result
