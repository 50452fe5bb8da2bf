"""The depth study's report (``routerbench study depth``): the papers' table and two figures.

From the rows of a study run directory (mode ``study``, :mod:`harness.training.study`):

- :func:`study_runs`: one row per run (router, depth, seed, status, loss at the token budget);
- :func:`depth_table`: per router and depth, the validation loss at the token budget (mean over
  seeds and per-seed values), and against ``block_attnres`` at the same depth, paired by seed: the
  mean difference Δ, the perplexity change 100·(exp(Δ) − 1) and a paired t-test over seeds
  (:func:`harness.stats.seeds.paired_t`; one seed gives "one seed: no test");
- figures ``loss_vs_depth`` and ``gain_vs_depth`` (the depth trend against ``block_attnres``,
  paired by seed, with each depth's t-interval over seeds), each with the CSV of what it draws;
- :func:`write_report`: ``study.md``, ``study.html``, ``study_table.csv``, ``study_runs.csv`` and
  the figures of a set of runs, and the text the command prints; :func:`write_study` is its case of
  one run directory written into itself, :func:`reports.study_merge.write_merged` of several (the
  units of a study, ``routerbench study report``).

Losses are pooled across directories; wall-clock figures never across devices: each run keeps its
device (``study_runs.csv``'s ``device`` column), and the estimate and the training clocks are
summed per device only. Units that were expected but hold no complete set of routers are listed,
never filled.

A tiny-scale study says "plumbing smoke test, not evidence" in the caption, the figures and the
report; a char-scale study below the full step budget says it is a smoke test (the manifest's
``budget_note``, :meth:`harness.spec.study.StudySpec.budget_note`). A diverged or failed run has
no loss: it is left out of every mean and every pair, and the table says which seeds were left out.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from harness.rundir.records import MANIFEST_FILE, load_rows
from harness.stats import seeds

from . import sentences as say
from .plotting import save_png
from .render import Section, render_html, render_markdown

STUDY_MODE = "study"
BASELINE = "block_attnres"
RUN_COLUMNS = ["router", "depth", "seed", "status", "loss", "train_time", "device", "note", "case_key"]
TABLE_COLUMNS = ["router", "depth", "n_seeds", "loss_mean", "loss_per_seed", "left_out", "n_pairs",
                 "delta", "delta_lo", "delta_hi", "ppl_change_pct", "t", "p", "test"]
NO_TEST_ONE = "one seed: no test"


def study_runs(rows: list[dict] | pd.DataFrame, device: str | None = None) -> pd.DataFrame:
    """One row per study run: :data:`RUN_COLUMNS`; ``status`` ``ok`` (a loss at the token
    budget), ``diverged``, ``error``/``oom``/``skipped`` (the run's failure row), or ``incomplete``
    (evaluations committed, no final rows yet); ``loss`` (nats) only for ``ok`` runs;
    ``train_time`` (s, steps only); ``device``: ``device`` (the run directory's device slug), else
    each row's own ``device`` field."""
    df = pd.DataFrame(rows)
    if df.empty or "mode" not in df:
        return pd.DataFrame(columns=RUN_COLUMNS)
    df = df[df["mode"] == STUDY_MODE]
    out = []
    for key, g in df.groupby("case_key", sort=False):
        first = g.iloc[0]
        level = g[g["repeat"].isna()] if "repeat" in g else g
        loss = level[(level["metric"] == "loss_at_token_budget") & (level["status"] == "ok")]
        bad = level[level["status"].isin(["diverged", "error", "oom", "skipped"])]
        clock = level.loc[level["metric"] == "train_time", "value"]
        if len(bad):
            status, note = bad["status"].iloc[0], str(bad["error"].iloc[0] or "")
        elif len(loss) and loss["value"].notna().all():
            status, note = "ok", ""
        else:
            status, note = "incomplete", "evaluations committed, no result yet"
        out.append({"router": first["router"], "depth": int(first["n_layers"]), "seed": int(first["seed"]),
                    "status": status, "loss": float(loss["value"].iloc[-1]) if status == "ok" else math.nan,
                    "train_time": float(clock.iloc[-1]) if len(clock) else math.nan,
                    "device": device or str(first.get("device") or ""), "note": note, "case_key": key})
    return pd.DataFrame(out, columns=RUN_COLUMNS)


def _per_seed(losses: dict[int, float]) -> str:
    return "; ".join(f"{s}: {say.fmt_num(v, 4)}" for s, v in sorted(losses.items()))


def depth_table(runs: pd.DataFrame, order: list[str] | None = None, baseline: str = BASELINE,
                conf: float = seeds.CONF) -> pd.DataFrame:
    """The papers' table: per router and depth, :data:`TABLE_COLUMNS`.

    ``loss_mean``: mean over the ``n_seeds`` seeds with a loss; ``loss_per_seed``: ``"0: 1.2345;
    1: …"``; ``left_out``: seeds whose run has no loss and why. Against ``baseline`` at the same
    depth, over the ``n_pairs`` seeds with a loss on both sides: ``delta`` = mean of router −
    baseline (nats), ``delta_lo``/``delta_hi`` its ``conf`` t-interval, ``ppl_change_pct`` =
    100·(exp(mean router − mean baseline) − 1), ``t``/``p`` of the paired t-test, ``test`` in
    words (``"one seed: no test"`` when n = 1). All NaN on the baseline's own rows and where the
    baseline was not trained.
    """
    if runs.empty:
        return pd.DataFrame(columns=TABLE_COLUMNS)
    order = order or list(dict.fromkeys(runs["router"]))
    ok = runs[runs["status"] == "ok"]
    rows = []
    for router in [r for r in order if r in set(runs["router"])]:
        for depth in sorted(runs.loc[runs["router"] == router, "depth"].unique()):
            mine = runs[(runs["router"] == router) & (runs["depth"] == depth)]
            losses = {int(r.seed): float(r.loss) for r in ok[(ok["router"] == router)
                                                            & (ok["depth"] == depth)].itertuples()}
            base = {int(r.seed): float(r.loss) for r in ok[(ok["router"] == baseline)
                                                          & (ok["depth"] == depth)].itertuples()}
            gone = mine[mine["status"] != "ok"]
            row = {"router": router, "depth": int(depth), "n_seeds": len(losses),
                   "loss_mean": float(np.mean(list(losses.values()))) if losses else math.nan,
                   "loss_per_seed": _per_seed(losses),
                   "left_out": "; ".join(f"seed {r.seed}: {r.status}" for r in gone.itertuples()),
                   "n_pairs": 0, "delta": math.nan, "delta_lo": math.nan, "delta_hi": math.nan,
                   "ppl_change_pct": math.nan, "t": math.nan, "p": math.nan, "test": ""}
            if router != baseline and base:
                t = seeds.paired_t(losses, base, conf)
                row.update(n_pairs=t.n, delta=t.mean_diff, delta_lo=t.lo, delta_hi=t.hi, t=t.t, p=t.p,
                           ppl_change_pct=seeds.perplexity_change(t.mean_treat, t.mean_base) if t.n else math.nan,
                           test=_test_words(t))
            elif router != baseline:
                row["test"] = f"no {baseline} run at this depth"
            rows.append(row)
    return pd.DataFrame(rows, columns=TABLE_COLUMNS)


def _test_words(t: seeds.PairedTest) -> str:
    if t.n == 0:
        return "no seed paired"
    if t.n == 1:
        return NO_TEST_ONE
    return (f"paired t = {say.fmt_num(t.t, 2)}, {say.p_equals(t.p)} ({t.n} seeds); Δ {t.conf:.0%} CI "
            f"{say.fmt_interval(t.lo, t.hi, 3, signed=True)}")


def display_table(table: pd.DataFrame, baseline: str = BASELINE) -> pd.DataFrame:
    """:func:`depth_table` as report cells (losses 4 decimals, Δ signed 4 decimals, % 2)."""
    out = []
    for r in table.to_dict("records"):
        base = r["router"] == baseline
        out.append({"router": r["router"], "depth": str(r["depth"]), "seeds": str(r["n_seeds"]),
                    "val loss at budget (mean)": say.fmt_num(r["loss_mean"], 4),
                    "per seed": r["loss_per_seed"] or "–",
                    f"Δ vs {baseline} (nats)": "baseline" if base else say.fmt_signed(r["delta"], 4),
                    "perplexity": "baseline" if base else say.fmt_pct(r["ppl_change_pct"], 2),
                    "paired test": "–" if base else (r["test"] or "–"),
                    **({"left out": r["left_out"]} if table["left_out"].astype(bool).any() else {})})
    return pd.DataFrame(out)


def caption(manifest: dict, runs: pd.DataFrame, baseline: str = BASELINE) -> str:
    """What the table shows, its budget and its block layout; a tiny study says it is no evidence."""
    lay = manifest.get("layout") or {}
    per = lay.get("per_depth") or {}
    layout = (f"Block layout: {lay.get('held')} held fixed at {lay.get('value')} across depths for "
              f"{', '.join(lay.get('routers', []))} (blocks × layers per block: "
              + ", ".join(f"{d} layers {v['n_blocks']} × {v['layers_per_block']}" for d, v in per.items())
              + "). ") if lay.get("routers") else ""
    tokens = manifest.get("token_budget")
    budget = f"{tokens:,} tokens, " if tokens else ""
    label = manifest.get("scale_label")
    return (f"{label[0].upper() + label[1:] + '. ' if label else ''}Validation loss (nats) at the token "
            f"budget ({budget}{manifest.get('max_steps')} steps), per router and depth: mean over seeds and "
            f"each seed's value. Δ = router − {baseline} at the same depth, paired by seed (same data order "
            "and shared initial weights), mean over the seeds with both runs; perplexity change = "
            "100·(exp(Δ) − 1); paired t-test over seeds. " + layout).strip()


def sentences(table: pd.DataFrame, baseline: str = BASELINE) -> list[str]:
    """One sentence per router and depth compared with ``baseline``, quoting only table cells."""
    out = []
    for r in table.to_dict("records"):
        if r["router"] == baseline or not r["n_pairs"]:
            continue
        out.append(f"At {r['depth']} layers, {r['router']} vs {baseline}: Δ {say.fmt_signed(r['delta'], 4)} "
                   f"nats at the token budget ({say.fmt_pct(r['ppl_change_pct'], 2)} perplexity); "
                   f"{r['test']}.")
    return out


# --- figures --------------------------------------------------------------------------------


def _axes_depth(ax, depths) -> None:
    import matplotlib.ticker
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted(depths), [str(d) for d in sorted(depths)])
    ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    ax.set_xlabel("depth (transformer layers)")


def _palette(order: list[str]) -> dict:
    import seaborn as sns
    return dict(zip(order, sns.color_palette("tab10", max(len(order), 1))))


def loss_vs_depth(runs: pd.DataFrame, out_dir: Path, title: str, order: list[str]) -> Path | None:
    """Loss at the token budget against depth: per router the mean over seeds (line) and each
    seed (dots). Writes ``loss_vs_depth.png`` and ``loss_vs_depth.csv``; None without a loss."""
    import matplotlib.pyplot as plt

    ok = runs[runs["status"] == "ok"]
    if ok.empty:
        return None
    pal = _palette(order)
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    data = []
    for router in [r for r in order if r in set(ok["router"])]:
        g = ok[ok["router"] == router]
        mean = g.groupby("depth")["loss"].mean()
        ax.plot(mean.index, mean.values, marker="o", color=pal[router], label=router)
        ax.scatter(g["depth"], g["loss"], s=12, color=pal[router], alpha=0.45)
        data += [{"router": router, "depth": d, "seed": "mean", "loss": v} for d, v in mean.items()]
        data += [{"router": router, "depth": r.depth, "seed": r.seed, "loss": r.loss} for r in g.itertuples()]
    _axes_depth(ax, ok["depth"].unique())
    ax.set_ylabel("validation loss at the token budget (nats)")
    ax.legend(frameon=False, fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1))
    fig.suptitle(f"Validation loss at the token budget: mean over seeds (line), each seed (dots)\n{title}",
                 fontsize=9)
    path = save_png(fig, Path(out_dir) / "loss_vs_depth.png")
    pd.DataFrame(data).to_csv(path.with_suffix(".csv"), index=False)
    return path


