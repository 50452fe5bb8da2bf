"""``routerbench compare``: the same cases across devices or commits, side by side
(:mod:`reports.compare`)."""

from __future__ import annotations

from pathlib import Path

import click

from routers.errors import ConfigError

from . import SHORT_HELP
from .report import run_dirs


@click.command("compare", short_help=SHORT_HELP["compare"])
@click.argument("runs", nargs=-1, required=True)
@click.option("--out", default=None, metavar="DIR",
              help="Output dir (default: compare-<first run id> beside the first run).")
def compare_cmd(runs, out) -> None:
    """Paired ratios per device, step-time ratios between runs, figures: compare.html + compare.md.

    RUNS are two or more run dirs, or folders holding them; the first is the reference.
    """
    from reports.compare import NothingToCompare, build_compare
    dirs = run_dirs(runs, bench_out="temp")
    if len(dirs) < 2:
        raise ConfigError(f"RUNS: only one run ({dirs[0]}); compare needs two or more run "
                          "directories (or folders holding them)")
    target = Path(out) if out else dirs[0].parent / f"compare-{dirs[0].name}"
    try:
        paths = build_compare(dirs, target)
    except NothingToCompare as exc:
        raise ConfigError(str(exc)) from None
    except OSError as exc:
        raise ConfigError(f"--out {target}: cannot write there ({exc.strerror or exc}); "
                          "give --out a writable directory") from None
    click.echo("compare: " + ", ".join(str(paths[k]) for k in ("compare.html", "compare.md")))


COMMANDS = (compare_cmd,)
