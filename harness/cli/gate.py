"""``routerbench gate``: a CI gate on paired timing ratios (the rules and verdicts:
:mod:`harness.ci.gate`; here: which files are read and written, and what is printed)."""

from __future__ import annotations

import math
import os
import shutil
import sys
import tempfile
from pathlib import Path

import click

from harness.rundir.records import RECORDS_FILE
from routers.errors import ConfigError

from . import SHORT_HELP
from .report import run_dirs

COLUMNS = ["rule", "metric", "case", "ratio", "CI", "limit", "verdict", "note"]


def resolve(paths, tmp: Path, what: str = "RESULTS") -> list[Path]:
    """The run directories named by ``paths``: run directories, folders holding them
    (:func:`harness.cli.report.run_dirs`), or pytest-benchmark JSON files, each converted into a
    run directory under ``tmp`` (:func:`reports.benchjson.to_run_dir`).

    Raises:
        ConfigError: a path that is neither, a folder without run directories, a malformed JSON.
    """
    out: list[Path] = []
    for i, p in enumerate(map(Path, paths)):
        if p.is_file() and p.suffix == ".json":
            try:
                from reports.benchjson import to_run_dir
            except ImportError:
                raise ConfigError(f"{what}: {p}: reading pytest-benchmark JSON needs reports.benchjson, "
                                  "missing from this checkout") from None
            out.append(Path(to_run_dir(p, tmp / f"{i}-{p.stem}")))
        elif p.is_dir():
            out += [d for d in run_dirs([p]) if d not in out]
        elif not p.exists():
            raise ConfigError(f"{what}: {p} does not exist; give run directories, folders that hold "
                              "them, or a pytest-benchmark JSON file")
        else:
            raise ConfigError(f"{what}: {p} is neither a run directory (or a folder holding them) nor "
                              "a pytest-benchmark JSON file")
    return out


def load_plugins(paths) -> list[str]:
    """Load the plugins the results recorded (:mod:`harness.rundir.plugins`; a pytest-benchmark
    JSON's in its benchmarks' ``extra_info``, :func:`reports.benchjson.plugin_records`), so the
    rules may name their routers; never raises for a result it cannot read (:func:`resolve` does).

    Returns:
        one sentence per plugin that could not be loaded here.
    """
    import json

    from harness.rundir.plugins import load_for
    from reports.benchjson import plugin_records
    from routers import plugins
    dirs, recs = [], []
    for p in map(Path, paths):
        if p.is_file() and p.suffix == ".json":
            try:
                recs += plugin_records(json.loads(p.read_text(encoding="utf-8")))
            except (OSError, ValueError, AttributeError):
                continue
        elif p.is_dir():
            dirs += [p] + sorted(m.parent for m in p.rglob("manifest.json"))
    return list(dict.fromkeys(load_for(dirs) + plugins.load_recorded(recs)))


def read_baseline(baseline: Path, tmp: Path) -> list[Path]:
    """The baseline's run directories: those in or below ``baseline`` and the bench JSON files
    directly in it (converted under ``tmp``, :func:`resolve`); ``[]`` when it is missing or empty.

    Raises:
        ConfigError: ``baseline`` is a file, or holds a malformed JSON.
    """
    if not baseline.exists():
        return []
    if not baseline.is_dir():
        raise ConfigError(f"--baseline {baseline}: not a directory; give the folder of the baseline run")
    held = [] if (baseline / RECORDS_FILE).is_file() else sorted(baseline.glob("*.json"))
    held += [baseline] if any(baseline.rglob(RECORDS_FILE)) else []
    return resolve(held, tmp, what=f"--baseline {baseline}") if held else []


def baseline_entries(baseline: Path) -> list[Path]:
    """What ``--update-baseline`` may replace in ``baseline``: its run directories (folders with a
    ``records.jsonl`` in or below them) and JSON files.

    Raises:
        ConfigError: ``baseline`` holds anything else (it is refused rather than emptied).
    """
    if not baseline.is_dir():
        return []
    if (baseline / RECORDS_FILE).is_file():
        raise ConfigError(f"--baseline {baseline}: is itself a run directory; give a folder that holds "
                          "the baseline's run directories (--update-baseline replaces its content)")
    entries = sorted(baseline.iterdir())
    for e in entries:
        if not ((e.is_file() and e.suffix == ".json") or (e.is_dir() and any(e.rglob(RECORDS_FILE)))):
            raise ConfigError(f"--baseline {baseline}: holds {e.name}, neither a run directory nor a "
                              "bench JSON; --update-baseline replaces only a baseline folder: give an "
                              "empty or baseline-only DIR")
    return entries


