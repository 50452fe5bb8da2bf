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

from . import tables, training  # noqa: E402

DPI = 110

#: Why a figure is missing, by figure name; the report prints this in its place.
NO_DATA = {
    "step_time_overhead_vs_width": "No data for this figure: it needs step times of prenorm and "
                                   "another router at two or more widths (d_model).",
    "flops_vs_depth": "No data for this figure: it needs fvcore forward FLOP counts at two or more "
                      "depths (n_layers).",
    "loss_curves": "No data for this figure: these runs hold no training evaluations "
                   "(mode \"train\" or \"pilot\", metric val_loss).",
    "time_to_target": "No data for this figure: it needs a router and its baseline that both "
                      "reached the target loss with the same seed.",
    "decomposition": "No data for this figure: it needs a router and its baseline that both "
                     "reached the target loss with the same seed.",
    "compile_vs_eager": "No data for this figure: no compile or cudagraph step times yet; it "
                        "appears once a sweep includes those backends.",
}


#: Widest PNG a report embeds, in pixels (the HTML page is 1,200 px wide).
MAX_WIDTH_PX = 1200


def png_size(path: Path | str) -> tuple[int, int]:
    """(width, height) in pixels of a PNG file, from its IHDR chunk."""
    head = Path(path).read_bytes()[16:24]
    return int.from_bytes(head[:4], "big"), int.from_bytes(head[4:], "big")


