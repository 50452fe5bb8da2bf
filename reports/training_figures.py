"""Figures of the training race (:mod:`reports.training`, :mod:`reports.race`): loss curves with the
target, time-to-target ratios per seed, and the decomposition of a ratio into steps and time per
step. Each takes the frame of :func:`reports.frame.load_frame` and an output directory and returns
the PNG it wrote (with the CSV of its numbers beside it), or ``None`` when the runs hold no data
for it (:data:`NO_DATA` says why, in the report)."""

from __future__ import annotations

from pathlib import Path

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")  # files only; never open a window (CI, SSH, CUDA boxes without a display)

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

from . import plotting as pl  # noqa: E402
from . import race, training  # noqa: E402

#: Why a figure is missing, by figure name; the report prints this in its place.
NO_DATA = {
    "loss_curves": "No data for this figure: these runs hold no training evaluations "
                   "(mode \"train\" or \"pilot\", metric val_loss).",
    "time_to_target": "No data for this figure: it needs a router and its baseline that both "
                      "reached the target loss with the same seed.",
    "decomposition": "No data for this figure: it needs a router and its baseline that both "
                     "reached the target loss with the same seed.",
}


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


#: The panels of :func:`loss_figure`: (x column, axis label, panel title).
_LOSS_PANELS = (("tokens", "tokens seen (tokens)", "validation loss vs tokens seen"),
                ("elapsed", "training clock (s, evaluation excluded)",
                 "validation loss vs training clock"))


def loss_figure(df: pd.DataFrame) -> tuple[plt.Figure, pd.DataFrame] | None:
    """The figure of :func:`loss_curves` and the evaluations it draws, unsaved (``None`` without
    ``val_loss`` rows of a training run or pilot): a row of panels per run and backend, a panel
    per x axis, each titled by its axis (and its run and backend when several); the legend names
    every router, a diverged one as ``<router>: diverged (<n> run(s), until divergence)``."""
    w = training.curves(df)
    if w.empty:
        return None
    runs = training.run_frame(df)
    palette = pl.variant_hue(df, df)["palette"]
    names = pl.variant_labels(df)
    panels = [p for p in _LOSS_PANELS if w[p[0]].notna().any()] or [
        ("step", "optimizer step (steps)", "validation loss vs optimizer step")]
    groups = list(w.groupby(["run_id", "backend"], sort=False))
    several = len(groups) > 1
    fig, axes = plt.subplots(len(groups), len(panels), figsize=(5.4 * len(panels),
                                                                3.7 * len(groups)), squeeze=False)
    for row, ((run_id, backend), g) in zip(axes, groups):
        r = runs[(runs["run_id"] == run_id) & (runs["backend"] == backend)]
        targets = np.unique(r["target_loss"].dropna())
        for ax, (x, label, title) in zip(row, panels):
            train = g[(g["mode"] == training.TRAIN_MODE) & (g["status"] != "diverged")]
            for variant, v in train.groupby("variant", sort=False):
                band = _band_over_seeds(v, x) if x != "step" else (
                    v.groupby("step")["val_loss"].agg(mean="mean", lo="min", hi="max")
                    .reset_index().rename(columns={"step": "x"}))
                if band.empty:  # a run without this axis (an old record without a clock)
                    continue
                n = v["seed"].nunique()
                ax.plot(band["x"], band["mean"], color=palette.get(variant), linewidth=1.5,
                        label=f"{names.get(variant, variant)} ({n} seed{'s' if n != 1 else ''})")
                ax.fill_between(band["x"], band["lo"], band["hi"], color=palette.get(variant),
                                alpha=0.2, linewidth=0)
            dead = g[(g["mode"] == training.TRAIN_MODE) & (g["status"] == "diverged")]
            for variant, dv in dead.groupby("variant", sort=False):
                n = dv["seed"].nunique()
                for i, (seed, d) in enumerate(dv.groupby("seed")):
                    d = d.dropna(subset=[x])
                    ax.plot(d[x], d["val_loss"], color=palette.get(variant), linestyle=":",
                            linewidth=1, marker="x", markevery=[len(d) - 1] if len(d) else None,
                            label=f"{names.get(variant, variant)}: diverged ({n} run"
                                  f"{'s' if n != 1 else ''}, until divergence)" if i == 0 else None)
            for (variant, seed), p in g[g["mode"] == training.PILOT_MODE].groupby(
                    ["variant", "seed"]):
                p = p.dropna(subset=[x])
                ax.plot(p[x], p["val_loss"], color=palette.get(variant), linestyle="--",
                        linewidth=1.2, label=f"pilot ({names.get(variant, variant)}, seed {seed})")
            for i, target in enumerate(targets):
                ax.axhline(target, color="0.3", linestyle="-.", linewidth=1,
                           label=f"target {target:.3f} nats" if i == 0 else None)
            ax.set_xlabel(label)
            if x == "tokens":  # 200k, 1.5M: plain integers would run into each other
                ax.xaxis.set_major_formatter(matplotlib.ticker.EngFormatter(sep=""))
            ax.set_ylabel("validation loss (nats)")
            ax.set_title((f"{_group_label(run_id, backend, True)} · " if several else "") + title,
                         fontsize=9)
    legend = {}  # one legend for all panels: a label once, from wherever it was drawn
    for ax in axes.flat:
        legend.update(zip(*reversed(ax.get_legend_handles_labels())))
    if legend:
        axes[0][-1].legend(legend.values(), legend.keys(), loc="upper left",
                           bbox_to_anchor=(1.02, 1), frameon=False, fontsize=8)
    where = "" if several else f" (run {groups[0][0][0]}, backend {groups[0][0][1]})"
    fig.suptitle(f"Validation loss, mean and min–max over seeds{where} — {pl.device_title(df)}")
    fig.tight_layout()
    return fig, w


