"""Noise readings of a timed group, the noisy flag, and re-measuring a noisy group while its steps
are held (harness/timing/noise.py, harness/sweep/timed.py)."""

from __future__ import annotations

import os

import multiprocessing as mp
import time
from dataclasses import replace

import pandas as pd
import pytest
import torch

from harness.rundir.records import load_rows
from harness.rundir.writer import RunWriter
from harness.sweep.cases import expand
from harness.sweep.options import SweepOptions
from harness.sweep.run import run_sweep
from harness.timing import noise
from harness.timing.timer import TimingPolicy
from workloads.config import DecoderConfig

TINY = DecoderConfig(vocab_size=32, d_model=16, n_layers=2, n_heads=2, seq_len=8, batch_size=2)
OPTS = SweepOptions(flops=False, memory=False, paired=True,
                    timing=TimingPolicy(warmup_min_count=1, warmup_min_s=0.0, repeats=6))
CPU = torch.device("cpu")
NEVER = {"cpu_util_min": 0.0, "cpu_pressure_max": 1.0, "iqr_rel_max": 1e9, "ci_width_rel_max": 1e9}
ALWAYS = dict(NEVER, cpu_util_min=1e9)  # no process reaches 1e9 × its threads


def test_thresholds_flag_each_reading_and_ignore_missing_ones():
    quiet = {"cpu_util": 0.9, "cpu_pressure": 0.01, "iqr_rel": 0.02, "ci_width_rel": 0.03}
    assert noise.noise_reasons(quiet) == []
    loud = {"cpu_util": 0.2, "cpu_pressure": 0.6, "iqr_rel": 0.5, "ci_width_rel": 0.4}
    assert noise.noise_reasons(loud) == ["cpu_util 0.200 < 0.35", "cpu_pressure 0.600 > 0.2",
                                         "iqr_rel 0.500 > 0.15", "ci_width_rel 0.400 > 0.15"]
    assert noise.noise_reasons({"cpu_pressure": float("nan")}) == []
    assert noise.noise_reasons({"iqr_rel": 0.2}, noise.check_thresholds({"iqr_rel_max": 0.25})) == []
    with pytest.raises(ValueError, match="unknown threshold 'iqr'"):
        noise.check_thresholds({"iqr": 1})
    for bad in (-1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="cpu_util_min must be a finite number >= 0"):
            noise.check_thresholds({"cpu_util_min": bad})
    assert noise.iqr_rel([1.0, 2.0, 3.0, 4.0, 5.0]) == pytest.approx(2.0 / 3.0)


def _sweep(tmp_path, opts) -> pd.DataFrame:
    cases = expand(["prenorm", "haares"], TINY, [16], [2], ["fwd"])
    with RunWriter(tmp_path, "r", "s") as w:
        run_sweep(cases, CPU, w, opts, progress=False)
    return pd.DataFrame(load_rows([tmp_path]))


def test_a_busy_machine_is_said_at_the_start_from_cpu_pressure(tmp_path, monkeypatch):
    """``/proc/pressure/cpu``'s "some avg10" (percent) above cpu_pressure_max (a ratio) warns;
    at or below it, without the file, or unreadable, nothing is said (the load average planted
    quiet)."""
    line = "some avg10={} avg60=1.00 avg300=0.50 total=123\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"
    warn = noise.busy_warning(line.format("52.00"))
    assert warn.startswith("warning: this machine is busy") and "52 %" in warn and "above 20 %" in warn
    assert "timed again only once the load has dropped, else it keeps its first timing" in warn
    assert noise.busy_warning(line.format("20.00")) is None  # the threshold itself is quiet
    assert noise.busy_warning(line.format("20.01")) is not None
    assert noise.busy_warning("") is None and noise.busy_warning("some avg10=x total=1") is None
    absent = tmp_path / "no-psi"
    monkeypatch.setattr(noise, "PRESSURE_FILE", absent)
    assert noise.busy_warning() is None
    absent.write_text(line.format("75.50"))
    assert "76 %" in noise.busy_warning()


