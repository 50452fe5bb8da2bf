"""``routerbench compare``: the same cases measured in several runs (devices or commits) side by side.

Each run directory is labelled by its device name (``environment.device_name`` in its manifest);
when two runs share a device, by device and git sha, or device and run id when the shas agree too.
A *case* is (router, options, impl, backend, compile mode, mode, workload, shape); only cases with
``ok`` step times in every run are compared, the others are counted and listed. Two views:

* paired ratios to prenorm (:func:`reports.paired.paired_ratio_table`), one "ratio [CI]" column
  per run: each interval covers the noise within its own run, not drift between runs;
* step-time ratios between runs: a case's median step time in run B / in the first run. The two
  medians come from different processes (and machines), so the ratio is unpaired: drift, clocks
  and load between the runs are all part of it.

Written by :func:`build_compare`: ``compare.md``, a self-contained ``compare.html`` (figures as
base64 data URIs, 1200 px wide at most) and each figure as PNG with its data as CSV beside it.
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only

import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

from . import frame, paired, render, tables  # noqa: E402
from .plotting import save_png  # noqa: E402

#: What makes two runs' step times the same case (run and device may differ).
CASE = ("router", "options", "impl", "backend", "compile_mode", "compile_scope", "mode", "workload",
        *frame.SHAPE_COLS)
#: A paired ratio's case also names its seed (pairs are timed per seed).
PAIRED_CASE = (*CASE, "seed")
#: Shown columns of a case: router (options), impl, backend[:compile mode], mode, shape.
SHOWN = ["router", "impl", "backend", "mode", "shape"]
PARTIAL_SHOWN = 20
#: Files of a compare that are written only when they have data.
STALE = {f"{stem}.{ext}" for stem in ("compare_paired_ratios", "compare_step_ratios")
         for ext in ("png", "csv")} | {"compare_partial.csv"}
DPI = 110


class NothingToCompare(ValueError):
    """Fewer than two runs, or no case with ``ok`` step times in every run."""


def run_labels(runs: list[dict]) -> list[str]:
    """One distinct label per run: its ``device_name``; runs sharing a device get `` @ <sha>``
    when their ``git_sha`` values all differ, else `` · <run_id>``; `` #k`` ends any tie left."""
    labels = []
    for r in runs:
        twins = [t for t in runs if t["device_name"] == r["device_name"]]
        shas = [t["git_sha"] for t in twins]
        if len(twins) == 1:
            labels.append(r["device_name"])
        elif all(shas) and len(set(shas)) == len(shas):
            labels.append(f"{r['device_name']} @ {r['git_sha'][:12]}")
        else:
            labels.append(f"{r['device_name']} · {r['run_id']}")
    return [lbl + (f" #{labels[:i].count(lbl) + 1}" if labels.count(lbl) > 1 else "")
            for i, lbl in enumerate(labels)]


