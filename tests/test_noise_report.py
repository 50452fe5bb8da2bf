"""What the report and its summary say of noise: the last attempt used and flagged by the noise
thresholds, numbers the data contradicts turned into warnings, sentences that quote their table
(and a multi-resolution router against Block AttnRes from the same rounds), and a mostly noisy run
opening with its verdict (reports/summary.py, reports/paired.py, reports/paper_baseline.py)."""

from __future__ import annotations

from dataclasses import replace

import pandas as pd
import pytest

from harness.rundir.writer import RunWriter

from test_noise import ALWAYS, NEVER, OPTS, _sweep


def test_the_report_uses_the_last_attempt_and_flags_noise_by_its_thresholds(tmp_path):
    from reports import build_report, load_frame
    d = tmp_path / "r"
    _sweep(d, replace(OPTS, noise_thresholds=ALWAYS, max_attempts=2, remeasure_s=600))
    df = load_frame([d])
    st = df[df.metric == "step_time"]
    assert set(st.attempt) == {2} and st.groupby("router").size().tolist() == [6, 6]
    assert set(df.drop_duplicates("case_key").attempts) == {2}
    build_report([d], tmp_path / "loud", noise_thresholds=ALWAYS)
    table = pd.read_csv(tmp_path / "loud" / "paired.csv")
    assert table.attempts.tolist() == [2] and "router: cpu_util" in table.noisy[0]
    md = (tmp_path / "loud" / "report.md").read_text()
    assert md.index("## Summary") < md.index("## Warnings") < md.index("## Cost")
    assert "Noise: 2 of 2 timed cases were noisy" in md and "(noisy group)" in md.split("## Warnings")[0]
    build_report([d], tmp_path / "quiet", noise_thresholds=NEVER)
    assert pd.read_csv(tmp_path / "quiet" / "paired.csv").noisy.isna().all()
    assert "Noise:" not in (tmp_path / "quiet" / "report.md").read_text()


def _rows(w, router, mode, times):
    for i, ms in enumerate(times):
        w.write(case_key=f"{router}|{mode}", router=router, impl="naive", backend="eager", mode=mode,
                workload="decoder", d_model=16, n_layers=2, n_heads=2, seq_len=8, batch_size=2,
                dtype="float32", seed=0, metric="step_time", value=ms, unit="ms", repeat=i, pair=i, attempt=1)


def test_numbers_the_data_contradicts_become_warnings(tmp_path):
    from reports import build_report, load_frame
    from reports.cautions import consistency_warnings
    with RunWriter(tmp_path, "r", "s", base={"device": "cpu"}) as w:
        with w.unit(["x"], kind="group") as u:
            # fwd: under a load drift the medians mislead (5.0 unpaired) while the pairs say 1.1
            _rows(u, "prenorm", "fwd", [1, 1, 1, 10, 10])
            _rows(u, "haares", "fwd", [5, 5, 1.1, 11, 11])
            # fwd_bwd faster than fwd: impossible without noise
            _rows(u, "prenorm", "fwd_bwd", [2, 2, 2, 2, 2])
            _rows(u, "haares", "fwd_bwd", [2.2, 2.2, 2.2, 2.2, 2.2])
    warn = consistency_warnings(load_frame([tmp_path]))
    assert any("whose fwd step is slower than its fwd_bwd step (haares eager d=16 L=2)" in x for x in warn)
    assert any("paired 1.10, unpaired 5.00" in x for x in warn)
    assert warn[-1].startswith("No CUDA device")
    paths = build_report([tmp_path], tmp_path / "rep")
    page = paths["report.html"].read_text()
    # contents, then the summary's sentence and figure before the first table
    toc, summary = page.index('<nav class="toc">'), page.index('<h2 id="s1">Summary: what each router costs')
    assert toc < summary < page.index("haares naive over prenorm") < page.index("<img") < page.index("<table")
    assert page.index('<h2 id="s2">Warnings</h2>') < page.index('<h2 id="s3">Cost')
    from reports.plotting import MAX_WIDTH_PX, png_size
    assert all(png_size(p)[0] <= MAX_WIDTH_PX for n, p in paths.items() if n.endswith(".png"))


