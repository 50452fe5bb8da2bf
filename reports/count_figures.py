"""Figures of what the cost sweep counted: forward FLOPs vs depth, the router's FLOP share vs width
(counted beside analytic), saved activations and router state vs depth as multiples of prenorm,
and the routers' I/O models beside their measured traffic. Each takes the frame of
:func:`reports.frame.load_frame` and an output directory and returns the PNG it wrote (with the
CSV of its numbers beside it), or ``None`` when the runs hold no data for it (:data:`NO_DATA`
says why, in the report)."""

from __future__ import annotations

from pathlib import Path

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")  # files only; never open a window (CI, SSH, CUDA boxes without a display)

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

from harness.step.backends import plain  # noqa: E402
from routers import BASELINE  # noqa: E402
from routers.api import NOT_DECLARED  # noqa: E402
from routers.impls import REFERENCE  # noqa: E402

from . import frame, tables  # noqa: E402
from . import plotting as pl  # noqa: E402

#: Why a figure is missing, by figure name; the report prints this in its place.
NO_DATA = {
    "flops_vs_depth": "No data for this figure: it needs fvcore forward FLOP counts at two or more "
                      "depths (n_layers).",
    "router_flop_share_vs_width": "No data for this figure: it needs router and forward FLOP "
                                  "counts (fvcore, --flops) at two or more widths (d_model).",
    "memory_vs_depth": "No data for this figure: it needs saved activations (eager fwd_bwd) or "
                       "router state of prenorm and another router at two or more depths "
                       "(n_layers).",
    "router_cost_models": "No data for this figure: these runs hold no router cost-model rows "
                          "(router_io_ideal, router_io_measured).",
}


def flops_vs_depth(df: pd.DataFrame, out_dir: Path | str) -> Path | None:
    """Forward GFLOP (fvcore, FLOP = 2·FMA) against n_layers, one line per router, a column per
    d_model, a row per workload when several; log y.

    Returns:
        ``<out_dir>/flops_vs_depth.png`` with ``flops_vs_depth.csv`` (the medians drawn: the
        router, ``options``, ``impl``, ``variant``, ``workload``, ``d_model``, ``n_layers``,
        ``gflop_fwd``), or ``None`` with
        fewer than two depths counted.
    """
    t = tables.overhead_table(df)
    keys = ["router", "options", "impl", "variant", "workload", "d_model", "n_layers"]
    t = t[t["gflop_fwd"].notna()]
    shape = pl.shape_text(t, skip=("d_model", "n_layers"))
    t = t.groupby(keys, as_index=False)["gflop_fwd"].median()
    if t.empty or t["n_layers"].nunique() < 2:
        return None
    data = t.copy()
    t["n_layers"] = t["n_layers"].astype(float)
    g = sns.relplot(data=t, kind="line", x="n_layers", y="gflop_fwd", **pl.variant_hue(df, t),
                    col=pl.facet(t, "d_model"), row=pl.facet(t, "workload"), markers=True,
                    height=3.2, aspect=1.2, facet_kws={"sharey": False})
    g.set(yscale="log")
    pl.measured_ticks(g, t["n_layers"], log2=False)
    for ax in g.axes.flat:
        ax.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
        ax.yaxis.set_minor_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
    g.set_axis_labels("n_layers (decoder blocks)", "forward GFLOP (10⁹ FLOP, log scale)")
    g.figure.suptitle(f"Forward FLOPs by depth — {pl.device_title(df)}\n{shape}; "
                      f"{tables.FLOP_CONVENTION}", y=1.08, fontsize=10)
    return pl.save_with_data(g.figure, out_dir, "flops_vs_depth", data)


