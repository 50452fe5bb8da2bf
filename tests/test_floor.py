"""The physical floor (MEASUREMENT.md, "Noise on shared machines"): the byte model against a hand
computation, the bandwidth probe and its table of nominal figures, and the one bandwidth unit of a
run."""

from __future__ import annotations

import math

import pytest
import torch
from click.testing import CliRunner

from harness.cli import main
from harness.costs.bandwidth import measure_bandwidth, nominal_bandwidth
from harness.rundir.records import completed_cases, load_rows, units
from harness.rundir.writer import RunWriter
from harness.sweep.cases import Case
from reports import load_frame
from reports.floor import FLOOR_METHOD, extra_router_bytes, floor_table, write_floor
from workloads.config import DecoderConfig

SHAPE = DecoderConfig(vocab_size=32, d_model=256, n_layers=12, n_heads=4, seq_len=256, batch_size=4,
                      dtype="bfloat16")


def _write_pairs(run_dir, bandwidth_gbs: float | None, prenorm_ms=10.0, router_ms=12.0, pairs=5):
    with RunWriter(run_dir, "r", "s1", base={"device": "cpu"}) as w:
        cases = [Case(r, SHAPE, "fwd_bwd") for r in ("prenorm", "block_attnres")]
        with w.unit([c.key for c in cases], kind="group") as u:
            for case, ms in zip(cases, (prenorm_ms, router_ms)):
                for i in range(pairs):
                    u.write(**case.columns(), metric="step_time", value=ms, unit="ms", repeat=i, pair=i)
        if bandwidth_gbs is not None:
            with w.unit([], kind="bandwidth") as u:
                u.write(case_key="bandwidth|cpu", metric="mem_bandwidth", value=bandwidth_gbs,
                        unit="GB/s", repeat=0)


def test_floor_matches_a_hand_computation(tmp_path):
    # block_attnres, L = 12: N = 6 blocks over 2L = 24 sublayers; block b's phase 1 reads the
    # embedding and the b − 1 completed blocks: 1 + 2 + … + 6 = 21 reads, 21/24 = 0.875 d per token
    # and sublayer (the paper's Table 1 bounds it by N·N/2L = 1.5). Forward: 0.875 + 5 = 5.875 d
    # (prenorm 3), 2.875 d extra. A training step, the ideal fwd+bwd model (floor version 2):
    # 4·0.875 + 8 + 5 = 16.5 d (prenorm 6: forward 3, one gradient accumulation 3), so 10.5 d
    # extra. bf16: 2 bytes per element.
    fwd = 4 * 256 * (2 * 12) * 256 * 2.875 * 2                # B·T · 2L · d · 2.875 · 2 bytes
    assert fwd == 36_175_872
    step = 4 * 256 * (2 * 12) * 256 * 10.5 * 2                # fwd_bwd: 16.5 − 6 = 10.5 d extra
    assert extra_router_bytes("block_attnres", d_model=256, n_layers=12, seq_len=256, batch_size=4,
                              dtype="bfloat16", mode="fwd") == fwd
    assert extra_router_bytes("block_attnres", d_model=256, n_layers=12, seq_len=256, batch_size=4,
                              dtype="bfloat16", mode="fwd_bwd") == step
    assert extra_router_bytes("prenorm", d_model=256, n_layers=12, seq_len=256, batch_size=4,
                              dtype="bfloat16", mode="fwd") == 0
    assert math.isnan(extra_router_bytes("block_attnres", d_model=256, n_layers=12, seq_len=256,
                                         batch_size=4, dtype="bfloat16", mode="decode"))

    _write_pairs(tmp_path / "bw", bandwidth_gbs=100.0)
    t = floor_table(load_frame([tmp_path / "bw"]))
    assert len(t) == 1
    row = t.iloc[0]
    floor_ms = step / 100e9 * 1e3                             # 1.32120576 ms at 100 GB/s
    assert (row["router"], row["mode"], row["bandwidth_gbs"]) == ("block_attnres", "fwd_bwd", 100.0)
    assert row["extra_bytes"] == step and row["floor_ms"] == pytest.approx(floor_ms)
    assert row["prenorm_ms"] == 10.0
    assert row["floor_share_pct"] == pytest.approx(floor_ms / 10.0 * 100)        # 13.2 %
    assert row["paired_overhead_pct"] == pytest.approx(20.0)                            # 12 ms / 10 ms
    assert row["over_floor"] == pytest.approx(20.0 / (floor_ms / 10.0 * 100))
    assert row["floor_version"] == 2 and "floor version 2" in FLOOR_METHOD and "prenorm 6" in FLOOR_METHOD
    path = write_floor(load_frame([tmp_path / "bw"]), tmp_path / "out")
    assert path.name == "floor.csv" and path.read_text().count("\n") == 2

    # without a bandwidth row: the bytes stand, the floor is NaN
    _write_pairs(tmp_path / "nobw", bandwidth_gbs=None)
    row = floor_table(load_frame([tmp_path / "nobw"])).iloc[0]
    assert row["extra_bytes"] == step and math.isnan(row["floor_ms"]) and math.isnan(row["over_floor"])
    assert row["paired_overhead_pct"] == pytest.approx(20.0)


