"""``routerbench gate``: verdicts on paired ratios of synthetic runs (no timing), a planted slowdown
in a real tiny run, the baseline, bad input and exit statuses."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from harness.ci import gate
from harness.ci.rules import load_rules
from harness.cli import main
from harness.cli.gate import resolve
from harness.rundir import faults
from harness.rundir.writer import RunWriter
from harness.stats.bootstrap import bootstrap_ratio_of_ratios
from reports.frame import load_frame

ROOT = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "harness.cli"]
CPU = "AMD EPYC 7B13"
SHAPE = dict(workload="decoder", d_model=32, n_layers=2, n_heads=2, seq_len=16, batch_size=2,
             dtype="float32", seed=0)


def write_run(root: Path, run_id: str, series: dict, device_name: str = CPU, mode: str = "fwd",
              readings: dict | None = None) -> Path:
    """A run directory with one paired group: ``series`` maps (router, backend) -> step times in ms,
    index i being round i; ``readings`` maps (router, backend) -> noise readings of that case."""
    d = root / run_id
    keys = {(r, b): f"{r}|{b}|{mode}" for r, b in series}
    with RunWriter(d, run_id, "s1", base={"device": "cpu"}) as w:
        with w.unit(keys.values(), kind="group") as u:
            for (router, backend), times in series.items():
                for i, t in enumerate(times):
                    u.write(case_key=keys[router, backend], router=router, router_options={},
                            impl="naive", backend=backend,
                            compile_mode="default" if backend == "compile" else None, mode=mode,
                            **SHAPE, metric="step_time", value=float(t), unit="ms", repeat=i, pair=i)
                for metric, value in (readings or {}).get((router, backend), {}).items():
                    u.write(case_key=keys[router, backend], router=router, router_options={},
                            impl="naive", backend=backend,
                            compile_mode="default" if backend == "compile" else None, mode=mode,
                            **SHAPE, metric=metric, value=float(value), unit="ratio")
    manifest = {"run_id": run_id, "environment": {"device": "cpu", "device_name": device_name}}
    (d / "manifest.json").write_text(json.dumps(manifest))
    return d


def noisy_pairs(ratio: float, rel_iqr: float, n: int = 20, seed: int = 0, base_ms: float = 10.0):
    """prenorm and router times of ``n`` rounds: each time lognormal around its true value with
    IQR/median ``rel_iqr`` (IQR/median of a lognormal is 2·sinh(0.6745·σ))."""
    sigma = math.asinh(rel_iqr / 2) / 0.6745
    rng = np.random.default_rng(seed)
    return (base_ms * np.exp(rng.normal(0, sigma, n)), ratio * base_ms * np.exp(rng.normal(0, sigma, n)))


def rules_file(tmp_path: Path, text: str, name: str = "rules.toml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


OVERHEAD = '[[rule]]\nname = "overhead"\nmetric = "overhead_vs_prenorm"\nmax_pct = {pct}\n'
GROWTH = '[[rule]]\nname = "growth"\nmetric = "overhead_growth"\nmax_pct = {pct}\n'


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def one_verdict(run: Path, rules: Path) -> dict:
    table = gate.evaluate(load_rules(rules), load_frame([run]))
    assert len(table) == 1, table
    return table.iloc[0].to_dict()


# --- verdicts -------------------------------------------------------------------------------------

def test_true_ratio_one_never_fails_under_heavy_noise(tmp_path):
    rules = rules_file(tmp_path, OVERHEAD.format(pct=10))
    seen = set()
    for seed in range(20):
        pre, router = noisy_pairs(1.0, 0.5, seed=seed)
        sample = router / pre
        run = write_run(tmp_path, f"s{seed}", {("prenorm", "eager"): pre, ("rezero", "eager"): router})
        r = one_verdict(run, rules)
        seen.add(r["verdict"])
        assert r["verdict"] in ("pass", "inconclusive"), (seed, r)
        assert r["ratio"] == pytest.approx(np.median(sample))
    assert "inconclusive" in seen  # at this noise the CI is wide: no silent pass


def test_clear_slowdown_fails_and_clear_equality_passes(tmp_path):
    rules = rules_file(tmp_path, OVERHEAD.format(pct=10))
    pre, router = noisy_pairs(2.0, 0.05, seed=1)
    r = one_verdict(write_run(tmp_path, "slow", {("prenorm", "eager"): pre, ("rezero", "eager"): router}), rules)
    assert r["verdict"] == "fail" and r["lo"] > 1.1 and r["ratio"] == pytest.approx(2.0, rel=0.1)
    pre, router = noisy_pairs(1.0, 0.01, seed=2)
    r = one_verdict(write_run(tmp_path, "same", {("prenorm", "eager"): pre, ("rezero", "eager"): router}), rules)
    assert r["verdict"] == "pass" and r["hi"] <= 1.1


def test_cli_fail_names_rule_and_case_and_writes_markdown(tmp_path):
    pre, router = noisy_pairs(2.0, 0.05, seed=3)
    compiled = pre * 0.7
    run = write_run(tmp_path, "r", {("prenorm", "eager"): pre, ("haares", "eager"): router,
                                    ("prenorm", "compile"): compiled})
    rules = rules_file(tmp_path, OVERHEAD.format(pct=25) + '[[rule]]\nmetric = "compile_vs_eager"\nmax_pct = 10\n')
    md = tmp_path / "summary.md"
    res = invoke("gate", run, "--rules", rules, "--markdown", md)
    assert res.exit_code == 1, res.output
    fails = [ln for ln in res.stdout.splitlines() if ln.startswith("FAIL ")]
    assert len(fails) == 1 and fails[0].startswith("FAIL overhead: haares [naive] · eager · fwd · d32 L2 T16 B2: ratio 2.")
    assert "> limit 1.25" in fails[0] and "(CI " in fails[0]
    assert "compile_vs_eager" in res.stdout and "prenorm [naive] · compile:default" in res.stdout
    assert "2 check(s): 1 pass, 1 fail, 0 inconclusive -> exit 1" in res.stdout.splitlines()[-1]
    text = md.read_text()
    assert "| rule " in text and "| overhead " in text and "| fail " in text and "|---" in text


def test_exit_3_on_inconclusive_only_and_strict_makes_it_1(tmp_path):
    pre, router = noisy_pairs(1.0, 0.01, n=4)  # 4 pairs: no CI
    run = write_run(tmp_path, "r", {("prenorm", "eager"): pre, ("rezero", "eager"): router})
    rules = rules_file(tmp_path, OVERHEAD.format(pct=10) + '[[rule]]\nmetric = "cudagraph_vs_eager"\nmax_pct = 10\n')
    res = invoke("gate", run, "--rules", rules)
    assert res.exit_code == 3, res.output
    assert "no CI: 4 pair(s), 5 needed" in res.stdout and "no case matched" in res.stdout
    assert "0 pass, 0 fail, 2 inconclusive" in res.stdout
    assert invoke("gate", run, "--rules", rules, "--strict").exit_code == 1
    pre, router = noisy_pairs(1.0, 0.01, n=10)
    run = write_run(tmp_path, "ok", {("prenorm", "eager"): pre, ("rezero", "eager"): router})
    assert invoke("gate", run, "--rules", rules_file(tmp_path, OVERHEAD.format(pct=10), "one.toml"),
                  "--strict").exit_code == 0


# --- baseline -------------------------------------------------------------------------------------

def test_ratio_of_ratios():
    a1, a2 = [10.0] * 6, [8.0, 9.0, 10.0, 11.0, 12.0]
    g, lo, hi = bootstrap_ratio_of_ratios(a1, [15.0] * 6, a2, [1.2 * x for x in a2])
    assert (g, lo, hi) == pytest.approx((1.25, 1.25, 1.25))
    g, lo, hi = bootstrap_ratio_of_ratios(a1[:4], [15.0] * 4, a2, a2)
    assert g == pytest.approx(1.5) and math.isnan(lo) and math.isnan(hi)
    with pytest.raises(ValueError, match="second run"):
        bootstrap_ratio_of_ratios(a1, a1, [1.0], [])


def test_growth_against_baseline(tmp_path):
    pre, noise = noisy_pairs(1.0, 0.02, seed=4)
    base = write_run(tmp_path / "baseline", "b", {("prenorm", "eager"): pre, ("haares", "eager"): pre * 1.2})
    now = write_run(tmp_path / "now", "n", {("prenorm", "eager"): pre, ("haares", "eager"): pre * 1.5 * noise / noise.mean()})
    t = gate.evaluate(load_rules(rules_file(tmp_path, GROWTH.format(pct=10))),
                      load_frame([now]), load_frame([base]))
    assert len(t) == 1 and t.iloc[0]["verdict"] == "fail"
    assert t.iloc[0]["ratio"] == pytest.approx(1.25, rel=0.02)
    res = invoke("gate", now, "--rules", rules_file(tmp_path, GROWTH.format(pct=10)),
                 "--baseline", tmp_path / "baseline")
    assert res.exit_code == 1 and "FAIL growth: haares [naive] · eager" in res.stdout
    res = invoke("gate", now, "--rules", rules_file(tmp_path, GROWTH.format(pct=30)),
                 "--baseline", tmp_path / "baseline")
    assert res.exit_code == 0, res.output


def test_baseline_of_another_device_is_refused(tmp_path):
    pre, _ = noisy_pairs(1.0, 0.02)
    write_run(tmp_path / "baseline", "b", {("prenorm", "eager"): pre, ("haares", "eager"): pre}, device_name="Intel Xeon")
    now = write_run(tmp_path / "now", "n", {("prenorm", "eager"): pre, ("haares", "eager"): pre})
    res = invoke("gate", now, "--rules", rules_file(tmp_path, GROWTH.format(pct=10)), "--baseline", tmp_path / "baseline")
    assert res.exit_code == 2 and res.stdout == ""
    err = res.stderr.strip()
    assert err.count("\n") == 0 and "Intel Xeon" in err and CPU in err and str(tmp_path / "baseline") in err


def test_growth_rules_skipped_without_baseline_and_inconclusive_before_the_first(tmp_path):
    pre, _ = noisy_pairs(1.0, 0.01, seed=5)
    now = write_run(tmp_path / "now", "n", {("prenorm", "eager"): pre, ("haares", "eager"): pre})
    rules = rules_file(tmp_path, OVERHEAD.format(pct=10) + GROWTH.format(pct=10))
    res = invoke("gate", now, "--rules", rules)  # one rules file serves runs with and without a baseline
    assert res.exit_code == 0, res.output
    assert "needs --baseline DIR" in res.stdout and "1 pass, 0 fail, 0 inconclusive, 1 skipped" in res.stdout
    res = invoke("gate", now, "--rules", rules, "--baseline", tmp_path / "none-yet")
    assert res.exit_code == 3 and "no baseline yet" in res.stdout
    assert not (tmp_path / "none-yet").exists()  # only --update-baseline writes it


def test_update_baseline_copies_results(tmp_path):
    pre, _ = noisy_pairs(1.0, 0.02)
    now = write_run(tmp_path / "now", "n", {("prenorm", "eager"): pre, ("haares", "eager"): pre})
    base = tmp_path / "baseline"
    rules = rules_file(tmp_path, GROWTH.format(pct=10))
    res = invoke("gate", now, "--rules", rules, "--baseline", base, "--update-baseline")
    assert res.exit_code == 3 and "no baseline yet" in res.stdout and "baseline updated" in res.stdout
    assert (base / "n" / "records.jsonl").read_bytes() == (now / "records.jsonl").read_bytes()
    res = invoke("gate", now, "--rules", rules, "--baseline", base)
    assert res.exit_code == 0 and "1.00" in res.stdout  # the same run: growth 1
    (base / "notes.txt").write_text("not a run")
    res = invoke("gate", now, "--rules", rules, "--baseline", base, "--update-baseline")
    assert res.exit_code == 2 and "notes.txt" in res.stderr and (base / "n").is_dir()


# --- bad input ------------------------------------------------------------------------------------

def test_the_project_rules_load():
    rules = load_rules(ROOT / ".ci" / "gate.toml")
    assert {r.metric for r in rules} == {"compile_vs_eager", "overhead_vs_prenorm", "overhead_growth"}
    assert all(r.limit > 1 for r in rules)


@pytest.mark.parametrize("text, field", [
    ("[[rule]\nmetric = 1", "not valid TOML"),
    ('title = "x"\n', "title: unknown top-level key"),
    ('[[rule]]\nmetric = "foo"\nmax_pct = 1\n', "rule[1].metric: unknown metric 'foo' (known: compile_vs_eager"),
    (OVERHEAD.format(pct=1) + '[[rule]]\nmetric = "overhead_vs_prenorm"\nmax_pct = 1\nrouters = ["nope"]\n',
     "rule[2].routers: unknown name 'nope'"),
    ('[[rule]]\nmetric = "compile_vs_eager"\nmax_pct = 1\nmax_pc = 2\n', "rule[1].max_pc: unknown key"),
    ('[[rule]]\nmetric = "compile_vs_eager"\nmax_pct = -5\n', "rule[1].max_pct: -5"),
    ('[[rule]]\nmetric = "compile_vs_eager"\n', "rule[1].max_pct: missing"),
    ('[[rule]]\nmetric = "compile_vs_eager"\nmax_pct = nan\n', "rule[1].max_pct: nan"),
    ('[[rule]]\nmetric = "compile_vs_eager"\nmax_pct = 5\nmodes = ["train"]\n', "rule[1].modes: unknown name 'train'"),
    ('[[rule]]\nmetric = "overhead_vs_prenorm"\nmax_pct = 5\nbackends = ["jit"]\n', "rule[1].backends: unknown name 'jit'"),
    ('[[rule]]\nmetric = "overhead_growth"\nmax_pct = 5\nrouters = ["prenorm"]\n', "rule[1].routers: prenorm is the reference"),
    ('[[rule]]\nmetric = "compile_vs_eager"\nmax_pct = 5\nbackends = ["eager"]\n', "rule[1].backends: compile_vs_eager takes no backends"),
    ('[[rule]]\nmetric = "compile_vs_eager"\nmax_pct = 5\nrouters = "haares"\n', "rule[1].routers: must be a non-empty list"),
])
def test_bad_rules_exit_2_with_one_line(tmp_path, text, field, no_models):
    rules = rules_file(tmp_path, text)
    res = invoke("gate", tmp_path / "does-not-matter", "--rules", rules)  # rules come first
    assert res.exit_code == 2 and res.stdout == ""
    assert res.stderr.count("\n") == 1 and res.stderr.startswith(f"routerbench: error: {rules}: ")
    assert field in res.stderr


def test_missing_rules_file(tmp_path):
    res = invoke("gate", tmp_path, "--rules", tmp_path / "none.toml")
    assert res.exit_code == 2 and "none.toml: cannot read the rules file" in res.stderr


def test_results_without_paired_ratios_exit_2(tmp_path):
    rules = rules_file(tmp_path, OVERHEAD.format(pct=10))
    (tmp_path / "empty").mkdir()
    res = invoke("gate", tmp_path / "empty", "--rules", rules)
    assert res.exit_code == 2 and res.stderr.count("\n") == 1 and "empty" in res.stderr
    d = tmp_path / "unpaired"
    with RunWriter(d, "u", "s1", base={"device": "cpu"}) as w, w.unit(["k"]) as u:
        u.write(case_key="k", router="prenorm", impl="naive", backend="eager", mode="fwd", **SHAPE,
                metric="step_time", value=1.0, unit="ms", repeat=0)
    res = invoke("gate", d, "--rules", rules)
    assert res.exit_code == 2 and res.stderr.count("\n") == 1
    assert str(d) in res.stderr and "no paired step times" in res.stderr


def test_paired_rows_without_any_ratio_exit_2(tmp_path):
    pre, _ = noisy_pairs(1.0, 0.02)
    run = write_run(tmp_path, "alone", {("rezero", "eager"): pre})  # no prenorm, no compiled step
    res = invoke("gate", run, "--rules", rules_file(tmp_path, OVERHEAD.format(pct=10)))
    assert res.exit_code == 2 and res.stderr.count("\n") == 1
    assert str(run) in res.stderr and "no paired ratio" in res.stderr


def test_runs_of_two_devices_exit_2(tmp_path):
    pre, _ = noisy_pairs(1.0, 0.02)
    a = write_run(tmp_path, "a", {("prenorm", "eager"): pre, ("rezero", "eager"): pre})
    b = write_run(tmp_path, "b", {("prenorm", "eager"): pre, ("rezero", "eager"): pre}, device_name="Intel Xeon")
    res = invoke("gate", a, b, "--rules", rules_file(tmp_path, OVERHEAD.format(pct=10)))
    assert res.exit_code == 2 and "several devices" in res.stderr and "Intel Xeon" in res.stderr


# --- a planted slowdown in a real run -------------------------------------------------------------

def test_planted_slowdown_fails_the_gate(tmp_path):
    """A 300 ms spin in every rezero step against a tiny prenorm step (about 1 ms on a quiet 2-core
    CPU, 200 ms seen under heavy load): a ratio far above the limit whatever the load. The busy-machine rule (its own test below) is switched off
    here so this test checks the rule's verdict and message only."""
    run = subprocess.run(
        CLI + ["run", "--routers", "prenorm,rezero", "--backends", "eager", "--modes", "fwd", "--impls", "naive",
               "--widths", "32", "--depths", "2", "--seq-len", "16", "--batch-size", "2", "--repeats", "6",
               "--warmup-s", "0", "--max-attempts", "1", "--no-train", "--no-report", "--no-flops", "--quiet",
               "--out", str(tmp_path), "--run-id", "slow"],
        capture_output=True, text=True, cwd=ROOT, timeout=300,
        env={**os.environ, faults.ENV: "slow=300:rezero|*"})
    assert run.returncode == 0, run.stderr
    rules = rules_file(tmp_path, OVERHEAD.format(pct=50))
    res = subprocess.run(CLI + ["gate", str(tmp_path), "--rules", str(rules), "--noise-thresholds",
                                '{"cpu_pressure_max": 1.0, "cpu_util_min": 0.0}'],
                         capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "FAIL overhead: rezero [naive] · eager · fwd · d32 L2 T16 B2: ratio" in res.stdout


def test_a_busy_machine_leaves_a_check_undecided_and_spread_is_only_noted(tmp_path):
    pre, rz = noisy_pairs(2.0, 0.02)
    busy = write_run(tmp_path, "busy", {("prenorm", "eager"): pre, ("rezero", "eager"): rz},
                     readings={("rezero", "eager"): {"cpu_pressure": 0.9, "cpu_util": 0.95}})
    v = one_verdict(busy, rules_file(tmp_path, OVERHEAD.format(pct=10)))
    assert v["verdict"] == "inconclusive"
    assert v["note"].startswith("busy machine, not decided (would be fail): cpu_pressure 0.900 > 0.2")
    # the same under thresholds that call it quiet: decided
    table = gate.evaluate(load_rules(rules_file(tmp_path, OVERHEAD.format(pct=10))), load_frame([busy]),
                          noise_thresholds={**gate_noise_defaults(), "cpu_pressure_max": 0.95})
    assert table.iloc[0]["verdict"] == "fail"
    spread = write_run(tmp_path, "spread", {("prenorm", "eager"): pre, ("rezero", "eager"): rz},
                       readings={("rezero", "eager"): {"iqr_rel": 0.5}})
    v = one_verdict(spread, rules_file(tmp_path, OVERHEAD.format(pct=10)))
    assert v["verdict"] == "fail" and "noisy: iqr_rel 0.500 > 0.15" in v["note"]


def gate_noise_defaults() -> dict:
    from harness.timing.noise import THRESHOLDS
    return dict(THRESHOLDS)


def test_a_failing_or_uncertain_run_never_becomes_the_baseline(tmp_path):
    pre, rz = noisy_pairs(1.0, 0.02)
    base = write_run(tmp_path / "r", "base", {("prenorm", "eager"): pre, ("rezero", "eager"): rz})
    bl = tmp_path / "bl"
    rules = rules_file(tmp_path, OVERHEAD.format(pct=50) + GROWTH.format(pct=10))
    res = invoke("gate", base, "--rules", rules, "--baseline", bl, "--update-baseline")
    assert res.exit_code == 3 and "baseline updated" in res.output  # the first: "no baseline yet"
    pre2, slow = noisy_pairs(1.5, 0.02, seed=1)
    worse = write_run(tmp_path / "w", "worse", {("prenorm", "eager"): pre2, ("rezero", "eager"): slow})
    res = invoke("gate", worse, "--rules", rules, "--baseline", bl, "--update-baseline")
    assert res.exit_code == 1 and "baseline not updated (1 check(s) failed)" in res.output
    assert [p.name for p in bl.iterdir()] == ["base"]
    busy = write_run(tmp_path / "b", "busy", {("prenorm", "eager"): pre, ("rezero", "eager"): rz},
                     readings={("rezero", "eager"): {"cpu_pressure": 0.9}})
    res = invoke("gate", busy, "--rules", rules, "--baseline", bl, "--update-baseline")
    assert res.exit_code == 3 and "baseline not updated (2 check(s) inconclusive" in res.output
    assert [p.name for p in bl.iterdir()] == ["base"]


def test_two_rules_of_one_name_exit_2(tmp_path):
    res = invoke("gate", tmp_path, "--rules", rules_file(tmp_path, OVERHEAD.format(pct=10) * 2))
    assert res.exit_code == 2 and "rule[2].name: 'overhead' names an earlier rule too" in res.stderr


def test_slow_fault_needs_its_delay():
    with pytest.raises(ValueError, match="slow needs its delay"):
        faults.parse("slow:rezero|*")
    assert faults.parse("slow=20:rezero|*") == [("slow", "rezero|*", 20)]


# --- pytest-benchmark JSON ------------------------------------------------------------------------

def test_bench_json_results_and_baseline(tmp_path):
    import torch

    from harness.ci.benchplugin import machine_info
    from harness.ci.pairbench import PairBench
    from harness.ci.suite import BenchPair
    from harness.sweep.cases import Case
    from harness.sweep.options import SweepOptions
    from harness.timing.timer import TimingPolicy
    from workloads.config import DecoderConfig
    tiny = DecoderConfig(d_model=32, n_layers=2, n_heads=2, seq_len=16, batch_size=2)
    pair = BenchPair("vs_prenorm", Case("prenorm", tiny, "fwd"), Case("rezero", tiny, "fwd"), 6)
    opts = SweepOptions(timing=TimingPolicy(warmup_min_count=1, warmup_min_s=0.0, repeats=6))
    with PairBench(pair, torch.device("cpu"), opts) as pb:
        for _ in range(pair.rounds):
            pb.round()
        info = pb.finish()
    path = tmp_path / "bench.json"
    path.write_text(json.dumps({"machine_info": machine_info(torch.device("cpu")), "version": "5.3.1",
                                "benchmarks": [{"name": f"test_pair[{pair.id}]", "group": pair.group,
                                                "extra_info": info}]}))
    rules = rules_file(tmp_path, OVERHEAD.format(pct=10_000) + GROWTH.format(pct=25))
    base = tmp_path / "baseline"
    quiet = ["--noise-thresholds", json.dumps({"cpu_pressure_max": 1.0, "cpu_util_min": 0.0})]  # real timing
    res = invoke("gate", path, "--rules", rules, "--baseline", base, "--update-baseline", *quiet)
    assert res.exit_code == 3, res.output  # the growth rule has no baseline yet
    assert "rezero [naive] · eager · fwd · d32 L2 T16 B2" in res.stdout and "no baseline yet" in res.stdout
    assert (base / "bench.json").read_bytes() == path.read_bytes() and not (tmp_path / "bench").exists()
    t = gate.evaluate(load_rules(rules), *(load_frame(resolve([p], tmp_path / n))
                                                for p, n in ((path, "a"), (base / "bench.json", "b"))))
    assert t.loc[t.metric == "overhead_growth", "ratio"].tolist() == [1.0]  # the same pairs
    res = invoke("gate", path, "--rules", rules, "--baseline", base)
    assert res.exit_code in (0, 3) and "overhead_growth" in res.stdout, res.output
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    res = invoke("gate", bad, "--rules", rules)
    assert res.exit_code == 2 and res.stderr.count("\n") == 1 and str(bad) in res.stderr
