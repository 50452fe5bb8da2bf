"""The one writer of a run directory: lock, recovery of a dead writer's leftovers, units of resume
staged as measured and committed whole, ``aborted/`` (the format is :mod:`harness.rundir.records`).

Opening a run directory creates it (errors name ``--out``), takes an exclusive ``fcntl.flock`` on
``.lock`` (the kernel drops it when the process dies, so no stale lock survives a kill), then
recovers from an earlier process that died: a torn tail of ``records.jsonl`` after its last end
marker and every pending file are moved to ``aborted/``. Committing and abandoning a unit hold
SIGINT and SIGTERM, so an interrupt cannot fall between writing a unit and knowing it is written.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import errno
import json
import os
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from routers.errors import ConfigError

from . import faults
from .lock import make_run_dir, take_lock
from .records import (ABORTED_DIR, END, EXTENDABLE_SCHEMA, MANIFEST_FILE, PENDING_DIR, RECORDS_FILE, SCHEMA_VERSION,
                      aborted_summary, completed_cases, end_of_last_unit, json_default, make_row, schema_of, units)

__all__ = ["DiskFullError", "MemoryWriter", "NullRunWriter", "RunWriter", "StagingWriter", "Unit"]


class DiskFullError(OSError):
    """A unit could not be recorded for lack of space (``ENOSPC``); nothing partial was kept."""


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def _fsync_append(path: Path, data: bytes) -> None:
    """Append ``data`` to ``path`` and fsync; on any error cut the file back to its old size."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        start = os.fstat(fd).st_size
        try:
            view = memoryview(data)
            while view:
                n = os.write(fd, view)
                view = view[n:]
            os.fsync(fd)
        except OSError:
            os.ftruncate(fd, start)  # no partial row and no partial unit survive
            raise
    finally:
        os.close(fd)


@contextlib.contextmanager
def _signals_held():
    """Hold SIGINT and SIGTERM while a unit is committed or abandoned, so an interrupt cannot fall
    between writing a unit and marking it done; a held signal is delivered right after."""
    try:
        old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    except (AttributeError, ValueError, OSError):  # no pthread_sigmask here
        yield
        return
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


@dataclass
class StagingWriter:
    """Appends rows of one unit to its pending file as they are measured (one fsync per row).

    This is what measuring code writes to (``w.write(**case.columns(), metric=…, value=…,
    unit="ms")``); under ``--isolate`` the child process holds one on the parent's pending path.

    Args:
        path: the pending file.
        base: column values of every row (``run_id``, ``session``, ``resume_unit``, ``device``).
        run_dir: the run directory (profiles write traces beside the records).
    """

    path: Path
    base: dict[str, Any]
    run_dir: Path | None = None
    rows: int = 0

    def write(self, **row: Any) -> dict[str, Any]:
        """Append one row (missing columns become ``None``) and return it.

        Raises:
            ValueError: an unknown column or status.
            OSError: the pending file cannot be written (``ENOSPC``: the disk is full).
        """
        full = make_row(self.base, row)
        _fsync_append(Path(self.path), (json.dumps(full, default=json_default) + "\n").encode())
        self.rows += 1
        return full


class MemoryWriter:
    """A writer (``w.write(**row)``, as :class:`StagingWriter`) that keeps full record rows in
    memory: a pytest-benchmark pair's rows go to its ``extra_info`` (:mod:`harness.ci.pairbench`),
    and :mod:`reports.benchjson` makes a run directory of them later.

    Args:
        base: column values of every row (``device``).
    """

    def __init__(self, base: dict[str, Any]) -> None:
        self.base, self.rows, self.run_dir = dict(base), [], None

    def write(self, **row: Any) -> dict[str, Any]:
        """Append one row (checked as a record row) and return it.

        Raises:
            ValueError: an unknown column or status.
        """
        full = make_row(self.base, row)
        self.rows.append(full)
        return full

def _is_row(line: str) -> bool:
    """A complete JSON row (a fragment torn by a dying writer is not one)."""
    try:
        return isinstance(json.loads(line), dict)
    except json.JSONDecodeError:
        return False


