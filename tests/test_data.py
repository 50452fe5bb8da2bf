"""Tests for workloads/data.py: corpus format, splits, stdlib corpus, batches, errors."""
import hashlib
import json
import os
import platform

import numpy as np
import pytest
import torch

# the repo is checked out next to shared/, which holds the test data
from paths import SHAKESPEARE

from workloads.batches import fixed_val_batches, random_batches, synthetic_batch
from workloads.data import CharCorpus, default_corpus, prepare_corpus, prepare_corpus_from_text, stdlib_text

SHAKESPEARE_SHA = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"
TEXT = ("abcdefghij" * 100)  # 1000 chars, 10 symbols


@pytest.fixture
def corpus(tmp_path):
    return prepare_corpus_from_text(TEXT, tmp_path / "c")


def test_split_sizes_and_format(corpus, tmp_path):
    assert (len(corpus.train), len(corpus.val)) == (900, 100)
    assert corpus.vocab_size == 10 and corpus.chars == tuple("abcdefghij")
    assert corpus.train.dtype == np.uint8 and isinstance(corpus.val, np.memmap)
    meta = json.loads((tmp_path / "c" / "vocab.json").read_text())
    assert meta["dtype"] == "uint8" and (meta["n_train"], meta["n_val"]) == (900, 100)
    assert meta["sha256"] == hashlib.sha256(TEXT.encode()).hexdigest()
    assert meta["val_fraction"] == 0.1
    assert os.path.getsize(tmp_path / "c" / "train.bin") == 900
    # the validation split is the contiguous tail of the text
    assert corpus.decode(corpus.val) == TEXT[900:]
    assert corpus.decode(corpus.train) == TEXT[:900]


@pytest.mark.parametrize("n,f,n_val", [(10, 0.3, 3), (1000, 0.5, 500), (7, 0.25, 1), (999, 0.1, 99)])
def test_split_rounding(tmp_path, n, f, n_val):
    c = prepare_corpus_from_text("x" * n, tmp_path, val_fraction=f)
    assert (len(c.train), len(c.val)) == (n - n_val, n_val)


def test_round_trip_and_reload(corpus, tmp_path):
    ids = corpus.encode("jihgfa")
    assert ids.dtype == np.uint8 and ids.tolist() == [9, 8, 7, 6, 5, 0]
    assert corpus.decode(ids) == "jihgfa"
    assert corpus.decode(torch.tensor([0, 1, 2])) == "abc"
    again = CharCorpus.load(tmp_path / "c")
    assert again.sha256 == corpus.sha256 and np.array_equal(again.train, corpus.train)
    with pytest.raises(ValueError, match="'z' is not in the corpus vocabulary"):
        corpus.encode("abz")
    with pytest.raises(ValueError, match=r"\[0, 10\)"):
        corpus.decode([10])


def test_uint16_vocabulary(tmp_path):
    text = "".join(chr(0x4E00 + i) for i in range(300)) * 2  # 300 CJK symbols > 256
    c = prepare_corpus_from_text(text, tmp_path)
    assert c.vocab_size == 300 and c.train.dtype == np.uint16 and c.val.dtype == np.uint16
    assert json.loads((tmp_path / "vocab.json").read_text())["dtype"] == "uint16"
    assert c.decode(c.encode(text)) == text
    assert os.path.getsize(tmp_path / "val.bin") == 2 * 60


def test_prepare_from_file_hashes_bytes(tmp_path):
    f = tmp_path / "t.txt"
    f.write_text("héllo wörld\n" * 20, encoding="utf-8")
    c = prepare_corpus(f, tmp_path / "out", val_fraction=0.2)
    assert c.sha256 == hashlib.sha256(f.read_bytes()).hexdigest()
    assert c.source == "text file t.txt" and len(c.val) == 48
    assert "é" in c.chars and c.decode(np.concatenate([c.train, c.val])) == f.read_text("utf-8")


