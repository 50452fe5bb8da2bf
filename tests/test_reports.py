"""reports/: tables with golden numbers, figures as real PNGs, the report files, no-data paths."""

from __future__ import annotations

import html
import json
import math

import pytest
import torch
from frames import row

from harness.rundir.environment import cpu_model, write_manifest
from harness.rundir.records import MANIFEST_FILE, RECORDS_FILE, aborted_summary
from harness.rundir.writer import RunWriter
from reports import (build_report, compile_vs_eager, environment_table, failures, load_frame, overhead_table,
                     step_time_summary, tables, training_summary)
from reports.sections import CPU_RACE_NOTE, NO_DATA

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
SHAPE = dict(n_heads=4, seq_len=64, batch_size=2, dtype="float32")


def cost_case(w: RunWriter, router: str, d_model: int, times, *, n_layers=2, mode="fwd",
              backend="eager", compile_mode=None, fma=None, router_fma=None, saved=None,
              impl="naive", done=True):
    """One cost case as its own unit of resume; ``done=False``: interrupted (moved to aborted/)."""
    key = f"{router}-{impl}-{backend}-{compile_mode}-{mode}-d{d_model}-L{n_layers}"
    case = dict(case_key=key, router=router, router_options={}, impl=impl, backend=backend,
                compile_mode=compile_mode, mode=mode, workload="decoder", d_model=d_model,
                n_layers=n_layers, seed=0, **SHAPE)
    u = w.unit([key])
    for i, t in enumerate(times):
        u.write(**case, repeat=i, metric="step_time", value=t, unit="ms")
    if fma is not None:
        u.write(**case, metric="fwd_flops_fvcore", value=fma, unit="FMA")
    if router_fma is not None:
        u.write(**case, metric="router_flops_fvcore", value=router_fma, unit="FMA")
    if saved is not None:
        u.write(**case, metric="saved_activation", value=saved, unit="bytes")
    if done:
        u.commit()
    else:
        u.abandon("interrupted")
    return key


def train_run(w: RunWriter, router: str, seed: int, losses, *, reached_at=None, target=2.0):
    key = f"train-{router}-s{seed}"
    case = dict(case_key=key, router=router, impl="naive", backend="eager", mode="train",
                workload="decoder", d_model=64, n_layers=2, seed=seed, **SHAPE)
    with w.unit([key], kind="train") as u:
        for step, loss in enumerate(losses):
            u.write(**case, repeat=step * 10, metric="val_loss", value=loss, unit="nats")
            u.write(**case, repeat=step * 10, metric="elapsed", value=step * 1.5, unit="s")
            u.write(**case, repeat=step * 10, metric="tokens", value=step * 1280, unit="tokens")
        u.write(**case, metric="target_loss", value=target, unit="nats")
        if reached_at is None:
            u.write(**case, metric="time_to_target", value=None, unit="s", status="not_converged",
                    error="target not reached within 30 steps")
        else:
            u.write(**case, metric="time_to_target", value=reached_at * 1.5, unit="s")
            u.write(**case, metric="steps_to_target", value=reached_at * 10, unit="steps")
            u.write(**case, metric="tokens_to_target", value=reached_at * 1280, unit="tokens")
        u.write(**case, metric="loss_at_token_budget", value=losses[-1], unit="nats")
        u.write(**case, metric="token_budget", value=(len(losses) - 1) * 1280, unit="tokens")


@pytest.fixture
def run_dir(tmp_path):
    d = tmp_path / "results" / "cpu" / "run-a"
    with RunWriter(d, run_id="run-a", session="s1", base={"device": "cpu"}) as w:
        for d_model in (64, 128):
            for n_layers in (2, 4):
                scale = d_model / 64 * n_layers / 2
                cost_case(w, "prenorm", d_model, [10, 10, 10], n_layers=n_layers, fma=1e9 * scale,
                          saved=4 * 2**20)
                cost_case(w, "haares", d_model, [12, 12, 12], n_layers=n_layers,
                          fma=1.25e9 * scale, router_fma=0.25e9 * scale, saved=6 * 2**20)
        with w.unit(["prenorm|{}|cudagraph"]) as u:
            u.write(case_key="prenorm|{}|cudagraph", router="prenorm", impl="naive", backend="cudagraph",
                    mode="fwd", workload="decoder", d_model=64, n_layers=2, metric="step_time",
                    status="skipped", error="cudagraph needs CUDA; this machine has none")
        train_run(w, "prenorm", 0, [3.0, 2.5, 1.9, 1.8], reached_at=2)
        train_run(w, "haares", 0, [3.0, 2.6, 2.2, 2.1])
    write_manifest(d, "cpu", {"run_id": "run-a", "corpus": {"sha256": "f" * 64}})
    return d