class Unit(StagingWriter):
    """One unit of resume: rows staged as measured, then :meth:`commit` or :meth:`abandon`.

    Used as a context manager: a normal exit commits, an exception (an interrupt included)
    abandons and re-raises.
    """

    def __init__(self, owner: "RunWriter", name: str, cases: list[str], kind: str) -> None:
        super().__init__(owner.run_dir / PENDING_DIR / f"{name}.jsonl",
                         {**owner.base, "run_id": owner.run_id, "session": owner.session, "resume_unit": name},
                         owner.run_dir)
        self.owner, self.name, self.cases, self.kind = owner, name, list(cases), kind
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.touch()
        self.closed = False
        self._kill_at = faults.unit_kill_point(self.cases, "kill_in_unit")

    def write(self, **row: Any) -> dict[str, Any]:
        """Stage one row (:meth:`StagingWriter.write`)."""
        full = super().write(**row)
        if self._kill_at is not None and self.rows >= self._kill_at:
            faults.kill_now()  # ROUTERBENCH_FAULT=kill_in_unit=N: a kill mid-unit, at a named point
        return full

    def __enter__(self) -> "Unit":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if self.closed:
            return
        if exc_type is None:
            self.commit()
        else:
            self.abandon(f"{exc_type.__name__}: {exc}".strip().rstrip(":"))

    def commit(self, statuses: dict[str, str] | None = None, extra: dict[str, Any] | None = None) -> None:
        """Append the staged rows and the end marker to ``records.jsonl`` in one fsync-ed write.

        Args:
            statuses: case key -> final status (``ok``, ``oom``, ``error``, …), kept in the marker.
            extra: more marker fields (a training segment's ``{"segment": {"case": key, "step": s}}``).

        Raises:
            DiskFullError: no space left; the records are as before and the unit is abandoned
                (its rows moved to ``aborted/`` by a rename, which needs no space).
        """
        with _signals_held():
            self._commit(statuses, extra)

    def _commit(self, statuses: dict[str, str] | None, extra: dict[str, Any] | None = None) -> None:
        rows = [ln for ln in self.path.read_text(encoding="utf-8").splitlines() if _is_row(ln)]
        marker = {END: self.name, "schema": SCHEMA_VERSION, "kind": self.kind, "rows": len(rows),
                  "cases": self.cases, "statuses": statuses or {}, "session": self.owner.session,
                  "committed": _now(), **(extra or {})}
        data = ("\n".join(rows + [json.dumps(marker, default=json_default)]) + "\n").encode()
        records = self.owner.records
        start = records.stat().st_size if records.exists() else 0
        try:
            faults.maybe_disk_full(self.cases, records, data)
            _fsync_append(records, data)
        except OSError as exc:
            if records.exists() and records.stat().st_size > start:
                os.truncate(records, start)  # no partial unit survives
            if exc.errno != errno.ENOSPC:
                self._abandon(f"{type(exc).__name__}: {exc}")
                raise
            self._abandon("no space left on device")
            raise DiskFullError(errno.ENOSPC, f"no space left on device writing {self.owner.records}: "
                                f"the unit in progress was moved to {ABORTED_DIR}/, nothing partial "
                                "was recorded") from None
        if faults.unit_kill_point(self.cases, "kill_after_commit") is not None:
            faults.kill_now()  # a kill between the commit and the pending file's removal
        # a kill here leaves the pending file of a committed unit: recovery drops it
        # (RunWriter._recover), never moving committed rows to aborted/
        self.path.unlink()
        self.closed = True
        self.owner.completed.update({c: (statuses or {}).get(c, "ok") for c in self.cases})

    def abandon(self, reason: str) -> Path | None:
        """Move the staged rows to ``aborted/``, with ``reason`` in ``aborted/index.jsonl``."""
        with _signals_held():
            return self._abandon(reason)

    def _abandon(self, reason: str) -> Path | None:
        self.closed = True
        return self.owner._move_to_aborted(self.path, reason)


