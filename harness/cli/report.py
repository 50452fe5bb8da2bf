"""``routerbench report`` and ``routerbench summary``: tables and figures from run directories."""

from __future__ import annotations

from pathlib import Path

import click

from routers.errors import ConfigError


def _run_dirs(results) -> list[Path]:
    dirs = [Path(r) for r in results]
    for d in dirs:
        if not d.is_dir():
            raise ConfigError(f"RESULTS: {d} is not a directory (give run directories or their parents)")
    return dirs


def write_report(run_dirs, out=None) -> None:
    """Build the report of ``run_dirs`` and say where it is."""
    from reports import build_report
    paths = build_report(run_dirs, out)
    click.echo("report: " + ", ".join(str(paths[k]) for k in ("report.html", "report.md") if k in paths))


@click.command("report")
@click.argument("results", nargs=-1, required=True)
@click.option("--out", default=None, help="Output dir (default: the run dir when one is given).")
def report_cmd(results, out) -> None:
    """Tables, seaborn figures, report.html and report.md from one or more run dirs."""
    write_report(_run_dirs(results), out)


@click.command("summary")
@click.argument("results", nargs=-1, required=True)
def summary_cmd(results) -> None:
    """Print step time per case: vs prenorm, vs eager, and compile/capture time apart."""
    from reports.tables import backend_table, load_frame
    t = backend_table(load_frame(_run_dirs(results)))
    if t.empty:
        click.echo("no ok step_time rows")
        return
    t = t.assign(shape=t.apply(lambda r: f"d{r.d_model} L{r.n_layers} T{r.seq_len} B{r.batch_size}", axis=1),
                 backend=t.backend + t.compile_mode.map(lambda m: f"[{m}]" if m else ""))
    cols = ["shape", "mode", "backend", "router", "impl", "median_ms", "overhead_pct", "vs_eager", "setup_s"]
    click.echo(t[cols].to_string(index=False, float_format=lambda v: f"{v:.2f}", na_rep="–"))


COMMANDS = (report_cmd, summary_cmd)
