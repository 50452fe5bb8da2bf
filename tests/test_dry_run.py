"""The plan before the work: ``run``, ``train`` and ``study depth`` print cases, groups, models to
compile, a time range and the peak memory before any model is built; ``--dry-run`` prints it and
exits 0 building nothing and creating no run directory; the estimate's arithmetic; its
calibration on earlier manifests; the manifest's plan and actual time."""

from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner
from paths import SHAKESPEARE

from harness.cli import main
from harness.costs import forecast as fc
from harness.rundir.environment import device_slug
from harness.sweep.forecast import forecast_sweep, group_timing
from harness.sweep.options import SweepOptions
from harness.timing.timer import TimingPolicy
from workloads.decoder import Decoder

PLAN_LINES = ("plan: ", "estimate: ", "peak memory (estimate): ", "dry run: no model built")


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture
def no_model(monkeypatch, tmp_path):
    """Building a decoder fails the test; the working directory is empty (no ``results/``)."""
    def boom(self, *a, **k):
        raise AssertionError("a Decoder was built during a dry run")
    monkeypatch.setattr(Decoder, "__init__", boom)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _plan(output: str) -> list[str]:
    for line in PLAN_LINES:
        assert line in output, output
    return output.splitlines()


def test_run_dry_run_of_the_default_suite_builds_nothing(no_model):
    res = invoke("run", "--dry-run")
    assert res.exit_code == 0, res.output
    lines = _plan(res.output)
    head = next(ln for ln in lines if ln.startswith("plan: "))
    assert re.match(r"plan: \d+ cost cases in \d+ groups \(paired\), \d+ models to compile; smoke race: "
                    r"2 runs x 300 steps$", head), head
    assert "uncalibrated: documented constants; timing: 10 rounds per group" in res.output
    assert re.search(r"set-up .*\(compile \d+ models: .*\), timing .*, race .*, report ", res.output)
    assert not (no_model / "results").exists()


def test_train_dry_run_builds_nothing(no_model):
    res = invoke("train", "--dry-run")
    assert res.exit_code == 0, res.output
    lines = _plan(res.output)
    assert lines[0].startswith("plan: 9 training runs (3 routers x 3 seeds) and a prenorm pilot to step ")
    assert "at most 300 steps a run" in res.output and "evaluations " in res.output
    assert not (no_model / "results").exists()


def test_study_depth_dry_run_builds_nothing(no_model):
    # the default routers: prenorm, rezero, layerscale, block_attnres, haares, wav_v1, mhc
    for scale, runs in (("char", "63 study runs (7 routers x 3 depths x 3 seeds)"),
                        ("tiny", "21 study runs (7 routers x 3 depths x 1 seed)")):
        res = invoke("study", "depth", "--dry-run", "--scale", scale)
        assert res.exit_code == 0, res.output
        _plan(res.output)
        assert f"plan: {runs}" in res.output and "timed estimate " in res.output
    assert not (no_model / "results").exists()


@pytest.mark.skipif(not SHAKESPEARE.exists(), reason=f"real text absent: {SHAKESPEARE}")
def test_study_dry_run_reads_the_corpus_it_is_given(tmp_path, monkeypatch):
    text = tmp_path / "slice.txt"
    text.write_text(SHAKESPEARE.read_text()[:30_000])
    assert invoke("data", "prepare", "--text", text, "--out", tmp_path / "c").exit_code == 0
    monkeypatch.setattr(Decoder, "__init__", lambda self, *a, **k: pytest.fail("a Decoder was built"))
    res = invoke("study", "depth", "--dry-run", "--scale", "tiny", "--data", tmp_path / "c",
                 "--out", tmp_path / "res")
    assert res.exit_code == 0, res.output
    _plan(res.output)
    assert not (tmp_path / "res").exists()


def test_dry_run_is_no_option_of_the_spec_file(no_model):
    res = invoke("run", "--dry-run", "--routers", "prenorm", "--no-train", "--widths", "16", "--depths", "2")
    assert res.exit_code == 0, res.output
    from harness.spec import RunSpec
    from harness.spec.base import leaves
    assert "dry_run" not in {name for _, name, _ in leaves(RunSpec)}


# --- the estimate's arithmetic ----------------------------------------------------------------

