"""The papers' corpora: text8's normalisation, and token corpora imported from nanoGPT's files.

- :func:`text8_normalize`: the character rules by which Matt Mahoney's ``wikifil.pl`` made text8
  (``routerbench data prepare --text FILE --normalize text8``).
- :class:`TokenCorpus` and :func:`import_tokens`: a corpus of token ids made by an external
  tokenizer (nanoGPT's ``data/openwebtext/prepare.py``: GPT-2 BPE ids as raw little-endian uint16 in
  ``train.bin`` / ``val.bin``), imported once by ``routerbench data prepare --tokens DIR
  --vocab-size V --out DIR``. It loads through :meth:`workloads.data.CharCorpus.open` like a char
  corpus (``vocab.json`` says ``"kind": "tokens"``), so training needs no change.

See docs/CORPORA.md for building each corpus from its public source.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

import numpy as np

from workloads.data import FILES, CharCorpus, _memmap

NORMALIZERS = ("none", "text8")
DIGIT_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
# byte -> byte: A-Z lowercased, a-z kept, every other byte a space (wikifil.pl's tr/A-Z/a-z/ and
# tr/a-z/ /c, which act on bytes: a multi-byte UTF-8 character becomes spaces, never a letter)
_TEXT8_TABLE = bytes(c + 32 if 65 <= c <= 90 else c if 97 <= c <= 122 else 32 for c in range(256))
_SPACES = re.compile(rb"  +")

#: token ids of a token corpus: nanoGPT writes np.uint16, little-endian on every machine it runs on
TOKEN_DTYPE = np.dtype("<u2")
#: tokens read per chunk when scanning a token file at import (32 MB of uint16)
SCAN_CHUNK = 1 << 24


def text8_normalize(text: str | bytes) -> str:
    """``text`` normalised as text8 is: lowercase a-z words separated by single spaces.

    The rules are the character part of Matt Mahoney's ``wikifil.pl`` (the script that made
    text8 from enwik9), applied to the UTF-8 bytes of ``text`` as Perl applies them:

    1. ``A``-``Z`` are lowercased (ASCII only: "Ä" is not turned into a letter);
    2. each digit is spelled out between spaces: "0" -> " zero ", "1" -> " one ", ... "9" -> " nine ";
    3. every byte other than ``a``-``z`` becomes a space (so a non-ASCII character, whose UTF-8
       bytes are all >= 0x80, becomes a space; punctuation, tabs and newlines too);
    4. runs of spaces are squeezed to one.

    Unlike wikifil.pl's output (text8 itself begins with one space) there is no leading space, nor
    a trailing one. Returns a str of ``a``-``z`` and single spaces (empty when ``text`` holds no
    letter or digit). Idempotent.

    Not applied: the rest of wikifil.pl, which strips the XML and wiki markup of a Wikipedia dump
    (keeps only ``<text>`` elements, drops ``#REDIRECT`` pages, tags, ``<ref>``s, URLs,
    ``{{templates}}``, image and interlanguage links, decodes ``&amp;`` etc.). The input must
    already be plain text: run wikifil.pl on enwik8/enwik9 (its output is already normalised), or
    extract a dump's text with a tool such as WikiExtractor, then prepare with ``--normalize text8``.
    """
    data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
    for digit, word in enumerate(DIGIT_WORDS):
        data = data.replace(str(digit).encode(), f" {word} ".encode())
    return _SPACES.sub(b" ", data.translate(_TEXT8_TABLE)).strip(b" ").decode("ascii")


class TokenCorpus(CharCorpus):
    """A corpus of token ids from an external tokenizer, memory-mapped read-only.

    Same attributes as :class:`CharCorpus`, which training uses (``path``, ``vocab_size``,
    ``dtype``, ``sha256``, ``source``, ``val_fraction``, ``train``, ``val``), with ``chars`` empty
    and ``kind == "tokens"``; ``vocab_size`` is the one given at import (ids are < it), ``dtype``
    little-endian uint16, ``sha256`` the digest of the two files' digests (``train_sha256``,
    ``val_sha256``, computed once at import), ``storage`` how the files came ("copy", "hardlink",
"symlink", "in place"). :meth:`encode` and :meth:`decode` raise
    NotImplementedError: the corpus holds ids, not characters.

    Opening trusts ``vocab.json`` (it does not re-hash or re-scan gigabytes of ids), but checks
    that each file's size agrees with ``n_train`` / ``n_val``.
    """

    kind = "tokens"

    def __init__(self, path: Path, meta: dict):
        self.path = Path(path)
        if meta["kind"] != self.kind:
            raise ValueError(f"vocab.json has kind {meta['kind']!r}, not {self.kind!r}")
        self.chars = ()
        self._codes = np.zeros(0, dtype=np.uint32)
        self.vocab_size = _check_vocab_size(meta["vocab_size"], "vocab.json vocab_size")
        if np.dtype(meta["dtype"]) != np.dtype(np.uint16):
            raise ValueError(f"vocab.json dtype is {meta['dtype']!r}; a token corpus holds uint16 ids")
        self.dtype = TOKEN_DTYPE
        if int(meta.get("max_id", -1)) >= self.vocab_size:
            raise ValueError(f"vocab.json max_id {meta['max_id']} is not below vocab_size {self.vocab_size}")
        self.sha256: str = meta["sha256"]
        self.source: str = meta["source"]
        self.train_sha256: str = meta["train_sha256"]
        self.val_sha256: str = meta["val_sha256"]
        self.storage: str = meta.get("storage", "copy")
        n_train, n_val = int(meta["n_train"]), int(meta["n_val"])
        self.val_fraction = n_val / (n_train + n_val)
        self.train = _memmap(self.path / "train.bin", self.dtype, n_train)
        self.val = _memmap(self.path / "val.bin", self.dtype, n_val)

    def _no_text(self, what: str):
        raise NotImplementedError(
            f"cannot {what} with a token corpus ('{self.path}', {self.source}): it holds ids of an "
            f"external tokenizer (vocab {self.vocab_size}), not characters; use that tokenizer")

    def encode(self, text: str) -> np.ndarray:
        """Raises NotImplementedError: a token corpus has no characters."""
        self._no_text("encode text")

    def decode(self, ids) -> str:
        """Raises NotImplementedError: a token corpus has no characters."""
        self._no_text("decode ids")

    def __repr__(self) -> str:
        return (f"TokenCorpus('{self.path}', vocab_size={self.vocab_size}, train={len(self.train)}, "
                f"val={len(self.val)}, sha256={self.sha256[:12]})")


def _check_vocab_size(v, label: str = "--vocab-size") -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not 1 <= v <= 65536:
        raise ValueError(f"{label} must be an int in [1, 65536] (ids are stored as uint16), got {v!r}")
    return int(v)


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
    vocab_size = _check_vocab_size(vocab_size)
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
