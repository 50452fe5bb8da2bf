"""The training race: each router against its baselines, paired by seed (MEASUREMENT.md, "Time to
target loss").

:func:`comparison_table` pairs the runs of :func:`reports.training.run_frame` by seed within one run
and backend: the time-to-target ratio and its two factors (steps, time per step) from
:func:`harness.stats.seeds.decompose`, the loss at the token budget (paired t-test) and the loss at
equal wall-clock time; :func:`ratio_points` gives the per-seed ratios the figures draw, and
:func:`sentences` one sentence per comparison (:mod:`reports.sentences`).

A diverged run enters every comparison as ``diverged``: no loss of it (not even its last finite
one) is ever a result. A run at or below the target at step 0 has no time to target to divide by:
its pairs are ``missing``, and say why. Every statistic is :mod:`harness.stats`'s; this module
only pairs the runs.
"""

from __future__ import annotations

import math
from typing import Iterator

import numpy as np
import pandas as pd

from harness.stats import curves, seeds

from . import sentences as say
from . import training
from .frame import TRAIN_MODE

COMPARISON_COLUMNS = [
    "run_id", "backend", "router", "variant", "baseline", "target_loss", "conf", "seeds", "n",
    "censored", "diverged", "missing", "dropped", "not_measured", "load",
    "time_ratio", "time_lo", "time_hi", "time_per_seed",
    "steps_ratio", "steps_lo", "steps_hi", "steps_per_seed",
    "step_time_ratio", "step_time_lo", "step_time_hi",
    "loss_n", "loss_router", "loss_base", "loss_diff", "loss_diff_lo", "loss_diff_hi",
    "ppl_change_pct", "loss_p", "loss_welch_p",
    "t_star", "wall_n", "wall_short", "wall_loss_router", "wall_loss_base", "wall_diff",
    "wall_diff_lo", "wall_diff_hi", "wall_p"]


POINT_COLUMNS = ["run_id", "backend", "variant", "baseline", "quantity", "seed", "kind", "ratio"]


METHOD = ("Protocol (docs/MEASUREMENT.md): untimed warm-up, then weights, optimizer and data order "
          "reset; validation on fixed batches every few steps, off the clock; the crossing of the "
          "target is interpolated linearly between the two evaluations around it. Runs are paired "
          "by seed (same data order and initial weights): ratio = router / baseline per seed, "
          f"geometric mean with a {seeds.CONF:.0%} t-interval on the log ratios (n − 1 degrees "
          "of freedom); time ratio = steps ratio × step-time ratio. A run that never reached the "
          "target is a bound (\"> x\": the ratio is at least x), counted and left out of the "
          "interval; a diverged run is never a value. Loss at the token budget: paired t-test "
          "(Welch's p beside it, secondary). Loss at equal wall-clock: each run's validation loss "
          "interpolated at T* = the smallest median training time over the routers of the run; "
          "a pair whose run ended before T* cannot be read there and is left out.")


def _obs(r: pd.Series, value: str, bound: str) -> seeds.Obs:
    """One run as one side of a pair: its ``value`` column, or a bound (``bound`` column) when it
    did not converge. A run that failed, was skipped or has no verdict is ``missing``; so are a
    not-converged run without a bound (old records without any clock) and a run at the target
    from step 0 (a value of 0 forms no ratio)."""
    if r["status"] == "diverged":
        return seeds.Obs(None, "diverged")
    if r["status"] == "not converged" and np.isfinite(r[bound]) and r[bound] > 0:
        return seeds.Obs(None, "not_converged", bound=float(r[bound]))
    if r["status"] == "ok" and np.isfinite(r[value]) and r[value] > 0:
        return seeds.Obs(float(r[value]))
    return seeds.Obs(None, "missing")


def _by_seed(runs: pd.DataFrame) -> dict[int, pd.Series]:
    return {int(r["seed"]): r for _, r in runs.iterrows()}


def _wall_loss(curve: pd.DataFrame, t_star: float) -> float:
    c = curve.dropna(subset=["elapsed"]).sort_values("step")
    return curves.value_at(c["elapsed"].to_numpy(), c["val_loss"].to_numpy(), t_star)


def _t_star(measured: pd.DataFrame) -> float:
    """T* of one run and backend: the smallest median clock (``train_time``, else the last
    evaluation's) over its routers, diverged and failed runs left out."""
    alive = measured[measured["status"].isin(["ok", "not converged"])]
    med = alive.groupby("variant")["clock_end"].median().dropna()
    return float(med.min()) if len(med) else math.nan