SMALL = ("--suite", "full", "--routers", "prenorm,haares", "--widths", "16,32", "--depths", "2", "--impls", "naive",
         "--no-train")


def test_case_group_and_compile_counts(no_model):
    # eager: 2 routers x 2 widths x 2 modes = 8; compile at the smallest shape, fwd_bwd: 2 more,
    # grouped with that shape's eager fwd_bwd cases: 4 groups
    res = invoke("run", "--dry-run", *SMALL, "--no-report")
    assert res.exit_code == 0, res.output
    assert res.output.splitlines()[0] == "plan: 10 cost cases in 4 groups (paired), 2 models to compile"
    assert "report" not in res.output.splitlines()[2]
    res = invoke("run", "--dry-run", *SMALL, "--no-paired", "--backends", "eager")
    assert res.output.splitlines()[0] == "plan: 8 cost cases in 8 units (unpaired: one case each), 0 models to compile"


def _cases(*args):
    from harness.cli.common import load_spec
    from harness.spec import RunSpec
    cli = {}
    it = iter(args)
    for flag in it:
        cli[flag[2:].replace("-", "_")] = next(it)
    spec, _ = load_spec(RunSpec, cli, None)
    return spec.cases()


def test_fixed_rounds_and_the_remeasure_budget():
    opts = SweepOptions(timing=TimingPolicy(repeats=10), remeasure_s=60.0, max_attempts=3)
    lo, hi = group_timing((0.01, 0.1), opts)
    assert lo == pytest.approx(11 * 0.01)  # 10 rounds + the untimed interleaved one
    assert hi == pytest.approx(11 * 0.1 + min(60, 2 * 11 * 0.1))
    assert group_timing((1.0, 10.0), opts)[1] == pytest.approx(110 + 60)  # re-measuring: at most 60 s
    assert group_timing((1.0, 10.0), SweepOptions(remeasure_s=60.0, max_attempts=1))[1] == pytest.approx(110)


def test_with_a_precision_target_the_high_end_is_the_group_budget():
    opts = SweepOptions(precision_target=0.03, group_budget_s=30.0, min_pairs=10, max_rounds=400,
                        remeasure_s=0.0)
    assert group_timing((0.1, 1.0), opts) == pytest.approx((11 * 0.1, 30.0))
    # max_rounds bounds it when fewer rounds than the budget allows
    assert group_timing((0.001, 0.01), opts)[1] == pytest.approx(401 * 0.01)
    # through the sweep: every group's timing ends at its budget
    cases = _cases("--routers", "prenorm,haares", "--widths", "256", "--depths", "8", "--impls", "naive",
                   "--seq-len", "256", "--batch-size", "8", "--backends", "eager", "--modes", "fwd,fwd_bwd",
                   "--precision-target", "0.03", "--group-budget-s", "30", "--remeasure-s", "0")
    sw = forecast_sweep(cases, opts)
    assert sw.units == [2, 2] and sw.parts["timing"][1] == pytest.approx(2 * 30.0)


def test_peak_memory_is_the_largest_groups_estimate():
    from harness.sweep.plan import case_bytes, sweep_units
    cases = _cases("--routers", "prenorm,haares", "--widths", "16,32", "--depths", "2", "--impls", "naive",
                   "--backends", "eager")
    sw = forecast_sweep(cases, SweepOptions())
    sizes = [sum(case_bytes(c) for c in u) for u in sweep_units(cases)]
    assert sw.peak_bytes == max(sizes) and sw.peak_cases == 2
    assert sw.compiled == 0 and sw.parts["compile"] == (0.0, 0.0)


def test_compile_grows_with_depth_and_a_warm_cache_is_the_low_end():
    from workloads.config import PRESETS
    cfg = PRESETS["cpu-quick"]
    shallow = fc.compile_seconds(cfg, "prenorm", {}, "model", "fwd_bwd")
    deep = fc.compile_seconds(cfg.replace(n_layers=12), "prenorm", {}, "model", "fwd_bwd")
    block = fc.compile_seconds(cfg, "wav_v1", {"impl": "two_phase"}, "model", "fwd_bwd")
    assert shallow[1] < deep[1] and shallow[1] < block[1]
    assert shallow[0] == pytest.approx(shallow[1] * fc.WARM_COMPILE / fc.LOADED_MACHINE)
    layer = [fc.compile_seconds(cfg.replace(n_layers=L), "haares", {"impl": "two_phase"}, "layer", "fwd_bwd")
             for L in (12, 24)]
    assert layer[0] == layer[1]  # the layer scope's regions do not grow with depth


