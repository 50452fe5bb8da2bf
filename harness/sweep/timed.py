"""Timing a prepared group and writing what the timing found: the one timing step of ``routerbench
run`` and ``routerbench profile``, whose rows the pytest-benchmark suite writes through
:func:`record_attempt` too (DESIGN.md, "Layers"; MEASUREMENT.md, "Timing", "Timing to a precision
target", "Noise on shared machines").

:func:`time_group` times the warm steps of a group in interleaved rounds
(:func:`harness.timing.paired.time_paired`, each router after its prenorm: the ``A`` of its pairs),
either a fixed ``--repeats`` rounds or, with ``--precision-target``, until every paired ratio is
precise under the stopping rule of :mod:`harness.stats.sequential` (:func:`time_rounds`). Each
attempt's rows are :func:`record_attempt`'s: ``step_time`` per round (``repeat`` = ``pair`` =
round; no ``pair`` when a single step was timed; ``n_pairs``, ``stop`` and ``ci_conf`` columns), the
noise readings of :mod:`harness.timing.noise`, and on CUDA the SM clock before and after.

What is noisy is timed again, its steps still held, within the re-measuring budget
(``--remeasure-s``, ``--max-attempts``): a noisy case alone with its partners (:func:`partners`:
the prenorm of its backend, the router its paper measures it against, and its eager twin for "vs
eager"), as a new attempt of that case whose
partner rows name it in ``pairs_with``, so its ratios use that attempt's pairs only; a noisy
prenorm (every ratio of its backend leans on it) re-times the whole group. A group is one unit of
resume (:mod:`harness.rundir.records`): its rows are recorded together or not at all.
"""

from __future__ import annotations

import time
import traceback
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from harness.rundir import faults
from harness.rundir.writer import StagingWriter
from harness.stats.bootstrap import MIN_PAIRS_FOR_CI
from harness.stats.sequential import LookSchedule, half_width_rel, median_interval, ratio_interval
from harness.step import backends
from harness.step.device_errors import DeviceContextLost, poisons_context
from harness.timing import noise, paired
from harness.timing.gpu import GpuProbe
from harness.timing.timer import synchronize, time_steps
from routers import BASELINE, paper_baseline

from .cases import Case
from .options import SweepOptions

#: Rounds between two progress beats while timing (one ABBA cycle).
BEAT_ROUNDS = 2


def _error_text(exc: BaseException) -> str:
    if isinstance(exc, torch.cuda.OutOfMemoryError):
        return str(exc).splitlines()[0]
    last = traceback.extract_tb(exc.__traceback__)[-1]
    return f"{type(exc).__name__}: {exc} ({last.filename}:{last.lineno})"


def _fail(case: Case, w: StagingWriter, exc: BaseException) -> str:
    status = "oom" if isinstance(exc, torch.cuda.OutOfMemoryError) else "error"
    w.write(**case.columns(), metric="step_time", unit="ms", status=status, error=_error_text(exc))
    return status


def device_lost(exc: BaseException, keys: list[str]) -> DeviceContextLost:
    """The :class:`DeviceContextLost` of a sticky device error raised while ``keys`` were timed
    together: on the case whose call raised it, or, raised by a synchronisation after a round, on
    the last case called before it (the error text says so)."""
    who = paired.failed_step(exc)
    text = _error_text(exc)
    if who is None:
        who = keys[-1]
        text += f" (raised by the synchronisation after a round of {len(keys)} steps; CUDA_LAUNCH_BLOCKING=1 pins it)"
    return DeviceContextLost(who, text)


def partners(case: Case, group: list[Case]) -> list[Case]:
    """The cases ``case``'s ratios are taken against: the prenorm of its backend, compile mode and
    scope (none for a prenorm), then the router its paper measures it against with the same impl
    and backend (``routers.paper_baseline``: block_attnres for haares and wav_v1; none when it is
    not in the group), then its eager twin (same router, options, impl; none for an eager case).
    The order is the order of a re-time's rounds (prenorm first)."""
    out = []
    setting = (case.backend, case.compile_mode, case.compile_scope)
    base = [c for c in group if c.router == BASELINE and (c.backend, c.compile_mode, c.compile_scope) == setting]
    if case.router != BASELINE and base:
        out.append(base[0])
    paper = paper_baseline(case.router)
    same = [c for c in group if paper is not None and c.router == paper and c.impl == case.impl
            and (c.backend, c.compile_mode, c.compile_scope) == setting]
    out += same[:1]
    if case.backend != "eager":
        twin = [c for c in group if c.backend == "eager" and (c.router, c.options, c.impl)
                == (case.router, case.options, case.impl)]
        out += twin[:1]
    return out