def gain_vs_depth(runs: pd.DataFrame, table: pd.DataFrame, out_dir: Path, title: str,
                  order: list[str], baseline: str = BASELINE) -> Path | None:
    """Δ loss against ``baseline`` (router − baseline, paired by seed; below 0: better) against
    depth: per router the mean (line, with its t-interval where n ≥ 2) and each seed's Δ (dots).
    Writes ``gain_vs_depth.png`` and ``.csv``; None without a pair."""
    import matplotlib.pyplot as plt

    t = table[(table["router"] != baseline) & (table["n_pairs"] > 0)]
    if t.empty:
        return None
    ok = runs[runs["status"] == "ok"]
    base = ok[ok["router"] == baseline].set_index(["depth", "seed"])["loss"]
    pal = _palette(order)
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    ax.axhline(0.0, color="0.4", linestyle="--", linewidth=1)
    data = []
    for router in [r for r in order if r in set(t["router"])]:
        g = t[t["router"] == router].sort_values("depth")
        err = np.array([g["delta"] - g["delta_lo"], g["delta_hi"] - g["delta"]])
        ax.errorbar(g["depth"], g["delta"], yerr=np.nan_to_num(err), marker="o", capsize=3,
                    color=pal[router], label=router)
        data += [{"router": router, "depth": r.depth, "seed": "mean", "delta": r.delta, "lo": r.delta_lo,
                  "hi": r.delta_hi, "n_pairs": r.n_pairs} for r in g.itertuples()]
        for r in ok[ok["router"] == router].itertuples():
            if (r.depth, r.seed) in base.index:
                d = r.loss - base[(r.depth, r.seed)]
                ax.scatter([r.depth], [d], s=12, color=pal[router], alpha=0.45)
                data.append({"router": router, "depth": r.depth, "seed": r.seed, "delta": d})
    _axes_depth(ax, t["depth"].unique())
    ax.set_ylabel(f"Δ val loss vs {baseline} (nats; < 0: better)")
    ax.legend(frameon=False, fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1))
    fig.suptitle(f"Δ loss at the token budget vs {baseline}, paired by seed: mean (line; bars: "
                 f"{seeds.CONF:.0%} t-interval where ≥ 2 seeds), each seed (dots)\n{title}", fontsize=9)
    path = save_png(fig, Path(out_dir) / "gain_vs_depth.png")
    pd.DataFrame(data).to_csv(path.with_suffix(".csv"), index=False)
    return path


