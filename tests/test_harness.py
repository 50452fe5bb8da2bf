"""Records, resume, memory and timing helpers of the harness."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch
from torch import nn

from harness.costs.memory import saved_activation_bytes
from harness.rundir.records import ABORTED_DIR, COLUMNS, RecordsWarning, load_rows, read_jsonl
from harness.rundir.writer import RunWriter
from harness.sweep.cases import Case, expand
from harness.sweep.options import SweepOptions
from harness.sweep.run import run_sweep
from harness.timing.timer import TimingPolicy, median_iqr
from routers.errors import ConfigError
from workloads.config import DecoderConfig
from workloads.decoder import Decoder

TINY = DecoderConfig(vocab_size=32, d_model=16, n_layers=2, n_heads=2, seq_len=8, batch_size=2)
FAST = SweepOptions(timing=TimingPolicy(warmup_min_count=1, warmup_min_s=0.0, repeats=3), max_attempts=1)


def test_records_round_trip_into_pandas(tmp_path):
    with RunWriter(tmp_path, "run1", "s1", base={"device": "cpu"}) as w, w.unit(["c"]) as u:
        u.write(router="haares", router_options={"n_blocks": 2}, metric="step_time", value=1.5,
                unit="ms", repeat=0, d_model=16)
        u.write(router="haares", metric="time_to_target", unit="s", status="not_converged", error="budget")
        with pytest.raises(ValueError, match="unknown record column"):
            u.write(bogus=1)
        with pytest.raises(ValueError, match="status"):
            u.write(status="fine")
    with open(tmp_path / "records.jsonl", "a") as fh:
        fh.write('{"run_id": "run1", "metr')  # a row torn by an interruption
    with pytest.warns(RecordsWarning, match="line 4 after the last end marker"):
        df = pd.DataFrame(load_rows([tmp_path]))
    assert list(df.columns) == list(COLUMNS)
    assert len(df) == 2
    assert df.loc[0, "value"] == 1.5 and df.loc[0, "unit"] == "ms" and df.loc[0, "device"] == "cpu"
    assert json.loads(df.loc[0, "router_options"]) == {"n_blocks": 2}
    assert df.loc[1, "status"] == "not_converged" and pd.isna(df.loc[1, "value"])


def test_sweep_resumes_without_redoing_or_losing_cases(tmp_path):
    cases = expand(["prenorm", "haares"], TINY, [16], [2], ["fwd_bwd"])
    w1 = RunWriter(tmp_path, "run", "s1")
    stats = run_sweep(cases[:1], torch.device("cpu"), w1, FAST, progress=False)
    assert stats == {"resumed": 0, "ok": 1}
    # The earlier session was then interrupted inside haares's case: rows written, unit not committed.
    w1.unit([cases[1].key]).write(**cases[1].columns(), metric="step_time", value=99.0, unit="ms", repeat=0)
    w1.close()
    w2 = RunWriter(tmp_path, "run", "s2")
    assert w2.recovered["pending_units"] == 1
    stats = run_sweep(cases, torch.device("cpu"), w2, FAST, progress=False)
    w2.close()
    assert stats == {"resumed": 1, "ok": 1}
    aborted = [r for f in sorted((tmp_path / ABORTED_DIR).glob("s1-*.jsonl")) for r in read_jsonl(f)]
    assert any(r["value"] == 99.0 for r in aborted)  # nothing measured is lost...
    kept = pd.DataFrame(load_rows([tmp_path]))
    st = kept[kept.metric == "step_time"]
    assert 99.0 not in st.value.tolist()  # ...but the finished attempt is the one reported
    assert st.groupby("router").size().to_dict() == {"haares": 3, "prenorm": 3}
    assert set(kept.metric) >= {"fwd_flops_fvcore", "router_flops_fvcore", "saved_activation",
                                "params_matrix", "params_router", "step_time"}
    assert kept[kept.metric == "params_matrix"].value.iloc[0] == 16 * 16 * 16 * 2


def test_failing_case_is_an_error_row_and_the_sweep_goes_on(tmp_path, monkeypatch):
    import harness.sweep.prepare as prepare
    cases = expand(["prenorm", "haares"], TINY, [16], [2], ["fwd"])
    real = prepare.build_model

    def broken(case, device):
        if case.router == "prenorm":
            raise RuntimeError("synthetic failure")
        return real(case, device)

    monkeypatch.setattr(prepare, "build_model", broken)
    with RunWriter(tmp_path, "run", "s") as w:
        assert run_sweep(cases, torch.device("cpu"), w, FAST, progress=False) == {"resumed": 0, "error": 1, "ok": 1}
    rows = pd.DataFrame(load_rows([tmp_path]))
    err = rows[rows.status == "error"]
    assert err.router.tolist() == ["prenorm"] and "synthetic failure" in err.error.iloc[0]


def test_saved_activation_bytes_by_hand():
    x = torch.randn(4, 8, requires_grad=True)  # 32 float32 = 128 bytes
    lin = nn.Linear(8, 16, bias=False)
    # exp saves its result (128 B); linear saves its input, the same tensor (counted once) and
    # its weight (a parameter: excluded); sum saves nothing.
    n = saved_activation_bytes(lambda: lin(x.exp()).sum(), exclude=list(lin.parameters()))
    assert n == 128
    # without the exclusion the weight's 8*16*4 = 512 bytes count too
    assert saved_activation_bytes(lambda: lin(x.exp()).sum()) == 128 + 512


def test_saved_activation_bytes_frees_what_it_counted():
    """The saved tensors die with the forward's output, outputs saved by their own node (exp)
    included: a pack hook that kept the live tensor would close a cycle gc cannot collect, and a
    sweep held every case's saved graph (pytorch/pytorch#115255)."""
    import gc
    import weakref
    x = torch.randn(4, 8, requires_grad=True)
    refs = []

    def forward():
        y = x.exp()  # exp saves its own output
        refs.append(weakref.ref(y))
        return (y * 2).sum()

    assert saved_activation_bytes(forward) == 128
    gc.collect()
    assert refs[0]() is None

    def dead_branch():
        dead = x.exp()  # saves 128 B, but never reaches the result: freed during the forward
        del dead
        return x.sin().sum()  # sin saves its input x: 128 B

    assert saved_activation_bytes(dead_branch) == 128


