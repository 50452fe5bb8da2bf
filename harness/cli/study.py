"""``routerbench study depth``: the papers' depth study (routers × depths × seeds, paired by seed)."""

from __future__ import annotations

import time

import click

from routers.errors import ConfigError

from . import SHORT_HELP
from ..spec.study import StudySpec
from .common import Run, load_spec, spec_options
from .forecast import calibrate, corpus_vocab, dry_run_option, plan_study


@click.group("study", short_help=SHORT_HELP["study"])
def study_group() -> None:
    """Studies across a grid of shapes: `study depth`, the papers' depth study."""


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
    built; --dry-run prints it and exits (the timed estimate runs only when the study does)."""
    command_started = time.perf_counter()
    import torch

    from harness.timing.noise import THRESHOLDS
    from harness.training.config import train_unavailable_reason
    from harness.training.schedule import Trainer, choose_schedule
    from harness.training.study import all_runs, estimate_cost, fmt_duration, groups

    from .train import corpus_info, load_corpus

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
    if unavailable:  # before the corpus, any model or the run directory: one line, exit 2
        raise ConfigError(f"{labels('study.backend')} {st.backend}: {unavailable}; use --backend eager or "
                          "compile here, or run the study on a CUDA device")
    corpus = load_corpus(st.data, labels("study.data"))
    scheds = {}
    for seed, depth, group in groups(spec, corpus, device):
        if seed:
            break
        scheds[depth] = choose_schedule(st.schedule, group, device)
    deepest = scheds[max(scheds)]
    one = max(deepest["estimate_bytes"].values())
    if device.type == "cpu" and one > deepest["available_bytes"]:
        raise ConfigError(f"one run at depth {max(scheds)} needs an estimated {one / 2**30:.1f} GiB, more "
                          f"than the {deepest['available_bytes'] / 2**30:.1f} GiB free here; lower "
                          f"{labels('study.depths')} or use {labels('study.scale')} tiny")
    runs = all_runs(spec, corpus, device)
    run = Run("study depth", spec)  # a locked or mismatched run directory fails here, in one line
    click.echo(spec.scale_label())
    forecast = calibrate(plan_study(spec, device, corpus.vocab_size), spec.output.out, device, run.run_id)
    forecast.echo()
    click.echo(backend_line(spec))
    if note := spec.budget_note():
        click.echo(f"budget: {note}")
    run.announce(f"  ({len(runs)} runs: {len(spec.routers.routers)} routers x {len(st.depths)} depths x "
                 f"{st.seeds} seed{'s' * (st.seeds != 1)})")
    layout, cfg = spec.layout(), spec.decoder_config(st.depths[0])
    if layout["routers"]:
        per = ", ".join(f"{d}: {v['n_blocks']} x {v['layers_per_block']}" for d, v in layout["per_depth"].items())
        click.echo(f"block layout: {layout['held']} held fixed at {layout['value']} for "
                   f"{', '.join(layout['routers'])} (depth: blocks x layers per block = {per})")
    with run.guarded(lambda: [r.key for r in runs]):
        from harness.rundir.records import units
        reached = {m["segment"]["case"]: m["segment"]["step"] for m in units(run.dir) if m.get("segment")}
        left: dict[tuple[int, str], float] = {}  # runs left, a resumed run counted by its steps left
        n_left = 0
        for r in runs:
            if r.key not in run.writer.completed:
                n_left += 1
                frac = 1 - reached.get(r.key, 0) / max(1, r.tc.max_steps)
                left[(r.cfg.n_layers, r.router)] = left.get((r.cfg.n_layers, r.router), 0) + frac
        estimate = None
        if left:
            click.echo(f"estimate: timing {st.estimate_steps} steps of each router at each depth "
                       f"(after {spec.train_config(st.depths[0]).untimed_warmup} untimed) ...")
            estimate = estimate_cost(spec, corpus, run.device, left, echo=click.echo)
            click.echo(f"estimate: {fmt_duration(estimate['total_s'])} for the {n_left} "
                       f"run{'s' * (n_left != 1)} left of {len(runs)} (steps, evaluations and "
                       "set-up, a resumed run by its steps left; checkpoints not counted)")
            pressure = estimate["machine"].get("cpu_pressure")
            if pressure is not None and pressure > THRESHOLDS["cpu_pressure_max"]:
                click.echo(f"estimate: CPU pressure {pressure:.2f} while timing (tasks waited for a CPU "
                           f"{pressure:.0%} of the time): the machine is loaded and the estimate with it")
        run.manifest({"corpus": corpus_info(corpus), "study": "depth", "scale": st.scale,
                      "scale_label": spec.scale_label(), "routers": list(spec.routers.routers),
                      "depths": list(st.depths), "seeds": list(range(st.seeds)), "layout": layout,
                      "router_options": {str(d): spec.options_at(d) for d in st.depths},
                      "schedule": {str(d): s for d, s in scheds.items()}, "estimate": estimate,
                      "eval_every": st.eval_every, "max_steps": st.max_steps, "precision": st.precision,
                      "backend": st.backend, "compile_scope": st.compile_scope,
                      "full_max_steps": spec.full_steps(), "budget_note": spec.budget_note(),
                      "token_budget": st.max_steps * cfg.batch_size * cfg.seq_len,
                      "metric": "loss_at_token_budget", "plan": forecast.manifest(run.resumed)})
        started = time.perf_counter()
        trainer = Trainer(run.writer, run.dir, run.device, spec.output.quiet, "study")
        for seed, depth, group in groups(spec, corpus, run.device):
            trainer.label = f"study L{depth}"
            trainer.run_group(group, scheds[depth]["schedule"], st.eval_every)
        if left:
            click.echo(f"trained in {fmt_duration(time.perf_counter() - started)} (estimated "
                       f"{fmt_duration(estimate['total_s'])})")
        if spec.output.report:
            from reports.study import write_study
            paths, text = write_study(run.dir)
            click.echo(text)
            click.echo("study report: " + ", ".join(str(paths[k]) for k in ("study.md", "study.html")
                                                    if k in paths))
            from .train import diagnose
            diagnose(run.dir, run.device)  # what each router learned, per depth
    run.finish(command_started)


#: What each backend does to a study run's step, as the plan says it.
BACKEND_WORDS = {"eager": "each op launched from Python",
                 "compile": "torch.compile(fullgraph=True), compiled once per run, off the clock",
                 "cudagraph": "forward, backward, clip and AdamW captured in one CUDA graph per run, "
                              "the capture off the clock"}


def backend_line(spec) -> str:
    """``backend: cudagraph (...), precision bf16-mixed`` for the plan."""
    st = spec.study
    scope = f", scope {st.compile_scope}" if st.compile_scope else ""
    return f"backend: {st.backend}{scope} ({BACKEND_WORDS[st.backend]}), precision {st.precision}"


COMMANDS = (study_group,)
