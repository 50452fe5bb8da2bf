"""``routerbench run --supervise``: the sweep in a child process, resumed in a new one after a sticky
device error (docs/GPU.md, "Supervision: a device error costs one case").

A sticky CUDA error (an illegal memory access, a launch failure) leaves the process that raised it
unable to run anything more on its device (:mod:`harness.step.device_errors`). The child records
the case that raised it as an ``error`` row, moves the unit it was measuring to ``aborted/``, and
exits with :data:`EXIT_DEVICE_LOST`; the supervisor then starts a new child on the same run
directory, which resumes it as any resume does (the completed units stay, the aborted unit's other
cases are measured again). Each restart follows a recorded error row, so there are at most as many
restarts as cases. Any other exit of a child is the command's own.

The supervisor builds no model and never touches the device (a CUDA context of its own would hold
device memory the children need). It runs each child in a process group of its own and passes
SIGINT, SIGTERM and SIGHUP on to it, so that one Ctrl-C reaches the child once (the command's
interrupt: a second one exits at once); the child dies with the supervisor (``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import click

#: Set in the environment of a supervised child (it supervises nothing itself).
CHILD_ENV = "ROUTERBENCH_SUPERVISED"

#: Exit status of a command stopped by a sticky device error (``EX_TEMPFAIL``: try again).
EXIT_DEVICE_LOST = 75

#: The signals the supervisor passes on to its child.
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def supervised_child() -> bool:
    """Whether this process is a supervised child (``ROUTERBENCH_SUPERVISED`` set)."""
    return bool(os.environ.get(CHILD_ENV))


def _die_with_parent() -> None:  # in the child, before exec: Linux only, best effort
    os.setpgid(0, 0)
    try:
        import ctypes
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except Exception:  # noqa: BLE001 - off Linux the child outlives a killed supervisor
        pass


def run_child(cmd: list[str]) -> int:
    """Run ``cmd`` as a supervised child, passing :data:`FORWARDED` signals on to it; its exit
    status (128 + N when a signal N ended it). The child loads the plugins this process loaded
    (:func:`routers.plugins.child_env`)."""
    from routers import plugins
    env = {**plugins.child_env(), CHILD_ENV: "1"}
    proc = subprocess.Popen(cmd, env=env, preexec_fn=_die_with_parent)  # noqa: PLW1509 - no threads here
    old = {s: signal.signal(s, lambda signum, frame: proc.send_signal(signum)) for s in FORWARDED}
    try:
        while True:
            try:
                rc = proc.wait()
                break
            except InterruptedError:  # pragma: no cover - PEP 475 retries wait() itself
                continue
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    return 128 - rc if rc < 0 else rc


def lost_line(run_dir: Path, restarts: int, prog: str = "routerbench") -> str:
    """The supervisor's last line after restarts: how many cases of the run are ``error`` rows of
    sticky device errors, and where to read them (the sweep's own last line, written by the last
    child, counts only what that child measured)."""
    from harness.rundir.records import load_rows
    from harness.step.device_errors import LOST_MARK
    lost = {r["case_key"]: r["router"] for r in load_rows([run_dir])
            if r.get("status") == "error" and LOST_MARK in str(r.get("error") or "")}
    names = ", ".join(lost[k] for k in sorted(lost)[:4]) + (", …" if len(lost) > 4 else "")
    return (f"supervisor: the run finished after {restarts} restart{'s' * (restarts != 1)} in a new process; "
            f"{len(lost)} case{'s' * (len(lost) != 1)} lost to a sticky device error "
            f"{'are error rows' if len(lost) != 1 else 'is an error row'} ({names}): {prog} status "
            f"{shlex.quote(str(run_dir))}")


def supervise(spec, run_dir: Path, run_id: str, out: str, max_restarts: int, prog: str = "routerbench") -> int:
    """Run ``routerbench run`` of the resolved ``spec`` into ``run_dir`` in a child process, and
    again in a new one after each exit :data:`EXIT_DEVICE_LOST`, at most ``max_restarts`` times.

    Args:
        spec: the resolved :class:`harness.spec.RunSpec` (the first child reads it from a file).
        run_dir: the run directory the children write (``out/<device>/<run_id>``).
        run_id, out: its ``--run-id`` and ``--out``.
        max_restarts: restarts at most (each follows a recorded error row: the number of cases).
        prog: how the last line names the program (:func:`harness.cli.common.program`).

    Returns:
        the exit status of the last child.
    """
    from harness.rundir.records import SPEC_FILE

    from ..spec import write_toml
    with tempfile.TemporaryDirectory(prefix="routerbench-supervise-") as tmp:
        first = Path(tmp) / SPEC_FILE
        write_toml(spec, first, "routerbench run spec of a supervised child", spec.NOT_IN_FILE)
        restarts = 0
        while True:
            # the first child gets the options given (a resumed run checks them against its
            # spec.toml); a restart, the run's own spec.toml
            spec_file = run_dir / SPEC_FILE if restarts and (run_dir / SPEC_FILE).exists() else first
            rc = run_child([sys.executable, "-m", "harness.cli", "run", "--config", str(spec_file),
                            "--out", out, "--run-id", run_id])
            if rc != EXIT_DEVICE_LOST:
                if restarts:
                    click.echo(lost_line(run_dir, restarts, prog), err=True)
                return rc
            if restarts >= max_restarts:
                click.echo(f"supervisor: {restarts} restarts, as many as the run has cases: stopping; "
                           f"resume with the command above", err=True)
                return rc
            restarts += 1
            click.echo(f"supervisor: a sticky device error ended the process measuring {run_dir}; "
                       f"resuming the rest of the run in a new process (restart {restarts})", err=True)
