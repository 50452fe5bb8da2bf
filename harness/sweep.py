"""The cost sweep: cases grouped into units of resume, each measured and recorded whole.

A **unit** is what one end marker of ``records.jsonl`` covers (:mod:`harness.records`): with
paired timing (the default) the cases that share backend, compile mode, mode, shape and seed
(:func:`harness.paired.group_key`); without it, or for a case that cannot be paired, one case. A
unit's rows are staged as they are measured and committed together when it is complete; an
interrupted unit is moved to ``aborted/`` and measured again, whole, on resume, so pairs never span
two processes and no case is ever recorded twice.

``--isolate`` runs each unit in a child process (``multiprocessing`` spawn, so the pairing of a
group is kept). The child writes its rows to the unit's pending file and reports progress per case;
a child that dies (a crash in a compiled or captured graph) or makes no progress for
``--case-timeout`` seconds (a hang) is killed, its unit abandoned, and its cases re-run one by one
in fresh children to pin the failure on its case, which becomes an ``error`` row.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import signal
import time
from typing import Callable, Iterable, Iterator

import torch
from tqdm import tqdm

from .cases import Case
from .measure import PAIRED_DEFAULT, SweepOptions, flops_key, run_case
from .paired import NetOfResident, compile_group, group_key, pairable, split_group, time_group
from .rundir import RunWriter, StagingWriter

__all__ = ["PAIRED_DEFAULT", "SweepOptions", "measure_unit", "prepared_group", "run_sweep", "sweep_units"]

#: Seconds a child under ``--isolate`` may take to start (import torch) on top of ``--case-timeout``.
STARTUP_S = 120.0

Heartbeat = Callable[[str, int], None]


def sweep_units(cases: Iterable[Case], paired: bool = PAIRED_DEFAULT,
                budget_bytes: int | None = None) -> list[list[Case]]:
    """The units of a sweep in order of first appearance: paired groups (split when their
    estimated memory exceeds ``budget_bytes``, :func:`harness.paired.split_group`), or single
    cases."""
    groups: dict[object, list[Case]] = {}
    for i, case in enumerate(cases):
        key = group_key(case) if paired and pairable(case) else ("alone", i)
        groups.setdefault(key, []).append(case)
    return [part for g in groups.values() for part in (split_group(g, budget_bytes) if len(g) > 1 else [g])]


def split_groups(cases: Iterable[Case], paired: bool, budget_bytes: int | None) -> list[dict]:
    """For the manifest: each paired group that was split, with its subgroups' case counts."""
    whole = sweep_units(cases, paired, None)
    out = []
    for g in whole:
        parts = split_group(g, budget_bytes) if len(g) > 1 else [g]
        if len(parts) > 1:
            c = g[0]
            out.append({"mode": c.mode, "d_model": c.cfg.d_model, "n_layers": c.cfg.n_layers,
                        "cases": len(g), "subgroups": [len(p) for p in parts]})
    return out


def measure_unit(todo: list[tuple[Case, bool]], device: torch.device, w: StagingWriter,
                 opts: SweepOptions, heartbeat: Heartbeat | None = None) -> dict[str, str]:
    """Measure the cases of one unit and write their rows to ``w``.

    Args:
        todo: (case, count its router's FLOPs here) for each case of the unit.
        heartbeat: called with a label and a weight (how many cases' time the next phase may
            take) before each phase; ``--isolate`` uses it as a progress signal.

    Returns:
        case key -> final status (``ok``, ``oom``, ``error`` or ``skipped``).
    """
    beat = heartbeat or (lambda label, weight: None)
    cases = [c for c, _ in todo]
    if len(todo) == 1 or not (opts.paired and pairable(cases[0])):
        out = {}
        for case, first in todo:
            beat(case.key, 1)
            out[case.key] = run_case(case, device, w, opts, count_flops=first)
        return out
    with prepared_group(todo, device, w, opts, beat) as (held, status):
        if held:
            beat("timing", len(held))
            status.update(time_group(cases, held, device, w, opts))
    return status


@contextlib.contextmanager
def prepared_group(todo: list[tuple[Case, bool]], device: torch.device, w: StagingWriter,
                   opts: SweepOptions, heartbeat: Heartbeat | None = None
                   ) -> Iterator[tuple[dict[str, Callable[[], object]], dict[str, str]]]:
    """Set up every case of a paired group and hold their warm steps while the body times them.

    Each case goes through :func:`harness.measure.run_case` with ``hold`` (parameters, FLOPs,
    saved activations, CUDA peak memory, compile or capture time, warm-up: its rows go to ``w``),
    inside :func:`harness.paired.compile_group` so the compiled models of the group live side by
    side. This is the one way a group is prepared: ``routerbench run`` times the held steps with
    :func:`harness.paired.time_group`, the pytest-benchmark suite (:mod:`harness.bench`) one round
    per benchmark call.

    Yields:
        (case key -> warm step, for the cases that set up ``ok``; case key -> status so far).
        On exit the steps are dropped and, on CUDA, the cache emptied.
    """
    beat = heartbeat or (lambda label, weight: None)
    cases = [c for c, _ in todo]
    held: dict[str, Callable[[], object]] = {}
    status: dict[str, str] = {}
    try:
        with compile_group("compile" if any(c.backend == "compile" for c in cases) else cases[0].backend,
                           len(cases)):
            for case, first in todo:
                beat(case.key, 1)
                cw = NetOfResident(w, device) if held and device.type == "cuda" else w
                status[case.key] = run_case(case, device, cw, opts, count_flops=first, hold=held)
            yield held, status
    finally:
        held.clear()
        if device.type == "cuda":
            torch.cuda.empty_cache()