def _pairs(df: pd.DataFrame) -> Iterator[dict]:
    """Each (run, backend, router variant, baseline variant) of the measured runs, with the runs of
    both sides by seed, their curves and T*."""
    runs = training.run_frame(df)
    measured = runs[runs["mode"] == TRAIN_MODE]
    if measured.empty:
        return
    curve = training.curves(df)
    for (run_id, backend), g in measured.groupby(["run_id", "backend"], sort=False):
        t_star = _t_star(g)
        bases = training.baselines_for(g["router"].unique())
        variants = g[["router", "variant"]].drop_duplicates()  # already in report order
        c = curve[(curve["run_id"] == run_id) & (curve["backend"] == backend)
                  & (curve["mode"] == TRAIN_MODE)]
        for router, variant in variants.itertuples(index=False):
            for base in bases.get(router, ()):
                for bvariant in variants.loc[variants["router"] == base, "variant"]:
                    yield {"run_id": run_id, "backend": backend, "router": router,
                           "variant": variant, "baseline": bvariant, "t_star": t_star,
                           "treat": _by_seed(g[g["variant"] == variant]),
                           "base": _by_seed(g[g["variant"] == bvariant]),
                           "treat_curves": c[c["variant"] == variant],
                           "base_curves": c[c["variant"] == bvariant]}


def _why(side: dict[int, pd.Series], seed: int) -> str:
    """Why one side of a seed's pair cannot form a ratio ("" when it can)."""
    if seed not in side:
        return "absent"
    r = side[seed]
    if training.at_start(r):
        return training.AT_START
    return "" if r["status"] == "ok" else r["status"]


def _bound_words(entry: str, who: str, base: str) -> str:
    """What a censored time ratio (``"> 1.6"``, ``"< 0.8"`` of :func:`harness.stats.seeds.paired_ratio`)
    says, in words: ``" (its time-to-target ratio is above 1.6: haares trained 1.6× prenorm's time to
    target without reaching it)"``; "" for any other entry."""
    if entry[:1] == ">":
        x = entry[1:].strip()
        return (f" (its time-to-target ratio is above {x}: {who} trained {x}× {base}'s time to target "
                "without reaching it)")
    if entry[:1] == "<":
        x = entry[1:].strip()
        return (f" (its time-to-target ratio is below {x}: {who} reached the target in {x}× the time "
                f"{base} trained without reaching it)")
    return ""


def _dropped(p: dict, per_seed: dict) -> str:
    """Which seeds were left out of the time interval and why, e.g. ``"seed 2: haares not
    converged (its time-to-target ratio is above 1.2: haares trained 1.2× prenorm's time to target
    without reaching it)"``."""
    notes = []
    for seed, entry in per_seed.items():
        if not isinstance(entry, str):
            continue
        why = [f"{name} {w}" for name, side in ((p["variant"], p["treat"]),
                                                (p["baseline"], p["base"]))
               if (w := _why(side, seed))]
        bound = _bound_words(entry, p["variant"], p["baseline"])
        notes.append(f"seed {seed}: {', '.join(why) or 'incomplete record'}{bound}")
    return "; ".join(notes)


def _load(p: dict) -> str:
    """Which seeds' two sides trained under different load, e.g. ``"seed 0: CPU pressure haares
    0.04, prenorm 0.62 over their own steps"``: their ``train_cpu_pressure`` readings differ by
    more than the noisy-group threshold ``cpu_pressure_max`` (:mod:`harness.timing.noise`). On a
    shared machine a sequential race's runs meet different loads; an interleaved one's share it."""
    from harness.timing.noise import THRESHOLDS
    notes = []
    for seed in sorted(set(p["treat"]) & set(p["base"])):
        a, b = (side[seed].get("train_cpu_pressure") for side in (p["treat"], p["base"]))
        if a is None or b is None or pd.isna(a) or pd.isna(b) or abs(a - b) <= THRESHOLDS["cpu_pressure_max"]:
            continue
        notes.append(f"seed {seed}: CPU pressure {p['variant']} {a:.2f}, {p['baseline']} {b:.2f} over their "
                     "own steps")
    return "; ".join(notes)


