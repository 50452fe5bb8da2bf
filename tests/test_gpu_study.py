"""``scripts/gpu_study.sh BUDGET`` (the depth study sized to a budget on one GPU) and what it needs:
``study depth --backend``, the sizing (:mod:`harness.spec.study_budget`, planted step times), the
budget parser, ``--dry-run`` at 6 min and 1 h, the refusals, and the report's depth-trend figure
with paired seed CIs and its smoke-test sentence. CPU only: the graphed study itself needs a GPU."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
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
from harness.cli.study_budget import parse_budget
from harness.spec import study_budget as sb
from harness.spec.base import load
from harness.spec.study import StudySpec, budget_words
from routers.errors import ConfigError
from workloads.data import prepare_corpus_from_text, stdlib_text

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_study.sh"
NO_CUDA = not torch.cuda.is_available()


def _script(*args: str, timeout: int = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHON": sys.executable}
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout,
                          env=env, cwd=ROOT)


# --- the script --------------------------------------------------------------------------------

def test_the_script_parses_and_passes_shellcheck():
    assert subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True).returncode == 0
    if shutil.which("shellcheck"):
        res = subprocess.run(["shellcheck", str(SCRIPT)], capture_output=True, text=True)
        assert res.returncode == 0, res.stdout


def _plan(out: str) -> dict:
    steps = int(re.search(r"x ([\d,]+) steps per run", out).group(1).replace(",", ""))
    est, budget = map(float, re.search(r"estimate: .*?\((\d+) s\) of the .*?\((\d+) s\) budget", out).groups())
    routers = re.search(r"plan: (\d) routers", out).group(1)
    return {"steps": steps, "estimate_s": est, "budget_s": budget, "routers": int(routers)}


@pytest.fixture(scope="module")
def dry_runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("dry") / "out"
    runs = {b: _script(b, "--dry-run", "--out", str(out)) for b in ("360", "1h")}
    assert not out.exists()  # a dry run writes nothing
    return runs


def test_dry_run_plans_fit_their_budget_and_a_longer_budget_buys_more_steps(dry_runs):
    six, hour = dry_runs["360"], dry_runs["1h"]
    for res in (six, hour):
        assert res.returncode == 0, res.stderr
        assert "ASSUMED, not measured" in res.stdout  # no GPU probed: labelled
        assert "torch " in res.stdout and "triton" in res.stdout and "device " in res.stdout
        assert "backend cudagraph" in res.stdout and "impl two_phase" in res.stdout
    a, b = _plan(six.stdout), _plan(hour.stdout)
    assert a["budget_s"] == 360 and b["budget_s"] == 3600
    assert a["estimate_s"] <= 360 and b["estimate_s"] <= 3600
    assert sb.MIN_STEPS <= a["steps"] < sb.SHORT_RUN_STEPS and a["routers"] == 2
    assert b["steps"] >= 5 * a["steps"] and b["routers"] == 3  # an hour: wav_v1 joins, 3 resume points
    assert f"{a['steps']} steps per run" in six.stdout and "a smoke test" in six.stdout
    assert "5,000 steps (41M tokens)" in six.stdout
    assert f"--max-steps {a['steps']} --eval-every {a['steps']} " in six.stdout  # no resume checkpoint
    assert f"--eval-every {math.ceil(b['steps'] / 4)} " in hour.stdout


def test_the_script_refuses_a_bad_budget_in_one_line():
    for bad in ("6x", "-5", "0", "1h30"):
        res = _script(bad, "--dry-run")
        assert res.returncode == 2 and res.stdout == ""
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and "BUDGET" in lines[0], res.stderr
    res = _script("--dry-run")
    assert res.returncode == 2 and "BUDGET missing" in res.stderr


@pytest.mark.skipif(not NO_CUDA, reason="a CUDA device is visible")
def test_without_cuda_and_without_dry_run_it_exits_2_in_one_line_and_writes_nothing(tmp_path):
    res = _script("6m", "--out", str(tmp_path / "out"))
    assert res.returncode == 2 and res.stdout == ""
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "no CUDA device" in lines[0] and "--dry-run" in lines[0]
    assert not (tmp_path / "out").exists()


# --- the budget and the sizing -------------------------------------------------------------------

@pytest.mark.parametrize("text,seconds", [("360", 360), ("360s", 360), ("6m", 360), ("6min", 360),
                                          ("1.5h", 5400), ("1h30m", 5400), (" 2m 30s ", 150)])
def test_a_budget_is_seconds_or_a_duration_with_a_unit(text, seconds):
    assert parse_budget(text) == seconds


@pytest.mark.parametrize("text", ["", "6x", "m", "1h30", "h1", "-5", "0", "six minutes"])
def test_a_bad_budget_is_refused_naming_it(text):
    with pytest.raises(ConfigError, match="BUDGET"):
        parse_budget(text)


@pytest.fixture
def no_overheads(monkeypatch):
    """The fixed parts at 0 s, so the planted cases alone price the study."""
    for name in ("STARTUP_S", "REPORT_S", "DIAGNOSE_PER_RUN_S", "ARCHIVE_S"):
        monkeypatch.setattr(sb, name, 0.0)
    monkeypatch.setattr(sb, "CHECKPOINT_RATE", 1e9)


def _cases(step_s=0.01, setup_s=0.0, eval_s=0.0, params=0) -> list[sb.Case]:
    return [sb.Case(d, r, step_s, setup_s, eval_s, params) for d in sb.DEPTHS for r in sb.ALL]


def test_the_steps_per_run_are_what_the_budget_buys_at_the_planted_step_times(no_overheads):
    # three routers x 2 depths x 5 seeds x 10 ms = 0.3 s a step (+ 0.06 s: the study's own estimate
    # times one step of each): 361 s buy 1,200 steps, >= 1,000, so wav_v1 joins
    plan = sb.size_study(361, _cases(), spent_s=0.0)
    assert plan.routers == sb.ALL and plan.steps == 1200 and plan.seeds == 5
    assert plan.total_s == pytest.approx(1200 * 0.3 + 6 * 0.01)
    # 201 s: three routers would get 660 steps, too few; two routers (0.2 s a step) get 1,000
    plan = sb.size_study(201, _cases(), spent_s=0.0)
    assert plan.three_router_steps == 660 and plan.routers == sb.PAIR and plan.steps == 1000
    assert plan.parts["steps"] == pytest.approx(5 * 1000 * 4 * 0.01)
    # what was spent comes off the budget: 60 s of 261
    assert sb.size_study(261, _cases(), spent_s=60.0).steps == 1000
    # rounded down to two significant digits: 246.8 s / 0.2 s = 1,234 steps -> 1,200
    assert sb.size_study(246.8, _cases(), spent_s=0.0).steps == 1200
    # capped at the full study; the rest of the budget is said to be unused
    plan = sb.size_study(10_000, _cases(), spent_s=0.0)
    assert plan.steps == sb.FULL_STEPS and "the full study" in plan.buys() and "unused" in plan.buys()


def test_too_small_a_budget_is_refused_naming_the_budget_that_would_do(no_overheads):
    assert sb.size_study(20.1, _cases(), spent_s=0.0).steps == 100  # 2 routers: 0.2 s a step
    with pytest.raises(ConfigError, match=r"BUDGET 19 s buys 94 steps per run, fewer than 100.*at least 1m"):
        sb.size_study(19, _cases(), spent_s=0.0)


def test_set_up_evaluations_and_checkpoints_are_priced(no_overheads):
    cases = _cases(step_s=0.01, setup_s=2.0, eval_s=0.5, params=10**8)
    short = sb.study_seconds(cases, sb.PAIR, 5, 500)  # evaluations at 0 and 500, final weights only
    assert short["set-up"] == pytest.approx(5 * 4 * 2.0)
    assert short["steps"] == pytest.approx(5 * 500 * 4 * 0.01)
    assert short["evaluations and checkpoints"] == pytest.approx(5 * 4 * (2 * 0.5 + 4 * 10**8 / 1e9))
    assert short["the study's own estimate"] == pytest.approx(4 * (2.0 + 0.5 + 0.01))
    long = sb.study_seconds(cases, sb.PAIR, 5, 2000)  # every 500 steps: 5 evaluations, 3 resume checkpoints
    assert long["evaluations and checkpoints"] == pytest.approx(5 * 4 * (5 * 0.5 + (3 * 16 + 4) * 10**8 / 1e9))
    assert (sb.eval_every(999), sb.eval_every(1000), sb.eval_every(2001)) == (999, 250, 501)
    assert (sb.warmup(250), sb.warmup(5000)) == (50, 200)


def test_the_plan_s_arguments_are_a_study_the_spec_accepts():
    plan = sb.size_study(360, sb.assumed_cases(), spent_s=30.0, measured=False)
    args = dict(zip(plan.args()[::2], plan.args()[1::2]))
    assert args["--backend"] == "cudagraph" and args["--precision"] == "bf16-mixed"
    assert json.loads(args["--router-options"]) == {r: {"impl": "two_phase"} for r in plan.routers}
    cli = {k[2:].replace("-", "_"): v for k, v in args.items() if k != "--quiet"}
    spec, labels = load(StudySpec, {**cli, "device": "cpu"})
    spec = spec.resolve(labels)
    assert spec.study.max_steps == plan.steps and spec.study.eval_every == plan.steps
    assert spec.train_config(48).backend == "cudagraph"
    assert spec.options_at(48)["haares"] == {"impl": "two_phase", "n_blocks": 4, "block_unit": "layer"}
    assert spec.budget_note() == budget_words(plan.steps, 5000, 32 * 256)
    assert "a smoke test" in spec.budget_note() and "not stated in our sources" in spec.budget_note()


def test_the_budget_sentence_says_smoke_test_or_shortened_study_and_how_far_from_the_full_one():
    assert budget_words(5000, 5000, 8192) is None
    small = budget_words(500, 5000, 8192)
    assert small.startswith("500 steps per run (4.1M tokens): a smoke test; the full study trains 5,000 "
                            "steps (41M tokens) per run, 10x more (the char-* presets' budget, ours")
    assert budget_words(2500, 5000, 8192).startswith("2,500 steps per run (20.5M tokens): a shortened study")


# --- study depth --backend ------------------------------------------------------------------------

def test_study_depth_takes_the_backend_of_train_into_every_run():
    spec, labels = load(StudySpec, {"scale": "tiny", "backend": "compile", "compile_scope": "layer",
                                    "device": "cpu"})
    tc = spec.resolve(labels).train_config(4)
    assert (tc.backend, tc.compile_scope) == ("compile", "layer")
    spec, labels = load(StudySpec, {"scale": "tiny", "backend": "compile", "device": "cpu"})
    assert spec.resolve(labels).train_config(4).compile_scope == "model"  # train's default
    spec, labels = load(StudySpec, {"scale": "tiny", "device": "cpu"})
    assert spec.resolve(labels).train_config(4).backend == "eager"
    spec, labels = load(StudySpec, {"scale": "tiny", "compile_scope": "layer", "device": "cpu"})
    with pytest.raises(ConfigError, match="--compile-scope has no effect without --backend compile"):
        spec.resolve(labels)


def test_the_dry_run_plan_shows_the_backend_and_says_cpu_cannot_run_it(tmp_path):
    res = CliRunner().invoke(main, ["study", "depth", "--routers", "block_attnres,haares", "--depths", "12,48",
                                    "--max-steps", "500", "--backend", "cudagraph", "--precision", "bf16-mixed",
                                    "--device", "cpu", "--out", str(tmp_path), "--dry-run"])
    assert res.exit_code == 0, res.output
    assert "backend cudagraph, bf16-mixed" in res.output  # the scale label
    assert "backend: cudagraph (forward, backward, clip and AdamW captured in one CUDA graph" in res.output
    assert "budget: 500 steps per run (4.1M tokens): a smoke test" in res.output
    assert "note: --backend cudagraph cannot run here" in res.output
    assert not list(tmp_path.iterdir())


@pytest.mark.skipif(not NO_CUDA, reason="a CUDA device is visible")
def test_a_cuda_only_backend_is_refused_on_cpu_in_one_line_before_any_work(tmp_path, no_models):
    res = CliRunner().invoke(main, ["study", "depth", "--scale", "tiny", "--backend", "cudagraph",
                                    "--out", str(tmp_path)])
    assert res.exit_code == 2
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("routerbench: error: --backend cudagraph: ")
    assert "no CUDA device" in lines[0]
    assert not list(tmp_path.iterdir())  # no run directory


# --- the report: the depth-trend figure with paired seed CIs, and the smoke-test sentence ---------

@pytest.fixture(scope="module")
def small_study(tmp_path_factory):
    """block_attnres and haares at depths 2 and 4, 2 seeds, 4 steps, eager on CPU, no report."""
    corpus = prepare_corpus_from_text(stdlib_text(200_000), tmp_path_factory.mktemp("corpus") / "c")
    out = tmp_path_factory.mktemp("study")
    n = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        res = CliRunner().invoke(main, ["study", "depth", "--scale", "tiny", "--routers", "block_attnres,haares",
                                        "--depths", "2,4", "--blocks", "2", "--seeds", "2", "--max-steps", "4",
                                        "--eval-every", "4", "--estimate-steps", "1", "--backend", "eager",
                                        "--device", "cpu", "--quiet", "--no-report", "--data", str(corpus.path),
                                        "--out", str(out), "--run-id", "s"])
    finally:
        torch.set_num_threads(n)
    assert res.exit_code == 0, res.output
    return next(out.glob("*/s")), res.output


def test_the_backend_reaches_the_manifest_and_every_run(small_study):
    from harness.rundir.records import load_rows
    run_dir, output = small_study
    assert "backend: eager" in output
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["backend"] == "eager" and manifest["full_max_steps"] == 200
    assert manifest["budget_note"] is None  # tiny: a plumbing smoke test already
    assert {r["backend"] for r in load_rows([run_dir]) if r.get("mode") == "study"} == {"eager"}


def test_the_depth_trend_figure_draws_the_paired_seed_intervals_and_the_report_says_smoke_test(small_study):
    from reports.study import depth_table, study_runs, write_study
    from harness.rundir.records import load_rows
    run_dir, _ = small_study
    manifest_path = run_dir / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    note = budget_words(4, 5000, 8192)
    manifest_path.write_text(json.dumps({**manifest, "budget_note": note}))
    paths, text = write_study(run_dir)
    assert f"Budget: {note}." in text and f"Budget: {note}." in (run_dir / "study.md").read_text()
    assert "gain_vs_depth.png" in paths and (run_dir / "gain_vs_depth.png").stat().st_size > 0
    fig = pd.read_csv(run_dir / "gain_vs_depth.csv")
    means = fig[fig["seed"] == "mean"].set_index("depth")
    runs = study_runs(load_rows([run_dir]))
    loss = runs.set_index(["router", "depth", "seed"])["loss"]
    for depth in (2, 4):  # the bars: router - block_attnres paired by seed, 95 % t-interval with n - 1 df
        d = np.array([loss[("haares", depth, s)] - loss[("block_attnres", depth, s)] for s in (0, 1)])
        half = st.t.ppf(0.975, 1) * d.std(ddof=1) / math.sqrt(2)
        assert means.loc[depth, "n_pairs"] == 2
        assert means.loc[depth, "delta"] == pytest.approx(d.mean())
        assert (means.loc[depth, "lo"], means.loc[depth, "hi"]) == pytest.approx((d.mean() - half, d.mean() + half))
    table = depth_table(runs, ["block_attnres", "haares"])
    assert set(table.loc[table["router"] == "haares", "n_pairs"]) == {2}


# --- the script's whole path on a CPU, with a stand-in for the GPU ---------------------------------

STUB = """#!/bin/bash
# CUDA "visible", and the probe and plan replaced by a tiny eager study's arguments; else Python.
if [ "$1" = "-c" ] && [[ "$2" == *"torch.cuda.is_available"* ]]; then exit 0; fi
if [ "$1" = "-m" ] && [ "$2" = "harness.cli.study_budget" ] && [[ " $* " == *" --probe "* ]]; then
  prev=""; for a in "$@"; do [ "$prev" = "--args-file" ] && args_file=$a; prev=$a; done
  printf '%s\\n' --scale tiny --routers block_attnres,haares --depths 2,4 --blocks 2 --seeds 2 \\
    --max-steps 4 --eval-every 4 --estimate-steps 1 --device cpu --quiet --data "$STUB_DATA" > "$args_file"
  echo '{"stub": true}' > "$(dirname "$args_file")/plan.json"
  exit 0