def ratio_pairs(cases: list[Case]) -> list[tuple[str, str]]:
    """The ``(A, B)`` case keys of every paired ratio among ``cases``: each case against each of
    its :func:`partners` present."""
    return [(p.key, c.key) for c in cases for p in partners(c, cases)]


@dataclass
class Rounds:
    """The rounds of one timing: ``times`` (case key -> ms per round), ``stop`` (why it stopped,
    :data:`harness.stats.sequential.STOP_REASONS`), ``conf`` (the level of the rule's intervals;
    None for fixed rounds), ``widest`` (the widest relative half-width of the last look)."""

    times: dict[str, list[float]]
    stop: str = "fixed"
    conf: float | None = None
    widest: float = float("nan")


def _widest(times: dict[str, list[float]], ratios: list[tuple[str, str]], conf: float) -> tuple[float, str]:
    widest, who = float("nan"), ""
    for a, b in ratios:
        if a in times and b in times:
            hw = half_width_rel(*median_interval(np.asarray(times[b]) / np.asarray(times[a]), conf))
            if hw == hw and not (hw <= widest):
                widest, who = hw, b
    return widest, who


def time_rounds(steps: dict[str, Callable[[], object]], device: torch.device, opts: SweepOptions,
                ratios: list[tuple[str, str]], budget_s: float,
                beat: Callable[..., None] | None = None, labels: dict[str, str] | None = None) -> Rounds:
    """Time ``steps`` interleaved (dict order is the round order) after one untimed round.

    Fixed rounds (``opts.precision_target`` None): ``opts.timing.repeats`` rounds. With a target:
    the looks of a :class:`harness.stats.sequential.LookSchedule` from ``opts.min_pairs`` to
    ``opts.max_rounds``, capped at the rounds ``budget_s`` allows at the untimed round's pace (the
    schedule is fixed before the first timed round); at each look every ratio of ``ratios`` gets
    the rule's interval, and timing stops at the first look where all are within the target
    (``precise``), when the next look would not fit in ``budget_s`` (``budget``), or at the last
    look (``max_rounds``; ``budget`` when the budget set the last look). ``beat`` is called every
    :data:`BEAT_ROUNDS` rounds and at each look with the widest current half-width, naming its
    case by ``labels`` (step key -> what the progress line calls it; default: the key).

    Raises:
        whatever a step raises (the caller times each step alone then).
    """
    beat = beat or (lambda *a, **k: None)
    names = list(steps)
    t0 = time.perf_counter()
    for name in names:  # one untimed interleaved round: re-warms every step after the others' set-up
        try:
            steps[name]()
        except Exception as exc:
            paired.blame(exc, name)
            raise
    synchronize(device)
    round_s = max(time.perf_counter() - t0, 1e-6)
    target = opts.precision_target
    if target is None:
        sched, n_max, stop = None, opts.timing.repeats, "fixed"
        conf = 0.95  # progress only: the report's interval for fixed rounds is the bootstrap
    else:
        fits = int(budget_s / round_s)
        n_max = max(opts.min_pairs, min(opts.max_rounds, fits))
        sched = LookSchedule.make(opts.min_pairs, n_max)
        n_max, conf = sched.looks[-1], sched.conf
        stop = "max_rounds" if n_max >= opts.max_rounds - opts.max_rounds % 2 else "budget"
    times: dict[str, list[float]] = {n: [] for n in names}
    looks = list(sched.looks) if sched else []
    started = time.perf_counter()
    widest = float("nan")
    while (n := len(times[names[0]])) < n_max:
        chunk = min(BEAT_ROUNDS, n_max - n, (looks[0] - n) if looks else BEAT_ROUNDS)
        for k, v in paired.time_paired(steps, device, chunk, opts.pair_order, first_round=n).items():
            times[k] += v
        n += chunk
        widest, who = _widest(times, ratios, conf)
        at_look = bool(looks) and n == looks[0]
        text = (f"round {n} of {'<=' if sched else ''}{n_max}"
                + (f": widest CI ±{widest:.1%} ({(labels or {}).get(who, who)})" if widest == widest else ""))
        beat("timing", len(names), text=text + (" (look)" if at_look else ""), round=n, max_rounds=n_max,
             widest=None if widest != widest else round(widest, 5))
        if at_look:
            looks.pop(0)
            if widest == widest and widest <= target:
                return Rounds(times, "precise", conf, widest)
            pace = (time.perf_counter() - started) / n
            if looks and time.perf_counter() - started + (looks[0] - n) * pace > budget_s:
                return Rounds(times, "budget", conf, widest)
    return Rounds(times, stop, None if sched is None else conf, widest)