def _rows_b(w, router, backend, times, d=16):
    for i, ms in enumerate(times):
        w.write(case_key=f"{router}|{backend}|{d}", router=router, impl="naive", backend=backend,
                compile_mode="default" if backend == "compile" else None, mode="fwd_bwd",
                workload="decoder", d_model=d, n_layers=2, n_heads=2, seq_len=8, batch_size=2,
                dtype="float32", seed=0, metric="step_time", value=ms, unit="ms", repeat=i, pair=i, attempt=1)


def test_summary_sentences_quote_their_table_and_say_imprecise(tmp_path):
    from reports import load_frame
    from reports.summary import cost_sentences
    with RunWriter(tmp_path, "r", "s", base={"device": "cpu"}) as w:
        with w.unit(["x"], kind="group") as u:
            for backend, ratio in (("eager", 1.2), ("compile", 1.1)):
                _rows_b(u, "prenorm", backend, [1.0] * 6)
                _rows_b(u, "haares", backend, [ratio] * 6)
                _rows_b(u, "prenorm", backend, [1.0] * 6, d=8)   # a smaller shape: not the summary's
                _rows_b(u, "haares", backend, [3.0] * 6, d=8)
            _rows_b(u, "prenorm", "eager", [1.0] * 6, d=32)      # the largest shape, eager imprecise
            _rows_b(u, "haares", "eager", [0.5, 2.0, 0.6, 1.9, 0.7, 2.1], d=32)
            _rows_b(u, "prenorm", "compile", [1.0] * 6, d=32)
            _rows_b(u, "haares", "compile", [1.1] * 6, d=32)
            _rows_b(u, "prenorm", "eager", [1.0] * 6, d=64)      # larger still, but eager only: fewer backends
            _rows_b(u, "haares", "eager", [1.5] * 6, d=64)
    said, table = cost_sentences(load_frame([tmp_path]))
    row = table.iloc[0]
    assert (row.d_model, row.eager_hi - row.eager_lo > 0.25 * row.eager_ratio) == (32, True)
    r = row.eager_ratio, row.eager_lo, row.eager_hi
    pct = [f"{(x - 1) * 100:.0f}".replace("-", "\u2212") for x in r]
    assert said == [f"haares naive over prenorm at d=32, 2 layers, T=8, B=2, fwd_bwd: "
                    f"{'+' if r[0] >= 1 else ''}{pct[0]} % eager [CI {pct[1]} to {'+' if r[1] < 1 <= r[2] else ''}{pct[2]} %] "
                    "(imprecise: CI wider than 25% of the ratio); +10 % compiled [CI 10 to 10 %]; block_attnres "
                    "naive was not timed in the same group, so no paired ratio to it."]
    d2 = tmp_path / "two"
    with RunWriter(d2, "r", "s", base={"device": "cpu"}) as w:
        with w.unit(["x"], kind="group") as u:
            for backend, ratio in (("eager", 1.2), ("compile", 1.1)):
                _rows_b(u, "prenorm", backend, [1.0] * 6)
                _rows_b(u, "haares", backend, [ratio] * 6)
    said, table = cost_sentences(load_frame([d2]))
    row = table.iloc[0]
    eager, comp = round((row.eager_ratio - 1) * 100), round((row.compile_ratio - 1) * 100)
    assert (eager, comp) == (20, 10)
    assert said == [f"haares naive over prenorm at d=16, 2 layers, T=8, B=2, fwd_bwd: +{eager} % eager "
                    f"[CI {eager} to {eager} %]; +{comp} % compiled [CI {comp} to {comp} %]; block_attnres naive "
                    "was not timed in the same group, so no paired ratio to it."]


