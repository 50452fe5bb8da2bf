"""``routerbench report``: the tables, figures and documents of one or more runs, written to one
folder (:func:`build_report`).
"""

from __future__ import annotations

from pathlib import Path

from . import (count_figures, floor, frame, impls, paired, paper_baseline, race, tables, time_figures,
               training, training_figures)
from .render import render_html, render_markdown
from .sections import build_sections

#: Every figure of a report in report order: name -> function(frame, out_dir) -> PNG path or None.
FIGURES = {**{k: time_figures.FIGURES[k] for k in ("step_time_overhead_vs_width", "overhead_vs_width",
                                                   "overhead_vs_depth")},
           **{k: count_figures.FIGURES[k] for k in ("router_flop_share_vs_width", "flops_vs_depth",
                                                    "memory_vs_depth")},
           "compile_vs_eager": time_figures.FIGURES["compile_vs_eager"],
           "compile_time_vs_depth": time_figures.FIGURES["compile_time_vs_depth"],
           "router_cost_models": count_figures.FIGURES["router_cost_models"],
           **training_figures.FIGURES, **paired.FIGURES, **paper_baseline.FIGURES, **impls.FIGURES}


def build_report(run_dirs: list[Path | str], out_dir: Path | str | None = None,
                 noise_thresholds: dict | None = None) -> dict[str, Path]:
    """Tables, figures and the report of one or more runs.

    Args:
        run_dirs: run directories (``results/<device-slug>/<run-id>/``), each with
            ``records.jsonl`` and, ideally, ``manifest.json``.
        out_dir: where to write; defaults to the run directory when there is exactly one.
        noise_thresholds: thresholds of a noisy group (:data:`harness.timing.noise.THRESHOLDS` keys);
            None: the defaults.

    Returns:
        File name -> path of everything written: ``report.md``, ``report.html``,
        ``overhead.csv`` (when there are cost cases), ``paired.csv``
        (:func:`reports.paired.paired_ratio_table`, when there are paired step times),
        ``paper_baseline.csv`` (:func:`reports.paper_baseline.paired_vs_paper_table`, when a router
        with a paper baseline, haares or wav_v1, was timed),
        ``training_runs.csv`` and ``training_comparison.csv`` (:mod:`reports.training`, :mod:`reports.race`, when
        there are training runs) and one ``<figure>.png`` per figure that had data, with
        ``<figure>.csv`` beside it where the figure writes its data. A CSV or figure without
        data is not written, and one left by an earlier report is removed.

    Raises:
        ValueError: no run directory, or several and no ``out_dir`` (``routerbench report --out``).
        FileNotFoundError: a run directory without ``records.jsonl`` (named in the message).
    """
    paths = frame.run_dir_paths(run_dirs)
    if out_dir is None:
        if len(paths) > 1:
            raise ValueError(f"{len(paths)} run directories given and no out_dir: pass out_dir "
                             "(routerbench report RESULTS... --out DIR)")
        out_dir = paths[0]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    df = frame.load_frame(paths)
    df.attrs["noise_thresholds"] = noise_thresholds  # None: harness.timing.noise.THRESHOLDS
    names = {run: (m.get("environment") or {}).get("device_name") or m.get("device_name")
             for run, m in frame.load_manifests(paths).items()}
    df["device_name"] = [names.get(r) or d for r, d in zip(df["run_id"], df["device"])]
    written: dict[str, Path] = {}
    for name, table in (("overhead.csv", tables.overhead_table(df)),
                        ("paired.csv", paired.paired_ratio_table(df)),
                        ("paper_baseline.csv", paper_baseline.paired_vs_paper_table(df)),
                        ("floor.csv", floor.floor_table(df)),
                        ("training_runs.csv", training.runs_table(df)),
                        ("training_comparison.csv", race.comparison_table(df))):
        if not table.empty:  # like a figure: only when the runs hold its data
            table.to_csv(out / name, index=False)
            written[name] = out / name
        elif (out / name).exists():
            (out / name).unlink()  # from an earlier report whose data is no longer here
    figs = {}
    for name, fn in FIGURES.items():
        figs[name] = fn(df, out)
        for stale in (out / f"{name}.png", out / f"{name}.csv"):
            if figs[name] is None and stale.exists():
                stale.unlink()  # a figure of an earlier report whose data is no longer here
        if figs[name] is not None:
            written[figs[name].name] = figs[name]
            data = figs[name].with_suffix(".csv")
            if data.exists():
                written[data.name] = data
    title, sections = build_sections(df, paths, figs)
    md, page = out / "report.md", out / "report.html"
    md.write_text(render_markdown(title, sections, out), encoding="utf-8")
    page.write_text(render_html(title, sections), encoding="utf-8")
    written[md.name], written[page.name] = md, page
    return written
