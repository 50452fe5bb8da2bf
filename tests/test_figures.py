"""The cost figures (reports/time_figures.py, reports/count_figures.py; DESIGN.md, "Results") on one
tiny real sweep, each with its data."""

from __future__ import annotations

import base64

import pandas as pd
import pytest
import torch

from harness.rundir.writer import RunWriter
from harness.sweep.cases import expand
from harness.sweep.options import SweepOptions
from harness.sweep.run import run_sweep
from harness.timing.timer import TimingPolicy
from reports import build_report, load_frame, plotting, tables
from reports.report import FIGURES
from reports.sections import NO_DATA
from reports.time_figures import compile_vs_eager
from workloads.config import DecoderConfig

TINY = DecoderConfig(vocab_size=32, d_model=16, n_layers=2, n_heads=2, seq_len=8, batch_size=2)
ROUTERS = ["prenorm", "haares", "block_attnres"]
#: The figures of the paired cost sweep (compile_vs_eager needs a compiled backend: its own test).
COST_FIGURES = ("step_time_overhead_vs_width", "overhead_vs_width", "overhead_vs_depth",
                "flops_vs_depth", "router_flop_share_vs_width", "memory_vs_depth",
                "router_cost_models")
DEVICE = "Test Device 9000"
#: (router, impl) of the sweep: prenorm offers only naive.
VARIANTS = {("prenorm", "naive"), ("haares", "naive"), ("haares", "two_phase"),
            ("block_attnres", "naive"), ("block_attnres", "two_phase")}


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory):
    """One tiny real paired sweep on CPU (~15 s): fwd_bwd, so that saved activations are
    measured; 5 repeats, the fewest pairs with a bootstrap interval."""
    d = tmp_path_factory.mktemp("sweep")
    cases = expand(ROUTERS, TINY, [16, 32], [2, 4], ["fwd_bwd"], impls=["naive", "two_phase"])
    opts = SweepOptions(flops=True, paired=True, max_attempts=1,
                        timing=TimingPolicy(warmup_min_count=1, warmup_min_s=0, repeats=5))
    with RunWriter(d, run_id="tiny", session="s1", base={"device": "cpu"}) as w:
        stats = run_sweep(cases, torch.device("cpu"), w, opts, progress=False)
    assert stats == {"resumed": 0, "ok": len(cases)}
    return d


@pytest.fixture(scope="module")
def drawn(sweep_dir, tmp_path_factory):
    """Each cost figure drawn from the sweep: name -> (PNG path, its CSV, what its figure said)."""
    df = load_frame([sweep_dir])
    df["device_name"] = DEVICE
    out = tmp_path_factory.mktemp("figures")
    said = {}
    save = plotting.save_png

    def spy(fig, path, dpi=plotting.DPI):
        said[path.stem] = {"title": " ".join(fig._suptitle.get_text().split()),  # unwrapped
                           "labels": [lbl for ax in fig.axes if ax.get_visible()
                                      for lbl in (ax.get_xlabel(), ax.get_ylabel()) if lbl]}
        return save(fig, path, dpi)

    plotting.save_png = spy
    try:
        paths = {name: FIGURES[name](df, out) for name in COST_FIGURES}
    finally:
        plotting.save_png = save
    return {name: (p, pd.read_csv(p.with_suffix(".csv"), keep_default_na=False,
                                  na_values=[""]), said[name]) for name, p in paths.items()}


def test_report_draws_every_cost_figure_with_its_data(sweep_dir, tmp_path):
    out = build_report([sweep_dir], tmp_path)
    for name in COST_FIGURES:
        assert out[f"{name}.png"].is_file() and out[f"{name}.csv"].is_file(), name
        assert NO_DATA[name].startswith("No data for this figure")
    assert "compile_vs_eager.png" not in out  # eager only
    for name, path in out.items():
        if name.endswith(".png"):
            assert plotting.png_size(path)[0] <= plotting.MAX_WIDTH_PX, name
    # paired_ratios and impls say why in their section; paper_ratios is drawn only where haares or wav_v1 ran
    assert set(FIGURES) <= set(NO_DATA) | {"paired_ratios", "impls", "paper_ratios"}


def test_report_shows_every_figure_it_writes(sweep_dir, tmp_path):
    out = build_report([sweep_dir], tmp_path)
    md = out["report.md"].read_text(encoding="utf-8")
    page = out["report.html"].read_text(encoding="utf-8")
    written = sorted(n for n in out if n.endswith(".png"))
    assert {"flops_vs_depth.png", "step_time_overhead_vs_width.png"} <= set(written)
    for name in written:  # each linked in the Markdown and inlined, byte for byte, in the page
        assert f"]({name})" in md, name
        assert base64.b64encode(out[name].read_bytes()).decode("ascii") in page, name
    assert page.count("data:image/png;base64,") == len(written)
    cost = md.split("## Cost: step time, FLOPs and memory vs prenorm")[1].split("\n## ")[0]
    order = [cost.index(f"]({n}.png)") for n in ("overhead_vs_width", "overhead_vs_depth",
                                                  "step_time_overhead_vs_width", "flops_vs_depth",
                                                  "router_flop_share_vs_width")]
    assert order == sorted(order)  # paired first; the unpaired overhead after them, as detail