def router_flop_share_vs_width(df: pd.DataFrame, out_dir: Path | str) -> Path | None:
    """The router's share (%) of the forward FLOPs against d_model at the largest n_layers:
    counted (fvcore router FMA / forward FMA, ``router_flop_pct`` of
    :func:`reports.tables.overhead_table`; solid, one line per router and impl) beside analytic
    (:func:`reports.tables.router_cost_table`'s FLOP per token × B·T / the fvcore forward FLOPs of
    the naive impl; dotted, one line per router). The router's mixing grows like L·d per token
    and the matrices like d², so the share should fall with width: the amortisation the HAARES
    paper claims.

    Returns:
        ``<out_dir>/router_flop_share_vs_width.png`` with its CSV (``source`` = counted or
        analytic, the router, impl and shape, ``router_flop_pct``, ``gflop_fwd`` and, analytic,
        ``flop_per_token``), or ``None`` without router FLOP counts at two or more widths.
    """
    ov = tables.overhead_table(df)
    ov = ov[ov["router_flop_pct"].notna()]
    if ov.empty:
        return None
    static = list(frame.STATIC_KEYS)
    counted = ov.groupby(static, as_index=False)[["router_flop_pct", "gflop_fwd"]].median()
    counted["source"] = "counted (fvcore)"
    analytic = tables.router_cost_table(df).drop(columns=["io_ideal_d", "io_measured_d",
                                                          "io_kernel_d", "state_mib"])
    analytic = analytic[analytic["flop_per_token"].notna()].merge(
        counted[[*static, "gflop_fwd"]], on=static)
    # the analytic count is the naive reference: one line per router, over naive's forward FLOPs
    analytic = (analytic.assign(_ref=analytic["impl"] != REFERENCE)
                .sort_values("_ref", kind="stable")
                .drop_duplicates([k for k in static if k not in ("impl", "variant")])
                .drop(columns="_ref"))
    tokens = (analytic["batch_size"] * analytic["seq_len"]).astype(float)
    analytic["router_flop_pct"] = (analytic["flop_per_token"].astype(float) * tokens
                                   / (analytic["gflop_fwd"].astype(float) * 1e9) * 100)
    analytic["source"] = "analytic"
    t = pd.concat([counted, analytic], ignore_index=True)
    keys = ["workload", *(c for c in frame.SHAPE_COLS if c not in ("d_model", "n_layers"))]
    data = pl.largest(t, keys, "d_model", "n_layers")
    if data.empty:
        return None
    data = data.assign(family=pl.family(data))
    data["panel"] = data["workload"] + (" · " + data[keys[1:]].astype(str).agg(" ".join, axis=1)
                                        if data.groupby(keys).ngroups > 1 else "")
    data["panel"] = data["panel"] + " · L=" + data["n_layers"].astype(str)
    palette = pl.family_palette(df)
    fig, axes = pl.panel_grid(data["panel"].nunique(), width=5.2, height=3.8)
    for ax, (panel, g) in zip(axes, data.groupby("panel", sort=False)):
        for (family, source, impl), line in g.groupby(["family", "source", "impl"], sort=True):
            line = line.sort_values("d_model")
            counted_line = source != "analytic"
            ax.plot(line["d_model"].astype(float), line["router_flop_pct"],
                    color=palette[family], linestyle="-" if counted_line else ":",
                    marker=pl.IMPL_MARKERS.get(impl, "^") if counted_line else "x",
                    markersize=4 if counted_line else 8, linewidth=1.4 if counted_line else 2,
                    zorder=2 if counted_line else 3,  # on top: it often hides naive's count
                    label=f"{family} · {impl}, counted" if counted_line
                    else f"{family}, analytic")
        pl.x_ticks(ax, g["d_model"], log2=True)
        ax.set_ylim(bottom=0)
        ax.set_title(panel, fontsize=9)
        ax.set_xlabel("d_model (features per token, log₂ scale)")
        ax.set_ylabel("router FLOPs / forward FLOPs (%)")
    pl.figure_legend(fig, axes)
    pl.suptitle(fig, "Router share of the forward FLOPs vs width: the amortisation the HAARES "
                   f"paper claims — {pl.device_title(df)}",
              f"{pl.fixed_text(data, 'n_layers')}, {pl.shape_text(data, skip=('d_model', 'n_layers'))}",
              f"solid: counted (fvcore), dotted: analytic; {tables.FLOP_CONVENTION}")
    fig.tight_layout()
    cols = ["source", "router", "options", "impl", "variant", "workload", *frame.SHAPE_COLS,
            "router_flop_pct", "gflop_fwd", "flop_per_token"]
    return pl.save_with_data(fig, out_dir, "router_flop_share_vs_width", data[cols])


