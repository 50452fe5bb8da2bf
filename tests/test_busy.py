"""The summary quotes every backend a run timed, and flags host-bound eager ratios on a GPU."""

from __future__ import annotations

import tarfile

import pytest

from harness.rundir.writer import RunWriter
from reports import load_frame
from reports.busy import busy_share
from reports.summary import cost_sentences

from paths import H200_RUNS


def _rows(w, router, backend, times, mode="fwd_bwd"):
    for i, ms in enumerate(times):
        w.write(case_key=f"{router}|{backend}|{mode}", router=router, impl="naive", backend=backend,
                compile_mode="default" if backend == "compile" else None, mode=mode,
                workload="decoder", d_model=16, n_layers=2, n_heads=2, seq_len=8, batch_size=2,
                dtype="float32", seed=0, metric="step_time", value=ms, unit="ms", repeat=i, pair=i, attempt=1)


def _run(path, device, backends):
    """prenorm at 13.6 ms eager, 4.95 ms replayed; haares 1.5× eager, 1.2× replayed (fwd_bwd) and
    eager only in train_step (the heavier mode, with fewer backends)."""
    base = {"eager": 13.6, "cudagraph": 4.95}
    with RunWriter(path, "r", "s", base={"device": device}) as w:
        with w.unit(["x"], kind="group") as u:
            for backend, ratio in (("eager", 1.5), ("cudagraph", 1.2)):
                if backend in backends:
                    _rows(u, "prenorm", backend, [base[backend]] * 6)
                    _rows(u, "haares", backend, [ratio * base[backend]] * 6)
            _rows(u, "prenorm", "eager", [14.0] * 6, mode="train_step")
            _rows(u, "haares", "eager", [1.4 * 14.0] * 6, mode="train_step")
    return cost_sentences(load_frame([path]))


def test_busy_share_is_replayed_over_eager_and_none_without_a_time():
    assert busy_share(13.6, 4.95) == pytest.approx(0.364, abs=1e-3)
    assert busy_share(4.0, 5.0) == 1.0
    assert busy_share(13.6, float("nan")) is None and busy_share(None, 4.95) is None
    assert busy_share(0.0, 4.95) is None


def test_a_cuda_run_with_graph_rows_quotes_both_backends_and_flags_eager_host_bound(tmp_path):
    said, table = _run(tmp_path, "cuda", ("eager", "cudagraph"))
    row = table.iloc[0]
    assert row["mode"] == "fwd_bwd"  # the mode with two backends, not the heavier train_step
    assert row.busy_share == pytest.approx(4.95 / 13.6)
    assert said == ["haares naive over prenorm at d=16, 2 layers, T=8, B=2, fwd_bwd: +50 % eager "
                    "[CI 50 to 50 %] (host-bound: the GPU was busy 36 % of the step); +20 % graph "
                    "replay [CI 20 to 20 %]; graph replay measures the router's device cost, eager "
                    "mostly host overhead."]


def test_a_cuda_run_without_graph_rows_says_nothing_of_the_host(tmp_path):
    said, _ = _run(tmp_path, "cuda", ("eager",))
    assert said == ["haares naive over prenorm at d=16, 2 layers, T=8, B=2, train_step: +40 % eager "
                    "[CI 40 to 40 %]."]


def test_a_cpu_eager_run_keeps_its_sentence(tmp_path):
    said, table = _run(tmp_path, "cpu", ("eager",))
    assert said == ["haares naive over prenorm at d=16, 2 layers, T=8, B=2, train_step: +40 % eager "
                    "[CI 40 to 40 %]."]
    assert table.busy_share.isna().all()


@pytest.mark.skipif(not H200_RUNS.exists(), reason=f"{H200_RUNS} absent")
def test_the_h200_graph_run_quotes_graph_replay_and_flags_host_bound_eager(tmp_path):
    with tarfile.open(H200_RUNS) as tar:
        tar.extractall(tmp_path, members=[m for m in tar.getmembers()
                                          if "gpu-check-graph" in m.name], filter="data")
    run = next(tmp_path.rglob("gpu-check-graph"))
    said, table = cost_sentences(load_frame([run]))
    full = next(s for s in said if s.startswith("full_attnres "))
    assert "fwd_bwd" in full and "% graph replay [CI" in full
    assert table.loc[table.router == "full_attnres", "cudagraph_ratio"].iloc[0] > 1
    assert "% eager [CI" in full and "(host-bound: the GPU was busy 36 % of the step)" in full