def test_load_frame_types(run_dir):
    df = load_frame([run_dir])
    assert df["value"].dtype == float and df["d_model"].dtype == "int64"
    assert set(df["variant"]) == {"prenorm", "haares"}
    assert (df.loc[df["backend"] == "eager", "compile_mode"] == "").all()


def test_step_time_summary_median_iqr(tmp_path):
    with RunWriter(tmp_path, run_id="r", session="s") as w:
        cost_case(w, "prenorm", 64, [9, 10, 11, 30])
    s = row(step_time_summary(load_frame([tmp_path])), router="prenorm")
    assert s["median_ms"] == 10.5 and s["n"] == 4
    assert s["iqr_ms"] == pytest.approx(15.75 - 9.75)


def test_overhead_golden_numbers(run_dir):
    t = overhead_table(load_frame([run_dir]))
    assert len(t) == 8
    h = row(t, router="haares", d_model=64, n_layers=2)
    p = row(t, router="prenorm", d_model=64, n_layers=2)
    assert h["overhead_pct"] == pytest.approx(20.0) and p["overhead_pct"] == 0.0
    assert p["gflop_fwd"] == pytest.approx(2.0) and h["gflop_fwd"] == pytest.approx(2.5)
    assert h["router_flop_pct"] == pytest.approx(20.0)
    assert h["saved_mib"] == pytest.approx(6.0) and h["saved_ratio"] == pytest.approx(1.5)
    assert row(t, router="prenorm", d_model=128, n_layers=4)["gflop_fwd"] == pytest.approx(8.0)


def test_overhead_nan_without_prenorm_and_per_backend(tmp_path):
    with RunWriter(tmp_path, run_id="r", session="s", base={"device": "cpu"}) as w:
        cost_case(w, "haares", 64, [12, 12, 12])
        cost_case(w, "prenorm", 64, [5, 5, 5], backend="compile", compile_mode="default")
        cost_case(w, "haares", 64, [6, 6, 6], backend="compile", compile_mode="default")
    t = overhead_table(load_frame([tmp_path]))
    assert math.isnan(row(t, router="haares", backend="eager")["overhead_pct"])
    assert row(t, router="haares", backend="compile")["overhead_pct"] == pytest.approx(20.0)


def test_training_summary(run_dir):
    s = training_summary(load_frame([run_dir]))
    p, h = row(s, router="prenorm"), row(s, router="haares")
    assert p["time_to_target"] == pytest.approx(3.0) and p["steps_to_target"] == 20
    assert p["tokens_to_target"] == 2560 and p["target_loss"] == 2.0
    assert h["time_to_target"] == "not converged"
    assert h["final_val_loss"] == pytest.approx(2.1) and h["final_step"] == 30
    assert h["loss_at_token_budget"] == pytest.approx(2.1) and h["token_budget"] == 3840


def test_failures_list_skipped_not_not_converged(run_dir):
    f = failures(load_frame([run_dir]))
    assert list(f["status"]) == ["skipped"]
    assert "needs CUDA" in f["error"].iloc[0]


