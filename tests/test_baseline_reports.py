"""What the report shows of the baseline routers: the mHC conventions table (reports/conventions.py:
every convention of each timed mHC case resolved, and the public port it matches) and the n-stream
state in the memory table (reports/tables.py ``state_ratio``)."""

from __future__ import annotations

import torch

from harness.rundir.writer import RunWriter
from harness.sweep.cases import expand
from harness.sweep.options import SweepOptions
from harness.sweep.run import run_sweep
from harness.timing.timer import TimingPolicy
from reports import load_frame
from reports.conventions import PORTS, conventions_table, matches
from reports.report import build_report
from routers import router_options
from workloads.config import DecoderConfig

TINY = DecoderConfig(vocab_size=32, d_model=16, n_layers=2, n_heads=2, seq_len=8, batch_size=2)
FAST = SweepOptions(flops=False, memory=False, max_attempts=1,
                    timing=TimingPolicy(warmup_min_count=1, warmup_min_s=0.0, repeats=2))


def test_matches_names_the_port_of_each_convention_set():
    paper = router_options("mhc")
    assert matches(paper) == "paper (arXiv:2512.24880)"
    assert matches({**paper, **PORTS["TileKernels 1.0.0"]}) == "TileKernels 1.0.0"
    assert matches({**paper, "sk_init": "softmax_eps"}) == "Liger (LigerMHC)"
    assert matches({**paper, "res_apply": "HT"}) == "none of the ports in docs/BASELINES.md"


def test_the_report_shows_the_conventions_of_each_timed_mhc_case(tmp_path):
    tk = PORTS["TileKernels 1.0.0"]
    with RunWriter(tmp_path, "run", "s") as w:
        cases = expand(["prenorm", "mhc"], TINY, [16], [2], ["fwd"]) + \
            expand(["mhc"], TINY, [16], [2], ["fwd"], options={"mhc": tk})
        run_sweep(cases, torch.device("cpu"), w, FAST, progress=False)
    t = conventions_table(load_frame([tmp_path])).set_index("matches")
    assert set(t.index) == {"paper (arXiv:2512.24880)", "TileKernels 1.0.0"}
    assert t.loc["TileKernels 1.0.0", ["sk_init", "sk_iters", "res_apply", "post_mult"]].tolist() == \
        ["softmax_eps", 10, "HT", 1.0]
    assert t.loc["paper (arXiv:2512.24880)", ["sk_init", "sk_iters", "res_apply", "post_mult"]].tolist() == \
        ["exp", 20, "H", 2.0]
    md = build_report([tmp_path], tmp_path / "rep")["report.md"].read_text()
    assert "TileKernels 1.0.0" in md and "softmax_eps" in md and "paper (arXiv:2512.24880)" in md


def test_the_memory_table_shows_the_n_stream_state(tmp_path):
    """shc carries n = 4 copies of the residual: its router state is 4× prenorm's; mhc adds its
    float32 coefficients (n² + 2n per token)."""
    from reports.tables import overhead_table
    with RunWriter(tmp_path, "run", "s") as w:
        run_sweep(expand(["prenorm", "shc", "mhc"], TINY, [16], [2], ["fwd"]), torch.device("cpu"), w,
                  FAST, progress=False)
    t = overhead_table(load_frame([tmp_path])).set_index("router")
    assert t.loc["prenorm", "state_ratio"] == 1.0 and t.loc["shc", "state_ratio"] == 4.0
    assert t.loc["mhc", "state_ratio"] == (4 * 16 + 24) / 16
