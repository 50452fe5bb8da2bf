"""Tests for workloads/corpora.py and ``routerbench data prepare``: text8 normalisation, token corpora
imported from nanoGPT's uint16 files."""
import hashlib
import json
import os
import shutil
import subprocess

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from harness.cli import main
from routers.errors import ConfigError
from workloads.batches import fixed_val_batches, random_batches
from workloads.corpora import import_tokens
from workloads.data import CharCorpus, TokenCorpus, prepare_corpus
from workloads.text8 import text8_normalize

# uppercase, punctuation, digits, a tab, blank lines, runs of spaces, non-ASCII letters (É, ï, and
# the Kelvin sign, whose Unicode lowercase is an ASCII "k": text8 works on bytes, so it is a space)
SNIPPET = "  The 3rd-of-May, 1808!!\n\nCAFÉ\tnaïve  x2y \u212a\n"
SNIPPET_TEXT8 = "the three rd of may one eight zero eight caf na ve x two y"


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def one_line_error(res, *needles):
    assert res.exit_code == 2, (res.exit_code, res.output)
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("routerbench: error:"), res.output
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


# --- text8 -------------------------------------------------------------------------------------

def test_text8_rules_exact():
    assert text8_normalize("Hello, World 42!\nÄbc") == "hello world four two bc"
    assert text8_normalize(SNIPPET) == SNIPPET_TEXT8
    assert text8_normalize(SNIPPET.encode("utf-8")) == SNIPPET_TEXT8
    assert text8_normalize("0123456789") == "zero one two three four five six seven eight nine"
    assert text8_normalize("   \n\t!?") == "" and text8_normalize("") == ""
    assert text8_normalize(b"ab\xff\xfe\x00cd") == "ab cd"  # any bytes, not only UTF-8
    assert text8_normalize(SNIPPET_TEXT8) == SNIPPET_TEXT8  # idempotent


@pytest.mark.skipif(shutil.which("perl") is None, reason="no perl")
def test_text8_matches_wikifil_pl_character_rules():
    """The character part of wikifil.pl, run by Perl, gives the same text (less its leading space)."""
    script = ('undef $/; $_ = <STDIN>; $_=" $_ "; tr/A-Z/a-z/; s/0/ zero /g; s/1/ one /g; s/2/ two /g; '
              's/3/ three /g; s/4/ four /g; s/5/ five /g; s/6/ six /g; s/7/ seven /g; s/8/ eight /g; '
              's/9/ nine /g; tr/a-z/ /cs; chop; print $_;')
    rng = np.random.default_rng(0)
    samples = [SNIPPET.encode(), "Ünïcödé 2024 €😀 <b>&amp;</b>".encode()] + \
              [rng.integers(0, 256, int(n), dtype=np.uint8).tobytes() for n in rng.integers(0, 200, 20)]
    for raw in samples:
        perl = subprocess.run(["perl", "-e", script], input=raw, capture_output=True, check=True).stdout
        assert perl.decode("ascii").lstrip(" ") == text8_normalize(raw), raw


def test_prepare_normalize_text8_cli(tmp_path):
    f = tmp_path / "t.txt"
    f.write_bytes((SNIPPET * 4).encode("utf-8"))
    res = invoke("data", "prepare", "--text", f, "--out", tmp_path / "c", "--normalize", "text8",
                 "--val-fraction", "0.25")
    assert res.exit_code == 0, res.output
    c = CharCorpus.open(tmp_path / "c")
    expected = " ".join([SNIPPET_TEXT8] * 4)
    assert c.decode(np.concatenate([c.train, c.val])) == expected
    assert set(c.chars) <= set("abcdefghijklmnopqrstuvwxyz ") and len(c.val) == len(expected) // 4
    meta = json.loads((tmp_path / "c" / "vocab.json").read_text())
    assert meta["normalize"] == "text8" and meta["source_sha256"] == hashlib.sha256(f.read_bytes()).hexdigest()
    assert meta["sha256"] == hashlib.sha256(expected.encode()).hexdigest()  # of the text the corpus holds
    # the default keeps the text as it is
    assert invoke("data", "prepare", "--text", f, "--out", tmp_path / "raw").exit_code == 0
    raw = CharCorpus.open(tmp_path / "raw")
    assert raw.decode(np.concatenate([raw.train, raw.val])) == SNIPPET * 4 and "normalize" not in \
        json.loads((tmp_path / "raw" / "vocab.json").read_text())


def test_prepare_normalize_text8_errors(tmp_path):
    f = tmp_path / "p.txt"
    f.write_text("!!! ... ???\n" * 10)
    with pytest.raises(ValueError, match="after --normalize text8 is empty"):
        prepare_corpus(f, tmp_path / "o", normalize="text8")
    one_line_error(invoke("data", "prepare", "--text", f, "--out", tmp_path / "o", "--normalize", "text9"),
                   "--normalize")


# --- token corpora -----------------------------------------------------------------------------

