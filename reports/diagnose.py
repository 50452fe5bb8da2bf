"""Figures and CSVs of ``routerbench diagnose``: what a trained router learned (the numbers come
from :mod:`harness.training.diagnose`).

Files written into the output directory (default ``RUN_DIR/diagnose/``):

- ``depth_weights.csv``: long format, one row per run, read and source: ``run, case_key, router,
  seed, mode, step, read, read_label, source, source_kind (state|detail), order, weight`` (the mean
  softmax weight over batches, sequences and positions; a read's weights sum to 1). Reads are
  sublayers 0..2L−1 and the readout (``read`` 2L, ``read_label`` ``out``).
  ``depth_weights_<run>.png``: its heatmap (reads × sources) per run of an AttnRes-family router.
- ``detail_share.csv`` / ``.png`` (``haares``, ``wav_v1``): per read, the summed weight on
  detail sources, their count and the count of sources.
- ``detail_bias.csv`` / ``.png``: the learned logit bias of each read and detail kind as the
  router stores it (``detail_bias``, shape (2L+1, kinds)), its init β_D, and whether the read's
  pool holds a detail of that kind (reads that hold none never train their bias).
- ``hidden_rms.csv`` / ``.png``: per run and depth, the RMS of each sublayer's input h_k (and of
  h_out at depth 2L) and of its update u_k (arXiv:2603.15031's view of PreNorm dilution).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns

from harness.training.diagnose import TrainedRun, diagnose_run_dir

from .plotting import save_png

RUN_COLUMNS = ("run", "case_key", "router", "seed", "mode", "step")


def frames(results: list[tuple[TrainedRun, dict[str, list[dict]]]]) -> dict[str, pd.DataFrame]:
    """The long frames ``weights``, ``bias``, ``rms`` of :func:`harness.training.diagnose.diagnose_run_dir`'s
    results, each row prefixed with its run's columns (:data:`RUN_COLUMNS`); ``share`` derived
    from ``weights``: per run and read, ``detail_share`` (sum of detail weights, unitless),
    ``n_detail``, ``n_sources`` (runs of routers with detail bases only)."""
    out: dict[str, list[dict]] = {"weights": [], "bias": [], "rms": []}
    for run, diag in results:
        head = dict(zip(RUN_COLUMNS, (run.label, run.key, run.router, run.seed, run.mode, run.step)))
        for name in out:
            out[name] += [{**head, **row} for row in diag[name]]
    f = {name: pd.DataFrame(rows) for name, rows in out.items()}
    if not f["bias"].empty:                                  # runs of routers with detail bases
        w = f["weights"][f["weights"]["run"].isin(set(f["bias"]["run"]))]
        w = w.assign(detail=w["weight"].where(w["source_kind"] == "detail", 0.0),
                     is_detail=w["source_kind"] == "detail")
        f["share"] = (w.groupby([*RUN_COLUMNS, "read", "read_label"], sort=False)
                       .agg(detail_share=("detail", "sum"), n_detail=("is_detail", "sum"),
                            n_sources=("source", "size")).reset_index())
    else:
        f["share"] = pd.DataFrame()
    return f


def _read_order(t: pd.DataFrame) -> list[str]:
    return list(t.sort_values("read")["read_label"].drop_duplicates())


def depth_weight_heatmap(w: pd.DataFrame, run: str, out_dir: Path) -> Path:
    """Heatmap of one run's mean depth weights, reads (rows) × sources (columns), written to
    ``depth_weights_<run>.png``; a source a read does not see is blank."""
    t = w[w["run"] == run]
    cols = list(t.sort_values("order")["source"].drop_duplicates())
    grid = t.pivot_table(index="read_label", columns="source", values="weight").reindex(
        index=_read_order(t), columns=cols)
    annot = grid.shape[1] <= 16 and grid.shape[0] <= 26
    fig, ax = plt.subplots(figsize=(max(4.5, 0.55 * len(cols) + 2.5), max(3.0, 0.32 * len(grid) + 1.6)))
    sns.heatmap(grid, ax=ax, vmin=0.0, vmax=1.0, cmap="viridis", annot=annot, fmt=".2f",
                annot_kws={"fontsize": 7}, mask=grid.isna(), cbar_kws={"label": "mean softmax weight"},
                linewidths=0.3, linecolor="white")
    first = t.iloc[0]
    ax.set_title(f"{run}: depth-softmax weights at step {first['step']}\n"
                 "(mean over validation tokens; blank: not a source of that read)", fontsize=9)
    ax.set_xlabel("source (e: embedding, Cb: block b, P: partial block, D/P.kind: detail, uk: sublayer k)")
    ax.set_ylabel("read (sublayer, out: readout)")
    return save_png(fig, out_dir / f"depth_weights_{run}.png")


def _by_read(ax, t: pd.DataFrame, y: str, label: str) -> None:
    """One line per run against the read index, tick labels from ``read_label``."""
    for run, g in t.groupby("run", sort=False):
        g = g.sort_values("read")
        ax.plot(g["read"], g[y], marker="o", ms=3, label=f"{run}{label}")
    reads = t.drop_duplicates("read").sort_values("read")
    step = max(1, len(reads) // 16)
    ax.set_xticks(reads["read"][::step], reads["read_label"][::step], rotation=60, fontsize=7)


def detail_share_figure(share: pd.DataFrame, out_dir: Path) -> Path:
    """Share of each read's weight on detail sources, one line per run, over the reads whose pool
    holds a detail source (``detail_share.png``; the CSV has every read)."""
    fig, ax = plt.subplots(figsize=(7, 3.6))
    _by_read(ax, share[share["n_detail"] > 0], "detail_share", "")
    ax.set_ylim(bottom=0)
    ax.set_xlabel("read (sublayer, out: readout)")
    ax.set_ylabel("weight on detail sources")
    ax.set_title("Detail share of the depth softmax (reads with a detail source; mean over "
                 "validation tokens)", fontsize=9)
    ax.legend(fontsize=7, frameon=False)
    return save_png(fig, out_dir / "detail_share.png")


def detail_bias_figure(bias: pd.DataFrame, out_dir: Path) -> Path:
    """Learned detail biases of the reads whose pool holds that detail kind, one line per run and
    kind; the dashed line is the init β_D (``detail_bias.png``)."""
    fig, ax = plt.subplots(figsize=(7, 3.6))
    used = bias[bias["used"]]
    for kind, g in used.groupby("kind", sort=False):
        _by_read(ax, g, "bias", f" · {kind}")
    for init in bias["init"].drop_duplicates():
        ax.axhline(init, ls="--", lw=0.8, color="grey")
    ax.set_xlabel("read (sublayer, out: readout)")
    ax.set_ylabel("detail logit bias")
    ax.set_title("Learned detail biases (reads with a detail source; dashed: init)", fontsize=9)
    ax.legend(fontsize=7, frameon=False)
    return save_png(fig, out_dir / "detail_bias.png")


def hidden_rms_figure(rms: pd.DataFrame, out_dir: Path) -> Path:
    """RMS of each sublayer's input h_k (and h_out) and of its update u_k by depth, one line per
    run, log scale (``hidden_rms.png``)."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8), layout="constrained")
    for ax, (q, title) in zip(axes, (("read_input", "input h_k of sublayer k (out: h_out)"),
                                     ("update", "update u_k of sublayer k"))):
        t = rms[rms["quantity"] == q].rename(columns={"depth": "read", "depth_label": "read_label"})
        _by_read(ax, t, "rms", "")
        ax.set_yscale("log")
        ax.set_xlabel("depth (sublayer)")
        ax.set_title(title, fontsize=9)
    axes[0].set_ylabel("RMS over d, mean over tokens")
    axes[0].legend(fontsize=7, frameon=False)
    fig.suptitle("Hidden-state RMS by depth (the AttnRes paper's view of PreNorm dilution)", fontsize=10)
    return save_png(fig, out_dir / "hidden_rms.png")


