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
                    "[CI 50 to 50 %] (host-bound: the GPU was busy 36 % of prenorm's eager step); +20 % graph "
                    "replay [CI 20 to 20 %]; graph replay measures the router's device cost, eager "
                    "mostly host overhead; block_attnres naive was not timed in the same group, so no paired ratio to it."]


def test_a_cuda_run_without_graph_rows_says_nothing_of_the_host(tmp_path):
    said, _ = _run(tmp_path, "cuda", ("eager",))
    assert said == ["haares naive over prenorm at d=16, 2 layers, T=8, B=2, train_step: +40 % eager "
                    "[CI 40 to 40 %]; block_attnres naive was not timed in the same group, so no paired ratio to it."]


def test_a_cpu_eager_run_keeps_its_sentence(tmp_path):
    said, table = _run(tmp_path, "cpu", ("eager",))
    assert said == ["haares naive over prenorm at d=16, 2 layers, T=8, B=2, train_step: +40 % eager "
                    "[CI 40 to 40 %]; block_attnres naive was not timed in the same group, so no paired ratio to it."]
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
    assert "% eager [CI" in full and "(host-bound: the GPU was busy 36 % of prenorm's eager step)" in full
    assert set(table.busy_of) == {"prenorm"}  # inferred from prenorm's graph rows, not traced per router


# --- measured: the traced device-busy share and NVML readings (harness/timing/gpu.py) ----------
def test_busy_union_counts_overlaps_once_over_the_span():
    from harness.timing.gpu import busy_union_share
    # kernels 0-10 and 5-15 overlap (busy 0-15), then a gap, then 20-30: 25 µs busy of 30
    assert busy_union_share([(20, 30), (0, 10), (5, 15)]) == pytest.approx(25 / 30)
    assert busy_union_share([(0, 10), (10, 20)]) == 1.0  # back to back: never idle
    assert busy_union_share([(0, 1), (99, 100)]) == pytest.approx(0.02)
    assert busy_union_share([]) is None and busy_union_share([(5, 5)]) is None


def test_device_busy_share_reads_only_the_trace_of_a_cuda_device():
    import torch

    from harness.timing.gpu import device_busy_share, device_intervals
    calls = []
    assert device_busy_share(lambda: calls.append(1), torch.device("cpu")) is None and not calls
    with pytest.raises(ValueError, match="steps must be >= 2"):
        device_busy_share(lambda: None, torch.device("cpu"), steps=1)

    class Ev:  # a profiler event: kernels are device_type CUDA, host calls CPU
        def __init__(self, dev, s, e):
            self.device_type = dev
            self.time_range = type("R", (), {"start": s, "end": e})()

    cuda, cpu = torch.autograd.DeviceType.CUDA, torch.autograd.DeviceType.CPU
    assert device_intervals([Ev(cuda, 0, 4), Ev(cpu, 0, 100), Ev(cuda, 6, 10)]) == [(0, 4), (6, 10)]


class FakeNvml:
    """pynvml's calls the probe makes, with planted readings (one per sample, the last repeated)."""

    NVML_CLOCK_SM, NVML_TEMPERATURE_GPU = 1, 0

    def __init__(self, clocks, temps, reasons):
        self.clocks, self.temps, self.reasons, self.n = clocks, temps, reasons, 0

    def _at(self, seq):
        return seq[min(self.n, len(seq) - 1)]

    def nvmlDeviceGetClockInfo(self, h, kind):
        assert kind == self.NVML_CLOCK_SM and h == "h"
        return self._at(self.clocks)

    def nvmlDeviceGetTemperature(self, h, kind):
        return self._at(self.temps)

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        v = self._at(self.reasons)
        self.n += 1  # the last call of a sample
        return v


def test_the_gpu_probe_reads_clock_spread_hottest_reading_and_every_throttle_reason():
    import torch

    from harness.timing.gpu import GpuProbe, throttle_text
    nvml = FakeNvml(clocks=[1980, 1980, 1755], temps=[61, 70, 66], reasons=[0x0, 0x4, 0x20])
    probe = GpuProbe(torch.device("cpu"), nvml=nvml, handle="h", sample_s=3600)  # no sample from the thread
    with probe:
        nvml.n = 1
        probe.sample()
    m = probe.metrics()
    assert m["sm_clock_spread"] == pytest.approx((1980 - 1755) / 1980)
    assert m["gpu_temp_max"] == 70 and int(m["throttle_reasons"]) == 0x24
    assert throttle_text(0x24) == "software power cap, software thermal slowdown"
    assert throttle_text(0) == "none" and throttle_text(0x10000) == "0x10000"
    assert GpuProbe(torch.device("cpu")).metrics() == {}  # a CPU: no NVML readings


