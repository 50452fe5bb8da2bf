"""``routerbench diagnose RUN_DIR``: what a trained router learned, from the last checkpoint of
each training run (:mod:`harness.training.diagnose` computes, :mod:`reports.diagnose` writes)."""

from __future__ import annotations

import click

from . import SHORT_HELP


@click.command("diagnose", short_help=SHORT_HELP["diagnose"])
@click.argument("run_dir")
@click.option("--out", default=None, metavar="DIR", help="Output dir (default: RUN_DIR/diagnose).")
@click.option("--batches", default=4, show_default=True, type=click.IntRange(min=1), metavar="N",
              help="Fixed validation batches per run (the run's batch size and sequence length).")
@click.option("--data", default=None, metavar="DIR",
              help="Corpus dir, when the one the run's manifest records is not on this machine.")
@click.option("--device", default="cpu", show_default=True, metavar="DEV", help="cpu or cuda[:N].")
def diagnose_cmd(run_dir, out, batches, data, device) -> None:
    """Depth-softmax weights per read and source, detail share and learned detail biases
    (haares, wav_v1), hidden-state RMS by depth: CSVs and figures, one line per file written.

    Each run's router is rebuilt with impl=naive (its weights visible), its last checkpoint
    loaded, and run in eval mode on fixed validation batches of its corpus."""
    from harness.spec.parts import resolve_device
    from reports.diagnose import write_diagnostics
    dev = resolve_device(device, "--device")
    for path in write_diagnostics(run_dir, out, batches, data, str(dev),
                                  note=lambda msg: click.echo(f"diagnose: {msg}", err=True)):
        click.echo(str(path))


COMMANDS = (diagnose_cmd,)
