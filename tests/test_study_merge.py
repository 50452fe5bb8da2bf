"""``routerbench study report`` (reports/study_merge.py, harness/cli/study_report.py): one depth-study
report from several run directories. Two real tiny studies (seeds 0 and 1, CPU eager, 2 routers ×
depths {2, 4} × 10 steps) merge into one table of both seeds; edited copies of them are refused or
warned of; a study root lists its missing units; clocks are summed per device only."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pandas as pd
import pytest
import torch
from click.testing import CliRunner

from harness.cli import main
from harness.rundir.records import load_rows
from harness.training.units import study_units, write_index
from reports import sentences as say
from reports.study import device_clocks, missing_units
from reports.study_merge import find_study_dirs, merge_check, write_merged
from routers.errors import ConfigError
from workloads.data import prepare_corpus_from_text, stdlib_text

ARGS = ["study", "depth", "--scale", "tiny", "--routers", "block_attnres,haares", "--depths", "2,4",
        "--blocks", "2", "--max-steps", "10", "--eval-every", "5", "--estimate-steps", "1",
        "--device", "cpu", "--quiet", "--threads", "2"]
GPU = "cuda-nvidia-h100-80gb-hbm3"


@pytest.fixture(scope="module")
def studies(tmp_path_factory):
    """Two tiny studies trained once, seed 0 and seed 1, each its own run directory: {seed: dir}."""
    corpus = prepare_corpus_from_text(stdlib_text(300_000), tmp_path_factory.mktemp("corpus") / "c")
    out = tmp_path_factory.mktemp("studies")
    n = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        for seed in (0, 1):
            res = CliRunner().invoke(main, [*ARGS, "--seed-list", str(seed), "--data", str(corpus.path),
                                            "--out", str(out), "--run-id", f"s{seed}"])
            assert res.exit_code == 0, res.output
    finally:
        torch.set_num_threads(n)
    dirs = {seed: next(out.glob(f"*/s{seed}")) for seed in (0, 1)}
    # one unit (L4, seed 1) of a study of seeds 0,1 in its own directory under the study root ROOT/U
    res = CliRunner().invoke(main, [*ARGS, "--seed-list", "0,1", "--unit", "3", "--data", str(corpus.path),
                                    "--out", str(out / "units"), "--run-id", "U"])
    assert res.exit_code == 0, res.output
    return {**dirs, "root": out / "units"}


def _losses(run_dir: Path) -> dict:
    return {(r["router"], r["n_layers"], r["seed"]): r["value"] for r in load_rows([run_dir])
            if r["metric"] == "loss_at_token_budget" and r["status"] == "ok"}


def _copy(src: Path, dst: Path, edit=None) -> Path:
    shutil.copytree(src, dst)
    if edit:
        path = dst / "manifest.json"
        manifest = json.loads(path.read_text())
        edit(manifest)
        path.write_text(json.dumps(manifest))
    return dst


def _csv(path: Path) -> pd.DataFrame:
    return pd.read_csv(path)


def _cli(args: list[str]):
    """``routerbench study report ARGS`` through the CLI's error handling (one line, exit 2)."""
    return CliRunner().invoke(main, ["study", "report", *args])


def test_two_seeds_merge_into_one_table_of_each_directorys_losses(studies, tmp_path):
    warnings: list[str] = []
    paths, text = write_merged([studies[0], studies[1]], tmp_path / "out", warnings)
    assert warnings == []
    losses = {**_losses(studies[0]), **_losses(studies[1])}
    assert len(losses) == 8 and {k[2] for k in losses} == {0, 1}
    runs = _csv(paths["study_runs.csv"])
    assert {(r.router, r.depth, r.seed): r.loss for r in runs.itertuples()} == losses  # bitwise, per seed
    assert list(zip(runs.seed, runs.depth)) == [(0, 2)] * 2 + [(0, 4)] * 2 + [(1, 2)] * 2 + [(1, 4)] * 2
    table = _csv(paths["study_table.csv"]).set_index(["router", "depth"])
    for (router, depth), r in table.iterrows():
        mine = [losses[(router, depth, s)] for s in (0, 1)]
        assert r.n_seeds == 2 and r.loss_mean == pytest.approx(sum(mine) / 2, abs=1e-12)
        assert r.loss_per_seed == f"0: {mine[0]:.4f}; 1: {mine[1]:.4f}"
        if router == "haares":
            diffs = [losses[(router, depth, s)] - losses[("block_attnres", depth, s)] for s in (0, 1)]
            assert r.n_pairs == 2 and r.delta == pytest.approx(sum(diffs) / 2, abs=1e-12)
            assert r.delta_lo < r.delta < r.delta_hi and "(2 seeds)" in r.test
    gain = _csv(paths["gain_vs_depth.csv"])  # the figure reads the merged set: both seeds, n = 2
    assert set(gain[gain.seed == "mean"].n_pairs) == {2} and set(gain.seed) == {"mean", "0", "1"}
    assert "2 seeds, depths 2,4" in text and "Missing units" not in text
    md = (tmp_path / "out" / "study.md").read_text()
    assert "— s0, s1" in md.splitlines()[0]
    clocks = [runs.loc[runs.seed == s, "train_time"].sum() for s in (0, 1)]
    assert f"Training clocks of the runs sum to {sum(clocks):.0f} s" in md  # one device: summed