def test_build_report_writes_everything(run_dir):
    out = build_report([run_dir])
    for name in ("report.md", "report.html", "overhead.csv", "step_time_overhead_vs_width.png",
                 "flops_vs_depth.png", "loss_curves.png"):
        assert out[name] == run_dir / name and out[name].is_file(), name
    assert "compile_vs_eager.png" not in out
    for name, path in out.items():
        if name.endswith(".png"):
            assert path.read_bytes()[:8] == PNG_MAGIC, name
    md = out["report.md"].read_text(encoding="utf-8")
    page = out["report.html"].read_text(encoding="utf-8")
    assert "](step_time_overhead_vs_width.png)" in md and "](loss_curves.png)" in md
    import re
    shown = re.findall(r"\]\((\w+)\.png\)", md)
    # unpaired fixture: the unpaired overhead figure stands in for the paired one; every
    # figure written is shown (flops_vs_depth beside the router's FLOP share)
    assert shown == ["step_time_overhead_vs_width", "flops_vs_depth", "router_flop_share_vs_width",
                     "memory_vs_depth", "loss_curves"]
    assert page.count("data:image/png;base64,") == len(shown) and "<table" in page
    for text in (md, page):
        assert "run-a" in text and html.escape(cpu_model()) in text and "ffffffffffff" in text
        assert torch.__version__ in text
        assert "+20.0" in text and "not converged" in text
        assert "FLOP = 2·FMA, causal attention not halved, see docs/FLOPS.md" in text
        assert CPU_RACE_NOTE in text and NO_DATA["compile_vs_eager"] in text
        assert "cudagraph needs CUDA; this machine has none" in text
    heads = [line for line in md.splitlines() if line.startswith("## ")]
    # top-down: the warnings (CPU here; no paired rows, so no summary), then the detail sections
    assert heads[:2] == ["## Warnings", "## Cost: step time, FLOPs and memory vs prenorm"] and heads[-3:] == [
        "## Training race: time to target loss", "## Skipped and failed cases", "## Environment"]
    fails = md.split("## Skipped and failed cases")[1]
    assert "| prenorm, naive, cudagraph, fwd, d=64 L=2 " in fails
    assert "prenorm\\|{}\\|cudagraph" not in fails  # the case key stays out of the table
    csv = out["overhead.csv"].read_text().splitlines()
    assert csv[0].startswith("run_id,router,") and len(csv) == 9


def test_no_data_sections(tmp_path):
    with RunWriter(tmp_path, run_id="one-width", session="s", base={"device": "cpu"}) as w:
        cost_case(w, "prenorm", 64, [10, 10])
        cost_case(w, "haares", 64, [11, 11])
    out = build_report([tmp_path], tmp_path / "report")
    assert set(out) == {"report.md", "report.html", "overhead.csv"}
    md = out["report.md"].read_text(encoding="utf-8")
    for name in ("overhead_vs_width", "router_flop_share_vs_width"):
        assert NO_DATA[name] in md
    assert "## Training race" not in md and NO_DATA["loss_curves"] not in md
    assert "No manifest.json" in md and "None: every case ran" in md
    assert "+10.0" in md


def test_empty_records(tmp_path):
    (tmp_path / RECORDS_FILE).write_text("")
    md = build_report([tmp_path])["report.md"].read_text(encoding="utf-8")
    assert "No rows in these runs" in md and "## Cost" not in md and "## Training" not in md


def test_compile_vs_eager_figure(tmp_path):
    with RunWriter(tmp_path, run_id="r", session="s", base={"device": "cpu"}) as w:
        for backend, mode in (("eager", None), ("compile", "default")):
            cost_case(w, "prenorm", 64, [10, 11, 12], backend=backend, compile_mode=mode)
            cost_case(w, "haares", 64, [12, 13, 14], backend=backend, compile_mode=mode)
    df = load_frame([tmp_path])
    assert compile_vs_eager(df[df["backend"] == "eager"], tmp_path) is None
    path = compile_vs_eager(df, tmp_path / "figs")
    assert path.name == "compile_vs_eager.png" and path.read_bytes()[:8] == PNG_MAGIC


def test_missing_records_names_path(tmp_path):
    empty = tmp_path / "no-records-here"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match="no-records-here"):
        build_report([empty])
    with pytest.raises(FileNotFoundError, match="does-not-exist"):
        load_frame([tmp_path / "does-not-exist"])


def test_several_runs_need_out_dir(run_dir, tmp_path):
    other = tmp_path / "run-b"
    with RunWriter(other, run_id="run-b", session="s") as w:
        cost_case(w, "prenorm", 64, [10])
    with pytest.raises(ValueError, match="out_dir"):
        build_report([run_dir, other])
    out = build_report([run_dir, other], tmp_path / "combined")
    assert "run-a, run-b" in out["report.md"].read_text(encoding="utf-8")


def test_runs_are_never_pooled(tmp_path):
    # The same cases on two machines: each run keeps its own medians and its own baseline.
    for run, scale in (("fast", 1), ("slow", 2)):
        with RunWriter(tmp_path / run, run_id=run, session="s", base={"device": "cuda"}) as w:
            cost_case(w, "prenorm", 64, [10 * scale] * 3)
            cost_case(w, "haares", 64, [12 * scale] * 3)
    t = overhead_table(load_frame([tmp_path / "fast", tmp_path / "slow"]))
    assert len(t) == 4 and (t["n"] == 3).all()
    assert row(t, run_id="slow", router="prenorm")["median_ms"] == 20
    assert list(t.loc[t["router"] == "haares", "overhead_pct"]) == pytest.approx([20.0, 20.0])


