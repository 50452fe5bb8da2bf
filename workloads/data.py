"""Corpora on disk (char-level, and token ids imported from nanoGPT's files), preparing a char
corpus from text, and the embedded stdlib corpus. Batches of a corpus: :mod:`workloads.batches`.

A corpus is a directory with ``train.bin`` and ``val.bin`` (raw token ids, uint8 when the vocabulary
has <= 256 symbols, else uint16) and ``vocab.json``. The last ``val_fraction`` of the text is the
validation split: contiguous, never shuffled, so it is text the model has not seen nearby.
A ``vocab.json`` with ``"kind": "tokens"`` is a corpus of an external tokenizer's ids imported
from nanoGPT's files (:class:`TokenCorpus`, made by :mod:`workloads.corpora`); :meth:`CharCorpus.load`
opens both kinds.
"""
from __future__ import annotations

import hashlib
import json
import math
import numbers
import os
import platform
import re
import shutil
import sysconfig
import tempfile
from pathlib import Path

import numpy as np
import torch

from routers.errors import ConfigError

from .text8 import NORMALIZERS, text8_normalize

PREPARE_HINT = "run `routerbench data prepare --text FILE --out DIR` to make one"
FILES = ("train.bin", "val.bin", "vocab.json")
#: characters encoded per chunk when writing a corpus (bounds the int64 ids held at once)
ENCODE_CHUNK = 1 << 24
# The stdlib corpus keeps printable ASCII + newline so its vocabulary stays under 100 symbols.
NOT_KEPT = re.compile(r"[^\x20-\x7e\n]")
REPLACEMENT = "?"
# encodings/ is excluded too: its codec tables are repetitive and would fill the validation tail.
STDLIB_EXCLUDE = frozenset({"site-packages", "test", "tests", "idlelib", "__pycache__", "encodings"})
STDLIB_SEPARATOR = "\n\n"


