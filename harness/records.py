"""Tidy results that are never lost, doubled or orphaned (DESIGN.md, "Results").

A run directory ``results/<device-slug>/<run-id>/`` holds

- ``records.jsonl``: long-format rows with the columns of :data:`COLUMNS`, grouped in **units of
  resume** (a paired group of a sweep, one case of an unpaired sweep, a training run, a profile).
  A unit's rows and its end marker ``{"end_of_unit": …}`` are appended in one write, flushed and
  ``fsync``-ed, so a reader keeps exactly the rows followed by their marker and needs no other file;
- ``pending/<session>-<n>.jsonl``: the rows of the unit being measured, appended (and fsync-ed) one
  by one as they are made, so a crash loses nothing already measured;
- ``aborted/``: the rows of every abandoned unit (an interrupt, a killed process, a crashed or hung
  child under ``--isolate``, a full disk), moved there whole, never read as results, counted in
  ``manifest.json`` (``aborted``);
- ``.lock``: the lock of the one writer (:class:`harness.rundir.RunWriter`), with its pid, host
  and start time;
- ``manifest.json`` and ``spec.toml``: the environment and the resolved run spec.

Schema versions: 2 (this one: ``schema`` column, end markers); 1 (no markers, a ``done.jsonl`` of
finished cases) is still read, never extended. This module is the format and its reader; the writer
is :mod:`harness.rundir`.
"""

from __future__ import annotations

import fcntl
import json
from pathlib import Path
from typing import Any, Iterable, Iterator

#: Version of the row and marker format written by this module.
SCHEMA_VERSION = 2

#: Column order of every row. ``router_options`` is a JSON string; shape columns are flat.
COLUMNS: tuple[str, ...] = (
    "schema", "run_id", "session", "resume_unit", "case_key", "router", "router_options", "impl", "backend",
    "compile_mode", "mode", "workload", "d_model", "n_layers", "n_heads", "seq_len", "batch_size",
    "dtype", "device", "seed", "repeat", "pair", "metric", "value", "unit", "status", "error",
)
#: ``unit`` is the unit of measure (``ms``, ``bytes``); ``resume_unit`` names the unit of resume
#: whose end marker covers the row.

#: Allowed values of the ``status`` column.
STATUSES = ("ok", "oom", "error", "skipped", "not_converged", "diverged")

RECORDS_FILE = "records.jsonl"
MANIFEST_FILE = "manifest.json"
SPEC_FILE = "spec.toml"
LOCK_FILE = ".lock"
PENDING_DIR = "pending"
ABORTED_DIR = "aborted"
LEGACY_DONE_FILE = "done.jsonl"
#: Key of the end marker object of a unit in ``records.jsonl``.
END = "end_of_unit"


def json_default(obj: Any) -> Any:
    if hasattr(obj, "item"):
        return obj.item()
    return str(obj)


def make_row(base: dict[str, Any], row: dict[str, Any]) -> dict[str, Any]:
    """A full row: every column of :data:`COLUMNS`, ``base`` then ``row`` applied.

    Raises:
        ValueError: an unknown column or status.
    """
    full = {c: None for c in COLUMNS}
    full.update(base)
    full["status"] = "ok"
    unknown = set(row) - set(COLUMNS)
    if unknown:
        raise ValueError(f"unknown record column(s) {sorted(unknown)}; known: {COLUMNS}")
    full.update(row)
    full["schema"] = SCHEMA_VERSION
    if full["status"] not in STATUSES:
        raise ValueError(f"status must be one of {STATUSES}, got {full['status']!r}")
    if isinstance(full.get("router_options"), dict):
        full["router_options"] = json.dumps(full["router_options"], sort_keys=True)
    return full


def lock_holder(run_dir: Path) -> dict[str, Any] | None:
    """Who holds the lock of ``run_dir`` now (pid, host, started), or None when nobody does."""
    path = Path(run_dir) / LOCK_FILE
    if not path.exists():
        return None
    with open(path, encoding="utf-8") as fh:
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                return json.loads(fh.read() or "{}") or {"pid": None}
            except json.JSONDecodeError:
                return {"pid": None}
        fcntl.flock(fh.fileno(), fcntl.LOCK_UN)
    return None