def save_png(fig: plt.Figure, path: Path | str, dpi: int = DPI) -> Path:
    """Save ``fig`` (tight bounding box) at ``dpi``, lowered when needed so the image is at most
    :data:`MAX_WIDTH_PX` wide, and close it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi, bbox_inches="tight")
    width = png_size(path)[0]
    if width > MAX_WIDTH_PX:
        fig.savefig(path, dpi=int(dpi * MAX_WIDTH_PX / width) - 1, bbox_inches="tight")
    plt.close(fig)
    return path


def _save(fig: plt.Figure, out_dir: Path | str, name: str) -> Path:
    return save_png(fig, Path(out_dir) / f"{name}.png")


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


def _device(df: pd.DataFrame) -> str:
    """The device name(s) for a title: ``device_name`` (added by :func:`reports.render.
    build_report` from each run's manifest) where known, else the ``device`` column."""
    for col in ("device_name", "device"):
        if col in df:
            names = [n for n in dict.fromkeys(df[col].astype(str)) if n and n != "nan"]
            if names:
                return ", ".join(names)
    return "unknown device"


def _save_with_data(fig: plt.Figure, out_dir: Path | str, name: str, data: pd.DataFrame) -> Path:
    """The PNG and, beside it with the same stem, the CSV of the numbers it draws."""
    path = _save(fig, out_dir, name)
    data.to_csv(path.with_suffix(".csv"), index=False)
    return path


def _group_label(run_id: str, backend: str, several: bool) -> str:
    return f"{run_id} · {backend}" if several else backend


def _band_over_seeds(runs: pd.DataFrame, x: str) -> pd.DataFrame:
    """Mean, min and max of ``val_loss`` over the seeds of one router at each ``x``.

    On ``tokens`` the seeds evaluate at the same points; on the clock (``elapsed``) each seed is
    interpolated on a common grid, up to the shortest seed's clock so every point has every seed.
    """
    if x == "tokens":
        return (runs.groupby(x)["val_loss"].agg(mean="mean", lo="min", hi="max")
                .reset_index().rename(columns={x: "x"}))
    per_seed = [g.sort_values(x) for _, g in runs.dropna(subset=[x]).groupby("seed")]
    if not per_seed:
        return pd.DataFrame(columns=["x", "mean", "lo", "hi"])
    end = min(float(g[x].iloc[-1]) for g in per_seed)
    grid = np.linspace(0.0, end, 100)
    ys = np.array([np.interp(grid, g[x].to_numpy(float), g["val_loss"].to_numpy(float))
                   for g in per_seed])
    return pd.DataFrame({"x": grid, "mean": ys.mean(0), "lo": ys.min(0), "hi": ys.max(0)})


def loss_curves(df: pd.DataFrame, out_dir: Path | str) -> Path | None:
    """Validation loss against tokens seen and against the training clock (two panels per run
    and backend): per router a line at the mean over seeds and a band from the min to the max
    over seeds; diverged runs drawn thin and dotted, each on its own and left out of the band;
    the pilot dashed; the target loss a horizontal line.

    Returns:
        ``<out_dir>/loss_curves.png`` with ``loss_curves.csv`` beside it (every evaluation drawn:
        :data:`reports.training.CURVE_COLUMNS`), or ``None`` without ``val_loss`` rows of a
        training run or pilot.
    """
    w = training.curves(df)
    if w.empty:
        return None
    runs = training.run_frame(df)
    palette = _hue(df, df)["palette"]
    panels = [(x, lbl) for x, lbl in (("tokens", "tokens seen (tokens)"),
                                      ("elapsed", "training clock (s, evaluation excluded)"))
              if w[x].notna().any()] or [("step", "optimizer step (steps)")]
    groups = list(w.groupby(["run_id", "backend"], sort=False))
    fig, axes = plt.subplots(len(groups), len(panels), figsize=(5.4 * len(panels),
                                                                3.7 * len(groups)), squeeze=False)
    for row, ((run_id, backend), g) in zip(axes, groups):
        r = runs[(runs["run_id"] == run_id) & (runs["backend"] == backend)]
        targets = np.unique(r["target_loss"].dropna())
        for ax, (x, label) in zip(row, panels):
            train = g[(g["mode"] == training.TRAIN_MODE) & (g["status"] != "diverged")]
            for variant, v in train.groupby("variant", sort=False):
                band = _band_over_seeds(v, x) if x != "step" else (
                    v.groupby("step")["val_loss"].agg(mean="mean", lo="min", hi="max")
                    .reset_index().rename(columns={"step": "x"}))
                if band.empty:  # a run without this axis (an old record without a clock)
                    continue
                n = v["seed"].nunique()
                ax.plot(band["x"], band["mean"], color=palette.get(variant), linewidth=1.5,
                        label=f"{variant} ({n} seed{'s' if n != 1 else ''})")
                ax.fill_between(band["x"], band["lo"], band["hi"], color=palette.get(variant),
                                alpha=0.2, linewidth=0)
            dead = g[(g["mode"] == training.TRAIN_MODE) & (g["status"] == "diverged")]
            for i, ((variant, seed), d) in enumerate(dead.groupby(["variant", "seed"])):
                d = d.dropna(subset=[x])
                ax.plot(d[x], d["val_loss"], color=palette.get(variant), linestyle=":",
                        linewidth=1, marker="x", markevery=[len(d) - 1] if len(d) else None,
                        label="diverged run (until divergence)" if i == 0 else None)
            for (variant, seed), p in g[g["mode"] == training.PILOT_MODE].groupby(
                    ["variant", "seed"]):
                p = p.dropna(subset=[x])
                ax.plot(p[x], p["val_loss"], color=palette.get(variant), linestyle="--",
                        linewidth=1.2, label=f"pilot ({variant}, seed {seed})")
            for i, target in enumerate(targets):
                ax.axhline(target, color="0.3", linestyle="-.", linewidth=1,
                           label=f"target {target:.3f} nats" if i == 0 else None)
            ax.set_xlabel(label)
            if x == "tokens":  # 200k, 1.5M: plain integers would run into each other
                ax.xaxis.set_major_formatter(matplotlib.ticker.EngFormatter(sep=""))
            ax.set_ylabel("validation loss (nats)")
            ax.set_title(_group_label(run_id, backend, len(groups) > 1), fontsize=9)
    legend = {}  # one legend for all panels: a label once, from wherever it was drawn
    for ax in axes.flat:
        legend.update(zip(*reversed(ax.get_legend_handles_labels())))
    if legend:
        axes[0][-1].legend(legend.values(), legend.keys(), loc="upper left",
                           bbox_to_anchor=(1.02, 1), frameon=False, fontsize=8)
    fig.suptitle(f"Validation loss, mean and min–max over seeds — {_device(df)}")
    fig.tight_layout()
    return _save_with_data(fig, out_dir, "loss_curves", w)


def _comparison_label(r, several: bool) -> str:
    return (f"{r['variant']} vs {r['baseline']}"
            + (f"\n{_group_label(r['run_id'], r['backend'], True)}" if several else
               f" ({r['backend']})"))


#: Tick candidates of a ratio axis (log scale): dense near 1, where the comparisons sit.
_RATIO_TICKS = (0.1, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1, 1.1, 1.2, 1.3, 1.5, 1.75, 2,
                2.5, 3, 4, 5, 7, 10)


def _ratio_axis(ax) -> None:
    """A log ratio axis with a dashed line at 1 and labelled ticks wherever the data lie."""
    ax.axvline(1.0, color="0.4", linestyle="--", linewidth=1)
    ax.set_xscale("log")
    lo, hi = ax.get_xlim()
    ticks = [t for t in _RATIO_TICKS if lo <= t <= hi]
    if len(ticks) > 9:
        ticks = ticks[::2] if 1 in ticks[::2] else ticks[1::2]
    ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
    ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())


