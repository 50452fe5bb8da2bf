"""The cost sweep: cases grouped into units of resume, each measured and recorded whole.

A **unit** is what one end marker of ``records.jsonl`` covers (:mod:`harness.rundir.records`): with
paired timing (the default) the cases of one group (:func:`harness.sweep.plan.group_key`); without
it, or for a case that cannot be paired, one case. A unit's rows are staged as they are measured
(:func:`harness.sweep.unit.measure_unit`) and committed together when it is complete; an
interrupted unit is moved to ``aborted/`` and measured again, whole, on resume, so pairs never span
two processes and no case is ever recorded twice. ``--isolate`` runs each unit in a child process
(:mod:`harness.sweep.isolate`).

Progress: every unit's start and end and every heartbeat of its set-up and timing
(:class:`harness.sweep.prepare.Heartbeat`) is an event of the run's ``progress.json``
(:class:`harness.rundir.progress.Progress`, which adds a ``tick`` whenever nothing else came for 10
s); the progress bar's postfix shows the stage now (``group 2/5 · compiling model 3 of 14 (haares
two_phase compile, model scope) · 85 s``).
"""

from __future__ import annotations

from collections import Counter
from typing import Iterable

import torch
from tqdm import tqdm

from harness.rundir.progress import Progress
from harness.rundir.writer import RunWriter
from harness.step.device_errors import DeviceContextLost

from .cases import Case
from .isolate import run_isolated
from .options import SweepOptions
from .plan import sweep_units
from .prepare import case_label, flops_key
from .unit import measure_unit, record_lost


def run_sweep(cases: Iterable[Case], device: torch.device, run: RunWriter,
              opts: SweepOptions = SweepOptions(), progress: bool = True) -> dict[str, int]:
    """Measure every case not yet complete in ``run``'s directory, one unit at a time, telling
    its progress in ``progress.json`` (module doc) and, with ``progress``, in a bar.

    Returns:
        a count per final status; ``resumed`` counts the cases complete before this call.

    Raises:
        KeyboardInterrupt (or the CLI's ``Interrupted``): the unit in progress is moved to
            ``aborted/`` and the exception propagates; every complete unit is kept.
        harness.rundir.writer.DiskFullError: no space to record a unit; nothing partial was kept.
        harness.step.device_errors.DeviceContextLost: a case raised a sticky device error (an
            illegal memory access, a launch failure): the case is recorded as an ``error`` row,
            the unit it was measured in goes to ``aborted/``, and the rest of the run must be
            measured in a new process (``routerbench run --supervise`` does so).
    """
    cases = list(cases)
    stats: dict[str, int] = {"resumed": 0}
    seen: set = set()
    first_of: dict[str, bool] = {}
    for case in cases:  # FLOPs at the first case of each router and shape, in sweep order
        first_of[case.key] = flops_key(case) not in seen
        seen.add(flops_key(case))
    bar = tqdm(total=len(cases), desc="cost sweep" + (" (paired)" if opts.paired else ""), unit="case",
               disable=not progress)
    plan = [(g, [(c, first_of[c.key]) for c in g if c.key not in run.completed])
            for g in sweep_units(cases, opts.paired, opts.group_budget_bytes)]
    n_units = sum(1 for _, todo in plan if todo)
    word = "group" if opts.paired else "case"
    where = {"unit": ""}

    def show(ev: dict) -> None:  # the stage now, in the bar (also from the ticker's thread)
        latest = tracker.latest or ev
        age = max(0.0, ev["t"] - latest["t"])
        parts = (where["unit"], latest["text"], f"{age:.0f} s" if age >= 1 else "")
        bar.set_postfix_str(" · ".join(x for x in parts if x))

    tracker = Progress(run.run_dir if getattr(run, "records", None) is not None else None,
                       on_event=show if progress else None)
    with tracker:
        done = len(cases) - sum(len(todo) for _, todo in plan)
        tracker.event("sweep", f"cost sweep: {len(cases)} cases, {done} done before, {n_units} "
                      f"{word}{'s' * (n_units != 1)} to measure", n=n_units, cases=len(cases), resumed=done)
        k = 0
        for group, todo in plan:
            stats["resumed"] += len(group) - len(todo)
            bar.update(len(group) - len(todo))
            if not todo:
                continue
            k += 1
            c = todo[0][0]
            where["unit"] = f"{word} {k}/{n_units}"
            tracker.event("unit", f"{word} {k} of {n_units}: {len(todo)} case{'s' * (len(todo) > 1)} "
                          f"d={c.cfg.d_model} L={c.cfg.n_layers} {c.mode}"
                          + ("" if len(todo) > 1 else f" ({case_label(c)})"),
                          k=k, n=n_units, cases=[t.key for t, _ in todo])
            if opts.isolate:
                statuses = run_isolated(todo, device, run, opts, heartbeat=tracker.beat)
            else:
                try:
                    with run.unit([t.key for t, _ in todo], kind="group" if len(todo) > 1 else "case") as u:
                        statuses = measure_unit(todo, device, u, opts, heartbeat=tracker.beat)
                        u.commit(statuses)
                except DeviceContextLost as lost:  # the unit went to aborted/; its case is an error row
                    case = next((t for t, _ in todo if t.key == lost.case_key), todo[0][0])
                    record_lost(run, case, lost)
                    tracker.event("device_lost", f"{word} {k} of {n_units}: a sticky device error in "
                                  f"{case_label(case)}, recorded as its error row; this process stops",
                                  k=k, n=n_units, case=case.key, router=case.router,
                                  error=lost.error[:300])
                    bar.close()
                    raise
            for s in statuses.values():
                stats[s] = stats.get(s, 0) + 1
            counted = Counter(statuses.values())
            tracker.event("unit_done", f"{word} {k} of {n_units} done: "
                          + ", ".join(f"{s} {m}" for s, m in sorted(counted.items())),
                          k=k, n=n_units, statuses=dict(counted))
            bar.update(len(todo))
        where["unit"] = ""
        tracker.stop("done", "cost sweep done: " + ", ".join(f"{s} {m}" for s, m in sorted(stats.items())))
    bar.close()
    return stats
