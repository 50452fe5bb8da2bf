"""Two runs read together keep every row of both (reports/frame.py last_attempt per run): the same
case keys, sessions and units in runA and runB, re-timed a different number of times in each,
through ``summary``, ``report`` and ``compare``, each with a run column. Times are planted, so the
numbers are known; nothing is timed."""

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from harness.rundir.writer import RunWriter

ROOT = Path(__file__).resolve().parents[1]
MODES = ("fwd", "fwd_bwd")
#: run -> mode -> attempts of its group (the last is the one reported)
ATTEMPTS = {"runA": {"fwd": 2, "fwd_bwd": 3}, "runB": {"fwd": 3, "fwd_bwd": 2}}
#: the planted haares / prenorm ratio of the last attempt of each run and mode
RATIO = {("runA", "fwd"): 1.25, ("runA", "fwd_bwd"): 1.5, ("runB", "fwd"): 1.75, ("runB", "fwd_bwd"): 2.0}
BUSY = {"cpu_pressure": 0.6, "cpu_util": 0.9, "iqr_rel": 0.01, "ci_width_rel": 0.01}  # noisy: pressure 0.6


def _case(router, mode):
    return dict(case_key=f"{router}|{mode}", router=router, impl="naive", backend="eager", mode=mode,
                workload="decoder", d_model=16, n_layers=2, n_heads=2, seq_len=8, batch_size=2,
                dtype="float32", seed=0)


def write_run(d: Path, run_id: str) -> None:
    """A run of two groups (prenorm + haares, fwd and fwd_bwd), each timed ATTEMPTS times, every
    attempt noisy; the last attempt of each has the planted ratio, the earlier ones 10×."""
    with RunWriter(d, run_id, "s1", base={"device": "cpu"}) as w:
        for mode in MODES:
            with w.unit([f"prenorm|{mode}", f"haares|{mode}"], kind="group") as u:
                n = ATTEMPTS[run_id][mode]
                for att in range(1, n + 1):
                    ratio = RATIO[(run_id, mode)] if att == n else 10.0
                    for router, ms in (("prenorm", 2.0), ("haares", 2.0 * ratio)):
                        for i in range(6):
                            u.write(**_case(router, mode), metric="step_time", value=ms * (1 + 0.001 * i),
                                    unit="ms", repeat=i, pair=i, attempt=att)
                        for metric, v in BUSY.items():
                            u.write(**_case(router, mode), metric=metric, value=v, unit="ratio", attempt=att)
                u.commit({f"prenorm|{mode}": "ok", f"haares|{mode}": "ok"})
    (d / "manifest.json").write_text(json.dumps({"run_id": run_id, "environment": {
        "device": "cpu", "device_name": "Test CPU", "torch": "2.13.0"}, "git_sha": None}))


@pytest.fixture
def two_runs(tmp_path):
    for run_id in ATTEMPTS:
        write_run(tmp_path / run_id, run_id)
    return tmp_path / "runA", tmp_path / "runB"


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "harness.cli", *map(str, args)], capture_output=True,
                          text=True, cwd=ROOT)


def test_load_keeps_the_last_attempt_of_each_run(two_runs):
    from reports import load
    df = load(*two_runs)
    st = df[(df.metric == "step_time") & (df.router == "haares")]
    got = st.groupby(["run_id", "mode"])["value"].median().div(2.0).round(3).to_dict()
    assert got == pytest.approx({k: v * 1.0025 for k, v in RATIO.items()}, rel=1e-3)
    assert set(zip(st["run_id"], st["mode"], st["attempts"])) == {(r, m, ATTEMPTS[r][m]) for r, m in RATIO}


def test_summary_of_two_runs_shows_every_row_with_a_run_column(two_runs):
    out = _cli("summary", "--unpaired", *two_runs)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].split()[0] == "run"
    haares = [ln.split() for ln in lines[1:] if " haares " in f" {ln} "]
    # run, shape (4 words), mode, backend, router, impl, median_ms, overhead_pct, …
    assert sorted((r[0], r[5]) for r in haares) == sorted(RATIO)  # (run, mode) of every case
    for r in haares:
        pct = (RATIO[(r[0], r[5])] * 1.0 - 1) * 100
        assert "–" not in r[:8] and f"{pct:.2f}" in r, r


def test_report_of_two_runs_has_both_runs_in_its_tables_and_summary(two_runs, tmp_path):
    out = _cli("report", *two_runs, "--out", tmp_path / "rep")
    assert out.returncode == 0, out.stderr
    pt = pd.read_csv(tmp_path / "rep" / "paired.csv")
    h = pt[pt.router == "haares"]
    assert sorted(zip(h.run_id, h["mode"])) == sorted(RATIO)
    for r in h.itertuples():
        assert r.ratio == pytest.approx(RATIO[(r.run_id, r.mode)], rel=1e-3)
    md = (tmp_path / "rep" / "report.md").read_text()
    summary = md.split("## ", 2)[1]
    for run_id in ATTEMPTS:
        assert run_id in summary, summary[:2000]


def test_compare_of_two_runs_names_them_and_warns_of_noise(two_runs, tmp_path):
    out = _cli("compare", *two_runs, "--out", tmp_path / "cmp")
    assert out.returncode == 0, out.stderr
    md = (tmp_path / "cmp" / "compare.md").read_text()
    runs = md.split("## Runs", 1)[1].split("##", 1)[0]
    assert "runA" in runs and "runB" in runs
    assert "Warning: noisy timings" in runs and "runA: 2 of 2" in runs and "runB: 2 of 2" in runs, runs


def test_summary_prints_paired_ratios_with_intervals_by_default(two_runs):
    """The default summary: the report's sentences, then per case its paired ratio to prenorm
    [CI], each run apart; the unpaired medians only with --unpaired."""
    out = _cli("summary", *two_runs)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "median_ms" not in text and "vs prenorm [CI]" in text
    rows = [ln.split() for ln in text.splitlines() if " haares " in f" {ln} " and ln.split()[0] in ("runA", "runB")]
    assert sorted((r[0], r[5]) for r in rows) == sorted(RATIO)  # (run, mode) of every paired case
    for r in rows:
        ratio = float(r[r.index("haares") + 3])
        assert ratio == pytest.approx(RATIO[(r[0], r[5])], rel=1e-3)  # the last attempt's pairs