# --- calibration ------------------------------------------------------------------------------

def _manifest(root, run_id, command, estimate, actual=None, resumed=False, pressure=None):
    session = {"plan": {"uncalibrated_s": estimate, "estimate_s": estimate, "resumed": resumed},
               "cpu_pressure_start": pressure}
    if actual is not None:
        session["actual_s"] = actual
    d = root / run_id
    d.mkdir(parents=True)
    (d / "manifest.json").write_text(json.dumps({"command": command, "run_id": run_id, "sessions": [session],
                                                 **session}))


def test_calibration_is_the_median_ratio_of_earlier_runs(tmp_path):
    _manifest(tmp_path, "a", "run", [10, 40], actual=30)      # geometric mean 20: x1.5
    _manifest(tmp_path, "b", "run", [100, 400], actual=200)   # 200: x1.0
    _manifest(tmp_path, "c", "run", [10, 40])                 # interrupted: no actual time
    _manifest(tmp_path, "d", "run", [10, 40], actual=5, resumed=True)
    _manifest(tmp_path, "e", "train", [10, 40], actual=80)    # another command: x4
    cal = fc.calibration(fc.read_manifests(tmp_path), "run")
    assert cal["factor"] == pytest.approx(1.25) and cal["runs"] == 2 and sorted(cal["run_ids"]) == ["a", "b"]
    assert fc.describe_calibration(cal) == "calibrated on 2 earlier runs on this device: ×1.25"
    other = fc.calibration(fc.read_manifests(tmp_path), "study depth")  # none of its own: all of them
    assert other["runs"] == 3 and other["factor"] == pytest.approx(1.5)
    assert fc.calibration([], "run") is None
    assert fc.describe_calibration(None) == "uncalibrated: documented constants"


def test_runs_begun_on_a_busy_machine_do_not_calibrate(tmp_path):
    """A run whose first session began above cpu_pressure_max (its manifest's
    cpu_pressure_start) says more of the load than of the work: it is left out, and counted."""
    _manifest(tmp_path, "quiet", "run", [10, 40], actual=30, pressure=0.05)   # x1.5
    _manifest(tmp_path, "busy", "run", [10, 40], actual=130, pressure=0.52)   # x6.5, left out
    _manifest(tmp_path, "edge", "run", [100, 400], actual=200, pressure=0.20)  # at the threshold: x1.0
    cal = fc.calibration(fc.read_manifests(tmp_path), "run")
    assert sorted(cal["run_ids"]) == ["edge", "quiet"] and cal["factor"] == pytest.approx(1.25)
    assert fc.describe_calibration(cal) == ("calibrated on 2 earlier runs on this device: ×1.25; "
                                            "1 begun on a busy machine left out")
    only = tmp_path / "only"
    only.mkdir()
    _manifest(only, "busy", "train", [10, 40], actual=130, pressure=0.9)
    cal = fc.calibration(fc.read_manifests(only), "run")
    assert cal["factor"] == 1.0 and cal["runs"] == 0
    assert fc.describe_calibration(cal) == "uncalibrated: documented constants; 1 begun on a busy machine left out"


def test_the_plan_scales_by_the_calibration_of_this_device(no_model):
    import torch
    root = no_model / "res"
    dev = root / device_slug(torch.device("cpu"))
    _manifest(dev, "a", "run", [10, 40], actual=40)  # x2
    args = ("run", "--dry-run", *SMALL, "--no-report")
    plain = invoke(*args).output
    calibrated = invoke(*args, "--out", root).output
    assert "calibrated on 1 earlier run on this device: ×2" in calibrated
    assert "uncalibrated" in plain


# --- the manifest keeps the estimate beside the actual time -----------------------------------

