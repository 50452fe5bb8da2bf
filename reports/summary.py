"""What each router costs, at a glance: one row per router and impl, one sentence per row.

The summary is built from paired statistics only (MEASUREMENT.md, "Noise on shared machines"):
the overhead over ``prenorm`` is the per-pair ratio of :func:`reports.paired.paired_ratio_table`
with its bootstrap interval, eager and compiled each from its own interleaved group; the saved
activations come from :func:`reports.tables.overhead_table` (a count, not a timing). Per router and
impl the row is taken at the largest shape (width, then depth) of the heaviest mode timed
(``train_step``, else ``fwd_bwd``, else ``fwd``). A ratio whose interval is wider than
:data:`TOLERANCE` (relative to the ratio) is flagged "imprecise" beside its number and CI (never
withheld); a ratio from a noisy group says so. Runs read together are summarised each on its own (a ``run_id`` column and
the run named in each sentence): their timings were never paired. Where several compile scopes ran, the compiled ratio is the default
scope's (``model``); the report's "Compile scopes" table compares the two.
"""

from __future__ import annotations

import pandas as pd

from harness.step.backends import DEFAULT_COMPILE_SCOPE

from . import frame, paired, tables
from .sentences import cost_sentence

#: Widest interval, relative to its ratio ((hi − lo) / ratio), that is still quoted as a number.
TOLERANCE = 0.25
MODES = ("train_step", "fwd_bwd", "fwd")
METHOD = ("Each sentence quotes the row of the table below: the per-pair step-time ratio to prenorm "
          "(median of the pairs, 95 % bootstrap CI) of the interleaved eager group and of the compiled "
          "group, at the largest shape of the heaviest mode timed, and the saved activations as a "
          f"multiple of prenorm's. A ratio whose CI is wider than {TOLERANCE:.0%} of it is flagged "
          "'imprecise', one timed on a busy machine 'noisy group'; unpaired medians are in the detail "
          "tables below.")
COLUMNS = ["run_id", "router", "impl", "mode", "d_model", "n_layers", "seq_len", "batch_size",
           "eager_ratio", "eager_lo", "eager_hi", "eager_noisy", "compile_ratio", "compile_lo",
           "compile_hi", "compile_noisy", "saved_ratio"]


#: Report headers and number formats (for :data:`reports.render.COLUMN_STYLE`).
COLUMN_STYLE = {
    "eager_ratio": ("eager / prenorm (×)", "{:.3f}"), "eager_lo": ("eager CI low", "{:.3f}"),
    "eager_hi": ("eager CI high", "{:.3f}"), "eager_noisy": ("eager noisy", None),
    "compile_ratio": ("compiled / prenorm (×)", "{:.3f}"), "compile_lo": ("compiled CI low", "{:.3f}"),
    "compile_hi": ("compiled CI high", "{:.3f}"), "compile_noisy": ("compiled noisy", None),
}


def _pick(t: pd.DataFrame) -> pd.DataFrame:
    """Of each router and impl, the rows at the heaviest mode and largest shape it was timed at."""
    t = t.assign(_m=t["mode"].map({m: i for i, m in enumerate(MODES)}).fillna(len(MODES)))
    t = t.sort_values(["_m", "d_model", "n_layers"], ascending=[True, False, False], kind="stable")
    keys = ["run_id", "router", "impl"]
    first = t.drop_duplicates(keys)[[*keys, "mode", "d_model", "n_layers"]]
    return t.merge(first, on=[*keys, "mode", "d_model", "n_layers"])


def cost_summary(df: pd.DataFrame) -> pd.DataFrame:
    """One row per run, router and impl (prenorm excluded): :data:`COLUMNS`; ratios are router /
    prenorm (×), NaN where that backend was not paired at that shape."""
    pt = paired.paired_ratio_table(df)
    if pt.empty:
        return pd.DataFrame(columns=COLUMNS)
    pt = pt[pt["mode"].isin(MODES)]
    if "compile_scope" in pt:  # one compiled figure per row: the default scope's where several ran
        scopes = pt.loc[pt["backend"] == "compile", "compile_scope"].dropna().unique()
        keep = DEFAULT_COMPILE_SCOPE if DEFAULT_COMPILE_SCOPE in scopes else (sorted(scopes) or [None])[0]
        pt = pt[(pt["backend"] != "compile") | (pt["compile_scope"] == keep)]
    eager = _pick(pt[pt["backend"] == "eager"]) if (pt["backend"] == "eager").any() else _pick(pt)
    keys = ["run_id", "router", "impl", "mode", *frame.SHAPE_COLS]
    out = eager[keys].copy()
    for backend in ("eager", "compile"):
        b = pt[pt["backend"] == backend][[*keys, "ratio", "ratio_lo", "ratio_hi", "noisy"]]
        b = b.drop_duplicates(keys).rename(columns={"ratio": f"{backend}_ratio", "ratio_lo": f"{backend}_lo",
                                                    "ratio_hi": f"{backend}_hi", "noisy": f"{backend}_noisy"})
        out = out.merge(b, on=keys, how="left")
    ov = tables.overhead_table(df)
    if not ov.empty:
        ov = ov[ov["backend"] == "eager"][[*keys, "saved_ratio"]].drop_duplicates(keys)
        out = out.merge(ov, on=keys, how="left")
    return out.reindex(columns=COLUMNS).reset_index(drop=True)


def cost_sentences(df: pd.DataFrame) -> tuple[list[str], pd.DataFrame]:
    """The summary sentences and the table they quote."""
    t = cost_summary(df)
    several = t["run_id"].nunique() > 1
    return [cost_sentence(r, TOLERANCE, run=several) for r in t.to_dict("records")], t
