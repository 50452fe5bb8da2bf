"""What each router costs, at a glance: one row per router and impl, one sentence per row.

The summary is built from paired statistics only (MEASUREMENT.md, "Noise on shared machines"):
the overhead over ``prenorm`` is the per-pair ratio of :func:`reports.paired.paired_ratio_table`
with its bootstrap interval, eager and compiled each from its own interleaved group; the saved
activations come from :func:`reports.tables.overhead_table` (a count, not a timing). Per router and
impl the row is taken at the mode and shape where the most backends (eager, compile per scope,
cudagraph) were timed, then one where the run has graph-replay rows, then the heaviest mode
(``train_step``, else ``fwd_bwd``, else ``fwd``), then the largest shape (width, then depth); the sentence quotes every
backend timed there, each with its × floor (:mod:`reports.floor`) where the run measured a
bandwidth. On CUDA an eager ratio whose step kept the GPU busy less than
:data:`reports.busy.HOST_BOUND` of the time (the router's recorded ``device_busy``,
:func:`reports.busy.recorded_busy`; else prenorm's inferred from the same run's graph rows,
:func:`reports.busy.busy_shares`; nothing said without either) is flagged host-bound. A ratio
whose interval is wider than :data:`TOLERANCE` (relative to the ratio) is flagged "imprecise" beside its number and CI (never
withheld); a ratio from a noisy group says so. Runs read together are summarised each on its own (a ``run_id`` column and
the run named in each sentence): their timings were never paired. Where several compile scopes ran, each is quoted (the default
scope's, ``model``, in the ``compile_*`` columns); the report's "Compile scopes" table compares them.
"""

from __future__ import annotations

import textwrap

import pandas as pd

from harness.step.backends import BY_NAME, DEFAULT_COMPILE_SCOPE, compiles, plain

from . import busy, declared, floor, frame, paired, paper_baseline, tables
from .sentences import cost_sentence

#: Widest interval, relative to its ratio ((hi − lo) / ratio), that is still quoted as a number.
TOLERANCE = 0.25
MODES = ("train_step", "fwd_bwd", "fwd")
METHOD = ("Each sentence quotes the row of the table below: the per-pair step-time ratio to prenorm "
          "(median of the pairs, 95 % bootstrap CI) of each backend timed (eager, compiled per scope, "
          "graph replay), each from its own interleaved group, at the mode and shape where the most "
          "backends were timed (then one with graph-replay rows, the heaviest mode, the largest shape), with "
          "'× floor' (the physical floor section) where a bandwidth was measured, and the saved "
          "activations as a multiple of prenorm's. On a GPU, an eager ratio is flagged 'host-bound' "
          "when the GPU was busy less than 80 % of the eager step: the router's traced device-busy "
          "share, or, for runs without one, prenorm's graph-replayed step over its eager step (same "
          "mode and shape). The GPU idled waiting for Python, so the eager ratio measures host overhead and graph "
          f"replay or compile the router's device cost. A ratio whose CI is wider than {TOLERANCE:.0%} of it is flagged "
          "'imprecise'; one whose timing crossed a noise threshold (a busy machine, or a spread or an "
          "interval wider than its threshold: the noisy column of the table below) 'noisy group'; unpaired medians are in the detail "
          "tables below.")
COLUMNS = ["run_id", "router", "impl", "mode", "device", "d_model", "n_layers", "seq_len", "batch_size",
           "eager_ratio", "eager_lo", "eager_hi", "eager_noisy", "eager_floor", "busy_share", "busy_of",
           "compile_ratio", "compile_lo", "compile_hi", "compile_noisy", "compile_floor",
           "cudagraph_ratio", "cudagraph_lo", "cudagraph_hi", "cudagraph_noisy", "cudagraph_floor",
           "saved_ratio"]