def test_a_multiresolution_router_is_quoted_against_block_attnres_from_the_same_rounds(tmp_path):
    """haares and wav_v1 timed in one group with block_attnres (same impl): their sentence and table
    give the paired ratio to it round by round, eager and compiled, with its interval, never a
    quotient of two ratios to prenorm; where block_attnres ran in another group only, they say so."""
    from reports import load_frame
    from reports.paper_baseline import paired_vs_paper_table
    from reports.summary import cost_sentences
    # prenorm's rounds vary and block_attnres's track them: haares / block_attnres is 1.16 in
    # every round, while haares / prenorm and block_attnres / prenorm spread
    base = [1.0, 2.0, 1.0, 3.0, 1.0, 2.0]
    with RunWriter(tmp_path, "r", "s", base={"device": "cpu"}) as w:
        with w.unit(["x"], kind="group") as u:
            for backend, k in (("eager", 1.0), ("compile", 0.5)):
                _rows_b(u, "prenorm", backend, [k * 1.0] * 6)
                _rows_b(u, "block_attnres", backend, [k * 1.5 * b for b in base])
                _rows_b(u, "haares", backend, [k * 1.5 * 1.16 * b for b in base])
            # block_attnres's interval against prenorm is wide: not this ratio's interval, no flag on it
            u.write(case_key="block_attnres|eager|16", router="block_attnres", impl="naive", backend="eager",
                    mode="fwd_bwd", workload="decoder", d_model=16, n_layers=2, n_heads=2, seq_len=8,
                    batch_size=2, dtype="float32", seed=0, metric="ci_width_rel", value=0.5, unit="ratio",
                    attempt=1)
        with w.unit(["y"], kind="group") as u:  # wav_v1 in a group of its own: no block_attnres there
            _rows_b(u, "prenorm", "eager", [1.0] * 6, d=8)
            _rows_b(u, "wav_v1", "eager", [2.0] * 6, d=8)
    df = load_frame([tmp_path])
    t = paired_vs_paper_table(df)
    hv = t[t.router == "haares"]
    assert list(hv.backend) == ["eager", "compile"] and (hv.paper_baseline == "block_attnres [naive]").all()
    assert hv.vs_paper.tolist() == pytest.approx([1.16, 1.16]) and (hv.pairs == 6).all()
    assert hv.vs_paper_lo.tolist() == pytest.approx([1.16, 1.16]) and (hv.no_pair == "").all()
    assert (hv.noisy == "").all()
    wv = t[t.router == "wav_v1"].iloc[0]
    assert wv.vs_paper != wv.vs_paper and wv.no_pair == "block_attnres naive not timed in this group"
    said, table = cost_sentences(df)
    h = next(x for x in said if x.startswith("haares"))
    assert h.endswith("; over block_attnres naive (same rounds): +16 % eager [CI 16 to 16 %], +16 % compiled "
                      "[CI 16 to 16 %].")
    w_ = next(x for x in said if x.startswith("wav_v1"))
    assert w_.endswith("; block_attnres naive was not timed in the same group, so no paired ratio to it.")
    row = table[table.router == "haares"].iloc[0]
    assert (row.eager_vs_paper, row.compile_vs_paper) == pytest.approx((1.16, 1.16))
    assert "vs_paper" not in " ".join(c for c in table.columns if table.loc[table.router == "block_attnres", c].notna().any())


def test_a_run_whose_cases_are_mostly_noisy_opens_with_its_verdict(tmp_path):
    """Every timed case noisy (thresholds no process meets): the report's summary and ``summary``
    open with the verdict, naming the reading; under thresholds it meets, no verdict."""
    from click.testing import CliRunner

    from harness.cli import main
    from reports import build_report
    d = tmp_path / "r"
    _sweep(d, replace(OPTS, noise_thresholds=NEVER, max_attempts=1))
    md = build_report([d], tmp_path / "loud", noise_thresholds=ALWAYS)["report.md"].read_text()
    top = md.split("## Summary: what each router costs", 1)[1].strip().splitlines()[0]
    assert top.startswith("Verdict: this run cannot answer. 2 of 2 timed cases were noisy in their last timing "
                          "(2 by cpu_util, worst cpu_util ") and "Run it again when nothing else runs" in top
    md = build_report([d], tmp_path / "quiet", noise_thresholds=NEVER)["report.md"].read_text()
    assert "Verdict:" not in md
    from reports import cautions, load_frame
    df = load_frame([d])
    df.attrs["noise_thresholds"] = ALWAYS
    assert cautions.verdict(df).startswith("Verdict: this run cannot answer. 2 of 2")
    res = CliRunner().invoke(main, ["summary", str(d)])
    assert res.exit_code == 0 and "vs prenorm [CI]" in res.output and "haares" in res.output
