"""The documented way to read routerbench results into pandas (docs/SWEEPS.md, "Loading results").

:func:`load` reads run directories, folders holding them, and pytest-benchmark JSON files into the
tidy case frame; :func:`run_rows` and :func:`damaged` give what it keeps apart (the rows of a run as
a whole, the lines it could not read); :func:`export_frame` joins the three into one table with a
``row_kind`` column, which :func:`write_export` writes as Parquet or CSV (``routerbench export``),
since ``DataFrame.attrs`` do not survive a file.

Why not ``pandas.read_json("records.jsonl", lines=True)``: a record file holds the end-of-unit
markers of its units of resume (rows with no metric; the bandwidth unit's has ``"status": "ok"``),
every timing attempt of a re-timed group (a busy attempt beside a quiet one), and after a crash a
torn last line, which makes ``read_json`` and DuckDB's ``read_json_auto`` fail.
"""

from __future__ import annotations

import importlib.util
import os
import re
import tempfile
from pathlib import Path
from typing import Any, Iterable

import pandas as pd

from harness.rundir.records import COLUMNS, RECORDS_FILE
from routers.errors import ConfigError

from .frame import _NUMERIC, load_frame

__all__ = ["load", "run_rows", "damaged", "find_runs", "export_frame", "write_export", "check_export",
           "ATTEMPTS", "ROW_KINDS", "EXPORT_FORMATS", "DAMAGE_COLUMNS"]

#: Values of ``load(attempts=…)``.
ATTEMPTS = ("last", "all")
#: Values of the ``row_kind`` column of an export: a case row of :func:`load`, a run-level row of
#: :func:`run_rows`, a problem of :func:`damaged`.
ROW_KINDS = ("case", "run", "damaged")
#: Formats of ``routerbench export --format`` and the file suffixes that imply them.
EXPORT_FORMATS = {"parquet": (".parquet", ".pq"), "csv": (".csv",)}
#: Columns of :func:`damaged` (and of the ``damaged`` rows of an export).
DAMAGE_COLUMNS = ("file", "line", "last_line", "reason")

#: Numeric columns of an export (the others are text): integers where every value is whole.
_NUMBERS = (*_NUMERIC, "value", "attempts", "line", "last_line")

_WHERE = ("RESULTS: {d} {what}; give run directories (results/<device>/<run-id>), folders that hold "
          "them, or a pytest-benchmark JSON (*.json)")


def find_runs(results: Iterable[Path | str], bench_root: Path | str | None = None) -> list[Path]:
    """The run directories named by ``results``, in order, each once: a run directory (it holds
    ``records.jsonl``) itself, a folder every run directory below it (recursively, sorted), and
    a pytest-benchmark JSON (``*.json``) the run directory it converts to
    (:func:`reports.benchjson.to_run_dir`): ``bench_root/<name>`` when given, else beside the
    file (``bench.json`` -> ``bench/``).

    Raises:
        ConfigError: a path that does not exist, is neither a folder nor a JSON, or holds no run
            directory; a malformed benchmark JSON (each one line, naming ``RESULTS``).
    """
    from .benchjson import default_out, is_bench_json, to_run_dir
    out: list[Path] = []
    results = list(results)
    for r in results:
        d = Path(r)
        if is_bench_json(d):
            target = default_out(d) if bench_root is None else Path(bench_root) / d.stem
            for n in range(1, len(results) + 1):
                if bench_root is None or not target.exists():
                    break
                target = Path(bench_root) / f"{d.stem}-{n}"  # two JSONs of one name
            found = [to_run_dir(d, target)]
        elif not d.exists():
            raise ConfigError(_WHERE.format(d=d, what="does not exist"))
        elif not d.is_dir():
            raise ConfigError(_WHERE.format(d=d, what="is not a directory"))
        else:
            found = [d] if (d / RECORDS_FILE).is_file() else sorted(p.parent for p in d.rglob(RECORDS_FILE))
        if not found:
            raise ConfigError(f"RESULTS: no {RECORDS_FILE} in or below {d}: no unit of that run was "
                              "finished yet (routerbench status RUN_DIR)")
        out += [p for p in found if p not in out]
    return out


def _flat(results: tuple) -> list[Path | str]:
    out: list[Path | str] = []
    for r in results:
        out.extend([r] if isinstance(r, (str, os.PathLike)) else _flat(tuple(r)))
    return out