# --- the report -----------------------------------------------------------------------------


def run_source(run_dir: Path | str, manifest: dict) -> dict:
    """What the report keeps of one run directory: ``dir``, ``device`` (the manifest's
    ``environment.device_slug``, else its device name, else ``"unknown device"``) and
    ``estimate`` (the manifest's, or None)."""
    env = manifest.get("environment") or {}
    return {"dir": str(run_dir), "device": env.get("device_slug") or env.get("device_name") or "unknown device",
            "estimate": manifest.get("estimate")}


def study_grid(manifest: dict) -> set[tuple[int, int]]:
    """``(depth, seed)`` of every unit a study's manifest plans: its seeds × its depths."""
    return {(int(d), int(s)) for d in manifest.get("depths") or () for s in manifest.get("seeds") or ()}


def missing_units(runs: pd.DataFrame, expected: dict[tuple[int, int], set[str]], routers: list[str]) -> list[str]:
    """The units of ``expected`` (``(depth, seed)`` -> the routers it should hold) that lack a
    finished run of one of them (``incomplete`` or absent), one phrase each, seeds outermost, routers
    in ``routers``' order: ``"L4 seed 1: not run"``, ``"L4 seed 1: haares not finished"``."""
    have = {(int(r.depth), int(r.seed), r.router) for r in runs[runs["status"] != "incomplete"].itertuples()}
    tried = {(int(r.depth), int(r.seed)) for r in runs.itertuples()}
    out = []
    for (depth, seed), want in sorted(expected.items(), key=lambda u: (u[0][1], u[0][0])):
        rank = {r: i for i, r in enumerate(routers)}
        lack = sorted((r for r in want if (depth, seed, r) not in have), key=lambda r: (rank.get(r, len(rank)), r))
        if lack:
            out.append(f"L{depth} seed {seed}: " + ("not run" if (depth, seed) not in tried
                                                    else f"{', '.join(lack)} not finished"))
    return out