def time_to_target(df: pd.DataFrame, out_dir: Path | str) -> Path | None:
    """Time-to-target ratio to each baseline (router / baseline, log scale), one line per
    comparison: each seed's ratio as a dot, a not-converged pair as an open triangle at its
    bound pointing where the true ratio lies (left out of the interval), and the geometric mean
    as a black diamond with its t-interval.

    Returns:
        ``<out_dir>/time_to_target.png`` with ``time_to_target.csv`` (the points, then the
        geometric mean, ``lo`` and ``hi`` of each comparison), or ``None`` when no comparison has
        a pair where both runs reached the target.
    """
    table = training.comparison_table(df)
    table = table[table["n"] > 0].reset_index(drop=True)
    if table.empty:
        return None
    points = training.ratio_points(df)
    points = points[points["quantity"] == "time"]
    keys = ["run_id", "backend", "variant", "baseline"]
    points = points.merge(table[keys], on=keys)
    several = table[["run_id", "backend"]].drop_duplicates().shape[0] > 1
    palette = _hue(df, df)["palette"]
    fig, ax = plt.subplots(figsize=(7.5, 0.75 * len(table) + 1.4))
    for i, r in table.iterrows():
        pts = points.merge(pd.DataFrame([r[keys]]), on=keys)
        for kind, marker, face in (("=", "o", palette.get(r["variant"])), (">", ">", "none"),
                                   ("<", "<", "none")):
            k = pts[pts["kind"] == kind]
            ax.scatter(k["ratio"], np.full(len(k), i) + 0.12, marker=marker, s=36,
                       facecolors=face, edgecolors=palette.get(r["variant"]), zorder=3,
                       label={"=": None, ">": "bound: router not converged",
                              "<": "bound: baseline not converged"}[kind]
                       if len(k) else None)
        err = None
        if np.isfinite(r["time_lo"]):
            err = [[r["time_ratio"] - r["time_lo"]], [r["time_hi"] - r["time_ratio"]]]
        ax.errorbar([r["time_ratio"]], [i - 0.12], xerr=err, fmt="D", color="black",
                    markersize=5, capsize=3, zorder=4,
                    label=f"geometric mean, {r['conf']:.0%} t-interval" if i == 0 else None)
    _ratio_axis(ax)
    ax.set_yticks(range(len(table)), [_comparison_label(r, several) for _, r in table.iterrows()])
    ax.invert_yaxis()
    ax.set_xlabel("time to target, router / baseline (×, log scale; < 1 is faster)")
    ax.set_ylabel("router vs baseline (paired by seed)")
    handles, labels = ax.get_legend_handles_labels()
    uniq = dict(zip(labels, handles))
    ax.legend(uniq.values(), uniq.keys(), loc="upper left", bbox_to_anchor=(1.02, 1),
              frameon=False, fontsize=8)
    ax.set_title(f"Time to target vs baseline, per seed — {_device(df)}")
    summary = table[keys + ["n", "time_ratio", "time_lo", "time_hi"]].assign(
        quantity="time", kind="gmean").rename(columns={"time_ratio": "ratio", "time_lo": "lo",
                                                       "time_hi": "hi"})
    return _save_with_data(fig, out_dir, "time_to_target", pd.concat([points, summary],
                                                                      ignore_index=True))


#: The factors of the time ratio in the decomposition figure: (column prefix, label, marker).
_FACTORS = (("time", "time to target", "D"), ("steps", "steps to target", "o"),
            ("step_time", "time per step", "s"))


def decomposition(df: pd.DataFrame, out_dir: Path | str) -> Path | None:
    """The time-to-target ratio and its two factors, steps ratio × step-time ratio, per
    comparison: geometric means over the pairs where both runs reached the target, each with its
    own t-interval (log scale, a line at 1).

    Returns:
        ``<out_dir>/decomposition.png`` with ``decomposition.csv`` (the estimates drawn), or
        ``None`` when no comparison has a pair where both runs reached the target.
    """
    table = training.comparison_table(df)
    table = table[table["n"] > 0].reset_index(drop=True)
    if table.empty:
        return None
    several = table[["run_id", "backend"]].drop_duplicates().shape[0] > 1
    colors = sns.color_palette("colorblind", len(_FACTORS))
    fig, ax = plt.subplots(figsize=(7.5, 0.9 * len(table) + 1.4))
    rows = []
    for i, r in table.iterrows():
        for j, ((col, label, marker), color) in enumerate(zip(_FACTORS, colors)):
            est, lo, hi = r[f"{col}_ratio"], r[f"{col}_lo"], r[f"{col}_hi"]
            err = [[est - lo], [hi - est]] if np.isfinite(lo) else None
            ax.errorbar([est], [i + (j - 1) * 0.22], xerr=err, fmt=marker, color=color,
                        markersize=5, capsize=3, label=label if i == 0 else None)
            rows.append({"run_id": r["run_id"], "backend": r["backend"],
                         "variant": r["variant"], "baseline": r["baseline"], "n": r["n"],
                         "quantity": col, "ratio": est, "lo": lo, "hi": hi})
    _ratio_axis(ax)
    ax.set_yticks(range(len(table)), [f"{_comparison_label(r, several)} (n={r['n']})"
                                      for _, r in table.iterrows()])
    ax.invert_yaxis()
    ax.set_xlabel("ratio to baseline (×, log scale): time = steps × time per step")
    ax.set_ylabel("router vs baseline (paired by seed)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1), frameon=False, fontsize=8)
    ax.set_title(f"Time to target = steps × time per step, vs baseline — {_device(df)}")
    return _save_with_data(fig, out_dir, "decomposition", pd.DataFrame(rows))


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
    "time_to_target": time_to_target,
    "decomposition": decomposition,
}
