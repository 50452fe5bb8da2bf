"""``routerbench run``: the cost sweep, then the one-seed smoke race and the report."""

from __future__ import annotations

import sys
import time
from dataclasses import replace
from pathlib import Path

import click

from harness.step.backends import captures, compiles
from harness.sweep.options import timing_manifest

from . import SHORT_HELP
from ..spec import RunSpec
from ..spec.run import RACE_EVAL_EVERY, RACE_PRESET
from ..spec.suites import DEFAULT_SUITE
from .common import DEFAULT_OUT, Run, load_spec, program, spec_options
from .forecast import EMBEDDED_VOCAB, calibrate, corpus_vocab, dry_run_option, plan_run
from .report import print_summary, write_report
from .supervise import supervise, supervised_child
from .train import corpus_info, load_corpus, plan, train_runs


@click.command("run", short_help=SHORT_HELP["run"])
@spec_options(RunSpec)
@dry_run_option
def run_cmd(config, dry_run, **cli) -> None:
    """Cost sweep (+ a one-seed smoke race + report). With no options: the seeds suite, what HAARES
    and WAV v1 cost against Block AttnRes and prenorm here (--suite full, baselines: longer sweeps).

    Shapes: the suite's (seeds: CPU d=64 at 4 and 8 layers, CUDA d=1024 at 4 and 12; full and
    baselines: the device grid), or with --preset that preset's one shape; --widths and --depths
    override either. The plan (cases, groups, models to compile, estimated
    time and peak memory) is printed before any model is built; --dry-run prints it and exits."""
    started = time.perf_counter()
    import torch

    from harness.costs.memory import available_bytes
    from harness.sweep.plan import split_groups
    from harness.training.config import TrainConfig
    from harness.training.schedule import MEMORY_FRACTION
    from workloads.config import preset

    spec, labels = load_spec(RunSpec, cli, config)
    cases = spec.cases()
    if spec.sweep.supervise and not dry_run and not supervised_child():  # before any CUDA call here
        sys.exit(_supervise(spec, len(cases)))
    device = torch.device(spec.output.device)
    budget = int(MEMORY_FRACTION * available_bytes(device))  # a group must fit in half the free memory
    opts = replace(spec.sweep_options(), group_budget_bytes=budget)
    corpus, tc, vocab = None, None, EMBEDDED_VOCAB
    if spec.race.train:  # the corpus is read before any model, so a bad --data fails first
        if dry_run:
            vocab = corpus_vocab(spec.race.data, labels("race.data"))
        else:
            corpus = load_corpus(spec.race.data, labels("race.data"))
            vocab = corpus.vocab_size
        tc = TrainConfig(preset(RACE_PRESET), target_loss=spec.race.target_loss,
                         max_steps=spec.race.train_steps, eval_every=RACE_EVAL_EVERY)
    forecast = plan_run(spec, cases, opts, device, tc, spec.race_options(), vocab)
    if warn := forecast.check_memory(device, "--widths, --depths, --batch-size or --seq-len (or pick a "
                                             "smaller --preset)"):
        click.echo(warn, err=True)
    if dry_run:
        calibrate(forecast, spec.output.out, device).echo()
        click.echo("dry run: no model built, no run directory created")
        return
    runs = plan(spec.race_options(), tc, [0], corpus) if tc is not None else []
    run = Run("run", spec)  # a locked or mismatched run directory fails here, in one line
    calibrate(forecast, spec.output.out, device, exclude=run.run_id).echo()
    split = split_groups(cases, opts.paired, budget)
    from reports.floor import FLOOR_VERSION
    run.manifest({"cases": len(cases), "timing": timing_manifest(opts), "floor_version": FLOOR_VERSION,
                  "group_memory": {"budget_bytes": budget, "fraction_of_free": MEMORY_FRACTION,
                                   "split": split},
                  "impls": impl_manifest(cases, run.device), "plan": forecast.manifest(run.resumed),
                  **({"corpus": corpus_info(corpus)} if corpus else {})})
    if split:
        click.echo(f"note: {len(split)} paired group(s) do not fit in {budget / 2**30:.1f} GiB by estimate "
                   "and are split into subgroups that each hold prenorm (manifest: group_memory)", err=True)
    from harness.timing.noise import machine_load
    load = machine_load()  # before this command's own work: what other work holds
    run.announce(f"  ({len(cases)} cost cases" + (f", {len(runs)} training runs)" if runs else ")"))
    from harness.costs.bandwidth import record_bandwidth
    from harness.sweep.run import run_sweep
    with run.guarded(lambda: [c.key for c in cases] + [k for *_, k in runs]):
        record_bandwidth(run.writer, run.device, opts.timing)  # once per run: the floor's bandwidth
        stats = run_sweep(cases, run.device, run.writer, opts, progress=not spec.output.quiet)
        click.echo("cost sweep: " + (", ".join(f"{n} {status}" for status, n in stats.items()) or "nothing to do"))
        if stats.get("skipped"):
            skip_reasons(run.dir)
        if runs:
            train_runs(runs, corpus, tc, run, spec.output.quiet, label="smoke race", load=load)
        if spec.output.report:
            where = write_report([run.dir], say=False)
            if not spec.output.quiet:  # the answer on the terminal: the verdict and the summary table
                click.echo("")
                print_summary([run.dir])
                click.echo("")
            click.echo(where)
    run.finish(started)
    if spec.sweep.suite == DEFAULT_SUITE and not spec.output.quiet:
        click.echo(f"more: {program()} run --suite full (every router, the device grid) or --suite baselines "
                   f"(the field's other residuals); {program()} train (time to a target loss, paired by seed); "
                   "docs/SWEEPS.md lists each with its measured time")
    if cases and not timed_anything(run.dir):
        fix = what_to_change(run.dir)
        click.echo("routerbench: nothing was timed: every cost case was skipped or failed (the reasons above and "
                   f"in {run.dir})" + (f"; on a {run.device.type} {fix}" if fix else ""), err=True)
        sys.exit(1)


