"""``routerbench report`` and ``routerbench summary``: tables and figures from run directories."""

from __future__ import annotations

from pathlib import Path

import click

from routers.errors import ConfigError

from . import SHORT_HELP


def run_dirs(results, bench_out: str = "beside") -> list[Path]:
    """The run directories named by RESULTS: each one itself, or every run directory below it; a
    pytest-benchmark JSON (``*.json``) is converted to a run directory first
    (:func:`reports.benchjson.to_run_dir`): ``bench_out="beside"`` writes it beside the file
    (``bench.json`` -> ``bench/``, where its report goes), ``"temp"`` into a temporary directory
    removed when the process exits (for commands that only read). The rules are
    :func:`reports.loading.find_runs`'s, which :func:`reports.load` shares.

    Raises:
        ConfigError: a path that does not exist or holds no run directory, or a malformed JSON.
    """
    from reports.loading import find_runs
    root = None
    if bench_out == "temp" and any(Path(r).suffix == ".json" for r in results):
        import atexit
        import tempfile
        tmp = tempfile.TemporaryDirectory(prefix="routerbench-bench-")
        atexit.register(tmp.cleanup)
        root = tmp.name
    return find_runs(results, bench_root=root)


def write_report(dirs, out=None, noise_thresholds: dict | None = None, say: bool = True) -> str:
    """Build the report of ``dirs`` and (with ``say``) print where it is.

    Returns:
        the line that says where it is (``report: …/report.html, …/report.md``).

    Raises:
        ConfigError: several runs and no ``--out``, or an ``--out`` that cannot be written.
    """
    from reports import build_report
    if out is None and len(dirs) > 1:
        raise ConfigError(f"{len(dirs)} runs given ({', '.join(str(d) for d in dirs[:3])}"
                          f"{', …' if len(dirs) > 3 else ''}): give --out DIR for their joint report")
    try:
        paths = build_report(dirs, out, noise_thresholds)
    except OSError as exc:
        raise ConfigError(f"--out {out or dirs[0]}: cannot write the report there "
                          f"({exc.strerror or exc}); give --out a writable directory") from None
    line = "report: " + ", ".join(str(paths[k]) for k in ("report.html", "report.md") if k in paths)
    if say:
        click.echo(line)
    return line


@click.command("report", short_help=SHORT_HELP["report"])
@click.argument("results", nargs=-1, required=True)
@click.option("--out", default=None, metavar="DIR", help="Output dir (default: the run dir when there is one).")
@click.option("--noise-thresholds", default=None, metavar="JSON",
              help='Thresholds of a noisy group, e.g. \'{"cpu_pressure_max": 0.3}\' (keys and defaults: '
                   "harness/timing/noise.py THRESHOLDS).")
def report_cmd(results, out, noise_thresholds) -> None:
    """Tables, seaborn figures, report.html and report.md from run dirs (or folders holding them),
    or from a pytest-benchmark JSON of tests/benchmarks (converted to a run dir beside it:
    bench.json -> bench/)."""
    write_report(run_dirs(results), out, parse_noise_thresholds(noise_thresholds))


def parse_noise_thresholds(text: str | None) -> dict | None:
    """The thresholds of ``--noise-thresholds JSON`` (missing keys take the defaults of
    :data:`harness.timing.noise.THRESHOLDS`), or None when the option is not given.

    Raises:
        ConfigError: not a JSON object, an unknown key or a value that is not a finite number.
    """
    import json

    from harness.timing.noise import check_thresholds
    if text is None:
        return None
    try:
        given = json.loads(text)
    except json.JSONDecodeError:
        given = None
    if not isinstance(given, dict):
        raise ConfigError(f"--noise-thresholds must be a JSON object of thresholds, got {text!r}")
    try:
        return check_thresholds(given)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


@click.command("summary", short_help=SHORT_HELP["summary"])
@click.argument("results", nargs=-1, required=True)
@click.option("--unpaired", is_flag=True, default=False,
              help="Print the unpaired medians per case instead (vs prenorm, vs eager, set-up s): "
                   "not paired, no interval; what the report's detail tables hold.")
def summary_cmd(results, unpaired) -> None:
    """What each router costs, paired: the verdict when most timed cases were noisy, the report's
    summary sentences, then per case its paired ratio to prenorm and to its eager twin, each with
    its interval and noise flag, and the failed cases. --unpaired: the medians instead."""
    dirs = run_dirs(results, bench_out="temp")
    if unpaired:
        from reports.frame import load_frame
        _unpaired(load_frame(dirs))
        return
    print_summary(dirs)


def print_summary(dirs) -> None:
    """What ``routerbench summary`` prints of run directories ``dirs`` (and what ``run`` prints
    at its end): the verdict when most timed cases were noisy, the report's summary sentences,
    per case its paired ratios (to prenorm, to its paper baseline, to its eager twin) with
    intervals and noise flags, and the failed cases."""
    from reports import cautions, paired
    from reports.frame import load_frame, load_manifests
    from reports.paper_baseline import paired_vs_paper_table
    from reports.summary import cost_sentences
    from reports.tables import failures
    df = load_frame(dirs)
    for note in df.attrs.get("plugin_notes", []):  # a plugin the runs recorded, not loaded here
        click.echo(f"Plugins: {note}.")
    if (first := cautions.verdict(df)) is not None:
        click.echo(first + "\n")
    said, _ = cost_sentences(df, load_manifests(dirs))
    for line in said:
        click.echo(line)
    pt = paired.paired_ratio_table(df)  # the sentences' own intervals (the same resamples)
    if pt.empty:
        click.echo("no paired timings (routerbench summary --unpaired shows the medians)")
    else:
        pv = paired.paired_vs_eager_table(df)
        click.echo("\n" + _paired_text(pt, pv, paired_vs_paper_table(df)))
    bad = failures(df)
    if len(bad):
        click.echo(f"\n{len(bad)} failed or skipped case row(s):")
        for r in bad.head(10).to_dict("records"):
            click.echo(f"  {r['status']}: {r['case']}: {' '.join(str(r.get('error') or '').split())[:160]}")
        if len(bad) > 10:
            click.echo("  … (routerbench status RUN_DIR lists every one)")