def test_a_single_directory_is_reported_as_write_study_reported_it(studies):
    d = studies[0]
    before = {n: (d / n).read_text() for n in ("study.md", "study_table.csv", "study_runs.csv")}
    runs = _csv(d / "study_runs.csv")
    slug = json.loads((d / "manifest.json").read_text())["environment"]["device_slug"]
    assert list(runs.columns)[:7] == ["router", "depth", "seed", "status", "loss", "train_time", "device"]
    assert set(runs.device) == {slug} and f"| {slug} " in before["study.md"]
    res = _cli([str(d)])  # one run directory: the report goes back into it, the same files
    assert res.exit_code == 0, res.output
    assert f"study report: {d / 'study.md'}, {d / 'study.html'}" in res.output
    assert {n: (d / n).read_text() for n in before} == before


def test_a_directory_given_twice_or_a_seed_in_two_directories_is_refused_naming_both(studies, tmp_path):
    with pytest.raises(ConfigError, match="the same run directory is given twice") as exc:
        merge_check([studies[0], studies[0]])
    assert str(exc.value).count(str(studies[0])) == 2
    copy = _copy(studies[0], tmp_path / "again")
    res = _cli([str(studies[0]), str(copy), "--out", str(tmp_path / "out")])
    lines = res.output.strip().splitlines()
    assert res.exit_code == 2 and len(lines) == 1 and lines[0].startswith("routerbench: error: ")
    assert str(studies[0]) in lines[0] and str(copy) in lines[0]
    assert "block_attnres at depth 2, seed 0" in lines[0] and not (tmp_path / "out").exists()


@pytest.mark.parametrize("field,edit", [
    ("corpus sha256", lambda m: m["corpus"].update(sha256="0" * 64)),
    ("max_steps", lambda m: m.update(max_steps=20)),
    ("haares's router options (manifest.json router_options) at depth 4",
     lambda m: m["router_options"]["4"]["haares"].update(n_blocks=4)),
    ("block layout (manifest.json layout.per_depth) at depth 2",
     lambda m: m["layout"]["per_depth"]["2"].update(n_blocks=1, layers_per_block=2)),
])
def test_runs_of_another_corpus_protocol_or_router_option_are_refused(studies, tmp_path, field, edit):
    other = _copy(studies[1], tmp_path / "other", edit)
    with pytest.raises(ConfigError) as exc:
        merge_check(find_study_dirs([studies[0], other]))
    msg = str(exc.value)
    assert "\n" not in msg and field in msg and str(studies[0]) in msg and str(other) in msg


def test_a_spec_with_another_learning_rate_is_refused(studies, tmp_path):
    other = _copy(studies[1], tmp_path / "other")
    spec = other / "spec.toml"
    spec.write_text(spec.read_text().replace("lr = 0.003", "lr = 0.001"))
    with pytest.raises(ConfigError, match=r"study\.lr \(spec\.toml\): 0\.003 vs 0\.001"):
        merge_check([studies[0], other])