def write_baseline(results, baseline: Path) -> list[Path]:
    """Replace ``baseline``'s content by a copy of the gated RESULTS: each run directory in or below
    them (``shutil.copytree``) and each JSON file given; staged beside ``baseline`` first, so a
    failed copy leaves the old baseline in place.

    Args:
        results: the RESULTS paths as given (JSON files are copied as files).
        baseline: the ``--baseline`` folder (created if missing).

    Returns:
        The new entries of ``baseline``.

    Raises:
        ConfigError: ``baseline`` holds something other than a baseline (:func:`baseline_entries`),
            or cannot be written.
    """
    old = baseline_entries(baseline)
    files = [Path(p) for p in results if Path(p).is_file()]
    dirs = run_dirs([p for p in results if Path(p).is_dir()]) if len(files) < len(results) else []
    stage = baseline.parent / f".{baseline.name}.new-{os.getpid()}"
    names: list[str] = []
    try:
        stage.mkdir(parents=True)
        for src in files + dirs:
            name, i = src.name, 1
            while name in names:
                i += 1
                name = f"{src.stem}-{i}{src.suffix}" if src.is_file() else f"{src.name}-{i}"
            names.append(name)
            (shutil.copy2 if src.is_file() else shutil.copytree)(src, stage / name)
        baseline.mkdir(parents=True, exist_ok=True)
        for e in old:
            shutil.rmtree(e) if e.is_dir() else e.unlink()
        for name in names:
            (stage / name).rename(baseline / name)
    except OSError as exc:
        raise ConfigError(f"--baseline {baseline}: cannot update it ({exc.strerror or exc})") from None
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return [baseline / n for n in names]


def _num(x: float) -> str:
    return f"{x:.2f}" if math.isfinite(x) else "—"


def _ci(r) -> str:
    return f"{r['lo']:.2f}–{r['hi']:.2f}" if math.isfinite(r["lo"]) and math.isfinite(r["hi"]) else "—"


#: Width at which the console table wraps its note column (the markdown keeps each note on one line).
NOTE_WIDTH = 60


def render(results, fmt: str = "simple") -> str:
    """The table of :data:`COLUMNS` (``tabulate`` format ``fmt``, e.g. ``"github"``); in a console
    format the note wraps at :data:`NOTE_WIDTH` characters, so the case stays on screen."""
    from tabulate import tabulate
    body = [[r["rule"], r["metric"], r["case"], _num(r["ratio"]), _ci(r), f"{r['limit']:.2f}",
             r["verdict"], r["note"]] for _, r in results.iterrows()]
    wrap = None if fmt == "github" else [None] * (len(COLUMNS) - 1) + [NOTE_WIDTH]
    return tabulate(body, headers=COLUMNS, tablefmt=fmt, disable_numparse=True, maxcolwidths=wrap)


def fail_lines(results) -> list[str]:
    """``FAIL <rule>: <case>: ratio 1.83 (CI 1.71–1.95) > limit 1.25`` per failing case."""
    return [f"FAIL {r['rule']}: {r['case']}: ratio {r['ratio']:.2f} (CI {_ci(r)}) > limit {r['limit']:.2f}"
            for _, r in results[results["verdict"] == "fail"].iterrows()]


def summary_line(results, status: int) -> str:
    """The final count line: checks per verdict and the exit status they give."""
    n = results["verdict"].value_counts()
    skipped = f", {n['skipped']} skipped" if n.get("skipped") else ""
    return (f"gate: {results['rule'].nunique()} rule(s), {len(results)} check(s): {n.get('pass', 0)} pass, "
            f"{n.get('fail', 0)} fail, {n.get('inconclusive', 0)} inconclusive{skipped} -> exit {status}")


def baseline_blockers(table) -> str:
    """Why this run must not become the baseline ("" when it may): a failed check (a regression
    would become the reference) or a check left inconclusive for another reason than the want of a
    baseline (a busy machine, a straddling interval: an uncertain reference)."""
    from harness.ci.gate import NO_CASE
    failed = int((table["verdict"] == "fail").sum())
    if failed:
        return f"{failed} check(s) failed"
    waiting = table["note"].str.startswith(("no baseline yet", "not in the baseline"))
    unsure = table[(table["verdict"] == "inconclusive") & ~waiting & (table["case"] != NO_CASE)]
    if len(unsure):
        first = unsure.iloc[0]
        return f"{len(unsure)} check(s) inconclusive, e.g. {first['rule']} on {first['case']}: {first['note']}"
    return ""


def _frame(dirs, what: str):
    from reports.frame import load_frame
    try:
        return load_frame(dirs)
    except (FileNotFoundError, ValueError) as exc:
        raise ConfigError(f"{what}: {exc}") from None


def _names(paths) -> str:
    return ", ".join(str(p) for p in paths)


@click.command("gate", short_help=SHORT_HELP["gate"])
@click.argument("results", nargs=-1, required=True)
@click.option("--rules", "rules_path", required=True, metavar="RULES.toml",
              help="Rules file: [[rule]] tables with metric, max_pct and optional name, routers, modes, "
                   "backends (.ci/gate.toml).")
@click.option("--baseline", default=None, metavar="DIR",
              help="Folder with the baseline run's run dirs or bench JSON, for overhead_growth rules.")
@click.option("--update-baseline", is_flag=True,
              help="After the rules are evaluated, replace --baseline DIR's content with a copy of RESULTS.")