class _Clock:
    """A planted /proc/stat and monotonic clock: ``tick(wall_s, busy_cpus)`` moves the wall clock
    by ``wall_s`` while the machine's tasks ran ``busy_cpus`` CPUs (this process none)."""

    def __init__(self, tmp_path, monkeypatch):
        from harness.timing import others
        self.stat, self.now, self.busy = tmp_path / "stat", 1000.0, 5000.0
        monkeypatch.setattr(others, "STAT_FILE", self.stat)
        monkeypatch.setattr(others.time, "monotonic", lambda: self.now)
        monkeypatch.setattr(others, "own_seconds", lambda: 7.0)
        self._write()
        others.mark()

    def _write(self):
        hz = os.sysconf("SC_CLK_TCK")
        self.stat.write_text(f"cpu  {int(self.busy * hz)} 0 0 90000 0 0 0 0 0 0\ncpu0 1 0 0 1 0 0 0 0 0 0\n")

    def tick(self, wall_s: float, busy_cpus: float):
        self.now += wall_s
        self.busy += wall_s * busy_cpus
        self._write()


def test_cores_held_by_other_work_are_busy_before_any_task_waits(tmp_path, monkeypatch):
    """Two busy loops on two idle cores: CPU pressure near 0 (no task waits yet), while other work
    holds about 2 CPUs since the command started (/proc/stat less this process). Above
    LOAD_SHARE_MAX of the CPUs is busy: the start warns, the plan's high end allows for it, and the
    manifest's reading leaves the run out of calibration."""
    from harness.costs import forecast as fc
    psi = tmp_path / "pressure"
    psi.write_text("some avg10=2.04 avg60=1.05 avg300=0.83 total=1\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")
    monkeypatch.setattr(noise, "PRESSURE_FILE", psi)
    monkeypatch.setattr(noise, "cpu_count", lambda: 2)
    clock = _Clock(tmp_path, monkeypatch)
    clock.tick(2.0, 1.0)  # half the CPUs: the threshold itself is quiet
    assert noise.machine_load()["busy"] == [] and noise.busy_warning() is None and fc.load_now() is None
    clock.tick(2.0, 2.8)  # since the mark: 1.9 CPUs on average
    m = noise.machine_load()
    assert m == {"pressure": pytest.approx(0.0204), "others": pytest.approx(1.9), "load_avg": 0.0, "cpus": 2,
                 "busy": ["other work holds 1.9 of 2 CPUs (/proc/stat since this command started, busy above 1)"]}
    assert "busy before the start: other work holds 1.9 of 2 CPUs" in noise.busy_warning()
    assert fc.load_now() == {"factor": 1.95, "pressure": pytest.approx(0.0204), "others": pytest.approx(1.9),
                             "load_avg": 0.0, "cpus": 2}
    assert fc.describe_load(fc.load_now()) == ("busy now: the high end allows ×1.95 for the load (other work "
                                               "holds 1.9 of 2 CPUs, CPU pressure 2 %)")
    session = {"cpu_pressure_start": 0.0204, "others_start": 1.9, "load_avg_start": 0.3, "cpus": 2}
    assert fc.busy_start({"sessions": [session]})
    assert not fc.busy_start({"sessions": [{**session, "others_start": 0.4, "load_avg_start": 1.9}]})
    assert fc.busy_start({"sessions": [{"cpu_pressure_start": 0.02, "load_avg_start": 1.9, "cpus": 2}]})  # older
    assert not fc.busy_start({"sessions": [{"cpu_pressure_start": 0.0204}]})  # an older manifest still


def test_the_previous_commands_tail_is_not_other_work(tmp_path, monkeypatch):
    """A command started right after another reads that one's load in the 1-minute load average
    (1.9 on 2 CPUs) while nothing else runs: what other work holds since this command started is
    ~0, so it neither warns nor widens its plan. Where /proc/stat cannot be read the load average
    stands in, tail and all."""
    from harness.costs import forecast as fc
    from harness.timing import others
    loadavg = tmp_path / "loadavg"
    loadavg.write_text("1.90 1.07 0.64 1/83 23347\n")
    monkeypatch.setattr(noise, "LOADAVG_FILE", loadavg)
    monkeypatch.setattr(noise, "cpu_count", lambda: 2)
    clock = _Clock(tmp_path, monkeypatch)
    clock.tick(3.0, 0.05)
    m = noise.machine_load()
    assert m["load_avg"] == 1.9 and m["others"] == pytest.approx(0.05, abs=0.01) and m["busy"] == []
    assert noise.busy_warning() is None and fc.load_now() is None
    monkeypatch.setattr(others, "STAT_FILE", tmp_path / "absent")
    assert noise.machine_load()["busy"] == ["the load average is 1.9 on 2 CPUs (busy above 1)"]