def record_attempt(cases: dict[str, Case], times: dict[str, list[float]], w: StagingWriter, *,
                   attempt: int, base: str | None, readings: dict[str, float],
                   clocks: list[float | None], stop: str = "fixed", conf: float | None = None,
                   pairs_with: dict[str, str] | None = None,
                   bases: dict[str, str] | None = None) -> dict[str, dict[str, float]]:
    """Write the rows of one timing attempt and return each case's noise readings.

    Args:
        cases: case key -> case, for every key of ``times``.
        times: case key -> step times in ms; index ``i`` is round ``i`` for every case.
        w: the writer of the unit.
        attempt: the attempt number (1, 2, …; the ``attempt`` column).
        base: the key every other case is paired with (its ``A``), unless ``bases`` names another:
            rows get ``pair`` = round and each paired case a ``ci_width_rel`` reading of its ratio
            to its base; None: timed alone (no ``pair``).
        readings: the machine's readings over the attempt (:class:`harness.timing.noise.Probe`).
        clocks: SM clock in MHz before and after the attempt (``None`` where unknown: CPU).
        stop, conf: why the timing stopped and the level of the rule's interval (None: fixed
            rounds, whose ``ci_width_rel`` is the bootstrap's at 95 %): the ``stop`` and
            ``ci_conf`` columns of the ``step_time`` rows.
        pairs_with: case key -> the re-timed case it partners (its rows get ``pairs_with`` and
            only ``step_time`` rows: the readings are the re-timed case's).
        bases: case key -> its own base key, overriding ``base``.

    Returns:
        case key -> readings written (the machine's, ``iqr_rel``, and ``ci_width_rel`` where a
        paired ratio of at least :data:`harness.stats.bootstrap.MIN_PAIRS_FOR_CI` pairs exists).
    """
    out = {}
    pairs_with = pairs_with or {}
    for k, ts in times.items():
        cols = cases[k].columns()
        extra = {"n_pairs": len(ts), "stop": stop, "ci_conf": conf, "pairs_with": pairs_with.get(k)}
        for i, ms in enumerate(ts):
            w.write(**cols, metric="step_time", value=ms, unit="ms", repeat=i,
                    pair=i if base is not None else None, attempt=attempt, **extra)
        if k in pairs_with:
            continue
        for i, mhz in enumerate(clocks):
            if mhz is not None:
                w.write(**cols, metric="sm_clock_mhz", value=mhz, unit="MHz", repeat=i, attempt=attempt)
        m = {**readings, "iqr_rel": noise.iqr_rel(ts)}
        b = (bases or {}).get(k, base)
        if base is not None and b is not None and k != b and b in times and len(ts) >= MIN_PAIRS_FOR_CI:
            med, lo, hi = ratio_interval(times[b], ts, conf)
            m["ci_width_rel"] = (hi - lo) / med if med > 0 else float("nan")
        for metric, value in m.items():
            if value == value:  # not NaN
                w.write(**cols, metric=metric, value=value, unit=noise.UNITS[metric], attempt=attempt)
        out[k] = m
    return out