def write_frames(f: dict[str, pd.DataFrame], out_dir: Path | str) -> list[Path]:
    """Write the CSVs and figures of :func:`frames` into ``out_dir`` (created).

    Returns:
        the paths written, CSV before its figure; nothing for a frame that is empty (no
        AttnRes-family router: no weights; no detail router: no share and no bias).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths: list[Path] = []

    def csv(frame: pd.DataFrame, name: str) -> None:
        frame.to_csv(out / name, index=False)
        paths.append(out / name)

    w = f["weights"]
    if not w.empty:
        csv(w, "depth_weights.csv")
        paths += [depth_weight_heatmap(w, run, out) for run in w["run"].drop_duplicates()]
    if not f["share"].empty:
        csv(f["share"], "detail_share.csv")
        paths.append(detail_share_figure(f["share"], out))
    if not f["bias"].empty:
        csv(f["bias"], "detail_bias.csv")
        paths.append(detail_bias_figure(f["bias"], out))
    csv(f["rms"], "hidden_rms.csv")
    paths.append(hidden_rms_figure(f["rms"], out))
    plt.close("all")
    return paths


def write_diagnostics(run_dir: Path | str, out_dir: Path | str | None = None, batches: int = 4,
                      data: Path | str | None = None, device: str = "cpu",
                      note: Callable[[str], None] | None = None) -> list[Path]:
    """Diagnose every training run of ``run_dir`` from its last checkpoint and write the CSVs and
    figures (module docstring); what ``routerbench diagnose`` and the end of a training run call.

    Args:
        run_dir: a run directory holding training runs and their checkpoints.
        out_dir: where to write (default ``run_dir/diagnose``).
        batches: fixed validation batches per run (the run's batch size and sequence length).
        data: the corpus dir, when the one the run's manifest records is not on this machine.
        device: where the models run (``cpu`` default).
        note: receives one line per run skipped (without a checkpoint, or in progress) and per run
            read from a resume checkpoint, naming its step (:func:`harness.training.diagnose.diagnose_run_dir`).

    Returns:
        the paths written.

    Raises:
        ConfigError: no training runs, no checkpoint, every run in progress, an unreadable corpus
            or checkpoint (one line naming ``RUN_DIR`` or the option).
    """
    notes: list[str] = []
    results = diagnose_run_dir(run_dir, batches, data, device, notes)
    if note is not None:
        for line in notes:
            note(line)
    return write_frames(frames(results), Path(out_dir) if out_dir else Path(run_dir) / "diagnose")
