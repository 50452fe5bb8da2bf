"""The pytest-benchmark suite's cases and their one measuring path (harness/ci/suite.py,
harness/ci/pairbench.py), and the conversion of its JSON into a run directory
(reports/benchjson.py). No timing decides a test:
times are only checked to be counted, paired and carried through unchanged."""

import contextlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from harness.ci.benchplugin import machine_info
from harness.ci.pairbench import PairBench
from harness.ci.suite import BenchPair, suite_pairs, suite_table
from harness.costs.flop_counter import count_flops_dispatch
from harness.rundir.writer import RunWriter
from harness.sweep import prepare
from harness.sweep.cases import Case
from harness.sweep.options import SweepOptions
from harness.sweep.prepare import build_model
from harness.sweep.run import run_sweep
from harness.timing.timer import TimingPolicy
from reports.benchjson import to_run_dir
from reports.frame import load_frame
from reports.paired import paired_ratio_table
from routers import ROUTERS, router_class
from routers.errors import ConfigError
from workloads.batches import synthetic_batch
from workloads.config import DecoderConfig

ROOT = Path(__file__).resolve().parents[1]
TINY = DecoderConfig(d_model=32, n_layers=2, n_heads=2, seq_len=16, batch_size=2)
QUICK = SweepOptions(timing=TimingPolicy(warmup_min_count=1, warmup_min_s=0.0, repeats=5),
                      max_attempts=1)  # a busy machine must not re-time the group: rows are counted
CPU = torch.device("cpu")


def test_cpu_suite_covers_every_router_eager_and_two_compiled():
    cases = suite_table("cpu")
    eager = {(c.router, c.impl, c.mode) for c in cases if c.backend == "eager"}
    want = {(r, i, m) for r in ROUTERS for i in router_class(r).impls for m in ("fwd", "fwd_bwd")}
    assert eager == want
    compiled = {(c.router, c.impl, c.mode) for c in cases if c.backend == "compile"}
    assert compiled == {("prenorm", "naive", "fwd_bwd"), ("haares", "two_phase", "fwd_bwd")}
    assert {c.cfg.d_model for c in cases} == {64} and not any(c.backend == "cudagraph" for c in cases)


def test_suite_pairs_are_router_vs_prenorm_or_backend_vs_eager():
    pairs = suite_pairs("cpu")
    ids = [p.id for p in pairs]
    assert len(ids) == len(set(ids))
    n_variants = sum(len(router_class(r).impls) for r in ROUTERS)
    # each non-prenorm variant vs prenorm in fwd and fwd_bwd eager, haares compiled vs prenorm
    # compiled, and the two compiled cases vs their eager selves
    assert sum(p.kind == "vs_prenorm" for p in pairs) == 2 * (n_variants - 1) + 1
    assert sum(p.kind == "vs_eager" for p in pairs) == 2
    for p in pairs:
        assert (p.a.cfg, p.a.mode) == (p.b.cfg, p.b.mode)
        if p.kind == "vs_prenorm":
            assert p.a.router == "prenorm" and p.a.backend == p.b.backend
        else:
            assert (p.a.router, p.a.impl, p.a.backend) == (p.b.router, p.b.impl, "eager")
    assert {p.group for p in pairs} == {"fwd-d64-L4-T64-B8-vs-prenorm", "fwd_bwd-d64-L4-T64-B8-vs-prenorm",
                                        "fwd_bwd-d64-L4-T64-B8-vs-eager"}
    assert all(p.group == f"{p.b.mode}-d64-L4-T64-B8-vs-{'prenorm' if p.kind == 'vs_prenorm' else 'eager'}"
               for p in pairs)
    gpu = suite_pairs("gpu")
    assert {p.b.backend for p in gpu} == {"eager", "compile", "cudagraph"}
    assert {p.b.cfg.d_model for p in gpu} == {256, 1024}
    with pytest.raises(ValueError, match="--bench-suite"):
        suite_table("tpu")


def _spy(monkeypatch):
    """Record the loss of each held step of every group prepared through prepare_group."""
    seen, real = [], prepare.prepare_group

    @contextlib.contextmanager
    def spy(todo, device, w, opts, heartbeat=None):
        with real(todo, device, w, opts, heartbeat) as group:
            seen.append({k: step().detach().clone() for k, step in group.steps.items()})
            yield group
    monkeypatch.setattr(prepare, "prepare_group", spy)
    return seen