def test_another_torch_version_is_a_warning_not_a_refusal(studies, tmp_path):
    other = _copy(studies[1], tmp_path / "other", lambda m: m["environment"].update(torch="2.0.0"))
    res = _cli([str(studies[0]), str(other), "--out", str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    warn = [ln for ln in res.output.splitlines() if ln.startswith("warning: ")]
    assert len(warn) == 1 and "torch" in warn[0] and "2.0.0" in warn[0] and str(other) in warn[0]
    assert "Caution: " in (tmp_path / "out" / "study.md").read_text()
    assert len(_csv(tmp_path / "out" / "study_runs.csv")) == 8


def test_a_study_root_lists_its_missing_units_and_fills_none(studies, tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    shutil.copy(studies[0] / "spec.toml", root / "study.toml")
    write_index(root, "S", study_units((0, 1, 2), (2, 4), "S"))  # seed 2 never ran
    for seed in (0, 1):
        _copy(studies[seed], root / "cpu-x" / f"S-s{seed}")
    res = _cli([str(root)])
    assert res.exit_code == 0, res.output
    gap = "Missing units (2; left out of every mean and pair, never filled): L2 seed 2: not run; L4 seed 2: not run."
    assert gap in res.output and gap in (root / "report" / "study.md").read_text()
    runs = _csv(root / "report" / "study_runs.csv")
    assert sorted(set(runs.seed)) == [0, 1] and len(runs) == 8
    assert f"written: {root / 'report' / 'study_table.csv'}" in res.output


def test_a_unit_directory_merges_with_a_whole_study_and_its_root_names_what_is_missing(studies, tmp_path):
    root = studies["root"]
    unit = next(root.glob("*/U-L4-s1"))
    assert json.loads((unit / "manifest.json").read_text())["unit"]["study_id"] == "U"
    assert find_study_dirs([root]) == [unit]
    res = _cli([str(studies[0]), str(root), "--out", str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    assert "Missing units (1; left out of every mean and pair, never filled): L2 seed 1: not run." in res.output
    runs = _csv(tmp_path / "out" / "study_runs.csv")
    want = {**_losses(studies[0]), **{k: v for k, v in _losses(studies[1]).items() if k[1] == 4}}
    assert {(r.router, r.depth, r.seed): r.loss for r in runs.itertuples()} == want  # the unit's, bitwise
    table = _csv(tmp_path / "out" / "study_table.csv").set_index(["router", "depth"])
    assert table.loc[("haares", 4), "n_pairs"] == 2 and table.loc[("haares", 2), "n_pairs"] == 1
    assert "— s0, U" in (tmp_path / "out" / "study.md").read_text().splitlines()[0]


def test_missing_units_name_the_routers_a_unit_lacks():
    runs = pd.DataFrame([{"router": r, "depth": 4, "seed": 1, "status": s, "loss": math.nan, "train_time": 1.0,
                          "device": "cpu", "note": "", "case_key": r}
                         for r, s in (("block_attnres", "diverged"), ("haares", "incomplete"))])
    want = {(4, 1): {"block_attnres", "haares", "wav_v1"}, (2, 1): {"block_attnres"}, (4, 0): {"haares"}}
    assert missing_units(runs, want, ["block_attnres", "haares", "wav_v1"]) == [
        "L4 seed 0: not run", "L2 seed 1: not run", "L4 seed 1: haares, wav_v1 not finished"]


def test_clocks_are_summed_per_device_and_each_run_names_its_device(studies, tmp_path):
    gpu = _copy(studies[1], tmp_path / "gpu", lambda m: m["environment"].update(device_slug=GPU))
    paths, _ = write_merged([studies[0], gpu], tmp_path / "out")
    runs = _csv(paths["study_runs.csv"])
    cpu = json.loads((studies[0] / "manifest.json").read_text())["environment"]["device_slug"]
    assert dict(zip(runs.seed, runs.device)) == {0: cpu, 1: GPU}
    own = {dev: _csv(d / "study_runs.csv")["train_time"].sum() for dev, d in ((cpu, studies[0]), (GPU, studies[1]))}
    clocks = device_clocks(runs)
    assert clocks == {cpu: (4, pytest.approx(own[cpu], abs=1e-12)), GPU: (4, pytest.approx(own[GPU], abs=1e-12))}
    md = (tmp_path / "out" / "study.md").read_text()
    for dev in (cpu, GPU):
        assert f"training clocks of its 4 runs sum to {say.fmt_seconds(clocks[dev][1])}." in md
        assert f"On {dev}: estimated before training" in md
    assert "Training clocks of the runs sum to" not in md  # never one sum over both devices
    assert "not added" in md and f"| {GPU} " in md and f"| {cpu} " in md
    losses = {**_losses(studies[0]), **_losses(studies[1])}  # losses are pooled all the same
    assert {(r.router, r.depth, r.seed): r.loss for r in runs.itertuples()} == losses


def test_a_path_that_holds_no_study_is_refused_in_one_line(tmp_path):
    (tmp_path / "empty").mkdir()
    res = _cli([str(tmp_path / "empty")])
    assert res.exit_code == 2 and res.output.count("\n") == 1
    assert f"{tmp_path / 'empty'}: neither a `study depth` run directory" in res.output
    with pytest.raises(ConfigError, match="no such file or directory"):
        find_study_dirs([tmp_path / "nowhere"])
