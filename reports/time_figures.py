"""Step-time figures of the cost sweep: the paired ratio to prenorm vs width and vs depth (impls by
line style, routers by hue, bootstrap CIs as bars), the unpaired overhead vs width where no paired
timing exists, and compiled vs eager. Each takes the frame of :func:`reports.frame.load_frame`
and an output directory and returns the PNG it wrote (with the CSV of its numbers beside it), or
``None`` when the runs hold no data for it (:data:`NO_DATA` says why, in the report)."""

from __future__ import annotations

from pathlib import Path

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")  # files only; never open a window (CI, SSH, CUDA boxes without a display)

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

from harness.step.backends import compiles, plain  # noqa: E402
from routers import BASELINE  # noqa: E402

from . import frame, paired, tables  # noqa: E402
from . import plotting as pl  # noqa: E402

#: Why a figure is missing, by figure name; the report prints this in its place.
NO_DATA = {
    "step_time_overhead_vs_width": "No data for this figure: it needs step times of prenorm and "
                                   "another router at two or more widths (d_model).",
    "compile_vs_eager": "No data for this figure: no compile or cudagraph step times yet; it "
                        "appears once a sweep includes those backends.",
    "overhead_vs_width": "No data for this figure: it needs paired step times of prenorm and another "
                         "router at two or more widths (--widths, e.g. 64,128; the seeds suite has one).",
    "overhead_vs_depth": "No data for this figure: it needs paired step times of prenorm and another "
                         "router at two or more depths (--depths, e.g. 4,8).",
    "compile_time_vs_depth": "No data for this figure: it needs compile times (--backends compile) "
                             "of a router at two or more depths (n_layers).",
}


def step_time_overhead_vs_width(df: pd.DataFrame, out_dir: Path | str) -> Path | None:
    """Step-time overhead vs prenorm (%) against d_model, one line per router.

    Style = mode (with the backend, and the run, when several), columns = n_layers, rows =
    workload when both decoder and router-only ran; a dashed zero line marks prenorm.

    Returns:
        ``<out_dir>/step_time_overhead_vs_width.png`` with ``step_time_overhead_vs_width.csv``
        (the rows of :func:`reports.tables.overhead_table` drawn, with their ``setting``), or
        ``None`` when no non-prenorm case has an overhead or fewer than two widths were measured.
    """
    t = tables.overhead_table(df)
    t = t[(t["router"] != BASELINE) & t["overhead_pct"].notna()].copy()
    if t.empty or t["d_model"].nunique() < 2:
        return None
    backend = pl.backend_label(t)
    t["setting"] = t["mode"] + (", " + backend if backend.nunique() > 1 else "")
    if t["run_id"].nunique() > 1:  # never average two runs (maybe two machines) into one line
        t["setting"] = t["setting"] + ", " + t["run_id"]
    t["overhead_pct"] = t["overhead_pct"].astype(float)
    data = t.copy()
    t["d_model"] = t["d_model"].astype(float)
    hue = pl.variant_hue(df, t)
    g = sns.relplot(data=t, kind="line", x="d_model", y="overhead_pct", **hue,
                    style="setting", col=pl.facet(t, "n_layers"), row=pl.facet(t, "workload"),
                    markers=True, dashes=False, height=3.2, aspect=1.3,
                    facet_kws={"sharey": False})
    g.refline(y=0, color="0.4", linestyle="--", linewidth=1)
    pl.measured_ticks(g, t["d_model"], log2=True)
    g.set_axis_labels("d_model (features per token, log₂ scale)", "step-time overhead vs prenorm (%)")
    g.figure.suptitle("Step-time overhead vs prenorm by width, unpaired medians of repeats — "
                      f"{pl.device_title(df)}\n{pl.shape_text(t, skip=('d_model', 'n_layers'))}",
                      y=1.08, fontsize=10)
    return pl.save_with_data(g.figure, out_dir, "step_time_overhead_vs_width", data)


