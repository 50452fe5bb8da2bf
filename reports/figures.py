"""Seaborn figures of a run's tables, saved as PNG files.

Each function takes the long frame of :func:`reports.tables.load_frame` and an output directory, and
returns the path of the PNG it wrote, or ``None`` when the runs hold no data for it (the report then
says so in a sentence). Figures use the ``variant`` label (router, impl when several, options) as
hue, with one colour per variant across all figures of a report.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")  # files only; never open a window (CI, SSH, CUDA boxes without a display)

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

from . import tables  # noqa: E402

DPI = 110

#: Why a figure is missing, by figure name; the report prints this in its place.
NO_DATA = {
    "step_time_overhead_vs_width": "No data for this figure: it needs step times of prenorm and "
                                   "another router at two or more widths (d_model).",
    "flops_vs_depth": "No data for this figure: it needs fvcore forward FLOP counts at two or more "
                      "depths (n_layers).",
    "loss_curves": "No data for this figure: these runs hold no training evaluations "
                   "(mode \"train\", metric val_loss).",
    "compile_vs_eager": "No data for this figure: no compile or cudagraph step times yet; it "
                        "appears once a sweep includes those backends.",
}


def _save(fig: plt.Figure, out_dir: Path | str, name: str) -> Path:
    path = Path(out_dir) / f"{name}.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI, bbox_inches="tight")
    plt.close(fig)
    return path


def _hue(df: pd.DataFrame, data: pd.DataFrame) -> dict:
    """Hue arguments for ``data``: one colour per variant of the whole frame ``df``, so a router
    keeps its colour in every figure of a report; prenorm first."""
    variants = sorted(df["variant"].unique(), key=lambda v: (not v.startswith(tables.BASELINE), v))
    colors = sns.color_palette("tab10" if len(variants) <= 10 else "husl", len(variants))
    present = set(data["variant"])
    return {"hue": "variant", "hue_order": [v for v in variants if v in present],
            "palette": dict(zip(variants, colors))}


def _ticks(g, values, log2: bool) -> None:
    """Ticks at the measured values only (widths and depths are a few powers of two)."""
    values = sorted(float(v) for v in pd.unique(values))
    for ax in g.axes.flat:
        if log2:
            ax.set_xscale("log", base=2)
        ax.set_xticks(values, [f"{v:g}" for v in values])
        ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())


def _backend_label(frame: pd.DataFrame) -> pd.Series:
    return frame["backend"].where(frame["compile_mode"] == "",
                                  frame["backend"] + ":" + frame["compile_mode"])


def _facet(frame: pd.DataFrame, col: str) -> str | None:
    """Use ``col`` as a facet only when it takes several values."""
    return col if frame[col].nunique() > 1 else None


def step_time_overhead_vs_width(df: pd.DataFrame, out_dir: Path | str) -> Path | None:
    """Step-time overhead vs prenorm (%) against d_model, one line per router.

    Style = mode (with the backend, and the run, when several), columns = n_layers, rows =
    workload when both decoder and router-only ran; a dashed zero line marks prenorm.

    Returns:
        ``<out_dir>/step_time_overhead_vs_width.png``, or ``None`` when no non-prenorm case has an
        overhead or fewer than two widths were measured.
    """
    t = tables.overhead_table(df)
    t = t[(t["router"] != tables.BASELINE) & t["overhead_pct"].notna()].copy()
    if t.empty or t["d_model"].nunique() < 2:
        return None
    backend = _backend_label(t)
    t["setting"] = t["mode"] + (", " + backend if backend.nunique() > 1 else "")
    if t["run_id"].nunique() > 1:  # never average two runs (maybe two machines) into one line
        t["setting"] = t["setting"] + ", " + t["run_id"]
    t["overhead_pct"] = t["overhead_pct"].astype(float)
    t["d_model"] = t["d_model"].astype(float)
    hue = _hue(df, t)
    g = sns.relplot(data=t, kind="line", x="d_model", y="overhead_pct", **hue,
                    style="setting", col=_facet(t, "n_layers"), row=_facet(t, "workload"),
                    markers=True, dashes=False, height=3.2, aspect=1.3,
                    facet_kws={"sharey": False})
    g.refline(y=0, color="0.4", linestyle="--", linewidth=1)
    _ticks(g, t["d_model"], log2=True)
    g.set_axis_labels("d_model", "step-time overhead vs prenorm (%)")
    g.figure.suptitle("Step-time overhead vs prenorm by width (median of repeats)", y=1.03)
    return _save(g.figure, out_dir, "step_time_overhead_vs_width")


def flops_vs_depth(df: pd.DataFrame, out_dir: Path | str) -> Path | None:
    """Forward GFLOP (fvcore, FLOP = 2·FMA) against n_layers, one line per router, a column per
    d_model, a row per workload when several; log y.

    Returns:
        ``<out_dir>/flops_vs_depth.png``, or ``None`` with fewer than two depths counted.
    """
    t = tables.overhead_table(df)
    keys = ["variant", "workload", "d_model", "n_layers"]
    t = t[t["gflop_fwd"].notna()].groupby(keys, as_index=False)["gflop_fwd"].median()
    if t.empty or t["n_layers"].nunique() < 2:
        return None
    t["n_layers"] = t["n_layers"].astype(float)
    g = sns.relplot(data=t, kind="line", x="n_layers", y="gflop_fwd", **_hue(df, t),
                    col=_facet(t, "d_model"), row=_facet(t, "workload"), markers=True,
                    height=3.2, aspect=1.2, facet_kws={"sharey": False})
    g.set(yscale="log")
    _ticks(g, t["n_layers"], log2=False)
    for ax in g.axes.flat:
        ax.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
        ax.yaxis.set_minor_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
    g.set_axis_labels("n_layers", "forward GFLOP")
    g.figure.suptitle(f"Forward FLOPs by depth ({tables.FLOP_CONVENTION})", y=1.03)
    return _save(g.figure, out_dir, "flops_vs_depth")


def _curves(df: pd.DataFrame) -> pd.DataFrame:
    tr = df[(df["mode"] == tables.TRAIN_MODE) & (df["status"] == "ok") & df["value"].notna()]
    tr = tr[tr["metric"].isin(["val_loss", "elapsed", "tokens"])]
    if tr.empty:
        return pd.DataFrame()
    keys = ["run_id", "case_key", "variant", "seed", "repeat"]
    tr = tr.assign(seed=tr["seed"].fillna(-1))
    wide = tr.pivot_table(index=keys, columns="metric", values="value", aggfunc="last")
    wide = wide.reset_index()
    if "val_loss" not in wide:
        return pd.DataFrame()
    return wide[wide["val_loss"].notna()]


def loss_curves(df: pd.DataFrame, out_dir: Path | str) -> Path | None:
    """Validation loss against tokens seen and against training wall time (two panels), one line
    per run (hue = router), a dashed horizontal line at each target loss labelled "target".

    Returns:
        ``<out_dir>/loss_curves.png``, or ``None`` without ``val_loss`` rows of mode ``train``.
    """
    w = _curves(df)
    if w.empty:
        return None
    w["seed"] = w["seed"].astype(str)
    w["run"] = w["run_id"] + "/" + w["case_key"]
    panels = [(x, lbl) for x, lbl in (("tokens", "tokens seen"), ("elapsed", "training time (s)"))
              if x in w and w[x].notna().any()]
    if not panels:
        panels = [("repeat", "optimizer step")]
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 3.6), squeeze=False)
    targets = tables.ok_rows(df[df["mode"] == tables.TRAIN_MODE], "target_loss")["value"].unique()
    for ax, (x, label) in zip(axes[0], panels):
        d = w[w[x].notna()].sort_values(["run", x])
        sns.lineplot(data=d, x=x, y="val_loss", **_hue(df, w), units="run", estimator=None,
                     marker="o", markersize=3, ax=ax, legend=ax is axes[0][-1])
        for i, target in enumerate(np.sort(targets)):
            ax.axhline(target, color="0.3", linestyle="--", linewidth=1,
                       label="target" if i == 0 else None)
        ax.set_xlabel(label)
        ax.set_ylabel("validation loss (nats)")
    leg_ax = axes[0][-1]
    leg_ax.legend(*leg_ax.get_legend_handles_labels(), loc="upper left", bbox_to_anchor=(1.02, 1),
                  frameon=False)
    fig.suptitle("Validation loss in the time-to-target race")
    fig.tight_layout()
    return _save(fig, out_dir, "loss_curves")


def compile_vs_eager(df: pd.DataFrame, out_dir: Path | str) -> Path | None:
    """Median step time per router under eager and each compile/cudagraph setting (bars; error
    bars = IQR of the repeats). One panel per run, mode and workload, at the largest shape
    (d_model × n_layers) that ran under a non-eager backend; only routers that did.

    Returns:
        ``<out_dir>/compile_vs_eager.png``, or ``None`` when no compile or cudagraph step times
        were measured.
    """
    st = tables.ok_rows(tables.cost_rows(df), "step_time").copy()
    if st.empty or not (st["backend"] != "eager").any():
        return None
    st["value"] = st["value"] * st["unit"].map(tables.TO_MS).fillna(1.0)
    st["setting"] = _backend_label(st)
    st["size"] = st["d_model"].astype(float) * st["n_layers"].astype(float)
    shape = [c for c in tables.SHAPE_COLS if c != "dtype"]
    panels = []
    several = st["run_id"].nunique() > 1
    for _, g in st.groupby(["run_id", "mode", "workload"], sort=True):
        compiled = g[g["backend"] != "eager"]
        if compiled.empty:
            continue
        top = compiled.sort_values(["size", *shape]).iloc[-1]
        g = g[(g[shape] == top[shape]).all(axis=1) & g["variant"].isin(compiled["variant"])]
        panels.append(g.assign(panel=(f"{top['run_id']} · " if several else "")
                               + f"{top['mode']} · {top['workload']} · d{top['d_model']} "
                               f"L{top['n_layers']}"))
    st = pd.concat(panels)
    order = ["eager"] + sorted(s for s in st["setting"].unique() if s != "eager")
    hue = _hue(df, st)
    g = sns.catplot(data=st, kind="bar", x="variant", y="value", order=hue["hue_order"],
                    hue="setting", hue_order=order, col="panel",
                    col_wrap=min(3, st["panel"].nunique()), estimator="median",
                    errorbar=("pi", 50), height=3.4, aspect=1.3, sharey=False, sharex=False)
    g.set_axis_labels("", "step time (ms, median)")
    g.set_titles("{col_name}")
    for ax in g.axes.flat:
        ax.tick_params(axis="x", labelrotation=30)
    g.figure.suptitle("Eager vs compiled step time (largest compiled shape)", y=1.03)
    return _save(g.figure, out_dir, "compile_vs_eager")


#: Figure functions in report order.
FIGURES = {
    "step_time_overhead_vs_width": step_time_overhead_vs_width,
    "flops_vs_depth": flops_vs_depth,
    "compile_vs_eager": compile_vs_eager,
    "loss_curves": loss_curves,
}
