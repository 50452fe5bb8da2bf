"""The training runs of a race: time to target loss, paired by seed (MEASUREMENT.md, "Time to
target loss"); the comparisons between them are :mod:`reports.race`.

From the rows of ``routerbench train`` (mode ``train``: measured runs; mode ``pilot``: the baseline
run, with its own seed, that set the target loss) this module builds

- :func:`run_frame` and :func:`runs_table`: one row per run, with its verdict (ok, not converged,
  diverged, error, skipped);
- :func:`curves`: each run's evaluations (validation loss against tokens and the clock);
- :func:`baselines_for`: whom each router is compared with;
- :func:`protocol_lines`, :func:`sentence_prefixes` and :func:`smoke_runs`: what the report says
  of the settings of each run.

A run at or below the target at step 0 (the target is not below its starting loss) has no time
to target to divide by (:func:`at_start`).
"""

from __future__ import annotations

from typing import Iterable

import numpy as np
import pandas as pd

from routers import BASELINE, paper_baseline

from . import sentences as say
from .frame import BACKEND_ORDER, TRAIN_MODE, TRAIN_MODES

PILOT_MODE = "pilot"
#: What makes one training run.
RUN_KEYS = ("run_id", "backend", "mode", "router", "variant", "seed", "case_key")
#: Run-level metrics read from the rows without a ``repeat``.
RUN_METRICS = ("target_loss", "token_budget", "step_budget", "train_time", "time_to_target",
               "steps_to_target", "tokens_to_target", "time_to_target_eval",
               "steps_to_target_eval", "loss_at_token_budget", "target_step", "train_cpu_pressure")
#: Per-evaluation metrics (``repeat`` = optimizer step).
EVAL_METRICS = ("val_loss", "elapsed", "tokens", "train_loss")

RUNS_COLUMNS = ["run_id", "backend", "mode", "router", "variant", "seed", "status",
                "time_to_target", "steps_to_target", "loss_at_token_budget", "train_time",
                "target_loss", "note"]
CURVE_COLUMNS = ["run_id", "backend", "mode", "router", "variant", "seed", "status", "step",
                 "tokens", "elapsed", "val_loss"]

#: Why a run that reached the target at step 0 forms no ratio.
AT_START = "reached the target at step 0: the target is not below the starting loss"


def train_rows(df: pd.DataFrame) -> pd.DataFrame:
    """The rows of training runs and pilots (modes ``train`` and ``pilot``)."""
    return df[df["mode"].isin(TRAIN_MODES)]


def baselines_for(routers: Iterable[str]) -> dict[str, tuple[str, ...]]:
    """Each router's baselines among ``routers``: ``prenorm`` for all but itself; for a router
    whose paper measures it against another (``routers.paper_baseline``: ``block_attnres`` for
    ``haares`` and ``wav_v1``) also that one when it was trained too."""
    routers = set(routers)
    out = {}
    for r in sorted(routers):
        bases = (BASELINE,) if BASELINE in routers and r != BASELINE else ()
        if (paper := paper_baseline(r)) is not None and paper in routers:
            bases += (paper,)
        out[r] = bases
    return out


# --- one row per run ------------------------------------------------------------------------


def _verdict(g: pd.DataFrame, mode: str) -> tuple[str, str]:
    """(status, reason) of one run from all its rows."""
    def reason(rows: pd.DataFrame) -> str:
        return next((e for e in rows["error"] if e), "")

    div = g[(g["metric"] == "diverged") | (g["status"] == "diverged")]
    if len(div):
        at = div["repeat"].dropna()
        return "diverged", reason(div) or (f"diverged at step {int(at.iloc[0])}" if len(at)
                                           else "diverged")
    # A failed or skipped run says so on its verdict row (time_to_target); other rows may be
    # skipped on purpose (loss_at_token_budget of a run stopped at its target). A pilot has no
    # verdict row: any failed row fails it.
    ttt = g[(g["metric"] == "time_to_target") & g["repeat"].isna()]
    verdict = g if mode == PILOT_MODE else ttt
    for status, label in (("error", "error"), ("oom", "error"), ("skipped", "skipped")):
        bad = verdict[verdict["status"] == status]
        if len(bad):
            return label, (("out of memory: " if status == "oom" else "") + reason(bad)).strip()
    if (ttt["status"] == "not_converged").any():
        return "not converged", reason(ttt[ttt["status"] == "not_converged"])
    if ((ttt["status"] == "ok") & ttt["value"].notna()).any():
        return "ok", ""
    if mode == PILOT_MODE and ((g["metric"] == "target_loss") & (g["status"] == "ok")).any():
        step = g.loc[(g["metric"] == "target_step") & g["value"].notna(), "value"]
        return "ok", "pilot: set the target" + (f" at step {step.iloc[-1]:g}" if len(step) else "")
    return "incomplete", "no verdict row (time_to_target) recorded"