@dataclass
class GroupTiming:
    """What :func:`time_group` measured: each case's final status, the step times (ms) of the last
    attempt of each case that timed ``ok`` (index ``i`` = round ``i`` where paired), and the
    attempt numbers of each case's own timings (the group's timings are numbered 1, 2, … in order;
    a re-timed case's partners are timed in its attempt, not their own), and the CPU pressure of
    each noisy case left with its timing because the machine was still busy (:func:`still_busy`)."""

    status: dict[str, str] = field(default_factory=dict)
    times: dict[str, list[float]] = field(default_factory=dict)
    attempts: dict[str, tuple[int, ...]] = field(default_factory=dict)
    left_noisy: dict[str, float] = field(default_factory=dict)


def _who(case) -> str:
    """A case as the progress line names it: router, impl and backend (``haares two_phase
    compile``), from its fields."""
    return " ".join(x for x in (case.router, case.impl, case.backend) if x)


def still_busy(case_key: str, opts: SweepOptions) -> float | None:
    """The machine's CPU pressure (a ratio: ``/proc/pressure/cpu`` avg10, or the ``busy=PCT``
    fault planted for ``case_key``) when it is above ``cpu_pressure_max`` of
    ``opts.noise_thresholds``, so that a timing started now would read noisy again; else None
    (quiet, or no PSI on this machine)."""
    p = faults.planted_pressure(case_key)
    p = noise.pressure_avg10() if p is None else p
    top = (opts.noise_thresholds or noise.THRESHOLDS).get("cpu_pressure_max", noise.THRESHOLDS["cpu_pressure_max"])
    return p if p is not None and p > top else None


def _attempt(keys: list[str], by_key: dict[str, Case], steps, device, w, opts: SweepOptions, *,
             attempt: int, backend: str, budget_s: float, beat, retimed: str | None = None
             ) -> tuple[dict[str, str], dict[str, list[float]], dict[str, dict[str, float]], str]:
    """One timing of ``keys`` (interleaved, or each alone when that fails) and its rows; also why
    its rounds stopped (``precise``, ``budget``, ``max_rounds`` or ``fixed``)."""
    group = [by_key[k] for k in keys]
    clocks = [noise.sm_clock_mhz(device)]
    try:
        with noise.Probe() as probe, GpuProbe(device) as gpu, backends.recompile_guard(backend):
            got = time_rounds({k: steps[k] for k in keys}, device, opts, ratio_pairs(group), budget_s, beat,
                              labels={c.key: c.router for c in group})
        together = len(keys) > 1
    except Exception as exc:  # one broken step must not take the group down: find it by timing alone
        if poisons_context(exc):  # nothing more can run here: the case that raised it is recorded
            raise device_lost(exc, keys) from exc
        got, together, probe = Rounds({}), False, None
    clocks.append(noise.sm_clock_mhz(device))
    status: dict[str, str] = {}
    for k in keys:
        if k not in got.times:
            try:
                with backends.recompile_guard(backend):
                    got.times[k] = time_steps(steps[k], device, opts.timing.repeats)
            except Exception as exc:  # noqa: BLE001 - recorded as the case's error row
                if poisons_context(exc):
                    raise DeviceContextLost(k, _error_text(exc)) from exc
                status[k] = _fail(by_key[k], w, exc)
    timed = {k: got.times[k] for k in keys if k in got.times}
    bases = {c.key: p[0].key for c in group if (p := partners(c, group)) and p[0].router == BASELINE}
    readings = record_attempt(by_key, timed, w, attempt=attempt, base=keys[0] if together else None,
                              readings={**probe.metrics(device), **gpu.metrics()} if probe is not None else {},
                              clocks=clocks, stop=got.stop if together else "fixed",
                              conf=got.conf if together else None, bases=bases,
                              pairs_with={k: retimed for k in keys if retimed and k != retimed})
    status.update({k: "ok" for k in timed})
    return status, timed, readings if probe is not None else {}, got.stop if together else "fixed"


