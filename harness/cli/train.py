"""``routerbench train``: time to a target validation loss, per router and seed; also the runner of
``routerbench run``'s one-seed smoke race."""

from __future__ import annotations

from pathlib import Path

import click

from ..spec import TrainSpec
from .common import Run, load_spec, spec_options
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
    from ..train import train_case_key
    return [(r, opts, seed, train_case_key(r, opts, tc, seed, corpus.sha256))
            for seed in seeds for r, opts in options_by_router.items()]


def train_runs(runs, corpus, tc, run: Run, quiet: bool, label: str = "train") -> None:
    """Train each planned run not yet complete in ``run``; each run is one unit of resume."""
    from ..train import run_training
    for r, opts, seed, key in runs:
        if key in run.writer.completed:
            click.echo(f"{label} {r} seed {seed}: already done, skipped")
            continue
        with run.writer.unit([key], kind="train") as u:
            try:
                res = run_training(r, opts, corpus, tc, seed, run.device, u, progress=not quiet)
            except Exception as exc:  # noqa: BLE001 - an allocation failure or OOM: a row, then go on
                import torch
                status = "oom" if isinstance(exc, torch.cuda.OutOfMemoryError) else "error"
                first = (str(exc).strip().splitlines() or [""])[0][:300]
                u.write(case_key=key, router=r, router_options=opts, seed=seed, mode="train",
                        metric="time_to_target", unit="s", status=status, error=f"{type(exc).__name__}: {first}")
                u.commit({key: status})
                click.echo(f"{label} {r} seed {seed}: {status}: {type(exc).__name__}: {first}", err=True)
                continue
            u.commit({key: res["status"]})
        ttt = f"{res['time_to_target']:.1f} s" if res["time_to_target"] is not None else res["status"]
        click.echo(f"{label} {r} seed {seed}: time to target {ttt}, final val loss {res['final_val_loss']:.4f}")


@click.command("train")
@spec_options(TrainSpec)
def train_cmd(config, **cli) -> None:
    """Time to a target validation loss, per router and seed.

    Defaults: --preset cpu-train, --routers prenorm,haares, one seed, the embedded corpus."""
    from ..train import TrainConfig

    spec, labels = load_spec(TrainSpec, cli, config)
    tr = spec.training
    tc = TrainConfig(spec.decoder_config(), target_loss=tr.target_loss, max_steps=tr.max_steps,
                     eval_every=tr.eval_every, lr=tr.lr, stop_at_target=tr.stop_at_target)
    corpus = load_corpus(tr.data, labels("training.data"))
    opts = {r: dict((spec.routers.router_options or {}).get(r, {})) for r in spec.routers.routers}
    runs = plan(opts, tc, range(tr.seeds), corpus)
    run = Run("train", spec)
    run.manifest({"corpus": corpus_info(corpus), "runs": len(runs)})
    run.announce()
    with run.guarded(lambda: [k for *_, k in runs]):
        train_runs(runs, corpus, tc, run, spec.output.quiet)
        if spec.output.report:
            write_report([run.dir])


COMMANDS = (train_cmd,)
