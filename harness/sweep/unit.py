"""Measuring one unit of a sweep (a paired group, or one case): every case prepared
(:func:`harness.sweep.prepare.prepare_group`), then the warm steps timed together
(:func:`harness.sweep.timed.time_group`), all rows written to the unit's writer. In the sweep's
process, or in an ``--isolate`` child (:mod:`harness.sweep.isolate`).
"""

from __future__ import annotations

import torch

from harness.rundir.writer import StagingWriter

from . import prepare, timed
from .cases import Case
from .options import SweepOptions


def measure_unit(todo: list[tuple[Case, bool]], device: torch.device, w: StagingWriter,
                 opts: SweepOptions, heartbeat: prepare.Heartbeat | None = None) -> dict[str, str]:
    """Measure the cases of one unit and write their rows to ``w``.

    Args:
        todo: (case, count its router's FLOPs here) for each case of the unit.
        heartbeat: called before each phase (:data:`harness.sweep.prepare.Heartbeat`).

    Returns:
        case key -> final status (``ok``, ``oom``, ``error`` or ``skipped``).
    """
    beat = heartbeat or (lambda label, weight: None)
    cases = [c for c, _ in todo]
    with prepare.prepare_group(todo, device, w, opts, beat) as group:
        if group.steps:
            beat("timing", len(group.steps))
            group.status.update(timed.time_group(cases, group.steps, device, w, opts).status)
        return dict(group.status)