def test_gradient_checkpointing_saves_less():
    x = torch.randint(0, 32, (2, 8))
    sizes = {}
    for ckpt in (False, True):
        torch.manual_seed(0)
        m = Decoder(TINY.replace(grad_checkpoint=ckpt), "haares").train()
        params = [*m.parameters(), *m.buffers()]
        sizes[ckpt] = saved_activation_bytes(lambda: m(x), exclude=params)
    assert sizes[True] < 0.5 * sizes[False]


def test_median_iqr():
    assert median_iqr([5.0, 1.0, 3.0, 2.0, 4.0]) == (3.0, 2.0)
    assert median_iqr([7.0]) == (7.0, 0.0)
    with pytest.raises(ValueError):
        median_iqr([])


def test_case_key_is_stable_and_distinguishes_options():
    a = Case("haares", TINY, "fwd", router_options=(("n_blocks", 1),))
    b = Case("haares", TINY, "fwd", router_options=(("n_blocks", 2),))
    assert a.key != b.key and a.key == Case("haares", TINY, "fwd", router_options=(("n_blocks", 1),)).key


def test_expand_validates_before_building():
    with pytest.raises(ConfigError, match="--widths 30 / --depths 2"):
        expand(["prenorm"], TINY, [30], [2], ["fwd"])  # 30 / 2 heads = 15: odd head size
    with pytest.raises(ConfigError, match="--modes"):
        expand(["prenorm"], TINY, [16], [2], ["decode_all"])
    with pytest.raises(ConfigError, match="n_blocks"):
        expand(["haares"], TINY, [16], [2], ["fwd"], options={"haares": {"n_blocks": 9}})


def test_saved_activation_bytes_of_a_known_decoder():
    """prenorm, router_only (each sublayer is RMSNorm alone), L=1, d=8, B·T = M = 4, float32.

    Counted by hand from autograd's saved tensors (each storage once; weights excluded):
      embedding: its indices, M int64                                        32
      h_0 = e, h_1 = e + u_0, h_2 = h_1 + u_1: each saved by its RMSNorm's x²     3 · M·d·4 = 384
      each RMSNorm's rsqrt(mean(x²) + ε), saved by rsqrt and the scaling      3 · M·4   =  48
      the final norm's x·rsqrt, saved by its gain multiply                        M·d·4 = 128
      the gain's output, saved by the LM head (its input)                         M·d·4 = 128
    """
    cfg = DecoderConfig(vocab_size=16, d_model=8, n_layers=1, n_heads=2, seq_len=4, batch_size=1,
                        workload="router_only")
    m = Decoder(cfg, "prenorm").train()
    x = torch.randint(0, 16, (1, 4))
    assert saved_activation_bytes(lambda: m(x), exclude=[*m.parameters(), *m.buffers()]) == \
        32 + 384 + 48 + 128 + 128