def run_sweep(cases: Iterable[Case], device: torch.device, run: RunWriter,
              opts: SweepOptions = SweepOptions(), progress: bool = True) -> dict[str, int]:
    """Measure every case not yet complete in ``run``'s directory, one unit at a time.

    Returns:
        a count per final status; ``resumed`` counts the cases complete before this call.

    Raises:
        KeyboardInterrupt (or the CLI's ``Interrupted``): the unit in progress is moved to
            ``aborted/`` and the exception propagates; every complete unit is kept.
        harness.records.DiskFullError: no space to record a unit; nothing partial was kept.
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
            statuses = _run_isolated(todo, device, run, opts)
        else:
            with run.unit([k.key for k, _ in todo], kind="group" if len(todo) > 1 else "case") as u:
                statuses = measure_unit(todo, device, u, opts)
                u.commit(statuses)
        for s in statuses.values():
            stats[s] = stats.get(s, 0) + 1
        bar.update(len(todo))
    bar.close()
    return stats


# --- --isolate -------------------------------------------------------------------------------

def _child_main(todo, device: str, path: str, base: dict, run_dir: str, opts: SweepOptions, conn) -> None:
    """Body of an isolated child: measure one unit into the parent's pending file."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and kills us
    try:  # die with the parent (Linux): an orphan must not go on writing
        import ctypes
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:  # noqa: BLE001 - best effort off Linux
        pass
    from pathlib import Path
    w = StagingWriter(Path(path), base, Path(run_dir))
    statuses = measure_unit(todo, torch.device(device), w, opts,
                            heartbeat=lambda label, weight: conn.send(("beat", label, weight)))
    conn.send(("done", statuses))


def _spawn_unit(todo: list[tuple[Case, bool]], device: torch.device, unit, opts: SweepOptions
                ) -> tuple[dict[str, str] | None, str | None]:
    """Run one unit in a spawned child; ``(statuses, None)`` or ``(None, what went wrong)``."""
    ctx = mp.get_context("spawn")
    recv, send = ctx.Pipe(duplex=False)
    p = ctx.Process(target=_child_main, daemon=True,
                    args=(todo, str(device), str(unit.path), unit.base, str(unit.run_dir), opts, send))
    p.start()
    send.close()
    deadline = time.monotonic() + STARTUP_S + opts.case_timeout
    try:
        while True:
            if recv.poll(0.2):
                try:
                    msg = recv.recv()
                except EOFError:  # the child closed its end: it died
                    p.join(5)
                    return None, _death(p.exitcode)
                if msg[0] == "done":
                    p.join(30)
                    return msg[1], None
                deadline = time.monotonic() + opts.case_timeout * msg[2]
            elif not p.is_alive():
                return None, _death(p.exitcode)
            elif time.monotonic() > deadline:
                return None, f"hung: no progress for {opts.case_timeout:g} s (--case-timeout)"
    finally:
        if p.is_alive():
            p.kill()
        p.join(10)
        recv.close()


def _death(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            return f"crashed: killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"crashed: killed by signal {-code}"
    return f"crashed: exit status {code}"


def _run_isolated(todo: list[tuple[Case, bool]], device: torch.device, run: RunWriter,
                  opts: SweepOptions) -> dict[str, str]:
    """One unit under ``--isolate``; after a crash or a hang, its cases one by one."""
    kind = "group" if len(todo) > 1 else "case"
    u = run.unit([c.key for c, _ in todo], kind=kind)
    try:
        statuses, failure = _spawn_unit(todo, device, u, opts)
    except BaseException as exc:
        u.abandon(f"{type(exc).__name__}: {exc}")
        raise
    if failure is None:
        u.commit(statuses)
        return statuses
    u.abandon(f"{failure} (under --isolate, {len(todo)} case(s))")
    out: dict[str, str] = {}
    for case, first in todo:
        if len(todo) > 1:
            u1 = run.unit([case.key], kind="case")
            try:
                st, fail = _spawn_unit([(case, first)], device, u1, opts)
            except BaseException as exc:
                u1.abandon(f"{type(exc).__name__}: {exc}")
                raise
            if fail is None:
                u1.commit(st)
                out.update(st)
                continue
            u1.abandon(f"{fail} (under --isolate, alone)")
            fail = f"{fail} under --isolate, run alone (its group: {failure})"
        else:
            fail = f"{failure} under --isolate"
        with run.unit([case.key], kind="case") as ue:
            ue.write(**case.columns(), metric="step_time", unit="ms", status="error", error=fail)
            ue.commit({case.key: "error"})
        out[case.key] = "error"
    return out