def _loss_test(treat: dict[int, float], base: dict[int, float], conf: float) -> dict:
    t = seeds.paired_t(treat, base, conf)
    ppl = seeds.perplexity_change(t.mean_treat, t.mean_base) if t.n else math.nan
    return {"n": t.n, "treat": t.mean_treat, "base": t.mean_base, "diff": t.mean_diff,
            "lo": t.lo, "hi": t.hi, "p": t.p, "welch_p": t.welch_p, "ppl": ppl}


#: Per quantity: the column of a run that reached the target, and of the bound when it did not.
_QUANTITIES = {"time": ("time_to_target", "clock_end"), "steps": ("steps_to_target", "step_budget")}


#: Runs whose losses are results: a not-converged run's loss is one, a diverged run's never.
_LIVE = ("ok", "not converged")


def _side(runs: dict[int, pd.Series], quantity: str) -> dict[int, seeds.Obs]:
    """One side of a pair, seed -> :class:`harness.stats.seeds.Obs` of ``time`` or ``steps``."""
    value, bound = _QUANTITIES[quantity]
    out = {}
    for seed, r in runs.items():
        if bound == "step_budget" and not np.isfinite(r["step_budget"]):
            r = r.copy()
            r["step_budget"] = r["last_step"]  # old records: the last evaluation
        out[seed] = _obs(r, value, bound)
    return out


def _losses_at_budget(runs: dict[int, pd.Series]) -> dict[int, float]:
    return {s: float(r["loss_at_token_budget"]) for s, r in runs.items()
            if r["status"] in _LIVE and np.isfinite(r["loss_at_token_budget"])}


def _not_measured(p: dict) -> str:
    """Why no run of either side was measured (all skipped, failed or without a verdict), as
    their notes; "" when some run of the pair trained."""
    runs = pd.DataFrame([*p["treat"].values(), *p["base"].values()])
    if runs.empty or not runs["status"].isin(say.UNMEASURED).all():
        return ""
    return say.reasons(runs)


def _ended_sooner(p: dict) -> int:
    """Pairs of live runs left out at T*: one of the two clocks ended before T*."""
    live = [s for s in set(p["treat"]) & set(p["base"])
            if p["treat"][s]["status"] in _LIVE and p["base"][s]["status"] in _LIVE]
    return int(sum(np.fmin(p["treat"][s]["clock_end"], p["base"][s]["clock_end"]) < p["t_star"]
                   for s in live))


def _losses_at(runs: dict[int, pd.Series], curve: pd.DataFrame, t_star: float
               ) -> dict[int, float]:
    """Each live run's validation loss at T* on its own clock (none outside its curve)."""
    if not np.isfinite(t_star):
        return {}
    out = {s: _wall_loss(curve[curve["seed"] == s], t_star) for s, r in runs.items()
           if r["status"] in _LIVE}
    return {s: v for s, v in out.items() if np.isfinite(v)}