def test_prepare_errors_name_the_option(tmp_path):
    with pytest.raises(FileNotFoundError, match="--text FILE: no such file 'x.txt'"):
        prepare_corpus("x.txt", tmp_path)
    with pytest.raises(ValueError, match=r"--val-fraction must be in \(0, 0.5\]"):
        prepare_corpus_from_text(TEXT, tmp_path, val_fraction=0.6)
    with pytest.raises(ValueError, match="--val-fraction"):
        prepare_corpus_from_text(TEXT, tmp_path, val_fraction=0)
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    with pytest.raises(ValueError, match="--text FILE: .*empty.txt' is empty"):
        prepare_corpus(empty, tmp_path / "o")
    with pytest.raises(ValueError, match="--text FILE.*too short.*--val-fraction 0.1; need at least 10"):
        prepare_corpus_from_text("abc", tmp_path)
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"\xff\xfe\xfa" * 10)
    with pytest.raises(ValueError, match="--text FILE: .* is not utf-8"):
        prepare_corpus(bad, tmp_path / "o")
    with pytest.raises(ValueError, match="--out DIR"):
        prepare_corpus_from_text(TEXT, bad)


def test_load_errors_name_the_option(tmp_path, corpus):
    hint = r"run `routerbench data prepare --text FILE --out DIR`"
    with pytest.raises(FileNotFoundError, match=f"--data DIR: no such directory .*{hint}"):
        CharCorpus.load(tmp_path / "nope")
    os.remove(tmp_path / "c" / "val.bin")
    with pytest.raises(FileNotFoundError, match=f"--data DIR: missing val.bin in .*{hint}"):
        CharCorpus.load(tmp_path / "c")
    (tmp_path / "c" / "val.bin").write_bytes(b"\0" * 7)
    with pytest.raises(ValueError, match="--data DIR: corrupt corpus.*val.bin has 7 bytes"):
        CharCorpus.load(tmp_path / "c")


def test_random_batches_shapes_shift_and_seed(corpus):
    data = np.arange(1000, dtype=np.int64) % 251
    x, y = random_batches(data, 4, 16, torch.Generator().manual_seed(0))
    assert x.shape == y.shape == (4, 16) and x.dtype == y.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])
    assert torch.equal((x + 1) % 251, y)  # consecutive tokens of data: y is x shifted by one

    def draw(seed, n=3):
        g = torch.Generator().manual_seed(seed)
        return [random_batches(corpus.train, 8, 32, g) for _ in range(n)]

    a, b, c = draw(1), draw(1), draw(2)
    assert all(torch.equal(p[0], q[0]) and torch.equal(p[1], q[1]) for p, q in zip(a, b))
    assert not all(torch.equal(p[0], q[0]) for p, q in zip(a, c))
    assert not torch.equal(a[0][0], a[1][0])  # successive batches differ


def test_random_batches_cover_the_whole_split():
    data = np.arange(11, dtype=np.uint8)
    g = torch.Generator().manual_seed(0)
    starts = {int(random_batches(data, 64, 10, g)[0][i, 0]) for i in range(64)}
    assert starts == {0}  # with seq_len + 1 == len(data) only offset 0 fits
    data = np.arange(20, dtype=np.uint8)
    xs = torch.cat([random_batches(data, 256, 10, g)[1] for _ in range(4)])
    assert int(xs.max()) == 19 and int(xs.min()) == 1  # the last token is reachable as a target


def test_fixed_val_batches(corpus):
    a = fixed_val_batches(corpus.val, 2, 8, 3)
    b = fixed_val_batches(corpus.val, 2, 8, 3)
    assert len(a) == 3 and all(x.shape == y.shape == (2, 8) for x, y in a)
    assert all(torch.equal(p[0], q[0]) and torch.equal(p[1], q[1]) for p, q in zip(a, b))
    assert all(torch.equal(x[:, 1:], y[:, :-1]) for x, y in a)
    data = np.arange(101, dtype=np.uint8)  # offsets evenly spaced over [0, 101 - 9]
    starts = [int(x[i, 0]) for x, _ in fixed_val_batches(data, 2, 8, 3) for i in range(2)]
    assert starts == [0, 18, 37, 55, 74, 92]


