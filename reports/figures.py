"""Seaborn figures of a run's tables, saved as PNG files.

Each function takes the long frame of :func:`reports.tables.load_frame` and an output directory, and
returns the path of the PNG it wrote, or ``None`` when the runs hold no data for it (the report then
says so in a sentence). Figures use the ``variant`` label (router, impl when several, options) as
hue, with one colour per variant across all figures of a report; the cost figures of issue 10
(``overhead_vs_width`` to ``router_cost_models``) instead give a router one colour and tell its
impls apart by line style, name the device and the shape in their titles, and write the numbers
they draw to a CSV beside the PNG.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")  # files only; never open a window (CI, SSH, CUDA boxes without a display)

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

from . import paired, tables, training  # noqa: E402

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
    "overhead_vs_width": "No data for this figure: it needs paired step times (--paired) of "
                         "prenorm and another router at two or more widths (d_model).",
    "overhead_vs_depth": "No data for this figure: it needs paired step times (--paired) of "
                         "prenorm and another router at two or more depths (n_layers).",
    "router_flop_share_vs_width": "No data for this figure: it needs router and forward FLOP "
                                  "counts (fvcore, --flops) at two or more widths (d_model).",
    "memory_vs_depth": "No data for this figure: it needs saved activations (eager fwd_bwd) or "
                       "router state of prenorm and another router at two or more depths "
                       "(n_layers).",
    "router_cost_models": "No data for this figure: these runs hold no router cost-model rows "
                          "(router_io_ideal, router_io_measured).",
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
    for _ in range(6):  # text snaps to whole pixels, so the width is not linear in the dpi
        width = png_size(path)[0]
        if width <= MAX_WIDTH_PX:
            break
        dpi *= min(MAX_WIDTH_PX / width, 0.97)
        fig.savefig(path, dpi=dpi, bbox_inches="tight")
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


# --- Cost figures: each names the device and the shape in its title and writes its data. -------

#: Shape columns of a title and their letters: "d=32 L=4 H=2 T=8 B=2 float32".
_SHAPE_TEXT = (("d_model", "d"), ("n_layers", "L"), ("n_heads", "H"), ("seq_len", "T"),
               ("batch_size", "B"), ("dtype", ""))
_LETTER = dict(_SHAPE_TEXT)
#: Line style of an implementation: a router's impls share its colour and differ in dashes.
_IMPL_LINES = {"naive": "-", "two_phase": "--"}
_IMPL_MARKERS = {"naive": "o", "two_phase": "s"}
#: What a panel of a cost figure never pools: the run (maybe another machine), the setting, the
#: seed. Shape columns other than the figure's own axes are added by each figure.
_PANEL_KEYS = ("run_id", "mode", "workload", "backend", "compile_mode", "device", "seed")


def _shape(t: pd.DataFrame, skip: tuple = ()) -> str:
    """The shape of ``t`` for a title, ``"T=8 B=2 float32"``; a column with several values as
    ``"T=8/16"``; the columns in ``skip`` (a figure's axes) left out."""
    parts = []
    for col, letter in _SHAPE_TEXT:
        if col in skip or col not in t:
            continue
        values = [v for v in pd.unique(t[col]) if str(v) not in ("", "nan")]
        if values:
            text = "/".join(str(v) for v in sorted(values))
            parts.append(f"{letter}={text}" if letter else text)
    return " ".join(parts)


def _suptitle(fig: plt.Figure, *lines: str) -> None:
    """The figure's title, each line wrapped to the width of the figure (device names can be
    long), so that the title never sets the width of the image."""
    chars = int(fig.get_size_inches()[0] * 13)
    fig.suptitle("\n".join(textwrap.fill(line, chars) for line in lines if line), fontsize=10)


def _family(t: pd.DataFrame) -> pd.Series:
    """Router and options without the impl: the colour key that keeps a router's impls one hue."""
    return t["router"] + t["options"].map(lambda o: f" ({o})" if o else "")


def _family_palette(df: pd.DataFrame) -> dict:
    """One colour per router (with its options) of the whole frame, prenorm first."""
    families = sorted(set(_family(df)), key=lambda f: (not f.startswith(tables.BASELINE), f))
    colors = sns.color_palette("tab10" if len(families) <= 10 else "husl", len(families))
    return dict(zip(families, colors))


#: Inches right of the panels kept for the legend of :func:`_figure_legend`.
_LEGEND_IN = 2.6


def _grid(n: int, width: float = 4.6, height: float = 3.4) -> tuple[plt.Figure, list]:
    """A figure of ``n`` panels, three to a row, and room for a legend right of them."""
    ncols = min(3, n)
    nrows = -(-n // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(width * ncols + _LEGEND_IN, height * nrows),
                             squeeze=False)
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    return fig, list(axes.flat[:n])


def _figure_legend(fig: plt.Figure, axes: list) -> None:
    """One legend right of the first row of panels (below the title), each label once."""
    seen: dict = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            seen.setdefault(label, handle)
    axes[min(2, len(axes) - 1)].legend(list(seen.values()), list(seen), loc="upper left",
                                       bbox_to_anchor=(1.02, 1), frameon=False, fontsize=8)


def _x_ticks(ax, values, log2: bool) -> None:
    """Ticks at the measured values only (widths and depths are a few powers of two)."""
    values = sorted(float(v) for v in pd.unique(values))
    if log2:
        ax.set_xscale("log", base=2)
    ax.set_xticks(values, [f"{v:g}" for v in values])
    ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())


