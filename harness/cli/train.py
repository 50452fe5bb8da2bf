"""``routerbench train``: time to a target validation loss, per router and seed; also the runner of
``routerbench run``'s one-seed smoke race.

Under ``torchrun --nproc_per_node=N $(which routerbench) train …`` the command trains every run with
DistributedDataParallel over N processes (:mod:`harness.training.distributed`): the options are checked
against ``WORLD_SIZE`` before any model is built, rank 0 alone writes and prints, and every rank
follows rank 0's decisions.
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

import click

from routers.errors import ConfigError

from . import SHORT_HELP
from ..spec import TrainSpec
from .common import Run, load_spec, spec_options
from .forecast import calibrate, corpus_vocab, dry_run_option, plan_train
from .report import write_report


def load_corpus(data: str | None, label: str = "--data"):
    """The corpus at ``data`` (one-line errors naming ``label``), else the embedded stdlib corpus."""
    from workloads.data import CharCorpus, default_corpus
    if data:
        return CharCorpus.open(data, label)
    return default_corpus(Path.home() / ".cache" / "routerbench")


def corpus_info(corpus) -> dict:
    return {"source": corpus.source, "sha256": corpus.sha256, "vocab_size": corpus.vocab_size,
            "n_train": len(corpus.train), "n_val": len(corpus.val), "path": str(corpus.path)}


def plan(options_by_router: dict[str, dict], tc, seeds, corpus) -> list[tuple[str, dict, int, str]]:
    """``(router, options, seed, case key)`` of each training run, seeds outermost."""
    from harness.training.config import train_case_key
    return [(r, opts, seed, train_case_key(r, opts, tc, seed, corpus))
            for seed in seeds for r, opts in options_by_router.items()]


def race_threads(load: dict | None, device_type: str, threads: int) -> int | None:
    """The intra-op threads a smoke race should train on when the machine was busy at the start
    (``load``: :func:`harness.timing.noise.machine_load` read then, before this command's own
    work): the CPUs other work did not hold, max(1, CPUs − round(others)) (the load average
    where ``others`` could not be read); None to keep ``threads`` (a quiet machine, a GPU, or no
    fewer threads to give).

    Threads that step in lockstep stall at every parallel region when another process holds one
    of their cores: measured here, a d=64 decoder's training step under two busy loops on 2 CPUs
    took 87 ms on 2 threads and 35–41 ms on 1 (18 and 23 ms quiet). Both sides of a race train on
    the same threads, so the pairing holds."""
    held = load.get("others") if load and load.get("others") is not None else (load or {}).get("load_avg")
    if device_type != "cpu" or not load or not load.get("busy") or held is None:
        return None
    free = max(1, int(load["cpus"]) - round(held))
    return free if free < threads else None


def train_runs(runs, corpus, tc, run: Run, quiet: bool, label: str = "train",
               load: dict | None = None) -> None:
    """Train the planned runs (the smoke race of ``routerbench run``) interleaved, in turns of 10
    steps, when they fit in memory together (:func:`harness.training.schedule.choose_schedule`),
    else one after the other; each evaluation is committed and checkpointed, so an interrupted race
    resumes mid-run. On a CPU that was busy at the start (``load``) they train on the threads
    :func:`race_threads` gives, said in one line and kept in the manifest (``race_threads``)."""
    import torch

    from harness.training.run import TrainRun
    from harness.training.schedule import Trainer, choose_schedule
    trainer = Trainer(run.writer, run.dir, run.device, quiet, label)
    group = [TrainRun(r, opts, corpus, tc, seed, run.device) for r, opts, seed, _ in runs]
    before = torch.get_num_threads()
    fewer = race_threads(load, run.device.type, before)
    if fewer is not None:
        click.echo(f"{label}: the machine was busy at the start ({'; '.join(load['busy'])}): training on "
                   f"{fewer} thread{'s' * (fewer != 1)}, not {before}, so that the cores other work holds do "
                   "not stall every step", err=True)
        run.note_session(race_threads={"threads": fewer, "instead_of": before, "load": load})
        torch.set_num_threads(fewer)
    try:
        # in turns of 10 steps where memory allows, so both sides of the race meet the same load
        trainer.run_group(group, schedule=choose_schedule("auto", group, run.device)["schedule"])
    finally:
        torch.set_num_threads(before)


def pilot_target(trainer, pilot, run: Run) -> float:
    """The target loss the pilot run sets: read back from the records when its unit is complete,
    else trained now.

    Raises:
        click.ClickException: the pilot failed or diverged (exit 1; give --target-loss instead).
    """
    from harness.rundir.records import load_rows
    from harness.training import distributed
    if not trainer.done(pilot):
        trainer.run_group([pilot])
    answer = None
    if distributed.is_main():  # read from rank 0's records, sent to every rank
        rows = [r for r in load_rows([run.dir]) if r["case_key"] == pilot.key]
        target = [r["value"] for r in rows if r["metric"] == "target_loss" and r["status"] == "ok"]
        if not target or target[-1] is None:
            why = next((r["error"] for r in rows if r.get("error")), "no target row")
            answer = f"the {pilot.router} pilot set no target ({why}); give --target-loss"
        else:
            answer = float(target[-1])
    answer = distributed.broadcast_object(answer)
    if isinstance(answer, str):
        raise click.ClickException(answer)
    return answer


@click.command("train", short_help=SHORT_HELP["train"])
@spec_options(TrainSpec)
@dry_run_option
def train_cmd(config, dry_run, **cli) -> None:
    """Time to a target validation loss: routers x seeds, paired by seed.

    Defaults: --preset cpu-train, --routers prenorm,block_attnres,haares, 3 seeds, a target set by a prenorm
    pilot at half the step budget, the embedded corpus.

    Under torchrun (torchrun --nproc_per_node=N $(which routerbench) train ...): DistributedDataParallel
    over N processes, --batch-size the global batch. The plan (runs, steps, estimated time and peak
    memory) is printed before any model is built; --dry-run prints it and exits."""
    from harness.training import distributed

    try:
        _train(config, cli, dry_run)
    except (ConfigError, click.ClickException):
        distributed.shutdown()  # every rank raised it (the checks see the same values everywhere)
        if distributed.env_rank() == 0:
            raise
        # rank 0 alone says so (one line); every rank exits 2. torchrun ends the other workers as
        # soon as one exits, so a rank that got here first waits for rank 0 to print its line
        # (torchrun stops it then; on its own it exits 2 after RANK_EXIT_WAIT_S)
        time.sleep(RANK_EXIT_WAIT_S)
        sys.exit(2)
    distributed.shutdown()


#: Seconds a rank other than 0 waits before exiting 2 on a bad option, so that rank 0's one line
#: comes out before torchrun stops the workers.
RANK_EXIT_WAIT_S = 10.0


def _train(config, cli, dry_run: bool = False) -> None:
    from dataclasses import replace

    import torch

    from harness.training import distributed
    from harness.training.config import PILOT_SEED, TIME_TO_TARGET_METHOD, train_unavailable_reason
    from harness.training.run import TrainRun
    from harness.training.schedule import Trainer, choose_schedule
    from routers import BASELINE

    started = time.perf_counter()
    spec, labels = load_spec(TrainSpec, cli, config)  # checks the batch against torchrun's WORLD_SIZE
    tr = spec.training
    tc = spec.train_config()
    if dry_run:  # no process group, no corpus built, no model, no run directory
        if distributed.env_rank() == 0:
            _forecast(spec, tc, torch.device(spec.output.device),
                      corpus_vocab(tr.data, labels("training.data"))).echo()
            click.echo("dry run: no model built, no run directory created")
        return
    device = distributed.init(torch.device(spec.output.device))  # cuda:LOCAL_RANK under torchrun
    main = distributed.is_main()
    echo = click.echo if main else (lambda *a, **k: None)
    corpus = load_corpus(tr.data, labels("training.data"))
    uniform = math.log(corpus.vocab_size)
    if tr.target_loss is not None and tr.target_loss >= uniform:
        raise ConfigError(f"{labels('training.target_loss')} {tr.target_loss:g} is not below ln(vocab) = "
                          f"{uniform:.3f} nats, the loss of an untrained model on this corpus (vocab "
                          f"{corpus.vocab_size}): every run would be at the target from step 0; lower it")
    opts = {r: dict((spec.routers.router_options or {}).get(r, {})) for r in spec.routers.routers}
    seeds = list(range(tr.seeds))
    runs = plan(opts, tc, seeds, corpus)
    pilot = None
    if tr.target_from_pilot:
        popts = dict((spec.routers.router_options or {}).get(tr.target_from_pilot, {}))
        pilot = TrainRun(tr.target_from_pilot, popts, corpus, tc, PILOT_SEED, device, mode="pilot",
                         stop_step=tc.pilot_stop(tr.pilot_fraction))
    sched = choose_schedule(tr.schedule, [TrainRun(r, o, corpus, tc, seeds[0], device) for r, o in opts.items()],
                            device)  # rank 0's decision under torchrun
    ddp = distributed.describe(device)
    ddp_info = {"world_size": ddp["world_size"], "ddp_backend": ddp["backend"]}
    ddp_note = (f", DDP over {ddp['world_size']} processes ({ddp['backend']}), global batch "
                f"{tc.cfg.batch_size}" if ddp["world_size"] > 1 else "")
    one = max(sched["estimate_bytes"].values())
    if device.type == "cpu" and one > sched["available_bytes"]:
        raise ConfigError(f"one training run needs an estimated {one / 2**30:.1f} GiB, more than the "
                          f"{sched['available_bytes'] / 2**30:.1f} GiB free here; lower "
                          f"{labels('shape.batch_size')} or raise {labels('training.grad_accum')}, or pick a "
                          f"smaller {labels('shape.preset')}")
    run = _open_run(spec)  # a locked or mismatched run directory fails here, in one line
    forecast = _forecast(spec, tc, device, corpus.vocab_size, exclude=run.run_id)
    if main:
        forecast.echo()
    target = ({"source": "given", "value": tr.target_loss} if pilot is None else
              {"source": "pilot", "router": pilot.router, "seed": PILOT_SEED, "fraction": tr.pilot_fraction,
               "step": pilot.stop_step})
    n_runs = len(runs) + (1 if pilot else 0)
    run.manifest({"corpus": corpus_info(corpus), "runs": n_runs, "seeds": seeds, "target": target,
                  "schedule": sched, "chunk": tr.chunk, "backend": tc.backend, "precision": tc.precision,
                  "grad_accum": tc.grad_accum, "eval_every": tc.eval_every,
                  "time_to_target": TIME_TO_TARGET_METHOD, "plan": forecast.manifest(run.resumed),
                  **ddp_info})
    if main:
        run.announce(f"  ({len(runs)} run{'s' * (len(runs) != 1)}{' and a pilot' if pilot else ''}, "
                     f"{len(seeds)} seed{'s' * (len(seeds) != 1)}, schedule {sched['schedule']}"
                     f"{ddp_note})")
    echo(f"schedule: {sched['schedule']} ({sched['reason']})")
    n_evals = tc.max_steps // tc.eval_every
    if tc.eval_every < FREQUENT_EVAL:  # each evaluation is also a checkpoint: say what it costs
        ckpt = 12 * _n_params(tc.cfg)  # float32 weights + AdamW's two moments
        echo(f"note: evaluating and checkpointing every {tc.eval_every} step{'s' * (tc.eval_every != 1)}: "
             f"{n_evals} evaluations and checkpoints (~{ckpt / 2**20:.1f} MiB each) per run; "
             f"{labels('training.eval_every')} N evaluates less often")
    if BASELINE not in opts:
        echo(f"note: {BASELINE} is not among the routers, so the report will compare no router "
             "with a baseline", err=True)
    keys = [k for *_, k in runs] + ([pilot.key] if pilot else [])
    trainer = Trainer(run.writer, run.dir, device, spec.output.quiet)
    with run.guarded(lambda: keys):
        why = train_unavailable_reason(tc.backend, device)
        if why:  # every run a skipped row, and a report that says so
            for r in ([pilot] if pilot else []) + [TrainRun(r, o, corpus, tc, s, device)
                                                   for s in seeds for r, o in opts.items()]:
                if not trainer.done(r):
                    trainer.fail(r, status="skipped", message=why)
        else:
            if pilot is not None:
                trainer.label = "pilot"
                tc = replace(tc, target_loss=pilot_target(trainer, pilot, run))
                trainer.label = "train"
                echo(f"target: {tc.target_loss:.4f} nats (the {pilot.router} pilot's val loss at step "
                     f"{pilot.stop_step} of {tc.max_steps})")
            for seed in seeds:
                group = [TrainRun(r, o, corpus, tc, seed, device) for r, o in opts.items()]
                trainer.run_group(group, sched["schedule"], tr.chunk or tr.eval_every)
        distributed.barrier(device)  # rank 0's last commit is on disk before the report
        if spec.output.report and main:
            write_report([run.dir])
            diagnose(run.dir, device)
    run.finish(started)


def _forecast(spec, tc, device, vocab: int, exclude: str | None = None):
    """The plan of a train spec (:func:`harness.cli.forecast.plan_train`), calibrated."""
    from harness.training import distributed
    tr = spec.training
    opts = {r: dict((spec.routers.router_options or {}).get(r, {})) for r in spec.routers.routers}
    pilot = None
    if tr.target_from_pilot:
        pilot = (tr.target_from_pilot, dict((spec.routers.router_options or {}).get(tr.target_from_pilot, {})),
                 tc.pilot_stop(tr.pilot_fraction))
    plan_ = plan_train(spec, tc, opts, list(range(tr.seeds)), device, vocab, pilot,
                       distributed.env_world_size())
    return calibrate(plan_, spec.output.out, device, exclude)


def diagnose(run_dir, device) -> None:
    """Write what each finished router learned (``routerbench diagnose``) beside the report; a
    run dir with nothing to diagnose (every run skipped or diverged) says so and goes on."""
    from reports.diagnose import write_diagnostics
    try:
        paths = write_diagnostics(run_dir, device=str(device), note=lambda m: click.echo(f"diagnose: {m}", err=True))
    except ConfigError as exc:
        click.echo(f"diagnose: nothing written ({exc})", err=True)
        return
    click.echo(f"diagnose: {len(paths)} files in {Path(run_dir) / 'diagnose'}")


def _open_run(spec) -> Run:
    """The run directory, opened by every rank (rank 0 locks and writes; the others hold a null
    writer); an error opening it on rank 0 (a locked directory, a resumed run with other options)
    reaches every rank, so all of them exit 2 and none waits alone."""
    from harness.training import distributed
    err, run = None, None
    try:
        run = Run("train", spec)
    except ConfigError as exc:
        err = str(exc)
    if distributed.world_size() > 1:
        err = distributed.broadcast_object(err)
    if err is not None:
        if run is not None:
            run.writer.close()
        raise ConfigError(err)
    return run


#: Below this cadence (steps) ``train`` says what evaluating (and checkpointing) so often costs.
FREQUENT_EVAL = 5


def _n_params(cfg) -> int:
    """Parameters of a prenorm decoder of shape ``cfg`` (built on the meta device: no memory);
    the routers add under 0.1 %."""
    import torch

    from workloads.decoder import Decoder
    with torch.device("meta"):
        return sum(p.numel() for p in Decoder(cfg, "prenorm").parameters())


COMMANDS = (train_cmd,)
