"""``routerbench export``: results as one Parquet or CSV file for pandas, DuckDB or a spreadsheet."""

from __future__ import annotations

from pathlib import Path

import click

from . import SHORT_HELP


@click.command("export", short_help=SHORT_HELP["export"])
@click.argument("results", nargs=-1, required=True)
@click.option("--out", required=True, metavar="FILE", help="The file to write (replaced if it exists).")
@click.option("--format", "fmt", default=None, metavar="[parquet|csv]",
              help="File format (default: from the suffix of --out, .parquet or .csv).")
@click.option("--attempts", default="last", type=click.Choice(["last", "all"]),
              help="Each case's last timing attempt (default), or every attempt (earlier ones "
                   "superseded=true).")
def export_cmd(results, out, fmt, attempts) -> None:
    """Write run dirs (or folders holding them, or a pytest-benchmark JSON) as one table: the
    case rows of reports.load (row_kind=case), the run-level rows (row_kind=run: memory
    bandwidth) and the damaged record lines (row_kind=damaged: file, line, reason)."""
    from reports.loading import check_export, find_runs, load, write_export
    fmt = check_export(fmt, out)  # before reading anything
    find_runs([r for r in results if Path(r).suffix != ".json"])  # a bad path fails before any conversion
    df = load(*results, attempts=attempts)
    write_export(df, out, fmt)
    runs = df["run_id"].nunique() if len(df) else 0
    click.echo(f"export: {out} ({len(df)} case rows of {runs} run{'s' * (runs != 1)}, "
               f"{len(df.attrs['run_rows'])} run rows, {len(df.attrs['damaged'])} damaged)")


COMMANDS = (export_cmd,)