def test_resume_keeps_only_the_finishing_session(tmp_path):
    # Session s1 is interrupted inside the prenorm case; s2 redoes and finishes it.
    with RunWriter(tmp_path, run_id="r", session="s1", base={"device": "cpu"}) as w1:
        cost_case(w1, "prenorm", 64, [100, 100], done=False)
    with RunWriter(tmp_path, run_id="r", session="s2", base={"device": "cpu"}) as w2:
        cost_case(w2, "prenorm", 64, [10, 10, 10])
        cost_case(w2, "haares", 64, [12, 12, 12])
    df = load_frame([tmp_path])
    assert set(df["session"]) == {"s2"}
    t = overhead_table(df)
    assert row(t, router="prenorm")["n"] == 3 and row(t, router="prenorm")["median_ms"] == 10
    assert row(t, router="haares")["overhead_pct"] == pytest.approx(20.0)
    # A case no session finished (a race cut short) keeps its rows, in aborted/, never in the
    # report; the session that finishes it is the one reported.
    with RunWriter(tmp_path, run_id="r", session="s3", base={"device": "cpu"}) as w3:
        cost_case(w3, "mhc", 64, [15], done=False)
    assert aborted_summary(tmp_path) == {"units": 2, "rows": 3}
    assert "mhc" not in set(load_frame([tmp_path])["router"])
    with RunWriter(tmp_path, run_id="r", session="s4", base={"device": "cpu"}) as w4:
        cost_case(w4, "mhc", 64, [15])
    assert row(overhead_table(load_frame([tmp_path])), router="mhc")["overhead_pct"] == 50.0
    md = build_report([tmp_path])["report.md"].read_text()
    assert "aborted/ and never used here" in md and "2 unit(s), 3 row(s)" in md


def test_environment_table_reads_manifest_fields(tmp_path):
    (tmp_path / MANIFEST_FILE).write_text(json.dumps({
        "run_id": "run-b", "git_sha": "0123456789abcdef0123-dirty",
        "command_line": "routerbench run --preset cpu-quick", "corpus": {"sha256": "ab" * 32},
        "environment": {"device": "cuda", "device_name": "NVIDIA H200", "cpu_model": "Test CPU",
                        "torch_threads": 8, "torch": "2.13.0", "cuda": "12.8", "gpu_count": 1,
                        "matmul_precision": "highest"},
        "sessions": [{"argv": ["routerbench", "run"], "git_sha": "0123"}]}))
    env = environment_table([tmp_path]).set_index("field")["run-b"]
    assert env["device"] == "NVIDIA H200" and env["CPU"] == "Test CPU" and env["threads"] == "8"
    assert env["torch"] == "2.13.0" and env["CUDA"] == "12.8"
    assert env["git sha"] == "0123456789ab-dirty"
    assert env["command line"] == "routerbench run --preset cpu-quick"
    assert env["corpus sha256"] == "abababababab" and "driver" not in env
    assert env["float32 matmul precision"] == "highest" and "precision" not in env
    with RunWriter(tmp_path, run_id="run-b", session="s") as w:
        cost_case(w, "prenorm", 64, [10])
    md = build_report([tmp_path])["report.md"].read_text(encoding="utf-8")
    assert md.startswith("# routerbench report: NVIDIA H200 — run run-b")