def test_benchmark_and_run_prepare_through_one_function_with_equal_losses(tmp_path, monkeypatch):
    seen = _spy(monkeypatch)
    a, b = Case("prenorm", TINY, "fwd_bwd"), Case("haares", TINY, "fwd_bwd", impl="two_phase")
    with RunWriter(tmp_path / "run", "r", "s", base={"device": "cpu"}) as run:
        run_sweep([a, b], CPU, run, QUICK, progress=False)
    with PairBench(BenchPair("vs_prenorm", a, b, 5), CPU, QUICK) as pb:
        for _ in range(5):
            pb.round()
        info = pb.finish()
    assert len(seen) == 2  # routerbench run's group, then the benchmark's pair
    for key in (a.key, b.key):
        assert torch.equal(seen[0][key], seen[1][key]), key  # bitwise
    # the set-up rows agree too: same parameters and FLOPs for the same case
    run_rows = [json.loads(ln) for ln in (tmp_path / "run" / "records.jsonl").read_text().splitlines()]
    for metric in ("params_matrix", "params_router", "fwd_flops_dispatch", "saved_activation"):
        ran = {(r["case_key"], r["value"]) for r in run_rows if r.get("metric") == metric}
        benched = {(r["case_key"], r["value"]) for r in info["rows"] if r.get("metric") == metric}
        assert ran == benched and ran, metric


def test_pair_bench_extra_info_values():
    a, b = Case("prenorm", TINY, "fwd_bwd"), Case("rezero", TINY, "fwd_bwd")
    with PairBench(BenchPair("vs_prenorm", a, b, 6), CPU, QUICK) as pb:
        assert pb.error is None
        for _ in range(6):
            pb.round()
        info = pb.finish()
    json.dumps(info)  # what pytest-benchmark stores must be JSON
    assert info["pairs"] == 6 and info["kind"] == "vs_prenorm" and info["case_key"] == b.key
    ta = [r["value"] for r in info["rows"] if r["metric"] == "step_time" and r["case_key"] == a.key]
    tb = [r["value"] for r in info["rows"] if r["metric"] == "step_time" and r["case_key"] == b.key]
    assert len(ta) == len(tb) == 6
    assert [r["pair"] for r in info["rows"] if r["metric"] == "step_time" and r["case_key"] == b.key] == list(range(6))
    from harness.stats.bootstrap import bootstrap_ratio_ci
    assert (info["ratio"], info["ratio_lo"], info["ratio_hi"]) == bootstrap_ratio_ci(ta, tb)
    assert info["a_ms"] == pytest.approx(sorted(ta)[2:4][0] / 2 + sorted(ta)[2:4][1] / 2)
    model = build_model(b, CPU)
    x, _ = synthetic_batch(TINY.vocab_size, TINY.batch_size, TINY.seq_len, seed=0)
    counted = count_flops_dispatch(model, (x,), backward=True)
    assert info["fwd_flops"] == counted["fwd_flops"] and info["bwd_flops"] == counted["bwd_flops"]
    assert info["step_flops"] == counted["fwd_flops"] + counted["bwd_flops"]
    assert "2 x multiply-add" in info["flop_convention"]
    assert info["tokens_per_s"] == pytest.approx(TINY.batch_size * TINY.seq_len / (info["b_ms"] / 1e3))
    assert info["mfu_pct"] is None and info["cuda_peak_allocated_bytes"] is None  # a CPU has neither
    assert info["saved_activation_bytes"] > 0
    assert {"cpu_util", "iqr_rel", "ci_width_rel"} <= set(info["noise"])


def test_pair_bench_reports_a_failed_set_up(monkeypatch):
    monkeypatch.setenv("ROUTERBENCH_FAULT", "oom:rezero|*")
    a, b = Case("prenorm", TINY, "fwd"), Case("rezero", TINY, "fwd")
    with PairBench(BenchPair("vs_prenorm", a, b, 5), CPU, QUICK) as pb:
        assert pb.error.startswith("oom: CUDA out of memory") and b.key in pb.error