@pytest.mark.slow
def test_manifest_holds_the_plan_and_the_actual_time(tmp_path, monkeypatch):
    from harness.timing import noise  # a quiet start, whatever the machine: a busy one calibrates nothing
    quiet = tmp_path / "pressure"
    quiet.write_text("some avg10=1.00 avg60=1.00 avg300=1.00 total=1\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")
    monkeypatch.setattr(noise, "PRESSURE_FILE", quiet)
    small = [("16" if a == "16,32" else a) for a in SMALL]  # one width
    args = ["run", *small, "--backends", "eager", "--repeats", "2", "--max-attempts", "1",
            "--warmup-s", "0", "--no-report", "--quiet", "--out", tmp_path]
    res = invoke(*args, "--run-id", "r1")
    assert res.exit_code == 0, res.output
    assert "plan: 4 cost cases in 2 groups (paired), 0 models to compile" in res.output
    m = json.loads(next(tmp_path.glob("*/r1/manifest.json")).read_text())
    plan = m["plan"]
    assert plan["resumed"] is False and len(plan["estimate_s"]) == 2
    assert plan["estimate_s"][0] <= plan["estimate_s"][1]
    assert set(plan["parts"]) == {"setup", "compile", "timing"} and plan["calibration"] is None
    assert m["actual_s"] > 0 and m["sessions"][0]["actual_s"] == m["actual_s"]
    assert m["sessions"][0]["cpu_pressure_start"] == pytest.approx(0.01)
    res = invoke(*args, "--run-id", "r2")  # the next run calibrates on the first
    assert "calibrated on 1 earlier run on this device" in res.output
    m2 = json.loads(next(tmp_path.glob("*/r2/manifest.json")).read_text())
    assert m2["plan"]["calibration"]["run_ids"] == ["r1"]


def test_a_plan_above_the_free_memory_is_refused_before_any_work(tmp_path):
    """8.7 TB by estimate on any machine: one line, exit 2, nothing written, the options to lower."""
    res = CliRunner().invoke(main, ["run", "--dry-run", "--depths", "2048", "--widths", "4096", "--routers",
                                    "prenorm", "--no-train", "--out", str(tmp_path)])
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("routerbench: error: this plan needs "), res.output
    assert "GiB by estimate" in lines[0] and "free: lower --widths, --depths, --batch-size or --seq-len" in lines[0]
    assert not list(tmp_path.iterdir())


def test_check_memory_compares_the_peak_with_the_free_bytes():
    import torch

    from harness.cli.forecast import Plan
    from routers.errors import ConfigError
    plan = Plan("run", "plan", {}, [], "", peak_bytes=3 * 2**30, peak_what="group 1: 2 cases resident")
    assert plan.check_memory(torch.device("cpu"), "--widths", free=4 * 2**30) is None  # fits: nothing said
    warn = plan.check_memory(torch.device("cpu"), "--widths", free=2 * 2**30)  # within the estimate's slack
    assert warn.startswith("warning: this plan needs 3.0 GiB by estimate (group 1: 2 cases resident) and cpu "
                           "has 2.0 GiB free; the estimate is soft (within 2x)")
    with pytest.raises(ConfigError, match=r"needs 3\.0 GiB by estimate \(group 1: 2 cases resident\) and cpu "
                                          r"has 1\.0 GiB free: lower --widths"):
        plan.check_memory(torch.device("cpu"), "--widths", free=2**30)