def comparison_table(df: pd.DataFrame, conf: float = seeds.CONF) -> pd.DataFrame:
    """Each router against each of its baselines (:func:`baselines_for`), paired by seed.

    Pairs are made only within one ``run_id`` and backend, from the measured runs (mode
    ``train``; the pilot has its own seed and is never paired).

    Args:
        df: a frame of :func:`reports.frame.load_frame`.
        conf: coverage of every interval.

    Returns:
        :data:`COMPARISON_COLUMNS`, one row per (run, backend, variant, baseline variant):

        - ``seeds`` (the seeds of either side, ``"0, 1, 2"``), ``n`` (pairs in the interval),
          ``censored``, ``diverged``, ``missing`` (pairs left out, :class:`harness.stats.
          RatioSummary`) and ``dropped`` (which, and why); ``not_measured``: when no run of
          either side trained (skipped, failed), their reasons, else "";
        - ``time_ratio`` (geometric mean of router/baseline time to target) with ``time_lo``,
          ``time_hi`` and ``time_per_seed`` (``"0.91, 0.88, > 1.2"``, seed order, bounds for
          not-converged pairs); ``steps_*`` the same for steps; ``step_time_*`` for time per step
          (:func:`harness.stats.seeds.decompose`);
        - ``loss_*``: the loss at the token budget, means of router and baseline, their paired
          difference with its interval, ``ppl_change_pct`` (perplexity change, %), ``loss_p``
          (paired t) and ``loss_welch_p``; ``loss_n`` seeds with a loss on both sides;
        - ``load``: the seeds whose two sides trained under different CPU load (:func:`_load`), else "";
        - ``t_star`` (s) and ``wall_*``: the validation loss interpolated at T* on each run's
          clock, paired the same way; ``wall_n`` pairs, ``wall_short`` pairs of live runs left
          out because a clock ended before T*.
    """
    rows = []
    for p in _pairs(df):
        dec = seeds.decompose(_side(p["treat"], "time"), _side(p["treat"], "steps"),
                              _side(p["base"], "time"), _side(p["base"], "steps"), conf)
        loss = _loss_test(_losses_at_budget(p["treat"]), _losses_at_budget(p["base"]), conf)
        wall = _loss_test(_losses_at(p["treat"], p["treat_curves"], p["t_star"]),
                          _losses_at(p["base"], p["base_curves"], p["t_star"]), conf)
        targets = pd.Series([r["target_loss"] for r in [*p["treat"].values(),
                                                          *p["base"].values()]], dtype=float)
        t = dec.time
        rows.append({
            "run_id": p["run_id"], "backend": p["backend"], "router": p["router"],
            "variant": p["variant"], "baseline": p["baseline"],
            "target_loss": targets.median(), "conf": conf,
            "seeds": say.fmt_seeds(t.per_seed), "n": t.n, "censored": t.censored,
            "diverged": t.diverged, "missing": t.missing, "dropped": _dropped(p, t.per_seed),
            "not_measured": _not_measured(p), "load": _load(p),
            "time_ratio": t.gmean, "time_lo": t.lo, "time_hi": t.hi,
            "time_per_seed": say.fmt_per_seed(t.per_seed),
            "steps_ratio": dec.steps.gmean, "steps_lo": dec.steps.lo, "steps_hi": dec.steps.hi,
            "steps_per_seed": say.fmt_per_seed(dec.steps.per_seed),
            "step_time_ratio": dec.step_time.gmean, "step_time_lo": dec.step_time.lo,
            "step_time_hi": dec.step_time.hi,
            "loss_n": loss["n"], "loss_router": loss["treat"], "loss_base": loss["base"],
            "loss_diff": loss["diff"], "loss_diff_lo": loss["lo"], "loss_diff_hi": loss["hi"],
            "ppl_change_pct": loss["ppl"], "loss_p": loss["p"], "loss_welch_p": loss["welch_p"],
            "t_star": p["t_star"], "wall_n": wall["n"], "wall_short": _ended_sooner(p),
            "wall_loss_router": wall["treat"],
            "wall_loss_base": wall["base"], "wall_diff": wall["diff"],
            "wall_diff_lo": wall["lo"], "wall_diff_hi": wall["hi"], "wall_p": wall["p"]})
    return pd.DataFrame(rows, columns=COMPARISON_COLUMNS)


def ratio_points(df: pd.DataFrame) -> pd.DataFrame:
    """Per-seed ratios of every comparison as numbers, for figures.

    Returns:
        :data:`POINT_COLUMNS`: ``quantity`` (``time`` or ``steps``), ``kind`` ``"="`` (both
        reached the target: the ratio of :func:`harness.stats.seeds.paired_ratio`), ``">"`` (the router
        did not converge: ``ratio`` = its bound / the baseline's value, a lower bound) or ``"<"``
        (the baseline did not: an upper bound). Pairs with a diverged, missing or twice-censored
        side give no point.
    """
    rows = []
    for p in _pairs(df):
        for quantity in _QUANTITIES:
            treat, base = _side(p["treat"], quantity), _side(p["base"], quantity)
            for seed in sorted(set(treat) & set(base)):
                t, b = treat[seed], base[seed]
                if (t.status, b.status) == ("ok", "ok"):
                    kind, ratio = "=", t.value / b.value
                elif (t.status, b.status) == ("not_converged", "ok"):
                    kind, ratio = ">", t.bound / b.value
                elif (t.status, b.status) == ("ok", "not_converged"):
                    kind, ratio = "<", t.value / b.bound
                else:
                    continue
                rows.append({"run_id": p["run_id"], "backend": p["backend"],
                             "variant": p["variant"], "baseline": p["baseline"],
                             "quantity": quantity, "seed": seed, "kind": kind, "ratio": ratio})
    return pd.DataFrame(rows, columns=POINT_COLUMNS)