#: Report headers and number formats (for :data:`reports.render.COLUMN_STYLE`).
COLUMN_STYLE = {
    "eager_ratio": ("eager / prenorm (×)", "{:.3f}"), "eager_lo": ("eager CI low", "{:.3f}"),
    "eager_hi": ("eager CI high", "{:.3f}"), "eager_noisy": ("eager noisy", None),
    "compile_ratio": ("compiled / prenorm (×)", "{:.3f}"), "compile_lo": ("compiled CI low", "{:.3f}"),
    "compile_hi": ("compiled CI high", "{:.3f}"), "compile_noisy": ("compiled noisy", None),
    "cudagraph_ratio": ("graph replay / prenorm (×)", "{:.3f}"),
    "cudagraph_lo": ("graph replay CI low", "{:.3f}"), "cudagraph_hi": ("graph replay CI high", "{:.3f}"),
    "cudagraph_noisy": ("graph replay noisy", None), "eager_floor": ("eager × floor", "{:.1f}"),
    "compile_floor": ("compiled × floor", "{:.1f}"), "cudagraph_floor": ("graph replay × floor", "{:.1f}"),
    "busy_share": ("GPU busy (eager, share of step)", "{:.2f}"), "busy_of": ("GPU busy: whose step", None),
    "best_mfu_pct": ("best MFU (%)", "{:.2f}"), "best_mfu_backend": ("best MFU in", None),
    "eager_failed": ("eager: no timing", None), "compile_failed": ("compiled: no timing", None),
    "cudagraph_failed": ("graph replay: no timing", None),
    "paper_baseline": ("paper baseline", None),
    **{f"{k}_vs_paper{c}": (f"{w}{h}", f) for k, w in (("eager", "eager"), ("compile", "compiled"),
                                                       ("cudagraph", "graph replay"))
       for c, h, f in (("", " / paper baseline (×)", "{:.3f}"), ("_lo", " vs paper CI low", "{:.3f}"),
                       ("_hi", " vs paper CI high", "{:.3f}"), ("_noisy", " vs paper noisy", None))},
}


def _label(backend: str, scope, several_scopes: bool, keep) -> tuple[str, str]:
    """The column prefix and the sentence's word for one backend (and compile scope)."""
    b = BY_NAME.get(backend)  # a name the records hold; another (or none) is shown as it is
    if b is not None and b.captures:
        return b.name, b.word
    if b is not None and b.compiles:
        if scope == keep or scope != scope or scope is None:
            return "compile", f"compiled ({keep} scope)" if several_scopes else "compiled"
        return f"compile_{scope}", f"compiled ({scope} scope)"
    return backend, backend


#: What identifies a failed case's row of the summary (failure rows carry no n_heads or dtype).
FAILED_KEYS = ["run_id", "router", "impl", "mode", "d_model", "n_layers", "seq_len", "batch_size"]
#: How a failed backend is said, by the row's status.
FAILED_WORDS = {"error": "failed", "oom": "ran out of memory", "skipped": "skipped"}


def _failed(df: pd.DataFrame, several_scopes: bool, keep) -> pd.DataFrame:
    """Each backend of a router's case that has no timing because it failed, ran out of memory or
    was skipped: :data:`FAILED_KEYS`, ``_key`` (the backend's column prefix, :func:`_label`),
    ``_word`` and ``failed`` (``"failed: BackendCompilerFailed: …"``, shortened to 120 characters at a
    word)."""
    bad = tables.failures(df)
    bad = bad[(bad["metric"] == "step_time") & bad["status"].isin(list(FAILED_WORDS))
              & bad["mode"].isin(MODES) & (bad["router"] != paired.BASELINE)]
    if bad.empty:
        return pd.DataFrame(columns=[*FAILED_KEYS, "_key", "_word", "failed"])
    keep = keep if keep is not None else DEFAULT_COMPILE_SCOPE  # no compiled ratio anywhere
    labels = [_label(b, s if isinstance(s, str) and s else keep, several_scopes, keep)
              for b, s in zip(bad["backend"], bad["compile_scope"])]
    text = [f"{FAILED_WORDS[st]}: {textwrap.shorten(str(e or ''), 120, placeholder=' …')}".rstrip(": ")
            for st, e in zip(bad["status"], bad["error"])]
    out = bad[FAILED_KEYS].assign(_key=[k for k, _ in labels], _word=[w for _, w in labels], failed=text)
    return out.drop_duplicates([*FAILED_KEYS, "_key"]).reset_index(drop=True)