def test_training_pooled_over_seeds(tmp_path):
    with RunWriter(tmp_path, run_id="r", session="s", base={"device": "cpu"}) as w:
        for seed, reached in ((0, 2), (1, 3), (2, 2)):
            train_run(w, "prenorm", seed, [3.0, 2.5, 1.9, 1.8], reached_at=reached)
        for seed, reached in ((0, 3), (1, None), (2, None)):
            train_run(w, "haares", seed, [3.0, 2.6, 2.2, 1.9], reached_at=reached)
        with w.unit(["cut-short"], kind="train") as u:  # a run recorded without its verdict
            u.write(case_key="cut-short", router="haares", impl="naive", mode="train", seed=3,
                    metric="val_loss", value=3.0, unit="nats", repeat=0)
    df = load_frame([tmp_path])
    pooled = tables.training_by_router(df).set_index("variant")
    assert pooled.loc["prenorm", "median_time_to_target"] == pytest.approx(3.0)
    assert pooled.loc["prenorm", "reached"] == "3/3" and pooled.loc["prenorm", "max_s"] == 4.5
    assert pooled.loc["haares", "median_time_to_target"] == "not converged"
    assert pooled.loc["haares", "reached"] == "1/3" and pooled.loc["haares", "seeds"] == 3
    assert math.isnan(row(training_summary(df), seed=3)["time_to_target"])
    md = build_report([tmp_path])["report.md"].read_text(encoding="utf-8")
    assert "Pooled over seeds" in md


def test_report_when_no_router_reaches_the_target(tmp_path):
    with RunWriter(tmp_path, "r", "s") as w:
        for r in ("prenorm", "haares"):
            c = dict(case_key=f"train|{r}", router=r, mode="train", backend="eager", seed=0,
                     d_model=16, n_layers=2)
            with w.unit([c["case_key"]], kind="train") as u:
                u.write(**c, metric="target_loss", value=1.0, unit="nats")
                for step, v in ((0, 4.0), (10, 3.0)):
                    u.write(**c, metric="val_loss", value=v, unit="nats", repeat=step)
                u.write(**c, metric="time_to_target", unit="s", status="not_converged", error="budget")
                u.write(**c, metric="loss_at_token_budget", value=3.0, unit="nats")
    t = tables.training_summary(load_frame([tmp_path]))
    assert t["time_to_target"].tolist() == ["not converged", "not converged"]
    assert t["final_val_loss"].tolist() == [3.0, 3.0]
    assert "not converged" in build_report([tmp_path])["report.md"].read_text()


# --- compile scopes ------------------------------------------------------------------------------

def compiled_case(w, router: str, impl: str, scope: str, n_layers: int, times, compile_s: float,
                  hits: int = 0, run_id: str = "r"):
    """One compiled fwd_bwd case with paired step times (pair i = round i) and its compile rows."""
    key = f"{router}-{impl}-compile-{scope}-L{n_layers}-{run_id}"
    case = dict(case_key=key, router=router, router_options={}, impl=impl, backend="compile",
                compile_mode="default", compile_scope=scope, mode="fwd_bwd", workload="decoder",
                d_model=64, n_layers=n_layers, seed=0, **SHAPE)
    for i, t in enumerate(times):
        w.write(**case, repeat=i, pair=i, metric="step_time", value=t, unit="ms")
    w.write(**case, metric="compile_time", value=compile_s, unit="s")
    for metric, value in (("graphs_fwd", 4 if scope == "layer" else 1), ("recompiles", 0),
                          ("fxgraph_cache_hit", hits), ("fxgraph_cache_miss", 8 - hits)):
        w.write(**case, metric=metric, value=value, unit="count")


def test_scope_table_compile_table_and_compile_time_vs_depth(tmp_path):
    """Two scopes of one router in one group: layer/model per round is 0.9 exactly; the
    compile table keeps each case's counts; the figure draws the three depths of two cold runs
    and a warm one together, marking the warm compile."""
    with RunWriter(tmp_path / "a", run_id="a", session="s", base={"device": "cpu"}) as w:
        with w.unit(["g"]) as u:
            model = [10.0, 11.0, 12.0, 10.5, 11.5, 10.2]
            compiled_case(u, "haares", "two_phase", "model", 12, model, 120.0)
            compiled_case(u, "haares", "two_phase", "layer", 12, [0.9 * t for t in model], 40.0, run_id="a")
    with RunWriter(tmp_path / "b", run_id="b", session="s", base={"device": "cpu"}) as w:
        with w.unit(["g"]) as u:
            compiled_case(u, "haares", "two_phase", "layer", 24, [9.0] * 3, 41.0, run_id="b")
            compiled_case(u, "haares", "two_phase", "layer", 48, [9.0] * 3, 12.0, hits=6, run_id="b")
    df = load_frame([tmp_path / "a", tmp_path / "b"])
    from reports.paired import paired_scope_table
    from reports.time_figures import compile_time_vs_depth
    s = row(paired_scope_table(df), router="haares")
    assert (s["pairs"], s["layer_vs_model"]) == (6, pytest.approx(0.9))
    assert s["layer_vs_model_lo"] == pytest.approx(0.9) and s["layer_vs_model_hi"] == pytest.approx(0.9)
    c = tables.compile_table(df)
    c = c.sort_values(["n_layers", "compile_scope"])
    assert list(c["compile_time"]) == [40.0, 120.0, 41.0, 12.0] and list(c["graphs_fwd"]) == [4, 1, 4, 4]
    png = compile_time_vs_depth(df, tmp_path)
    assert png.read_bytes()[:8] == PNG_MAGIC
    drawn = __import__("pandas").read_csv(png.with_suffix(".csv"))
    layer = drawn[drawn["compile_scope"] == "layer"].sort_values("n_layers")
    assert list(layer["n_layers"]) == [12, 24, 48] and list(layer["warm"]) == [False, False, True]
    assert list(drawn[drawn["compile_scope"] == "model"]["n_layers"]) == []  # one depth: no line