def load(*results: Path | str | Iterable[Path | str], attempts: str = "last",
         partners: bool = False) -> pd.DataFrame:
    """Routerbench results as the tidy case frame: one row per measured number of a case.

    ``reports.load("results/nvidia-h200")``, ``reports.load(run_a, run_b)`` or
    ``reports.load("bench.json")``; lists of these are flattened.

    Args:
        results: run directories (``results/<device-slug>/<run-id>/``), folders holding run
            directories (searched recursively, e.g. ``results/`` or ``results/<device-slug>/``), and
            pytest-benchmark JSON files of ``tests/benchmarks`` (``--benchmark-json``), converted
            into a temporary run directory that is removed before this returns.
        attempts: ``"last"`` (default): of each case only its last own timing attempt (a noisy
            group is timed again; see MEASUREMENT.md); rows without an attempt (FLOPs,
            parameters, memory, training rows) are all kept. ``"all"``: every row, those that are not
            of their case's last own timing marked ``superseded`` (``df[~df.superseded]`` is the
            default frame).
        partners: with ``attempts="last"``, also keep the ``step_time`` rows of a case that are
            not its own last timing but pair with another case's last timing (``partner_only``
            True): a prenorm's rows of the attempt that re-timed a router (``pairs_with`` naming
            it), and a re-timed router's rows of its earlier attempt that the prenorm's last timing
            used. What paired ratios need; left out by default, so a median over a case's rows
            is over its own last timing only.

    Returns:
        A DataFrame with no end-of-unit markers and no run-level rows, whose columns are

        - the record columns (``harness.rundir.records.COLUMNS``): ``run_id``, ``session``,
          ``resume_unit`` and ``case_key`` (which run, invocation, unit of resume and case);
          ``router``, ``router_options`` (JSON), ``impl``, ``backend``, ``compile_mode``,
          ``compile_scope``, ``mode`` (``fwd``, ``fwd_bwd``, ``train``, ``pilot``, …),
          ``workload``, the shape ``d_model``, ``n_layers``, ``n_heads``, ``seq_len``,
          ``batch_size``, ``dtype``, and ``device``; ``seed``, ``repeat`` (round, or evaluation
          step of a training run), ``pair``, ``attempt``; the timing columns ``pairs_with``,
          ``n_pairs``, ``stop``, ``ci_conf``; ``metric``, ``value`` (float, NaN when not
          measured), ``unit`` (its unit of measure: ``ms``, ``s``, ``bytes``, ``flops``,
          ``nats``, ``MHz``, …, as written, never converted), ``status`` (``ok``, ``oom``,
          ``error``, ``skipped``, ``not_converged``, ``diverged``) and ``error`` (why, when not
          ok). Numeric columns are int64 where no value is missing, else float; text columns
          have ``""`` for missing;
        - ``options`` (``router_options`` as ``"k=v, ..."``), ``variant`` (the legend label),
          ``attempts`` (the case's own timing attempts), ``partner_only``, and with
          ``attempts="all"`` ``superseded``.

        A training run is a case too: its evaluation rows (``repeat`` = step) and the rows of
        the run as a whole (``train_time``, ``time_to_target``, …, ``repeat`` empty) are case rows.
        ``df.attrs`` holds ``run_rows`` (see :func:`run_rows`), ``damaged`` (see :func:`damaged`)
        and ``record_problems`` (the same problems, one line each).

    Damaged lines never raise: an unparsable line, a torn tail after the last end marker (an
    unfinished unit, not results) or a unit whose rows do not match its marker is reported in
    :func:`damaged` and warned once as a ``harness.rundir.records.RecordsWarning``; every
    readable row of a finished unit is loaded.

    Raises:
        ConfigError: no result given; a path that does not exist or holds no run directory; a
            malformed benchmark JSON (one line each).
        ValueError: ``attempts`` not in :data:`ATTEMPTS`.
    """
    if attempts not in ATTEMPTS:
        raise ValueError(f"attempts must be one of {ATTEMPTS}, got {attempts!r}")
    paths = _flat(results)
    if not paths:
        raise ConfigError("RESULTS: none given; pass run directories, folders of them or a "
                          "pytest-benchmark JSON")
    with tempfile.TemporaryDirectory(prefix="routerbench-load-") as tmp:
        dirs = find_runs(paths, bench_root=tmp)
        df = load_frame(dirs, attempts=attempts)
    if attempts == "last" and not partners:
        df = df[~df["partner_only"]].reset_index(drop=True)
    df.attrs["damaged"] = [_damage(p, dirs) for p in df.attrs["record_problems"]]
    return df


def _damage(problem: str, dirs: list[Path]) -> dict[str, Any]:
    """One problem line of ``load_rows`` as ``{file, line, last_line, reason}``."""
    files = sorted((str(Path(d) / RECORDS_FILE) for d in dirs), key=len, reverse=True)
    file = next((f for f in files if problem.startswith(f)), "")
    rest = problem[len(file):] if file else problem
    m = re.match(r"\s*lines? ([0-9][0-9, –…]*)(?:\(\d+ lines\))?:?\s*(.*)$", rest)
    if not m:
        return {"file": file, "line": None, "last_line": None, "reason": rest.lstrip(" :")}
    nums = [int(n) for n in re.findall(r"\d+", m.group(1))]
    return {"file": file, "line": min(nums), "last_line": max(nums), "reason": m.group(2)}


def run_rows(df: pd.DataFrame) -> pd.DataFrame:
    """The run-level rows kept apart by :func:`load` (``df.attrs["run_rows"]``): rows of a run as
    a whole, not of a case, i.e. its memory bandwidth unit (:data:`reports.frame.RUN_METRICS`:
    ``mem_bandwidth`` in GB/s per repeat, ``mem_bandwidth_nominal`` on a known GPU; case key
    ``bandwidth|<device>``, no router or shape). Record columns, ``value`` numeric; empty when
    none."""
    rows = pd.DataFrame(df.attrs.get("run_rows") or [], columns=list(COLUMNS))
    rows["value"] = pd.to_numeric(rows["value"], errors="coerce").astype(float)
    return rows.reset_index(drop=True)


