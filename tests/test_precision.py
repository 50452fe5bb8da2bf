"""Timing to a precision target and re-timing only what is noisy (harness/sweep/timed.py): the
rows it writes, the report's and the gate's reading of them, and the options that set it."""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
import torch
from click.testing import CliRunner

from harness.ci.gate import settle_note
from harness.cli import main
from harness.rundir.records import load_rows
from harness.rundir.writer import RunWriter
from harness.stats.sequential import LookSchedule, median_interval
from harness.sweep import timed
from harness.sweep.cases import expand
from harness.sweep.options import SweepOptions
from harness.sweep.run import run_sweep
from harness.timing.timer import TimingPolicy
from reports import load_frame, paired_ratio_table
from workloads.config import DecoderConfig

TINY = DecoderConfig(vocab_size=32, d_model=16, n_layers=2, n_heads=2, seq_len=8, batch_size=2)
CPU = torch.device("cpu")
QUIET = {"cpu_util_min": 0.0, "cpu_pressure_max": 1.0, "iqr_rel_max": 100.0, "ci_width_rel_max": 100.0}
PRECISE = SweepOptions(flops=False, memory=False, timing=TimingPolicy(warmup_min_count=1, warmup_min_s=0.0),
                       max_attempts=1, noise_thresholds=QUIET, precision_target=1.0, min_pairs=6, max_rounds=20)


def _spin(ms: float):
    def step():
        end = time.perf_counter() + ms / 1e3
        while time.perf_counter() < end:
            pass
    return step


def _group(tmp_path, opts, spins=(2.0, 3.0)):
    cases = expand(["prenorm", "rezero"], TINY, [16], [2], ["fwd"])
    steps = {c.key: _spin(ms) for c, ms in zip(cases, spins)}
    with RunWriter(tmp_path, "run", "s") as w, w.unit([c.key for c in cases], kind="group") as u:
        got = timed.time_group(cases, steps, CPU, u, opts)
        u.commit(got.status)
    rows = pd.DataFrame(load_rows([tmp_path]))
    return cases, got, rows[rows.metric == "step_time"]


def test_a_reachable_target_stops_precise_at_the_first_look(tmp_path):
    cases, got, st = _group(tmp_path, PRECISE)
    sched = LookSchedule.make(6, 20)
    assert sched.looks == (10, 16, 20)  # 6 pairs give no interval at 1 − α/4: that look is dropped
    assert set(st.stop) == {"precise"} and set(st.n_pairs) == {10} and len(st) == 20
    assert st.ci_conf.unique().tolist() == [pytest.approx(sched.conf)]
    # the report's interval is the rule's own, at that level (not the bootstrap)
    t = paired_ratio_table(load_frame([tmp_path]))
    a, b = (st[st.router == r].sort_values("pair").value.to_numpy() for r in ("prenorm", "rezero"))
    assert (t.ratio.iloc[0], t.ratio_lo.iloc[0], t.ratio_hi.iloc[0]) == median_interval(b / a, sched.conf)
    assert t.interval.iloc[0] == f"rule {sched.conf:.2%}" and t.stop.iloc[0] == "precise"


def test_an_unreachable_target_stops_at_the_last_look_or_the_budget(tmp_path):
    _, _, st = _group(tmp_path / "max", replace(PRECISE, precision_target=1e-9, max_rounds=10))
    assert set(st.stop) == {"max_rounds"} and set(st.n_pairs) == {10}  # one look: 6 pairs give no interval
    _, _, st = _group(tmp_path / "budget", replace(PRECISE, precision_target=1e-9, group_budget_s=1e-4))
    # the budget allows no round at the warm-up round's pace: the first look is still timed
    assert set(st.stop) == {"budget"} and set(st.n_pairs) == {6}


def test_fixed_rounds_keep_the_bootstrap(tmp_path):
    _, _, st = _group(tmp_path, replace(PRECISE, precision_target=None, timing=TimingPolicy(
        warmup_min_count=1, warmup_min_s=0.0, repeats=7)))
    assert set(st.stop) == {"fixed"} and st.ci_conf.isna().all() and set(st.n_pairs) == {7}
    t = paired_ratio_table(load_frame([tmp_path]))
    assert t.interval.iloc[0] == "bootstrap 95%" and t.pairs.iloc[0] == 7


def test_progress_beats_every_cycle_and_at_each_look():
    beats = []
    steps = {"a": _spin(0.2), "b": _spin(0.3)}
    got = timed.time_rounds(steps, CPU, replace(PRECISE, precision_target=1e-9, max_rounds=16), [("a", "b")],
                            600.0, beat=lambda stage, weight, **info: beats.append((stage, info)))
    assert got.stop == "max_rounds" and len(got.times["a"]) == 16
    rounds = [info["round"] for stage, info in beats]
    assert rounds == list(range(2, 17, 2)) and {s for s, _ in beats} == {"timing"}
    looks = [info["round"] for _, info in beats if info["text"].endswith("(look)")]
    assert looks == [10, 16] and all(info["widest"] > 0 for _, info in beats[4:])