def loss_curves(df: pd.DataFrame, out_dir: Path | str) -> Path | None:
    """Validation loss against tokens seen and against the training clock (two panels per run
    and backend, :func:`loss_figure`): per router a line at the mean over seeds and a band from
    the min to the max over seeds; diverged runs drawn thin and dotted, each on its own and left
    out of the band, named in the legend by router; the pilot dashed; the target loss a
    horizontal line.

    Returns:
        ``<out_dir>/loss_curves.png`` with ``loss_curves.csv`` beside it (every evaluation drawn:
        :data:`reports.training.CURVE_COLUMNS`), or ``None`` without ``val_loss`` rows of a
        training run or pilot.
    """
    built = loss_figure(df)
    return None if built is None else pl.save_with_data(built[0], out_dir, "loss_curves", built[1])


def _comparison_label(r, several: bool, names: dict[str, str]) -> str:
    return (f"{names.get(r['variant'], r['variant'])} vs {names.get(r['baseline'], r['baseline'])}"
            + (f"\n{_group_label(r['run_id'], r['backend'], True)}" if several else
               f" ({r['backend']})"))


def _ratio_axis(ax) -> None:
    """A log ratio axis with a dashed line at 1 and labelled ticks wherever the data lie."""
    ax.axvline(1.0, color="0.4", linestyle="--", linewidth=1)
    ax.set_xscale("log")
    lo, hi = ax.get_xlim()
    ticks = [t for t in pl.RATIO_TICKS if lo <= t <= hi]
    if len(ticks) > 9:
        ticks = ticks[::2] if 1 in ticks[::2] else ticks[1::2]
    ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
    ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())


