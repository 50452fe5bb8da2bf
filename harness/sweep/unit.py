"""Measuring one unit of a sweep (a paired group, or one case): every case prepared
(:func:`harness.sweep.prepare.prepare_group`), then the warm steps timed together
(:func:`harness.sweep.timed.time_group`), all rows written to the unit's writer. In the sweep's
process, or in an ``--isolate`` child (:mod:`harness.sweep.isolate`).
"""

from __future__ import annotations

import torch

from harness.rundir.writer import RunWriter, StagingWriter
from harness.step.device_errors import LOST_MARK, DeviceContextLost

from . import prepare, timed
from .cases import Case
from .options import SweepOptions


def measure_unit(todo: list[tuple[Case, bool]], device: torch.device, w: StagingWriter,
                 opts: SweepOptions, heartbeat: prepare.Heartbeat | None = None) -> dict[str, str]:
    """Measure the cases of one unit and write their rows to ``w``.

    Args:
        todo: (case, count its router's FLOPs here) for each case of the unit.
        heartbeat: called before each phase (:class:`harness.sweep.prepare.Heartbeat`): the set-up's
            stages (:func:`harness.sweep.prepare.prepare_group`), then ``timing`` as the timing
            starts and at its looks (:func:`harness.sweep.timed.time_group`).

    Returns:
        case key -> final status (``ok``, ``oom``, ``error`` or ``skipped``).
    """
    beat = heartbeat or prepare.no_beat
    cases = [c for c, _ in todo]
    with prepare.prepare_group(todo, device, w, opts, beat) as group:
        if group.steps:
            n = len(group.steps)
            beat("timing", n, text=f"timing {n} warm step{'s' * (n > 1)}" + (" interleaved" if n > 1 else ""),
                 n=n)
            group.status.update(timed.time_group(cases, group.steps, device, w, opts, beat=beat).status)
        return dict(group.status)


def record_lost(run: RunWriter, case: Case, lost: DeviceContextLost) -> None:
    """Record ``case`` as an ``error`` row, in a unit of its own, after a sticky device error it
    raised (:mod:`harness.step.device_errors`). The unit it was measured in has been abandoned
    (its rows are in ``aborted/``); its other cases are measured again in a new process."""
    why = (f"{lost.error} {LOST_MARK} the process could run nothing more on its device; "
           "this case is recorded as an error and the rest of the run is measured in a new process]")
    with run.unit([case.key], kind="case") as u:
        u.write(**case.columns(), metric="step_time", unit="ms", status="error", error=why)
        u.commit({case.key: "error"})