def time_group(cases: list[Case], steps: dict[str, Callable[[], object]], device: torch.device,
               w: StagingWriter, opts: SweepOptions, beat: Callable[..., None] | None = None) -> GroupTiming:
    """Time the warm steps of a group interleaved, write their rows, and re-time what is noisy.

    Prenorm cases go first (the ``A`` of their backend's pairs), the others follow in the order
    given; rounds as :func:`time_rounds` (fixed, or to the precision target within
    ``opts.group_budget_s``). A case is noisy when :func:`harness.timing.noise.noise_reasons`
    under ``opts.noise_thresholds`` names a reason (machine readings count for every case; after a
    timing that stopped ``precise`` only they do, not the spread of the times). A noisy
    case is then timed again with its :func:`partners` as a new attempt of that case (its ratios
    use that attempt's pairs only); a noisy prenorm re-times the whole group. Re-timing goes on
    while a case is noisy, up to ``opts.max_attempts`` timings of it, only while the next
    timing (estimated from the step times of the last) fits in ``opts.remeasure_s`` seconds, and
    only when the machine is not still busy (:func:`still_busy`): a case that would be re-timed on a
    busy machine keeps its timing, flagged noisy, with a ``left_noisy`` row (the pressure). If
    the interleaved timing fails, each step is timed alone (one attempt) so the failure lands on
    its case.

    Returns:
        the final status of each timed case (``ok``, ``error`` or ``oom``), its last times and its
        number of attempts.
    """
    by_key = {c.key: c for c in cases if c.key in steps}
    keys = sorted(by_key, key=lambda k: by_key[k].router != BASELINE)  # stable: prenorm first
    backend = "compile" if any(c.backend == "compile" for c in cases) else cases[0].backend
    result = GroupTiming()
    status, times, readings, stop = _attempt(keys, by_key, steps, device, w, opts, attempt=1, backend=backend,
                                             budget_s=opts.group_budget_s, beat=beat)
    result.status.update(status)
    result.times.update(times)
    result.attempts.update({k: (1,) for k in times})
    spent = 0.0  # seconds spent re-measuring
    timings = 1  # attempt numbers are the group's timings: one number, one set of rounds
    pending = [k for k in keys
               if noise.noise_reasons(readings.get(k, {}), opts.noise_thresholds, precise=stop == "precise")]
    while pending and len(keys) > 1:
        k = pending.pop(0)
        n_of = sum(1 for _ in result.attempts.get(k, ()))
        if k not in result.times or n_of >= opts.max_attempts:
            continue
        whole = by_key[k].router == BASELINE
        group = [by_key[x] for x in keys]
        todo = keys if whole else [p.key for p in partners(by_key[k], group) if p.key in result.times] + [k]
        if len(todo) < 2:
            continue
        rounds = opts.timing.repeats if opts.precision_target is None else opts.min_pairs
        est = (rounds + 1) * sum(float(np.median(result.times[x])) for x in todo) / 1e3
        left = opts.remeasure_s - spent
        if est > left:
            continue
        if (busy := still_busy(k, opts)) is not None:  # timing again cannot make it quiet: keep it, flagged
            w.write(**by_key[k].columns(), metric="left_noisy", value=busy, unit="ratio",
                    attempt=max(result.attempts.get(k, (1,))))
            result.left_noisy[k] = busy
            if beat is not None:
                beat("timing", 1, text=f"{_who(by_key[k])} left noisy: the machine is still busy (a task "
                     f"waited for a CPU {busy:.0%} of the last 10 s); timing again cannot make it quiet",
                     round=0)
            continue
        t0 = time.perf_counter()
        timings += 1
        if beat is not None:
            beat("timing", len(todo), text=f"re-timing {'the group' if whole else _who(by_key[k])} "
                 f"(attempt {timings}): noisy", round=0)
        status, times, readings, stop = _attempt(todo, by_key, steps, device, w, opts, attempt=timings,
                                                 backend=backend, budget_s=min(opts.group_budget_s, left),
                                                 beat=beat, retimed=None if whole else k)
        spent += time.perf_counter() - t0
        mine = todo if whole else [k]
        for x in mine:
            if x in times:
                result.times[x] = times[x]
                result.attempts[x] = result.attempts.get(x, ()) + (timings,)
            result.status[x] = status.get(x, result.status.get(x, "ok"))
        again = [x for x in mine
                 if noise.noise_reasons(readings.get(x, {}), opts.noise_thresholds, precise=stop == "precise")]
        pending = again if whole else pending + again
    return result