def run_frame(df: pd.DataFrame) -> pd.DataFrame:
    """One row per training run with every recorded number (internal form of :func:`runs_table`).

    Returns:
        :data:`RUN_KEYS`, ``status``, ``note``, the :data:`RUN_METRICS` (NaN when absent: old
        records have no ``train_time`` or ``step_budget``), ``last_step`` and ``last_elapsed``
        (the last evaluation) and ``clock_end`` (``train_time``, else ``last_elapsed``). A
        diverged run's ``time_to_target``, ``steps_to_target``, ``tokens_to_target`` and
        ``loss_at_token_budget`` are NaN whatever its rows say.
    """
    keys = list(RUN_KEYS)
    cols = [*keys, "status", "note", *RUN_METRICS, "last_step", "last_elapsed", "clock_end"]
    tr = train_rows(df)
    if tr.empty:
        return pd.DataFrame(columns=cols)
    ok = tr[(tr["status"] == "ok") & tr["value"].notna()]
    level = ok[ok["repeat"].isna() & ok["metric"].isin(RUN_METRICS)]
    out = tr[keys].drop_duplicates().set_index(keys)
    if len(level):
        out = out.join(level.groupby([*keys, "metric"], dropna=False)["value"].last()
                       .unstack("metric"))
    evals = ok[ok["repeat"].notna() & (ok["metric"] == "val_loss")]
    out = out.join(evals.groupby(keys, dropna=False)["repeat"].max().rename("last_step"))
    el = ok[ok["repeat"].notna() & (ok["metric"] == "elapsed")].sort_values("repeat")
    out = out.join(el.groupby(keys, dropna=False)["value"].last().rename("last_elapsed"))
    verdicts = {k: _verdict(g, k[2]) for k, g in tr.groupby(keys, dropna=False, sort=False)}
    out["status"] = [verdicts[k][0] for k in out.index]
    out["note"] = [verdicts[k][1] for k in out.index]
    out = out.reindex(columns=[c for c in cols if c not in keys]).reset_index()
    for c in [*RUN_METRICS, "last_step", "last_elapsed"]:
        out[c] = out[c].astype(float)
    out["clock_end"] = out["train_time"].fillna(out["last_elapsed"])
    out.loc[at_start(out), "note"] = AT_START
    dead = out["status"] == "diverged"
    out.loc[dead, ["time_to_target", "steps_to_target", "tokens_to_target",
                   "loss_at_token_budget"]] = np.nan
    rank = {b: i for i, b in enumerate(BACKEND_ORDER)}
    out = out.assign(_b=out["backend"].map(rank).fillna(len(rank)),
                     _m=out["mode"] != PILOT_MODE, _base=out["router"] != BASELINE)
    out = out.sort_values(["run_id", "_b", "backend", "_m", "_base", "variant", "seed"],
                          kind="stable")
    return out[cols].reset_index(drop=True)


def at_start(runs: pd.DataFrame | pd.Series):
    """Whether a run (or each run of a frame) reached the target at step 0: ok, with a time or
    a step count to target of 0."""
    return (runs["status"] == "ok") & ((runs["time_to_target"] <= 0)
                                       | (runs["steps_to_target"] <= 0))


def runs_table(df: pd.DataFrame) -> pd.DataFrame:
    """One row per training run and pilot.

    Args:
        df: a frame of :func:`reports.frame.load_frame`.

    Returns:
        :data:`RUNS_COLUMNS`: ``mode`` (``train`` or ``pilot``), ``status`` (``ok``, ``not
        converged``, ``diverged``, ``error``, ``skipped``, or ``incomplete`` for a run without a
        verdict row), ``time_to_target`` (s), ``steps_to_target``, ``loss_at_token_budget``
        (nats), ``train_time`` (s, the clock at the last evaluation), ``target_loss`` (nats),
        ``note`` (why a run failed, did not converge or diverged; where a pilot set the target;
        :data:`AT_START` for a run at the target from step 0).
        Pilot first, then the baseline, within each run and backend.
    """
    return run_frame(df)[RUNS_COLUMNS]


def curves(df: pd.DataFrame) -> pd.DataFrame:
    """The evaluation curves of every run: :data:`CURVE_COLUMNS`, one row per evaluation
    (``step`` = optimizer step), with the run's ``status`` so a diverged run can be drawn apart."""
    tr = train_rows(df)
    tr = tr[(tr["status"] == "ok") & tr["value"].notna() & tr["repeat"].notna()
            & tr["metric"].isin(["val_loss", "elapsed", "tokens"])]
    if tr.empty:
        return pd.DataFrame(columns=CURVE_COLUMNS)
    keys = list(RUN_KEYS)
    wide = (tr.groupby([*keys, "repeat", "metric"], dropna=False)["value"].last()
            .unstack("metric").reset_index().rename(columns={"repeat": "step"}))
    if "val_loss" not in wide:
        return pd.DataFrame(columns=CURVE_COLUMNS)
    wide = wide.reindex(columns=[*keys, "step", "tokens", "elapsed", "val_loss"])
    status = run_frame(df)[keys + ["status"]]
    wide = wide.merge(status, on=keys, how="left")
    wide = wide[wide["val_loss"].notna()].sort_values([*keys, "step"], kind="stable")
    return wide[CURVE_COLUMNS].reset_index(drop=True)