def test_flops_vs_depth_data(drawn, sweep_dir):
    t = drawn["flops_vs_depth"][1]
    assert list(t.columns) == ["router", "options", "impl", "variant", "workload", "d_model",
                               "n_layers", "gflop_fwd"]
    assert set(zip(t["router"], t["impl"])) == VARIANTS
    assert len(t) == len(VARIANTS) * 2 * 2 and set(t["d_model"]) == {16, 32}
    assert set(t["n_layers"]) == {2, 4}
    ov = tables.overhead_table(load_frame([sweep_dir]))
    want = ov.groupby(["variant", "d_model", "n_layers"])["gflop_fwd"].median()
    got = t.set_index(["variant", "d_model", "n_layers"])["gflop_fwd"]
    assert got.tolist() == pytest.approx(want.loc[got.index].tolist())
    wide = t.pivot_table(index=["variant", "d_model"], columns="n_layers", values="gflop_fwd")
    assert (wide[4] > wide[2]).all()  # every router's forward grows with depth
    per = t.pivot_table(index=["d_model", "n_layers"], columns="variant", values="gflop_fwd")
    assert (per["haares [naive]"] > per["prenorm"]).all()  # the router's mixing is counted


def test_step_time_overhead_vs_width_data(drawn, sweep_dir):
    t = drawn["step_time_overhead_vs_width"][1]
    assert {"router", "impl", "d_model", "n_layers", "median_ms", "prenorm_ms", "overhead_pct",
            "setting"} <= set(t.columns)
    assert "prenorm" not in set(t["router"]) and set(t["setting"]) == {"fwd_bwd"}
    assert set(zip(t["router"], t["impl"], t["d_model"], t["n_layers"])) == {
        (r, i, d, n) for r, i in VARIANTS if r != "prenorm" for d in (16, 32) for n in (2, 4)}
    assert t["overhead_pct"].tolist() == pytest.approx(
        ((t["median_ms"] / t["prenorm_ms"] - 1) * 100).tolist())


def test_titles_name_device_and_shape_and_axes_have_units(drawn):
    for name, (path, _, said) in drawn.items():
        assert plotting.png_size(path)[0] <= plotting.MAX_WIDTH_PX, name
        assert DEVICE in said["title"] and "T=8 B=2" in said["title"], name
        assert said["labels"] and all("(" in lbl for lbl in said["labels"] if lbl != "router"), name
    assert "HAARES" in drawn["router_flop_share_vs_width"][2]["title"]
    assert "L=4 (the largest measured)" in drawn["overhead_vs_width"][2]["title"]
    assert "d=32 (the largest measured)" in drawn["overhead_vs_depth"][2]["title"]


@pytest.mark.parametrize("name, x, fixed", [("overhead_vs_width", "d_model", ("n_layers", 4)),
                                            ("overhead_vs_depth", "n_layers", ("d_model", 32))])
def test_overhead_rows_one_per_router_impl_and_x(drawn, name, x, fixed):
    t = drawn[name][1]
    assert (t[fixed[0]] == fixed[1]).all()
    letter = {"n_layers": "L", "d_model": "d"}[fixed[0]]
    assert (t["panel"] == f"fwd_bwd · eager · {letter}={fixed[1]}").all()
    keys = set(zip(t["router"], t["impl"], t[x]))
    assert len(t) == len(keys) == 8
    assert keys == {(r, i, v) for r, i in VARIANTS if r != "prenorm" for v in (t[x].unique())}
    assert (t["pairs"] == 5).all() and (t["ratio"] > 0).all()
    assert (t["ratio_lo"] <= t["ratio"]).all() and (t["ratio"] <= t["ratio_hi"]).all()


def test_router_flop_share_counted_beside_analytic(drawn):
    t = drawn["router_flop_share_vs_width"][1]
    assert (t["n_layers"] == 4).all()
    counted, analytic = t[t["source"] == "counted (fvcore)"], t[t["source"] == "analytic"]
    assert set(zip(counted["router"], counted["impl"], counted["d_model"])) == {
        (r, i, d) for r, i in VARIANTS for d in (16, 32)} and len(counted) == 10
    assert set(zip(analytic["router"], analytic["d_model"])) == {
        (r, d) for r in ROUTERS for d in (16, 32)} and (analytic["impl"] == "naive").all()
    # the analytic count is the naive reference: fvcore counts the same FLOPs
    both = analytic.merge(counted, on=["router", "impl", "d_model"], suffixes=("_a", "_c"))
    assert both["router_flop_pct_a"].tolist() == pytest.approx(both["router_flop_pct_c"].tolist(),
                                                               rel=0.05)
    haares = counted[(counted["router"] == "haares") & (counted["impl"] == "naive")]
    share = haares.set_index("d_model")["router_flop_pct"]
    assert share[32] < share[16]  # amortised over a wider model