def test_other_work_excludes_this_process_tree(tmp_path, monkeypatch):
    """The CPU seconds this process (and its waited-for children) ran in the window are not other
    work: the machine ran 2 CPUs for 2 s, 1.5 CPU-seconds of which were this process's own."""
    from harness.timing import others
    clock = _Clock(tmp_path, monkeypatch)
    own = iter([8.5])
    monkeypatch.setattr(others, "own_seconds", lambda: next(own))
    clock.tick(2.0, 2.0)
    assert others.held_by_others() == pytest.approx((4.0 - 1.5) / 2.0)
    assert others.busy_seconds("cpu  300 0 100 5000 7 1 1 0 0 0\n") == pytest.approx(
        402 / os.sysconf("SC_CLK_TCK"))  # user, nice, system, irq, softirq, steal: not idle or iowait
    assert others.busy_seconds("nothing here") is None


def test_a_noisy_group_is_timed_again_and_every_attempt_is_kept(tmp_path):
    df = _sweep(tmp_path / "a", replace(OPTS, noise_thresholds=ALWAYS, max_attempts=3, remeasure_s=600))
    st = df[df.metric == "step_time"]
    assert sorted(set(st.attempt)) == [1, 2, 3]
    assert st.groupby(["router", "attempt"]).size().tolist() == [6] * 6  # every attempt whole
    readings = df[df.metric.isin(["cpu_util", "load_avg", "iqr_rel", "ci_width_rel"])]
    assert set(readings.metric) >= {"cpu_util", "iqr_rel", "ci_width_rel"}
    assert set(readings[readings.metric == "ci_width_rel"].router) == {"haares"}  # the ratio's side
    # A quiet group, or no time left, is timed once.
    for opts in (replace(OPTS, noise_thresholds=NEVER), replace(OPTS, noise_thresholds=ALWAYS, remeasure_s=0)):
        d = tmp_path / f"q{len(list(tmp_path.iterdir()))}"
        assert set(_sweep(d, opts).query("metric == 'step_time'").attempt) == {1}


def test_a_multiresolution_router_is_retimed_with_block_attnres_as_its_partner(tmp_path):
    """A noisy haares is timed again with prenorm and block_attnres of its impl and backend (its
    paper baseline), so its last timing still pairs with block_attnres; block_attnres's rows of
    that timing name haares in pairs_with. The partners of a compiled case add its eager twin."""
    from harness.sweep.timed import partners
    cases = expand(["prenorm", "block_attnres", "haares"], TINY, [16], [2], ["fwd"], impls=["two_phase"],
                   backends=["eager", "compile"])
    by = {(c.router, c.backend): c for c in cases}
    assert partners(by["haares", "eager"], cases) == [by["prenorm", "eager"], by["block_attnres", "eager"]]
    assert partners(by["haares", "compile"], cases) == [by["prenorm", "compile"], by["block_attnres", "compile"],
                                                        by["haares", "eager"]]
    assert partners(by["block_attnres", "eager"], cases) == [by["prenorm", "eager"]]
    eager = [c for c in cases if c.backend == "eager"]
    with RunWriter(tmp_path, "r", "s") as w:
        # a ratio's spread flags the routers, never prenorm (no ratio of its own): each is re-timed alone
        run_sweep(eager, CPU, w, replace(OPTS, noise_thresholds=dict(NEVER, ci_width_rel_max=0.0), max_attempts=2,
                                         remeasure_s=600), progress=False)
    rows = pd.DataFrame(load_rows([tmp_path]))
    h = by["haares", "eager"].key
    retime = rows[(rows.metric == "step_time") & (rows.pairs_with == h)]
    assert set(retime.router) == {"prenorm", "block_attnres"}
    from reports import load_frame
    from reports.paper_baseline import paired_vs_paper_table
    t = paired_vs_paper_table(load_frame([tmp_path]))
    assert len(t) == 1 and t.pairs.iloc[0] == 6 and t.vs_paper.iloc[0] > 0 and t.no_pair.iloc[0] == ""


def _spin(stop):
    """Keep one core busy until ``stop`` is set."""
    spins = 0
    while not stop.is_set():
        spins += 1


