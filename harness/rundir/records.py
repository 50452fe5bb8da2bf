"""Tidy results that are never lost, doubled or orphaned (DESIGN.md, "Results").

A run directory ``results/<device-slug>/<run-id>/`` holds

- ``records.jsonl``: long-format rows with the columns of :data:`COLUMNS`, grouped in **units of
  resume** (a paired group of a sweep, one case of an unpaired sweep, a training run, a profile).
  A unit's rows and its end marker ``{"end_of_unit": …}`` are appended in one write, flushed and
  ``fsync``-ed, so a reader needs no other file to tell finished units from an unfinished one;
- ``pending/<session>-<n>.jsonl``: the rows of the unit being measured, appended (and fsync-ed) one
  by one as they are made, so a crash loses nothing already measured;
- ``aborted/``: the rows of every abandoned unit (an interrupt, a killed process, a crashed or hung
  child under ``--isolate``, a full disk), moved there whole, never read as results, counted in
  ``manifest.json`` (``aborted``);
- ``.lock``: the lock of the one writer (:class:`harness.rundir.writer.RunWriter`): pid, host, start;
- ``manifest.json`` and ``spec.toml``: the environment and the resolved run spec.

Schema versions: 4 (this one: the timing columns ``pairs_with``, ``n_pairs``, ``stop`` and
``ci_conf``, below; case keys as in 3, so a schema-3 directory is extended); 3 (the ``compile_scope``
column, in case keys too); 2 (``schema`` column, end markers; its compiled rows read as
``compile_scope`` ``model``, the only scope then); 1 (no markers, a ``done.jsonl`` of finished cases). Schemas 1 and 2 are read, never extended; a
schema newer than this version is refused, read or extended, with one line naming the upgrade
(:class:`NewerSchemaError`). This module is the format and its reader; the writer
is :mod:`harness.rundir`.

Reading (:func:`scan_records`): any end marker ends a unit, and the parseable rows since the previous
marker are that unit's rows: they load, and its cases count as done (:func:`completed_cases`), so a
resume never measures them twice. Nothing is dropped silently: an unparsable line, a row count that
differs from the marker's ``rows``, or rows whose ``resume_unit`` is not the marker's is a *problem*,
one line naming the file and the 1-based line numbers (``records.jsonl line 7: unparsable, skipped
(unit s1-0002: 3 of 4 rows loaded)``). Lines after the last end marker are an unfinished unit (a
commit torn by a crash): not results, reported as one problem, and cut off to ``aborted/`` by the next
writer (:func:`end_of_last_unit` follows the same rule). A schema-1 directory loads with the problem
``schema 1 records (an older routerbench): read, never extended``. :func:`load_rows` warns each
problem once (:class:`RecordsWarning`, printed as ``routerbench: warning: …``) and can return them.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import warnings
from pathlib import Path
from typing import Any, Iterable, Iterator

from routers.errors import ConfigError

#: Version of the row and marker format written by this module.
SCHEMA_VERSION = 4
#: The oldest schema a writer extends (its case keys are this schema's).
EXTENDABLE_SCHEMA = 3


class NewerSchemaError(ConfigError):
    """A ``records.jsonl`` written by a newer routerbench (a row or marker of a schema above
    :data:`SCHEMA_VERSION`): its columns may mean what this version cannot know, so it is
    neither read nor extended; the message names the file, the line, both versions and the
    upgrade."""


def check_schema(path: Path, n: int, obj: dict[str, Any]) -> None:
    """Refuse a row or marker of a schema newer than this version reads.

    Raises:
        NewerSchemaError: ``obj["schema"]`` above :data:`SCHEMA_VERSION`.
    """
    got = obj.get("schema")
    if isinstance(got, int) and not isinstance(got, bool) and got > SCHEMA_VERSION:
        raise NewerSchemaError(f"{path} line {n}: records of schema {got}, newer than this routerbench reads "
                               f"(schema {SCHEMA_VERSION}): upgrade routerbench (git pull && make venv, or pip "
                               "install -U routerbench) to read or resume this run")


#: Column order of every row. ``router_options`` is a JSON string; shape columns are flat.
COLUMNS: tuple[str, ...] = (
    "schema", "run_id", "session", "resume_unit", "case_key", "router", "router_options", "impl", "backend",
    "compile_mode", "compile_scope", "mode", "workload", "d_model", "n_layers", "n_heads", "seq_len", "batch_size",
    "dtype", "device", "seed", "repeat", "pair", "attempt", "pairs_with", "n_pairs", "stop", "ci_conf", "metric", "value", "unit", "status",
    "error",
)
#: ``unit`` is the unit of measure (``ms``, ``bytes``); ``resume_unit`` names the unit of resume
#: whose end marker covers the row; ``attempt`` numbers the timings of a group re-measured because
#: it was noisy (1, 2, …; empty in rows written before re-measuring existed, meaning 1). On
#: ``step_time`` rows of a timing (schema 4): ``n_pairs`` is the pairs (rounds) of the attempt,
#: ``stop`` why its timing stopped (``fixed``, ``precise``, ``budget``, ``max_rounds``:
#: :data:`harness.stats.sequential.STOP_REASONS`), ``ci_conf`` the level of the stopping rule's
#: interval (empty for fixed rounds: the report's bootstrap at 95 %), and ``pairs_with`` the case key
#: a row of a re-timed case's partner (its prenorm, its eager twin) pairs with; empty otherwise.

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
    """Who holds the lock of ``run_dir`` now (pid, host, started), or None. A ``--lock-free`` holder
    counts while its pid lives on this host; on another host it is ``unverified: True``."""
    path = Path(run_dir) / LOCK_FILE
    if not path.exists():
        return None
    held = False
    with open(path, encoding="utf-8") as fh:
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)
        except BlockingIOError:
            held = True
        except OSError:  # a file system without flock: only a lock-free holder can be read
            pass
        text = fh.read()
    h = {}
    with contextlib.suppress(ValueError):  # a holder cut short reads as none
        h = json.loads(text or "{}")
    if held or not h.get("lock_free"):
        return (h or {"pid": None}) if held else None
    if h.get("host") != socket.gethostname():
        return {**h, "unverified": True}
    try:
        os.kill(int(h.get("pid")), 0)
    except (ProcessLookupError, TypeError, ValueError):
        return None
    except PermissionError:  # alive, another user's
        return h
    return h


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


class RecordsWarning(UserWarning):
    """A problem met reading ``records.jsonl`` (see "Reading" in the module docstring); the message
    names the file and the line numbers."""


def _format_warning(message, category, filename, lineno, line=None):
    if issubclass(category, RecordsWarning):  # a finding about the user's data, not about our code
        return f"routerbench: warning: {message}\n"
    return _plain_format_warning(message, category, filename, lineno, line)


_plain_format_warning, warnings.formatwarning = warnings.formatwarning, _format_warning


def _lines(path: Path) -> Iterator[tuple[int, int, dict[str, Any] | None]]:
    """``(1-based line number, byte offset just after the line, object)`` of every non-blank line;
    the object is None where the line is not a JSON object (torn, garbled, a bare value)."""
    with open(path, "rb") as fh:
        pos = 0
        for n, raw in enumerate(fh, 1):
            pos += len(raw)
            if not raw.strip():
                continue
            try:
                obj = json.loads(raw.decode("utf-8", errors="replace"))
            except (json.JSONDecodeError, RecursionError):
                obj = None
            yield n, pos, obj if isinstance(obj, dict) else None


def _line_list(numbers: list[int]) -> str:
    if len(numbers) == 1:
        return f"line {numbers[0]}"
    shown = ", ".join(map(str, numbers[:6]))
    return f"lines {shown}" + (f", … ({len(numbers)} lines)" if len(numbers) > 6 else "")


def _unit_problems(path: Path, at: int, marker: dict[str, Any], rows: list[tuple[int, dict[str, Any]]],
                   bad: list[int]) -> list[str]:
    """What is wrong with one unit (its end marker on line ``at``), each as one line."""
    uid, want, got = marker[END], marker.get("rows"), len(rows)
    out = []
    if bad:
        out.append(f"{path} {_line_list(bad)}: unparsable, skipped (unit {uid}: {got} of {want} rows loaded)")
    elif got != want:
        out.append(f"{path} line {at}: the end marker of unit {uid} counts {want} rows but {got} precede "
                   f"it; the {got} loaded")
    foreign = [(n, r.get("resume_unit")) for n, r in rows if r.get("resume_unit") != uid]
    if foreign:
        names = ", ".join(sorted({str(u) for _, u in foreign}))
        out.append(f"{path} {_line_list([n for n, _ in foreign])}: rows of resume_unit {names} before the "
                   f"end marker of unit {uid} (line {at}); loaded with that unit")
    return out


def scan_records(path: Path) -> tuple[list[tuple[dict[str, Any], list[dict[str, Any]]]], list[str]]:
    """The units of a ``records.jsonl`` and the problems met reading it.

    Returns:
        ``(units, problems)``: ``units`` is ``[(end marker, rows), …]`` in file order, every unit
        ended by an end marker whatever its problems (see "Reading" in the module docstring);
        ``problems`` are one-line messages naming the file and the 1-based line numbers. A schema-1
        file has no units: ``([], [its schema-1 notice and unparsable lines])``; a missing file
        gives ``([], [])``.
    """
    path = Path(path)
    units_: list[tuple[dict[str, Any], list[dict[str, Any]]]] = []
    problems: list[str] = []
    if not path.exists():
        return units_, problems
    if not is_schema2(path):
        problems.append(f"{path}: schema 1 records (an older routerbench): read, never extended")
        bad = [n for n, _, obj in _lines(path) if obj is None]
        if bad:
            problems.append(f"{path} {_line_list(bad)}: unparsable, skipped")
        return units_, problems
    rows: list[tuple[int, dict[str, Any]]] = []
    bad: list[int] = []
    last = 0
    for n, _, obj in _lines(path):
        last = n
        if obj is not None:
            check_schema(path, n, obj)
        if obj is None:
            bad.append(n)
        elif END not in obj:
            rows.append((n, obj))
        else:
            problems.extend(_unit_problems(path, n, obj, rows, bad))
            units_.append((obj, [r for _, r in rows]))
            rows, bad = [], []
    if rows or bad:
        first = min([n for n, _ in rows] + bad)
        where = f"line {first}" if first == last else f"lines {first}–{last}"
        what = f"{len(rows)} row{'s' * (len(rows) != 1)}" + (f", {len(bad)} unparsable" if bad else "")
        problems.append(f"{path} {where} {'after the last end marker' if units_ else 'with no end marker'}: "
                        f"an unfinished unit ({what}), not read as results; the next writer moves them "
                        f"to {ABORTED_DIR}/")
    return units_, problems


def iter_units(path: Path) -> Iterator[tuple[dict[str, Any], list[dict[str, Any]]]]:
    """``(end marker, rows)`` of every unit of a schema-2 ``records.jsonl`` (those of
    :func:`scan_records`, its problems left out)."""
    yield from scan_records(path)[0]


def end_of_last_unit(path: Path) -> int:
    """Byte offset just after the last end marker of ``path`` (0 when none): what the writer keeps
    on open. Any end marker ends a unit, as in :func:`scan_records`, so the writer cuts exactly the
    lines the reader does not read as results."""
    end = 0
    for _, pos, obj in _lines(path):
        if obj is not None and END in obj:
            end = pos
    if end == 0 and not is_schema2(path):
        return Path(path).stat().st_size  # a schema-1 file has no markers: keep it whole
    return end


def is_schema2(path: Path) -> bool:
    """Whether the first JSON object of ``path`` is of schema 2 or later (units and end markers;
    an empty file is)."""
    for _, _, obj in _lines(path):
        if obj is not None:
            return "schema" in obj or END in obj
    return True


def schema_of(path: Path) -> int:
    """The schema of the first JSON object of ``path`` (1 without a ``schema`` field or marker;
    this version's for an empty or missing file).

    Raises:
        NewerSchemaError: that object is of a schema newer than this version reads.
    """
    for n, _, obj in _lines(path) if Path(path).exists() else ():
        if obj is not None:
            check_schema(path, n, obj)
            return int(obj.get("schema") or (2 if END in obj else 1))
    return SCHEMA_VERSION


def upgraded(row: dict[str, Any]) -> dict[str, Any]:
    """A row of an older schema with this schema's columns: ``compile_scope`` is ``model`` for a
    compiled row of schema 2 or 1 (the only scope then), empty otherwise; the timing columns of
    schema 4 empty."""
    if "compile_scope" not in row:
        row["compile_scope"] = "model" if row.get("backend") == "compile" else None
    for c in ("pairs_with", "n_pairs", "stop", "ci_conf"):  # schema < 4
        row.setdefault(c, None)
    return row


def completed_cases(run_dir: Path) -> dict[str, str]:
    """``case_key -> final status`` of every case whose unit is complete (ended by its marker) in
    ``run_dir``; a unit with a problem counts, so a resume never measures its cases twice."""
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


def load_rows(run_dirs: Iterable[Path], finished_only: bool = True,
              problems: list[str] | None = None) -> list[dict[str, Any]]:
    """The rows of the complete units of the given run directories.

    Schema 2: the rows of every unit ended by its marker (``finished_only`` is moot; unfinished
    units are in ``aborted/``). Schema 1 (``done.jsonl``, read for old results): with
    ``finished_only`` a case's rows come only from the session that finished it.

    Every problem met (:func:`scan_records`) is warned once as a :class:`RecordsWarning` and, when
    ``problems`` is a list, appended to it.
    """
    out: list[dict[str, Any]] = []
    found: list[str] = []
    for d in run_dirs:
        path = Path(d) / RECORDS_FILE
        units_, probs = scan_records(path)
        found.extend(probs)
        if path.exists() and not is_schema2(path):
            out.extend(upgraded(r) for r in _legacy_rows(Path(d), finished_only))
            continue
        for _, rows in units_:
            out.extend(upgraded(r) for r in rows)
    found = list(dict.fromkeys(found))  # a directory given twice: its problems once
    for p in found:
        warnings.warn(p, RecordsWarning, stacklevel=2)
    if problems is not None:
        problems.extend(found)
    return out


def _legacy_rows(run_dir: Path, finished_only: bool) -> list[dict[str, Any]]:
    rows = read_jsonl(run_dir / RECORDS_FILE)
    for r in rows:
        r["schema"], r["resume_unit"] = 1, None
    if finished_only:
        done = {r["case_key"]: r["session"] for r in read_jsonl(run_dir / LEGACY_DONE_FILE)}
        rows = [r for r in rows if r.get("case_key") not in done or done[r["case_key"]] == r.get("session")]
    return rows
