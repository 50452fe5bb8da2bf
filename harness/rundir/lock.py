"""The one writer of a run directory: creating the directory and taking its lock (DESIGN.md,
"Results"). ``fcntl.flock`` on ``.lock`` is dropped by the kernel when its process dies, so no
stale lock survives a kill; the file names the holder, which :func:`harness.rundir.records.
lock_holder` reads for ``routerbench status``.
"""

from __future__ import annotations

import datetime as _dt
import errno
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


#: What a run directory's lock is held by when ``flock`` is not used (``--lock-free``).
LOCK_FREE = "lock_free"


def take_lock(run_dir: Path, run_id: str, lock: bool = True):
    """Take the exclusive ``fcntl.flock`` of ``run_dir``'s ``.lock`` (dropped by the kernel when the
    process dies) and write the holder (pid, host, start time, command line) into it.

    Args:
        lock: False (``--lock-free``): write the holder, marked ``lock_free``, without ``flock``;
            one writer per directory is then the caller's promise (a launcher keeps it).

    Returns:
        the open lock file (closing it releases the lock).

    Raises:
        RunLockedError: another live process holds it (the message names its pid, host and start
            time, and ``--run-id``).
        ConfigError: the file system refuses ``flock`` (some network file systems): one line naming
            ``--lock-free`` and a local ``--out``. ``ROUTERBENCH_FAULT="lock_refused:GLOB"`` (GLOB over
            the run directory's path) plants that refusal.
    """
    path = run_dir / LOCK_FILE
    fh = open(path, "a+", encoding="utf-8")
    try:
        if lock:
            from .faults import fault_for
            if fault_for(str(run_dir)) == "lock_refused":
                raise OSError(errno.ENOLCK, "No locks available (injected by ROUTERBENCH_FAULT)")
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
    except OSError as exc:  # ENOLCK, EOPNOTSUPP, ENOSYS, EINVAL: a file system without flock
        fh.close()
        raise ConfigError(f"--out: the file system of {run_dir} refuses flock ({exc.strerror or exc}), so two "
                          "writers of one run directory could not be kept apart; put --out on a local file "
                          "system, or give --lock-free and run each unit once at a time (the launchers do)"
                          ) from None
    fh.seek(0)
    fh.truncate()
    fh.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "started": _now(),
                         "argv": sys.argv, **({} if lock else {LOCK_FREE: True})}) + "\n")
    fh.flush()
    return fh