def aborted_summary(run_dir: Path) -> dict[str, int]:
    """``{"units": n, "rows": m}`` moved to ``aborted/`` so far."""
    idx = read_jsonl(Path(run_dir) / ABORTED_DIR / "index.jsonl")
    return {"units": len(idx), "rows": sum(int(r.get("rows", 0)) for r in idx)}


# --- reading ---------------------------------------------------------------------------------

def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Every parseable JSON object of a JSON-lines file (a torn line is skipped)."""
    rows = []
    if not Path(path).exists():
        return rows
    with open(path, encoding="utf-8", errors="replace") as fh:
        for line in fh:
            line = line.strip()
            if not line:
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return rows


def iter_units(path: Path) -> Iterator[tuple[dict[str, Any], list[dict[str, Any]]]]:
    """``(end marker, rows)`` of every complete unit of a schema-2 ``records.jsonl``.

    A block whose marker is missing (a trailing unit torn by a crash), whose row count does not
    match its marker, or that holds an unparseable line is dropped whole.
    """
    buf: list[dict[str, Any]] = []
    bad = False
    if not Path(path).exists():
        return
    with open(path, encoding="utf-8", errors="replace") as fh:
        for line in fh:
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                bad = True
                continue
            if END not in obj:
                buf.append(obj)
                continue
            if not bad and len(buf) == obj.get("rows") and all(r.get("resume_unit") == obj[END] for r in buf):
                yield obj, buf
            buf, bad = [], False


def end_of_last_unit(path: Path) -> int:
    """Byte offset just after the last valid end marker of ``path`` (0 when none)."""
    end, count, bad = 0, 0, False
    with open(path, "rb") as fh:
        pos = 0
        for raw in fh:
            pos += len(raw)
            if not raw.strip():
                continue
            try:
                obj = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError):
                bad = True
                continue
            if END in obj:
                if not bad and obj.get("rows") == count:
                    end = pos
                count, bad = 0, False
            else:
                count += 1
    if end == 0 and not is_schema2(path):
        return Path(path).stat().st_size  # a schema-1 file has no markers: keep it whole
    return end


def is_schema2(path: Path) -> bool:
    with open(path, encoding="utf-8", errors="replace") as fh:
        for line in fh:
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                continue
            return "schema" in obj or END in obj
    return True


def completed_cases(run_dir: Path) -> dict[str, str]:
    """``case_key -> final status`` of every case whose unit is complete in ``run_dir``."""
    run_dir = Path(run_dir)
    path = run_dir / RECORDS_FILE
    if path.exists() and not is_schema2(path):
        return {r["case_key"]: "ok" for r in read_jsonl(run_dir / LEGACY_DONE_FILE)}
    out: dict[str, str] = {}
    for marker, _ in iter_units(path):
        for c in marker.get("cases", []):
            out[c] = marker.get("statuses", {}).get(c, "ok")
    return out


def units(run_dir: Path) -> list[dict[str, Any]]:
    """The end markers of the complete units of ``run_dir``, in order."""
    return [m for m, _ in iter_units(Path(run_dir) / RECORDS_FILE)]


def load_rows(run_dirs: Iterable[Path], finished_only: bool = True) -> list[dict[str, Any]]:
    """The rows of the complete units of the given run directories.

    Schema 2: exactly the rows followed by their unit's end marker (``finished_only`` is moot;
    unfinished units are in ``aborted/``). Schema 1 (``done.jsonl``, read for old results): with
    ``finished_only`` a case's rows come only from the session that finished it.
    """
    out: list[dict[str, Any]] = []
    for d in run_dirs:
        path = Path(d) / RECORDS_FILE
        if path.exists() and not is_schema2(path):
            out.extend(_legacy_rows(Path(d), finished_only))
            continue
        for _, rows in iter_units(path):
            out.extend(rows)
    return out


def _legacy_rows(run_dir: Path, finished_only: bool) -> list[dict[str, Any]]:
    rows = read_jsonl(run_dir / RECORDS_FILE)
    for r in rows:
        r["schema"], r["resume_unit"] = 1, None
    if finished_only:
        done = {r["case_key"]: r["session"] for r in read_jsonl(run_dir / LEGACY_DONE_FILE)}
        rows = [r for r in rows if r.get("case_key") not in done or done[r["case_key"]] == r.get("session")]
    return rows