def test_a_clock_that_moved_makes_the_timing_noisy():
    from harness.timing.noise import THRESHOLDS, noise_reasons
    assert noise_reasons({"sm_clock_spread": 0.114}) == ["sm_clock_spread 0.114 > 0.1"]
    assert noise_reasons({"sm_clock_spread": 0.02, "gpu_temp_max": 90.0, "throttle_reasons": 4.0}) == []
    old = {k: v for k, v in THRESHOLDS.items() if k != "sm_clock_spread_max"}  # a report's own thresholds
    assert noise_reasons({"sm_clock_spread": 0.5}, old) == ["sm_clock_spread 0.500 > 0.1"]


def test_a_recorded_busy_share_is_the_routers_own_and_wins_over_the_inferred_one(tmp_path):
    """prenorm's eager step 13.6 ms vs 4.95 ms replayed infers 36 %; the sweep traced haares's own
    eager step busy 55 % of the time: the sentence quotes 55 %."""
    with RunWriter(tmp_path, "r", "s", base={"device": "cuda"}) as w:
        with w.unit(["x"], kind="group") as u:
            for backend, base, ratio in (("eager", 13.6, 1.5), ("cudagraph", 4.95, 1.2)):
                _rows(u, "prenorm", backend, [base] * 6)
                _rows(u, "haares", backend, [ratio * base] * 6)
            u.write(case_key="haares|eager|fwd_bwd", router="haares", impl="naive", backend="eager",
                    mode="fwd_bwd", workload="decoder", d_model=16, n_layers=2, n_heads=2, seq_len=8,
                    batch_size=2, dtype="float32", seed=0, metric="device_busy", value=0.55, unit="ratio")
    said, table = cost_sentences(load_frame([tmp_path]))
    assert table.iloc[0].busy_share == pytest.approx(0.55) and table.iloc[0].busy_of == "router"
    assert "(host-bound: the GPU was busy 55 % of the step)" in said[0]


def test_the_report_says_which_gpu_readings_a_cuda_run_has(tmp_path):
    from reports.cautions import gpu_readings
    _run(tmp_path / "a", "cuda", ("eager",))
    assert gpu_readings(load_frame([tmp_path / "a"]))[0].startswith(
        "GPU readings: these CUDA timings were taken without nvidia-ml-py")
    _run(tmp_path / "c", "cpu", ("eager",))
    assert gpu_readings(load_frame([tmp_path / "c"])) == []
    with RunWriter(tmp_path / "b", "r", "s", base={"device": "cuda"}) as w:
        with w.unit(["x"], kind="group") as u:
            _rows(u, "prenorm", "eager", [13.6] * 6)
            for metric, value in (("sm_clock_spread", 0.031), ("gpu_temp_max", 71.0), ("throttle_reasons", 0x5)):
                u.write(case_key="prenorm|eager|fwd_bwd", router="prenorm", impl="naive", backend="eager",
                        mode="fwd_bwd", workload="decoder", d_model=16, n_layers=2, n_heads=2, seq_len=8,
                        batch_size=2, dtype="float32", seed=0, metric=metric, value=value, unit="x", attempt=1)
    assert gpu_readings(load_frame([tmp_path / "b"])) == [
        "GPU readings (NVML, sampled every 20 ms over each timing): the SM clock moved by at most 3.1 % "
        "within a timing; the hottest reading was 71 °C; clock-event reasons seen: software power cap."]


