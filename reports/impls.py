"""Implementations side by side: each impl's step time relative to the fastest impl of its case,
with the parity error that let it be timed (:mod:`harness.sweep.parity`).

A case here is a router, its options, backend, compile mode, mode, workload and shape; its impls
(``naive``, ``two_phase``, peer kernels of ``routers/peers/``) are compared by median step time.
Only an impl that passed parity has a time; one that failed is listed with its error and no time.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only

import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

from routers import impls  # noqa: E402
from routers.impls import FAMILIES, REFERENCE  # noqa: E402

from . import frame  # noqa: E402
from .plotting import save_png  # noqa: E402

#: Every router with more than one implementation (``routers.impls.FAMILIES``).
FAMILY_ROUTERS = tuple(r for f in FAMILIES.values() for r in f.routers)

#: What makes a case; impls of one case are compared.
CASE = ("run_id", "router", "options", "backend", "compile_mode", "compile_scope", "mode", "workload",
        *frame.SHAPE_COLS)
COLUMNS = [*CASE, "impl", "median_ms", "vs_fastest", "parity_error", "parity"]
COLUMN_STYLE = {"vs_fastest": ("step time / fastest impl (×)", "{:.3f}"),
                "parity_error": ("parity error vs naive (max rel)", "{:.1e}"), "parity": ("parity", None)}
METHOD = ("Each implementation of a router against the others on the same case (router, options, shape): "
          "median step "
          "time over the fastest impl's (1.00 = fastest), beside the parity error of the check run "
          "before it was timed (largest relative error of the output and gradients against naive on "
          "random parameters far from the init; naive is the reference and has none).")
NO_TABLE = "Only one implementation per case in these runs (add --impls naive,two_phase,…)."


def impl_table(df: pd.DataFrame) -> pd.DataFrame:
    """One row per case and impl of the block routers timed with more than one impl.

    Returns:
        :data:`COLUMNS`: ``median_ms`` (NaN when the impl was not timed), ``vs_fastest`` (median /
        the smallest median of the case's impls), ``parity_error`` (NaN for naive) and ``parity``
        (``ok``, the failure message, or ``reference`` for naive).
    """
    cost = frame.cost_rows(df)
    cost = cost[cost["router"].isin(FAMILY_ROUTERS)]
    if cost.empty:
        return pd.DataFrame(columns=COLUMNS)
    st = frame.ok_rows(cost, "step_time")
    # with no ok timing at all (a cudagraph-only run on a CPU) the empty unit column maps to no float
    scale = st["unit"].map(frame.TO_MS).astype(float).fillna(1.0)
    med = (st.assign(value=st["value"].astype(float) * scale)
           .groupby([*CASE, "impl"], dropna=False)["value"].median().rename("median_ms").reset_index())
    par = cost[cost["metric"] == "parity_error"]
    par = par.groupby([*CASE, "impl"], dropna=False).agg(
        parity_error=("value", "last"), status=("status", "last"), error=("error", "last")).reset_index()
    t = med.merge(par, on=[*CASE, "impl"], how="outer")
    if t.empty:
        return pd.DataFrame(columns=COLUMNS)
    t["parity"] = [("reference" if i == REFERENCE else "ok" if s == "ok" else (e or "failed"))
                   for i, s, e in zip(t["impl"], t["status"].fillna("ok"), t["error"].fillna(""))]
    bad = cost[(cost["metric"] == "step_time") & (cost["status"] != "ok")]
    why = bad.groupby([*CASE, "impl"], dropna=False)["error"].last().rename("why").reset_index()
    t = t.merge(why, on=[*CASE, "impl"], how="left")
    untimed = t["median_ms"].isna() & t["why"].notna() & ~t["parity"].str.startswith("parity failed")
    t.loc[untimed, "parity"] = t.loc[untimed, "parity"] + "; not timed: " + t.loc[untimed, "why"].astype(str)
    n = t.groupby(list(CASE), dropna=False)["impl"].transform("nunique")
    t = t[n > 1].copy()
    if t.empty:
        return pd.DataFrame(columns=COLUMNS)
    t["vs_fastest"] = t["median_ms"] / t.groupby(list(CASE), dropna=False)["median_ms"].transform("min")
    return frame.sort_cases(t)[COLUMNS].reset_index(drop=True)


def against() -> dict[str, str]:
    """impl → the impl it is read against, as each registered impl declares it
    (``routers.impls.Impl.against``: ``lean``'s backward against the autograd backward of the same
    two-phase forward)."""
    return {n: impls.lookup(n).against for n in impls.names() if impls.lookup(n).against is not None}


VS_COLUMNS = ["run_id", "backend", "compile_mode", "compile_scope", "mode", "workload", *frame.SHAPE_COLS,
              "router", "options", "impl", "against", "pairs", "vs_ratio", "vs_lo", "vs_hi"]
COLUMN_STYLE.update({"vs_ratio": ("(impl / prenorm) / (against / prenorm) (×)", "{:.3f}"),
                     "vs_lo": ("CI low", "{:.3f}"), "vs_hi": ("CI high", "{:.3f}")})
VS_METHOD = ("An implementation against the one it replaces (lean against two_phase: the same "
             "forward, a backward that keeps the sources once), both timed in one paired group with "
             "prenorm: the ratio of their paired ratios to prenorm, median(impl/prenorm) / "
             "median(against/prenorm), over the rounds both timed, with a 95% bootstrap interval "
             "that resamples those rounds jointly, since each round timed both "
             "(harness.stats.bootstrap.bootstrap_ratio_of_ratios, joint; no interval below 5 "
             "rounds). Below 1: the impl is faster. lean's FLOP rows are its naive twin's (fvcore "
             "cannot see into its Functions): its router FLOP share reads as naive's, not as a "
             "larger cost; what its backward recomputes is the recompute_flops_dispatch row.")
NO_VS_TABLE = ("No implementation was timed beside the one it is read against in a paired group "
               "(add --impls two_phase,lean with prenorm among --routers).")


def _same_rounds(a: dict, b: dict) -> tuple[dict, dict]:
    """The two sides of :func:`impl_vs_table` on the rounds both timed (their pair numbers)."""
    ra = a["rows"].groupby("pair")["value"].median()
    rb = b["rows"].groupby("pair")["value"].median()
    base = a["base_rows"].groupby("pair")["value"].median()
    common = ra.index.intersection(rb.index).intersection(base.index).sort_values()
    return ({"prenorm": base[common].tolist(), "times": ra[common].tolist()},
            {"prenorm": base[common].tolist(), "times": rb[common].tolist()})


def impl_vs_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per paired group (run, session, setting, shape) and router: each impl of :func:`against`
    timed beside the impl it is read against, as a ratio of ratios with its bootstrap interval.

    Returns:
        :data:`VS_COLUMNS`; ``pairs`` is the rounds both timed. Empty when no such pair was timed.
    """
    from harness.stats.bootstrap import bootstrap_ratio_of_ratios

    from .paired import pairs_by_variant
    found: dict[tuple, dict] = {}
    for p in pairs_by_variant(df):
        v = p["variant_keys"]
        found.setdefault((tuple(p["group"].items()), tuple(p["timing"].items()), v["router"], v["options"]),
                         {})[v["impl"]] = p
    rows = []
    for (group, _timing, router, options), by_impl in found.items():
        for impl, ref in against().items():
            if impl in by_impl and ref in by_impl:
                a, b = _same_rounds(by_impl[impl], by_impl[ref])
                r, lo, hi = bootstrap_ratio_of_ratios(a["prenorm"], a["times"], b["prenorm"], b["times"], joint=True)
                rows.append({**dict(group), "router": router, "options": options, "impl": impl,
                             "against": ref, "pairs": len(a["times"]), "vs_ratio": r, "vs_lo": lo, "vs_hi": hi})
    if not rows:
        return pd.DataFrame(columns=VS_COLUMNS)
    return frame.sort_cases(pd.DataFrame(rows))[VS_COLUMNS].reset_index(drop=True)


def impl_figure(df: pd.DataFrame, out_dir: Path | str) -> Path | None:
    """Bars of step time / fastest impl per case, the parity error written beside each bar
    (``impls.png`` with its data as ``impls.csv``); None with fewer than two impls of a case."""
    t = impl_table(df)
    t = t[t["median_ms"].notna()]
    if t.empty:
        return None
    t = t.assign(case=t["router"] + " · " + t.apply(frame.backend_text, axis=1) + " · " + t["mode"] + " · " + t["workload"]
                 + " d" + t["d_model"].astype(str) + " L" + t["n_layers"].astype(str))
    if t["run_id"].nunique() > 1:  # one bar per case and impl: the same case of two runs apart
        t["case"] = t["run_id"].astype(str) + " · " + t["case"]
    out = Path(out_dir) / "impls.png"
    t.to_csv(out.with_suffix(".csv"), index=False)
    cases = list(dict.fromkeys(t["case"]))
    fig, ax = plt.subplots(figsize=(8, 0.5 + 0.45 * len(t)))
    sns.barplot(data=t, y="case", x="vs_fastest", hue="impl", ax=ax, order=cases, orient="h")
    for container, impl in zip(ax.containers, [h.get_text() for h in ax.get_legend().get_texts()]):
        sub = t[t["impl"] == impl].set_index("case")
        labels = []
        for c in cases:
            if c in sub.index:
                err = sub.loc[c, "parity_error"]
                labels.append("reference" if impl == REFERENCE else f"parity {err:.0e}" if err == err else "")
        ax.bar_label(container, labels=labels[:len(container)], padding=3, fontsize=7)
    ax.axvline(1.0, color="0.4", linestyle="--", linewidth=1)
    ax.set_xlabel("step time / fastest impl of the case (×); label: parity error vs naive")
    ax.set_ylabel("")
    ax.set_title("Implementations: step time relative to the fastest, with their parity error")
    return save_png(fig, out)


FIGURES = {"impls": impl_figure}