class CharCorpus:
    """A prepared char-level corpus, memory-mapped read-only.

    Attributes: ``path`` (Path), ``chars`` (tuple of str, sorted by code point; id i is chars[i]),
    ``vocab_size`` (int), ``dtype`` (np.uint8 or np.uint16), ``sha256`` (hex digest of the source
    text bytes; with ``--normalize text8``, of the normalised text), ``source`` (str), ``val_fraction`` (float), ``train`` / ``val`` (1-D np.memmap of
    token ids, dtype ``dtype``), ``kind`` ("chars"; "tokens" for a
    :class:`TokenCorpus`).
    """

    kind = "chars"

    def __init__(self, path: Path, meta: dict):
        self.path = Path(path)
        self.chars: tuple[str, ...] = tuple(meta["chars"])
        self.vocab_size = len(self.chars)
        self.dtype = np.dtype(meta["dtype"])
        self.sha256: str = meta["sha256"]
        self.source: str = meta["source"]
        self.val_fraction = float(meta["val_fraction"])
        self._codes = np.array([ord(c) for c in self.chars], dtype=np.uint32)
        self.train = _memmap(self.path / "train.bin", self.dtype, int(meta["n_train"]))
        self.val = _memmap(self.path / "val.bin", self.dtype, int(meta["n_val"]))

    @classmethod
    def load(cls, path: str | Path) -> "CharCorpus":
        """Open the corpus in directory ``path``: a :class:`CharCorpus`, or a
        :class:`TokenCorpus` when vocab.json says ``"kind": "tokens"``.

        Raises FileNotFoundError (naming ``--data DIR`` and the prepare command) when the directory or
        one of its files is missing, ValueError when vocab.json is unreadable or a .bin file's size
        disagrees with it.
        """
        path = Path(path)
        missing = [f for f in FILES if not (path / f).is_file()]
        if missing:
            what = "no such directory" if not path.is_dir() else f"missing {', '.join(missing)} in"
            raise FileNotFoundError(f"--data DIR: {what} '{path}'; {PREPARE_HINT}")
        try:
            meta = json.loads((path / "vocab.json").read_text(encoding="utf-8"))
            kind = meta.get("kind", "chars")
            if kind == "tokens":
                return TokenCorpus(path, meta)
            if kind != "chars":
                raise ValueError(f"unknown kind {kind!r} in vocab.json")
            return cls(path, meta)
        except (ValueError, KeyError, TypeError, AttributeError, IndexError, OSError) as e:
            what = f"missing key {e}" if isinstance(e, KeyError) else f"{type(e).__name__}: {e}"
            raise ValueError(f"--data DIR: corrupt corpus in '{path}' ({what}); {PREPARE_HINT}") from e

    @classmethod
    def open(cls, path: str | Path, label: str = "--data") -> "CharCorpus":
        """:meth:`load`, with every failure as one :class:`ConfigError` line naming ``label``.

        Raises:
            ConfigError: a missing directory or file, an unreadable or corrupt ``vocab.json``
                (truncated JSON, a missing key), a ``.bin`` file of the wrong size, a char corpus's
                token id outside its vocabulary (a token corpus's ids were checked at import: opening
                it reads no ids, only the file sizes).
        """
        try:
            corpus = cls.load(path)
        except (FileNotFoundError, ValueError) as e:
            raise ConfigError(str(e).replace("--data DIR", label, 1)) from None
        except OSError as e:
            raise ConfigError(f"{label}: cannot read '{path}' ({e.strerror or e}); {PREPARE_HINT}") from None
        if corpus.kind != "chars":
            return corpus  # a token corpus's ids were checked once, at import: gigabytes, not re-read
        for name, split in (("train.bin", corpus.train), ("val.bin", corpus.val)):
            top = int(split.max()) if len(split) else 0  # one pass over the file: a char corpus is small
            if top >= corpus.vocab_size:
                raise ConfigError(f"{label}: corrupt corpus in '{path}' ({name} holds token id {top}, "
                                  f"vocab.json has {corpus.vocab_size} symbols); {PREPARE_HINT}")
        return corpus

    def encode(self, text: str) -> np.ndarray:
        """Token ids of ``text``: 1-D array of ``self.dtype``, length len(text).

        Raises ValueError naming the first character not in the vocabulary.
        """
        codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
        ids = np.searchsorted(self._codes, codes)
        bad = (ids >= self.vocab_size) | (self._codes[np.minimum(ids, self.vocab_size - 1)] != codes)
        if bad.any():
            c = chr(codes[np.argmax(bad)])
            raise ValueError(f"character {c!r} is not in the corpus vocabulary ({self.path})")
        return ids.astype(self.dtype)

    def decode(self, ids) -> str:
        """Text of token ids ``ids`` (1-D sequence, np.ndarray or torch.Tensor of ints).

        Raises ValueError for an id outside [0, vocab_size).
        """
        ids = np.asarray(ids.cpu() if isinstance(ids, torch.Tensor) else ids, dtype=np.int64).ravel()
        if ids.size and (ids.min() < 0 or ids.max() >= self.vocab_size):
            raise ValueError(f"token ids must be in [0, {self.vocab_size}); got {ids.min()}..{ids.max()}")
        return self._codes[ids].tobytes().decode("utf-32-le")

    def __repr__(self) -> str:
        return (f"CharCorpus('{self.path}', vocab_size={self.vocab_size}, train={len(self.train)}, "
                f"val={len(self.val)}, sha256={self.sha256[:12]})")


def _memmap(path: Path, dtype: np.dtype, n: int) -> np.memmap:
    size = path.stat().st_size
    if size != n * dtype.itemsize:
        raise ValueError(f"{path.name} has {size} bytes, vocab.json says {n} tokens of {dtype}")
    return np.memmap(path, dtype=dtype, mode="r", shape=(n,))



#: token ids of a token corpus: nanoGPT writes np.uint16, little-endian on every machine it runs on
TOKEN_DTYPE = np.dtype("<u2")


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
        self.vocab_size = check_vocab_size(meta["vocab_size"], "vocab.json vocab_size")
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


def check_vocab_size(v, label: str = "--vocab-size") -> int:
    """``v`` as an int if it can be a token corpus's vocabulary (1..65536: ids are stored as uint16).

    Raises:
        ValueError: naming ``label``.
    """
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not 1 <= v <= 65536:
        raise ValueError(f"{label} must be an int in [1, 65536] (ids are stored as uint16), got {v!r}")
    return int(v)