def test_a_noisy_case_is_re_timed_alone_with_its_prenorm(tmp_path, monkeypatch):
    """jitter=MS (harness/rundir/faults.py) spreads haares's steps: only haares is re-timed, with
    prenorm as its partner, and its ratio uses that attempt's pairs only."""
    monkeypatch.setenv("ROUTERBENCH_FAULT", "jitter=300:haares|*;busy=0:*")  # re-timed even on a busy machine
    # steps of ~10 ms (not ~1 ms), so a busy machine's preemptions stay far below the threshold
    # that half the steps spinning 300 ms crosses (IQR ≈ 2 medians)
    cfg = replace(TINY, seq_len=64, batch_size=4)
    cases = expand(["prenorm", "haares", "rezero"], cfg, [128], [2], ["fwd_bwd"])
    opts = SweepOptions(flops=False, memory=False, timing=TimingPolicy(warmup_min_count=1, warmup_min_s=0.0, repeats=6),
                        max_attempts=2, remeasure_s=120.0,
                        noise_thresholds={**QUIET, "iqr_rel_max": 1.5})
    with RunWriter(tmp_path, "run", "s") as w:
        assert run_sweep(cases, CPU, w, opts, progress=False) == {"resumed": 0, "ok": 3}
    rows = pd.DataFrame(load_rows([tmp_path]))
    st = rows[rows.metric == "step_time"]
    key = {c.router: c.key for c in cases}
    first = rows[(rows.metric == "iqr_rel") & (rows.attempt == 1)].set_index("router").value
    if max(first["prenorm"], first["rezero"]) > 1.5:   # the machine, not the fault, spread them
        pytest.skip(f"machine too busy: prenorm/rezero IQR {first['prenorm']:.2f}/{first['rezero']:.2f} "
                    "of their medians crossed the threshold the jitter fault is meant to cross alone")
    if first["haares"] <= 1.5:   # steps so slowed that 300 ms of jitter no longer doubles their spread
        pytest.skip(f"machine too busy: the jitter fault spread haares by only {first['haares']:.2f} of its "
                    "median (steps slowed far past ~10 ms), under the threshold it is meant to cross")
    assert sorted(set(st[st.router == "haares"].attempt)) == [1, 2]
    assert set(st[st.router == "rezero"].attempt) == {1}  # quiet: timed once
    partner = st[(st.router == "prenorm") & (st.attempt == 2)]
    assert len(partner) == 6 and set(partner.pairs_with) == {key["haares"]}
    assert st[st.router == "haares"].pairs_with.isna().all()
    iqr = rows[(rows.metric == "iqr_rel") & (rows.router == "haares")]
    assert len(iqr) == 2 and iqr[iqr.attempt == 1].value.iloc[0] > 1.5   # max_attempts=2: no third
    df = load_frame([tmp_path])
    t = paired_ratio_table(df).set_index("router")
    new = st[(st.attempt == 2)]
    a = new[new.router == "prenorm"].sort_values("pair").value.to_numpy()
    b = new[new.router == "haares"].sort_values("pair").value.to_numpy()
    assert t.loc["haares", "pairs"] == 6 and t.loc["haares", "attempts"] == 2
    assert t.loc["haares", "ratio"] == pytest.approx(float(np.median(b / a)))
    old = st[(st.attempt == 1)]
    a1 = old[old.router == "prenorm"].sort_values("pair").value.to_numpy()
    r1 = old[old.router == "rezero"].sort_values("pair").value.to_numpy()
    assert t.loc["rezero", "ratio"] == pytest.approx(float(np.median(r1 / a1)))
    # prenorm's own rows stay its first timing: the partner rows never count as its result
    from reports.frame import ok_rows
    own = ok_rows(df, "step_time")
    assert set(own[own.router == "prenorm"].attempt) == {1}


def test_gate_says_what_would_decide_it():
    assert settle_note(10, 1.04, 1.00, 1.08, 1.06).startswith("about 30 more pairs")
    assert settle_note(10, 1.055, 1.0, 1.1, 1.06).startswith("cannot be settled by more pairs")


@pytest.mark.parametrize("argv, needle", [
    (["--precision-target", "0.03", "--repeats", "5"], "--repeats fixes the rounds"),
    (["--min-pairs", "8"], "--min-pairs has no effect without --precision-target"),
    (["--precision-target", "0.03", "--no-paired"], "needs --paired"),
    (["--precision-target", "0.03", "--min-pairs", "40", "--max-rounds", "20"], "below --min-pairs"),
    (["--precision-target", "2"], "--precision-target"),
])
def test_bad_precision_options_are_one_line(argv, needle, tmp_path):
    r = CliRunner().invoke(main, ["run", "--out", str(tmp_path), *argv])
    assert r.exit_code == 2 and needle in r.output, r.output
    assert not any(tmp_path.iterdir())  # nothing measured, nothing created


def test_a_precise_timing_is_not_re_timed_for_the_spread_of_its_times(tmp_path):
    """The rule's interval already holds the spread; only machine readings re-time a precise timing."""
    spread = {**QUIET, "iqr_rel_max": 0.0, "ci_width_rel_max": 0.0}        # every timing "spread"
    opts = replace(PRECISE, max_attempts=3, remeasure_s=60.0, noise_thresholds=spread)
    _, got, st = _group(tmp_path / "precise", opts)
    assert set(st.stop) == {"precise"} and set(st.attempt) == {1}
    df = load_frame([tmp_path / "precise"])
    df.attrs["noise_thresholds"] = spread  # the report judges with the run's thresholds (a busy CI machine aside)
    assert paired_ratio_table(df).noisy.tolist() == [""]
    # fixed rounds: the same spread re-times the group
    _, _, st = _group(tmp_path / "fixed", replace(opts, precision_target=None, timing=TimingPolicy(
        warmup_min_count=1, warmup_min_s=0.0, repeats=6)))
    assert set(st.attempt) == {1, 2, 3}
    # a machine reading still counts after a precise stop
    from harness.timing.noise import noise_reasons
    m = {"iqr_rel": 0.5, "cpu_pressure": 0.5}
    assert noise_reasons(m, opts.noise_thresholds, precise=True) == []          # QUIET's pressure limit is 1.0
    assert noise_reasons(m, {**spread, "cpu_pressure_max": 0.2}, precise=True) == ["cpu_pressure 0.500 > 0.2"]
