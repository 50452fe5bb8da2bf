"""``routerbench diagnose``: known answers at initialisation through the command's own path (a
checkpoint written by the trainer at step 0 of a tiny run), hidden-state RMS against an
independent loop, and the one-line errors (harness/training/diagnose.py, reports/diagnose.py)."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pandas as pd
import pytest
import torch
from click.testing import CliRunner

from harness.cli import main
from harness.cli.train import corpus_info
from harness.rundir.environment import write_manifest
from harness.rundir.writer import RunWriter
from harness.training.checkpoint import checkpoint_dir
from harness.training.config import TrainConfig
from harness.training.diagnose import find_trained_runs, load_model
from harness.training.run import TrainRun
from harness.training.schedule import Trainer
from routers.errors import ConfigError
from workloads.batches import fixed_val_batches
from workloads.config import DecoderConfig
from workloads.data import prepare_corpus_from_text

# 4 layers in 2 blocks of 4 sublayers: pools with C, P and (haares) completed and partial details.
TINY = DecoderConfig(d_model=16, n_layers=4, n_heads=2, seq_len=16, batch_size=4)
TC = TrainConfig(TINY, target_loss=3.0, max_steps=10, eval_every=5, untimed_warmup=1, warmup_steps=2)
ROUTERS = {"prenorm": {}, "block_attnres": {"n_blocks": 2}, "haares": {"n_blocks": 2}}
BATCHES = 2
E2 = math.exp(-2.0)


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    text = "".join(f"def f{i}(x):\n    return x * {i} + {i % 7}  # line {i}\n" for i in range(3000))
    return prepare_corpus_from_text(text, tmp_path_factory.mktemp("corpus") / "c")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, corpus):
    """A run dir as a training command leaves it after each run's step-0 evaluation: the rows of
    that evaluation committed, its checkpoint ``step-00000000.pt`` kept, the manifest's corpus."""
    torch.set_num_threads(2)
    d = tmp_path_factory.mktemp("runs") / "r"
    d.mkdir()
    write_manifest(d, "cpu", {"corpus": corpus_info(corpus)})
    with RunWriter(d, "r", "s") as w:
        trainer = Trainer(w, d, torch.device("cpu"), quiet=True)
        for name, opts in ROUTERS.items():
            run = TrainRun(name, opts, corpus, TC, 0, torch.device("cpu"))
            run.setup()
            run.advance(0, trainer.on_eval)          # the step-0 evaluation, then its checkpoint
            assert (checkpoint_dir(d, run.key) / "step-00000000.pt").exists()
    return d