def test_nominal_bandwidth_by_name():
    assert nominal_bandwidth("NVIDIA H200") == 4800.0
    assert nominal_bandwidth("NVIDIA H100 80GB HBM3") == 3350.0
    assert nominal_bandwidth("NVIDIA H100 PCIe") == 2000.0
    assert nominal_bandwidth("NVIDIA A100-SXM4-80GB") == 2039.0
    assert nominal_bandwidth("NVIDIA A100-PCIE-40GB") == 1555.0
    assert nominal_bandwidth("NVIDIA L4") == 300.0
    assert nominal_bandwidth("AMD EPYC 7B13") is None and nominal_bandwidth("") is None


def test_measure_bandwidth_on_cpu():
    res = measure_bandwidth(torch.device("cpu"), nbytes=2**20, repeats=3)
    assert {"device", "device_name", "nbytes", "bytes_per_copy", "repeats", "samples_gbs", "median_gbs",
            "iqr_gbs", "nominal_gbs"} <= set(res)
    assert res["nbytes"] == 2**20 and res["bytes_per_copy"] == 2**21 and res["repeats"] == 3
    assert len(res["samples_gbs"]) == 3 and res["median_gbs"] > 0 and res["iqr_gbs"] >= 0
    assert res["nominal_gbs"] is None


def test_a_run_records_one_bandwidth_unit_and_a_resume_none(tmp_path):
    args = ["run", "--widths", "16", "--depths", "2", "--n-heads", "2", "--seq-len", "8", "--batch-size", "2",
            "--routers", "prenorm,haares", "--modes", "fwd", "--backends", "eager", "--impls", "naive",
            "--repeats", "2", "--max-attempts", "1", "--warmup-s", "0", "--no-train", "--no-report",
            "--no-flops", "--quiet", "--out", str(tmp_path), "--run-id", "bw"]
    for _ in range(2):  # the second call resumes the finished run
        res = CliRunner().invoke(main, args)
        assert res.exit_code == 0, res.output
    d = next(tmp_path.glob("*/bw"))
    assert [m["kind"] for m in units(d)].count("bandwidth") == 1
    rows = [r for r in load_rows([d]) if r["metric"] == "mem_bandwidth"]
    assert len(rows) == 2 and all(r["status"] == "ok" and r["value"] > 0 and r["unit"] == "GB/s" for r in rows)
    assert {r["case_key"] for r in rows} == {"bandwidth|cpu"}
    assert not any(k.startswith("bandwidth|") for k in completed_cases(d))  # case counts unchanged
    t = floor_table(load_frame([d]))
    assert list(t["router"]) == ["haares"] and t["floor_ms"].iloc[0] > 0


def test_every_router_declares_an_ideal_training_step_above_its_forward():
    """The floor of a training step is defined once for all routers: each declares its ideal
    fwd+bwd traffic, at least its forward's, prenorm's 6 the least of all; its forward never above
    the paper's Table 1 model (which bounds what a step reads from above); a block router's layer
    scope (the padded pool) never below its model scope; hand values for the fixed routers, the
    block routers at 12 layers, 6 blocks, and full_attnres (S = 12: phase 1 reads 1 + 13 = 14
    sources over 24 sublayers, phase 2 (12 + 1)/2 on average: 7.083; 4·7.083 + 2)."""
    from routers import ROUTERS, build_router
    want = {"prenorm": 6.0, "rezero": 8.0, "layerscale": 8.0, "block_attnres": 16.5, "haares": 24.0,
            "wav_v1": 31.5, "shc": 29.0, "full_attnres": 4 * (14 / 24 + 6.5) + 2}
    for name in ROUTERS:
        r = build_router(name, 256, 12)
        both, fwd = r.ideal_io_fwd_bwd_per_token(), r.ideal_io_fwd_per_token()
        assert both is not None and both >= max(fwd, 6.0), name
        assert fwd <= r.ideal_io_per_token(), name
        if name in want:
            assert both == pytest.approx(want[name]), name
        if name in ("block_attnres", "haares", "wav_v1"):
            assert r.ideal_io_fwd_bwd_per_token(layout="padded") >= both, name