def device_clocks(runs: pd.DataFrame) -> dict[str, tuple[int, float]]:
    """Per device (in order of appearance): ``(runs with a clock, their training clocks summed,
    s)``. Clocks of different devices are never added together."""
    clocks = runs.groupby("device", sort=False)["train_time"]
    return {str(dev): (int(g.notna().sum()), float(g.sum())) for dev, g in clocks}


def clock_sentences(runs: pd.DataFrame, sources: list[dict]) -> list[str]:
    """The estimate before training and the training clocks, per device: on one device one
    sentence (the estimates of its directories summed; nothing without an estimate), on several
    one per device and a sentence that they are not added."""
    devices = list(dict.fromkeys([s["device"] for s in sources] + list(runs["device"].dropna())))
    est = {d: [s["estimate"] for s in sources if s["device"] == d and s.get("estimate")] for d in devices}
    method = next((e.get("method") for v in est.values() for e in v), None)
    clocks = device_clocks(runs)
    if len(devices) <= 1:
        if not method:
            return []
        e, total = est[devices[0]], clocks.get(devices[0], (0, 0.0))[1]
        return [f"Estimated before training: {sum(x['total_s'] for x in e):.0f} s for "
                f"{sum(x['runs_left'] for x in e):g} runs ({method}). Training clocks of the runs sum to "
                f"{total:.0f} s (steps only; evaluation off the clock)."]
    out = []
    for d in devices:
        (n, total), e = clocks.get(d, (0, 0.0)), est[d]
        guess = (f"estimated before training {sum(x['total_s'] for x in e):.0f} s for "
                 f"{sum(x['runs_left'] for x in e):g} runs; " if e else "no estimate recorded; ")
        out.append(f"On {d}: {guess}training clocks of its {n} run{'s' * (n != 1)} sum to "
                   f"{say.fmt_seconds(total)}.")
    return out + [f"Clocks and estimates of different devices are not added (clocks: steps only, evaluation "
                  f"off the clock{'; estimates: ' + method if method else ''})."]


