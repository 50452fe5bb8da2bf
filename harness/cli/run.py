"""``routerbench run``: the cost sweep, then the one-seed smoke race and the report."""

from __future__ import annotations

import click

from harness.sweep.options import timing_manifest

from ..spec import RunSpec
from ..spec.run import RACE_EVAL_EVERY, RACE_PRESET
from .common import Run, load_spec, spec_options
from .report import write_report
from .train import corpus_info, load_corpus, plan, train_runs


@click.command("run")
@spec_options(RunSpec)
def run_cmd(config, **cli) -> None:
    """Cost sweep (+ a one-seed smoke race + report). With no options: this device's default suite.

    Shapes: the device grid (CPU: d=64,128 x 4,8 layers), or with --preset that preset's one shape;
    --widths and --depths override either."""
    from harness.costs.bandwidth import record_bandwidth
    from harness.sweep.run import run_sweep
    from harness.training.config import TrainConfig
    from workloads.config import preset

    spec, labels = load_spec(RunSpec, cli, config)
    cases = spec.cases()
    opts = spec.sweep_options()
    runs, corpus, tc = [], None, None
    if spec.race.train:  # the corpus is read before any model, so a bad --data fails first
        corpus = load_corpus(spec.race.data, labels("race.data"))
        tc = TrainConfig(preset(RACE_PRESET), target_loss=spec.race.target_loss,
                         max_steps=spec.race.train_steps, eval_every=RACE_EVAL_EVERY)
        runs = plan(spec.race_options(), tc, [0], corpus)
    run = Run("run", spec)
    from dataclasses import replace

    from harness.costs.memory import available_bytes
    from harness.sweep.plan import split_groups
    from harness.training.schedule import MEMORY_FRACTION
    budget = int(MEMORY_FRACTION * available_bytes(run.device))  # a group must fit in half the free memory
    opts = replace(opts, group_budget_bytes=budget)
    split = split_groups(cases, opts.paired, budget)
    run.manifest({"cases": len(cases), "timing": timing_manifest(opts),
                  "group_memory": {"budget_bytes": budget, "fraction_of_free": MEMORY_FRACTION,
                                   "split": split},
                  "impls": impl_manifest(cases, run.device),
                  **({"corpus": corpus_info(corpus)} if corpus else {})})
    if split:
        click.echo(f"note: {len(split)} paired group(s) do not fit in {budget / 2**30:.1f} GiB by estimate "
                   "and are split into subgroups that each hold prenorm (manifest: group_memory)", err=True)
    run.announce(f"  ({len(cases)} cost cases)")
    with run.guarded(lambda: [c.key for c in cases] + [k for *_, k in runs]):
        record_bandwidth(run.writer, run.device, opts.timing)  # once per run: the floor's bandwidth
        stats = run_sweep(cases, run.device, run.writer, opts, progress=not spec.output.quiet)
        click.echo(f"cost sweep: {stats}")
        if runs:
            train_runs(runs, corpus, tc, run, spec.output.quiet, label="smoke race")
        if spec.output.report:
            write_report([run.dir])


COMMANDS = (run_cmd,)


def impl_manifest(cases, device) -> dict:
    """Each implementation the sweep uses: its schedule, package and version, and why it cannot
    run here (None when it can), for the manifest."""
    from routers import impls
    out = {}
    for name in sorted({c.impl for c in cases if c.router in impls.BLOCK_ROUTERS}):
        impl = impls.get(name)
        out[name] = {"schedule": impl.schedule, "package": impl.package, "version": impl.version(),
                     "unavailable": impl.unavailable_reason(device.type), "conventions": impl.conventions}
    return out