fi
exec "$STUB_PYTHON" "$@"
"""


@pytest.mark.skipif(shutil.which("timeout") is None or shutil.which("tar") is None, reason="needs timeout, tar")
def test_the_script_runs_the_study_prints_table_and_figure_and_writes_one_archive(tmp_path):
    corpus = prepare_corpus_from_text(stdlib_text(200_000), tmp_path / "c")
    stub = tmp_path / "python"
    stub.write_text(STUB)
    stub.chmod(0o755)
    env = {**os.environ, "PYTHON": str(stub), "STUB_PYTHON": sys.executable, "STUB_DATA": str(corpus.path)}
    res = subprocess.run(["bash", str(SCRIPT), "5m", "--out", str(tmp_path / "out")], capture_output=True,
                         text=True, timeout=300, env=env, cwd=ROOT)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    out = res.stdout
    tail = out[out.index("== result"):]
    assert "## Loss at the token budget" in tail and "| haares " in tail
    fig = re.search(r"figure \(depth trend: .*paired by seed, 95% t-interval bars\): (\S+gain_vs_depth\.png)", tail)
    assert fig and Path(fig.group(1)).is_file()
    archives = list((tmp_path / "out").glob("gpu-study-*.tar.gz"))
    assert len(archives) == 1 and f"archive: {archives[0]}" in tail
    import tarfile
    with tarfile.open(archives[0]) as tar:
        names = tar.getnames()
    tag = archives[0].name[:-len(".tar.gz")]
    assert f"{tag}/gain_vs_depth.png" in names and f"{tag}/study.md" in names
    assert f"{tag}/gpu_study/plan.json" in names and f"{tag}/gpu_study/gpu_study.log" in names
    assert not any("/checkpoints" in n for n in names)
