"""One study run directory trained: the whole one-process study of ``routerbench study depth``, or
one of its units (:mod:`harness.training.units`)."""

from __future__ import annotations

import time

import click

from routers.errors import ConfigError

from .common import Run
from .forecast import calibrate, plan_study


def train_study(spec, labels, corpus, device, threads: int, command_started: float, unit=None) -> None:
    """Train the study into one run directory (``--out``/``--run-id``), or only ``unit`` (a
    :class:`harness.training.units.Unit`) into its own, ``<out>/<device>/STUDY-L{depth}-s{seed}``:
    the schedule and memory check, the timed estimate of what is left, the manifest, the runs; the
    report and what each router learned at the end of a whole study (a unit leaves that to
    ``routerbench study report``).

    Raises:
        ConfigError: one run too big for this CPU's free memory (naming ``--depths`` and
            ``--scale``); a locked or mismatched run directory.
    """
    from harness.timing.noise import THRESHOLDS
    from harness.training.schedule import Trainer, choose_schedule
    from harness.training.study import all_runs, estimate_cost, fmt_duration, groups

    from .train import corpus_info

    st = spec.study
    scheds = {}
    for seed, depth, group in groups(spec, corpus, device, unit):
        if depth not in scheds:
            scheds[depth] = choose_schedule(st.schedule, group, device)
    deepest = scheds[max(scheds)]
    one = max(deepest["estimate_bytes"].values())
    if device.type == "cpu" and one > deepest["available_bytes"]:
        raise ConfigError(f"one run at depth {max(scheds)} needs an estimated {one / 2**30:.1f} GiB, more "
                          f"than the {deepest['available_bytes'] / 2**30:.1f} GiB free here; lower "
                          f"{labels('study.depths')} or use {labels('study.scale')} tiny")
    runs = all_runs(spec, corpus, device, unit)
    # a locked or mismatched run directory fails here, in one line
    run = Run("study depth", spec, run_id=unit.run_id if unit else None, lock=not spec.launch.lock_free)
    click.echo(spec.scale_label())
    if unit is None:
        forecast = calibrate(plan_study(spec, device, corpus.vocab_size), spec.output.out, device, run.run_id)
        forecast.echo()
    click.echo(backend_line(spec) + f", {threads} CPU thread{'s' * (threads != 1)}")
    if note := spec.budget_note():
        click.echo(f"budget: {note}")
    if unit is None:
        run.announce(f"  ({len(runs)} runs: {len(spec.routers.routers)} routers x {len(st.depths)} depths x "
                     f"{st.seeds} seed{'s' * (st.seeds != 1)})")
    else:
        run.announce(f"  ({unit.label()}: {len(runs)} runs, one per router)")
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
                      "depths": list(st.depths), "seeds": list(st.seed_list), "layout": layout,
                      "router_options": {str(d): spec.options_at(d) for d in st.depths},
                      "schedule": {str(d): s for d, s in scheds.items()}, "estimate": estimate,
                      "eval_every": st.eval_every, "max_steps": st.max_steps, "precision": st.precision,
                      "backend": st.backend, "compile_scope": st.compile_scope,
                      "full_max_steps": spec.full_steps(), "budget_note": spec.budget_note(),
                      "token_budget": st.max_steps * cfg.batch_size * cfg.seq_len, "threads": threads,
                      "unit": None if unit is None else {**unit.__dict__, "study_id": spec.output.run_id},
                      "metric": "loss_at_token_budget",
                      **({"plan": forecast.manifest(run.resumed)} if unit is None else {})})
        started = time.perf_counter()
        trainer = Trainer(run.writer, run.dir, run.device, spec.output.quiet, "study")
        for seed, depth, group in groups(spec, corpus, run.device, unit):
            trainer.label = f"study L{depth}"
            trainer.run_group(group, scheds[depth]["schedule"], st.eval_every)
        if left:
            click.echo(f"trained in {fmt_duration(time.perf_counter() - started)} (estimated "
                       f"{fmt_duration(estimate['total_s'])})")
        if spec.output.report and unit is None:
            from reports.study import write_study
            paths, text = write_study(run.dir)
            click.echo(text)
            click.echo("study report: " + ", ".join(str(paths[k]) for k in ("study.md", "study.html")
                                                    if k in paths))
            from .train import diagnose
            diagnose(run.dir, run.device)  # what each router learned, per depth
    run.finish(command_started)


def backend_line(spec) -> str:
    """``backend: cudagraph (...), precision bf16-mixed`` for the plan."""
    st = spec.study
    scope = f", scope {st.compile_scope}" if st.compile_scope else ""
    from harness.step.backends import of
    return f"backend: {st.backend}{scope} ({of(st.backend).plan}), precision {st.precision}"
