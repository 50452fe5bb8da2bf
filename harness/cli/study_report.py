"""``routerbench study report``: one depth-study report from the units of a study (each its own run
directory, ``study depth --unit``), from whole studies of other seeds, or from one study directory
(:mod:`reports.study_merge`). A subcommand of ``study`` (:mod:`harness.cli.study` adds it)."""

from __future__ import annotations

from pathlib import Path

import click

from routers.errors import ConfigError


@click.command("report", short_help="One depth-study report from study units or run directories.")
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path), metavar="ROOT_OR_DIRS...")
@click.option("--out", "out", type=click.Path(path_type=Path), default=None, metavar="DIR",
              help="Where the report goes (default: the run directory when exactly one is given, else "
                   "<first argument>/report).")
def report_cmd(paths: tuple[Path, ...], out: Path | None) -> None:
    """The depth study's table and figures from study run directories: each argument a run
    directory of `study depth`, a study root (`--out` of `study depth --unit`, with study.json)
    or a directory holding study run directories.

    Losses at the token budget are pooled over all of them (paired by seed); clocks and estimates
    only per device. Units planned but not finished are listed, never filled. Runs of another
    corpus, protocol, block layout or router option, or a unit held twice, are refused in one
    line naming both directories; other torch/triton/routerbench versions or commits are warned of."""
    from reports.study_merge import is_study_dir, write_merged

    if out is None:
        out = paths[0] if len(paths) == 1 and is_study_dir(paths[0]) else paths[0] / "report"
    warnings: list[str] = []
    try:
        files, text = write_merged(list(paths), out, warnings)
    except OSError as exc:
        where = str(exc.filename or "")
        if where and not Path(where).resolve().is_relative_to(Path(out).resolve()):
            raise ConfigError(f"{where}: cannot be read ({exc.strerror or exc}); fix its permissions or leave "
                              "its run directory out") from None
        raise ConfigError(f"--out {out}: cannot write the report there ({exc.strerror or exc}); give --out a "
                          "writable directory") from None
    for w in warnings:
        click.echo(f"warning: {w}")
    click.echo(text)
    click.echo("study report: " + ", ".join(str(files[k]) for k in ("study.md", "study.html") if k in files))
    click.echo("written: " + ", ".join(str(p) for k, p in files.items() if k not in ("study.md", "study.html")))
