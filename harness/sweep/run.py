"""The cost sweep: cases grouped into units of resume, each measured and recorded whole.

A **unit** is what one end marker of ``records.jsonl`` covers (:mod:`harness.rundir.records`): with
paired timing (the default) the cases of one group (:func:`harness.sweep.plan.group_key`); without
it, or for a case that cannot be paired, one case. A unit's rows are staged as they are measured
(:func:`harness.sweep.unit.measure_unit`) and committed together when it is complete; an
interrupted unit is moved to ``aborted/`` and measured again, whole, on resume, so pairs never span
two processes and no case is ever recorded twice. ``--isolate`` runs each unit in a child process
(:mod:`harness.sweep.isolate`).
"""

from __future__ import annotations

from typing import Iterable

import torch
from tqdm import tqdm

from harness.rundir.writer import RunWriter

from .cases import Case
from .isolate import run_isolated
from .options import SweepOptions
from .plan import sweep_units
from .prepare import flops_key
from .unit import measure_unit


def run_sweep(cases: Iterable[Case], device: torch.device, run: RunWriter,
              opts: SweepOptions = SweepOptions(), progress: bool = True) -> dict[str, int]:
    """Measure every case not yet complete in ``run``'s directory, one unit at a time.

    Returns:
        a count per final status; ``resumed`` counts the cases complete before this call.

    Raises:
        KeyboardInterrupt (or the CLI's ``Interrupted``): the unit in progress is moved to
            ``aborted/`` and the exception propagates; every complete unit is kept.
        harness.rundir.writer.DiskFullError: no space to record a unit; nothing partial was kept.
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
    for group in sweep_units(cases, opts.paired, opts.group_budget_bytes):
        todo = [(c, first_of[c.key]) for c in group if c.key not in run.completed]
        stats["resumed"] += len(group) - len(todo)
        bar.update(len(group) - len(todo))
        if not todo:
            continue
        c = todo[0][0]
        bar.set_postfix_str(f"{len(todo)} case(s) d={c.cfg.d_model} L={c.cfg.n_layers} {c.mode} {c.backend}")
        if opts.isolate:
            statuses = run_isolated(todo, device, run, opts)
        else:
            with run.unit([k.key for k, _ in todo], kind="group" if len(todo) > 1 else "case") as u:
                statuses = measure_unit(todo, device, u, opts)
                u.commit(statuses)
        for s in statuses.values():
            stats[s] = stats.get(s, 0) + 1
        bar.update(len(todo))
    bar.close()
    return stats