def test_slow_fault_wraps_only_the_named_case(monkeypatch):
    from harness.rundir import faults
    monkeypatch.setenv("ROUTERBENCH_FAULT", "slow=5:rezero|*")
    step = lambda: 1  # noqa: E731
    assert faults.maybe_slow("prenorm|{}|naive", step) is step
    assert faults.maybe_slow("rezero|{}|naive", step) is not step and faults.maybe_slow("rezero|x", step)() == 1


def test_machine_info_holds_identity_only_and_extra_info_the_run():
    info = machine_info(CPU)
    assert info["torch"] == torch.__version__ and info["routerbench"] == 2
    assert info["gpu_count"] == 0 and info["gpu_name"] is None and info["driver"] is None
    assert info["cpu_model"] == info["device_name"] and info["cpu_threads"] >= 1
    assert info["cpu_cores"] is None or 1 <= info["cpu_cores"] <= info["cpu_threads"]
    assert set(info) == {"routerbench", "device", "device_name", "cpu_model", "cpu_cores", "cpu_threads",
                         "gpu_name", "gpu_count", "driver", "cuda", "cudnn", "torch", "triton", "python",
                         "machine", "system"}  # no hostname, command line, clock or frequency
    a, b = Case("prenorm", TINY, "fwd"), Case("rezero", TINY, "fwd")
    with PairBench(BenchPair("vs_prenorm", a, b, 5), CPU, QUICK) as pb:
        for _ in range(5):
            pb.round()
        extra = pb.finish()
    assert extra["routerbench"] == 2 and extra["argv"] == sys.argv and extra["hostname"]
    assert extra["environment"]["device_name"] == info["device_name"] and extra["sm_clock_mhz"] is None


def test_pedantic_hooks_time_the_measured_side_as_target_and_the_baseline_by_abba():
    a, b = Case("prenorm", TINY, "fwd"), Case("rezero", TINY, "fwd")
    with PairBench(BenchPair("vs_prenorm", a, b, 6), CPU, QUICK) as pb:
        calls = []
        for key in (a.key, b.key):
            real = pb.steps[key]
            pb.steps[key] = lambda real=real, key=key: (calls.append(key), real())[1]
        kw = pb.pedantic(6)
        assert kw["rounds"] == 6 and kw["iterations"] == 1 and kw["warmup_rounds"] == 0
        for _ in range(6):  # pytest-benchmark's pedantic loop: setup, timed target, teardown
            kw["setup"]()
            n_before = len(calls)
            kw["target"]()
            assert calls[n_before:] == [b.key]  # the recorded call runs the router alone
            kw["teardown"]()
        info = pb.finish()
    assert calls == [a.key, b.key, b.key, a.key] * 3  # ABBA across rounds
    assert info["pairs"] == 6


def _bench_json(tmp_path, pairs):
    benches = []
    for i, pair in enumerate(pairs):
        with PairBench(pair, CPU, QUICK) as pb:
            for _ in range(pair.rounds):
                pb.round()
            benches.append({"name": f"test_pair[{pair.id}]", "fullname": f"x::test_pair[{pair.id}]",
                            "group": pair.group, "extra_info": pb.finish()})
    data = {"machine_info": machine_info(CPU), "commit_info": {"id": "abc"},
            "benchmarks": benches + [{"name": "other", "extra_info": {}}],
            "datetime": "2026-12-01T10:00:00.000000+00:00", "version": "5.3.1"}
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(data))
    return path, benches