@pytest.mark.slow
@pytest.mark.skipif(noise.pressure_total_us() is None, reason="no /proc/pressure/cpu (Linux PSI) here")
def test_a_group_timed_under_load_is_flagged_noisy(tmp_path, real_machine):
    """The same group timed quiet, then with four busy processes on the cores: the loaded timing's
    readings cross the thresholds (the quiet one's may too on a busy machine; it is not asserted)."""
    opts = replace(OPTS, max_attempts=1)
    quiet = _sweep(tmp_path / "quiet", opts)
    stop = mp.Event()
    spinners = [mp.Process(target=_spin, args=(stop,), daemon=True) for _ in range(4)]
    for p in spinners:
        p.start()
    time.sleep(0.5)
    try:
        loaded = _sweep(tmp_path / "loaded", opts)
    finally:
        stop.set()
        for p in spinners:
            p.join(timeout=10)
    def reasons(df):
        m = df[df.router == "haares"].set_index("metric")["value"]
        return noise.noise_reasons(m.to_dict())
    assert reasons(loaded), loaded[loaded.metric.isin(list(noise.UNITS))][["metric", "value"]]
    slow = (loaded[loaded.metric == "step_time"].value.median() /
            quiet[quiet.metric == "step_time"].value.median())
    print(f"loaded/quiet median step time {slow:.1f}x; quiet reasons {reasons(quiet)}")
    # The loaded group's summary quotes its own paired ratio (or calls it imprecise), flagged
    # noisy; nothing is stated across the two timings, which were not paired.
    from reports import build_report
    from reports.frame import load_frame
    from reports.summary import cost_sentences
    build_report([tmp_path / "loaded"], tmp_path / "rep")
    said, table = cost_sentences(load_frame([tmp_path / "loaded"]))
    pt = pd.read_csv(tmp_path / "rep" / "paired.csv")
    assert table.eager_ratio.iloc[0] == pytest.approx(pt.ratio.iloc[0])
    pct = f"{(pt.ratio.iloc[0] - 1) * 100:+.0f} % eager".replace("-", "\u2212")
    assert pct in said[0] and "(noisy group)" in said[0]  # the number, flagged, never withheld


def test_a_noisy_group_on_a_machine_still_busy_keeps_its_first_timing_flagged(tmp_path, monkeypatch):
    """With the load planted at 60 % (fault ``busy=60``, above cpu_pressure_max 0.2) when the noisy
    cases would be re-timed, nothing is timed again: one attempt, a ``left_noisy`` row with the
    reading, and the report's warnings say so; a quiet machine (``busy=0``) re-times them."""
    from reports import build_report
    loud = dict(ALWAYS, cpu_pressure_max=0.2)
    monkeypatch.setenv("ROUTERBENCH_FAULT", "busy=60:*")
    df = _sweep(tmp_path / "busy", replace(OPTS, noise_thresholds=loud, max_attempts=3, remeasure_s=600))
    st = df[df.metric == "step_time"]
    assert set(st.attempt) == {1} and st.groupby("router").size().tolist() == [6, 6]
    left = df[df.metric == "left_noisy"]
    assert left.value.tolist() == [0.6, 0.6] and left.attempt.tolist() == [1, 1]  # each noisy case, once
    md = (build_report([tmp_path / "busy"], tmp_path / "rep", noise_thresholds=loud)["report.md"]).read_text()
    assert ("Load: 2 noisy cases kept their first timing, flagged noisy, because the machine was still busy "
            "when they would have been timed again (a task waited for a CPU up to 60% of the last 10 s)") in md
    monkeypatch.setenv("ROUTERBENCH_FAULT", "busy=0:*")
    df = _sweep(tmp_path / "quiet", replace(OPTS, noise_thresholds=loud, max_attempts=2, remeasure_s=600))
    assert set(df[df.metric == "step_time"].attempt) == {1, 2} and "left_noisy" not in set(df.metric)


def test_the_busy_fault_takes_a_percentage():
    from harness.rundir import faults
    assert faults.parse("busy=0:*;busy=100:x") == [("busy", "*", 0), ("busy", "x", 100)]
    for bad in ("busy:*", "busy=101:*"):
        with pytest.raises(ValueError, match="busy needs its CPU pressure"):
            faults.parse(bad)


def test_progress_names_a_left_noisy_case_by_its_fields():
    """The eager and compiled cases of one router are told apart on the progress line (they once
    both read "haares", cut from the case key)."""
    from harness.sweep.timed import _who
    eager, = expand(["haares"], TINY, [16], [2], ["fwd_bwd"], impls=["two_phase"])
    compiled = replace(eager, backend="compile", compile_mode="default", compile_scope="model")
    assert _who(eager) == "haares two_phase eager" and _who(compiled) == "haares two_phase compile"
