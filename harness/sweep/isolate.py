"""``--isolate``: each unit of a sweep in a child process (``multiprocessing`` spawn, so the pairing
of a group is kept).

The child writes its rows to the unit's pending file and sends every heartbeat of its unit
(:class:`harness.sweep.prepare.Heartbeat`: each stage of each case's set-up, the timing's looks) to
the parent as ``("beat", stage, weight, info)``; the parent passes it on to its own heartbeat (the
run's progress, :class:`harness.rundir.progress.Progress`) and gives the child ``weight`` ×
``--case-timeout`` seconds until the next one. A child that dies (a crash in a compiled or captured graph) or makes no progress for ``--case-timeout`` seconds
(a hang) is killed, its unit abandoned, and its cases re-run one by one in fresh children to pin
the failure on its case, which becomes an ``error`` row.
"""

from __future__ import annotations

import multiprocessing as mp
import signal
import time

import torch

from harness.rundir.writer import RunWriter, StagingWriter
from harness.step.device_errors import DeviceContextLost

from .cases import Case
from .options import SweepOptions
from .prepare import Heartbeat, no_beat
from .unit import measure_unit, record_lost

#: Seconds a child under ``--isolate`` may take to start (import torch) on top of ``--case-timeout``.
STARTUP_S = 120.0


def _child_main(todo, device: str, path: str, base: dict, run_dir: str, opts: SweepOptions, conn,
                plugin_records: list | None = None) -> None:
    """Body of an isolated child: load the parent's plugins (``plugin_records``:
    :func:`routers.plugins.records`), then measure one unit into the parent's pending file."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and kills us
    try:  # die with the parent (Linux): an orphan must not go on writing
        import ctypes
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:  # noqa: BLE001 - best effort off Linux
        pass
    from pathlib import Path

    from routers import plugins
    if (said := plugins.load_recorded(plugin_records)):  # the parent loaded them: this cannot differ
        raise plugins.PluginError("; ".join(said))
    w = StagingWriter(Path(path), base, Path(run_dir))

    def beat(stage: str, weight: int = 1, **info) -> None:
        conn.send(("beat", stage, weight, info))

    try:
        statuses = measure_unit(todo, torch.device(device), w, opts, heartbeat=beat)
    except DeviceContextLost as lost:  # this child can run nothing more: the parent records it
        conn.send(("lost", lost.case_key, lost.error))
        return
    conn.send(("done", statuses))


def _spawn_unit(todo: list[tuple[Case, bool]], device: torch.device, unit, opts: SweepOptions,
                beat: Heartbeat = no_beat) -> tuple[dict[str, str] | None, str | DeviceContextLost | None]:
    """Run one unit in a spawned child, passing its heartbeats on to ``beat``; ``(statuses, None)``
    or ``(None, what went wrong)``: a text, or the child's :class:`DeviceContextLost`."""
    beat("spawn", 1, text=f"starting a child process for {len(todo)} case{'s' * (len(todo) > 1)} (--isolate)")
    from routers import plugins
    ctx = mp.get_context("spawn")
    recv, send = ctx.Pipe(duplex=False)
    p = ctx.Process(target=_child_main, daemon=True,
                    args=(todo, str(device), str(unit.path), unit.base, str(unit.run_dir), opts, send,
                          plugins.records()))
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
                if msg[0] == "lost":
                    p.join(30)
                    return None, DeviceContextLost(msg[1], msg[2])
                deadline = time.monotonic() + opts.case_timeout * msg[2]
                try:
                    beat(msg[1], msg[2], **(msg[3] if len(msg) > 3 else {}))
                except Exception:  # noqa: BLE001 - progress must never end a unit
                    pass
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


def run_isolated(todo: list[tuple[Case, bool]], device: torch.device, run: RunWriter,
                 opts: SweepOptions, heartbeat: Heartbeat | None = None) -> dict[str, str]:
    """One unit under ``--isolate``; after a crash or a hang, its cases one by one (announced by a
    ``retry`` heartbeat). ``heartbeat`` receives a ``spawn`` beat per child and the children's
    heartbeats."""
    beat = heartbeat or no_beat
    kind = "group" if len(todo) > 1 else "case"
    u = run.unit([c.key for c, _ in todo], kind=kind)
    try:
        statuses, failure = _spawn_unit(todo, device, u, opts, beat)
    except BaseException as exc:
        u.abandon(f"{type(exc).__name__}: {exc}")
        raise
    if failure is None:
        u.commit(statuses)
        return statuses
    if isinstance(failure, DeviceContextLost):  # that case is an error row; the rest in a new child
        u.abandon(f"DeviceContextLost: {failure} (under --isolate, {len(todo)} case(s))")
        case = next((c for c, _ in todo if c.key == failure.case_key), todo[0][0])
        record_lost(run, case, failure)
        rest = [(c, first) for c, first in todo if c.key != case.key]
        if rest:
            beat("retry", 1, text=f"a sticky device error in {case.router} (under --isolate): "
                 f"its group's other {len(rest)} case(s) in a new child")
        return {case.key: "error", **(run_isolated(rest, device, run, opts, heartbeat) if rest else {})}
    u.abandon(f"{failure} (under --isolate, {len(todo)} case(s))")
    out: dict[str, str] = {}
    if len(todo) > 1:
        beat("retry", 1, text=f"{failure} (under --isolate): running its {len(todo)} cases one by one")
    for case, first in todo:
        if len(todo) > 1:
            u1 = run.unit([case.key], kind="case")
            try:
                st, fail = _spawn_unit([(case, first)], device, u1, opts, beat)
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
