"""The re-timing policy of a timed group (MEASUREMENT.md, "Noise on shared machines"): which
cases' ratios are taken against which (:func:`partners`), what is noisy after an attempt, and what
to time next, decided from what was measured alone. The timing loop that acts on it is
:func:`harness.sweep.timed.time_group`; nothing here times, writes a row or touches a device.

After each attempt the loop reports what it measured (:meth:`RetimePolicy.measured`); a case is
noisy when :func:`harness.timing.noise.noise_reasons` under ``opts.noise_thresholds`` names a reason
(machine readings count for every case; after a timing that stopped ``precise`` only they do).
:meth:`RetimePolicy.next` then gives the next :class:`Job`: a noisy case again with its partners,
as a new attempt of that case (a noisy prenorm: the whole group), while it is noisy, up to
``opts.max_attempts`` timings of it, while the next timing (estimated from the last step times)
fits what is left of ``opts.remeasure_s``, and not while the machine is still busy: such a case
keeps its timing, flagged (a ``left_noisy`` job, which times nothing).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from harness.step.backends import compiles, of
from harness.timing import noise
from routers import BASELINE, paper_baseline

from .cases import Case
from .options import SweepOptions


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
    if not of(case.backend).plain:
        twin = [c for c in group if of(c.backend).plain and (c.router, c.options, c.impl)
                == (case.router, case.options, case.impl)]
        out += twin[:1]
    return out


def ratio_pairs(cases: list[Case]) -> list[tuple[str, str]]:
    """``(A key, B key)`` of every ratio the group's timing reports: each case against each of
    its :func:`partners` present."""
    return [(p.key, c.key) for c in cases for p in partners(c, cases)]


@dataclass(frozen=True)
class Job:
    """One thing to do next: time ``keys`` (``attempt``, within ``budget_s``; ``retimed``: the noisy
    case they are timed for, None for the whole group), or, with ``left_noisy`` set (the CPU
    pressure, a ratio), keep ``retimed``'s timing, flagged noisy, and time nothing."""

    keys: list[str]
    attempt: int
    budget_s: float
    retimed: str | None = None
    left_noisy: float | None = None


@dataclass
class RetimePolicy:
    """The policy of one group: built from its cases (prenorm first: the ``A`` of their pairs),
    told what each attempt measured, asked what to do next.

    Attributes:
        keys: the group's case keys in timing order.
        ratios: :func:`ratio_pairs` of the group, as keys.
        bases: case key -> the key of its prenorm partner, where it has one.
        partners: case key -> its :func:`partners`' keys.
        compiled: the keys of compiled cases (a timing holding one runs under the recompile guard).
    """

    cases: list[Case]
    opts: SweepOptions
    busy: Callable[[str], float | None] = lambda key: None
    keys: list[str] = field(init=False)
    by_key: dict[str, Case] = field(init=False)
    ratios: list[tuple[str, str]] = field(init=False)
    bases: dict[str, str] = field(init=False)
    partners: dict[str, list[str]] = field(init=False)
    compiled: set[str] = field(init=False)
    _pending: list[str] = field(init=False, default_factory=list)
    _attempts: dict[str, int] = field(init=False, default_factory=dict)
    _last: dict[str, int] = field(init=False, default_factory=dict)
    _times: dict[str, list[float]] = field(init=False, default_factory=dict)
    _spent: float = field(init=False, default=0.0)
    _timings: int = field(init=False, default=0)
    _whole: bool = field(init=False, default=True)

    def __post_init__(self) -> None:
        ordered = sorted(self.cases, key=lambda c: c.router != BASELINE)  # stable: prenorm first
        self.keys = [c.key for c in ordered]
        self.by_key = {c.key: c for c in ordered}
        self.ratios = ratio_pairs(ordered)
        self.partners = {c.key: [p.key for p in partners(c, ordered)] for c in ordered}
        self.bases = {c.key: p[0].key for c in ordered if (p := partners(c, ordered)) and p[0].router == BASELINE}
        self._baseline = {c.key for c in ordered if c.router == BASELINE}
        self.compiled = {c.key for c in ordered if compiles(c.backend)}

    def first(self) -> Job:
        """The first timing: the whole group within ``opts.group_budget_s``."""
        self._timings = 1
        return Job(list(self.keys), 1, self.opts.group_budget_s)

    def measured(self, job: Job, times: dict[str, list[float]], readings: dict[str, dict[str, float]],
                 stop: str, seconds: float) -> list[str]:
        """Take what ``job`` measured (each case's step times in ms and noise readings; why its
        rounds stopped; the seconds it took, re-timings counted against ``opts.remeasure_s``);
        returns the keys it found noisy, which :meth:`next` re-times."""
        if job.attempt > 1:
            self._spent += seconds
        mine = job.keys if job.retimed is None else [job.retimed]
        for k in mine:
            if k in times:
                self._times[k] = times[k]
                self._attempts[k] = self._attempts.get(k, 0) + 1
                self._last[k] = job.attempt
        noisy = [k for k in mine if noise.noise_reasons(readings.get(k, {}), self.opts.noise_thresholds,
                                                        precise=stop == "precise")]
        self._pending = noisy if job.retimed is None and job.attempt > 1 else self._pending + noisy
        return noisy

    def next(self) -> Job | None:
        """The next :class:`Job`, or None when nothing is left to re-time (see the module doc)."""
        while self._pending and len(self.keys) > 1:
            k = self._pending.pop(0)
            if k not in self._times or self._attempts.get(k, 0) >= self.opts.max_attempts:
                continue
            whole = k in self._baseline
            todo = self.keys if whole else [p for p in self.partners[k] if p in self._times] + [k]
            if len(todo) < 2:
                continue
            rounds = self.opts.timing.repeats if self.opts.precision_target is None else self.opts.min_pairs
            est = (rounds + 1) * sum(float(np.median(self._times[x])) for x in todo) / 1e3
            left = self.opts.remeasure_s - self._spent
            if est > left:
                continue
            if (pressure := self.busy(k)) is not None:  # timing again cannot make it quiet
                return Job([k], self._last.get(k, 1), 0.0, retimed=k, left_noisy=pressure)
            self._timings += 1
            return Job(list(todo), self._timings, min(self.opts.group_budget_s, left), None if whole else k)
        return None
