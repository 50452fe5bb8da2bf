"""The one writer of a run directory: creating the directory and taking its lock (DESIGN.md,
"Results"). ``fcntl.flock`` on ``.lock`` is dropped by the kernel when its process dies, so no
stale lock survives a kill; the file names the holder, which :func:`harness.rundir.records.
lock_holder` reads for ``routerbench status``.
"""

from __future__ import annotations

import datetime as _dt
import fcntl
import json
import os
import socket
import sys
from pathlib import Path

from routers.errors import ConfigError

from .records import LOCK_FILE


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


class RunLockedError(ConfigError):
    """Another live process writes to this run directory (it holds the ``.lock``)."""


def make_run_dir(run_dir: Path, out_option: str = "--out") -> None:
    """Create ``run_dir`` and check that it can be written.

    Raises:
        ConfigError: naming ``out_option`` when a path component is a file, the directory cannot
            be created (permissions, a read-only or missing file system) or written.
    """
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        probe = run_dir / f".write-test-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except (FileExistsError, NotADirectoryError):
        raise ConfigError(f"{out_option}: {run_dir} cannot be created: a part of that path is a file; "
                          f"give {out_option} a directory") from None
    except OSError as exc:
        raise ConfigError(f"{out_option}: cannot write {run_dir} ({exc.strerror or exc}); give "
                          f"{out_option} a writable directory") from None


def take_lock(run_dir: Path, run_id: str):
    """Take the exclusive ``fcntl.flock`` of ``run_dir``'s ``.lock`` (dropped by the kernel when the
    process dies) and write the holder (pid, host, start time, command line) into it.

    Returns:
        the open lock file (closing it releases the lock).

    Raises:
        RunLockedError: another live process holds it (the message names its pid, host and start
            time, and ``--run-id``).
    """
    path = run_dir / LOCK_FILE
    fh = open(path, "a+", encoding="utf-8")
    try:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        fh.seek(0)
        try:
            h = json.loads(fh.read() or "{}")
        except json.JSONDecodeError:
            h = {}
        fh.close()
        who = (f"pid {h.get('pid')} on {h.get('host')} since {h.get('started')}" if h
               else "another process")
        raise RunLockedError(f"--run-id {run_id}: {run_dir} is being written by {who}; wait for it "
                             "or choose another --run-id") from None
    fh.seek(0)
    fh.truncate()
    fh.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "started": _now(),
                         "argv": sys.argv}) + "\n")
    fh.flush()
    return fh