def _overhead_vs(df: pd.DataFrame, out_dir: Path | str, x: str, fixed: str, name: str,
                 xlabel: str, log2: bool) -> Path | None:
    t = paired.paired_ratio_table(df)
    if t.empty:
        return None
    keys = [*pl.PANEL_KEYS, *(c for c in frame.SHAPE_COLS if c not in (x, fixed))]
    data = pl.largest(t, keys, x, fixed)
    if data.empty:
        return None
    data = data.assign(family=pl.family(data))
    data.insert(0, "panel", pl.panel_label(data, keys, always=(fixed,)))
    palette = pl.family_palette(df)
    fig, axes = pl.panel_grid(data["panel"].nunique())
    for ax, (panel, g) in zip(axes, data.groupby("panel", sort=False)):
        lines = list(g.groupby(["family", "impl"], sort=True))
        span = float(g[x].max() - g[x].min())
        for k, ((family, impl), line) in enumerate(lines):
            line = line.sort_values(x)
            y = line["ratio"].astype(float)
            err = np.array([(y - line["ratio_lo"].astype(float)).clip(lower=0),
                            (line["ratio_hi"].astype(float) - y).clip(lower=0)])
            ax.errorbar(pl.dodge(line[x], k, len(lines), log2, span), y, yerr=err,
                        color=palette[family], linestyle=pl.IMPL_LINES.get(impl, ":"),
                        marker="o", markersize=4, capsize=3, linewidth=1.4,
                        label=f"{family} · {impl}")
        ax.axhline(1.0, color="0.4", linestyle="--", linewidth=1, label="prenorm (1×)")
        pl.x_ticks(ax, g[x], log2)
        ax.set_title(panel, fontsize=9)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("step time / prenorm (×, log scale)")
    pl.shared_ratio_axes(axes)
    pl.figure_legend(fig, axes)
    pl.suptitle(fig, f"Step time / prenorm vs {'width' if x == 'd_model' else 'depth'}: paired "
                   f"median, {paired.CONF:.0%} bootstrap CI — {pl.device_title(df)}",
              f"{pl.fixed_text(data, fixed)}, {pl.shape_text(data, skip=(x, fixed))}; naive solid, "
              "two_phase dashed, lean dotted")
    fig.tight_layout()
    return pl.save_with_data(fig, out_dir, name, data.drop(columns="family"))


def overhead_vs_width(df: pd.DataFrame, out_dir: Path | str) -> Path | None:
    """Paired step-time ratio to prenorm (:func:`reports.paired.paired_ratio_table`) with its
    bootstrap CI as error bars against d_model, at the largest n_layers; one panel per backend
    (and compile mode, mode, run), one line per router and impl: a router keeps one colour, its
    impls differ in line style (naive solid, two_phase dashed, lean dotted); a dashed line at 1.

    Returns:
        ``<out_dir>/overhead_vs_width.png`` with ``overhead_vs_width.csv`` (the paired rows drawn
        and their ``panel``), or ``None`` without paired rows at two or more widths.
    """
    return _overhead_vs(df, out_dir, "d_model", "n_layers", "overhead_vs_width",
                        "d_model (features per token, log₂ scale)", log2=True)


def overhead_vs_depth(df: pd.DataFrame, out_dir: Path | str) -> Path | None:
    """As :func:`overhead_vs_width` against n_layers, at the largest d_model.

    Returns:
        ``<out_dir>/overhead_vs_depth.png`` with ``overhead_vs_depth.csv``, or ``None`` without
        paired rows at two or more depths.
    """
    return _overhead_vs(df, out_dir, "n_layers", "d_model", "overhead_vs_depth",
                        "n_layers (decoder blocks)", log2=False)