def test_a_busy_machine_widens_the_plans_high_end_by_its_load(no_model, tmp_path, monkeypatch):
    """Planted readings: CPU pressure 90 % (a load average of 2.0 on 4 CPUs, which no longer
    decides, and no CPU held by other work) make the high end 1 + max(0.9, 0 / 4) times the quiet
    plan's, said in the estimate line and kept in the manifest's plan; the low end stays (the
    load may lift)."""
    from harness.timing import noise
    args = ("run", "--dry-run", *SMALL, "--no-report")
    psi, loadavg = tmp_path / "pressure", tmp_path / "loadavg"
    monkeypatch.setattr(noise, "PRESSURE_FILE", psi)
    monkeypatch.setattr(noise, "LOADAVG_FILE", loadavg)
    monkeypatch.setattr(noise, "cpu_count", lambda: 4)
    loadavg.write_text("0.20 0.50 0.80 1/200 12345\n")
    psi.write_text("some avg10=5.00 avg60=5.00 avg300=5.00 total=1\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")
    quiet = invoke(*args).output
    loadavg.write_text("2.00 1.50 0.80 3/200 12345\n")
    psi.write_text("some avg10=90.00 avg60=80.00 avg300=40.00 total=1\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")
    busy = invoke(*args).output
    factor = 1 + max(0.9, 0.0 / 4)
    assert "busy now" not in quiet
    assert (f"busy now: the high end allows ×{factor:.2f} for the load (other work holds 0.0 of 4 CPUs, "
            "CPU pressure 90 %)") in busy

    def span(text):
        line = next(x for x in text.splitlines() if x.startswith("estimate: "))
        return line.split("estimate: ")[1].split(" (")[0]
    assert span(quiet) != span(busy)
    from harness.cli.forecast import Plan
    plan = Plan("run", "plan: …", {"setup": (10.0, 40.0)}, [("set-up", ("setup",), None)], "note", 0, "-",
                calibration={"factor": 1.5, "runs": 1, "command": "run", "run_ids": ["a"], "busy": 0})
    assert plan.estimate == (15.0, 60.0)
    plan.load = {"factor": factor, "pressure": 0.9, "load_avg": 2.0, "cpus": 4}
    assert plan.estimate == (15.0, pytest.approx(60.0 * factor)) == plan.span(("setup",))
    assert plan.manifest()["load"]["factor"] == factor and plan.manifest()["uncalibrated_s"] == [10.0, 40.0]


def test_dry_run_lists_the_cases_this_machine_will_skip(no_model):
    """Cases the plan holds but this device cannot run (cudagraph, reduce-overhead without CUDA)
    are listed by reason with their count before any work; they are not counted as compiled."""
    import torch
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: nothing is skipped")
    res = invoke("run", "--dry-run", "--routers", "prenorm,haares", "--backends", "eager,cudagraph,compile",
                 "--compile-modes", "default,reduce-overhead", "--depths", "2", "--widths", "16", "--no-train")
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert "plan: 8 cost cases in 2 groups (paired) and 2 single cases, 2 models to compile" in lines[0], lines[0]
    assert ("skipped here (2 cases): cudagraph captures CUDA work: no CUDA device here: prenorm naive cudagraph "
            "d=16 L=2, haares two_phase cudagraph d=16 L=2") in lines
    assert any(ln.startswith("skipped here (2 cases): compile mode reduce-overhead uses CUDA graphs") for ln in lines)
    quiet = invoke("run", "--dry-run", "--routers", "prenorm", "--backends", "eager", "--no-train")
    assert "skipped here: none (every planned case can run on this device)" in quiet.output.splitlines()


def test_dry_run_checks_that_out_can_take_what_the_plan_writes(no_model, monkeypatch):
    """--out is checked before any work, a dry run included, and nothing is created: a path under
    a file, a directory this user cannot write, and a disk with less free space than the plan's
    records and checkpoints each stop the command with one line naming --out."""
    import os
    import shutil
    from collections import namedtuple
    f = no_model / "file"
    f.write_text("x")
    res = invoke("run", "--dry-run", "--out", f / "results")
    assert res.exit_code == 2 and f"--out {f / 'results'}: {f} is a file, not a directory" in res.output
    res = invoke("run", "--dry-run", "--out", no_model / "a" / "b")
    assert res.exit_code == 0 and "disk: at most" in res.output and not (no_model / "a").exists()
    monkeypatch.setattr(os, "access", lambda path, mode: False)
    res = invoke("run", "--dry-run", "--out", no_model / "ro")
    assert res.exit_code == 2 and "is not writable here; give --out a writable directory" in res.output
    monkeypatch.undo()
    monkeypatch.chdir(no_model)
    monkeypatch.setattr(Decoder, "__init__", lambda *a, **k: (_ for _ in ()).throw(AssertionError("built")))
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(10 * 2**20, 10 * 2**20 - 1024, 1024))
    res = invoke("run", "--dry-run")
    assert res.exit_code == 2, res.output
    assert re.search(r"--out .*results: 0 MiB free on its disk and this plan writes about \d+ MiB \(records, "
                     r"checkpoints\); free some space or give --out a directory on another disk", res.output)
