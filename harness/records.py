"""Tidy results: one row per measured number, appended to ``records.jsonl`` as it is measured.

A run directory ``results/<device-slug>/<run-id>/`` holds

- ``records.jsonl``: long-format rows with the columns of :data:`COLUMNS` (DESIGN.md, "Results");
- ``manifest.json``: the environment and command line of the run (:mod:`harness.env`);
- ``done.jsonl``: one line per finished case (``case_key``, ``session``), so an interrupted sweep
  resumes without redoing finished cases; rows of an unfinished attempt stay in ``records.jsonl``
  (nothing measured is lost) and are told apart by their ``session`` column.

Rows are flushed and ``fsync``-ed one by one, so a crash loses at most the row being written.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

#: Column order of every row. ``router_options`` is a JSON string; shape columns are flat.
COLUMNS: tuple[str, ...] = (
    "run_id", "session", "case_key", "router", "router_options", "impl", "backend", "compile_mode",
    "mode", "workload", "d_model", "n_layers", "n_heads", "seq_len", "batch_size", "dtype", "device",
    "seed", "repeat", "pair", "metric", "value", "unit", "status", "error",
)

#: Allowed values of the ``status`` column.
STATUSES = ("ok", "oom", "error", "skipped", "not_converged", "diverged")

RECORDS_FILE = "records.jsonl"
MANIFEST_FILE = "manifest.json"
DONE_FILE = "done.jsonl"


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "item"):
        return obj.item()
    return str(obj)


@dataclass
class RecordWriter:
    """Appends tidy rows to ``<run_dir>/records.jsonl``.

    Args:
        run_dir: the run directory; created if missing.
        run_id: written into every row.
        session: id of this invocation (a resumed run gets a new session).
        base: column values shared by every row of this writer (e.g. ``device``).

    Raises:
        ValueError: from :meth:`write` when a row has an unknown column or status.
    """

    run_dir: Path
    run_id: str
    session: str
    base: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.run_dir = Path(self.run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / RECORDS_FILE

    def write(self, **row: Any) -> dict[str, Any]:
        """Append one row (missing columns become ``None``) and return it."""
        full = {c: None for c in COLUMNS}
        full.update(self.base)
        full.update(run_id=self.run_id, session=self.session, status="ok")
        unknown = set(row) - set(COLUMNS)
        if unknown:
            raise ValueError(f"unknown record column(s) {sorted(unknown)}; known: {COLUMNS}")
        full.update(row)
        if full["status"] not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, got {full['status']!r}")
        if isinstance(full.get("router_options"), dict):
            full["router_options"] = json.dumps(full["router_options"], sort_keys=True)
        line = json.dumps(full, default=_json_default)
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(line + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        return full

    def mark_done(self, case_key: str) -> None:
        """Record that every row of ``case_key`` in this session has been written."""
        with open(self.run_dir / DONE_FILE, "a", encoding="utf-8") as fh:
            fh.write(json.dumps({"case_key": case_key, "session": self.session}) + "\n")
            fh.flush()
            os.fsync(fh.fileno())


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Read a JSON-lines file, ignoring a torn last line left by a crash."""
    rows = []
    if not Path(path).exists():
        return rows
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            line = line.strip()
            if not line:
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a row torn by an interruption; everything before it is kept
    return rows


def done_cases(run_dir: Path) -> dict[str, str]:
    """Map ``case_key -> session`` of the cases finished in ``run_dir``."""
    return {r["case_key"]: r["session"] for r in read_jsonl(Path(run_dir) / DONE_FILE)}


def load_rows(run_dirs: Iterable[Path], finished_only: bool = True) -> list[dict[str, Any]]:
    """All rows of the given run directories.

    With ``finished_only`` a case's rows are kept only from the session that finished it, so a
    resumed run does not count an interrupted attempt twice; rows of cases no session finished
    (e.g. a training race cut short) are kept as they are.
    """
    out: list[dict[str, Any]] = []
    for d in run_dirs:
        rows = read_jsonl(Path(d) / RECORDS_FILE)
        if finished_only:
            done = done_cases(Path(d))
            rows = [r for r in rows if r.get("case_key") not in done
                    or done[r["case_key"]] == r.get("session")]
        out.extend(rows)
    return out
