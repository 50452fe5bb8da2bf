"""The ``routerbench`` command (DESIGN.md, "Commands"): one module per command, each a thin
wiring over its spec (:mod:`harness.spec`), the measuring code and the report.

Every option is checked before any model is built; a bad value exits with status 2 and one line
``routerbench: error: …`` naming the option (or ``--config`` key) to change, click's own usage
errors included. Long commands (``run``, ``train``, ``profile``) hold one lock per run directory
and stop cleanly on SIGINT/SIGTERM (:class:`harness.cli.common.Run`).
"""

from __future__ import annotations

#: What this package may import (DESIGN.md, "Layers"; checked by tests/test_layers.py): every stage.
MAY_IMPORT = ("routers", "workloads", "harness.stats", "harness.rundir", "harness.step", "harness.timing",
              "harness.costs", "harness.sweep", "harness.training", "harness.spec", "reports", "harness.ci")

import os  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402


def _interrupted_while_loading(signum, frame):  # Ctrl-C while torch loads: no traceback
    sys.stderr.write("\nrouterbench: interrupted before any work\n")
    os._exit(128 + signum)


_previous_sigint = signal.signal(signal.SIGINT, _interrupted_while_loading)

import click  # noqa: E402 - after the handler: importing torch takes seconds

from routers.errors import ConfigError  # noqa: E402


class _Group(click.Group):
    """Turns every usage or configuration error into one line and exit status 2."""

    def main(self, args=None, prog_name=None, **kw):
        try:
            return super().main(args=args, prog_name=prog_name or "routerbench", standalone_mode=False, **kw)
        except click.exceptions.NoArgsIsHelpError as exc:
            click.echo(exc.ctx.get_help() if exc.ctx else str(exc))
            sys.exit(0)
        except click.UsageError as exc:
            path = exc.ctx.command_path if exc.ctx else "routerbench"
            _fail(exc.format_message().replace("\n", " ") + f" (see {path} --help)")
        except click.ClickException as exc:
            _fail(exc.format_message())
        except click.exceptions.Exit as exc:
            sys.exit(exc.exit_code)
        except click.exceptions.Abort:
            click.echo("routerbench: aborted", err=True)
            sys.exit(130)

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except ConfigError as exc:
            _fail(str(exc))


def _fail(msg: str) -> None:
    click.echo(f"routerbench: error: {' '.join(str(msg).split())}", err=True)
    sys.exit(2)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """Benchmark and profile residual routers in decoder-only Transformers."""


def _register() -> None:
    from . import compare, data, diagnose, export, gate, listing, profile, report, run, status, study, train
    for mod in (listing, run, train, study, profile, report, compare, gate, export, diagnose, status, data):
        for cmd in mod.COMMANDS:
            main.add_command(cmd)


_register()
signal.signal(signal.SIGINT, _previous_sigint)  # the commands install their own (harness.cli.common)