def test_batch_errors_name_seq_len(corpus):
    g = torch.Generator().manual_seed(0)
    with pytest.raises(ValueError, match="--seq-len 100 needs at least 101 tokens.*has 100"):
        random_batches(corpus.val, 2, 100, g)
    with pytest.raises(ValueError, match="--seq-len"):
        fixed_val_batches(corpus.val, 2, 100, 1)
    with pytest.raises(ValueError, match="--batch-size"):
        random_batches(corpus.val, 0, 8, g)


def test_synthetic_batch():
    x, y = synthetic_batch(50, 3, 12, seed=7)
    assert x.shape == y.shape == (3, 12) and x.dtype == torch.int64 and x.device.type == "cpu"
    assert torch.equal(x[:, 1:], y[:, :-1]) and 0 <= int(x.min()) and int(x.max()) < 50
    assert torch.equal(synthetic_batch(50, 3, 12, seed=7)[0], x)
    assert not torch.equal(synthetic_batch(50, 3, 12, seed=8)[0], x)
    with pytest.raises(ValueError, match="--seq-len"):
        synthetic_batch(50, 3, 0, seed=0)


def test_default_corpus_is_stdlib_text_and_cached(tmp_path):
    text = stdlib_text(200_000)
    assert len(text) == 200_000 and set(text) <= set(map(chr, range(0x20, 0x7F))) | {"\n"}
    assert text == stdlib_text(200_000)  # deterministic
    c = default_corpus(tmp_path, max_bytes=200_000)
    assert c.sha256 == hashlib.sha256(text.encode()).hexdigest()
    assert c.path == tmp_path / f"stdlib-{platform.python_version()}-{c.sha256[:12]}"
    assert c.source == f"python stdlib {platform.python_version()} source"
    assert c.vocab_size < 100 and c.train.dtype == np.uint8
    assert (len(c.train), len(c.val)) == (180_000, 20_000)
    assert c.decode(c.train[:1000]) == text[:1000]
    mtime = os.stat(c.path / "train.bin").st_mtime_ns
    again = default_corpus(tmp_path, max_bytes=200_000)
    assert again.path == c.path and os.stat(c.path / "train.bin").st_mtime_ns == mtime
    assert [p.name for p in tmp_path.iterdir()] == [c.path.name]  # no temp dirs left behind
    os.remove(c.path / "val.bin")  # a damaged cache is rebuilt
    assert len(default_corpus(tmp_path, max_bytes=200_000).val) == 20_000


def test_default_corpus_full_size_is_quick(tmp_path):
    import time
    t = time.perf_counter()
    c = default_corpus(tmp_path)
    assert time.perf_counter() - t < 5.0
    assert len(c.train) + len(c.val) == 4_000_000 and c.vocab_size < 100


def _shakespeare():
    if not SHAKESPEARE.is_file():
        pytest.skip(f"tinyshakespeare.txt not found at {SHAKESPEARE} (set ROUTERBENCH_SHARED_DATA or check out the repo next to shared/)")
    return SHAKESPEARE


def test_tinyshakespeare_slice(tmp_path):
    text = _shakespeare().read_text(encoding="utf-8")[:50_000]
    src = tmp_path / "slice.txt"
    src.write_text(text, encoding="utf-8")
    c = prepare_corpus(src, tmp_path / "out")
    assert c.chars == tuple(sorted(set(text)))
    assert (len(c.train), len(c.val)) == (45_000, 5_000)
    assert c.sha256 == hashlib.sha256(text.encode()).hexdigest()
    assert c.decode(c.val[:40]) == text[45_000:45_040]


def test_tinyshakespeare_full(tmp_path):
    c = prepare_corpus(_shakespeare(), tmp_path)
    assert c.vocab_size == 65 and c.sha256 == SHAKESPEARE_SHA
    assert len(c.train) + len(c.val) == 1_115_394 and len(c.val) == 111_539