def damaged(df: pd.DataFrame) -> pd.DataFrame:
    """The damaged lines met by :func:`load` (``df.attrs["damaged"]``), one row per problem:
    ``file`` (the ``records.jsonl``), ``line`` and ``last_line`` (1-based; the first and last line
    it names, empty for a problem of the whole file such as schema-1 records) and ``reason``
    (e.g. ``after the last end marker: an unfinished unit (1 row, 1 unparsable), not read as
    results; …``). Empty when the records were whole."""
    out = pd.DataFrame(df.attrs.get("damaged") or [], columns=list(DAMAGE_COLUMNS))
    for c in ("line", "last_line"):
        out[c] = pd.to_numeric(out[c], errors="coerce").astype("Int64")
    return out


def export_frame(df: pd.DataFrame) -> pd.DataFrame:
    """A frame of :func:`load` as one table for a file: ``row_kind`` first (:data:`ROW_KINDS`),
    then its case rows (``case``), its :func:`run_rows` (``run``) and its :func:`damaged` rows
    (``damaged``, with the :data:`DAMAGE_COLUMNS`; empty on the other rows). Columns a kind
    lacks are null; integer columns are nullable integers, flags nullable booleans."""
    parts = [df.assign(row_kind="case"), run_rows(df).assign(row_kind="run"),
             damaged(df).assign(row_kind="damaged")]
    parts = [p for p in parts if len(p)] or parts[:1]
    cols = ["row_kind", *dict.fromkeys([c for p in parts for c in p.columns if c != "row_kind"])]
    out = pd.concat([p.reindex(columns=cols) for p in parts], ignore_index=True)
    for c in ("row_kind", *DAMAGE_COLUMNS):
        if c not in out:
            out[c] = pd.Series(dtype=object)
    for c in out.columns:
        if c in ("partner_only", "superseded"):
            out[c] = out[c].astype("boolean")
        elif c in _NUMBERS:
            num = pd.to_numeric(out[c], errors="coerce").astype(float)
            whole = c not in ("value", "ci_conf") and bool((num.dropna() == num.dropna().round()).all())
            out[c] = num.astype("Int64") if whole else num
        else:
            out[c] = out[c].astype(object).where(out[c].notna(), None).map(
                lambda v: v if v is None else str(v))
    out.attrs = {}
    return out


def check_export(fmt: str | None, out: Path | str) -> str:
    """The format of an export to ``out`` (``fmt``, else from the suffix of ``out``), checked before
    any result is read.

    Raises:
        ConfigError: no format and an unknown suffix; an unknown format, or one another than the
            suffix of ``out`` implies; ``out`` an existing
            folder; Parquet without pyarrow (naming ``pip install pyarrow``).
    """
    out = Path(out)
    if out.is_dir():
        raise ConfigError(f"--out {out}: is a directory; give a file name (e.g. {out / ('results.' + (fmt or 'parquet'))})")
    if fmt is None:
        fmt = next((f for f, sfx in EXPORT_FORMATS.items() if out.suffix.lower() in sfx), None)
        if fmt is None:
            raise ConfigError(f"--out {out}: give --format parquet or csv (or an --out ending in "
                              ".parquet or .csv)")
    if fmt not in EXPORT_FORMATS:
        raise ConfigError(f"--format {fmt}: unknown; give one of {', '.join(EXPORT_FORMATS)}")
    implied = next((f for f, sfx in EXPORT_FORMATS.items() if out.suffix.lower() in sfx), None)
    if implied is not None and implied != fmt:
        raise ConfigError(f"--format {fmt} contradicts --out {out} (a .{implied} name); give one of them")
    if fmt == "parquet" and importlib.util.find_spec("pyarrow") is None:
        raise ConfigError("--format parquet needs pyarrow: pip install pyarrow (or pip install -e '.[test]'), "
                          "or use --format csv")
    return fmt


def write_export(df: pd.DataFrame, out: Path | str, fmt: str) -> Path:
    """Write :func:`export_frame` of ``df`` to ``out`` as ``fmt`` (``parquet`` or ``csv``, no
    index), through a temporary file beside it so a failed write leaves no partial file.

    Returns:
        ``out``.

    Raises:
        ConfigError: as :func:`check_export`, or ``out`` that cannot be written (naming ``--out``).
    """
    fmt, out = check_export(fmt, out), Path(out)
    table = export_frame(df)
    tmp = out.with_name(f".{out.name}.tmp")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        if fmt == "parquet":
            table.to_parquet(tmp, index=False)
        else:
            table.to_csv(tmp, index=False)
        os.replace(tmp, out)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise ConfigError(f"--out {out}: cannot write it ({exc.strerror or exc}); give a writable "
                          "file") from None
    return out

