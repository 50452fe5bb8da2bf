"""Paired timing results: each router's per-pair ratio to prenorm with a bootstrap interval.

Rows come from :mod:`harness.timing.paired`: ``step_time`` rows with a ``pair`` column, written by one
session that timed a group (same run, backend, compile mode, mode, workload, shape, seed) in
interleaved rounds. A router's round ``i`` is divided by prenorm's round ``i`` of the same session;
the table gives the median of those ratios with a percentile-bootstrap interval over pairs
(:func:`harness.stats.bootstrap.bootstrap_ratio_ci`), and each side's median and IQR over the same pairs.

The interval covers noise within one run, not drift between runs (MEASUREMENT.md, "Timing"):
with two or more runs of the same cases the figure puts their ratios side by side, so agreement
is shown, never asserted.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import matplotlib

matplotlib.use("Agg")  # files only

import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

from harness.stats.sequential import ratio_interval  # noqa: E402
from harness.step.backends import compiles, plain  # noqa: E402
from harness.timing import noise  # noqa: E402
from harness.timing.timer import median_iqr  # noqa: E402
from routers import BASELINE  # noqa: E402

from . import frame  # noqa: E402
from .plotting import save_png, shared_ratio_axes  # noqa: E402

#: Rows timed together: one session of one run at one setting and shape.
PAIR_KEYS = ("run_id", "session", "backend", "compile_mode", "compile_scope", "mode", "workload",
             *frame.SHAPE_COLS, "device", "seed")
VARIANT_KEYS = ("router", "options", "impl", "variant")
#: What one timing of a group shares beyond :data:`PAIR_KEYS`: its unit and attempt (a re-timed
#: case's rounds pair only with its partners' rows of that attempt).
TIMING_KEYS = ("resume_unit", "attempt")
#: What must match for two runs' ratios to be the same case (run, session and device may differ).
SAME_CASE = ("backend", "compile_mode", "compile_scope", "mode", "workload", *frame.SHAPE_COLS, "seed", "variant")
CONF = 0.95
COLUMNS = [*(k for k in PAIR_KEYS if k != "session"), *VARIANT_KEYS, "pairs", "median_ms",
           "iqr_ms", "prenorm_ms", "prenorm_iqr_ms", "ratio", "ratio_lo", "ratio_hi", "interval",
           "stop", "attempts", "noisy"]

#: Report headers and number formats (merged into :data:`reports.render.COLUMN_STYLE`).
COLUMN_STYLE = {
    "pairs": ("pairs", None), "prenorm_iqr_ms": ("prenorm IQR (ms)", "{:.3f}"),
    "ratio": ("ratio to prenorm (median of pairs)", "{:.3f}"),
    "ratio_lo": ("CI low", "{:.3f}"), "ratio_hi": ("CI high", "{:.3f}"),
    "attempts": ("timings", None), "noisy": ("noisy (last timing)", None),
    "interval": ("interval", None), "stop": ("timing stopped", None),
    "eager_ms": ("eager (ms)", "{:.3f}"),
    "paired_vs_eager": ("vs eager, paired (median of pairs, ×)", "{:.3f}"),
    "paired_vs_eager_lo": ("CI low", "{:.3f}"), "paired_vs_eager_hi": ("CI high", "{:.3f}"),
    "model_ms": ("model scope (ms)", "{:.3f}"), "layer_ms": ("layer scope (ms)", "{:.3f}"),
    "layer_vs_model": ("layer / model scope, paired (median of pairs, ×)", "{:.3f}"),
    "layer_vs_model_lo": ("CI low", "{:.3f}"), "layer_vs_model_hi": ("CI high", "{:.3f}"),
}
METHOD = (f"Paired timing: in each run, the routers of one backend, mode and shape were timed "
          f"interleaved with prenorm in one process (ABBA rounds unless the manifest says "
          f"otherwise). ratio = median over rounds of router time / prenorm time of the same "
          f"round, with a {CONF:.0%} percentile-bootstrap interval over rounds; medians and IQRs "
          f"are over the same rounds. With --precision-target the interval is the stopping rule's "
          f"own (the distribution-free interval of the median at 1 − α/K for K pre-set looks, "
          f"docs/MEASUREMENT.md), named in the interval column. A re-timed case's ratio uses its "
          f"last timing's pairs only. The interval covers noise within one run, not drift "
          f"between runs: the figure shows how repeated runs agree.")
NO_TABLE = ("No paired step times (rows with a pair column and a prenorm in the same group): "
            "run `routerbench run --paired` with prenorm among --routers.")
NO_DATA = "No data for this figure: it needs paired step times of prenorm and another router."


def paired_rows(df: pd.DataFrame) -> pd.DataFrame:
    """The ``ok`` ``step_time`` rows of the cost sweep that carry a ``pair``, values in ms, a
    partner's rows of another case's timing included (``partner_only``)."""
    st = frame.ok_rows(frame.cost_rows(df), "step_time", partners=True)
    st = st[st["pair"].notna()]
    to_ms = pd.to_numeric(st["unit"].map(frame.TO_MS), errors="coerce").astype(float).fillna(1.0)
    return st.assign(value=st["value"].astype(float) * to_ms)


def _own(rows: pd.DataFrame) -> pd.DataFrame:
    return rows[~rows["partner_only"].astype(bool)] if "partner_only" in rows else rows


def interval_label(rows: pd.DataFrame) -> tuple[float | None, str]:
    """The level of the stopping rule's interval the rows were timed under (their ``ci_conf``),
    and how the report names the interval: ``rule 99.5 %`` or ``bootstrap 95 %``."""
    conf = pd.to_numeric(rows["ci_conf"], errors="coerce").dropna() if "ci_conf" in rows else pd.Series(dtype=float)
    if conf.empty:
        return None, f"bootstrap {CONF:.0%}"
    c = float(conf.iloc[0])
    return c, f"rule {c:.2%}".replace(".00%", "%")


def _stop(rows: pd.DataFrame) -> str:
    s = rows["stop"].astype(str) if "stop" in rows else pd.Series(dtype=str)
    s = s[~s.isin(["", "None", "nan"])]
    return s.iloc[0] if len(s) else "fixed"


def pairs_by_variant(df: pd.DataFrame) -> Iterator[dict]:
    """The pairs behind every ratio to prenorm, grouped as :func:`paired_ratio_table` groups them:
    per timing (:data:`PAIR_KEYS` and :data:`TIMING_KEYS`: one attempt of one group of one
    session) and per variant other than prenorm timed there as its own (not as a partner), the
    rounds both sides timed, in order.

    Yields:
        ``group``, ``timing`` and ``variant_keys`` (dicts of those columns), ``prenorm`` and ``times`` (ms,
        round by round; each round's median where a round holds several rows), and the rows of
        each side (``base_rows``, ``rows``). Timings without prenorm yield nothing; of several
        prenorm variants in a timing, the first in name order is the baseline.
    """
    keys = [*PAIR_KEYS, *TIMING_KEYS]
    for gk, g in paired_rows(df).groupby(keys, dropna=False, sort=False):
        base_rows = g[g["router"] == BASELINE]
        if base_rows.empty:
            continue
        base_rows = base_rows[base_rows["variant"] == sorted(base_rows["variant"].unique())[0]]
        base = base_rows.groupby("pair")["value"].median()
        for vk, v in _own(g[g["router"] != BASELINE]).groupby(list(VARIANT_KEYS), sort=False):
            mine = v.groupby("pair")["value"].median()
            common = mine.index.intersection(base.index).sort_values()
            if len(common):
                yield {"group": dict(zip(PAIR_KEYS, gk)), "timing": dict(zip(TIMING_KEYS, gk[len(PAIR_KEYS):])),
                       "variant_keys": dict(zip(VARIANT_KEYS, vk)),
                       "prenorm": base[common].tolist(), "times": mine[common].tolist(),
                       "base_rows": base_rows, "rows": v}


def paired_ratio_table(df: pd.DataFrame, n_boot: int = 2000, conf: float = CONF,
                       seed: int = 0) -> pd.DataFrame:
    """Every paired router against the prenorm of its group, pair by pair.

    Args:
        df: a frame of :func:`reports.frame.load_frame`.
        n_boot, conf, seed: of :func:`harness.stats.bootstrap.bootstrap_ratio_ci`.

    Returns:
        :data:`COLUMNS`: the group and variant, ``pairs`` (rounds present on both sides),
        ``median_ms``/``iqr_ms`` (router) and ``prenorm_ms``/``prenorm_iqr_ms`` over those
        rounds, ``ratio`` (median of router/prenorm per round), ``ratio_lo``/``ratio_hi`` (the
        interval: the stopping rule's own where ``ci_conf`` says a rule timed them, else the
        bootstrap at ``conf``), ``interval`` (which: ``rule 99.5 %`` or ``bootstrap 95 %``),
        ``stop`` (why timing stopped), ``attempts`` (the case's timings; the last is used) and ``noisy``
        (why the last timing of either side crossed a threshold of :mod:`harness.timing.noise`, ``""``
        when quiet; thresholds from ``df.attrs["noise_thresholds"]``, else the defaults). Groups
        without prenorm give no rows; empty input, an empty frame.
    """
    why = noise_by_case(df, df.attrs.get("noise_thresholds"), by_session=True)
    out = []
    for p in pairs_by_variant(df):
        a, b = p["prenorm"], p["times"]
        rule, label = interval_label(p["rows"])
        ratio, lo, hi = ratio_interval(a, b, rule, n_boot=n_boot, seed=seed, boot_conf=conf)
        (med, iqr), (bmed, biqr) = median_iqr(b), median_iqr(a)
        reasons = [f"{side}: {r}" for side, rows_ in (("router", p["rows"]), ("prenorm", p["base_rows"]))
                   for r in why.get((rows_["case_key"].iloc[0], rows_["session"].iloc[0]), [])]
        v = p["rows"]
        out.append({**p["group"], **p["variant_keys"],
                    "pairs": len(a), "median_ms": med, "iqr_ms": iqr, "prenorm_ms": bmed,
                    "prenorm_iqr_ms": biqr, "ratio": ratio, "ratio_lo": lo, "ratio_hi": hi,
                    "interval": label, "stop": _stop(v), "attempts": int(v["attempts"].max()) if "attempts" in v else 1,
                    "noisy": "; ".join(reasons)})
    if not out:
        return pd.DataFrame(columns=COLUMNS)
    return frame.sort_cases(pd.DataFrame(out))[COLUMNS].reset_index(drop=True)


#: What the eager and the compiled step of one router share to be paired: the same unit of
#: resume (one interleaved group; rounds of different groups are not pairs) and case.
EAGER_KEYS = ("run_id", "session", "resume_unit", "mode", "workload", *frame.SHAPE_COLS, "device",
              "seed", "router", "options", "impl", "variant")
EAGER_COLUMNS = [*(k for k in EAGER_KEYS if k != "resume_unit"), "backend",
                 "compile_mode", "compile_scope", "pairs", "eager_ms", "median_ms", "paired_vs_eager", "paired_vs_eager_lo",
                 "paired_vs_eager_hi", "noisy"]


def paired_vs_eager_table(df: pd.DataFrame, n_boot: int = 2000, conf: float = CONF,
                          seed: int = 0) -> pd.DataFrame:
    """Each compiled (or graph-replayed) step against the eager step of the same router, impl and
    shape timed in the same interleaved group, pair by pair (``harness.sweep.plan.group_key``).

    Returns:
        :data:`EAGER_COLUMNS`: ``paired_vs_eager`` (median over rounds of that backend's time / the eager
        time of the same round; below 1 is faster) with its bootstrap interval, ``eager_ms`` and
        ``median_ms`` over the common rounds, ``noisy`` (why either side's last timing crossed a
        threshold of :mod:`harness.timing.noise`, ``""`` when quiet). Runs that timed the backends in separate groups
        (older runs) give no rows: their "vs eager" is unpaired (``tables.backend_table``).
    """
    rows = paired_rows(df)
    why = noise_by_case(df, df.attrs.get("noise_thresholds"), by_session=True)
    out = []
    for gk, g in rows.groupby([*EAGER_KEYS, "attempt"], dropna=False, sort=False):
        eager_rows = g[g["backend"].map(plain).astype(bool)]
        eager = eager_rows.groupby("pair")["value"].median()
        if eager.empty:
            continue
        for (backend, cm, sc), o in _own(g[~g["backend"].map(plain).astype(bool)]).groupby(
                ["backend", "compile_mode", "compile_scope"], sort=False):
            other = o.groupby("pair")["value"].median()
            common = other.index.intersection(eager.index).sort_values()
            if common.empty:
                continue
            ratio, lo, hi = ratio_interval(eager[common].tolist(), other[common].tolist(),
                                           interval_label(o)[0], n_boot=n_boot, seed=seed, boot_conf=conf)
            reasons = [f"{side}: {r}" for side, rows_ in ((backend, o), ("eager", eager_rows))
                       for r in why.get((rows_["case_key"].iloc[0], rows_["session"].iloc[0]), [])]
            out.append({**dict(zip(EAGER_KEYS, gk[:-1])), "backend": backend, "compile_mode": cm, "compile_scope": sc,
                        "pairs": len(common), "eager_ms": float(eager[common].median()),
                        "median_ms": float(other[common].median()), "paired_vs_eager": ratio,
                        "paired_vs_eager_lo": lo, "paired_vs_eager_hi": hi, "noisy": "; ".join(reasons)})
    if not out:
        return pd.DataFrame(columns=EAGER_COLUMNS)
    return pd.DataFrame(out)[EAGER_COLUMNS].reset_index(drop=True)


#: Columns of :func:`paired_scope_table`.
SCOPE_COLUMNS = [*(k for k in EAGER_KEYS if k != "resume_unit"), "compile_mode", "pairs", "model_ms",
                 "layer_ms", "layer_vs_model", "layer_vs_model_lo", "layer_vs_model_hi", "noisy"]


def paired_scope_table(df: pd.DataFrame, n_boot: int = 2000, conf: float = CONF,
                       seed: int = 0) -> pd.DataFrame:
    """Each router's layer-scope compiled step against its model-scope compiled step of the same
    compile mode and shape, timed in the same interleaved group, pair by pair.

    Returns:
        :data:`SCOPE_COLUMNS`: ``layer_vs_model`` (median over rounds of the layer-scope time /
        the model-scope time of the same round; below 1 is faster) with its bootstrap interval,
        ``model_ms`` and ``layer_ms`` over the common rounds, ``noisy`` as in
        :func:`paired_vs_eager_table`. Groups that timed one scope only give no rows.
    """
    rows = paired_rows(df)
    rows = rows[rows["backend"].map(compiles).astype(bool)]
    why = noise_by_case(df, df.attrs.get("noise_thresholds"), by_session=True)
    out = []
    for gk, g in rows.groupby([*EAGER_KEYS, "compile_mode", "attempt"], dropna=False, sort=False):
        sides = {sc: g[g["compile_scope"] == sc] for sc in ("model", "layer")}
        if any(v.empty for v in sides.values()):
            continue
        t = {sc: v.groupby("pair")["value"].median() for sc, v in sides.items()}
        common = t["model"].index.intersection(t["layer"].index).sort_values()
        if common.empty:
            continue
        ratio, lo, hi = ratio_interval(t["model"][common].tolist(), t["layer"][common].tolist(),
                                       interval_label(sides["layer"])[0], n_boot=n_boot, seed=seed, boot_conf=conf)
        reasons = [f"{sc}: {r}" for sc, v in sides.items()
                   for r in why.get((v["case_key"].iloc[0], v["session"].iloc[0]), [])]
        out.append({**dict(zip([*EAGER_KEYS, "compile_mode"], gk[:-1])), "pairs": len(common),
                    "model_ms": float(t["model"][common].median()), "layer_ms": float(t["layer"][common].median()),
                    "layer_vs_model": ratio, "layer_vs_model_lo": lo, "layer_vs_model_hi": hi,
                    "noisy": "; ".join(reasons)})
    if not out:
        return pd.DataFrame(columns=SCOPE_COLUMNS)
    return pd.DataFrame(out)[SCOPE_COLUMNS].reset_index(drop=True)


def noise_by_case(df: pd.DataFrame, thresholds: dict | None = None,
                  by_session: bool = False) -> dict:
    """case key -> why its last timing was noisy (:func:`harness.timing.noise.noise_reasons` of its
    noise readings under ``thresholds``, default :data:`harness.timing.noise.THRESHOLDS`; a timing
    that stopped ``precise`` is judged by the machine's readings alone); quiet cases
    and cases without readings (records from before noise was measured) are absent. Readings of
    different sessions are judged apart (a benchmark JSON times prenorm once per benchmark, each
    its own session): with ``by_session`` the keys are ``(case key, session)``, else a case's
    reasons are those of every session where it was noisy."""
    readings = df[df["metric"].isin(list(noise.UNITS)) & (df["status"] == "ok") & df["value"].notna()]
    stops = df[(df["metric"] == "step_time") & (df["stop"] == "precise")] if "stop" in df else df.iloc[:0]
    precise = set(zip(stops["case_key"], stops["session"], stops["attempt"]))
    out: dict = {}
    for (key, session), g in readings.groupby(["case_key", "session"], sort=False):
        last = g["attempt"].max() if "attempt" in g else None
        reasons = noise.noise_reasons(dict(zip(g["metric"], g["value"])), thresholds or noise.THRESHOLDS,
                                      precise=(key, session, last) in precise)
        if not reasons:
            continue
        if by_session:
            out[(key, session)] = reasons
        else:
            out.setdefault(key, [])
            out[key] += [r for r in reasons if r not in out[key]]
    return out


def _panel(t: pd.DataFrame) -> pd.Series:
    """One panel per setting and shape; only the shape columns that vary are named."""
    label = t["mode"] + " · " + t.apply(frame.backend_text, axis=1) if len(t) else t["mode"]
    if t["workload"].nunique() > 1:
        label = label + " · " + t["workload"]
    for col, short in (("d_model", "d"), ("n_layers", "L"), ("seq_len", "T"),
                       ("batch_size", "B"), ("dtype", "")):
        if t[col].nunique() > 1 or col in ("d_model", "n_layers"):
            label = label + f" {short}" + t[col].astype(str)
    return label


#: Inches per router row of :func:`paired_ratio_figure`: the panels of a row come to the
#: report's width (``MAX_WIDTH_PX``) at 110 dpi, so its text is printed at 8-9 pt and never
#: scaled down (a 3×3 grid of 13 routers was once 3,900 px wide, shown at 5 px text).
PANEL_ROW_IN = 0.22
#: Inches of a panel's plot, and per character of its longest router label (8 pt) beside it.
PANEL_WIDTH_IN = 2.0
LABEL_CHAR_IN = 0.055
#: Inches of the page at 110 dpi (1,200 px).
PAGE_IN = 10.9


def _draw(data: pd.DataFrame, runs: list[str], palette: dict, **_) -> None:
    """Points at each ratio with its interval as error bars; runs dodged along y."""
    ax = plt.gca()
    variants = sorted(data["variant"].unique())
    y0 = data["variant"].map({v: i for i, v in enumerate(variants)}).astype(float)
    present = [r for r in runs if r in set(data["run_id"])]
    for j, run in enumerate(present):
        d = data["run_id"] == run
        off = (j - (len(present) - 1) / 2) * 0.5 / max(len(present), 1)
        r = data.loc[d, "ratio"].astype(float)
        err = [(r - data.loc[d, "ratio_lo"].astype(float)).clip(lower=0),
               (data.loc[d, "ratio_hi"].astype(float) - r).clip(lower=0)]
        ax.errorbar(r, y0[d] + off, xerr=err, fmt="o", capsize=3, color=palette[run], label=run)
    ax.axvline(1.0, color="0.4", linestyle="--", linewidth=1)
    ax.set_yticks(range(len(variants)), variants)
    ax.set_ylim(len(variants) - 0.5, -0.5)  # first variant on top


def paired_ratio_figure(df: pd.DataFrame, out_dir: Path | str,
                        table: pd.DataFrame | None = None) -> Path | None:
    """Per-pair ratio to prenorm with its bootstrap interval, one panel per setting and shape.

    With two or more runs holding the same cases (:data:`SAME_CASE`), only those cases are drawn
    and the runs sit side by side (hue = run id): agreement between runs is shown, not tested.
    With one run, every paired router of it.

    Returns:
        ``<out_dir>/paired_ratios.png``, or ``None`` without paired rows.
    """
    t = paired_ratio_table(df) if table is None else table
    if t.empty:
        return None
    return save_png(paired_ratio_grid(t), Path(out_dir) / "paired_ratios.png", 110)


def paired_ratio_grid(table: pd.DataFrame, xlabel: str = "step time / prenorm (×, log)",
                      title: str = "Per-pair step-time ratio to prenorm") -> plt.Figure:
    """The figure of :func:`paired_ratio_figure` from a non-empty :func:`paired_ratio_table` (or
    a table of the same columns against another baseline, ``xlabel`` and ``title`` naming it):
    three panels of :data:`PANEL_WIDTH_IN` to a row, a run legend only for two or more runs."""
    t = table.copy()
    shared = t.groupby(list(SAME_CASE), dropna=False)["run_id"].transform("nunique") > 1
    compare = bool(shared.any())
    if compare:
        t = t[shared]
    t["panel"] = _panel(t)
    runs = sorted(t["run_id"].unique())
    palette = dict(zip(runs, sns.color_palette("tab10" if len(runs) <= 10 else "husl", len(runs))))
    n_panels = t["panel"].nunique()
    rows = t.groupby("panel")["variant"].nunique().max()
    height = PANEL_ROW_IN * rows + 1.2  # inches: the panels of a row fill the page at 110 dpi
    width = PANEL_WIDTH_IN + LABEL_CHAR_IN * t["variant"].str.len().max()  # long options: fewer a row
    with plt.rc_context({"xtick.labelsize": 8, "ytick.labelsize": 8}):  # before the grid's layout
        g = sns.FacetGrid(t, col="panel", col_wrap=max(1, min(3, n_panels, int(PAGE_IN // width))),
                          sharex=False, sharey=False, height=height, aspect=width / height)
        g.map_dataframe(_draw, runs=runs, palette=palette)
    g.set_titles("{col_name}", size=9)
    shared_ratio_axes(g.axes.flat, "x")  # one log axis: panels read against each other
    g.set_axis_labels(xlabel, "")
    if len(runs) > 1:  # a legend of one run says nothing the title does not
        seen: dict = {}
        for ax in g.axes.flat:
            for h, lbl in zip(*ax.get_legend_handles_labels()):
                seen.setdefault(lbl, h)
        g.figure.legend(list(seen.values()), list(seen), title="run", loc="upper left",
                        bbox_to_anchor=(1.0, 0.95), frameon=False, fontsize=8)
    g.figure.suptitle(f"{title}: median and {CONF:.0%} bootstrap CI, one log axis"
                      + (", repeated runs side by side" if compare else "")
                      + (f" (run {runs[0]})" if len(runs) == 1 else ""), y=1.02, fontsize=10)
    return g.figure


#: Figures of this module, by name (the report adds them to :data:`reports.time_figures.FIGURES`).
FIGURES = {"paired_ratios": paired_ratio_figure}

__all__ = ["paired_rows", "paired_ratio_table", "paired_ratio_figure", "paired_ratio_grid", "FIGURES", "COLUMN_STYLE",
           "METHOD", "NO_DATA", "NO_TABLE"]