def compile_vs_eager(df: pd.DataFrame, out_dir: Path | str) -> Path | None:
    """Compiled (and graph-replayed) / eager step time of each router and impl, one bar per
    setting, a line at 1: the paired ratio with its bootstrap CI as error bars
    (:func:`reports.paired.paired_vs_eager_table`) where the backends were timed in one group,
    else the unpaired ``vs_eager`` of :func:`reports.tables.backend_table`, said so on the axis.
    One panel per run, mode and workload, at the largest shape (d_model × n_layers) that ran
    under a non-eager backend; only routers that did.

    Returns:
        ``<out_dir>/compile_vs_eager.png`` with ``compile_vs_eager.csv`` (the backend-table rows
        drawn, with their ``label`` and ``panel``), or ``None`` when no compile or cudagraph step
        time has an eager one to compare with.
    """
    from .paired import paired_vs_eager_table
    pv = paired_vs_eager_table(df)
    is_paired = not pv.empty
    if is_paired:  # eager and compiled timed in one group: per-round ratios with their CI
        bt = pv.rename(columns={"paired_vs_eager": "vs_eager", "paired_vs_eager_lo": "lo",
                                "paired_vs_eager_hi": "hi"})
    else:  # older runs: the backends were timed apart, so only unpaired medians exist
        bt = tables.backend_table(df)
        bt = bt[~bt["backend"].map(plain).astype(bool) & bt["vs_eager"].notna()].copy()
        bt["lo"] = bt["hi"] = np.nan
    if bt.empty:
        return None
    bt["setting"] = pl.backend_label(bt)
    bt["label"] = pl.family(bt) + " · " + bt["impl"]
    bt["size"] = bt["d_model"].astype(float) * bt["n_layers"].astype(float)
    shape = [c for c in frame.SHAPE_COLS if c != "dtype"]
    several = bt["run_id"].nunique() > 1
    panels = []
    for _, g in bt.groupby(["run_id", "mode", "workload"], sort=True):
        top = g.sort_values(["size", *shape]).iloc[-1]
        g = g[(g[shape] == top[shape]).all(axis=1)]
        panels.append(g.assign(panel=(f"{top['run_id']} · " if several else "")
                               + f"{top['mode']} · {top['workload']} · d={top['d_model']} "
                               f"L={top['n_layers']}"))
    data = pd.concat(panels).drop(columns="size")
    settings = sorted(data["setting"].unique())
    colors = dict(zip(settings, sns.color_palette("colorblind", len(settings))))
    rows = max(g["label"].nunique() for _, g in data.groupby("panel"))
    fig, axes = pl.panel_grid(data["panel"].nunique(), width=5.2,
                      height=0.32 * rows * len(settings) + 1.4)
    for ax, (panel, g) in zip(axes, data.groupby("panel", sort=False)):
        labels = list(dict.fromkeys(g.assign(_base=g["router"] != BASELINE)
                                    .sort_values(["_base", "label"])["label"]))
        height = 0.8 / len(settings)
        for j, setting in enumerate(settings):
            s = g[g["setting"] == setting].set_index("label").reindex(labels)
            v = s["vs_eager"].astype(float)
            err = np.vstack([v - s["lo"].astype(float), s["hi"].astype(float) - v]) if is_paired else None
            bars = ax.barh(np.arange(len(labels)) + (j - (len(settings) - 1) / 2) * height,
                           v, height=height, color=colors[setting], label=setting, xerr=err,
                           error_kw={"elinewidth": 1, "capsize": 2, "ecolor": "0.2"})
            ax.bar_label(bars, fmt="%.2f", fontsize=7, padding=2)
        ax.axvline(1.0, color="0.4", linestyle="--", linewidth=1)
        ax.set_yticks(range(len(labels)), labels)
        ax.invert_yaxis()
        ax.set_xlabel("compiled / eager step time, median of per-round ratios (×; bars: 95 % "
                      "bootstrap CI; < 1 is faster)" if is_paired else
                      "compiled / eager median step time, unpaired (×; < 1 is faster)")
        ax.set_title(panel, fontsize=9)
    pl.figure_legend(fig, axes)
    pl.suptitle(fig, f"Compiled vs eager step time (largest compiled shape) — {pl.device_title(df)}",
              pl.shape_text(data))
    fig.tight_layout()
    return pl.save_with_data(fig, out_dir, "compile_vs_eager", data)