def what_to_change(run_dir) -> str:
    """The options that would make the skipped cases of ``run_dir`` run on this device, from what
    made them skip: a ``cudagraph`` case needs ``--backends eager or compile``, a ``reduce-overhead``
    case ``--compile-modes default``, a case whose impl cannot run here another ``--impls``; ""
    when no case was skipped (they failed: their errors say why)."""
    from harness.rundir.records import load_rows
    skipped = [r for r in load_rows([run_dir]) if r.get("metric") == "step_time" and r.get("status") == "skipped"]
    fixes = []
    if any(captures(r.get("backend")) for r in skipped):
        fixes.append("--backends eager or compile (cudagraph captures CUDA work)")
    if any(compiles(r.get("backend")) and r.get("compile_mode") == "reduce-overhead" for r in skipped):
        fixes.append("--compile-modes default or max-autotune-no-cudagraphs (reduce-overhead uses CUDA graphs)")
    if any(not captures(r.get("backend")) and r.get("compile_mode") != "reduce-overhead" for r in skipped):
        fixes.append("--impls naive, two_phase or lean (an impl that cannot run here)")
    return "use " + "; ".join(fixes) if fixes else ""


def timed_anything(run_dir) -> bool:
    """Whether a run holds any timed cost case (an ``ok`` ``step_time`` row) or a training run that
    ended (a ``train_time`` row)."""
    from harness.rundir.records import load_rows
    return any(r.get("status") in ("ok", "not_converged") and r.get("metric") in ("step_time", "train_time")
               for r in load_rows([run_dir]))


def _supervise(spec, n_cases: int) -> int:
    """``--supervise``: this command in a child process, resumed in a new one after each sticky
    device error (:mod:`harness.cli.supervise`); its exit status."""
    import torch

    from harness.rundir.environment import device_slug, new_run_id
    out = spec.output.out or DEFAULT_OUT
    run_id = spec.output.run_id or new_run_id()
    run_dir = Path(out) / device_slug(torch.device(spec.output.device)) / run_id
    return supervise(spec, run_dir, run_id, out, max_restarts=n_cases, prog=program())


def skip_reasons(run_dir, most: int = 3) -> None:
    """Why cases were skipped, on the terminal: each distinct reason of the run's ``skipped``
    ``step_time`` rows (a ``cudagraph`` case on a CPU names what would break its capture there)
    with its count, the most frequent first, at most ``most`` of them."""
    from collections import Counter

    from harness.rundir.records import load_rows
    why = Counter(r.get("error") or "?" for r in load_rows([run_dir])
                  if r.get("metric") == "step_time" and r.get("status") == "skipped")
    for reason, n in why.most_common(most):
        click.echo(f"  skipped ({n}): {reason}")
    if len(why) > most:
        click.echo(f"  skipped: {len(why) - most} more reason(s) in the report's warnings")


COMMANDS = (run_cmd,)


def impl_manifest(cases, device) -> dict:
    """Each implementation the sweep uses: its schedule, package and version, and why it cannot
    run here (None when it can), for the manifest."""
    from routers import impls
    out = {}
    for name in sorted({c.impl for c in cases if impls.family_of(c.router) is not None}):
        impl = impls.get(name)
        fam = impl.family
        out[name] = {"family": fam.name if fam else "every", "schedule": impl.schedule, "package": impl.package, "version": impl.version(),
                     "unavailable": impl.unavailable_reason(device.type), "conventions": impl.conventions}
    return out