def test_impl_figure_keeps_the_compile_scopes_apart(tmp_path):
    """Two impls under two scopes (4 cases of one router and shape): four bars, one per case."""
    from reports.impls import impl_figure
    with RunWriter(tmp_path, run_id="r", session="s", base={"device": "cpu"}) as w:
        with w.unit(["g"]) as u:
            for scope, base in (("layer", 10.0), ("model", 11.0)):
                compiled_case(u, "haares", "naive", scope, 12, [base * 1.5] * 3, 1.0)
                compiled_case(u, "haares", "two_phase", scope, 12, [base] * 3, 1.0)
    png = impl_figure(load_frame([tmp_path]), tmp_path)
    drawn = __import__("pandas").read_csv(png.with_suffix(".csv"))
    assert len(drawn) == 4 and drawn["case"].nunique() == 2
    assert sorted(drawn["vs_fastest"]) == pytest.approx([1.0, 1.0, 1.5, 1.5])


def test_the_summary_quotes_one_compiled_ratio_per_router_the_default_scope(tmp_path):
    """prenorm and haares under both scopes in one group: the summary has one haares row, whose
    compiled ratio is the model scope's (1.2 per round), not the layer scope's (1.5)."""
    base = [10.0, 11.0, 12.0, 10.5, 11.5, 10.2]
    with RunWriter(tmp_path / "a", run_id="a", session="s", base={"device": "cpu"}) as w:
        with w.unit(["g"]) as u:
            for scope, factor in (("model", 1.2), ("layer", 1.5)):
                compiled_case(u, "prenorm", "naive", scope, 12, base, 50.0)
                compiled_case(u, "haares", "two_phase", scope, 12, [factor * t for t in base], 90.0)
    from reports.summary import cost_summary
    t = cost_summary(load_frame([tmp_path / "a"]))
    assert len(t) == 1 and t.iloc[0]["compile_ratio"] == pytest.approx(1.2)


def test_a_run_holding_fewer_cases_than_it_planned_is_called_incomplete_first(tmp_path):
    import json as _json

    from harness.rundir.records import MANIFEST_FILE
    from harness.rundir.writer import RunWriter
    from reports.cautions import incomplete
    from reports.frame import load_manifests
    d = tmp_path / "r"
    with RunWriter(d, "r", "s") as w:
        for router in ("prenorm", "rezero"):
            with w.unit([router], kind="group") as u:
                u.write(case_key=router, router=router, impl="naive", backend="eager", mode="fwd",
                        workload="decoder", d_model=16, n_layers=2, n_heads=2, seq_len=8, batch_size=2,
                        dtype="float32", seed=0, metric="step_time", value=1.0, unit="ms", repeat=0)
    (d / MANIFEST_FILE).write_text(_json.dumps({"run_id": "r", "command": "run", "cases": 3}))
    df = load_frame([d])
    assert incomplete(df, load_manifests([d])) == [
        "Incomplete: run r holds 2 of the 3 cost cases it planned; the others were never measured (the run "
        "was stopped or its process died): `routerbench status` on its directory says how to resume it."]
    (d / MANIFEST_FILE).write_text(_json.dumps({"run_id": "r", "command": "run", "cases": 2}))
    assert incomplete(df, load_manifests([d])) == []
    md = build_report([d], tmp_path / "rep")["report.md"].read_text()
    assert "Incomplete:" not in md