def _check_val_fraction(val_fraction: float) -> float:
    if isinstance(val_fraction, bool) or not (isinstance(val_fraction, numbers.Real)
                                              and 0 < val_fraction <= 0.5):
        raise ValueError(f"--val-fraction must be in (0, 0.5], got {val_fraction!r}")
    return float(val_fraction)


def prepare_corpus(text: str | Path, out_dir: str | Path, val_fraction: float = 0.1,
                   source: str | None = None, normalize: str = "none") -> CharCorpus:
    """Make a corpus in ``out_dir`` from the utf-8 text file at path ``text``.

    ``normalize``: "none" keeps the text as it is; "text8" applies text8's rules first
    (:func:`workloads.text8.text8_normalize`: lowercase a-z words, digits spelled out, single
    spaces), any bytes accepted. The sha256 recorded is that of the file's bytes, or with "text8"
    that of the normalised text (vocab.json then also has ``normalize`` and ``source_sha256``, the
    file's); ``source`` defaults to the file name. Raises FileNotFoundError ("--text FILE: no such
    file ...") for a missing file, ValueError naming ``--text FILE`` for an empty or non-utf-8 file
    (with "none") or one too short to give one validation token, ValueError naming
    ``--val-fraction`` outside (0, 0.5], ``--normalize`` for an unknown rule, ``--out DIR`` when
    ``out_dir`` is an existing file.
    """
    path = Path(text)
    val_fraction = _check_val_fraction(val_fraction)
    if normalize not in NORMALIZERS:
        raise ValueError(f"--normalize must be one of {', '.join(NORMALIZERS)}, got {normalize!r}")
    if not path.is_file():
        what = ("is a directory, not a file" if path.is_dir() else
                "is not a regular file" if path.exists() else "no such file")
        raise FileNotFoundError(f"--text FILE: {what} '{path}'")
    raw = path.read_bytes()
    sha = hashlib.sha256(raw).hexdigest()
    if normalize == "text8":
        decoded = text8_normalize(raw)
        del raw
        return _write_corpus(decoded, hashlib.sha256(decoded.encode("ascii")).hexdigest(), out_dir,
                             val_fraction, source or f"text file {path.name}, text8-normalised",
                             label=f"--text FILE: '{path}' after --normalize text8",
                             extra={"normalize": "text8", "source_sha256": sha})
    try:
        decoded = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"--text FILE: '{path}' is not utf-8 text ({e})") from e
    del raw
    return _write_corpus(decoded, sha, out_dir, val_fraction,
                         source or f"text file {path.name}", label=f"--text FILE: '{path}'")


def prepare_corpus_from_text(text: str, out_dir: str | Path, val_fraction: float = 0.1,
                             source: str | None = None) -> CharCorpus:
    """Make a corpus in ``out_dir`` from the string ``text``; sha256 is of ``text.encode('utf-8')``.

    Same errors as :func:`prepare_corpus` (the text is labelled ``--text FILE: text``).
    """
    val_fraction = _check_val_fraction(val_fraction)
    return _write_corpus(text, hashlib.sha256(text.encode("utf-8")).hexdigest(), out_dir,
                         val_fraction, source or "text string", label="--text FILE: text")


def _write_corpus(text: str, sha256: str, out_dir: str | Path, val_fraction: float, source: str,
                  label: str, extra: dict | None = None) -> CharCorpus:
    if not text:
        raise ValueError(f"{label} is empty")
    n = len(text)
    # round() first so that e.g. 0.3 * 10 is 3, not 2.9999999999999996 floored to 2
    n_val = math.floor(round(n * val_fraction, 6))
    if n_val < 1:
        raise ValueError(f"{label} has {n} characters, too short to give one validation token with "
                         f"--val-fraction {val_fraction}; need at least {math.ceil(1 / val_fraction)}")
    chars = sorted(set(text))
    if len(chars) > 65536:
        raise ValueError(f"{label} has {len(chars)} distinct characters; uint16 ids allow 65536")
    dtype = np.dtype(np.uint8 if len(chars) <= 256 else np.uint16)
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out DIR: '{out}' exists and is not a directory")
    out.mkdir(parents=True, exist_ok=True)
    (out / "vocab.json").unlink(missing_ok=True)  # written last: its presence marks a whole corpus
    codes = np.array([ord(c) for c in chars], dtype=np.uint32)
    for name, lo, hi in (("train.bin", 0, n - n_val), ("val.bin", n - n_val, n)):
        with open(out / name, "wb") as f:  # in chunks: ids are int64 before the cast
            for i in range(lo, hi, ENCODE_CHUNK):
                part = np.frombuffer(text[i:min(i + ENCODE_CHUNK, hi)].encode("utf-32-le"), np.uint32)
                np.searchsorted(codes, part).astype(dtype).tofile(f)
    meta = {"chars": chars, "dtype": dtype.name, "n_train": n - n_val, "n_val": n_val,
            "sha256": sha256, "source": source, "val_fraction": val_fraction, **(extra or {})}
    (out / "vocab.json").write_text(json.dumps(meta, ensure_ascii=False, indent=1), encoding="utf-8")
    return CharCorpus.load(out)