def write_nanogpt(d, n_train=5000, n_val=700, vocab=50257, seed=0):
    """train.bin / val.bin as nanoGPT's prepare.py writes them: raw uint16 ids, no header."""
    d.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    train = rng.integers(0, vocab, n_train, dtype=np.int64).astype(np.uint16)
    val = rng.integers(0, vocab, n_val, dtype=np.int64).astype(np.uint16)
    train[17] = vocab - 1  # the largest id occurs
    for name, arr in (("train.bin", train), ("val.bin", val)):
        m = np.memmap(d / name, dtype=np.uint16, mode="w+", shape=(len(arr),))
        m[:] = arr
        m.flush()
        del m
    return train, val


def test_import_tokens_metadata_and_training_entry_point(tmp_path):
    train, val = write_nanogpt(tmp_path / "owt")
    res = invoke("data", "prepare", "--tokens", tmp_path / "owt", "--vocab-size", 50257, "--out", tmp_path / "c")
    assert res.exit_code == 0, res.output
    assert "token corpus, vocab 50257, train 5,000 / val 700 tokens (copy)" in res.output
    meta = json.loads((tmp_path / "c" / "vocab.json").read_text())
    sha_t = hashlib.sha256((tmp_path / "owt" / "train.bin").read_bytes()).hexdigest()
    sha_v = hashlib.sha256((tmp_path / "owt" / "val.bin").read_bytes()).hexdigest()
    assert meta == {"kind": "tokens", "vocab_size": 50257, "dtype": "uint16", "n_train": 5000, "n_val": 700,
                    "max_id": 50256, "sha256": hashlib.sha256(f"{sha_t} {sha_v}".encode()).hexdigest(),
                    "train_sha256": sha_t, "val_sha256": sha_v, "source": "nanoGPT token files owt",
                    "imported_from": str((tmp_path / "owt").resolve()), "storage": "copy"}
    assert (tmp_path / "c" / "train.bin").read_bytes() == (tmp_path / "owt" / "train.bin").read_bytes()
    assert os.stat(tmp_path / "c" / "train.bin").st_ino != os.stat(tmp_path / "owt" / "train.bin").st_ino
    assert sorted(p.name for p in (tmp_path / "c").iterdir()) == ["train.bin", "val.bin", "vocab.json"]

    # the entry point training uses (harness/cli/train.py load_corpus, harness/spec/*.py)
    c = CharCorpus.open(tmp_path / "c", "--data")
    assert isinstance(c, TokenCorpus) and isinstance(c, CharCorpus) and c.kind == "tokens"
    assert (c.vocab_size, c.chars, c.sha256, c.source) == (50257, (), meta["sha256"], "nanoGPT token files owt")
    assert c.dtype == np.uint16 and c.path == tmp_path / "c" and c.val_fraction == pytest.approx(700 / 5700)
    assert isinstance(c.train, np.memmap) and np.array_equal(c.train, train) and np.array_equal(c.val, val)
    x, y = random_batches(c.train, 4, 64, torch.Generator().manual_seed(0))
    assert x.shape == y.shape == (4, 64) and x.dtype == y.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1]) and int(x.max()) < 50257 and int(x.max()) > 255
    windows = np.lib.stride_tricks.sliding_window_view(train.astype(np.int64), 65)
    for row in torch.cat([x, y[:, -1:]], 1).numpy():  # each row is a run of the file's ids
        assert (windows == row).all(1).any()
    (vx, vy), = fixed_val_batches(c.val, 2, 32, 1)
    assert vx.dtype == torch.int64 and np.array_equal(vx[0].numpy(), val[:32].astype(np.int64))
    with pytest.raises(NotImplementedError, match="token corpus.*not characters"):
        c.decode([1, 2])
    with pytest.raises(NotImplementedError, match="token corpus"):
        c.encode("hi")


def test_open_trusts_metadata_but_checks_sizes(tmp_path):
    write_nanogpt(tmp_path / "owt", vocab=1000)
    import_tokens(tmp_path / "owt", tmp_path / "c", 1000)
    # opening does not re-scan the ids: an id put past the vocabulary afterwards goes unseen ...
    with open(tmp_path / "c" / "train.bin", "r+b") as f:
        f.write(np.array([60000], dtype="<u2").tobytes())
    assert CharCorpus.open(tmp_path / "c").train[0] == 60000
    # ... but a file whose size disagrees with vocab.json is refused, one line naming the option
    with open(tmp_path / "c" / "val.bin", "ab") as f:
        f.write(b"\0\0")
    with pytest.raises(ConfigError, match=r"^training.data: corrupt corpus .*val.bin has 1402 bytes, "
                                          r"vocab.json says 700 tokens of uint16"):
        CharCorpus.open(tmp_path / "c", "training.data")
    os.truncate(tmp_path / "c" / "val.bin", 1398)
    with pytest.raises(ConfigError, match="val.bin has 1398 bytes"):
        CharCorpus.open(tmp_path / "c")