def test_bench_json_becomes_a_run_dir_with_the_same_paired_ratios(tmp_path):
    a = Case("prenorm", TINY, "fwd")
    pairs = [BenchPair("vs_prenorm", a, Case("rezero", TINY, "fwd"), 6),
             BenchPair("vs_prenorm", a, Case("layerscale", TINY, "fwd"), 6)]
    path, benches = _bench_json(tmp_path, pairs)
    run = to_run_dir(path, tmp_path / "bench")
    t = paired_ratio_table(load_frame([run]))
    assert len(t) == 2  # each router paired with its own benchmark's prenorm only
    for b in benches:
        row = t[t["router"] == b["extra_info"]["router"]].iloc[0]
        assert row["pairs"] == 6
        assert (row["ratio"], row["ratio_lo"], row["ratio_hi"]) == pytest.approx(
            (b["extra_info"]["ratio"], b["extra_info"]["ratio_lo"], b["extra_info"]["ratio_hi"]), rel=1e-12)
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["environment"]["torch"] == torch.__version__ and manifest["git_sha"] == "abc"
    assert to_run_dir(path, tmp_path / "bench") == run  # a re-conversion replaces the earlier one
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "x").write_text("")
    with pytest.raises(ConfigError, match="--out"):
        to_run_dir(path, tmp_path / "other")
    bad = tmp_path / "bad.json"
    bad.write_text('{"benchmarks": [{"name": "x", "extra_info": {"routerbench": 1, "rows": 3}}]}')
    with pytest.raises(ConfigError, match=r"benchmarks\[0\] \(x\): extra_info.rows"):
        to_run_dir(bad, tmp_path / "b2")
    bad.write_text('{"benchmarks": [{"name": "x", "extra_info": {"routerbench": 9, "rows": []}}]}')
    with pytest.raises(ConfigError, match=r"layout 9; this routerbench reads layouts 1, 2"):
        to_run_dir(bad, tmp_path / "b3")


def test_a_bench_json_of_layout_1_reads_as_before(tmp_path):
    """Stored baselines of layout 1 kept the environment and command line in machine_info."""
    a = Case("prenorm", TINY, "fwd")
    path, benches = _bench_json(tmp_path, [BenchPair("vs_prenorm", a, Case("rezero", TINY, "fwd"), 5)])
    data = json.loads(path.read_text())
    ei = data["benchmarks"][0]["extra_info"]
    data["machine_info"] = {"node": "host-a", "cpu": {"brand_raw": "x"}, "routerbench_argv": ["pytest", "-q"],
                            "routerbench_environment": ei.pop("environment")}
    for k in ("argv", "hostname", "sm_clock_mhz", "cpu_mhz"):
        ei.pop(k)
    ei["routerbench"] = 1
    old = tmp_path / "old.json"
    old.write_text(json.dumps(data))
    new_run, old_run = to_run_dir(path, tmp_path / "new"), to_run_dir(old, tmp_path / "old")
    m_new, m_old = (json.loads((r / "manifest.json").read_text()) for r in (new_run, old_run))
    assert m_old["environment"] == m_new["environment"] and m_old["command_line"] == "pytest -q"
    assert m_new["command_line"] == " ".join(sys.argv)
    assert m_old["pytest_benchmark"]["layouts"] == [1] and m_new["pytest_benchmark"]["layouts"] == [2]
    t_new, t_old = (paired_ratio_table(load_frame([r])) for r in (new_run, old_run))
    assert t_new[["ratio", "ratio_lo", "ratio_hi"]].equals(t_old[["ratio", "ratio_lo", "ratio_hi"]])


def test_report_command_reads_a_bench_json(tmp_path):
    a = Case("prenorm", TINY, "fwd")
    path, _ = _bench_json(tmp_path, [BenchPair("vs_prenorm", a, Case("rezero", TINY, "fwd"), 5)])
    cli = [sys.executable, "-m", "harness.cli"]
    out = subprocess.run(cli + ["report", str(path)], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    md = (tmp_path / "bench" / "report.md").read_text()
    assert "rezero" in md and "d=32, 2 layers" in md
    out = subprocess.run(cli + ["summary", str(path)], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0 and "rezero" in out.stdout
    bad = subprocess.run(cli + ["report", str(tmp_path / "missing.json")], capture_output=True, text=True, cwd=ROOT)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "does not exist" in bad.stderr


def test_benchmark_suite_collects_the_table_only_with_benchmark_only():
    base = [sys.executable, "-m", "pytest", "tests/benchmarks", "--collect-only", "-q", "-p", "no:cacheprovider"]
    out = subprocess.run(base + ["--benchmark-only", "--bench-suite", "cpu"], capture_output=True,
                         text=True, cwd=ROOT)
    ids = [ln for ln in out.stdout.splitlines() if "test_pair[" in ln]
    assert len(ids) == len(suite_pairs("cpu")), out.stdout[-2000:]
