"""harness/costs/peak.py and reports.tables.mfu_table: peak lookup, model FLOPs, tokens/s and MFU.
Expected values are computed by hand from the formulas of docs/FLOPS.md ("MFU")."""

from __future__ import annotations

import json

import pytest

from harness.costs.peak import mfu, model_flops_per_step, peak_flops, tokens_per_step
from harness.rundir.environment import write_manifest
from harness.rundir.records import MANIFEST_FILE
from harness.rundir.writer import RunWriter
from reports import build_report, load_frame
from reports.frame import load_manifests
from reports.tables import mfu_table

D, L, H, T, B = 256, 12, 4, 256, 4
N = 16 * D * D * L                            # SwiGLU sublayer matrices: 12,582,912
R = 2 * L * D * B * T                         # prenorm's analytic mixing: one add per sublayer


@pytest.mark.parametrize("name,peak", [
    ("NVIDIA H100 80GB HBM3", 989e12), ("NVIDIA H100 PCIe", 756e12), ("NVIDIA H100 NVL", 835e12),
    ("NVIDIA H200", 989e12), ("NVIDIA A100-SXM4-80GB", 312e12), ("NVIDIA A10G", 125e12),
    ("NVIDIA A10", 125e12), ("NVIDIA B200", 2.25e15), ("NVIDIA GB200", 2.5e15),
    ("NVIDIA L40S", 362e12), ("NVIDIA L4", 121e12), ("NVIDIA GeForce RTX 4090", 165.2e12),
])
def test_peak_by_name(name, peak):
    assert peak_flops(name) == peak
    assert peak_flops(name, "cuda") == peak


@pytest.mark.parametrize("name,device", [
    ("Intel(R) Xeon(R) Processor", "cpu"), ("NVIDIA H100 80GB HBM3", "cpu"),
    ("NVIDIA L40", "cuda"), ("Some Accelerator X", "cuda"), ("", "cuda"), (None, None),
])
def test_peak_blank_for_cpu_and_unknown(name, device):
    assert peak_flops(name, device) is None
    assert mfu(1e12, 1.0, peak_flops(name, device)) is None


def test_model_flops_hand_computed():
    train = model_flops_per_step("fwd_bwd", n_matrix=N, n_layers=L, d_model=D, seq_len=T,
                                 batch_size=B, router_fwd_flops=R)
    assert train == (6 * N * B * T                # 6N per token
                     + 12 * L * D * T * B * T      # attention, causal not halved
                     + 3 * R) == 86_991_962_112    # router's depth mixing, fwd + bwd
    assert model_flops_per_step("train_step", n_matrix=N, n_layers=L, d_model=D, seq_len=T,
                                batch_size=B, router_fwd_flops=R) == train
    fwd = model_flops_per_step("fwd", n_matrix=N, n_layers=L, d_model=D, seq_len=T,
                               batch_size=B, router_fwd_flops=R)
    assert fwd * 3 == train
    decode = model_flops_per_step("decode", n_matrix=N, n_layers=L, d_model=D, seq_len=T,
                                  batch_size=B, router_fwd_flops=R)
    assert decode == B * (2 * N + 4 * L * D * T) + 2 * L * D * B   # B tokens, T cached positions
    router_only = model_flops_per_step("fwd", n_matrix=0, n_layers=L, d_model=D, seq_len=T,
                                       batch_size=B, router_fwd_flops=R, attention=False)
    assert router_only == R
    with pytest.raises(ValueError, match="unknown mode"):
        model_flops_per_step("train", n_matrix=N, n_layers=L, d_model=D, seq_len=T,
                             batch_size=B, router_fwd_flops=R)


def test_tokens_per_step():
    assert tokens_per_step("fwd_bwd", B, T) == tokens_per_step("fwd", B, T) == 1024
    assert tokens_per_step("decode", B, T) == B


def write_run(root, run_id, device, device_name, cases):
    """A run directory with a manifest and, per (router, mode, times), a cost case."""
    d = root / run_id
    with RunWriter(d, run_id=run_id, session="s1", base={"device": device}) as w:
        for router, mode, times in cases:
            case = dict(case_key=f"{router}-{mode}", router=router, router_options={}, impl="naive",
                        backend="eager", mode=mode, workload="decoder", d_model=D, n_layers=L,
                        n_heads=H, seq_len=T, batch_size=B, dtype="bfloat16", seed=0)
            with w.unit([case["case_key"]]) as u:  # one unit of resume per case
                for i, t in enumerate(times):
                    u.write(**case, repeat=i, metric="step_time", value=t, unit="ms")
                u.write(**case, metric="params_matrix", value=N, unit="count")
                u.write(**case, metric="router_flops_analytic", value=R, unit="FLOP")
    if device_name is None:
        write_manifest(d, device, {"run_id": run_id})        # this machine: a CPU
    else:
        (d / MANIFEST_FILE).write_text(json.dumps(
            {"run_id": run_id, "environment": {"device": device, "device_name": device_name}}))
    return d