class RunWriter:
    """The one writer of a run directory: lock, recovery, units, ``aborted/`` bookkeeping.

    Opening a run directory creates it (errors name ``--out``), takes an exclusive
    ``fcntl.flock`` on ``.lock`` (the kernel drops it when the process dies, so no stale lock
    survives a kill), then recovers from an earlier process that died: a torn tail of
    ``records.jsonl`` after its last end marker and every pending file are moved to ``aborted/``.

    Args:
        run_dir: ``<out>/<device-slug>/<run-id>``.
        run_id: written into every row.
        session: id of this invocation (a resumed run gets a new session).
        base: column values shared by every row (e.g. ``device``).
        out_option: how the user named the results root, for error messages (``--out results``).
        lock: False (``--lock-free``): no ``flock``; the holder is written and cleared at close.

    Raises:
        ConfigError: the directory cannot be created or written (the message names ``--out``).
        RunLockedError: another live process holds the lock (the message names its pid, host and
            start time, and ``--run-id``).
    """

    def __init__(self, run_dir: Path, run_id: str, session: str, base: dict[str, Any] | None = None,
                 out_option: str = "--out", lock: bool = True) -> None:
        self.run_dir, self.run_id, self.session = Path(run_dir), run_id, session
        self.lock_free = not lock
        self.base = dict(base or {})
        self.records = self.run_dir / RECORDS_FILE
        self._n_units = 0
        self.resumed = self.records.exists()
        make_run_dir(self.run_dir, out_option)
        if self.resumed and schema_of(self.records) < EXTENDABLE_SCHEMA:
            raise ConfigError(f"--run-id {run_id}: {self.run_dir} holds records of schema "
                              f"{schema_of(self.records)} (an older routerbench, whose case keys differ); they "
                              "can be reported but not extended: choose another --run-id")
        self._lock_fh = take_lock(self.run_dir, run_id, lock)
        self.recovered = self._recover()
        self.completed: dict[str, str] = completed_cases(self.run_dir)

    # --- units ---------------------------------------------------------------------------
    def unit(self, cases: Iterable[str], kind: str = "cases") -> Unit:
        """A new unit covering ``cases`` (case keys); see :class:`Unit`."""
        self._n_units += 1
        return Unit(self, f"{self.session}-{self._n_units:04d}", list(cases), kind)

    def close(self) -> None:
        """Remove ``pending/`` when no unit is left in it, and release the lock (also released
        by the kernel when the process dies)."""
        if self._lock_fh is not None:
            with contextlib.suppress(OSError):  # not empty: a unit left for the next writer to recover
                (self.run_dir / PENDING_DIR).rmdir()
            if self.lock_free:  # no kernel lock to drop: the holder is cleared by hand
                with contextlib.suppress(OSError):
                    self._lock_fh.truncate(0)
            self._lock_fh.close()
            self._lock_fh = None

    def __enter__(self) -> "RunWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- recovery and aborted/ -----------------------------------------------------------
    def _recover(self) -> dict[str, int]:
        """Move what a dead writer left half-done to ``aborted/``; returns counts."""
        found = {"torn_tail_bytes": 0, "pending_units": 0}
        if self.records.exists():
            keep = end_of_last_unit(self.records)
            size = self.records.stat().st_size
            if size > keep:
                with open(self.records, "rb+") as fh:
                    fh.seek(keep)
                    tail = fh.read()
                    tail_path = self.run_dir / PENDING_DIR / f"{self.session}-torn-tail.jsonl"
                    tail_path.parent.mkdir(parents=True, exist_ok=True)
                    tail_path.write_bytes(tail)
                    fh.truncate(keep)
                    fh.flush()
                    os.fsync(fh.fileno())
                self._move_to_aborted(tail_path, f"torn tail of {RECORDS_FILE} (a commit cut short)")
                found["torn_tail_bytes"] = size - keep
        pending = self.run_dir / PENDING_DIR
        left = sorted(pending.glob("*.jsonl")) if pending.exists() else []
        # a unit whose end marker is in the records was committed: its process died before it
        # removed the pending file, whose rows are all in the records already
        committed = {m.get(END) for m in units(self.run_dir)} if left and self.records.exists() else set()
        for p in left:
            if p.stem in committed:
                p.unlink()
                found["committed_pending_removed"] = found.get("committed_pending_removed", 0) + 1
                continue
            self._move_to_aborted(p, "left by a process that died or was killed")
            found["pending_units"] += 1
        return found

    def _move_to_aborted(self, path: Path, reason: str) -> Path | None:
        if not path.exists():
            return None
        dest_dir = self.run_dir / ABORTED_DIR
        dest_dir.mkdir(exist_ok=True)
        dest, n = dest_dir / path.name, 1
        while dest.exists():  # never overwrite an earlier abandoned unit
            n += 1
            dest = dest_dir / f"{path.stem}.{n}{path.suffix}"
        os.replace(path, dest)
        n_rows = sum(1 for ln in dest.read_text(encoding="utf-8", errors="replace").splitlines() if ln.strip())
        try:
            with open(dest_dir / "index.jsonl", "a", encoding="utf-8") as fh:
                fh.write(json.dumps({"file": dest.name, "rows": n_rows, "reason": reason,
                                     "session": self.session, "moved": _now()}) + "\n")
            _update_manifest_aborted(self.run_dir)
        except OSError:
            pass  # the rows are safe in aborted/ whatever the bookkeeping could write
        return dest


class NullRunWriter:
    """The writer of a process that must not write (a ``torchrun`` rank other than 0): its units
    measure and are dropped (:class:`_NullUnit`), no lock is taken, nothing is created."""

    def __init__(self, run_dir: Path, run_id: str) -> None:
        self.run_dir, self.run_id, self.session = Path(run_dir), run_id, "rank"
        self.records = None  # writes nothing, not even checkpoints
        self.base: dict[str, Any] = {}
        self.completed: dict[str, str] = {}
        self.resumed = False
        self.recovered = {"torn_tail_bytes": 0, "pending_units": 0}

    def unit(self, cases: Iterable[str], kind: str = "cases") -> "_NullUnit":
        return _NullUnit()

    def close(self) -> None:
        """Nothing to release: no lock was taken."""


class _NullUnit:
    """A unit that checks its rows like :class:`Unit` (so a bad row fails on every rank) and keeps
    none of them."""

    run_dir = None
    rows = 0

    def __enter__(self) -> "_NullUnit":
        return self

    def __exit__(self, *exc) -> None:
        """Nothing staged, so nothing to commit or abandon."""

    def write(self, **row: Any) -> dict[str, Any]:
        return make_row({}, row)

    def commit(self, statuses: dict[str, str] | None = None, extra: dict[str, Any] | None = None) -> None:
        """Rank 0 records the unit; this rank drops it."""

    def abandon(self, reason: str) -> None:
        """Nothing staged: nothing to move to ``aborted/``."""


def _update_manifest_aborted(run_dir: Path) -> None:
    path = run_dir / MANIFEST_FILE
    if not path.exists():
        return
    manifest = json.loads(path.read_text())
    manifest["aborted"] = aborted_summary(run_dir)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(manifest, indent=2, default=str))
    tmp.replace(path)
