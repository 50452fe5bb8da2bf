"""``routerbench study depth``: the papers' depth study (routers × depths × seeds, paired by seed)."""

from __future__ import annotations

import time

import click

from routers.errors import ConfigError

from . import SHORT_HELP
from ..spec.study import StudySpec
from .common import load_spec, spec_options
from .forecast import calibrate, corpus_vocab, dry_run_option, plan_study
from .study_report import report_cmd
from .study_train import backend_line, train_study


@click.group("study", short_help=SHORT_HELP["study"])
def study_group() -> None:
    """Studies across a grid of shapes: `study depth`, the papers' depth study; `study report`, one
    report merged from its units or run directories."""


@study_group.command("depth")
@spec_options(StudySpec)
@dry_run_option
def depth_cmd(config, dry_run, **cli) -> None:
    """Train routers at several depths over seeds, paired by seed, with the block layout held
    fixed across depths; table and figures of the loss at the token budget against block_attnres.

    Defaults: prenorm, rezero, layerscale, block_attnres, haares, wav_v1, mhc; depths 12,24,48 at the
    char-* presets' settings (d=512, T=256, B=32, 5000 steps), 3 seeds; --blocks 4; the embedded
    corpus; --backend eager (cudagraph: the whole training step in one CUDA graph, CUDA only).
    --scale tiny: depths 4,8,16 at d=64, 200 steps, one seed, a plumbing smoke test.
    The plan (runs, steps, estimated time range and peak memory) is printed before any model is
    built; --dry-run prints it and exits (the timed estimate runs only when the study does).

    As units (one seed at one depth, every router; docs/TRAINING.md): --units json|commands prints
    each unit's command; --unit I,J runs those here; --launcher local --workers N runs them in
    parallel; `routerbench status ROOT` and `routerbench study report ROOT` read them back."""
    command_started = time.perf_counter()
    import torch

    from harness.training.config import train_unavailable_reason
    from harness.training.units import default_threads, torch_threads

    from .train import load_corpus

    spec, labels = load_spec(StudySpec, cli, config)
    st = spec.study
    device = torch.device(spec.output.device)
    unavailable = train_unavailable_reason(st.backend, device)
    if dry_run:
        click.echo(spec.scale_label())
        calibrate(plan_study(spec, device, corpus_vocab(st.data, labels("study.data"))),
                  spec.output.out, device).echo()
        click.echo(backend_line(spec))
        if note := spec.budget_note():
            click.echo(f"budget: {note}")
        if unavailable:
            click.echo(f"note: {labels('study.backend')} {st.backend} cannot run here ({unavailable}): "
                       "without --dry-run the study refuses it")
        click.echo("dry run: no model built, no run directory created")
        return
    if unavailable and spec.launch.launcher != "slurm":  # (a login node: the nodes run it) one line, exit 2
        raise ConfigError(f"{labels('study.backend')} {st.backend}: {unavailable}; use --backend eager or "
                          "compile here, or run the study on a CUDA device")
    if spec.unit_mode():  # one seed at one depth per run directory (harness/training/units.py)
        from . import study_units
        la = spec.launch
        if la.launcher == "slurm":  # sbatch --test-only first: a refused array writes nothing
            from .study_slurm import launch_slurm
            launch_slurm(spec, labels, *study_units.plan_root(spec), la.unit)
            return
        root, study_id, units = study_units.study_root(spec, labels)
        chosen = [units[i] for i in la.unit] if la.unit is not None else units
        if la.units is not None:
            study_units.print_units(spec, labels, root, study_id, units, device, la.units)
        elif la.launcher == "local":
            study_units.launch_local(spec, labels, root, study_id, chosen, device)
        else:
            study_units.run_here(spec, labels, root, chosen, device)
        return
    corpus = load_corpus(st.data, labels("study.data"))
    threads = spec.launch.threads or default_threads()
    with torch_threads(threads):
        train_study(spec, labels, corpus, device, threads, command_started)


study_group.add_command(report_cmd)

COMMANDS = (study_group,)