# --- pairs ----------------------------------------------------------------------------------


# --- words ----------------------------------------------------------------------------------


def sentence_prefixes(df: pd.DataFrame, table: pd.DataFrame,
                      manifests: dict[str, dict] | None = None) -> list[str]:
    """What each sentence of ``table`` (:func:`comparison_table` of ``df``) starts with, so that
    the sentences of several training runs reported together say which run they are about:
    ``"[run r1, eager, fp32] "`` names the run when ``df`` trained several, the backend when
    several, the precision (from the manifests, run_id -> manifest) when runs differ in it;
    ``""`` for every row when ``df`` holds one run and backend."""
    groups = train_rows(df)[["run_id", "backend"]].drop_duplicates()
    if len(groups) <= 1:
        return [""] * len(table)
    precision = {r: str((manifests or {}).get(r, {}).get("precision") or "")
                 for r in groups["run_id"].unique()}
    runs, backends = groups["run_id"].nunique() > 1, groups["backend"].nunique() > 1
    show_precision = len(set(precision.values())) > 1
    out = []
    for run_id, backend in zip(table["run_id"], table["backend"]):
        parts = ([f"run {run_id}"] if runs else []) + ([backend] if backends else []) + (
            [precision[run_id]] if show_precision and precision[run_id] else [])
        out.append(f"[{', '.join(parts)}] ")
    return out


def protocol_line(run_id: str, manifest: dict) -> str:
    """The settings of one ``routerbench train`` run from its manifest, in one sentence: "Run
    r1: backend eager, precision fp32, grad-accum 1, evaluation every 7 steps, schedule
    interleaved in turns of 10 steps (reason), target from a prenorm pilot (seed 10000) at step
    154, seeds 0, 1, 2." Settings the manifest lacks (older records) are left out."""
    m = manifest
    parts = [f"{label} {m[key]}" for key, label in (
        ("backend", "backend"), ("precision", "precision"), ("grad_accum", "grad-accum"))
        if m.get(key) is not None]
    def steps(n: int) -> str:
        return f"{n} step" + ("s" if n != 1 else "")

    if m.get("eval_every"):
        every = m["eval_every"]
        parts.append("evaluation every " + ("step" if every == 1 else steps(every)))
    sched = m.get("schedule") or {}
    if sched.get("schedule"):
        turns = (f" in turns of {steps(m['chunk'])}"
                 if sched["schedule"] == "interleaved" and m.get("chunk") else "")
        why = f" ({sched['reason']})" if sched.get("reason") else ""
        parts.append(f"schedule {sched['schedule']}{turns}{why}")
    target = m.get("target") or {}
    if target.get("source") == "pilot":
        parts.append(f"target from a {target.get('router', '?')} pilot (seed "
                     f"{target.get('seed', '?')}) at step {target.get('step', '?')}")
    elif target.get("source") == "given" and target.get("value") is not None:
        parts.append(f"target {target['value']:g} nats (given)")
    if m.get("seeds") is not None:
        parts.append(f"seed{'s' * (len(m['seeds']) != 1)} {say.fmt_seeds(m['seeds'])}")
    return f"Run {run_id}: {', '.join(parts) or 'no protocol settings recorded'}."


def protocol_lines(df: pd.DataFrame, manifests: dict[str, dict]) -> list[str]:
    """:func:`protocol_line` of each training run of ``df`` whose manifest (run_id -> manifest,
    :func:`reports.frame.load_manifests`) is one of ``routerbench train``."""
    ids = train_rows(df)["run_id"].unique()
    return [protocol_line(r, manifests[r]) for r in sorted(ids)
            if manifests.get(r, {}).get("command") == "train"]


def smoke_runs(df: pd.DataFrame) -> list[str]:
    """Runs whose race is a smoke test: every router trained with a single seed.

    The rule is the seed count, not the command that wrote the rows: one seed gives no interval
    and no test whichever command ran it (``routerbench run``'s race always has one seed), while
    MEASUREMENT.md asks for at least three.
    """
    runs = run_frame(df)
    measured = runs[runs["mode"] == TRAIN_MODE]
    seeds = measured.groupby(["run_id", "variant"])["seed"].nunique()
    return sorted(run for run, s in seeds.groupby(level="run_id") if s.max() <= 1)
