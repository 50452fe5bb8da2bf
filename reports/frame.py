"""The long frame every table, figure and verdict reads: the rows of one or more run directories
(:mod:`harness.rundir.records`) as a pandas DataFrame, one row per measured number, with the case
columns of DESIGN.md ("Results") and a ``variant`` label; plus what selects from it (the last
timing of each case, the ``ok`` rows of a metric, the cost-sweep rows), the manifests beside it,
and a readable label of a case.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import pandas as pd

from harness.rundir.plugins import load_for as load_plugins
from harness.rundir.records import COLUMNS, RECORDS_FILE, load_rows
from routers import BASELINE

TRAIN_MODE = "train"


#: Modes of the training race: measured runs and the pilot run that sets the target loss.
TRAIN_MODES = (TRAIN_MODE, "pilot")


MIB = 2**20


SHAPE_COLS = ("d_model", "n_layers", "n_heads", "seq_len", "batch_size", "dtype")


#: One cost case: what was routed, how it ran, on which shape, in which run (repeats of two runs,
#: maybe on two machines, are never pooled). ``variant`` labels (router, impl, options) for
#: legends; it adds no grouping of its own.
CASE_KEYS = ("run_id", "router", "options", "impl", "backend", "compile_mode", "compile_scope", "mode", "workload",
             *SHAPE_COLS, "device", "variant")


#: A router's baseline: the prenorm case of the same run, setting and shape (any impl).
BASE_KEYS = ("run_id", "backend", "compile_mode", "compile_scope", "mode", "workload", *SHAPE_COLS, "device")


#: Counts that do not depend on how the model ran (FLOPs, parameters).
STATIC_KEYS = ("router", "options", "impl", "workload", *SHAPE_COLS, "variant")


TRAIN_KEYS = ("run_id", "router", "options", "variant", "seed")


_NUMERIC = ("schema", "d_model", "n_layers", "n_heads", "seq_len", "batch_size", "seed", "repeat", "pair", "attempt",
            "n_pairs", "ci_conf")


_TEXT = tuple(c for c in COLUMNS if c not in _NUMERIC + ("value",))


#: Factor from a time ``unit`` to milliseconds.
TO_MS = {"ms": 1.0, "s": 1e3, "us": 1e-3, "ns": 1e-6}


#: Metrics of a run as a whole, not of a case (:mod:`harness.costs.bandwidth`): no router, no shape.
RUN_METRICS = ("mem_bandwidth", "mem_bandwidth_nominal")


def run_dir_paths(run_dirs: Iterable[Path | str]) -> list[Path]:
    """The run directories as paths, each checked to hold ``records.jsonl``.

    Raises:
        ValueError: when no run directory is given.
        FileNotFoundError: naming the first directory without ``records.jsonl``.
    """
    paths = [Path(p) for p in run_dirs]
    if not paths:
        raise ValueError("no run directory given: pass at least one results/<device>/<run-id>/")
    for p in paths:
        if not (p / RECORDS_FILE).is_file():
            raise FileNotFoundError(
                f"no {RECORDS_FILE} in {p}: pass a run directory written by `routerbench run` "
                f"or `routerbench train` (results/<device-slug>/<run-id>/)")
    return paths


def _options_label(raw: Any) -> str:
    if raw is None or (isinstance(raw, float) and np.isnan(raw)) or raw == "":
        return ""
    opts = json.loads(raw) if isinstance(raw, str) else raw
    if not isinstance(opts, dict):
        return str(opts)
    return ", ".join(f"{k}={v}" for k, v in sorted(opts.items()))


def options_without_impl(options: str) -> str:
    """An ``options`` label (``"impl=two_phase, n_blocks=4"``) less its ``impl=`` entry, which
    the ``impl`` column already names."""
    return ", ".join(p for p in str(options or "").split(", ") if p and not p.startswith("impl="))


def _variant(router: str, impl: str, options: str, several_impls: bool) -> str:
    """``haares [two_phase] (n_blocks=4)``: the impl in brackets where the router has several
    in the frame or its options name one, then the other options; each named once."""
    shown = several_impls or "impl=" in str(options)
    rest = options_without_impl(options)
    return router + (f" [{impl}]" if shown and impl else "") + (f" ({rest})" if rest else "")


def load_frame(run_dirs: Iterable[Path | str], finished_only: bool = True,
               attempts: str = "last") -> pd.DataFrame:
    """Rows of the run directories as one DataFrame (``harness.rundir.records.load_rows``); the
    documented loading API built on it is :func:`reports.loading.load`.

    Args:
        run_dirs: run directories, each holding ``records.jsonl``.
        finished_only: passed to ``load_rows``: rows of a case come only from the session that
            finished it, so an interrupted attempt is not counted twice.
        attempts: ``"last"``: the rows :func:`last_attempt` keeps; ``"all"``: every row, those not
            of their case's last own timing marked ``superseded``.

    Returns:
        The columns of ``harness.rundir.records.COLUMNS``; ``value``, shape columns, seed, repeat and pair
        numeric (int64 where no value is missing); text columns with nulls as ``""``. Added:
        ``options`` (``router_options`` as ``"k=v, ..."``) and ``variant`` (the router, its impl
        when the router has several or its options name one, and its other options, each once:
        the legend label of figures, ``haares [two_phase] (n_blocks=4)``).
        ``df.attrs["run_rows"]``: the rows (dicts) of :data:`RUN_METRICS` (the run's memory
        bandwidth), kept out of the frame since they describe no case. ``df.attrs["record_problems"]``: the problems met reading the records (unparsable lines,
        units that do not match their end marker, an unfinished tail, schema-1 records), one line
        each naming the file and line numbers, for a report to show; ``[]`` when none. Each is
        also warned once as a :class:`harness.rundir.records.RecordsWarning`.
        ``df.attrs["plugin_notes"]``: the plugins the runs recorded are loaded first
        (:func:`harness.rundir.plugins.load_for`); one sentence per plugin that could not be
        (or changed since), for a report to show; ``[]`` when none.

    Raises:
        FileNotFoundError: when a run directory has no ``records.jsonl``.
        ValueError: ``attempts`` neither ``"last"`` nor ``"all"``.
    """
    if attempts not in ("last", "all"):
        raise ValueError(f"attempts must be 'last' or 'all', got {attempts!r}")
    problems: list[str] = []
    paths = run_dir_paths(run_dirs)
    notes = load_plugins(paths)  # the plugins the runs recorded: their routers' classes, here too
    df = pd.DataFrame(load_rows(paths, finished_only=finished_only, problems=problems), columns=list(COLUMNS))
    run_level = df["metric"].isin(RUN_METRICS)
    run_rows = df[run_level].assign(value=lambda r: pd.to_numeric(r["value"], errors="coerce"))
    df = df[~run_level].reset_index(drop=True)
    for c in _NUMERIC + ("value",):
        df[c] = pd.to_numeric(df[c], errors="coerce").astype(float)
        if c != "value" and len(df) and df[c].notna().all():
            df[c] = df[c].astype("int64")
    for c in _TEXT:
        df[c] = df[c].astype(object).where(df[c].notna(), "").astype(str)
    df = last_attempt(df, keep_all=attempts == "all")
    df["options"] = pd.Series([_options_label(r) for r in df["router_options"]], index=df.index,
                              dtype=str)
    impls = df.groupby("router")["impl"].nunique() if len(df) else pd.Series(dtype=int)
    df["variant"] = pd.Series([_variant(r, i, o, impls.get(r, 1) > 1)
                               for r, i, o in zip(df["router"], df["impl"], df["options"])],
                              index=df.index, dtype=str)
    df.attrs["record_problems"] = problems
    df.attrs["plugin_notes"] = notes
    df.attrs["run_rows"] = run_rows.to_dict("records")  # plain rows: pandas compares attrs
    return df


def last_attempt(df: pd.DataFrame, keep_all: bool = False) -> pd.DataFrame:
    """Keep, of each case, the rows of its last own timing, and the rows that timing pairs with.

    A group's timings are numbered by ``attempt`` (1, 2, …; a noisy case is timed again with its
    partners, ``harness.sweep.timed.time_group``). A case's *own* rows have no ``pairs_with``;
    of them only its last attempt is kept (rows without an attempt number, such as FLOPs, memory
    and rows of older runs, are all kept). A ``step_time`` row that is not its case's last own
    timing (a partner's rows in a re-time, or a case's own rows of a timing another case still
    uses) is kept as ``partner_only`` when its timing is the last own timing of some case of the
    same session and unit: it pairs, but never counts as its own case's result
    (:func:`ok_rows` leaves it out unless asked). Cases are told apart by run, case key and
    session, so two runs read together keep each its own attempts. Adds ``attempts`` (the case's
    own timings) and ``partner_only``; with ``keep_all`` every row stays and ``superseded`` marks
    those that are not their case's last own timing (earlier attempts, and partner rows)."""
    att = pd.to_numeric(df["attempt"], errors="coerce")
    own = df["pairs_with"].astype(str).isin(["", "None", "nan"]) if "pairs_with" in df else pd.Series(True, index=df.index)
    run = df["run_id"].astype(str) if "run_id" in df else pd.Series("", index=df.index)
    who = [run, df["case_key"], df["session"]]
    last = att.where(own).groupby(who).transform("max")
    keep_own = att.isna() | (own & (att == last))
    unit = run + "\x1f" + df["session"].astype(str) + "\x1f" + df["resume_unit"].astype(str)
    live = set(zip(unit[keep_own & att.notna()], att[keep_own & att.notna()]))
    partner = (~keep_own & (df["metric"] == "step_time")
               & pd.Series([(u, a) in live for u, a in zip(unit, att)], index=df.index, dtype=bool))
    n_own = att.where(own).groupby(who).transform("nunique")
    keep = keep_own | partner
    if keep_all:
        keep = pd.Series(True, index=df.index)
    out = df[keep].copy()
    out["attempts"] = n_own[keep].where(n_own[keep] > 0, 1).fillna(1).astype("int64")
    out["partner_only"] = partner[keep].astype(bool)
    if keep_all:
        out["superseded"] = ~keep_own
    out.attrs = dict(df.attrs)
    return out


