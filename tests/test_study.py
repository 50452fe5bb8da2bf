"""``routerbench study depth`` (harness/training/study.py, harness/spec/study.py, reports/study.py): the block
layout held fixed across depths, the table against the records, the paired statistics, the estimate
before training, and resume after a kill. CPU eager, 2 routers × depths {2, 4} × 1 seed × 10 steps."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from click.testing import CliRunner
from scipy import stats as st

from harness.cli import main
from harness.rundir.records import load_rows
from harness.spec.base import load
from harness.spec.study import TINY_LABEL, StudySpec
from reports.study import NO_TEST_ONE, depth_table, study_runs
from workloads.config import PRESETS, TRAINING_PRESETS
from workloads.data import prepare_corpus_from_text, stdlib_text

ROOT = Path(__file__).resolve().parents[1]
ARGS = ["study", "depth", "--scale", "tiny", "--routers", "block_attnres,haares", "--depths", "2,4",
        "--blocks", "2", "--max-steps", "10", "--eval-every", "5", "--estimate-steps", "1",
        "--device", "cpu", "--quiet"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return prepare_corpus_from_text(stdlib_text(300_000), tmp_path_factory.mktemp("corpus") / "c")


@pytest.fixture(scope="module")
def study(tmp_path_factory, corpus):
    """One tiny study, trained once: (run dir, terminal output)."""
    out = tmp_path_factory.mktemp("study")
    n = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        res = CliRunner().invoke(main, [*ARGS, "--data", str(corpus.path), "--out", str(out), "--run-id", "s"])
    finally:
        torch.set_num_threads(n)
    assert res.exit_code == 0, res.output
    return next(out.glob("*/s")), res.output


def _losses(run_dir: Path) -> dict:
    return {(r["router"], r["n_layers"], r["seed"]): r["value"] for r in load_rows([run_dir])
            if r["metric"] == "loss_at_token_budget" and r["status"] == "ok"}


@pytest.mark.parametrize("flag,value,depth", [("--blocks", "4", 6), ("--block-length", "3", 4)])
def test_a_block_setting_that_does_not_divide_a_depth_exits_2_in_one_line(tmp_path, corpus, no_models,
                                                                         flag, value, depth):
    res = CliRunner().invoke(main, ["study", "depth", "--depths", "4,6", flag, value, "--data", str(corpus.path),
                                    "--out", str(tmp_path), "--device", "cpu"])
    assert res.exit_code == 2
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("routerbench: error: ")
    assert f"{flag} {value} does not divide depth {depth}" in lines[0]
    assert not list(tmp_path.iterdir())  # no run directory either


def test_the_layout_options_never_come_from_router_options(tmp_path, no_models):
    res = CliRunner().invoke(main, ["study", "depth", "--routers", "haares", "--router-options",
                                    '{"haares": {"n_blocks": 3}}', "--out", str(tmp_path), "--device", "cpu"])
    assert res.exit_code == 2 and "haares.n_blocks is set by the study" in res.output


def test_a_block_length_gives_each_depth_its_own_count_of_equal_blocks():
    spec, labels = load(StudySpec, {"scale": "tiny", "block_length": "2", "routers": "prenorm,wav_v1"})
    spec = spec.resolve(labels)
    assert [spec.options_at(d)["wav_v1"]["n_blocks"] for d in (4, 8, 16)] == [2, 4, 8]
    assert spec.options_at(8)["prenorm"] == {}
    lay = spec.layout()
    assert lay["held"] == "block length" and lay["routers"] == ["wav_v1"]
    assert {v["layers_per_block"] for v in lay["per_depth"].values()} == {2}


def test_the_block_count_is_held_fixed_across_depths_and_recorded(study):
    run_dir, _ = study
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["layout"]["held"] == "block count" and manifest["layout"]["value"] == 2
    assert manifest["layout"]["per_depth"] == {"2": {"n_blocks": 2, "layers_per_block": 1},
                                               "4": {"n_blocks": 2, "layers_per_block": 2}}
    assert manifest["router_options"]["4"]["haares"] == {"n_blocks": 2, "block_unit": "layer"}
    built = {(r["router"], r["n_layers"]): json.loads(r["router_options"]) for r in load_rows([run_dir])}
    assert built == {(r, d): {"n_blocks": 2, "block_unit": "layer"}
                     for r in ("block_attnres", "haares") for d in (2, 4)}
    assert manifest["scale"] == "tiny" and TINY_LABEL in manifest["scale_label"]


def test_the_estimate_is_printed_and_recorded_before_training(study):
    run_dir, output = study
    assert output.index("estimate: ") < output.index("study L2 block_attnres seed 0: val loss")
    assert "estimate: " in output and "for the 4 runs left of 4" in output
    est = json.loads((run_dir / "manifest.json").read_text())["estimate"]
    assert est["runs_left"] == 4 and len(est["cases"]) == 4 and est["total_s"] > 0
    assert {(c["depth"], c["router"]) for c in est["cases"]} == {(d, r) for d in (2, 4)
                                                                 for r in ("block_attnres", "haares")}


def test_the_table_quotes_the_records_and_says_the_tiny_scale_is_no_evidence(study):
    run_dir, output = study
    losses = _losses(run_dir)
    assert len(losses) == 4
    table = pd.read_csv(run_dir / "study_table.csv")
    for r in table.itertuples():
        assert r.loss_mean == losses[(r.router, r.depth, 0)] and r.n_seeds == 1
    h = table[table.router == "haares"].set_index("depth")
    for d in (2, 4):
        delta = losses[("haares", d, 0)] - losses[("block_attnres", d, 0)]
        assert h.loc[d, "delta"] == pytest.approx(delta, abs=1e-12)
        assert h.loc[d, "ppl_change_pct"] == pytest.approx(100 * math.expm1(delta))
        assert h.loc[d, "test"] == NO_TEST_ONE and math.isnan(h.loc[d, "p"])
    md = (run_dir / "study.md").read_text()
    assert TINY_LABEL in md and TINY_LABEL in output and "one seed: no test" in md
    assert f"{losses[('haares', 4, 0)]:.4f}" in md
    for name in ("loss_vs_depth", "gain_vs_depth"):
        assert (run_dir / f"{name}.png").stat().st_size > 0 and (run_dir / f"{name}.csv").exists()
    assert (run_dir / "study.html").exists()


def _runs(losses: dict) -> pd.DataFrame:
    return pd.DataFrame([{"router": r, "depth": d, "seed": s, "status": "ok" if v is not None else "diverged",
                          "loss": math.nan if v is None else v, "train_time": 1.0, "note": "", "case_key": ""}
                         for (r, d, s), v in losses.items()])


def test_delta_perplexity_and_the_paired_test_over_seeds():
    base, haares = [2.10, 2.20, 2.05], [2.08, 2.15, 2.04]
    losses = {**{("block_attnres", 48, s): v for s, v in enumerate(base)},
              **{("haares", 48, s): v for s, v in enumerate(haares)},
              ("haares", 12, 0): 2.5, ("block_attnres", 12, 0): 2.4, ("wav_v1", 48, 0): None,
              ("wav_v1", 48, 1): 2.0}
    t = depth_table(_runs(losses), ["block_attnres", "haares", "wav_v1"]).set_index(["router", "depth"])
    row = t.loc[("haares", 48)]
    d = np.array(haares) - np.array(base)
    assert row.n_seeds == 3 and row.n_pairs == 3 and row.loss_mean == pytest.approx(np.mean(haares))
    assert row.delta == pytest.approx(d.mean())
    assert row.ppl_change_pct == pytest.approx(100 * (math.exp(np.mean(haares) - np.mean(base)) - 1))
    assert row.p == pytest.approx(st.ttest_rel(haares, base).pvalue)
    half = st.t.ppf(0.975, 2) * d.std(ddof=1) / math.sqrt(3)
    assert (row.delta_lo, row.delta_hi) == (pytest.approx(d.mean() - half), pytest.approx(d.mean() + half))
    assert row.loss_per_seed == "0: 2.0800; 1: 2.1500; 2: 2.0400"
    assert t.loc[("haares", 12)].test == NO_TEST_ONE and t.loc[("haares", 12)].delta == pytest.approx(0.1)
    wav = t.loc[("wav_v1", 48)]  # the diverged seed is left out of the mean and of every pair
    assert wav.n_seeds == 1 and wav.loss_mean == 2.0 and wav.left_out == "seed 0: diverged"
    assert wav.n_pairs == 1 and wav.delta == pytest.approx(2.0 - base[1])
    assert math.isnan(t.loc[("block_attnres", 48)].delta)


def test_study_runs_reads_one_row_per_run_from_the_records(study):
    run_dir, _ = study
    runs = study_runs(load_rows([run_dir]))
    assert len(runs) == 4 and set(runs.status) == {"ok"} and (runs.train_time > 0).all()


def _cli(out: Path, data: Path, fault: str | None = None):
    env = {k: v for k, v in os.environ.items() if k != "ROUTERBENCH_FAULT"}
    env["OMP_NUM_THREADS"] = "2"  # the same thread count as the in-process study it is compared with
    if fault:
        env["ROUTERBENCH_FAULT"] = fault
    args = [sys.executable, "-m", "harness.cli", *ARGS, "--data", str(data), "--out", str(out), "--run-id", "k"]
    return subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def test_a_killed_study_resumes_and_redoes_nothing_committed(tmp_path, corpus, study):
    killed = _cli(tmp_path, corpus.path, "kill_after_eval=1:study|haares|*n_layers=4,*")
    assert killed.returncode == -9, killed.stderr[-2000:]
    d = next(tmp_path.glob("*/k"))
    before = {(r["case_key"], r["metric"], r["repeat"]) for r in load_rows([d])}
    resumed = _cli(tmp_path, corpus.path)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    out = resumed.stdout + resumed.stderr
    assert out.count("already done, skipped") == 2  # both depth-2 runs
    assert "study L4 block_attnres seed 0: resumed at step 5" in out
    assert "study L4 haares seed 0: resumed at step 5" in out
    assert "for the 2 runs left of 4" in out  # only what is left is timed
    rows = load_rows([d])
    keys = [(r["case_key"], r["metric"], r["repeat"]) for r in rows]
    assert len(keys) == len(set(keys)) and before <= set(keys)  # nothing doubled, nothing lost
    assert _losses(d) == _losses(study[0])  # the losses of the uninterrupted study, bitwise
    assert not list((d / "checkpoints").rglob("step-*.pt"))  # no resume state left (final weights stay)


def test_training_presets_state_a_source_for_every_value():
    for name, tp in TRAINING_PRESETS.items():
        assert tp.shape == name and name in PRESETS
        for field, value, source in tp.settings():
            assert source.split(":")[0] in ("paper", "ours"), (name, field)
    char = [TRAINING_PRESETS[f"char-{d}L"] for d in (12, 24, 48)]
    same = {(t.d_model.value, t.global_batch.value, t.seq_len.value, t.lr.value, t.max_steps.value) for t in char}
    assert len(same) == 1 and [t.n_layers.origin for t in char] == ["paper"] * 3
    assert TRAINING_PRESETS["haares-201m"].seeds.value == 3 and TRAINING_PRESETS["haares-453m"].seeds.value == 2