def stdlib_files() -> list[Path]:
    """The standard library's ``.py`` files in sorted relative-path order.

    Excludes ``site-packages``, ``test``/``tests`` directories, ``idlelib`` and ``encodings``. Raises
    FileNotFoundError (suggesting ``--data DIR``) when the stdlib source directory is absent.
    """
    root = Path(sysconfig.get_paths()["stdlib"])
    if not root.is_dir():
        raise FileNotFoundError(f"no Python standard library source at '{root}' to build the default "
                                f"corpus; pass --data DIR ({PREPARE_HINT})")
    found = []
    for d, dirs, files in os.walk(root):
        dirs[:] = [x for x in dirs if x not in STDLIB_EXCLUDE]
        found += [Path(d, f).relative_to(root) for f in files if f.endswith(".py")]
    return [root / p for p in sorted(found, key=lambda p: p.as_posix())]


def stdlib_text(max_bytes: int = 4_000_000) -> str:
    """The default corpus text: stdlib sources joined by a blank line, cut at ``max_bytes`` chars.

    Decoded as utf-8 with errors replaced; every character outside printable ASCII + newline becomes
    ``"?"``, so characters equal bytes. Deterministic for a given standard library.
    Raises ValueError when ``max_bytes`` is not a positive int.
    """
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1:
        raise ValueError(f"max_bytes must be a positive int, got {max_bytes!r}")
    parts, total = [], 0
    for f in stdlib_files():
        text = NOT_KEPT.sub(REPLACEMENT, f.read_bytes().decode("utf-8", errors="replace"))
        parts.append(text + STDLIB_SEPARATOR)
        total += len(parts[-1])
        if total >= max_bytes:
            break
    return "".join(parts)[:max_bytes]


def default_corpus(cache_dir: str | Path, max_bytes: int = 4_000_000) -> CharCorpus:
    """The embedded corpus: real text from the stdlib's sources, built here, needing no download.

    Cached in ``cache_dir/stdlib-<python version>-<sha256[:12] of the text>/`` (built if absent or
    unreadable, reused otherwise). ``source`` is "python stdlib X.Y.Z source"; ``sha256`` is that of
    the text, recorded since the stdlib differs between Python versions. Same errors as
    :func:`stdlib_text`.
    """
    text = stdlib_text(max_bytes)
    sha = hashlib.sha256(text.encode("ascii")).hexdigest()
    version = platform.python_version()
    final = Path(cache_dir) / f"stdlib-{version}-{sha[:12]}"
    if final.is_dir():
        try:
            corpus = CharCorpus.load(final)
            if corpus.sha256 == sha:
                return corpus
        except (FileNotFoundError, ValueError):
            pass
        shutil.rmtree(final, ignore_errors=True)
    final.parent.mkdir(parents=True, exist_ok=True)
    # Build beside the final name, then rename: a reader never sees a half-written cache.
    tmp = Path(tempfile.mkdtemp(prefix=final.name + ".tmp-", dir=final.parent))
    try:
        prepare_corpus_from_text(text, tmp, source=f"python stdlib {version} source")
        os.rename(tmp, final)
    except OSError:
        if not (final / "vocab.json").is_file():  # not a concurrent builder's win: a real error
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return CharCorpus.load(final)
