"""``routerbench profile``: traces that carry the router labels, the router-share table, option
errors before any model, and labels that cost compile nothing."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch
from click.testing import CliRunner

from harness.cli import main
from harness.rundir.records import load_rows, units
from harness.rundir.writer import RunWriter
from harness.step import backends
from harness.step.modes import lm_loss
from harness.sweep.cases import Case
from harness.sweep.profile import METHODS, check_methods, profile_case
from harness.sweep.trace import lines_dropped, profile_labels
from harness.timing.timer import TimingPolicy
from routers import build_router
from workloads.config import DecoderConfig
from workloads.decoder import Decoder

CFG = DecoderConfig(vocab_size=32, d_model=32, n_layers=2, n_heads=2, seq_len=16, batch_size=2)
SHAPE = ["--d-model", 32, "--n-layers", 2, "--n-heads", 2, "--seq-len", 16, "--batch-size", 2,
         "--device", "cpu"]
FAST = TimingPolicy(warmup_min_count=1, warmup_min_s=0.0, repeats=1)


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def test_profile_cli_writes_a_trace_with_router_labels_and_a_share_table(tmp_path):
    res = invoke("profile", "--router", "haares", "--backend", "eager", "--impl", "two_phase",
                 *SHAPE, "--out", tmp_path, "--run-id", "t", "--memory-snapshot")
    assert res.exit_code == 0, res.output
    assert "--memory-snapshot: CUDA only" in res.output and "router share: labels" in res.output
    run_dir = next(tmp_path.glob("*/profile-t"))
    traces = list((run_dir / "trace").glob("*.pt.trace.json"))
    assert len(traces) == 1
    with open(traces[0]) as fh:
        doc = json.load(fh)
    names = {e.get("name") for e in doc["traceEvents"]}
    assert {"router.read", "router.write", "sublayer.attn", "sublayer.mlp"} <= names
    # Holistic Trace Analysis reads the rank from distributedInfo (else it guesses from the name)
    assert doc["distributedInfo"] == {"backend": "none", "rank": 0, "world_size": 1}
    assert any(n and n.startswith("ProfilerStep#") for n in names)
    assert not (run_dir / "memory_snapshot.pickle").exists()

    t = pd.read_csv(run_dir / "router_share.csv")
    assert list(t.columns) == ["label", "calls", "ms_per_step", "share_pct", "method"]
    assert set(t.method) == {"labels"}
    by = t.set_index("label")
    step_ms, router_ms = by.loc["step", "ms_per_step"], by.loc["router", "ms_per_step"]
    assert 0 < router_ms < step_ms
    assert 0 < by.loc["router", "share_pct"] < 100
    assert by.loc["router.read", "calls"] == by.loc["router.params", "calls"] == 2 * CFG.n_layers  # per sublayer
    # calls, not autograd nodes: the reads past a block start (one at a start returns phase 1's o_0)
    n_blocks = build_router("haares", 32, CFG.n_layers).n_blocks
    assert by.loc["router.read.backward", "calls"] == 2 * CFG.n_layers - n_blocks
    assert by.loc["router.read.backward", "ms_per_step"] > 0  # fwd_bwd: backward nodes attributed
    assert (run_dir / "router_share.png").stat().st_size > 0

    assert [m["kind"] for m in units(run_dir)] == ["profile"]  # the profile is one unit of resume
    rows = pd.DataFrame(load_rows([run_dir])).set_index("metric")
    assert rows.loc["router_share", "value"] == pytest.approx(by.loc["router", "share_pct"])
    assert rows.loc["profile_step_time", "unit"] == "ms" and set(rows.status) == {"ok"}
    assert rows.loc["router_share", "impl"] == "two_phase"

    # the same command again: the profile is complete, nothing is profiled or recorded twice
    again = invoke("profile", "--config", run_dir / "spec.toml", "--out", tmp_path, "--run-id", "t")
    assert again.exit_code == 0 and "nothing left to do" in again.output, again.output
    assert len(units(run_dir)) == 1 and len(list((run_dir / "trace").glob("*.json"))) == 1


def test_calls_count_calls_of_the_labelled_region_forward_and_backward(tmp_path, capfd):
    """L layers: 2L reads and 2L writes per step, with the backward of each read past a block start
    (the read at a start returns phase 1's o_0, an op of its params); the count is per step over
    the active steps, never the autograd nodes of a call (once 193 for router.read.backward)."""
    cfg = CFG.replace(n_layers=3)
    case = Case("haares", cfg, "fwd_bwd", "eager", impl="two_phase")
    t = profile_case(case, torch.device("cpu"), tmp_path, wait=0, warmup=1, active=2)["table"]
    calls = t.set_index("label")["calls"]
    n_blocks = build_router("haares", 32, cfg.n_layers).n_blocks
    assert calls["router.read"] == calls["router.params"] == 2 * cfg.n_layers
    assert calls["router.read.backward"] == 2 * cfg.n_layers - n_blocks
    assert calls["router.write"] == 2 * cfg.n_layers
    assert calls["sublayer.attn"] == calls["sublayer.attn.backward"] == cfg.n_layers
    assert calls["router.init"] == calls["router.output"] == calls["router.output.backward"] == 1
    labelled = calls.dropna()
    assert (labelled == labelled.round()).all()  # whole calls per step
    out, err = capfd.readouterr()
    assert "USDT:" not in out + err  # kineto's start/stop notices do not reach the terminal


def test_lines_dropped_keeps_every_other_line_in_order(capfd):
    import os
    with lines_dropped(b"USDT:"):
        os.write(2, b"USDT:2026 profiler_start\nkept on stderr\n")
        os.write(1, b"kept on stdout\nUSDT: profiler_stop\nand this\n")
    out, err = capfd.readouterr()
    assert out == "kept on stdout\nand this\n" and err == "kept on stderr\n"


def test_impl_defaults_to_two_phase_where_the_router_has_it():
    from harness.spec import ProfileSpec, load

    def impl(router):
        spec, labels = load(ProfileSpec, {"router": router, "device": "cpu"}, None)
        return spec.resolve(labels).profile.impl

    assert impl("haares") == "two_phase" and impl("rezero") == "naive"  # as the example of docs/SWEEPS.md ("Profiling")
    help_text = " ".join(invoke("profile", "--help").output.split())
    assert "default: two_phase where the router has it" in help_text


def test_paired_difference_and_router_only_methods(tmp_path):
    case = Case("haares", CFG, "fwd", "eager", impl="naive")
    with RunWriter(tmp_path, "run", "s") as w, w.unit([case.key], kind="profile") as u:
        res = profile_case(case, torch.device("cpu"), tmp_path, wait=0, warmup=1, active=1, writer=u,
                           methods=METHODS[1:], pairs=3, policy=FAST)
    t = res["table"]
    assert set(t.method) == {"paired_difference", "router_only"}
    assert set(res["router_share_by_method"]) == {"paired_difference", "router_only"}
    ro = t[(t.method == "router_only") & (t.label == "router")].iloc[0]
    assert 0 < ro.share_pct < 100  # the router_only step drops the attention and MLP matrices
    metrics = {r["metric"] for r in load_rows([tmp_path])}
    assert {"router_share_paired_difference", "profile_step_time_router_only"} <= metrics
    assert res["trace_files"]  # a trace is written under every method


def test_labels_are_off_by_default_and_change_nothing():
    torch.manual_seed(0)
    model = Decoder(CFG, "haares")
    assert model.profile_labels is False
    x = torch.randint(0, CFG.vocab_size, (CFG.batch_size, CFG.seq_len))
    ref = model(x)
    with profile_labels(model, True), torch.profiler.profile() as prof:
        assert model.profile_labels is True
        got = model(x)
    assert model.profile_labels is False
    assert {"router.init", "router.read", "router.write", "router.output"} <= {e.name for e in prof.events()}
    torch.testing.assert_close(got, ref, rtol=0, atol=0)


@pytest.mark.compile
def test_labels_keep_compile_fullgraph_without_graph_breaks():
    torch.manual_seed(0)
    eager = Decoder(CFG, "haares").train()
    x = torch.randint(0, CFG.vocab_size, (CFG.batch_size, CFG.seq_len))
    y = torch.roll(x, -1, dims=1)
    with profile_labels(eager, True):
        compiled = backends.prepare(eager, "compile", "default").model
        loss = lm_loss(compiled(x), y)
        loss.backward()
        assert backends.graph_breaks() == 0
    torch.testing.assert_close(loss, lm_loss(eager(x), y), rtol=1e-5, atol=1e-6)


def test_check_methods_names_the_option():
    assert check_methods(["labels"], "eager") == ("labels",)
    with pytest.raises(ValueError, match="--compile-mode reduce-overhead"):
        check_methods(["paired_difference"], "compile", "reduce-overhead")
    with pytest.raises(ValueError, match="--methods labels"):
        check_methods(["labels"], "cudagraph")


@pytest.mark.compile
def test_compile_profile_uses_the_timed_methods_without_recompiling(tmp_path):
    """Three compiled models (case, prenorm, router_only) live side by side: building them all
    before any runs keeps backends.prepare's dynamo reset from dropping compiled code, and the
    interleaved timing runs under error_on_recompile."""
    case = Case("haares", CFG, "fwd", "compile", "default", impl="two_phase")
    res = profile_case(case, torch.device("cpu"), tmp_path, wait=0, warmup=1, active=1, pairs=2, policy=FAST)
    assert set(res["table"].method) == {"paired_difference", "router_only"}
    assert backends.graph_breaks() == 0
    names = {e.get("name") for e in json.loads(res["trace_files"][0].read_text())["traceEvents"]}
    assert "router.read" not in names  # labels are off (and would not survive Inductor)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_profile_and_memory_snapshot(tmp_path):
    case = Case("haares", CFG, "fwd_bwd", "eager", impl="two_phase")
    res = profile_case(case, torch.device("cuda"), tmp_path, memory_snapshot=True)
    t = res["table"].set_index("label")
    assert 0 < t.loc["router", "ms_per_step"] < t.loc["step", "ms_per_step"]
    assert res["memory_snapshot"].stat().st_size > 0


def test_outputs_of_a_profile_cut_short_are_set_aside(tmp_path):
    from harness.rundir.environment import device_slug
    run_dir = tmp_path / device_slug("cpu") / "profile-u"
    (run_dir / "trace").mkdir(parents=True)
    (run_dir / "trace" / "old.pt.trace.json").write_text("{}")  # an attempt that was killed
    res = invoke("profile", "--router", "prenorm", *SHAPE, "--out", tmp_path,
                 "--run-id", "u")
    assert res.exit_code == 0, res.output
    assert [p.name for p in (run_dir / "trace").iterdir()] != ["old.pt.trace.json"]
    assert len(list((run_dir / "trace").glob("*.pt.trace.json"))) == 1
    assert list((run_dir / "aborted").glob("*-outputs/trace/old.pt.trace.json"))