#: The quantities of :func:`memory_vs_depth`: (column of the overhead table, axis label).
_MEMORY = (("saved_mib", "saved activations / prenorm's (×)"),
           ("router_state_mib", "peak router state / prenorm's (×)"))


def memory_vs_depth(df: pd.DataFrame, out_dir: Path | str) -> Path | None:
    """Saved activations (autograd, eager fwd_bwd) and peak router state as multiples of
    prenorm's at the same shape, against n_layers at the largest d_model: two panels, one line
    per router and impl (a router keeps one colour; naive solid, two_phase dashed, lean
    dotted), prenorm the flat line at 1. Eager rows only; both are counts, not timings, so runs are not told apart.

    Returns:
        ``<out_dir>/memory_vs_depth.png`` with ``memory_vs_depth.csv`` (``quantity``, the router,
        impl and shape, ``mib``, ``prenorm_mib`` and ``multiple`` = mib / prenorm_mib), or
        ``None`` without either quantity of prenorm and another router at two or more depths.
    """
    ov = tables.overhead_table(df)
    ov = ov[ov["backend"].map(plain).astype(bool)]
    static = list(frame.STATIC_KEYS)
    shape = ["workload", *frame.SHAPE_COLS]
    parts = []
    for col, _ in _MEMORY:
        m = ov[ov[col].notna()].groupby(static, as_index=False)[col].median()
        m = m.rename(columns={col: "mib"})
        base = m[m["router"] == BASELINE].groupby(shape)["mib"].median()
        m = m.merge(base.rename("prenorm_mib").reset_index(), on=shape)
        m["multiple"] = (m["mib"] / m["prenorm_mib"]).replace([np.inf, -np.inf], np.nan)
        if (m["router"] != BASELINE).any():
            parts.append(m.assign(quantity=col))
    if not parts:
        return None
    keys = ["quantity", "workload", *(c for c in frame.SHAPE_COLS
                                      if c not in ("d_model", "n_layers"))]
    data = pl.largest(pd.concat(parts, ignore_index=True), keys, "n_layers", "d_model")
    if data.empty:
        return None
    data = data.assign(family=pl.family(data))
    labels = dict(_MEMORY)
    palette = pl.family_palette(df)
    panels = list(data.groupby(keys, sort=False))
    fig, axes = pl.panel_grid(len(panels))
    for ax, (key, g) in zip(axes, panels):
        for (family, impl), line in g.groupby(["family", "impl"], sort=True):
            line = line.sort_values("n_layers")
            ax.plot(line["n_layers"].astype(float), line["multiple"], color=palette[family],
                    linestyle=pl.IMPL_LINES.get(impl, ":"), marker="o", markersize=4,
                    linewidth=1.4, label=f"{family} · {impl}")
        pl.x_ticks(ax, g["n_layers"], log2=False)
        ax.set_xlabel("n_layers (decoder blocks)")
        ax.set_ylabel(labels[key[0]])
        ax.set_title(f"{key[1]} · d={g['d_model'].iloc[0]}" + (
            f" · {pl.shape_text(g, skip=('d_model', 'n_layers'))}"
            if data.groupby(keys[1:]).ngroups > 1 else ""), fontsize=9)
    pl.figure_legend(fig, axes)
    pl.suptitle(fig, f"Memory vs depth as multiples of prenorm (eager) — {pl.device_title(df)}",
              f"{pl.fixed_text(data, 'd_model')}, {pl.shape_text(data, skip=('d_model', 'n_layers'))}")
    fig.tight_layout()
    cols = ["quantity", "router", "options", "impl", "variant", "workload", *frame.SHAPE_COLS,
            "mib", "prenorm_mib", "multiple"]
    return pl.save_with_data(fig, out_dir, "memory_vs_depth", data[cols])


