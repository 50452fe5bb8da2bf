"""Paired timing: the bootstrap interval on seeded synthetic samples, the ABBA call order, the
paired sweep's rows and resume, and the report's per-pair ratio."""

from __future__ import annotations

import json
import math
import statistics

import numpy as np
import pandas as pd
import pytest
import torch
from click.testing import CliRunner

from harness.cli import main
from harness.rundir.records import load_rows, read_jsonl, units
from harness.rundir.writer import RunWriter
from harness.stats.bootstrap import bootstrap_ratio_ci
from harness.sweep import timed
from harness.sweep.cases import expand
from harness.sweep.options import SweepOptions
from harness.sweep.run import run_sweep
from harness.timing import paired
from harness.timing.noise import sm_clock_mhz
from harness.timing.timer import TimingPolicy
from reports import build_report, load_frame, paired_ratio_figure, paired_ratio_table
from workloads.config import DecoderConfig

TINY = DecoderConfig(vocab_size=32, d_model=16, n_layers=2, n_heads=2, seq_len=8, batch_size=2)
TIMING = TimingPolicy(warmup_min_count=1, warmup_min_s=0.0, repeats=3)
PAIRED = SweepOptions(flops=False, timing=TIMING, paired=True, max_attempts=1)
CPU = torch.device("cpu")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


# --- bootstrap -------------------------------------------------------------------------------

def test_bootstrap_interval_covers_the_true_ratio_at_its_nominal_rate():
    """400 seeded draws of 30 pairs: lognormal noise on each side around a true ratio of 1.2,
    plus a drift shared by both sides of a pair (which pairing cancels). The 95 % interval must
    cover the true median ratio in 90–99 % of the draws."""
    rng = np.random.default_rng(12345)
    true_ratio, hits, draws = 1.2, 0, 400
    for i in range(draws):
        drift = np.exp(rng.normal(0.0, 0.3, 30))  # the machine slows and speeds up
        a = 10.0 * drift * np.exp(rng.normal(0.0, 0.05, 30))
        b = true_ratio * 10.0 * drift * np.exp(rng.normal(0.0, 0.05, 30))
        med, lo, hi = bootstrap_ratio_ci(a.tolist(), b.tolist(), seed=i)
        assert lo <= med <= hi
        hits += lo <= true_ratio <= hi
    assert 0.90 <= hits / draws <= 0.99, hits / draws