@pytest.mark.cuda
@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a CUDA device")
def test_on_a_gpu_a_host_bound_step_reads_less_busy_than_one_long_kernel():
    """Many tiny kernels launched from Python leave the GPU idle between them; one large matmul
    keeps it busy: the traced shares order so, each in (0, 1]."""
    import torch

    from harness.timing.gpu import GpuProbe, device_busy_share
    dev = torch.device("cuda")
    small = torch.ones(8, device=dev)
    big = torch.randn(4096, 4096, device=dev)

    def tiny():
        for _ in range(200):
            small.add_(1.0)

    def heavy():
        big @ big

    tiny(), heavy()
    busy_tiny, busy_heavy = device_busy_share(tiny, dev), device_busy_share(heavy, dev)
    assert 0 < busy_tiny < busy_heavy <= 1.0 and busy_heavy > 0.8
    with GpuProbe(dev) as probe:
        heavy()
        torch.cuda.synchronize()
    if probe.available:  # nvidia-ml-py installed: a clock, a temperature, a bitmask
        m = probe.metrics()
        assert 0 <= m["sm_clock_spread"] < 1 and m["gpu_temp_max"] > 0 and m["throttle_reasons"] >= 0


def test_a_backend_that_failed_is_said_with_why_where_it_failed(tmp_path):
    """haares compiled failed in fwd_bwd (an error row, no timing): its sentence is taken in
    fwd_bwd, where two backends were planned, not in train_step where only eager ran, and says
    why; a backend never planned says nothing."""
    with RunWriter(tmp_path, "r", "s", base={"device": "cpu"}) as w:
        with w.unit(["x"], kind="group") as u:
            _rows(u, "prenorm", "eager", [10.0] * 6)
            _rows(u, "haares", "eager", [15.0] * 6)
            _rows(u, "prenorm", "compile", [8.0] * 6)
            u.write(case_key="haares|compile|fwd_bwd", router="haares", impl="naive", backend="compile",
                    compile_mode="default", mode="fwd_bwd", workload="decoder", d_model=16, n_layers=2,
                    n_heads=2, seq_len=8, batch_size=2, dtype="float32", seed=0, metric="step_time",
                    unit="ms", status="error", error="BackendCompilerFailed: backend='inductor' raised:\n  boom")
            _rows(u, "prenorm", "eager", [14.0] * 6, mode="train_step")
            _rows(u, "haares", "eager", [1.4 * 14.0] * 6, mode="train_step")
    said, table = cost_sentences(load_frame([tmp_path]))
    assert said == ["haares naive over prenorm at d=16, 2 layers, T=8, B=2, fwd_bwd: +50 % eager [CI 50 to 50 %]; "
                    "compiled failed: BackendCompilerFailed: backend='inductor' raised: boom; block_attnres naive was not timed in the same group, so no paired ratio to it."]
    assert table["compile_failed"].iloc[0].startswith("failed: BackendCompilerFailed")
    assert "cudagraph_failed" not in table


def test_summary_tables_quote_the_intervals_of_its_sentences(tmp_path):
    """The terminal summary's table and its sentences come from the same bootstrap: a pair's
    interval reads the same in both (they once drew different resamples)."""
    from click.testing import CliRunner

    from harness.cli import main
    from reports.summary import cost_summary
    with RunWriter(tmp_path, "r", "s", base={"device": "cpu"}) as w:
        with w.unit(["x"], kind="group") as u:
            _rows(u, "prenorm", "eager", [10.0, 11.0, 9.0, 12.0, 10.5, 11.5, 9.5, 10.2])
            _rows(u, "haares", "eager", [15.0, 13.0, 17.0, 14.0, 16.5, 12.5, 15.5, 14.4])
    row = cost_summary(load_frame([tmp_path])).iloc[0]
    out = CliRunner().invoke(main, ["summary", str(tmp_path)]).output
    assert f"{row['eager_ratio']:.3f} [{row['eager_lo']:.3f}, {row['eager_hi']:.3f}]" in out, out


def test_a_race_on_fewer_threads_is_said_in_the_warnings():
    from reports.cautions import race_threads
    m = {"command": "run", "sessions": [{"race_threads": {"threads": 1, "instead_of": 2, "load": {}}}]}
    assert race_threads({"r1": m}) == [
        "Race on fewer threads: run r1's smoke race trained on 1 thread, not 2, because the machine was "
        "busy at its start (manifest: race_threads); its per-step times are those of that thread count, the "
        "same for both sides of each pair."]
    assert race_threads({"r2": {"command": "run", "sessions": [{}]}}) == [] and race_threads({}) == []