def _ci(ratio, lo, hi) -> str:
    ok = lambda v: v is not None and v == v  # noqa: E731
    if not ok(ratio):
        return "–"
    return f"{ratio:.3f} [{lo:.3f}, {hi:.3f}]" if ok(lo) and ok(hi) else f"{ratio:.3f}"


def _paired_text(pt, pv, pp=None) -> str:
    """Per case: its paired ratio to prenorm [CI], to its paper baseline [CI] where it has one
    (``pp``: :func:`reports.paper_baseline.paired_vs_paper_table`; the column is named after the
    baseline, "–" where it ran in another group, absent when no router has one), to its eager
    twin [CI], and why it was noisy (blank when quiet)."""
    import pandas as pd
    keys = ["run_id", "router", "impl", "backend", "compile_mode", "compile_scope", "mode", "d_model",
            "n_layers", "seq_len", "batch_size"]
    t = pt.assign(vs_prenorm=[_ci(*v) for v in zip(pt["ratio"], pt["ratio_lo"], pt["ratio_hi"])])
    paper_col = []
    if pp is not None and len(pp):
        bases = sorted({b.split(" [")[0] for b in pp["paper_baseline"]})
        name = f"vs {bases[0]} [CI]" if len(bases) == 1 else "vs paper baseline [CI]"
        p = pp.assign(**{name: [_ci(*v) for v in zip(pp["vs_paper"], pp["vs_paper_lo"], pp["vs_paper_hi"])]})
        on = [k for k in keys if k in t and k in p]
        t = t.merge(p[[*on, name]].drop_duplicates(on), on=on, how="left")
        t[name] = t[name].fillna("")
        paper_col = [name]
    if len(pv):
        v = pv.assign(vs_eager=[_ci(*x) for x in zip(pv["paired_vs_eager"], pv["paired_vs_eager_lo"],
                                                      pv["paired_vs_eager_hi"])])
        on = [k for k in keys if k in t and k in v]
        t = t.merge(v[[*on, "vs_eager"]].drop_duplicates(on), on=on, how="left")
    else:
        t = t.assign(vs_eager=None)
    fmt = lambda m: f"[{m}]" if isinstance(m, str) and m else ""  # noqa: E731
    t = t.assign(shape=[f"d{r.d_model} L{r.n_layers} T{r.seq_len} B{r.batch_size}" for r in t.itertuples()],
                 backend=t["backend"] + t["compile_mode"].map(fmt) + t["compile_scope"].map(fmt),
                 vs_eager=t["vs_eager"].fillna("–"),
                 noisy=t["noisy"].fillna("").map(lambda x: x if x else ""))
    cols = ["shape", "mode", "backend", "router", "impl", "pairs", "vs_prenorm", *paper_col, "vs_eager", "noisy"]
    if t["run_id"].nunique() > 1:  # runs read together: each row's run, never pooled
        t, cols = t.rename(columns={"run_id": "run"}), ["run", *cols]
    t = t.rename(columns={"vs_prenorm": "vs prenorm [CI]", "vs_eager": "vs eager [CI]"})
    cols = [{"vs_prenorm": "vs prenorm [CI]", "vs_eager": "vs eager [CI]"}.get(c, c) for c in cols]
    with pd.option_context("display.max_colwidth", 80, "display.width", 250):
        return t[cols].to_string(index=False)


def _unpaired(df) -> None:
    from harness.step.backends import BY_NAME
    from reports.tables import backend_table
    for note in df.attrs.get("plugin_notes", []):  # a plugin the runs recorded, not loaded here
        click.echo(f"Plugins: {note}.")
    t = backend_table(df)
    if t.empty:
        click.echo("no ok step_time rows")
        return
    plain = t.backend.map(lambda b: b in BY_NAME and BY_NAME[b].plain).astype(bool)
    t.loc[plain, "vs_eager"] = float("nan")  # eager against itself is 1.00 always: "–"
    t = t.assign(shape=t.apply(lambda r: f"d{r.d_model} L{r.n_layers} T{r.seq_len} B{r.batch_size}", axis=1),
                 backend=t.backend + t.compile_mode.map(lambda m: f"[{m}]" if m else "")
                 + t.compile_scope.map(lambda m: f"[{m}]" if m else ""))
    cols = ["shape", "mode", "backend", "router", "impl", "median_ms", "overhead_pct", "vs_eager", "setup_s"]
    if t["run_id"].nunique() > 1:  # runs read together: each row's run, never pooled
        t, cols = t.rename(columns={"run_id": "run"}), ["run", *cols]
    click.echo(t[cols].to_string(index=False, float_format=lambda v: f"{v:.2f}", na_rep="–"))


COMMANDS = (report_cmd, summary_cmd)