@click.option("--strict", is_flag=True, help="Exit 1, not 3, when a check is inconclusive.")
@click.option("--markdown", default=None, metavar="FILE",
              help="Also write the table as GitHub markdown to FILE (e.g. for $GITHUB_STEP_SUMMARY).")
@click.option("--noise-thresholds", default=None, metavar="JSON",
              help='Thresholds of a busy machine or noisy timing, e.g. \'{"cpu_pressure_max": 0.3}\' '
                   "(keys and defaults: harness/timing/noise.py THRESHOLDS). A check timed while the machine "
                   "was busy (cpu_pressure, cpu_util) is inconclusive.")
def gate_cmd(results, rules_path, baseline, update_baseline, strict, markdown, noise_thresholds) -> None:
    """Check paired timing ratios of RESULTS (run dirs, folders holding them, or pytest-benchmark
    JSON files) against the rules: compile_vs_eager, cudagraph_vs_eager, overhead_vs_prenorm
    (ratios within one run) and overhead_growth (vs --baseline, the same device).

    A check fails only when the ratio's whole 95 % CI lies above 1 + max_pct/100, passes when it
    lies at or below, and is inconclusive otherwise. overhead_growth rules are skipped without
    --baseline, inconclusive while DIR is empty. A check whose group was timed on a busy machine
    (harness/timing/noise.py) is inconclusive. --update-baseline stores RESULTS only when no check failed
    and none was inconclusive except for want of a baseline. Exit status: 0 all pass, 1 a rule
    failed, 3 only inconclusive besides passes (--strict: 1), 2 bad input.
    """
    from harness.ci import gate
    from harness.ci import rules as gate_rules
    from reports.paired import paired_rows
    if update_baseline and baseline is None:
        raise ConfigError("--update-baseline needs --baseline DIR (the folder to write the baseline to)")
    from .report import parse_noise_thresholds
    thresholds = parse_noise_thresholds(noise_thresholds)
    for note in load_plugins(results):  # before the rules: they may name a plugin's routers
        click.echo(f"Plugins: {note}.", err=True)
    rules = gate_rules.load_rules(rules_path)
    base_dir = Path(baseline) if baseline is not None else None
    for r in results if base_dir is not None else ():
        a, b = Path(r).resolve(), base_dir.resolve()
        if a == b or b in a.parents or a in b.parents:
            raise ConfigError(f"--baseline {base_dir}: overlaps RESULTS {r}; keep the baseline folder apart "
                              "from the results it is compared with")
    if update_baseline:
        baseline_entries(base_dir)  # refuse a folder it must not empty, before any work
    with tempfile.TemporaryDirectory(prefix="routerbench-gate-") as tmp:
        what = f"RESULTS {_names(results)}"
        dirs = resolve(results, Path(tmp) / "results")
        df = _frame(dirs, what)
        if df.empty:
            raise ConfigError(f"{what}: no rows in {_names(dirs)}")
        if paired_rows(df).empty:
            raise ConfigError(f"{what}: no paired step times (step_time rows with a pair column): run "
                              "`routerbench run --paired` (the default) or the pytest-benchmark suite")
        if not gate.has_paired_ratios(df):
            raise ConfigError(f"{what}: no paired ratio: no router timed beside prenorm, nor a compiled "
                              "step beside eager, in one group (add prenorm to --routers)")
        device = gate.device_of(dirs, df, what)
        base_df = gate.NO_BASELINE
        if base_dir is not None:
            base_df = f"no baseline yet: nothing in {base_dir}"
            bdirs = read_baseline(base_dir, Path(tmp) / "baseline")
            if bdirs:
                base_df = _frame(bdirs, f"--baseline {base_dir}")
                base_device = gate.device_of(bdirs, base_df, f"--baseline {base_dir}")
                if base_device != device:
                    raise ConfigError(f"--baseline {base_dir}: measured on {base_device[1]} ({base_device[0]}), "
                                      f"RESULTS on {device[1]} ({device[0]}); ratios of two devices do not "
                                      "compare: give a baseline of this device")
        table = gate.evaluate(rules, df, base_df, thresholds)
    status = gate.exit_status(table, strict)
    click.echo(render(table))
    for line in fail_lines(table):
        click.echo(line)
    click.echo(summary_line(table, status))
    if markdown:
        try:
            Path(markdown).write_text(f"### routerbench gate\n\n{render(table, 'github')}\n\n"
                                      f"{summary_line(table, status)}\n", encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"--markdown {markdown}: cannot write it ({exc.strerror or exc})") from None
    if update_baseline:
        why = baseline_blockers(table)
        if why:
            click.echo(f"baseline not updated ({why}): {base_dir} keeps what it held")
        else:
            new = write_baseline(results, base_dir)
            click.echo(f"baseline updated: {base_dir} now holds {_names(p.name for p in new)}")
    sys.exit(status)  # not ctx.exit: `python -m harness.cli` drops a command's return value


COMMANDS = (gate_cmd,)