def load_runs(run_dirs: list[Path | str]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Rows and environment of each run, the run's label in place of its ``run_id``.

    Each directory is read on its own, so two runs that share a run id (``--run-id nightly`` on
    two machines) stay apart.

    Returns:
        (frame of :func:`reports.frame.load_frame` with ``run_id`` = the run label plus a
        ``device_name`` column and ``attrs["plugin_notes"]`` of every run, runs table: ``label``,
        ``run_id``, ``device_name``, ``torch``, ``git_sha``, ``dir``), in the order given.

    Raises:
        NothingToCompare: fewer than two run directories.
        FileNotFoundError: a directory without ``records.jsonl``.
    """
    paths = frame.run_dir_paths(run_dirs)
    if len(paths) < 2:
        raise NothingToCompare(f"{len(paths)} run given ({paths[0]}): compare needs two or more "
                               "run directories (or folders holding them)")
    frames, runs = [], []
    for d in paths:
        f = frame.load_frame([d])
        manifest = next(iter(frame.load_manifests([d]).values()), {})
        env = manifest.get("environment") or {}
        run_id = next(iter(f["run_id"].unique()), "") or manifest.get("run_id") or d.name
        device = env.get("device_name") or manifest.get("device_name") or env.get("device_slug") \
            or next((v for v in f["device"].unique() if v), "unknown device")
        frames.append(f)
        runs.append({"run_id": run_id, "device_name": device, "torch": env.get("torch") or "–",
                     "git_sha": manifest.get("git_sha") or "", "dir": str(d)})
    labels = run_labels(runs)
    for f, r, lbl in zip(frames, runs, labels):
        f["run_id"], f["device_name"] = lbl, r["device_name"]
    df = pd.concat(frames, ignore_index=True)
    df.attrs["plugin_notes"] = list(dict.fromkeys(n for f in frames for n in f.attrs.get("plugin_notes", [])))
    return df, pd.DataFrame([{"label": lbl, **r} for lbl, r in zip(labels, runs)])


def _shown(t: pd.DataFrame) -> pd.DataFrame:
    """``t`` with the case columns of :data:`SHOWN` made readable (``shape`` e.g.
    ``"d=64 L=2 H=4 T=64 B=2 float32"``, workload and seed named only where they vary)."""
    t = t.copy()
    shape = ("d=" + t["d_model"].astype(str) + " L=" + t["n_layers"].astype(str) + " H="
             + t["n_heads"].astype(str) + " T=" + t["seq_len"].astype(str) + " B="
             + t["batch_size"].astype(str) + " " + t["dtype"])
    if t["workload"].nunique() > 1:
        shape = t["workload"] + " " + shape
    if "seed" in t and t["seed"].nunique() > 1:
        shape = shape + " seed " + t["seed"].astype(str)
    t["shape"] = shape
    t["router"] = t["router"] + t["options"].map(lambda o: f" ({o})" if o else "")
    t["backend"] = t.apply(frame.backend_text, axis=1) if len(t) else t["backend"]
    return t


def _by_run(long: pd.DataFrame, keys, value: str, labels: list[str]) -> pd.DataFrame:
    """``value`` of each case (rows) in each run (columns, in ``labels`` order)."""
    return (long.groupby([*keys, "run_id"], dropna=False)[value].first()
            .unstack("run_id").reindex(columns=labels))


def paired_compare(df: pd.DataFrame, labels: list[str]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Paired ratios to prenorm of the cases paired in every run.

    Returns:
        (side-by-side table: :data:`SHOWN` + one column per run label holding
        ``"ratio [lo, hi]"`` (3 decimals; ``[–]`` where too few pairs gave no interval; `` noisy``
        when timed on a busy machine);
        long table: :data:`SHOWN` + ``run`` (label), ``device_name``, ``pairs``, ``ratio``,
        ``ratio_lo``, ``ratio_hi`` (step time / prenorm, dimensionless), ``noisy`` (why either
        side's last timing was noisy, ``""`` when quiet)). Both empty without
        a paired case common to all runs.
    """
    t = paired.paired_ratio_table(df)
    long_cols = [*SHOWN, "run", "device_name", "pairs", "ratio", "ratio_lo", "ratio_hi", "noisy"]
    if t.empty:
        return pd.DataFrame(columns=[*SHOWN, *labels]), pd.DataFrame(columns=long_cols)
    t = t.merge(df[["run_id", "device_name"]].drop_duplicates(), on="run_id", how="left")
    t["noisy"] = t["noisy"].fillna("").astype(str) if "noisy" in t else ""
    t["cell"] = [f"{r:.3f} " + ("[–]" if math.isnan(lo) or math.isnan(hi) else f"[{lo:.3f}, {hi:.3f}]")
                 + (" noisy" if n else "") for r, lo, hi, n in zip(t["ratio"], t["ratio_lo"], t["ratio_hi"], t["noisy"])]
    wide = _by_run(t, PAIRED_CASE, "cell", labels)
    wide = frame.sort_cases(wide[wide.notna().all(axis=1)].reset_index())
    t = t.merge(wide[list(PAIRED_CASE)], on=list(PAIRED_CASE))  # common cases only
    side = _shown(wide)[[*SHOWN, *labels]].reset_index(drop=True)
    t = t.assign(_run=t["run_id"].map(labels.index)).sort_values("_run", kind="stable")
    long = _shown(t).rename(columns={"run_id": "run"})[long_cols].reset_index(drop=True)
    return side, long


def step_time_compare(df: pd.DataFrame, labels: list[str]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Median step time of every case in each run, and its ratio to the first run.

    Returns:
        (the cases in every run: :data:`SHOWN`, ``"<first> (ms)"`` (median step time there) and
        one ``"<label> / <first>"`` column per later run (ratio of medians, unpaired);
        the cases in only some runs: :data:`SHOWN` + ``in runs`` (the labels that have it)).
    """
    med = _by_run(tables.step_time_summary(df), CASE, "median_ms", labels)
    have = med.notna()
    some = have.any(axis=1) & ~have.all(axis=1)
    partial = med[some].reset_index().assign(
        **{"in runs": [", ".join(lbl for lbl in labels if h[lbl]) for _, h in have[some].iterrows()]})
    common = frame.sort_cases(med[have.all(axis=1)].reset_index())
    first, ratios = labels[0], [f"{lbl} / {labels[0]}" for lbl in labels[1:]]
    common = common.assign(**{r: common[lbl] / common[first] for r, lbl in zip(ratios, labels[1:])},
                           **{f"{first} (ms)": common[first]})
    return (_shown(common)[[*SHOWN, f"{first} (ms)", *ratios]].reset_index(drop=True),
            _shown(partial)[[*SHOWN, "in runs"]].reset_index(drop=True))


def _save(g, out_dir: Path, name: str, data: pd.DataFrame) -> Path:
    """Save the figure as ``<name>.png`` with its data as ``<name>.csv`` beside it."""
    path = out_dir / f"{name}.png"
    save_png(g.figure, path, DPI)
    data.to_csv(path.with_suffix(".csv"), index=False)
    return path


def _facets(t: pd.DataFrame, with_shape: bool) -> pd.DataFrame:
    """``t`` with ``panel`` (mode · backend[ · shape]) and, where impls vary, ``router [impl]``."""
    panel = t["mode"] + " · " + t["backend"]
    router = t["router"] + " [" + t["impl"] + "]" if t["impl"].nunique() > 1 else t["router"]
    return t.assign(panel=panel + " · " + t["shape"] if with_shape else panel, router=router)


def paired_compare_figure(long: pd.DataFrame, labels: list[str], out_dir: Path) -> Path | None:
    """Paired ratio to prenorm per router, one hue per run, points with their bootstrap CI;
    one panel per mode, backend and shape. Returns ``compare_paired_ratios.png`` (data in the
    ``.csv`` beside it), or ``None`` without common paired cases."""
    if long.empty:
        return None
    data = _facets(long, True)
    # Each case as three rows (CI low, ratio, CI high): their median is the ratio and their full
    # range the interval, so pointplot draws the bootstrap CI that paired_ratio_table computed.
    three = pd.concat([data.assign(y=data[c].fillna(data["ratio"]))
                       for c in ("ratio_lo", "ratio", "ratio_hi")], ignore_index=True)
    g = sns.catplot(three, kind="point", x="y", y="router", hue="run", hue_order=labels,
                    col="panel", col_wrap=min(3, data["panel"].nunique()), estimator="median",
                    errorbar=("pi", 100), dodge=0.4, linestyle="none", capsize=0.15,
                    sharex=False, height=0.5 * data["router"].nunique() + 1.8, aspect=1.6,
                    palette=sns.color_palette("tab10", len(labels)))
    for ax in g.axes.flat:
        ax.axvline(1.0, color="0.4", linestyle="--", linewidth=1)
    g.set_titles("{col_name}")
    g.set_axis_labels("step time / prenorm (ratio)", "router")
    g.figure.suptitle(f"Paired step-time ratio to prenorm, median and {paired.CONF:.0%} "
                      f"bootstrap CI per run: {' vs '.join(labels)}", y=1.03)
    return _save(g, out_dir, "compare_paired_ratios", long)


def step_ratio_figure(table: pd.DataFrame, labels: list[str], out_dir: Path) -> Path | None:
    """Median step time of each later run / the first run per router, one point per case
    (shape), one hue per later run, one panel per mode and backend. Returns
    ``compare_step_ratios.png`` (long data in the ``.csv`` beside it), or ``None`` when empty."""
    if table.empty:
        return None
    first = labels[0]
    long = pd.concat([table[SHOWN].assign(run=lbl, vs=first, ratio=table[f"{lbl} / {first}"])
                      for lbl in labels[1:]], ignore_index=True)
    data = _facets(long, False)
    g = sns.catplot(data, kind="strip", x="ratio", y="router", hue="run", hue_order=labels[1:],
                    col="panel", col_wrap=min(3, data["panel"].nunique()), dodge=True, size=6,
                    sharex=False, height=0.5 * data["router"].nunique() + 1.8, aspect=1.6,
                    palette=sns.color_palette("tab10", len(labels))[1:])
    for ax in g.axes.flat:
        ax.axvline(1.0, color="0.4", linestyle="--", linewidth=1)
    g.set_titles("{col_name}")
    g.set_axis_labels("median step time / first run (ratio)", "router")
    g.figure.suptitle(f"Median step time of {', '.join(labels[1:])} / {first} (unpaired: "
                      "different processes), one point per shape", y=1.03)
    return _save(g, out_dir, "compare_step_ratios", long)


def _cells(t: pd.DataFrame) -> pd.DataFrame:
    """Every cell as text (3 decimals for floats, ``–`` for missing), as render expects."""
    return t.astype(object).map(lambda v: "–" if v is None or v != v else
                                f"{v:.3f}" if isinstance(v, float) else str(v))


def _noise_warning(long: pd.DataFrame, labels: list[str]) -> str:
    """A warning naming each run whose paired ratios were timed on a busy machine, ``""`` if none."""
    if long.empty:
        return ""
    parts = []
    for lbl in labels:
        mine = long[long["run"] == lbl]
        n = int((mine["noisy"].astype(str) != "").sum())
        if n:
            parts.append(f"{lbl}: {n} of {len(mine)}")
    if not parts:
        return ""
    return ("Warning: noisy timings (a busy machine: CPU pressure or utilisation, or the spread, past "
            "the thresholds of harness/timing/noise.py) in " + "; ".join(parts) + " paired ratios "
            "(marked noisy). Load can shift a ratio, not only widen its CI: compare these with care.")


def build_compare(run_dirs: list[Path | str], out_dir: Path | str) -> dict[str, Path]:
    """Compare runs: tables, figures, ``compare.md`` and ``compare.html`` in ``out_dir``.

    Returns:
        File name -> path of everything written (``compare.md``, ``compare.html``, each figure
        with data as ``.png`` and ``.csv``, ``compare_partial.csv`` when some cases are not in
        every run).

    Raises:
        NothingToCompare: fewer than two runs, or no case with ``ok`` step times in all of them.
        FileNotFoundError: a directory without ``records.jsonl``.
        OSError: ``out_dir`` cannot be written.
    """
    df, runs = load_runs(run_dirs)
    labels = list(runs["label"])
    steps, partial = step_time_compare(df, labels)
    if steps.empty:
        raise NothingToCompare(f"no case in common between {', '.join(labels)}: each case (router, "
                               "impl, backend, compile mode, mode, shape) needs ok step times in "
                               f"every run ({len(partial)} case(s) are in only some)")
    side, long = paired_compare(df, labels)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    figs = {"paired": paired_compare_figure(long, labels, out),
            "steps": step_ratio_figure(steps, labels, out)}
    written = {p.name: p for f in figs.values() if f for p in (f, f.with_suffix(".csv"))}
    if len(partial):
        partial.to_csv(out / "compare_partial.csv", index=False)
        written["compare_partial.csv"] = out / "compare_partial.csv"
    for stale in (STALE - set(written)):  # left by an earlier compare into the same folder
        (out / stale).unlink(missing_ok=True)

    shown = runs.rename(columns={"label": "run", "run_id": "run id", "device_name": "device",
                                 "git_sha": "git sha"}).assign(**{"git sha": runs["git_sha"].str[:12]})
    head = render.Section("Runs", [("table", _cells(shown)), ("text", (
        f"{len(steps)} case(s) in common (router, options, impl, backend, compile mode, mode, "
        f"workload and shape with ok step times in every run); {len(partial)} in only some runs.")),
    ])
    pair = render.Section("Paired ratio to prenorm, side by side", [("text", paired.METHOD)])
    head.blocks += [("text", f"Plugins: {n}.") for n in df.attrs.get("plugin_notes", [])]
    noisy = _noise_warning(long, labels)
    if noisy:
        head.blocks.append(("text", noisy))
        pair.blocks.insert(0, ("text", noisy))
    if side.empty:
        pair.blocks.append(("text", "No case has paired step times with a prenorm in its group "
                                    "in every run: run `routerbench run --paired` with prenorm "
                                    "among --routers on each device."))
    else:
        pair.blocks += [("table", _cells(side)), ("figure", figs["paired"],
                        "Paired ratio to prenorm per router, one colour per run")]
    between = render.Section("Step time between runs (unpaired)", [
        ("text", f"Median step time of each case in each run / in {labels[0]}. The medians come "
                 "from different processes (and machines): the ratio is not paired, and drift, "
                 "clocks and load between the runs are part of it."),
        ("table", _cells(steps)),
        ("figure", figs["steps"], f"Median step time / {labels[0]} per router, one point per shape")])
    sections = [head, pair, between]
    if len(partial):
        more = len(partial) - PARTIAL_SHOWN
        sections.append(render.Section("Cases in only some runs", [
            ("text", f"{len(partial)} case(s) are not in every run and are left out above"
                     + (f"; the first {PARTIAL_SHOWN} are shown, all are in compare_partial.csv."
                        if more > 0 else ".")),
            ("table", _cells(partial.head(PARTIAL_SHOWN)))]))
    title = "routerbench compare: " + " vs ".join(labels)
    md, page = out / "compare.md", out / "compare.html"
    md.write_text(render.render_markdown(title, sections, out), encoding="utf-8")
    page.write_text(render.render_html(title, sections), encoding="utf-8")
    return {**written, md.name: md, page.name: page}


__all__ = ["NothingToCompare", "build_compare", "load_runs", "paired_compare",
           "paired_compare_figure", "run_labels", "step_ratio_figure", "step_time_compare"]
