"""The report's Implementations section reads an impl against the one it replaces (lean against
two_phase) as a ratio of paired ratios to prenorm (reports/impls.py impl_vs_table)."""

from __future__ import annotations

import pytest
from test_reports import compiled_case

from harness.rundir.writer import RunWriter
from reports import build_report, load_frame
from routers import impls


@pytest.mark.skipif(impls.lookup("lean") is None, reason="lean is not registered (routers/block/lean.py)")
def test_lean_is_read_against_two_phase_as_a_ratio_of_ratios(tmp_path):
    """prenorm, two_phase and lean in one paired group: lean/prenorm is 1.1 every round and
    two_phase/prenorm 1.0, so the ratio of ratios is 1.1 with a degenerate interval; the
    Implementations section shows the table."""
    with RunWriter(tmp_path, run_id="r", session="s", base={"device": "cpu"}) as w:
        with w.unit(["g"]) as u:
            base = [10.0, 11.0, 12.0, 10.5, 11.5, 10.2]
            compiled_case(u, "prenorm", "naive", "model", 12, base, 1.0)
            compiled_case(u, "haares", "two_phase", "model", 12, base, 1.0)
            compiled_case(u, "haares", "lean", "model", 12, [1.1 * t for t in base], 1.0)
    df = load_frame([tmp_path])
    from reports.impls import impl_vs_table
    t = impl_vs_table(df)
    assert len(t) == 1
    s = t.iloc[0]
    assert (s["router"], s["impl"], s["against"], s["pairs"]) == ("haares", "lean", "two_phase", 6)
    assert s["vs_ratio"] == pytest.approx(1.1) and s["vs_lo"] == pytest.approx(1.1) and s["vs_hi"] == pytest.approx(1.1)
    md = build_report([tmp_path])["report.md"].read_text()
    assert "lean against two_phase" in md and "1.100" in md