def test_id_not_below_vocab_size_is_refused(tmp_path):
    write_nanogpt(tmp_path / "owt", vocab=50257)
    out = tmp_path / "c"
    line = one_line_error(invoke("data", "prepare", "--tokens", tmp_path / "owt", "--vocab-size", 50000,
                                 "--out", out), "--vocab-size 50000", "token id 50256 (the largest found)")
    assert "train.bin" in line
    assert not out.exists()  # nothing written
    # a small chunk: the largest id is found across chunk boundaries, in val.bin too
    with open(tmp_path / "owt" / "val.bin", "r+b") as f:
        f.seek(2 * 650)
        f.write(np.array([65535], dtype="<u2").tobytes())
    with pytest.raises(ValueError, match=r"--vocab-size 50257 is too small: .*val.bin holds token id 65535 .*--vocab-size 65536 or"):
        import_tokens(tmp_path / "owt", out, 50257, chunk=64)
    assert not out.exists()


def test_link_does_not_copy(tmp_path):
    write_nanogpt(tmp_path / "owt", vocab=300)
    res = invoke("data", "prepare", "--tokens", tmp_path / "owt", "--vocab-size", 300, "--out", tmp_path / "c",
                 "--link")
    assert res.exit_code == 0, res.output
    for f in ("train.bin", "val.bin"):
        a, b = os.stat(tmp_path / "owt" / f), os.stat(tmp_path / "c" / f)
        assert (a.st_ino, a.st_dev) == (b.st_ino, b.st_dev) and b.st_nlink == 2  # one file, two names
    assert json.loads((tmp_path / "c" / "vocab.json").read_text())["storage"] == "hardlink"
    assert CharCorpus.open(tmp_path / "c").vocab_size == 300


def test_symlink_when_hard_link_fails(tmp_path, monkeypatch):
    write_nanogpt(tmp_path / "owt", vocab=300)

    def no_link(*a, **k):
        raise OSError(18, "Invalid cross-device link")
    monkeypatch.setattr(os, "link", no_link)
    c = import_tokens(tmp_path / "owt", tmp_path / "c", 300, link=True)
    assert (tmp_path / "c" / "train.bin").is_symlink() and c.storage == "symlink"
    assert os.readlink(tmp_path / "c" / "val.bin") == str((tmp_path / "owt" / "val.bin").resolve())
    assert len(CharCorpus.open(tmp_path / "c").val) == 700


def test_import_in_place_writes_only_metadata(tmp_path):
    write_nanogpt(tmp_path / "owt", vocab=300)
    before = os.stat(tmp_path / "owt" / "train.bin").st_ino
    c = import_tokens(tmp_path / "owt", tmp_path / "owt", 300)
    assert c.storage == "in place" and os.stat(tmp_path / "owt" / "train.bin").st_ino == before
    assert sorted(p.name for p in (tmp_path / "owt").iterdir()) == ["train.bin", "val.bin", "vocab.json"]


@pytest.mark.parametrize("args,needles", [
    (["--text", "@f", "--tokens", "@owt"], ["--text FILE and --tokens DIR are mutually exclusive"]),
    ([], ["give --text FILE", "--tokens DIR"]),
    (["--tokens", "@owt", "--vocab-size", "300", "--normalize", "text8"], ["--normalize applies to --text"]),
    (["--tokens", "@owt", "--vocab-size", "300", "--normalize", "none"], ["--normalize applies to --text"]),
    (["--tokens", "@owt", "--vocab-size", "300", "--val-fraction", "0.1"], ["--val-fraction applies to --text"]),
    (["--tokens", "@owt"], ["--tokens DIR needs --vocab-size"]),
    (["--tokens", "@owt", "--vocab-size", "70000"], ["--vocab-size must be an int in [1, 65536]"]),
    (["--tokens", "@owt", "--vocab-size", "0"], ["--vocab-size must be an int in [1, 65536]"]),
    (["--tokens", "@missing", "--vocab-size", "300"], ["--tokens DIR: no such directory"]),
    (["--tokens", "@f", "--vocab-size", "300"], ["--tokens DIR: not a directory"]),
    (["--tokens", "@half", "--vocab-size", "300"], ["--tokens DIR: missing val.bin"]),
    (["--tokens", "@odd", "--vocab-size", "300"], ["--tokens DIR:", "has 7 bytes, not a whole number"]),
    (["--text", "@f", "--vocab-size", "300"], ["--vocab-size applies to --tokens"]),
    (["--text", "@f", "--link"], ["--link applies to --tokens"]),
])
def test_bad_combinations_are_one_line(tmp_path, args, needles):
    write_nanogpt(tmp_path / "owt", vocab=300)
    (tmp_path / "f.txt").write_text("abc" * 20)
    (tmp_path / "half").mkdir()
    (tmp_path / "half" / "train.bin").write_bytes(b"\0\0")
    shutil.copytree(tmp_path / "owt", tmp_path / "odd")
    (tmp_path / "odd" / "train.bin").write_bytes(b"\0" * 7)
    paths = {"@f": tmp_path / "f.txt", "@owt": tmp_path / "owt", "@missing": tmp_path / "nope",
             "@half": tmp_path / "half", "@odd": tmp_path / "odd"}
    one_line_error(invoke("data", "prepare", *[paths.get(a, a) for a in args], "--out", tmp_path / "c"), *needles)
    assert not (tmp_path / "c").exists()
