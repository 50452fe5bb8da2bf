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
              "harness.costs", "harness.sweep", "harness.training", "harness.spec", "reports", "harness.ci",
              "harness.conformance")

import importlib  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402

#: Every command: name -> (module of this package, its attribute, the one line ``routerbench
#: --help`` shows). The group imports a command's module only when that command runs or shows its
#: own help, so ``routerbench --help`` loads neither torch nor pandas; each command takes its line
#: from here (``short_help=SHORT_HELP[name]``), and tests/test_cli.py checks the table against
#: the modules' ``COMMANDS``.
COMMANDS: dict[str, tuple[str, str, str]] = {
    "list": ("listing", "list_cmd", "Routers (impls, options), backends, modes and presets."),
    "run": ("run", "run_cmd", "Cost sweep (+ a one-seed smoke race + report)."),
    "train": ("train", "train_cmd", "Time to a target validation loss, routers x seeds paired by seed."),
    "study": ("study", "study_group", "Studies across a grid of shapes (`study depth`)."),
    "profile": ("profile", "profile_cmd", "torch.profiler traces of one case; the router's share of a step."),
    "check": ("check", "check_cmd", "Conformance of a router or impl: reference, gradients, host syncs, graphs, costs."),
    "costs": ("costs", "costs_cmd", "Launches and bytes of one step per router and impl, counted, never timed."),
    "kernels": ("kernels", "kernels_cmd", "Each fused kernel alone (time, GB/s, config) and each peer per op."),
    "report": ("report", "report_cmd", "Tables, figures, report.html and report.md from run dirs."),
    "summary": ("report", "summary_cmd", "Paired ratios vs prenorm and vs eager, with CIs and noise flags."),
    "compare": ("compare", "compare_cmd", "Paired ratios per device and step-time ratios between runs."),
    "gate": ("gate", "gate_cmd", "Check paired timing ratios against the CI gate's rules."),
    "export": ("export", "export_cmd", "Run dirs as one table (Parquet or CSV)."),
    "diagnose": ("diagnose", "diagnose_cmd", "What a trained router learned: depth weights, details, RMS."),
    "status": ("status", "status_cmd", "Cases done and left in a run dir, and how to resume it."),
    "data": ("data", "data_group", "Corpora for training."),
    "new": ("new", "new_group", "A package for a router of your own (`new router NAME`): install, check, run."),
}
#: name -> the line ``routerbench --help`` shows for it.
SHORT_HELP = {name: short for name, (_, _, short) in COMMANDS.items()}
#: The commands that load routers, and so plugins (``--plugin``, ``ROUTERBENCH_PLUGINS``, the
#: ``routerbench.routers`` / ``routerbench.impls`` entry points; :mod:`routers.plugins`): a bad
#: plugin stops these only, before any model is built.
LOADS_ROUTERS = frozenset(COMMANDS) - {"data", "status"}


def _interrupted_while_loading(signum, frame):  # Ctrl-C while torch loads: no traceback
    sys.stderr.write("\nrouterbench: interrupted before any work\n")
    os._exit(128 + signum)


_previous_sigint = signal.signal(signal.SIGINT, _interrupted_while_loading)

import click  # noqa: E402 - after the handler: importing torch takes seconds

from routers.errors import ConfigError  # noqa: E402


class _Group(click.Group):
    """Turns every usage or configuration error into one line and exit status 2, and loads each
    command's module on first use (:data:`COMMANDS`)."""

    def list_commands(self, ctx):
        return sorted(COMMANDS)

    def get_command(self, ctx, name):
        if name not in COMMANDS:
            return None
        module, attr, _ = COMMANDS[name]
        return getattr(importlib.import_module(f"{__name__}.{module}"), attr)

    def format_commands(self, ctx, formatter):
        """The commands' lines from :data:`COMMANDS`, without importing their modules."""
        with formatter.section("Commands"):
            formatter.write_dl([(name, SHORT_HELP[name]) for name in self.list_commands(ctx)])

    def main(self, args=None, prog_name=None, **kw):
        from harness.timing import others
        others.mark()  # the window of what other work holds starts with the command (no torch here)
        if (twice := repeated_option(sys.argv[1:] if args is None else args)) is not None:
            _fail(twice)
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

    def resolve_command(self, ctx, args):
        """Click's lookup, with the closest command names offered for a mistyped one."""
        if args and args[0] not in COMMANDS and not args[0].startswith("-"):
            import difflib
            close = difflib.get_close_matches(args[0], COMMANDS, n=2)
            hint = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
            ctx.fail(f"No such command {args[0]!r}.{hint}")
        ctx.meta["routerbench.command_args"] = list(args[1:])  # a command's --help loads no plugin
        return super().resolve_command(ctx, args)

    def invoke(self, ctx):
        from harness.rundir import faults
        try:
            faults.parse(os.environ.get(faults.ENV))  # the test hook's value, checked before any work
        except ValueError as exc:
            _fail(str(exc))
        try:
            return super().invoke(ctx)
        except ConfigError as exc:
            _fail(str(exc))


def repeated_option(args) -> str | None:
    """Why ``args`` name one option twice (``--widths 64 --widths 128``, or ``--quiet`` and
    ``--no-quiet``), or None. Click would keep the last silently; every option of routerbench takes
    one value (lists are comma-separated), so a repeat is refused before any work."""
    seen: dict[str, str] = {}
    for tok in args or ():
        if tok == "--":
            break
        if not isinstance(tok, str) or not tok.startswith("--") or tok in ("--help",):
            continue
        flag = tok.split("=", 1)[0]
        name = "--" + flag[5:] if flag.startswith("--no-") else flag
        if name in seen:
            if seen[name] != flag:
                return f"{seen[name]} and {flag} are both given; give one of them"
            return f"{flag} is given twice; give it once (a list is one comma-separated value, e.g. --widths 64,128)"
        seen[name] = flag
    return None


def _fail(msg: str) -> None:
    click.echo(f"routerbench: error: {' '.join(str(msg).split())}", err=True)
    sys.exit(2)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--plugin", "plugin", default=None, metavar="MODULE_OR_FILE[,...]",
              help="Load routers or impls from your own code: module names or .py files, comma-separated "
                   "(also ROUTERBENCH_PLUGINS, a --config file's plugins key and installed entry points; "
                   "docs/PLUGINS.md). ROUTERBENCH_PLUGINS=none loads no plugin.")
@click.pass_context
def main(ctx: click.Context, plugin: str | None) -> None:
    """Benchmark and profile residual routers in decoder-only Transformers.

    Every option takes one value (a list is one comma-separated value: --widths 64,128); an
    option given twice is refused."""
    asks_help = any(a in ("--help", "-h") for a in ctx.meta.get("routerbench.command_args", ()))
    if ctx.invoked_subcommand in LOADS_ROUTERS and not asks_help:
        from routers import plugins
        plugins.activate(plugin)
    elif plugin:
        raise ConfigError(f"--plugin: `routerbench {ctx.invoked_subcommand}` loads no router; drop --plugin")


signal.signal(signal.SIGINT, _previous_sigint)  # the commands install their own (harness.cli.common)