def _ratio_y_axis(ax) -> None:
    """A log ratio axis (y) with labelled ticks wherever the data lie, 1 always among them: an
    interval of a few noisy pairs can span 100×, and 0.9× must stay readable beside it."""
    ax.set_yscale("log")
    lo, hi = ax.get_ylim()
    wide = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)
    ticks = [t for t in (wide if hi / lo > 10 else _RATIO_TICKS) if lo <= t <= hi]
    while len(ticks) > 9:
        ticks = ticks[::2] if 1 in ticks[::2] else ticks[1::2]
    ax.set_yticks(ticks, [f"{t:g}" for t in ticks])
    ax.yaxis.set_minor_locator(matplotlib.ticker.NullLocator())


def _dodge(x: pd.Series, k: int, n: int, log2: bool, span: float) -> np.ndarray:
    """``x`` of line ``k`` of ``n`` shifted a little, so that error bars of one x stay apart."""
    off = k - (n - 1) / 2
    x = x.astype(float).to_numpy()
    return x * 2 ** (0.035 * off) if log2 else x + 0.012 * span * off


def _panel_label(t: pd.DataFrame, keys: list[str], always: tuple = ()) -> pd.Series:
    """Mode and backend always, then each key (and the ``always`` shape columns) that varies."""
    label = t["mode"] + " · " + _backend_label(t)
    for col in [*keys, *always]:
        if col in ("mode", "backend", "compile_mode") or col not in t:
            continue
        if col in always or t[col].nunique() > 1:
            name = f"{_LETTER[col]}=" if _LETTER.get(col) else "" if col == "dtype" else f"{col} "
            label = label + " · " + name + t[col].astype(str)
    return label


def _largest(t: pd.DataFrame, keys: list[str], x: str, fixed: str) -> pd.DataFrame:
    """The rows of each group of ``keys`` at its largest ``fixed``, groups with 2+ values of
    ``x`` there; empty when none."""
    kept = []
    for _, g in t.groupby(keys, dropna=False, sort=False):
        g = g[g[fixed] == g[fixed].max()]
        if g[x].nunique() >= 2:
            kept.append(g)
    return pd.concat(kept) if kept else t.iloc[:0]


def _fixed_text(t: pd.DataFrame, fixed: str) -> str:
    values = sorted(pd.unique(t[fixed]))
    return (f"{_LETTER[fixed]}={values[0]} (the largest measured)" if len(values) == 1
            else f"{fixed} at the largest of each panel")


def _overhead_vs(df: pd.DataFrame, out_dir: Path | str, x: str, fixed: str, name: str,
                 xlabel: str, log2: bool) -> Path | None:
    t = paired.paired_ratio_table(df)
    if t.empty:
        return None
    keys = [*_PANEL_KEYS, *(c for c in tables.SHAPE_COLS if c not in (x, fixed))]
    data = _largest(t, keys, x, fixed)
    if data.empty:
        return None
    data = data.assign(family=_family(data))
    data.insert(0, "panel", _panel_label(data, keys, always=(fixed,)))
    palette = _family_palette(df)
    fig, axes = _grid(data["panel"].nunique())
    for ax, (panel, g) in zip(axes, data.groupby("panel", sort=False)):
        lines = list(g.groupby(["family", "impl"], sort=True))
        span = float(g[x].max() - g[x].min())
        for k, ((family, impl), line) in enumerate(lines):
            line = line.sort_values(x)
            y = line["ratio"].astype(float)
            err = np.array([(y - line["ratio_lo"].astype(float)).clip(lower=0),
                            (line["ratio_hi"].astype(float) - y).clip(lower=0)])
            ax.errorbar(_dodge(line[x], k, len(lines), log2, span), y, yerr=err,
                        color=palette[family], linestyle=_IMPL_LINES.get(impl, ":"),
                        marker="o", markersize=4, capsize=3, linewidth=1.4,
                        label=f"{family} · {impl}")
        ax.axhline(1.0, color="0.4", linestyle="--", linewidth=1, label="prenorm (1×)")
        _ratio_y_axis(ax)
        _x_ticks(ax, g[x], log2)
        ax.set_title(panel, fontsize=9)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("step time / prenorm (×, log scale)")
    _figure_legend(fig, axes)
    _suptitle(fig, f"Step time / prenorm vs {'width' if x == 'd_model' else 'depth'}: paired "
                   f"median, {paired.CONF:.0%} bootstrap CI — {_device(df)}",
              f"{_fixed_text(data, fixed)}, {_shape(data, skip=(x, fixed))}; naive solid, "
              "two_phase dashed")
    fig.tight_layout()
    return _save_with_data(fig, out_dir, name, data.drop(columns="family"))