def sentences(df: pd.DataFrame, conf: float = seeds.CONF,
              manifests: dict[str, dict] | None = None) -> list[str]:
    """One sentence per row of :func:`comparison_table`, quoting only its numbers, each after
    its :func:`sentence_prefixes` (``manifests``: run_id -> manifest, for the precision)."""
    table = comparison_table(df, conf)
    return say.training_sentences(table, training.sentence_prefixes(df, table, manifests))


def comparison_display(table: pd.DataFrame, names: dict[str, str] | None = None) -> pd.DataFrame:
    """:func:`comparison_table` as report cells: each estimate with its interval in one cell;
    ``names`` (variant -> label, :func:`reports.plotting.variant_labels`) names the router and
    baseline, so that a label names the router, impl and options once."""
    names = names or {}
    if table.empty:
        return pd.DataFrame(columns=["run_id", "backend"])

    def est(v, lo, hi, fmt=say.fmt_ratio, digits=2, signed=False):
        ci = say.fmt_interval(lo, hi, digits, signed)
        return f"{fmt(v)} {ci}".strip()

    rows = []
    for r in table.to_dict("records"):
        rows.append({
            "run_id": r["run_id"], "backend": r["backend"], "router": names.get(r["variant"], r["variant"]),
            "baseline": names.get(r["baseline"], r["baseline"]), "target (nats)": say.fmt_num(r["target_loss"], 3),
            "seed ids": r["seeds"], "pairs (n)": r["n"], "censored": r["censored"],
            "diverged": r["diverged"],
            f"time ratio [{r['conf']:.0%} CI]": est(r["time_ratio"], r["time_lo"], r["time_hi"]),
            "time ratio per seed": r["time_per_seed"],
            "steps ratio": est(r["steps_ratio"], r["steps_lo"], r["steps_hi"]),
            "step-time ratio": est(r["step_time_ratio"], r["step_time_lo"], r["step_time_hi"]),
            "loss at budget router / baseline (nats)":
                f"{say.fmt_num(r['loss_router'], 4)} / {say.fmt_num(r['loss_base'], 4)}",
            "Δ loss at budget (nats)": est(r["loss_diff"], r["loss_diff_lo"], r["loss_diff_hi"],
                                           say.fmt_signed, 3, True),
            "perplexity": say.fmt_pct(r["ppl_change_pct"]),
            "p (paired t)": say.fmt_p(r["loss_p"]), "p (Welch)": say.fmt_p(r["loss_welch_p"]),
            "T*": say.fmt_seconds(r["t_star"]),
            "pairs at T*": (f"{r['wall_n']} of {r['wall_n'] + r['wall_short']}"
                            if r["wall_short"] else str(r["wall_n"])),
            "Δ loss at T* (nats)": est(r["wall_diff"], r["wall_diff_lo"], r["wall_diff_hi"],
                                       say.fmt_signed, 3, True),
            "p at T*": say.fmt_p(r["wall_p"]),
            "left out": r["dropped"]})
    return pd.DataFrame(rows)


def diverged_warnings(df: pd.DataFrame, names: dict[str, str] | None = None) -> list[str]:
    """One sentence for a report's Warnings naming the training runs (and pilots) that diverged,
    by router and seed (``"every training run diverged"`` when none survived; ``names``: variant
    -> label, :func:`reports.plotting.variant_labels`); ``[]`` when none did."""
    names = names or {}
    runs = training.run_frame(df)
    dead = runs[runs["status"] == "diverged"]
    if dead.empty:
        return []
    several = runs[["run_id", "backend"]].drop_duplicates().shape[0] > 1
    who = ", ".join(f"{names.get(r.variant, r.variant)} seed {r.seed}"
                    + (" (pilot)" if r.mode != TRAIN_MODE else "")
                    + (f" [{r.run_id} · {r.backend}]" if several else "")
                    for r in dead.itertuples(index=False))
    what = ("every training run diverged" if len(dead) == len(runs) else
            f"{len(dead)} of {len(runs)} training runs diverged")
    notes = say.notes(dead)
    why = "; ".join(notes[:3]) + ("; …" if len(notes) > 3 else "")
    return [f"Diverged: {what} ({who}): {why}. A diverged run has no time "
            "to target and none of its losses is a result, so no comparison reads it (a lower "
            "--lr or more --warmup-steps may help)."]