def test_bootstrap_edge_cases():
    five = [1.0, 2.0, 3.0, 4.0, 5.0]
    assert bootstrap_ratio_ci(five, [1.2 * v for v in five]) == pytest.approx((1.2,) * 3)
    # too few pairs for an interval: the median ratio, NaN bounds
    med, lo, hi = bootstrap_ratio_ci([2.0, 1.0, 4.0], [3.0, 1.6, 6.0])
    assert med == 1.5 and math.isnan(lo) and math.isnan(hi)
    # seeded: the same call gives the same interval
    a, b = [1.0, 1.1, 0.9, 1.05, 1.2], [1.3, 1.2, 1.1, 1.4, 1.25]
    assert bootstrap_ratio_ci(a, b, seed=3) == bootstrap_ratio_ci(a, b, seed=3)
    with pytest.raises(ValueError, match="equally long"):
        bootstrap_ratio_ci([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="positive"):
        bootstrap_ratio_ci([0.0], [1.0])
    with pytest.raises(ValueError, match="conf"):
        bootstrap_ratio_ci([1.0], [1.0], conf=1.5)


# --- interleaving ----------------------------------------------------------------------------

def recording(names, calls):
    return {n: (lambda n=n: calls.append(n)) for n in names}


def test_time_paired_interleaves_abba():
    calls: list[str] = []
    times = paired.time_paired(recording("AB", calls), CPU, repeats=4)
    assert "".join(calls) == "ABBAABBA"
    assert set(times) == {"A", "B"} and all(len(v) == 4 and min(v) >= 0 for v in times.values())
    calls.clear()
    paired.time_paired(recording("ABC", calls), CPU, repeats=3)
    assert "".join(calls) == "ABCCBAABC"  # ABBA with three: forward, reversed, forward
    calls.clear()
    paired.time_paired(recording("AB", calls), CPU, repeats=3, order="ABAB", warmup_rounds=1)
    assert "".join(calls) == "AB" + "ABABAB"  # one untimed round first
    with pytest.raises(ValueError, match="--pair-order"):
        paired.time_paired(recording("AB", calls), CPU, repeats=2, order="AABB")


def test_round_i_of_each_variant_is_pair_i():
    """Each variant's list index is its round: a step that slows down every round shows it."""
    clock = {"n": 0}

    def slowing():
        clock["n"] += 1
        x = 0
        for _ in range(20_000 * clock["n"]):
            x += 1
    times = paired.time_paired({"A": slowing, "B": slowing}, CPU, repeats=4)
    assert times["A"][3] > times["A"][0] and times["B"][3] > times["B"][0]


# --- the paired sweep ------------------------------------------------------------------------

def test_paired_sweep_writes_pair_columns_with_prenorm_first(tmp_path, monkeypatch):
    seen = []
    real = paired.time_paired

    def spy(steps, *a, **k):
        seen.append(list(steps))
        return real(steps, *a, **k)

    monkeypatch.setattr(paired, "time_paired", spy)
    cases = expand(["haares", "prenorm"], TINY, [16], [2], ["fwd", "fwd_bwd"])
    with RunWriter(tmp_path, "run", "s1", base={"device": "cpu"}) as w:
        assert run_sweep(cases, CPU, w, PAIRED, progress=False) == {"resumed": 0, "ok": 4}
    assert len({tuple(k) for k in seen}) == 2  # one group per mode (timed two rounds a call)
    for keys in seen:
        assert keys[0].startswith("prenorm|") and keys[1].startswith("haares|")
    rows = pd.DataFrame(load_rows([tmp_path]))
    st = rows[rows.metric == "step_time"]
    assert len(st) == 4 * 3 and (st.status == "ok").all()
    assert (st.pair == st.repeat).all() and sorted(set(st.pair)) == [0, 1, 2]
    assert st.groupby(["router", "mode"]).pair.apply(sorted).map(list).tolist() == [[0, 1, 2]] * 4
    # every other measurement of a case is still there; no clock rows on a CPU
    assert set(rows.metric) >= {"params_matrix", "router_state", "saved_activation", "step_time"}
    assert "sm_clock_mhz" not in set(rows.metric)
    # one unit of resume per group, covering every case of it
    markers = units(tmp_path)
    assert len(markers) == 2 and all(m["kind"] == "group" and len(m["cases"]) == 2 for m in markers)
    assert {k for m in markers for k in m["cases"]} == {c.key for c in cases}


def test_resume_skips_a_finished_paired_group(tmp_path):
    cases = expand(["prenorm", "haares"], TINY, [16], [2], ["fwd"])
    with RunWriter(tmp_path, "run", "s1") as w1:
        assert run_sweep(cases, CPU, w1, PAIRED, progress=False) == {"resumed": 0, "ok": 2}
    n_rows = len(read_jsonl(tmp_path / "records.jsonl"))  # rows and end markers
    with RunWriter(tmp_path, "run", "s2") as w2:
        assert run_sweep(cases, CPU, w2, PAIRED, progress=False) == {"resumed": 2}
    assert len(read_jsonl(tmp_path / "records.jsonl")) == n_rows


def test_interrupted_group_is_redone_and_finished_cases_are_not(tmp_path):
    cases = expand(["prenorm", "haares", "block_attnres"], TINY, [16], [2], ["fwd"])
    w1 = RunWriter(tmp_path, "run", "s1")
    # an earlier session finished prenorm alone, then died inside the group's timing
    assert run_sweep(cases[:1], CPU, w1, PAIRED, progress=False) == {"resumed": 0, "ok": 1}
    w1.unit([c.key for c in cases[1:]], kind="group").write(
        **cases[1].columns(), metric="step_time", value=99.0, unit="ms", repeat=0, pair=0)
    w1.close()
    with RunWriter(tmp_path, "run", "s2") as w2:
        assert w2.recovered["pending_units"] == 1  # the died group's rows went to aborted/
        assert run_sweep(cases, CPU, w2, PAIRED, progress=False) == {"resumed": 1, "ok": 2}
    st = pd.DataFrame(load_rows([tmp_path])).query("metric == 'step_time'")
    assert 99.0 not in st.value.tolist()
    assert set(st[st.router == "prenorm"].session) == {"s1"} and st[st.router == "prenorm"].pair.isna().all()
    # the two unfinished routers were timed together (pairs of one session), never with s1
    assert set(st[st.router != "prenorm"].session) == {"s2"} and st[st.router != "prenorm"].pair.notna().all()


def test_a_step_failing_in_paired_timing_is_its_own_error_row(tmp_path):
    cases = expand(["prenorm", "haares"], TINY, [16], [2], ["fwd"])

    def broken():
        raise RuntimeError("synthetic timing failure")

    with RunWriter(tmp_path, "run", "s") as w, w.unit([c.key for c in cases], kind="group") as u:
        status = timed.time_group(cases, {cases[0].key: lambda: None, cases[1].key: broken}, CPU, u,
                                  PAIRED).status
    assert status == {cases[0].key: "ok", cases[1].key: "error"}
    rows = pd.DataFrame(load_rows([tmp_path]))
    assert "synthetic timing failure" in rows[rows.status == "error"].error.iloc[0]
    ok = rows[(rows.status == "ok") & (rows.metric == "step_time")]
    assert ok.router.unique().tolist() == ["prenorm"] and ok.pair.isna().all()  # timed alone


def test_sm_clock_is_silent_on_cpu():
    assert sm_clock_mhz(CPU) is None


@pytest.mark.compile
@pytest.mark.slow
def test_eager_and_compiled_steps_share_one_group_so_vs_eager_is_paired(tmp_path):
    cases = expand(["prenorm", "haares"], TINY, [16], [2], ["fwd"], backends=["eager", "compile"])
    with RunWriter(tmp_path, "run", "s") as w:
        assert run_sweep(cases, CPU, w, PAIRED, progress=False) == {"resumed": 0, "ok": 4}
    markers = units(tmp_path)
    assert len(markers) == 1 and len(markers[0]["cases"]) == 4  # one interleaved group
    rows = pd.DataFrame(load_rows([tmp_path]))
    st = rows[rows.metric == "step_time"]
    assert (st.status == "ok").all() and st.pair.notna().all() and len(st) == 12
    assert (rows[rows.metric == "compile_time"].value > 0).all()  # compiled models coexist
    df = load_frame([tmp_path])
    from reports.paired import paired_vs_eager_table
    ve = paired_vs_eager_table(df)
    assert sorted(ve.router) == ["haares", "prenorm"] and (ve.pairs == 3).all()
    for r in ve.itertuples():  # the median of per-round ratios, from the rows themselves
        side = st[(st.router == r.router)].pivot_table(index="pair", columns="backend", values="value")
        assert r.paired_vs_eager == pytest.approx(statistics.median(side["compile"] / side["eager"]))
    pt = paired_ratio_table(df)
    assert set(pt.backend) == {"eager", "compile"}  # vs prenorm still within each backend
    from reports.time_figures import compile_vs_eager
    drawn = pd.read_csv(compile_vs_eager(df, tmp_path / "fig").with_suffix(".csv"))
    assert sorted(drawn.vs_eager) == pytest.approx(sorted(ve.paired_vs_eager))  # the paired ratios
    assert drawn.lo.isna().all()  # 3 pairs: below the 5 a bootstrap interval needs, so no bar


def test_cli_paired_flag_and_manifest(tmp_path):
    base = ["run", "--routers", "prenorm,haares", "--widths", "16", "--depths", "2", "--modes", "fwd",
            "--repeats", "2", "--max-attempts", "1", "--warmup-s", "0", "--backends", "eager", "--impls", "naive",
            "--no-train", "--no-report", "--no-flops", "--quiet", "--out", str(tmp_path)]
    for flag, rid in (("--paired", "p"), ("--no-paired", "u")):
        res = CliRunner().invoke(main, base + [flag, "--run-id", rid], catch_exceptions=False)
        assert res.exit_code == 0, res.output
    run_p, run_u = next(tmp_path.glob("*/p")), next(tmp_path.glob("*/u"))
    manifest = json.loads((run_p / "manifest.json").read_text())
    timing = manifest["sessions"][-1]["timing"]
    assert timing["cache_state"] == "warm" and timing["paired"] and timing["pair_order"] == "ABBA"
    assert json.loads((run_u / "manifest.json").read_text())["timing"]["paired"] is False
    st_p = pd.DataFrame(load_rows([run_p])).query("metric == 'step_time'")
    st_u = pd.DataFrame(load_rows([run_u])).query("metric == 'step_time'")
    assert st_p.pair.notna().all() and st_u.pair.isna().all() and len(st_p) == len(st_u) == 4
    res = CliRunner().invoke(main, base + ["--pair-order", "AABB", "--run-id", "x"])
    assert res.exit_code == 2 and "--pair-order" in res.output


# --- the report ------------------------------------------------------------------------------

PRENORM = [10.0, 11.0, 9.0, 10.5, 12.0]
HAARES = [12.0, 13.5, 10.0, 12.0, 15.0]


def write_group(w, times_by_router, *, d_model=64, mode="fwd", pair=True):
    """One group of a sweep, recorded as its unit of resume."""
    keys = {router: f"{router}|{mode}|d{d_model}" for router in times_by_router}
    with w.unit(keys.values(), kind="group") as u:
        for router, times in times_by_router.items():
            cols = dict(case_key=keys[router], router=router, router_options={}, impl="naive",
                        backend="eager", mode=mode, workload="decoder", d_model=d_model, n_layers=2,
                        n_heads=4, seq_len=64, batch_size=2, dtype="float32", seed=0)
            for i, t in enumerate(times):
                u.write(**cols, metric="step_time", value=t, unit="ms", repeat=i, pair=i if pair else None)


def test_report_ratio_is_the_median_of_per_pair_ratios(tmp_path):
    with RunWriter(tmp_path, "run-a", "s1", base={"device": "cpu"}) as w:
        write_group(w, {"prenorm": PRENORM, "haares": HAARES})
        write_group(w, {"prenorm": PRENORM, "haares": HAARES}, mode="fwd_bwd", pair=False)  # unpaired
        write_group(w, {"haares": HAARES}, d_model=128)  # paired, but no prenorm in its group
    t = paired_ratio_table(load_frame([tmp_path]))
    assert len(t) == 1
    row = t.iloc[0]
    by_hand = statistics.median([b / a for a, b in zip(PRENORM, HAARES)])
    assert by_hand == pytest.approx(1.2) and by_hand != pytest.approx(
        statistics.median(HAARES) / statistics.median(PRENORM))  # per pair, not of medians
    assert row.ratio == pytest.approx(by_hand)
    assert row.ratio_lo <= row.ratio <= row.ratio_hi
    assert row.pairs == 5 and row.router == "haares" and row["mode"] == "fwd"
    assert row.median_ms == statistics.median(HAARES) and row.prenorm_ms == statistics.median(PRENORM)
    assert row.prenorm_iqr_ms == pytest.approx(11.0 - 10.0)  # inclusive quartiles of PRENORM


def test_report_has_the_paired_section_and_figures(tmp_path):
    runs = []
    for run_id, scale in (("run-a", 1.0), ("run-b", 1.05)):
        d = tmp_path / run_id
        with RunWriter(d, run_id, "s1", base={"device": "cpu"}) as w:
            write_group(w, {"prenorm": PRENORM, "haares": [t * scale for t in HAARES],
                            "block_attnres": [t * 1.1 for t in PRENORM]})
        runs.append(d)
    single = build_report(runs[:1])
    assert single["paired_ratios.png"].read_bytes()[:8] == PNG_MAGIC
    md = single["report.md"].read_text()
    assert "Paired timing: ratio to prenorm" in md and "](paired_ratios.png)" in md
    assert pd.read_csv(single["paired.csv"]).ratio.notna().all()
    both = build_report(runs, tmp_path / "both")
    assert both["paired_ratios.png"].read_bytes()[:8] == PNG_MAGIC
    t = paired_ratio_table(load_frame(runs))
    assert sorted(t.run_id) == ["run-a", "run-a", "run-b", "run-b"]
    path = paired_ratio_figure(load_frame(runs), tmp_path / "fig")
    assert path.name == "paired_ratios.png"
    # without paired rows: no figure, and the report says why
    d = tmp_path / "unpaired"
    with RunWriter(d, "run-u", "s1") as w:
        write_group(w, {"prenorm": PRENORM, "haares": HAARES}, pair=False)
    assert paired_ratio_figure(load_frame([d]), d) is None
    out = build_report([d])
    assert "paired_ratios.png" not in out and "No paired step times" in out["report.md"].read_text()


def test_a_group_too_big_for_memory_is_split_into_subgroups_that_each_hold_prenorm():
    from harness.sweep.plan import case_bytes, split_group, split_groups, sweep_units
    from workloads.decoder import Decoder
    cases = expand(["prenorm", "haares", "block_attnres", "rezero"], TINY, [16], [2], ["fwd_bwd"],
                   backends=["eager", "compile"], impls=["naive", "two_phase"])
    (group,) = sweep_units(cases, True)
    assert len(group) == 12 and split_group(group, None) == [group]
    one = max(case_bytes(c) for c in group)
    parts = split_group(group, 3 * one)
    assert len(parts) > 1 and sorted(c.key for p in parts for c in p if c.router != "prenorm") == \
        sorted(c.key for c in group if c.router != "prenorm")  # every case once, prenorm in every part
    for p in parts:
        assert {c.backend for c in p if c.router == "prenorm"} == {"eager", "compile"}
        for r in {(c.router, c.impl) for c in p if c.router != "prenorm"}:  # a router's backends together
            assert {c.backend for c in p if (c.router, c.impl) == r} == {"eager", "compile"}
    assert sweep_units(cases, True, 3 * one) == parts
    assert split_groups(cases, True, 3 * one)[0]["subgroups"] == [len(p) for p in parts]
    # the estimate's weights and gradients: 2 × parameters × 4 bytes at float32, at least
    m = Decoder(group[0].cfg, group[0].router)
    assert case_bytes(group[0]) >= 2 * 4 * sum(p.numel() for p in m.parameters())