def router_cost_models(df: pd.DataFrame, out_dir: Path | str) -> Path | None:
    """The routers' I/O cost models (:func:`reports.tables.router_cost_table`): per router the
    ideal residual traffic of one forward (``io_ideal_d``: each input read once, each output
    written once, the AttnRes paper's Table 1 model, the same for every impl) beside what each
    impl's forward moves by the byte rule (``io_measured_d``, docs/MEASUREMENT.md) and, for
    ``fused``, the part its Triton kernels load and store (``io_kernel_d``, their byte models), in
    d elements per token and sublayer, forward only; grouped bars, one panel per depth
    (the ideal grows with the number of sublayers) at the largest width.

    Returns:
        ``<out_dir>/router_cost_models.png`` with ``router_cost_models.csv`` (``series`` =
        ideal, measured or kernels, the router, impl and shape, ``d_elements``), or ``None``
        without router cost-model rows.
    """
    rc = tables.router_cost_table(df)
    rc = rc[rc["io_ideal_d"].notna() | rc["io_measured_d"].notna()]
    if rc.empty:
        return None
    others = [c for c in frame.SHAPE_COLS if c != "n_layers"]
    kept = []
    for _, g in rc.groupby("workload", sort=True):  # units of d: the largest width stands for all
        top = g.sort_values(others).iloc[-1]
        kept.append(g[(g[others] == top[others]).all(axis=1)])
    rc = pd.concat(kept)
    rc = rc.assign(family=pl.family(rc))
    ideal = (rc.assign(_ref=rc["impl"] != REFERENCE).sort_values("_ref", kind="stable")
             .drop_duplicates(["family", "workload", *frame.SHAPE_COLS])
             .assign(series="ideal I/O model", d_elements=lambda r: r["io_ideal_d"]))
    measured = rc.assign(series="measured, " + rc["impl"], d_elements=rc["io_measured_d"])
    kernels = rc.assign(series="kernels, " + rc["impl"], d_elements=rc["io_kernel_d"])  # fused only
    data = pd.concat([ideal, measured, kernels[kernels["d_elements"].notna()]], ignore_index=True)
    data = data[data["d_elements"].notna()]
    data["panel"] = data["workload"] + " · L=" + data["n_layers"].astype(str)
    series = ["ideal I/O model"] + sorted(s for s in data["series"].unique()
                                          if s != "ideal I/O model")
    colors = dict(zip(series, ["0.6", *sns.color_palette("colorblind", len(series) - 1)]))
    families = sorted(data["family"].unique(),
                      key=lambda f: (not f.startswith(BASELINE), f))
    fig, axes = pl.panel_grid(data["panel"].nunique(), width=max(4.6, 0.6 * len(families) + 1.4),
                      height=3.6)
    width = 0.8 / len(series)
    for ax, (panel, g) in zip(axes, data.sort_values("n_layers").groupby("panel", sort=False)):
        for j, s in enumerate(series):
            v = g[g["series"] == s].set_index("family")["d_elements"].reindex(families)
            bars = ax.bar(np.arange(len(families)) + (j - (len(series) - 1) / 2) * width,
                          v.astype(float), width=width, color=colors[s], label=s)
            ax.bar_label(bars, fmt="%.3g", fontsize=6, padding=1)
            if s == "ideal I/O model":  # a router without an ideal I/O model: said, not drawn as 0
                for i in np.flatnonzero(v.isna().to_numpy() & np.isin(families, g["family"].unique())):
                    ax.text(i + (j - (len(series) - 1) / 2) * width, 0, NOT_DECLARED, rotation=90, fontsize=6,
                            ha="center", va="bottom", color="0.4")
        ax.set_xticks(range(len(families)), families, rotation=30 if len(families) > 3 else 0,
                      ha="right" if len(families) > 3 else "center")
        ax.set_xlabel("router")
        ax.set_ylabel("traffic per token and sublayer (d elements)")
        ax.set_title(panel, fontsize=9)
    pl.figure_legend(fig, axes)
    pl.suptitle(fig, "Router I/O of one forward: ideal model (AttnRes paper, Table 1) vs counted "
                   f"traffic — {pl.device_title(df)}", pl.shape_text(data, skip=("n_layers",)))
    fig.tight_layout()
    cols = ["panel", "series", "router", "options", "impl", "workload", *frame.SHAPE_COLS,
            "d_elements"]
    return pl.save_with_data(fig, out_dir, "router_cost_models", data[cols])


#: Figure functions of this module in report order.
FIGURES = {
    "flops_vs_depth": flops_vs_depth,
    "router_flop_share_vs_width": router_flop_share_vs_width,
    "memory_vs_depth": memory_vs_depth,
    "router_cost_models": router_cost_models,
}