#: Line style of each compile scope in :func:`compile_time_vs_depth`.
SCOPE_LINES = {"layer": "-", "model": "--"}


def compile_time_vs_depth(df: pd.DataFrame, out_dir: Path | str) -> Path | None:
    """Compile time against n_layers, one line per router, impl and compile scope (the scope by
    line style, the router by hue, the impl by marker): the cost the layer scope keeps flat. The
    runs of the frame are drawn together (a cold compile per depth is a run of its own, each with
    a fresh ``TORCHINDUCTOR_CACHE_DIR``; the median where a point ran more than once); a hollow
    marker is a compile that hit Inductor's FX-graph cache (``fxgraph_cache_hit`` > 0: not cold).
    One panel per mode, compile mode and workload, at the widest width that ran compiled.

    Returns:
        ``<out_dir>/compile_time_vs_depth.png`` with ``compile_time_vs_depth.csv`` (the
        ``compile_time`` rows drawn, seconds, and ``warm``), or ``None`` without compile times
        at two or more depths.
    """
    t = frame.ok_rows(frame.cost_rows(df), "compile_time")
    t = t[t["backend"].map(compiles).astype(bool)]
    if t.empty:
        return None
    hits = df[(df["metric"] == "fxgraph_cache_hit") & (df["status"] == "ok")].groupby("case_key")["value"].max()
    t = t.assign(warm=t["case_key"].map(hits).fillna(0) > 0)
    keys = ["mode", "compile_mode", "workload", "router", "options", "impl", "compile_scope"]
    t = (t.groupby([*keys, "d_model", "n_layers"], dropna=False)
         .agg(compile_s=("value", "median"), warm=("warm", "any")).reset_index())
    t = pl.largest(t, keys, "n_layers", "d_model")
    if t.empty:
        return None
    t["panel"] = pl.panel_label(t.assign(backend="compile"), ["workload"])
    palette = pl.family_palette(t)
    fig, axes = pl.panel_grid(t["panel"].nunique())
    for ax, (panel, g) in zip(axes, t.groupby("panel", sort=False)):
        for (fam, impl, scope), line in g.assign(family=pl.family(g)).groupby(["family", "impl", "compile_scope"]):
            line = line.sort_values("n_layers")
            color, marker = palette.get(fam), pl.IMPL_MARKERS.get(impl, "o")
            ax.plot(line["n_layers"], line["compile_s"], color=color, linestyle=SCOPE_LINES.get(scope, ":"),
                    marker=marker, label=f"{fam} [{impl}] {scope}")
            warm = line[line["warm"]]
            ax.scatter(warm["n_layers"], warm["compile_s"], marker=marker, s=40, facecolors="white",
                       edgecolors=color, zorder=3)
        pl.x_ticks(ax, g["n_layers"], log2=False)
        ax.set_xlabel("n_layers (decoder blocks)")
        ax.set_ylabel("compile time (s; first call, compile included)")
        ax.set_title(panel, fontsize=9)
    pl.figure_legend(fig, axes)
    pl.suptitle(fig, f"Compile time vs depth by compile scope — {pl.device_title(df)}",
                f"d={pl.fixed_text(t, 'd_model')}; layer scope solid, model scope dashed; "
                "hollow: the compile hit Inductor's cache")
    fig.tight_layout()
    return pl.save_with_data(fig, out_dir, "compile_time_vs_depth",
                             t[["panel", *keys, "d_model", "n_layers", "compile_s", "warm"]])


#: Figure functions of this module in report order.
FIGURES = {
    "step_time_overhead_vs_width": step_time_overhead_vs_width,
    "overhead_vs_width": overhead_vs_width,
    "overhead_vs_depth": overhead_vs_depth,
    "compile_vs_eager": compile_vs_eager,
    "compile_time_vs_depth": compile_time_vs_depth,
}