def _pick(t: pd.DataFrame, busy: pd.DataFrame, failed: pd.DataFrame | None = None) -> pd.DataFrame:
    """Of each run, router and impl, the mode and shape where the most backends were timed or
    failed (``failed``, :func:`_failed`: a backend that failed there is said there), then one
    whose busy share is known from graph rows, then the heaviest mode, then the largest shape:
    width, then depth: one row per key with ``mode`` and the shape."""
    keys = ["run_id", "router", "impl"]
    where = [*keys, "mode", *frame.SHAPE_COLS, "device"]
    per = t.groupby(where, dropna=False)["_key"].nunique().rename("_n").reset_index()
    if failed is not None and len(failed):
        n_failed = failed.groupby(FAILED_KEYS)["_key"].nunique().rename("_f").reset_index()
        per = per.merge(n_failed, on=FAILED_KEYS, how="left")
        per["_n"] = per["_n"] + per["_f"].fillna(0)
        per = per.drop(columns="_f")
    graphed = set(busy["mode"].astype(str) + "|" + busy["run_id"].astype(str)) if not busy.empty else set()
    per["_g"] = [f"{m}|{r}" in graphed for m, r in zip(per["mode"], per["run_id"])]
    per["_m"] = per["mode"].map({m: i for i, m in enumerate(MODES)}).fillna(len(MODES))
    per = per.sort_values(["_n", "_g", "_m", "d_model", "n_layers"], ascending=[False, False, True, False, False],
                          kind="stable")
    return per.drop_duplicates(keys)[[*keys, "mode", *frame.SHAPE_COLS, "device"]].reset_index(drop=True)


def _best_mfu(out: pd.DataFrame, df: pd.DataFrame, manifests: dict[str, dict]) -> pd.DataFrame:
    """``out`` with ``best_mfu_pct`` (the highest MFU, %, of :func:`reports.tables.mfu_table` over the
    backends timed at each row's run, router, impl, mode and shape) and ``best_mfu_backend`` (which
    backend reached it); unchanged when no case has an MFU (a CPU, an unknown device)."""
    m = tables.mfu_table(df, manifests)
    m = m[m["mfu_pct"].notna()] if len(m) else m
    if m.empty:
        return out
    keys = ["run_id", "router", "impl", "mode", *frame.SHAPE_COLS]
    m = m.assign(best_mfu_backend=[frame.backend_text(r) for r in m.to_dict("records")],
                 best_mfu_pct=m["mfu_pct"])
    best = (m.sort_values("best_mfu_pct", ascending=False, kind="stable").drop_duplicates(keys)
            [[*keys, "best_mfu_pct", "best_mfu_backend"]])
    return out.merge(best, on=keys, how="left")