@pytest.fixture(scope="module")
def written(run_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("diag")
    res = invoke("diagnose", run_dir, "--out", out, "--batches", BATCHES)
    assert res.exit_code == 0, res.output
    return out, res.stdout.splitlines()


def test_the_command_writes_one_line_per_file(written):
    out, lines = written
    names = {Path(p).name for p in lines}
    assert names == {"depth_weights.csv", "depth_weights_block_attnres-seed0.png",
                     "depth_weights_haares-seed0.png", "detail_share.csv", "detail_share.png",
                     "detail_bias.csv", "detail_bias.png", "hidden_rms.csv", "hidden_rms.png"}
    assert all(Path(p).parent == out and Path(p).stat().st_size > 0 for p in lines)


def _pools(w: pd.DataFrame, router: str) -> dict[str, list[tuple[str, float]]]:
    t = w[w["router"] == router]
    return {r: list(zip(g["source"], g["weight"])) for r, g in t.groupby("read_label", sort=False)}


def test_block_attnres_reads_are_plain_averages_at_init(written):
    """Zero-initialised pseudo-queries: every read is the uniform average of its sources."""
    w = pd.read_csv(written[0] / "depth_weights.csv")
    pools = _pools(w, "block_attnres")
    assert [s for s, _ in pools["0 attn"]] == ["e"]
    assert [s for s, _ in pools["3 mlp"]] == ["e", "P"]
    assert [s for s, _ in pools["4 attn"]] == ["e", "C1"]
    assert [s for s, _ in pools["5 mlp"]] == ["e", "C1", "P"]
    assert [s for s, _ in pools["out"]] == ["e", "C1", "C2"]
    assert len(pools) == 2 * TINY.n_layers + 1
    for read, pool in pools.items():
        for _, weight in pool:
            assert weight == pytest.approx(1 / len(pool), abs=1e-6), read
    assert set(w.loc[w["router"] == "block_attnres", "source_kind"]) == {"state"}
    assert set(w["router"]) == {"block_attnres", "haares"}    # prenorm has no depth softmax


def test_haares_gives_each_detail_e_to_the_minus_2_of_a_state_weight_at_init(written):
    """Detail logits biased by β_D = −2 at init: each detail source gets e^−2 of a state weight."""
    out = written[0]
    w = pd.read_csv(out / "depth_weights.csv")
    pools = _pools(w, "haares")
    assert [s for s, _ in pools["1 mlp"]] == ["e", "P", "P.split"]
    assert [s for s, _ in pools["5 mlp"]] == ["e", "C1", "D1.split", "P", "P.split"]
    assert [s for s, _ in pools["out"]] == ["e", "C1", "C2"]   # conservative readout: no details
    kinds = dict(zip(w["source"], w["source_kind"]))
    for read, pool in pools.items():
        n_state = sum(kinds[s] == "state" for s, _ in pool)
        n_detail = len(pool) - n_state
        state = 1 / (n_state + n_detail * E2)
        for source, weight in pool:
            want = state if kinds[source] == "state" else E2 * state
            assert weight == pytest.approx(want, abs=1e-6), (read, source)
    share = pd.read_csv(out / "detail_share.csv").set_index("read_label")
    assert share.loc["5 mlp", "detail_share"] == pytest.approx(2 * E2 / (3 + 2 * E2), abs=1e-6)
    assert share.loc["out", "detail_share"] == 0 and share.loc["out", "n_detail"] == 0
    bias = pd.read_csv(out / "detail_bias.csv")
    assert len(bias) == 2 * TINY.n_layers + 1 and set(bias["kind"]) == {"split"}
    assert (bias["bias"] == -2.0).all() and (bias["init"] == -2.0).all()
    assert bias.set_index("read_label")["used"].to_dict() == {
        "0 attn": False, **{f"{k} {'attn' if k % 2 == 0 else 'mlp'}": True for k in range(1, 8)},
        "out": False}


def test_hidden_rms_of_prenorm_matches_an_independent_loop(run_dir, corpus, written):
    """h_0 = e, h_{k+1} = h_k + u_k, h_out = h_2L: per-token RMS over d, mean over tokens."""
    run = next(r for r in find_trained_runs(run_dir) if r.router == "prenorm")
    model = load_model(run)
    want = {("read_input", k): 0.0 for k in range(2 * TINY.n_layers + 1)}
    want.update({("update", k): 0.0 for k in range(2 * TINY.n_layers)})
    rms = lambda t: float(t.double().pow(2).mean(-1).sqrt().mean())  # noqa: E731
    batches = fixed_val_batches(corpus.val, TINY.batch_size, TINY.seq_len, BATCHES)
    with torch.no_grad():
        for x, _ in batches:
            h = model.embed(x)
            for k, f in enumerate(model.sublayers):
                u = f(h)
                want["read_input", k] += rms(h) / BATCHES
                want["update", k] += rms(u) / BATCHES
                h = h + u
            want["read_input", 2 * TINY.n_layers] += rms(h) / BATCHES
    got = pd.read_csv(written[0] / "hidden_rms.csv")
    got = got[got["router"] == "prenorm"].set_index(["quantity", "depth"])["rms"]
    assert len(got) == len(want)
    for key, value in want.items():
        assert got[key] == pytest.approx(value, rel=1e-9), key
    assert set(pd.read_csv(written[0] / "hidden_rms.csv")["router"]) == set(ROUTERS)


def test_a_run_dir_without_checkpoints_or_training_runs_is_one_line_and_exit_2(run_dir, tmp_path):
    bare = tmp_path / "bare"
    shutil.copytree(run_dir, bare, ignore=shutil.ignore_patterns("checkpoints", ".lock"))
    res = invoke("diagnose", bare)
    assert res.exit_code == 2
    assert res.stderr.count("\n") == 1 and "routerbench: error: RUN_DIR: " in res.stderr
    assert str(bare) in res.stderr and "no checkpoint" in res.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    res = invoke("diagnose", empty)
    assert res.exit_code == 2 and str(empty) in res.stderr and "no training runs" in res.stderr
    with pytest.raises(ConfigError, match="no checkpoint"):
        find_trained_runs(bare)
    assert not (bare / "diagnose").exists()


def _copy(run_dir, tmp_path, name):
    d = tmp_path / name
    shutil.copytree(run_dir, d, ignore=shutil.ignore_patterns(".lock", "diagnose"))
    return d


def test_a_checkpoint_replaced_while_read_is_read_at_its_newer_step(run_dir, tmp_path, monkeypatch):
    """A run in progress replaces its checkpoint once while diagnose reads it (fault hook
    ``checkpoint_replaced=1``, which renames step-0 to step-1 as a next evaluation would): the
    newest checkpoint is read, its step is recorded, and the others are unchanged."""
    d = _copy(run_dir, tmp_path, "live")
    monkeypatch.setenv("ROUTERBENCH_FAULT", "checkpoint_replaced=1:train|haares|*")
    out = tmp_path / "out"
    res = invoke("diagnose", d, "--out", out, "--batches", BATCHES)
    assert res.exit_code == 0, res.output
    assert "Traceback" not in res.output
    assert sorted(res.stderr.splitlines()) == [  # each run says the step it was read at
        f"diagnose: {name}-seed0: read at step {step}, from its resume checkpoint (the run has not finished: "
        "in progress or stopped)" for name, step in (("block_attnres", 0), ("haares", 1), ("prenorm", 0))]
    rms = pd.read_csv(out / "hidden_rms.csv")
    steps = rms.groupby("router")["step"].unique().map(list).to_dict()
    assert steps == {"block_attnres": [0], "haares": [1], "prenorm": [0]}
    (haares,) = [r for r in find_trained_runs(d) if r.router == "haares"]
    assert haares.checkpoint.name == "step-00000001.pt" and haares.step == 1


def test_a_run_whose_checkpoint_outlasts_the_retries_is_one_line(run_dir, tmp_path, monkeypatch):
    """Replaced more often than diagnose looks again (CHECKPOINT_RETRIES + 1 reads): one run is
    skipped with one note line while the others are diagnosed; every run so, exit 2 with one
    line saying the run is in progress, no traceback, nothing written."""
    from harness.training.checkpoint import CHECKPOINT_RETRIES
    strikes = CHECKPOINT_RETRIES + 1
    d = _copy(run_dir, tmp_path, "busy")
    monkeypatch.setenv("ROUTERBENCH_FAULT", f"checkpoint_replaced={strikes}:train|haares|*")
    res = invoke("diagnose", d, "--out", tmp_path / "some", "--batches", BATCHES)
    assert res.exit_code == 0, res.output
    assert "diagnose: haares-seed0: in progress (its checkpoint was replaced while being read), skipped" \
        in res.stderr.splitlines() and res.stderr.count("\n") == 3  # and two runs read at step 0
    assert set(pd.read_csv(tmp_path / "some" / "hidden_rms.csv")["router"]) == {"prenorm", "block_attnres"}

    d = _copy(run_dir, tmp_path, "all")
    monkeypatch.setenv("ROUTERBENCH_FAULT", f"checkpoint_replaced={strikes}:train|*")
    res = invoke("diagnose", d, "--out", tmp_path / "none", "--batches", BATCHES)
    assert res.exit_code == 2
    assert res.stderr.count("\n") == 1 and "Traceback" not in res.output
    assert res.stderr.startswith("routerbench: error: RUN_DIR: ") and "in progress" in res.stderr
    assert str(d) in res.stderr
    assert not (tmp_path / "none").exists()

    one = _copy(run_dir, tmp_path, "one")
    for r in find_trained_runs(one):
        if r.router != "prenorm":
            shutil.rmtree(r.checkpoint.parent)
    monkeypatch.setenv("ROUTERBENCH_FAULT", f"checkpoint_replaced={strikes}:train|*")
    res = invoke("diagnose", one, "--batches", BATCHES)
    assert res.exit_code == 2 and res.stderr.count("\n") == 1
    assert f"run prenorm-seed0 is in progress: its checkpoint was replaced {strikes} times" in res.stderr


def test_runs_with_a_checkpoint_but_no_committed_evaluation_are_said(run_dir, tmp_path):
    """A run whose first evaluation is checkpointed but not yet committed has no rows: diagnose
    says so (one note line beside the runs it reads; exit 2 and one line when no run has rows)."""
    d = _copy(run_dir, tmp_path, "early")
    src = next((d / "checkpoints").glob("*/step-00000000.pt"))
    (d / "checkpoints" / "0123456789abcdef").mkdir()
    shutil.copy(src, d / "checkpoints" / "0123456789abcdef" / "step-00000005.pt")
    res = invoke("diagnose", d, "--out", tmp_path / "o", "--batches", BATCHES)
    assert res.exit_code == 0, res.output
    assert ("diagnose: 1 more run(s) have a checkpoint but no evaluation committed yet (in progress), skipped"
            in res.stderr.splitlines())
    (d / "records.jsonl").unlink()
    res = invoke("diagnose", d, "--batches", BATCHES)
    assert res.exit_code == 2 and res.stderr.count("\n") == 1 and "Traceback" not in res.output
    assert f"RUN_DIR: {d} is in progress: 4 training run(s) have a checkpoint but no evaluation committed yet" \
        in res.stderr
    shutil.rmtree(d / "checkpoints")
    res = invoke("diagnose", d)
    assert res.exit_code == 2 and "holds no training runs (it has no records.jsonl)" in res.stderr
