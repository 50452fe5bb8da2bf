"""Each router against the router its paper measures it against: HAARES and WAV v1 against Block
AttnRes (arXiv:2606.06564), paired round by round.

The seeds suite exists to say what the multi-resolution routers cost over Block AttnRes. A
router's class names that router (``routers.paper_baseline``); where both ran in one interleaved
group (the same session, timing attempt, backend, compile mode and scope, mode and shape; the same
impl), their rounds are pairs, so the ratio is the median over rounds of router time / paper
baseline time of the same round, with the interval of :func:`harness.stats.sequential.ratio_interval`
(the stopping rule's where a rule timed the group, else a 95 % bootstrap). A re-timed router is
re-timed with its paper baseline as a partner (:func:`harness.sweep.timed.partners`), so its last
timing still pairs. Nothing is divided across groups: where the paper baseline did not run in the
router's group, the table says so (``no_pair``) and the sentences quote no ratio.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from harness.stats.sequential import ratio_interval
from harness.timing.timer import median_iqr
from routers import BASELINE, paper_baseline

from . import frame
from .paired import CONF, PAIR_KEYS, TIMING_KEYS, VARIANT_KEYS, interval_label, noise_by_case, paired_rows, _own

#: A noise reason about a side's interval against prenorm (``ci_width_rel``), not about this
#: ratio, whose own interval is beside it: left out of ``noisy``.
OTHER_INTERVAL = "ci_width_rel"
#: Columns of :func:`paired_vs_paper_table`.
COLUMNS = [*(k for k in PAIR_KEYS if k != "session"), *VARIANT_KEYS, "paper_baseline", "pairs",
           "median_ms", "paper_ms", "vs_paper", "vs_paper_lo", "vs_paper_hi", "interval", "noisy", "no_pair"]
#: Report headers and number formats (merged into :data:`reports.render.COLUMN_STYLE`).
COLUMN_STYLE = {
    "paper_baseline": ("paper baseline (same impl)", None), "paper_ms": ("paper baseline (ms)", "{:.3f}"),
    "no_pair": ("no paired ratio", None),
    "vs_paper": ("vs paper baseline, paired (median of pairs, ×)", "{:.3f}"),
    "vs_paper_lo": ("CI low", "{:.3f}"), "vs_paper_hi": ("CI high", "{:.3f}"),
}
METHOD = ("Each router its paper measures against a baseline besides prenorm (HAARES and WAV v1: "
          "Block AttnRes, arXiv:2606.06564), against that baseline with the same impl, timed in the "
          "same interleaved group: ratio = median over rounds of router time / baseline time of the "
          "same round, with the stopping rule's interval when timed to a precision target, else a "
          f"{CONF:.0%} bootstrap CI. A row without a ratio says why (the baseline did not run in "
          "that group); no ratio is formed across groups.")
NO_TABLE = ("No router with a paper baseline (haares, wav_v1) ran in these runs.")
NO_DATA = ("No data for this figure: it needs haares or wav_v1 timed in one group with block_attnres "
           "of the same impl (the seeds suite: routerbench run).")


def _bases(routers) -> dict[str, str]:
    """router -> its paper baseline, for the routers that have one."""
    return {r: b for r in routers if isinstance(r, str) and r != BASELINE and (b := paper_baseline(r))}


def paired_vs_paper_table(df: pd.DataFrame, n_boot: int = 2000, conf: float = CONF,
                          seed: int = 0) -> pd.DataFrame:
    """Every timed router that has a paper baseline, against it, pair by pair.

    Args:
        df: a frame of :func:`reports.frame.load_frame`.
        n_boot, conf, seed: of :func:`harness.stats.bootstrap.bootstrap_ratio_ci`.

    Returns:
        :data:`COLUMNS`, one row per timing (:data:`reports.paired.PAIR_KEYS`, the router's last
        own attempt) and variant of such a router: ``paper_baseline`` (the baseline's variant,
        e.g. ``block_attnres [two_phase]``), ``pairs`` (rounds both timed), ``median_ms`` and
        ``paper_ms`` over those rounds, ``vs_paper`` (median of router / baseline per round; above 1
        the router is slower) with ``vs_paper_lo``/``vs_paper_hi`` and ``interval`` (which interval),
        ``noisy`` (why the router's timing or the baseline's last timing crossed a noise
        threshold, ``""`` when quiet; a side's interval against prenorm, ``ci_width_rel``, is
        not this ratio's and is left out) and ``no_pair`` (why there is no ratio: ``"block_attnres
        two_phase not timed in this group"``; empty when there is one). An empty frame when no
        such router was timed.
    """
    rows = paired_rows(df)
    bases = _bases(rows["router"].unique()) if len(rows) else {}
    if not bases:
        return pd.DataFrame(columns=COLUMNS)
    why = noise_by_case(df, df.attrs.get("noise_thresholds"), by_session=True)
    out = []
    for gk, g in rows.groupby([*PAIR_KEYS, *TIMING_KEYS], dropna=False, sort=False):
        own = _own(g)
        for vk, v in own[own["router"].isin(list(bases))].groupby(list(VARIANT_KEYS), sort=False):
            router, impl = vk[0], vk[2]
            cand = g[(g["router"] == bases[router]) & (g["impl"] == impl)]
            row = {**dict(zip(PAIR_KEYS, gk)), **dict(zip(VARIANT_KEYS, vk)),
                   "paper_baseline": f"{bases[router]} [{impl}]", "pairs": 0, "noisy": "", "no_pair": ""}
            mine = v.groupby("pair")["value"].median()
            if not cand.empty:
                cand = cand[cand["variant"] == sorted(cand["variant"].unique())[0]]
                base = cand.groupby("pair")["value"].median()
                common = mine.index.intersection(base.index).sort_values()
            if cand.empty or not len(common):
                row["no_pair"] = f"{bases[router]} {impl} not timed in this group"
                out.append(row)
                continue
            a, b = base[common].tolist(), mine[common].tolist()
            ratio, lo, hi = ratio_interval(a, b, interval_label(v)[0], n_boot=n_boot, seed=seed, boot_conf=conf)
            reasons = [f"{side}: {r}" for side, rows_ in ((router, v), (bases[router], cand))
                       for r in why.get((rows_["case_key"].iloc[0], rows_["session"].iloc[0]), [])
                       if not r.startswith(OTHER_INTERVAL)]
            row.update(pairs=len(common), median_ms=median_iqr(b)[0], paper_ms=median_iqr(a)[0], vs_paper=ratio,
                       vs_paper_lo=lo, vs_paper_hi=hi, interval=interval_label(v)[1], noisy="; ".join(reasons))
            out.append(row)
    if not out:
        return pd.DataFrame(columns=COLUMNS)
    t = pd.DataFrame(out).reindex(columns=COLUMNS)
    return frame.sort_cases(t).reset_index(drop=True)


def paper_ratio_figure(df: pd.DataFrame, out_dir: Path | str,
                       table: pd.DataFrame | None = None) -> Path | None:
    """The per-pair ratio of each router to its paper baseline with its interval, one panel per
    setting and shape (:func:`reports.paired.paired_ratio_grid`'s layout).

    Returns:
        ``<out_dir>/paper_ratios.png``, or ``None`` without a paired ratio.
    """
    from .paired import paired_ratio_grid
    from .plotting import save_png
    t = paired_vs_paper_table(df) if table is None else table
    t = t[t["vs_paper"].notna()] if len(t) else t
    if t.empty:
        return None
    t = t.rename(columns={"vs_paper": "ratio", "vs_paper_lo": "ratio_lo", "vs_paper_hi": "ratio_hi"})
    base = ", ".join(sorted({b.split(" [")[0] for b in t["paper_baseline"]}))
    fig = paired_ratio_grid(t, xlabel=f"time / {base} (×, log)",
                            title=f"Per-pair step-time ratio to {base} (the paper baseline, same impl)")
    return save_png(fig, Path(out_dir) / "paper_ratios.png", 110)


#: Figures of this module, by name (the report adds them to :data:`reports.time_figures.FIGURES`).
FIGURES = {"paper_ratios": paper_ratio_figure}
