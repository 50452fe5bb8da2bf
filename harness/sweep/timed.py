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

from .cases import Case
from .options import SweepOptions
from .retime import Job, RetimePolicy, partners, ratio_pairs  # noqa: F401 - partners, ratio_pairs: re-exported

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


def device_lost(exc: BaseException, keys: list[str], alone: bool = False) -> DeviceContextLost:
    """The :class:`DeviceContextLost` of a sticky device error raised while ``keys`` were timed
    together: on the case whose call raised it, or, raised by a synchronisation after a round, on
    the last case called before it (the error text says so); ``alone``: while the one case of
    ``keys`` was timed by itself, on that case, as it is."""
    who = paired.failed_step(exc) or (keys[0] if alone else None)
    text = _error_text(exc)
    if who is None:
        who = keys[-1]
        text += f" (raised by the synchronisation after a round of {len(keys)} steps; CUDA_LAUNCH_BLOCKING=1 pins it)"
    return DeviceContextLost(who, text)


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
        m = {**readings, "iqr_rel": noise.iqr_rel(ts)}  # what the rows say, worked out before they are written
        b = (bases or {}).get(k, base)
        if base is not None and b is not None and k != b and b in times and len(ts) >= MIN_PAIRS_FOR_CI:
            med, lo, hi = ratio_interval(times[b], ts, conf)
            m["ci_width_rel"] = (hi - lo) / med if med > 0 else float("nan")
        extra = {"n_pairs": len(ts), "stop": stop, "ci_conf": conf, "pairs_with": pairs_with.get(k)}
        rows = [dict(metric="step_time", value=ms, unit="ms", repeat=i, pair=i if base is not None else None,
                     **extra) for i, ms in enumerate(ts)]
        if k not in pairs_with:  # a partner's rows of a re-time: its step times alone
            rows += [dict(metric="sm_clock_mhz", value=mhz, unit="MHz", repeat=i) for i, mhz in enumerate(clocks)
                     if mhz is not None]
            rows += [dict(metric=metric, value=value, unit=noise.UNITS[metric]) for metric, value in m.items()
                     if value == value]  # not NaN
            out[k] = m
        cols = cases[k].columns()
        for row in rows:
            w.write(**cols, **row, attempt=attempt)
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

    def add(self, job: Job, status: dict[str, str], times: dict[str, list[float]]) -> None:
        """What ``job`` measured: for the cases it was timed for (the whole group, or the re-timed
        case alone; its partners' times stay those of their own attempts)."""
        for x in job.keys if job.retimed is None else [job.retimed]:
            if x in times:
                self.times[x] = times[x]
                self.attempts[x] = self.attempts.get(x, ()) + (job.attempt,)
            self.status[x] = status.get(x, self.status.get(x, "ok"))


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


def _attempt(job: Job, policy: RetimePolicy, steps, device, w, opts: SweepOptions, beat
             ) -> tuple[dict[str, str], dict[str, list[float]], dict[str, dict[str, float]], str]:
    """One timing of ``job.keys`` (interleaved, or each alone when that fails) and its rows; also why
    its rounds stopped (``precise``, ``budget``, ``max_rounds`` or ``fixed``)."""
    keys, by_key = job.keys, policy.by_key
    clocks = [noise.sm_clock_mhz(device)]
    backend = next((by_key[k].backend for k in keys if k in policy.compiled), by_key[keys[0]].backend)
    try:
        with noise.Probe() as probe, GpuProbe(device) as gpu, backends.recompile_guard(backend):
            ratios = [(a, b) for a, b in policy.ratios if a in keys and b in keys]
            got = time_rounds({k: steps[k] for k in keys}, device, opts, ratios, job.budget_s, beat,
                              labels={k: by_key[k].router for k in keys})
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
                    raise device_lost(exc, [k], alone=True) from exc
                status[k] = _fail(by_key[k], w, exc)
    timed = {k: got.times[k] for k in keys if k in got.times}
    readings = record_attempt(by_key, timed, w, attempt=job.attempt, base=keys[0] if together else None,
                              readings={**probe.metrics(device), **gpu.metrics()} if probe is not None else {},
                              clocks=clocks, stop=got.stop if together else "fixed",
                              conf=got.conf if together else None, bases=policy.bases,
                              pairs_with={k: job.retimed for k in keys if job.retimed and k != job.retimed})
    status.update({k: "ok" for k in timed})
    return status, timed, readings if probe is not None else {}, got.stop if together else "fixed"


def time_group(cases: list[Case], steps: dict[str, Callable[[], object]], device: torch.device,
               w: StagingWriter, opts: SweepOptions, beat: Callable[..., None] | None = None) -> GroupTiming:
    """Time the warm steps of a group interleaved, write their rows, and time again what the
    re-timing policy (:class:`harness.sweep.retime.RetimePolicy`) asks for until it asks nothing.

    Prenorm cases go first (the ``A`` of their backend's pairs), the others follow in the order
    given; rounds as :func:`time_rounds` (fixed, or to the precision target within the job's
    budget). A job that keeps a noisy timing (the machine still busy, :func:`still_busy`) writes its
    ``left_noisy`` row and times nothing. If an interleaved timing fails, each step is timed alone
    (one attempt) so the failure lands on its case.

    Returns:
        the final status of each timed case (``ok``, ``error`` or ``oom``), its last times and its
        attempts.
    """
    policy = RetimePolicy([c for c in cases if c.key in steps], opts, busy=lambda k: still_busy(k, opts))
    result = GroupTiming()
    if not policy.keys:  # no case set up: nothing to time
        return result
    job: Job | None = policy.first()
    while job is not None:
        if job.left_noisy is not None:
            _keep_noisy(job, policy, result, w, beat)
        else:
            if job.attempt > 1 and beat is not None:
                who = _who(policy.by_key[job.retimed]) if job.retimed else "the group"
                beat("timing", len(job.keys), text=f"re-timing {who} (attempt {job.attempt}): noisy", round=0)
            t0 = time.perf_counter()
            status, times, readings, stop = _attempt(job, policy, steps, device, w, opts, beat)
            result.add(job, status, times)
            policy.measured(job, times, readings, stop, time.perf_counter() - t0)
        job = policy.next()
    return result


def _keep_noisy(job: Job, policy: RetimePolicy, result: GroupTiming, w: StagingWriter, beat) -> None:
    """A noisy case kept with its timing, flagged: its ``left_noisy`` row (the CPU pressure)."""
    case = policy.by_key[job.retimed]
    w.write(**case.columns(), metric="left_noisy", value=job.left_noisy, unit="ratio", attempt=job.attempt)
    result.left_noisy[job.retimed] = job.left_noisy
    if beat is not None:
        beat("timing", 1, text=f"{_who(case)} left noisy: the machine is still busy (a task waited for a CPU "
             f"{job.left_noisy:.0%} of the last 10 s); timing again cannot make it quiet", round=0)