def ok_rows(df: pd.DataFrame, metric: str, partners: bool = False) -> pd.DataFrame:
    """Rows of ``metric`` with status ``ok`` and a value; a partner's rows of another case's
    timing (``partner_only``, :func:`last_attempt`) only with ``partners``."""
    sel = (df["metric"] == metric) & (df["status"] == "ok") & df["value"].notna()
    if not partners and "partner_only" in df:
        sel &= ~df["partner_only"].astype(bool)
    return df[sel]


def cost_rows(df: pd.DataFrame) -> pd.DataFrame:
    """Rows of the cost sweep (every mode except ``train`` and ``pilot``)."""
    return df[~df["mode"].isin(TRAIN_MODES)]


def load_manifests(run_dirs: Iterable[Path | str]) -> dict[str, dict]:
    """The readable ``manifest.json`` of each run directory, keyed by its ``run_id`` (else the
    directory name); runs without one are left out."""
    from harness.rundir.records import MANIFEST_FILE

    out: dict[str, dict] = {}
    for d in map(Path, run_dirs):
        try:
            manifest = json.loads((d / MANIFEST_FILE).read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            continue
        out[str(manifest.get("run_id") or d.name)] = manifest
    return out


#: Report order of backends; unknown ones come after, alphabetically.
BACKEND_ORDER = ("eager", "compile", "cudagraph")


def sort_cases(t: pd.DataFrame) -> pd.DataFrame:
    """Cases in report order: run, workload, mode, backend (eager first), shape, prenorm first."""
    rank = {b: i for i, b in enumerate(BACKEND_ORDER)}
    t = t.assign(_backend=t["backend"].map(rank).fillna(len(rank)), _base=t["router"] != BASELINE)
    order = ["run_id", "workload", "mode", "_backend", "backend", "compile_mode", "compile_scope", *SHAPE_COLS,
             "device", "_base", "router", "variant"]
    return t.sort_values([c for c in order if c in t], kind="stable").drop(
        columns=["_backend", "_base"])


#: Shape columns of a case label and their letters: "d=32 L=2 T=32 B=8".
_SHAPE_LETTERS = (("d_model", "d"), ("n_layers", "L"), ("seq_len", "T"), ("batch_size", "B"))


def backend_text(r: Any) -> str:
    """``backend``, with ``:compile_mode`` and ``:compile_scope`` where the case has them
    (``compile:default:layer``)."""
    out = str(r["backend"])
    for col in ("compile_mode", "compile_scope"):
        v = r.get(col) if hasattr(r, "get") else None
        if v is not None and v == v and v != "":
            out += f":{v}"
    return out


def case_label(r: Any) -> str:
    """A readable name of one case (a row with the case columns): router (options), impl,
    backend (compile mode), mode, shape and seed, e.g. ``"haares, naive, eager, train,
    d=32 L=2 T=32 B=8, seed 0"``; absent fields are left out."""
    def has(v: Any) -> bool:
        return v is not None and v == v and v != ""

    parts = [r["router"] + (f" ({r['options']})" if has(r.get("options")) else ""), r["impl"],
             backend_text(r),
             r["mode"],
             " ".join(f"{k}={int(r[c])}" for c, k in _SHAPE_LETTERS if has(r.get(c))),
             f"seed {int(r['seed'])}" if has(r.get("seed")) else ""]
    return ", ".join(p for p in parts if p)