def _vs_paper(out: pd.DataFrame, df: pd.DataFrame, keys: list[str], several_scopes: bool, keep,
              prefixes: list[str]) -> tuple[pd.DataFrame, list[str]]:
    """``out`` with, for rows whose router has a paper baseline (haares, wav_v1: block_attnres),
    ``paper_baseline`` (``"block_attnres [two_phase]"``) and per backend prefix
    ``<prefix>_vs_paper``, ``_vs_paper_lo``, ``_vs_paper_hi``, ``_vs_paper_noisy``: the paired ratio
    to it from the same group (:func:`reports.paper_baseline.paired_vs_paper_table`; NaN where the
    paper baseline did not run in that group), and the names of the columns added (none when no
    timed router has a paper baseline)."""
    pp = paper_baseline.paired_vs_paper_table(df)
    if pp.empty:
        return out, []
    scope = pp["compile_scope"] if "compile_scope" in pp else pd.Series(None, index=pp.index)
    pp = pp.assign(_key=[_label(b, sc, several_scopes, keep)[0] for b, sc in zip(pp["backend"], scope)])
    names = ["paper_baseline"]
    base = pp[[*keys, "paper_baseline"]].drop_duplicates(keys)
    out = out.merge(base, on=keys, how="left")
    for key in prefixes:
        b = pp[(pp["_key"] == key) & pp["vs_paper"].notna()]
        if b.empty:
            continue
        cols = {"vs_paper": f"{key}_vs_paper", "vs_paper_lo": f"{key}_vs_paper_lo",
                "vs_paper_hi": f"{key}_vs_paper_hi", "noisy": f"{key}_vs_paper_noisy"}
        out = out.merge(b[[*keys, *cols]].drop_duplicates(keys).rename(columns=cols), on=keys, how="left")
        names += list(cols.values())
    return out, names


