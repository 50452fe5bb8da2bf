"""``routerbench check NAME``: the conformance checks of a router or impl (docs/PLUGINS.md,
"routerbench check"; :mod:`harness.conformance`): one table (check, result, figure), then one line
per failure saying what to change. Exit 0 when every check passes, 1 when any fails, 2 for bad
input (an unknown NAME: one line listing the known routers and impls)."""

from __future__ import annotations

import sys

import click

from . import SHORT_HELP


def table(findings) -> list[str]:
    """The lines of the table: a header, then one row per finding (check, result, figure)."""
    rows = [("check", "result", "figure")]
    for f in findings:
        rows.append((f.check, "info" if f.info else ("pass" if f.passed else "FAIL"), f.figure))
    w0, w1 = (max(len(r[i]) for r in rows) for i in (0, 1))
    return [f"{a:{w0}s}  {b:{w1}s}  {c}".rstrip() for a, b, c in rows]


@click.command("check", short_help=SHORT_HELP["check"])
@click.argument("name")
@click.option("--impl", default=None, metavar="IMPL",
              help="Check this impl of router NAME against its family's reference impl (naive).")
@click.option("--inductor", is_flag=True, default=False,
              help="Also compile the step with Inductor and compare it with eager (tens of seconds on a CPU).")
@click.option("--device", default="cpu", show_default=True, type=click.Choice(["cpu", "cuda"]),
              help="Where the step checks (capture, graphs, ops) run; float64 equality runs on the CPU.")
def check_cmd(name: str, impl: str | None, inductor: bool, device: str) -> None:
    """Conformance checks of router (or impl) NAME: float64 equality with its reference (gradients
    too), no host synchronisation, graph breaks and layer-scope recompiles, ops and saved
    activations against prenorm, declared cost models. Exit 0: all pass; 1: a check failed; 2: bad
    input."""
    import torch

    from harness.conformance.run import resolve, run_checks
    from routers.errors import ConfigError
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda: no CUDA device here; use --device cpu")
    router, impl = resolve(name, impl, device)
    what = f"{router} (impl {impl})" if impl else router
    click.echo(f"routerbench check {what}:")
    findings = run_checks(router, impl, inductor=inductor, device=device)
    for line in table(findings):
        click.echo("  " + line)
    failed = [f for f in findings if not f.passed]
    for f in failed:
        click.echo(f"{f.check}: {f.line}")
    click.echo(f"{len(failed)} of {len(findings)} checks failed" if failed else "every check passed")
    sys.exit(1 if failed else 0)


COMMANDS = (check_cmd,)