def write_study(run_dir: Path | str) -> tuple[dict[str, Path], str]:
    """Write the study's report into ``run_dir`` and return ``(paths by file name, the text the
    command prints)``: :func:`write_report` of this one run directory."""
    d = Path(run_dir)
    manifest = json.loads((d / MANIFEST_FILE).read_text()) if (d / MANIFEST_FILE).exists() else {}
    source = run_source(d, manifest)
    runs = study_runs(load_rows([d]), source["device"])
    order = manifest.get("routers") or list(dict.fromkeys(runs["router"]))
    missing = missing_units(runs, {u: set(order) for u in study_grid(manifest)}, order)
    return write_report(d, manifest, runs, [source], missing, d.name)


def write_report(out_dir: Path | str, manifest: dict, runs: pd.DataFrame, sources: list[dict], missing: list[str],
                 name: str, cautions: list[str] | tuple[str, ...] = ()) -> tuple[dict[str, Path], str]:
    """Write the report of ``runs`` (:func:`study_runs` of every directory, with devices) into
    ``out_dir`` and return ``(paths by file name, the text the command prints)``: the scale label,
    caption, table and sentences, the ``missing`` units (:func:`missing_units`) and ``cautions``.

    ``manifest``: the study's (merged) manifest; ``sources``: :func:`run_source` of each directory
    (estimates and clocks per device); ``name``: the title's suffix."""
    d = Path(out_dir)
    d.mkdir(parents=True, exist_ok=True)
    order = manifest.get("routers") or list(dict.fromkeys(runs["router"]))
    table = depth_table(runs, order)
    cap, shown, words = caption(manifest, runs), display_table(table), sentences(table)
    tiny = manifest.get("scale") == "tiny"
    title = ("Depth study (plumbing smoke test, not evidence)" if tiny else "Depth study") + f" — {name}"
    fig_title = manifest.get("scale_label", "").replace("plumbing smoke test, not evidence",
                                                        "PLUMBING SMOKE TEST, NOT EVIDENCE")
    if manifest.get("budget_note"):
        what = "a SMOKE TEST of the claim" if "smoke test" in manifest["budget_note"] else "a shortened study"
        fig_title += f" — {manifest['max_steps']:,} steps per run: {what}"
    paths: dict[str, Path] = {}
    for fname, frame in (("study_table.csv", table), ("study_runs.csv", runs)):
        frame.to_csv(d / fname, index=False)
        paths[fname] = d / fname
    figs = {"loss_vs_depth": loss_vs_depth(runs, d, fig_title, order),
            "gain_vs_depth": gain_vs_depth(runs, table, d, fig_title, order)}
    budget = manifest.get("budget_note")  # a step budget below the full study's: a smoke test
    gaps = ([f"Missing units ({len(missing)}; left out of every mean and pair, never filled): "
             + "; ".join(missing) + "."] if missing else [])
    notes = [f"Caution: {c}" for c in cautions]
    head = Section("Summary", [("text", cap)] + ([("text", f"Budget: {budget}.")] if budget else [])
                   + [("text", s) for s in gaps + notes + words])
    if BASELINE not in order:
        head.blocks.append(("text", f"{BASELINE} was not trained: no Δ, no test."))
    head.blocks += [("text", s) for s in clock_sentences(runs, sources)]
    sections = [head, Section("Loss at the token budget", [("table", shown)])]
    fig_blocks = []
    for fig, path, what in (("loss_vs_depth", figs["loss_vs_depth"], "Loss at the token budget vs depth"),
                            ("gain_vs_depth", figs["gain_vs_depth"], f"Δ loss vs {BASELINE} vs depth")):
        if path is not None:
            paths[path.name] = path
            paths[path.with_suffix(".csv").name] = path.with_suffix(".csv")
            fig_blocks.append(("figure", path, f"{what}{' (plumbing smoke test, not evidence)' if tiny else ''}"))
        else:
            fig_blocks.append(("text", f"{what}: no data."))
    sections.append(Section("Figures", fig_blocks))
    runs_shown = runs.drop(columns=["case_key"]).assign(
        loss=[say.fmt_num(v, 4) for v in runs["loss"]], train_time=[say.fmt_seconds(v) for v in runs["train_time"]],
        depth=runs["depth"].astype(str), seed=runs["seed"].astype(str))
    sections.append(Section("Runs", [("table", runs_shown.rename(columns={
        "loss": "loss at budget (nats)", "train_time": "training clock"}))]))
    (d / "study.md").write_text(render_markdown(title, sections, d), encoding="utf-8")
    (d / "study.html").write_text(render_html(title, sections), encoding="utf-8")
    paths["study.md"], paths["study.html"] = d / "study.md", d / "study.html"
    text = "\n".join([cap, *([f"Budget: {budget}."] if budget else []), *gaps, "",
                      shown.to_markdown(index=False, disable_numparse=True), "", *words])
    return paths, text