def cost_summary(df: pd.DataFrame, manifests: dict[str, dict] | None = None) -> pd.DataFrame:
    """One row per run, router and impl (prenorm excluded): :data:`COLUMNS`, then the ratio, CI,
    noise and floor columns of any further compile scope (``compile_<scope>_ratio``, ...) and
    ``attrs["labels"]`` (the sentence's (prefix, word) per backend, in order); ratios are router / prenorm
    (×), NaN where that backend was not paired at that shape; ``*_floor`` is the × floor of
    :func:`reports.floor.floor_table` (NaN without a bandwidth row or a byte floor); ``busy_share``
    the router's recorded ``device_busy`` (:func:`reports.busy.recorded_busy`), else the
    :func:`reports.busy.busy_shares` of the row's mode and shape (NaN without either). With
    ``manifests`` (run_id -> manifest) and a device of known peak: ``best_mfu_pct`` and
    ``best_mfu_backend`` last (:func:`_best_mfu`). A backend that failed, ran out of memory or was
    skipped at a row's mode and shape (and has no ratio there) fills ``<prefix>_failed`` with why
    (:func:`_failed`; the column is absent when nothing failed). Rows of a router with a paper
    baseline (haares, wav_v1) carry ``paper_baseline`` and, per backend, the paired ratio to it
    (``<prefix>_vs_paper`` with its CI and noise, :func:`_vs_paper`); the columns are absent when
    no such router was timed."""
    pt = paired.paired_ratio_table(df)
    if pt.empty:
        return pd.DataFrame(columns=COLUMNS)
    pt = pt[pt["mode"].isin(MODES)].copy()
    if pt.empty:
        return pd.DataFrame(columns=COLUMNS)
    scope = pt["compile_scope"] if "compile_scope" in pt else pd.Series(None, index=pt.index)
    scopes = sorted(scope[pt["backend"].map(compiles).astype(bool)].dropna().unique())
    keep = DEFAULT_COMPILE_SCOPE if DEFAULT_COMPILE_SCOPE in scopes else (scopes or [None])[0]
    labels = [_label(b, s, len(scopes) > 1, keep) for b, s in zip(pt["backend"], scope)]
    pt["_key"] = [k for k, _ in labels]
    order = {"eager": 0, "compile": 1, "cudagraph": 3}
    words = sorted(set(labels), key=lambda kw: (order.get(kw[0], 2), kw[0]))
    fl = floor.floor_table(df, paired=pt.drop(columns="_key"))
    pt["_floor"] = fl["over_floor"].to_numpy() if len(fl) == len(pt) else float("nan")
    busy_t = busy.busy_shares(pt)
    failed = _failed(df, len(scopes) > 1, keep)
    chosen = _pick(pt, busy_t, failed)
    keys = ["run_id", "router", "impl", "mode", *frame.SHAPE_COLS]
    out = chosen.copy()
    words += sorted({(k, w) for k, w in zip(failed["_key"], failed["_word"])} - set(words),
                    key=lambda kw: (order.get(kw[0], 2), kw[0]))
    for key, _ in words:
        b = pt[pt["_key"] == key][[*keys, "ratio", "ratio_lo", "ratio_hi", "noisy", "_floor"]]
        b = b.drop_duplicates(keys).rename(columns={"ratio": f"{key}_ratio", "ratio_lo": f"{key}_lo",
                                                    "ratio_hi": f"{key}_hi", "noisy": f"{key}_noisy",
                                                    "_floor": f"{key}_floor"})
        out = out.merge(b, on=keys, how="left")
    if not busy_t.empty:
        out = out.merge(busy_t, on=busy.KEYS, how="left")
        out["busy_of"] = out["busy_share"].notna().map({True: "prenorm", False: None})
    rec = busy.recorded_busy(df)
    if not rec.empty:  # the case's own traced share, where the sweep recorded one
        rec = rec.rename(columns={"busy_share": "_busy_rec"})
        out = out.merge(rec, on=[*busy.KEYS, "router", "impl"], how="left")
        mine = out["_busy_rec"].notna()
        out["busy_share"] = out["_busy_rec"].combine_first(out["busy_share"]) if "busy_share" in out \
            else out["_busy_rec"]
        out["busy_of"] = out["busy_of"].where(~mine, "router") if "busy_of" in out else mine.map(
            {True: "router", False: None})
        out = out.drop(columns="_busy_rec")
    ov = tables.overhead_table(df)
    if not ov.empty:
        ov = ov[ov["backend"].map(plain).astype(bool)][[*keys, "saved_ratio"]].drop_duplicates(keys)
        out = out.merge(ov, on=keys, how="left")
    extra = [f"{k}_{c}" for k, _ in words if k not in BY_NAME
             for c in ("ratio", "lo", "hi", "noisy", "floor")]
    for key in dict.fromkeys(failed["_key"]):  # a backend without a timing says why, where it failed
        f = failed[failed["_key"] == key][[*FAILED_KEYS, "failed"]].rename(columns={"failed": f"{key}_failed"})
        out = out.merge(f, on=FAILED_KEYS, how="left")
        if f"{key}_ratio" in out:
            out.loc[out[f"{key}_ratio"].notna(), f"{key}_failed"] = None
    out, paper = _vs_paper(out, df, keys, len(scopes) > 1, keep, [k for k, _ in words])
    said = [c for c in out if c.endswith("_failed") and out[c].notna().any()]
    mfu = []
    if manifests:
        out = _best_mfu(out, df, manifests)
        mfu = [c for c in ("best_mfu_pct", "best_mfu_backend") if c in out]
    out = out.reindex(columns=[*COLUMNS, *extra, *paper, *said, *mfu]).reset_index(drop=True)
    out.attrs["labels"] = words
    out.attrs["floor_not_declared"] = declared.floor_sentence(fl)
    return out


def cost_sentences(df: pd.DataFrame, manifests: dict[str, dict] | None = None
                   ) -> tuple[list[str], pd.DataFrame]:
    """The summary sentences and the table they quote (with ``manifests``, the device names of a
    GPU run give the table its best MFU per row)."""
    t = cost_summary(df, manifests)
    several = t["run_id"].nunique() > 1
    labels = t.attrs.get("labels") or [("eager", "eager"), ("compile", "compiled")]
    said = [cost_sentence(r, TOLERANCE, run=several, labels=labels) for r in t.to_dict("records")]
    if t.attrs.get("floor_not_declared"):  # a router without an ideal I/O model: no floor, said so
        said.append(t.attrs["floor_not_declared"])
    return said, t
