"""``routerbench data prepare``: a char-level corpus from a text file."""

from __future__ import annotations

import click

from routers.errors import ConfigError


@click.group("data")
def data_group() -> None:
    """Corpora for training."""


@data_group.command("prepare")
@click.option("--text", required=True, help="A UTF-8 text file.")
@click.option("--out", required=True, help="Output directory of the corpus.")
@click.option("--val-fraction", default="0.1", show_default=True, help="Tail of the text kept for validation.")
def data_prepare(text, out, val_fraction) -> None:
    """Make a char-level corpus (train.bin, val.bin, vocab.json) from a text file."""
    from workloads.data import prepare_corpus
    try:
        vf = float(val_fraction)
    except ValueError:
        raise ConfigError(f"--val-fraction takes a number in (0, 0.5], got {val_fraction!r}") from None
    try:
        corpus = prepare_corpus(text, out, val_fraction=vf)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    except FileNotFoundError as exc:
        if str(exc).startswith("--text"):
            raise ConfigError(str(exc)) from None
        raise ConfigError(f"--out DIR: cannot write '{out}' ({exc.strerror or exc})") from None
    except OSError as exc:
        raise ConfigError(f"--out DIR: cannot write '{out}' ({exc.strerror or exc})") from None
    click.echo(f"{out}: vocab {corpus.vocab_size}, train {len(corpus.train):,} / val {len(corpus.val):,} "
               f"tokens, sha256 {corpus.sha256[:16]}…")


COMMANDS = (data_group,)