def time_to_target_figure(df: pd.DataFrame) -> tuple[plt.Figure, pd.DataFrame] | None:
    """The figure of :func:`time_to_target` and its data, unsaved (``None`` when no comparison
    has a pair where both runs reached the target). Comparison ``i`` is row ``i`` (top first):
    its per-seed points and its geometric mean sit on that row's y; the data's ``y`` column is
    read back from the drawn markers."""
    table = race.comparison_table(df)
    table = table[table["n"] > 0].reset_index(drop=True)
    if table.empty:
        return None
    points = race.ratio_points(df)
    points = points[points["quantity"] == "time"]
    keys = ["run_id", "backend", "variant", "baseline"]
    points = points.merge(table[keys], on=keys)
    several = table[["run_id", "backend"]].drop_duplicates().shape[0] > 1
    palette = pl.variant_hue(df, df)["palette"]
    names = pl.variant_labels(df)
    fig, ax = plt.subplots(figsize=(7.5, 0.75 * len(table) + 1.4))
    drawn, means = [], []
    for i, r in table.iterrows():
        pts = points.merge(pd.DataFrame([r[keys]]), on=keys)
        for kind, marker, face in (("=", "o", palette.get(r["variant"])), (">", ">", "none"),
                                   ("<", "<", "none")):
            k = pts[pts["kind"] == kind]
            if k.empty:
                continue
            dots = ax.scatter(k["ratio"], np.full(len(k), float(i)), marker=marker, s=64,
                              facecolors=face, edgecolors=palette.get(r["variant"]), alpha=0.85,
                              zorder=3, label={"=": "one seed's ratio (both reached the target)",
                                               ">": "bound: router not converged",
                                               "<": "bound: baseline not converged"}[kind])
            drawn.append(k.assign(y=dots.get_offsets()[:, 1]))
        err = None
        if np.isfinite(r["time_lo"]):
            err = [[r["time_ratio"] - r["time_lo"]], [r["time_hi"] - r["time_ratio"]]]
        mean = ax.errorbar([r["time_ratio"]], [float(i)], xerr=err, fmt="D", color="black",
                           markersize=5, capsize=3, zorder=4,
                           label=f"geometric mean, {r['conf']:.0%} t-interval" if i == 0 else None)
        means.append(float(mean.lines[0].get_ydata()[0]))
    _ratio_axis(ax)
    ax.set_yticks(range(len(table)), [_comparison_label(r, several, names)
                                      for _, r in table.iterrows()])
    ax.set_ylim(len(table) - 0.5, -0.5)  # one row per comparison, the first on top
    ax.set_xlabel("time to target, router / baseline (×, log scale; < 1 is faster)")
    ax.set_ylabel("router vs baseline (paired by seed)")
    handles, labels = ax.get_legend_handles_labels()
    uniq = dict(zip(labels, handles))
    ax.legend(uniq.values(), uniq.keys(), loc="upper left", bbox_to_anchor=(1.02, 1),
              frameon=False, fontsize=8)
    ax.set_title(f"Time to target vs baseline, per seed — {pl.device_title(df)}")
    summary = table[keys + ["n", "time_ratio", "time_lo", "time_hi"]].assign(
        quantity="time", kind="gmean", y=means).rename(
        columns={"time_ratio": "ratio", "time_lo": "lo", "time_hi": "hi"})
    return fig, pd.concat([*drawn, summary], ignore_index=True)


def time_to_target(df: pd.DataFrame, out_dir: Path | str) -> Path | None:
    """Time-to-target ratio to each baseline (router / baseline, log scale), one row per
    comparison (:func:`time_to_target_figure`): each seed's ratio as a dot, a not-converged pair
    as an open triangle at its bound pointing where the true ratio lies (left out of the
    interval), and the geometric mean as a black diamond with its t-interval, all on the
    comparison's row.

    Returns:
        ``<out_dir>/time_to_target.png`` with ``time_to_target.csv`` (the points, then the
        geometric mean, ``lo`` and ``hi`` of each comparison; ``y`` the row each is drawn on),
        or ``None`` when no comparison has a pair where both runs reached the target.
    """
    built = time_to_target_figure(df)
    return None if built is None else pl.save_with_data(built[0], out_dir, "time_to_target",
                                                        built[1])


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
    table = race.comparison_table(df)
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
    names = pl.variant_labels(df)
    ax.set_yticks(range(len(table)), [f"{_comparison_label(r, several, names)} (n={r['n']})"
                                      for _, r in table.iterrows()])
    ax.set_ylim(len(table) - 0.5, -0.5)  # one row per comparison, the first on top
    ax.set_xlabel("ratio to baseline (×, log scale): time = steps × time per step")
    ax.set_ylabel("router vs baseline (paired by seed)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1), frameon=False, fontsize=8)
    ax.set_title(f"Time to target = steps × time per step, vs baseline — {pl.device_title(df)}")
    return pl.save_with_data(fig, out_dir, "decomposition", pd.DataFrame(rows))


#: Figure functions of this module in report order.
FIGURES = {
    "loss_curves": loss_curves,
    "time_to_target": time_to_target,
    "decomposition": decomposition,
}