def test_mfu_table_mocked_h100(tmp_path):
    d = write_run(tmp_path, "gpu", "cuda", "NVIDIA H100 80GB HBM3",
                  [("prenorm", "fwd_bwd", [100.0, 120.0, 110.0]), ("prenorm", "decode", [2.0])])
    t = mfu_table(load_frame([d]), load_manifests([d]))
    train = t[t["mode"] == "fwd_bwd"].iloc[0]
    assert train["median_ms"] == 110.0
    assert train["tokens_per_s"] == pytest.approx(B * T / 0.110)             # 9309.09
    flops = 6 * N * B * T + 12 * L * D * T * B * T + 3 * R
    assert train["model_gflop"] == pytest.approx(flops / 1e9)
    assert train["device_name"] == "NVIDIA H100 80GB HBM3"
    assert train["peak_tflops"] == 989.0
    assert train["mfu_pct"] == pytest.approx(flops / 0.110 / 989e12 * 100)   # 0.07996 %
    decode = t[t["mode"] == "decode"].iloc[0]
    assert decode["tokens_per_s"] == pytest.approx(B / 0.002)               # B tokens per step
    assert decode["mfu_pct"] == pytest.approx(
        (B * (2 * N + 4 * L * D * T) + R / T) / 0.002 / 989e12 * 100)


def test_mfu_blank_for_cpu_unknown_and_missing_manifest(tmp_path):
    cpu = write_run(tmp_path, "cpu", "cpu", None, [("prenorm", "fwd", [50.0])])
    odd = write_run(tmp_path, "odd", "cuda", "Some Accelerator X", [("prenorm", "fwd", [50.0])])
    df = load_frame([cpu, odd])
    for manifests in (load_manifests([cpu, odd]), None):
        t = mfu_table(df, manifests)
        assert len(t) == 2 and t["mfu_pct"].isna().all() and t["peak_tflops"].isna().all()
        assert t["tokens_per_s"].tolist() == pytest.approx([B * T / 0.050] * 2)
    assert set(mfu_table(df, load_manifests([cpu, odd]))["device_name"]) >= {"Some Accelerator X"}


def test_mfu_in_report(tmp_path):
    d = write_run(tmp_path, "gpu", "cuda", "NVIDIA H100 80GB HBM3",
                  [("prenorm", "fwd_bwd", [100.0, 120.0, 110.0])])
    md = build_report([d])["report.md"].read_text()
    assert "Throughput and MFU" in md and "MFU (%)" in md and "tokens/s" in md
    assert f"{86_991_962_112 / 0.110 / 989e12 * 100:.2f}" in md


def test_empty_frame(tmp_path):
    d = tmp_path / "empty"
    RunWriter(d, run_id="empty", session="s1").close()
    (d / "records.jsonl").touch()
    t = mfu_table(load_frame([d]), {})
    assert t.empty and "mfu_pct" in t.columns


def test_hfu_is_the_dispatched_flops_over_the_step_and_the_summary_quotes_the_best_mfu(tmp_path):
    """HFU counts what was dispatched (here 1.5× the model's FLOPs, as a recomputing backward
    would); the summary table's best MFU is the fastest backend's."""
    from reports.summary import cost_summary
    d = tmp_path / "gpu"
    flops = 6 * N * B * T + 12 * L * D * T * B * T + 3 * R
    with RunWriter(d, run_id="gpu", session="s1", base={"device": "cuda"}) as w:
        with w.unit(["x"], kind="group") as u:
            for router in ("prenorm", "haares"):
                for backend, ms in (("eager", 20.0), ("cudagraph", 10.0)):
                    case = dict(case_key=f"{router}-{backend}", router=router, router_options={}, impl="naive",
                                backend=backend, mode="fwd_bwd", workload="decoder", d_model=D, n_layers=L,
                                n_heads=H, seq_len=T, batch_size=B, dtype="bfloat16", seed=0)
                    for i in range(6):
                        u.write(**case, repeat=i, pair=i, attempt=1, metric="step_time", value=ms, unit="ms")
                    u.write(**case, metric="params_matrix", value=N, unit="count")
                    u.write(**case, metric="router_flops_analytic", value=R, unit="FLOP")
                    u.write(**case, metric="fwd_flops_dispatch", value=flops / 2, unit="FLOP")
                    u.write(**case, metric="bwd_flops_dispatch", value=flops, unit="FLOP")
    (d / MANIFEST_FILE).write_text(json.dumps(
        {"run_id": "gpu", "environment": {"device": "cuda", "device_name": "NVIDIA H100 80GB HBM3"}}))
    df, manifests = load_frame([d]), load_manifests([d])
    t = mfu_table(df, manifests)
    graph = t[(t["router"] == "prenorm") & (t["backend"] == "cudagraph")].iloc[0]
    assert graph["mfu_pct"] == pytest.approx(flops / 0.010 / 989e12 * 100)
    assert graph["hfu_pct"] == pytest.approx(1.5 * graph["mfu_pct"])
    s = cost_summary(df, manifests).iloc[0]
    assert s["router"] == "haares" and s["best_mfu_backend"] == "cudagraph"
    assert s["best_mfu_pct"] == pytest.approx(graph["mfu_pct"])
    assert "best_mfu_pct" not in cost_summary(df).columns  # no manifests, no device name: no column
