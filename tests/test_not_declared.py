"""A router that declares none of the optional cost models (docs/PLUGINS.md, what a router may give): the counts,
tables, report text, floor, summary, `routerbench costs` and the forecasts say "not declared" for
it, never a wrong number and never an exception, and prenorm's numbers beside it are unchanged."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest
import torch
from click.testing import CliRunner

from harness.cli import main
from harness.rundir.records import load_rows
from harness.rundir.writer import RunWriter
from harness.sweep.cases import expand
from harness.sweep.options import SweepOptions
from harness.sweep.run import run_sweep
from harness.timing.timer import TimingPolicy
from reports import declared, floor, summary, tables
from reports.frame import load_frame
from routers import build_router, registry
from routers.api import MAY_GIVE, NOT_DECLARED, Router, declares

NAME = "nodecl_tmp"
TINY = dict(vocab_size=32, d_model=16, n_layers=2, n_heads=2, seq_len=8, batch_size=2)
FAST = SweepOptions(timing=TimingPolicy(warmup_min_count=1, warmup_min_s=0.0, repeats=3), max_attempts=1)


class NoDecl(Router):
    """h_{k+1} = h_k + 0.5 u_k, declaring no cost model."""

    def init_state(self, embedding, region=False):
        return embedding

    def read(self, state, role, params):
        return state

    def write(self, state, role, params, update):
        return state + 0.5 * update

    def output(self, state, params=()):
        return state

    def reference(self, embedding, updates):
        h, reads = embedding.double(), []
        for u in updates:
            reads.append(h)
            h = h + 0.5 * u.double()
        return reads, h


@pytest.fixture
def nodecl():
    registry.load_routers()
    registry.register(NAME, NoDecl)
    floor._io.cache_clear()
    try:
        yield NAME
    finally:
        registry.ROUTERS.pop(NAME, None)
        registry.ORIGINS.pop(NAME, None)
        floor._io.cache_clear()


@pytest.fixture
def swept(nodecl, tmp_path):
    from workloads.config import DecoderConfig
    cases = expand(["prenorm", NAME], DecoderConfig(**TINY), [16], [2], ["fwd_bwd"])
    w = RunWriter(tmp_path, "run", "s1")
    assert run_sweep(cases, torch.device("cpu"), w, FAST, progress=False) == {"resumed": 0, "ok": 2}
    w.close()
    return tmp_path


def test_declares_sees_only_what_the_class_defines(nodecl):
    r = build_router(NAME, 16, 2)
    assert not any(declares(r, m) for m in ("analytic_fwd_flops", "live_state_bytes", "ideal_io_per_token",
                                              "ideal_io_fwd_bwd_per_token"))
    assert all(declares(build_router("prenorm", 16, 2), m) for m in ("analytic_fwd_flops", "live_state_bytes"))
    assert r.analytic_fwd_flops(2, 8) is None and r.ideal_io_fwd_per_token() is None
    assert set(MAY_GIVE) >= {"analytic_fwd_flops", "live_state_bytes", "ideal_io_per_token"}


def test_counts_rows_say_not_declared_and_prenorm_keeps_its_numbers(swept):
    rows = pd.DataFrame(load_rows([swept]))
    mine = rows[(rows.router == NAME) & rows.metric.isin(declared.MODEL_OF)]
    assert sorted(mine.metric) == sorted(declared.MODEL_OF)
    assert (mine.status == "skipped").all() and mine.value.isna().all()
    assert all(e.startswith(NOT_DECLARED) and NAME in e for e in mine.error)
    # the counts that need no declaration still ran for it
    assert rows[(rows.router == NAME) & (rows.metric == "router_io_measured")].status.eq("ok").all()
    pre = rows[(rows.router == "prenorm") & rows.metric.isin(declared.MODEL_OF)].set_index("metric")
    assert (pre.status == "ok").all()
    r = build_router("prenorm", 16, 2)
    assert pre.loc["router_flops_analytic", "value"] == r.analytic_fwd_flops(2, 8)
    assert pre.loc["router_io_ideal", "value"] == r.ideal_io_per_token() * 16 * 4
    assert pre.loc["router_state", "value"] == r.live_state_bytes(2, 8, torch.float32)


def test_tables_report_text_and_floor(swept):
    df = load_frame([swept])
    rc = tables.router_cost_table(df).set_index("router")
    assert math.isnan(rc.loc[NAME, "flop_per_token"]) and math.isnan(rc.loc[NAME, "io_ideal_d"])
    assert math.isnan(rc.loc[NAME, "state_mib"]) and rc.loc[NAME, "io_measured_d"] > 0
    assert rc.loc["prenorm", "io_ideal_d"] == 3.0 and rc.loc["prenorm", "flop_per_token"] == 2 * 2 * 16
    assert declared.undeclared(df) == {NAME: ["analytic_fwd_flops", "ideal_io_per_token", "live_state_bytes"]}
    said = declared.sentence(df)
    assert said.startswith("Not declared: router nodecl_tmp declares no analytic_fwd_flops") and "prenorm" not in said
    # a cost model not declared is no failure
    assert tables.failures(df).empty
    ov = tables.overhead_table(df).set_index("router")
    assert math.isnan(ov.loc[NAME, "state_ratio"]) and ov.loc["prenorm", "state_ratio"] == 1.0
    mfu = tables.mfu_table(df).set_index("router")
    assert math.isnan(mfu.loc[NAME, "model_gflop"]) and mfu.loc["prenorm", "model_gflop"] > 0
    fl = floor.floor_table(df).set_index("router")
    assert math.isnan(fl.loc[NAME, "extra_bytes"]) and math.isnan(fl.loc[NAME, "floor_ms"])
    assert NAME in declared.floor_sentence(fl.reset_index()) and NOT_DECLARED in declared.floor_sentence(fl.reset_index())
    said, _ = summary.cost_sentences(df)
    assert any(NOT_DECLARED in s and NAME in s for s in said)
    assert not math.isnan(floor.extra_io_per_token("haares", 16, 2, {"n_blocks": 2}))


def test_report_says_not_declared(swept, tmp_path):
    from reports.report import build_report
    out = tmp_path / "rep"
    build_report([swept], out)
    md = (out / "report.md").read_text()
    assert f"Not declared: router {NAME} declares no analytic_fwd_flops, ideal_io_per_token, live_state_bytes" in md
    assert f"Floor {NOT_DECLARED} for {NAME}" in md


def test_floor_of_a_router_not_loaded_is_not_declared():
    floor._io.cache_clear()
    assert math.isnan(floor.extra_io_per_token("no_such_router_here", 16, 2))
    assert floor.extra_io_per_token("rezero", 16, 2) == 0.0  # prenorm-like models still give numbers


def test_costs_command(nodecl):
    res = CliRunner().invoke(main, ["costs", "--routers", NAME, "--widths", "16", "--depths", "2", "--tokens", "8",
                                    "--json"])
    assert res.exit_code == 0, res.output
    rows = {r["router"]: r for r in map(json.loads, res.output.splitlines())}
    mine, pre = rows[NAME], rows["prenorm"]
    assert mine["error"] is None and mine["units"] > 0
    assert mine["ideal_units"] is None and mine["floor_units"] is None and mine["router_flops_per_token"] is None
    assert mine["not_declared"] == ["analytic_fwd_flops", "ideal_io_fwd_per_token", "ideal_io_fwd_bwd_per_token"]
    assert pre["not_declared"] == [] and pre["ideal_units"] == 6.0 and pre["router_flops_per_token"] == 2 * 2 * 16
    text = CliRunner().invoke(main, ["costs", "--routers", NAME, "--widths", "16", "--depths", "2", "--tokens", "8"])
    assert text.exit_code == 0, text.output
    assert f"{NOT_DECLARED}: {NAME} d=16 L=2" in text.output
    assert NOT_DECLARED in [ln for ln in text.output.splitlines() if f" {NAME} " in ln][0]


def test_forecast_counts_the_flops_and_says_so(nodecl):
    from harness.costs import forecast as fc
    from harness.costs.router_flops import flop_note, router_fwd_flops
    from harness.sweep.forecast import forecast_sweep
    from workloads.config import DecoderConfig
    cfg = DecoderConfig(**TINY)
    flop, source = router_fwd_flops(cfg, NAME, {})
    assert source == "counted" and flop == (2 * 2) * (2 * 8) * 16 * 2  # 2L writes x B·T tokens x d x (a multiply, an add)
    assert router_fwd_flops(cfg, "prenorm", {}) == (build_router("prenorm", 16, 2).analytic_fwd_flops(2, 8),
                                                         "analytic")
    lo, hi = fc.step_seconds(cfg, NAME, {}, "fwd_bwd")
    assert 0 < lo < hi
    sw = forecast_sweep(expand(["prenorm", NAME], cfg, [16], [2], ["fwd_bwd"]), FAST)
    assert sw.notes == [flop_note(NAME, "counted")] and NOT_DECLARED in sw.notes[0]
    assert flop_note(NAME, "not declared").startswith(f"router {NAME}: analytic_fwd_flops {NOT_DECLARED}")


def test_model_flops_without_a_router_model_is_nan():
    from harness.costs.peak import model_flops_per_step
    assert math.isnan(model_flops_per_step("fwd", n_matrix=10, n_layers=2, d_model=16, seq_len=8, batch_size=2,
                                           router_fwd_flops=None))


def test_router_cost_figure_says_not_declared(swept, tmp_path, monkeypatch):
    import matplotlib.axes

    from reports import count_figures
    said = []
    real = matplotlib.axes.Axes.text
    monkeypatch.setattr(matplotlib.axes.Axes, "text", lambda ax, x, y, s, *a, **k: (said.append(s), real(ax, x, y, s, *a, **k))[1])
    path = count_figures.router_cost_models(load_frame([swept]), tmp_path / "figs")
    assert path is not None and said.count(NOT_DECLARED) == 1  # one bar: the router's ideal I/O model
    data = pd.read_csv(path.with_suffix(".csv"))
    assert set(data[data.router == "prenorm"].series) >= {"ideal I/O model"}
    assert "ideal I/O model" not in set(data[data.router == NAME].series)  # never drawn as a number