def test_memory_multiples_of_prenorm(drawn):
    t = drawn["memory_vs_depth"][1]
    assert (t["d_model"] == 32).all() and len(t) == 2 * len(VARIANTS) * 2
    assert set(t["quantity"]) == {"saved_mib", "router_state_mib"}
    assert (t.loc[t["router"] == "prenorm", "multiple"] == 1.0).all()
    routed = t[t["router"] != "prenorm"]
    assert (routed["multiple"] > 1).all()
    assert (routed["multiple"] == routed["mib"] / routed["prenorm_mib"]).all()


def test_router_cost_models_ideal_beside_measured(drawn):
    t = drawn["router_cost_models"][1]
    assert (t["d_model"] == 32).all() and set(t["n_layers"]) == {2, 4}
    ideal, measured = t[t["series"] == "ideal I/O model"], t[t["series"] != "ideal I/O model"]
    assert len(ideal) == len(ROUTERS) * 2 and len(measured) == len(VARIANTS) * 2
    assert (ideal.loc[ideal["router"] == "prenorm", "d_elements"] == 3.0).all()  # Table 1
    assert set(measured["series"]) == {"measured, naive", "measured, two_phase"}


def cost_case(w, router, impl, backend, times, compile_mode=None):
    key = f"{router}-{impl}-{backend}"
    case = dict(case_key=key, router=router, router_options={}, impl=impl, backend=backend,
                compile_mode=compile_mode, mode="fwd", workload="decoder", d_model=64,
                n_layers=4, n_heads=4, seq_len=64, batch_size=2, dtype="float32", seed=0)
    with w.unit([key]) as u:
        for i, t in enumerate(times):
            u.write(**case, repeat=i, metric="step_time", value=t, unit="ms")


def test_compile_vs_eager_ratio_with_readable_labels(tmp_path, monkeypatch):
    with RunWriter(tmp_path, run_id="r", session="s", base={"device": "cpu"}) as w:
        for router, impl, eager, compiled in (("prenorm", "naive", 10, 5),
                                              ("haares", "naive", 20, 8),
                                              ("haares", "two_phase", 16, 12)):
            cost_case(w, router, impl, "eager", [eager] * 3)
            cost_case(w, router, impl, "compile", [compiled] * 3, compile_mode="default")
    df = load_frame([tmp_path])
    assert compile_vs_eager(df[df["backend"] == "eager"], tmp_path) is None
    seen = {}
    save = plotting.save_png
    monkeypatch.setattr(plotting, "save_png", lambda fig, path, dpi=plotting.DPI: (
        seen.update(title=fig._suptitle.get_text(), xlabel=fig.axes[0].get_xlabel(),
                    yticks=[t.get_text() for t in fig.axes[0].get_yticklabels()]),
        save(fig, path, dpi))[1])
    path = compile_vs_eager(df, tmp_path / "figs")
    t = pd.read_csv(path.with_suffix(".csv"))
    assert t.set_index("label")["vs_eager"].to_dict() == pytest.approx(
        {"prenorm · naive": 0.5, "haares · naive": 0.4, "haares · two_phase": 0.75})
    assert seen["yticks"] == ["prenorm · naive", "haares · naive", "haares · two_phase"]
    assert seen["xlabel"].startswith("compiled / eager median step time, unpaired (×")  # timed apart
    assert "d=64 L=4" in t["panel"].iloc[0] and "T=64 B=2" in seen["title"]
    assert plotting.png_size(path)[0] <= plotting.MAX_WIDTH_PX


def test_no_data_gives_none(tmp_path):
    with RunWriter(tmp_path, run_id="r", session="s", base={"device": "cpu"}) as w:
        cost_case(w, "prenorm", "naive", "eager", [10, 10])
        cost_case(w, "haares", "naive", "eager", [11, 11])
    df = load_frame([tmp_path])
    for name in (*COST_FIGURES, "compile_vs_eager"):
        assert FIGURES[name](df, tmp_path) is None, name
        assert not (tmp_path / f"{name}.png").exists()


def test_ratio_panels_share_one_log_axis(sweep_dir):
    """The per-pair ratio figure's panels (4 shapes here) read on one log axis with 1 inside it;
    the helper gives panels of different ranges the union of them."""
    import matplotlib.pyplot as plt

    from reports import paired
    fig = paired.paired_ratio_grid(paired.paired_ratio_table(load_frame([sweep_dir])))
    axes = [ax for ax in fig.axes if ax.get_visible()]
    assert len(axes) == 4 and {ax.get_xscale() for ax in axes} == {"log"}
    assert len({tuple(round(v, 9) for v in ax.get_xlim()) for ax in axes}) == 1
    lo, hi = axes[0].get_xlim()
    assert lo < 1 < hi
    plt.close(fig)
    fig, (a, b) = plt.subplots(1, 2)
    a.plot([0, 1], [1.2, 1.5])
    b.plot([0, 1], [3.0, 40.0])
    plotting.shared_ratio_axes([a, b])
    assert a.get_ylim() == b.get_ylim() and a.get_yscale() == "log"
    assert a.get_ylim()[0] <= 1.0 and a.get_ylim()[1] >= 40.0
    assert 1.0 in a.get_yticks() and 20.0 in a.get_yticks()
    plt.close(fig)
