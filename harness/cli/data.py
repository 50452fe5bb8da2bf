"""``routerbench data prepare``: a char-level corpus from a text file, or a token corpus imported
from nanoGPT's ``train.bin`` / ``val.bin`` (docs/CORPORA.md)."""

from __future__ import annotations

import click

from routers.errors import ConfigError

from . import SHORT_HELP


@click.group("data", short_help=SHORT_HELP["data"])
def data_group() -> None:
    """Corpora for training."""


@data_group.command("prepare")
@click.option("--text", default=None, metavar="FILE", help="A UTF-8 text file: make a char-level corpus.")
@click.option("--tokens", default=None, metavar="DIR",
              help="A directory with nanoGPT's train.bin and val.bin (little-endian uint16 token ids): "
                   "import them as a token corpus.")
@click.option("--out", required=True, metavar="DIR", help="Output directory of the corpus.")
@click.option("--val-fraction", default=None, help="Tail of the text kept for validation (--text; default 0.1).")
@click.option("--normalize", type=click.Choice(["none", "text8"]), default=None,
              help="--text only: 'text8' applies text8's rules first (lowercase a-z, digits spelled out, "
                   "every other character a space, spaces squeezed); default 'none'.")
@click.option("--vocab-size", type=int, default=None,
              help="--tokens only: the tokenizer's vocabulary (GPT-2 BPE: 50257); every id must be below it.")
@click.option("--link", is_flag=True, default=False,
              help="--tokens only: hard-link (else symlink) the .bin files into --out instead of copying them.")
def data_prepare(text, tokens, out, val_fraction, normalize, vocab_size, link) -> None:
    """Make a char-level corpus (train.bin, val.bin, vocab.json) from a text file, or import
    nanoGPT token files as a token corpus."""
    if text is not None and tokens is not None:
        raise ConfigError("--text FILE and --tokens DIR are mutually exclusive: give --text for a char-level "
                          "corpus or --tokens for nanoGPT token files")
    if text is None and tokens is None:
        raise ConfigError("give --text FILE (a char-level corpus) or --tokens DIR (nanoGPT token files)")
    if tokens is not None:
        _import_tokens(tokens, out, val_fraction, normalize, vocab_size, link)
    else:
        _prepare_text(text, out, val_fraction, normalize, vocab_size, link)


def _prepare_text(text, out, val_fraction, normalize, vocab_size, link) -> None:
    from workloads.data import prepare_corpus
    for option, given in (("--vocab-size", vocab_size is not None), ("--link", link)):
        if given:
            raise ConfigError(f"{option} applies to --tokens DIR, not --text FILE (a char-level corpus's "
                              f"vocabulary is its characters)")
    try:
        vf = float(val_fraction if val_fraction is not None else "0.1")
    except ValueError:
        raise ConfigError(f"--val-fraction takes a number in (0, 0.5], got {val_fraction!r}") from None
    try:
        corpus = prepare_corpus(text, out, val_fraction=vf, normalize=normalize or "none")
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


def _import_tokens(tokens, out, val_fraction, normalize, vocab_size, link) -> None:
    from workloads.corpora import import_tokens
    if normalize is not None:
        raise ConfigError("--normalize applies to --text FILE, not --tokens DIR (token ids are already "
                          "tokenized text)")
    if val_fraction is not None:
        raise ConfigError("--val-fraction applies to --text FILE; with --tokens DIR the split is "
                          "train.bin / val.bin as given")
    if vocab_size is None:
        raise ConfigError("--tokens DIR needs --vocab-size, the tokenizer's vocabulary (GPT-2 BPE: 50257)")
    try:
        corpus = import_tokens(tokens, out, vocab_size, link=link)
    except (ValueError, FileNotFoundError) as exc:
        if str(exc).startswith("--"):
            raise ConfigError(str(exc)) from None
        raise ConfigError(f"--out DIR: cannot write '{out}' ({getattr(exc, 'strerror', None) or exc})") from None
    except OSError as exc:
        where = f"--tokens DIR: cannot read '{tokens}'" if exc.filename and str(tokens) in str(exc.filename) \
            else f"--out DIR: cannot write '{out}'"
        raise ConfigError(f"{where} ({exc.strerror or exc})") from None
    click.echo(f"{out}: token corpus, vocab {corpus.vocab_size}, train {len(corpus.train):,} / val "
               f"{len(corpus.val):,} tokens ({corpus.storage}), sha256 {corpus.sha256[:16]}…")


COMMANDS = (data_group,)
