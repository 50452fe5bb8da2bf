"""The papers' token corpora, imported from nanoGPT's files.

:func:`import_tokens` makes a corpus of token ids from an external tokenizer (nanoGPT's
``data/openwebtext/prepare.py``: GPT-2 BPE ids as raw little-endian uint16 in ``train.bin`` /
``val.bin``), once, for ``routerbench data prepare --tokens DIR --vocab-size V --out DIR``. It
opens as a :class:`workloads.data.TokenCorpus` through :meth:`workloads.data.CharCorpus.open` like
a char corpus (``vocab.json`` says ``"kind": "tokens"``), so training needs no change. text8's
normalisation is :mod:`workloads.text8`.

See docs/CORPORA.md for building each corpus from its public source.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np

from .data import FILES, TOKEN_DTYPE, CharCorpus, TokenCorpus, check_vocab_size

#: tokens read per chunk when scanning a token file at import (32 MB of uint16)
SCAN_CHUNK = 1 << 24


def _scan(path: Path, sink=None, chunk: int = SCAN_CHUNK) -> tuple[int, int, str]:
    """One chunked pass over the uint16 file at ``path``: (tokens, largest id, sha256 hex),
    writing the bytes to the open file ``sink`` too when given. Memory: one chunk."""
    h, top, n = hashlib.sha256(), -1, 0
    with open(path, "rb") as f:
        while True:
            ids = np.fromfile(f, dtype=TOKEN_DTYPE, count=chunk)
            if not ids.size:
                break
            h.update(ids)
            if sink is not None:
                sink.write(ids.tobytes())
            top, n = max(top, int(ids.max())), n + ids.size
    return n, top, h.hexdigest()


def _link(src: Path, dst: Path) -> str:
    """``dst`` made a hard link to ``src`` (else, across file systems, a symlink to its absolute
    path), replacing ``dst`` atomically. Returns "hardlink" or "symlink"."""
    tmp = dst.with_name(f".{dst.name}.link-{os.getpid()}")
    tmp.unlink(missing_ok=True)
    try:
        os.link(src, tmp)
        how = "hardlink"
    except OSError:
        os.symlink(src.resolve(), tmp)
        how = "symlink"
    os.replace(tmp, dst)
    return how


def import_tokens(tokens: str | Path, out_dir: str | Path, vocab_size: int, link: bool = False,
                  source: str | None = None, chunk: int = SCAN_CHUNK) -> TokenCorpus:
    """Import nanoGPT-format token files (``tokens/train.bin``, ``tokens/val.bin``: raw
    little-endian uint16 ids) as a corpus in ``out_dir``, once.

    Each file is read once, in chunks of ``chunk`` tokens (memory stays at one chunk for a 17 GB
    file): its sha256 is computed, every id is checked to be < ``vocab_size``, and, unless ``link``,
    the bytes are copied into ``out_dir``. With ``link`` the files are hard-linked into ``out_dir``
    (symlinked when that fails, e.g. across file systems): nothing is copied, and rewriting the
    source files later changes the corpus behind its metadata. When ``out_dir`` is ``tokens`` itself
    only ``vocab.json`` is written beside the files. ``vocab.json`` is written last (``kind``
    "tokens", ``vocab_size``, ``dtype`` "uint16", ``n_train``, ``n_val``, ``max_id``, the files'
    ``train_sha256`` / ``val_sha256``, ``sha256`` = sha256 of ``"<train_sha256> <val_sha256>"``,
    ``source`` (default "nanoGPT token files <dir name>"), ``imported_from``, ``storage``).

    Raises FileNotFoundError naming ``--tokens DIR`` (no such directory, a missing file),
    ValueError naming ``--tokens DIR`` (an empty file or one of odd size), ``--vocab-size`` (not in
    [1, 65536], or an id >= it: the message gives the largest id found) or ``--out DIR`` (a file).
    Nothing is written to ``out_dir`` when an error is raised.
    """
    src = Path(tokens)
    if not src.is_dir():
        raise FileNotFoundError(f"--tokens DIR: {'not a directory' if src.exists() else 'no such directory'} "
                                f"'{src}'")
    missing = [f for f in FILES[:2] if not (src / f).is_file()]
    if missing:
        raise FileNotFoundError(f"--tokens DIR: missing {', '.join(missing)} in '{src}' (nanoGPT's "
                                f"prepare.py writes train.bin and val.bin)")
    vocab_size = check_vocab_size(vocab_size)
    for f in FILES[:2]:
        size = (src / f).stat().st_size
        if size == 0 or size % TOKEN_DTYPE.itemsize:
            raise ValueError(f"--tokens DIR: '{src / f}' has {size} bytes, "
                             f"{'none' if size == 0 else 'not a whole number'} of uint16 token ids")
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out DIR: '{out}' exists and is not a directory")
    in_place = out.is_dir() and out.resolve() == src.resolve()
    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    storage = "in place" if in_place else "link" if link else "copy"
    scans, temps = {}, []
    try:
        for f in FILES[:2]:
            if storage == "copy":
                temps.append(out / f".{f}.import-{os.getpid()}")  # renamed over f once both are checked
                with open(temps[-1], "wb") as sink:
                    scans[f] = _scan(src / f, sink, chunk)
            else:
                scans[f] = _scan(src / f, None, chunk)
            n, top, _ = scans[f]
            if top >= vocab_size:
                raise ValueError(f"--vocab-size {vocab_size} is too small: {src / f} holds token id {top} (the "
                                 f"largest found); give --vocab-size {top + 1} or more (GPT-2 BPE: 50257)")
    except BaseException:
        for t in temps:
            t.unlink(missing_ok=True)
        if created and not any(out.iterdir()):
            out.rmdir()
        raise
    (out / "vocab.json").unlink(missing_ok=True)  # written last: its presence marks a whole corpus
    for f, tmp in zip(FILES[:2], temps):
        os.replace(tmp, out / f)
    if storage == "link":
        storage = "/".join(sorted({_link(src / f, out / f) for f in FILES[:2]}))
    (n_train, top_t, sha_t), (n_val, top_v, sha_v) = scans["train.bin"], scans["val.bin"]
    meta = {"kind": "tokens", "vocab_size": vocab_size, "dtype": "uint16", "n_train": n_train,
            "n_val": n_val, "max_id": max(top_t, top_v),
            "sha256": hashlib.sha256(f"{sha_t} {sha_v}".encode()).hexdigest(),
            "train_sha256": sha_t, "val_sha256": sha_v,
            "source": source or f"nanoGPT token files {src.resolve().name}",
            "imported_from": str(src.resolve()), "storage": storage}
    (out / "vocab.json").write_text(json.dumps(meta, indent=1), encoding="utf-8")
    return CharCorpus.load(out)