def overhead_vs_width(df: pd.DataFrame, out_dir: Path | str) -> Path | None:
    """Paired step-time ratio to prenorm (:func:`reports.paired.paired_ratio_table`) with its
    bootstrap CI as error bars against d_model, at the largest n_layers; one panel per backend
    (and compile mode, mode, run), one line per router and impl: a router keeps one colour, its
    impls differ in line style (naive solid, two_phase dashed); a dashed line at 1.

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
    static = list(tables.STATIC_KEYS)
    counted = ov.groupby(static, as_index=False)[["router_flop_pct", "gflop_fwd"]].median()
    counted["source"] = "counted (fvcore)"
    analytic = tables.router_cost_table(df).drop(columns=["io_ideal_d", "io_measured_d",
                                                          "state_mib"])
    analytic = analytic[analytic["flop_per_token"].notna()].merge(
        counted[[*static, "gflop_fwd"]], on=static)
    # the analytic count is the naive reference: one line per router, over naive's forward FLOPs
    analytic = (analytic.assign(_ref=analytic["impl"] != "naive")
                .sort_values("_ref", kind="stable")
                .drop_duplicates([k for k in static if k not in ("impl", "variant")])
                .drop(columns="_ref"))
    tokens = (analytic["batch_size"] * analytic["seq_len"]).astype(float)
    analytic["router_flop_pct"] = (analytic["flop_per_token"].astype(float) * tokens
                                   / (analytic["gflop_fwd"].astype(float) * 1e9) * 100)
    analytic["source"] = "analytic"
    t = pd.concat([counted, analytic], ignore_index=True)
    keys = ["workload", *(c for c in tables.SHAPE_COLS if c not in ("d_model", "n_layers"))]
    data = _largest(t, keys, "d_model", "n_layers")
    if data.empty:
        return None
    data = data.assign(family=_family(data))
    data["panel"] = data["workload"] + (" · " + data[keys[1:]].astype(str).agg(" ".join, axis=1)
                                        if data.groupby(keys).ngroups > 1 else "")
    data["panel"] = data["panel"] + " · L=" + data["n_layers"].astype(str)
    palette = _family_palette(df)
    fig, axes = _grid(data["panel"].nunique(), width=5.2, height=3.8)
    for ax, (panel, g) in zip(axes, data.groupby("panel", sort=False)):
        for (family, source, impl), line in g.groupby(["family", "source", "impl"], sort=True):
            line = line.sort_values("d_model")
            counted_line = source != "analytic"
            ax.plot(line["d_model"].astype(float), line["router_flop_pct"],
                    color=palette[family], linestyle="-" if counted_line else ":",
                    marker=_IMPL_MARKERS.get(impl, "^") if counted_line else "x",
                    markersize=4 if counted_line else 8, linewidth=1.4 if counted_line else 2,
                    zorder=2 if counted_line else 3,  # on top: it often hides naive's count
                    label=f"{family} · {impl}, counted" if counted_line
                    else f"{family}, analytic")
        _x_ticks(ax, g["d_model"], log2=True)
        ax.set_ylim(bottom=0)
        ax.set_title(panel, fontsize=9)
        ax.set_xlabel("d_model (features per token, log₂ scale)")
        ax.set_ylabel("router FLOPs / forward FLOPs (%)")
    _figure_legend(fig, axes)
    _suptitle(fig, "Router share of the forward FLOPs vs width: the amortisation the HAARES "
                   f"paper claims — {_device(df)}",
              f"{_fixed_text(data, 'n_layers')}, {_shape(data, skip=('d_model', 'n_layers'))}",
              f"solid: counted (fvcore), dotted: analytic; {tables.FLOP_CONVENTION}")
    fig.tight_layout()
    cols = ["source", "router", "options", "impl", "variant", "workload", *tables.SHAPE_COLS,
            "router_flop_pct", "gflop_fwd", "flop_per_token"]
    return _save_with_data(fig, out_dir, "router_flop_share_vs_width", data[cols])


#: The quantities of :func:`memory_vs_depth`: (column of the overhead table, axis label).
_MEMORY = (("saved_mib", "saved activations / prenorm's (×)"),
           ("router_state_mib", "peak router state / prenorm's (×)"))


def memory_vs_depth(df: pd.DataFrame, out_dir: Path | str) -> Path | None:
    """Saved activations (autograd, eager fwd_bwd) and peak router state as multiples of
    prenorm's at the same shape, against n_layers at the largest d_model: two panels, one line
    per router and impl (a router keeps one colour; naive solid, two_phase dashed), prenorm the
    flat line at 1. Eager rows only; both are counts, not timings, so runs are not told apart.

    Returns:
        ``<out_dir>/memory_vs_depth.png`` with ``memory_vs_depth.csv`` (``quantity``, the router,
        impl and shape, ``mib``, ``prenorm_mib`` and ``multiple`` = mib / prenorm_mib), or
        ``None`` without either quantity of prenorm and another router at two or more depths.
    """
    ov = tables.overhead_table(df)
    ov = ov[ov["backend"] == "eager"]
    static = list(tables.STATIC_KEYS)
    shape = ["workload", *tables.SHAPE_COLS]
    parts = []
    for col, _ in _MEMORY:
        m = ov[ov[col].notna()].groupby(static, as_index=False)[col].median()
        m = m.rename(columns={col: "mib"})
        base = m[m["router"] == tables.BASELINE].groupby(shape)["mib"].median()
        m = m.merge(base.rename("prenorm_mib").reset_index(), on=shape)
        m["multiple"] = (m["mib"] / m["prenorm_mib"]).replace([np.inf, -np.inf], np.nan)
        if (m["router"] != tables.BASELINE).any():
            parts.append(m.assign(quantity=col))
    if not parts:
        return None
    keys = ["quantity", "workload", *(c for c in tables.SHAPE_COLS
                                      if c not in ("d_model", "n_layers"))]
    data = _largest(pd.concat(parts, ignore_index=True), keys, "n_layers", "d_model")
    if data.empty:
        return None
    data = data.assign(family=_family(data))
    labels = dict(_MEMORY)
    palette = _family_palette(df)
    panels = list(data.groupby(keys, sort=False))
    fig, axes = _grid(len(panels))
    for ax, (key, g) in zip(axes, panels):
        for (family, impl), line in g.groupby(["family", "impl"], sort=True):
            line = line.sort_values("n_layers")
            ax.plot(line["n_layers"].astype(float), line["multiple"], color=palette[family],
                    linestyle=_IMPL_LINES.get(impl, ":"), marker="o", markersize=4,
                    linewidth=1.4, label=f"{family} · {impl}")
        _x_ticks(ax, g["n_layers"], log2=False)
        ax.set_xlabel("n_layers (decoder blocks)")
        ax.set_ylabel(labels[key[0]])
        ax.set_title(f"{key[1]} · d={g['d_model'].iloc[0]}" + (
            f" · {_shape(g, skip=('d_model', 'n_layers'))}"
            if data.groupby(keys[1:]).ngroups > 1 else ""), fontsize=9)
    _figure_legend(fig, axes)
    _suptitle(fig, f"Memory vs depth as multiples of prenorm (eager) — {_device(df)}",
              f"{_fixed_text(data, 'd_model')}, {_shape(data, skip=('d_model', 'n_layers'))}")
    fig.tight_layout()
    cols = ["quantity", "router", "options", "impl", "variant", "workload", *tables.SHAPE_COLS,
            "mib", "prenorm_mib", "multiple"]
    return _save_with_data(fig, out_dir, "memory_vs_depth", data[cols])


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
        bt = bt[(bt["backend"] != "eager") & bt["vs_eager"].notna()].copy()
        bt["lo"] = bt["hi"] = np.nan
    if bt.empty:
        return None
    bt["setting"] = _backend_label(bt)
    bt["label"] = _family(bt) + " · " + bt["impl"]
    bt["size"] = bt["d_model"].astype(float) * bt["n_layers"].astype(float)
    shape = [c for c in tables.SHAPE_COLS if c != "dtype"]
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
    fig, axes = _grid(data["panel"].nunique(), width=5.2,
                      height=0.32 * rows * len(settings) + 1.4)
    for ax, (panel, g) in zip(axes, data.groupby("panel", sort=False)):
        labels = list(dict.fromkeys(g.assign(_base=g["router"] != tables.BASELINE)
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
    _figure_legend(fig, axes)
    _suptitle(fig, f"Compiled vs eager step time (largest compiled shape) — {_device(df)}",
              _shape(data))
    fig.tight_layout()
    return _save_with_data(fig, out_dir, "compile_vs_eager", data)


def router_cost_models(df: pd.DataFrame, out_dir: Path | str) -> Path | None:
    """The routers' I/O cost models (:func:`reports.tables.router_cost_table`): per router the
    ideal residual traffic (``io_ideal_d``: each input read once, each output written once, the
    AttnRes paper's Table 1 model, the same for every impl) beside the traffic each impl's eager
    ops measured (``io_measured_d``), in d elements per token and sublayer; grouped bars, one
    panel per depth (the ideal grows with the number of sublayers) at the largest width.

    Returns:
        ``<out_dir>/router_cost_models.png`` with ``router_cost_models.csv`` (``series`` =
        ideal or measured, the router, impl and shape, ``d_elements``), or ``None`` without
        router cost-model rows.
    """
    rc = tables.router_cost_table(df)
    rc = rc[rc["io_ideal_d"].notna() | rc["io_measured_d"].notna()]
    if rc.empty:
        return None
    others = [c for c in tables.SHAPE_COLS if c != "n_layers"]
    kept = []
    for _, g in rc.groupby("workload", sort=True):  # units of d: the largest width stands for all
        top = g.sort_values(others).iloc[-1]
        kept.append(g[(g[others] == top[others]).all(axis=1)])
    rc = pd.concat(kept)
    rc = rc.assign(family=_family(rc))
    ideal = (rc.assign(_ref=rc["impl"] != "naive").sort_values("_ref", kind="stable")
             .drop_duplicates(["family", "workload", *tables.SHAPE_COLS])
             .assign(series="ideal I/O model", d_elements=lambda r: r["io_ideal_d"]))
    measured = rc.assign(series="measured, " + rc["impl"], d_elements=rc["io_measured_d"])
    data = pd.concat([ideal, measured], ignore_index=True)
    data = data[data["d_elements"].notna()]
    data["panel"] = data["workload"] + " · L=" + data["n_layers"].astype(str)
    series = ["ideal I/O model"] + sorted(s for s in data["series"].unique()
                                          if s != "ideal I/O model")
    colors = dict(zip(series, ["0.6", *sns.color_palette("colorblind", len(series) - 1)]))
    families = sorted(data["family"].unique(),
                      key=lambda f: (not f.startswith(tables.BASELINE), f))
    fig, axes = _grid(data["panel"].nunique(), width=max(4.6, 0.9 * len(families) + 1.6),
                      height=3.6)
    width = 0.8 / len(series)
    for ax, (panel, g) in zip(axes, data.sort_values("n_layers").groupby("panel", sort=False)):
        for j, s in enumerate(series):
            v = g[g["series"] == s].set_index("family")["d_elements"].reindex(families)
            bars = ax.bar(np.arange(len(families)) + (j - (len(series) - 1) / 2) * width,
                          v.astype(float), width=width, color=colors[s], label=s)
            ax.bar_label(bars, fmt="%.3g", fontsize=6, padding=1)
        ax.set_xticks(range(len(families)), families, rotation=30 if len(families) > 3 else 0,
                      ha="right" if len(families) > 3 else "center")
        ax.set_xlabel("router")
        ax.set_ylabel("traffic per token and sublayer (d elements)")
        ax.set_title(panel, fontsize=9)
    _figure_legend(fig, axes)
    _suptitle(fig, "Router I/O: ideal model (AttnRes paper, Table 1) vs measured eager "
                   f"traffic — {_device(df)}", _shape(data, skip=("n_layers",)))
    fig.tight_layout()
    cols = ["panel", "series", "router", "options", "impl", "workload", *tables.SHAPE_COLS,
            "d_elements"]
    return _save_with_data(fig, out_dir, "router_cost_models", data[cols])


#: Figure functions in report order.
FIGURES = {
    "step_time_overhead_vs_width": step_time_overhead_vs_width,
    "overhead_vs_width": overhead_vs_width,
    "overhead_vs_depth": overhead_vs_depth,
    "router_flop_share_vs_width": router_flop_share_vs_width,
    "flops_vs_depth": flops_vs_depth,
    "memory_vs_depth": memory_vs_depth,
    "compile_vs_eager": compile_vs_eager,
    "router_cost_models": router_cost_models,
    "loss_curves": loss_curves,
    "time_to_target": time_to_target,
    "decomposition": decomposition,
}
