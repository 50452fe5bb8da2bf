"""reports/training.py, reports/race.py, reports/sentences.py and the training figures on synthetic races.

Every curve is linear in the step, val_loss(s) = 4 − k·s with k = 2 / steps to the target 2.0,
and every clock linear, elapsed(s) = s·dt, so interpolation is exact and each number below is
computed by hand from (steps to target, dt) per router and seed.
"""

from __future__ import annotations

import json
import math
import warnings

import numpy as np
import pandas as pd
import pytest
from frames import row
from scipy import stats as sps

from harness.rundir.records import RECORDS_FILE
from harness.rundir.writer import RunWriter
from reports import build_report, frame, load_frame, race, tables, training
from reports import sentences as say
from reports.render import display_frame
from reports.sections import CPU_RACE_NOTE, NO_DATA
from reports.training_figures import decomposition, loss_curves, time_to_target

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
SHAPE = dict(workload="decoder", d_model=64, n_layers=2, n_heads=4, seq_len=64, batch_size=2,
             dtype="float32")
TARGET, BUDGET, EVERY, TOKENS_PER_STEP = 2.0, 60, 10, 128
LAST_FINITE = 3.1234  # the diverged run's last finite loss: never a result

#: (router, seed) -> (steps to target or None when not converged, s per step, k when not
#: converged). block_attnres seed 1 diverges at step 30 (after LAST_FINITE at step 20).
PLAN = {
    ("prenorm", 0): (50, 0.10), ("prenorm", 1): (50, 0.11), ("prenorm", 2): (50, 0.12),
    ("haares", 0): (40, 0.12), ("haares", 1): (45, 0.12), ("haares", 2): (None, 0.13),
    ("block_attnres", 0): (48, 0.09), ("block_attnres", 2): (52, 0.095),
    ("wav_v1", 0): (None, 0.10), ("wav_v1", 1): (None, 0.10), ("wav_v1", 2): (None, 0.10),
}
SLOW_K = 0.03  # slope of a run that does not reach the target within the budget


def case(router: str, seed: int, mode: str = "train") -> dict:
    return dict(case_key=f"train|{router}|s{seed}|{mode}", router=router, router_options={},
                impl="naive", backend="eager", mode=mode, seed=seed, **SHAPE)


def evals(u, c: dict, k: float, dt: float, last: int) -> None:
    for s in range(0, last + 1, EVERY):
        u.write(**c, repeat=s, metric="val_loss", value=4 - k * s, unit="nats")
        u.write(**c, repeat=s, metric="elapsed", value=s * dt, unit="s")
        u.write(**c, repeat=s, metric="tokens", value=s * TOKENS_PER_STEP, unit="tokens")
        if s:
            u.write(**c, repeat=s, metric="train_loss", value=4 - k * s + 0.05, unit="nats")


def measured_run(w: RunWriter, router: str, seed: int, steps: int | None, dt: float) -> None:
    c = case(router, seed)
    k = 2 / steps if steps else SLOW_K
    with w.unit([c["case_key"]], kind="train") as u:
        evals(u, c, k, dt, BUDGET)
        for metric, value, unit in (("target_loss", TARGET, "nats"),
                                    ("token_budget", BUDGET * TOKENS_PER_STEP, "tokens"),
                                    ("step_budget", BUDGET, "steps"),
                                    ("train_time", BUDGET * dt, "s"),
                                    ("loss_at_token_budget", 4 - k * BUDGET, "nats")):
            u.write(**c, metric=metric, value=value, unit=unit)
        if steps is None:
            for metric, unit in (("time_to_target", "s"), ("steps_to_target", "steps"),
                                 ("tokens_to_target", "tokens")):
                u.write(**c, metric=metric, unit=unit, status="not_converged",
                        error=f"val loss {4 - k * BUDGET:.3f} > target {TARGET} after {BUDGET} "
                              "steps")
        else:
            after = math.ceil(steps / EVERY) * EVERY
            for metric, value, unit in (
                    ("time_to_target", steps * dt, "s"), ("steps_to_target", steps, "steps"),
                    ("tokens_to_target", steps * TOKENS_PER_STEP, "tokens"),
                    ("time_to_target_eval", after * dt, "s"),
                    ("steps_to_target_eval", after, "steps")):
                u.write(**c, metric=metric, value=value, unit=unit)


def diverged_run(w: RunWriter, router: str, seed: int) -> None:
    c = case(router, seed)
    with w.unit([c["case_key"]], kind="train") as u:
        for s, loss in ((0, 4.0), (10, 3.5), (20, LAST_FINITE)):
            u.write(**c, repeat=s, metric="val_loss", value=loss, unit="nats")
            u.write(**c, repeat=s, metric="elapsed", value=s * 0.1, unit="s")
            u.write(**c, repeat=s, metric="tokens", value=s * TOKENS_PER_STEP, unit="tokens")
        u.write(**c, repeat=30, metric="diverged", unit="nats", status="diverged",
                error="non-finite loss at step 30")
        for metric, value, unit in (("target_loss", TARGET, "nats"),
                                    ("step_budget", BUDGET, "steps"), ("train_time", 3.0, "s")):
            u.write(**c, metric=metric, value=value, unit=unit)
        for metric, unit in (("time_to_target", "s"), ("steps_to_target", "steps"),
                             ("tokens_to_target", "tokens"), ("loss_at_token_budget", "nats")):
            u.write(**c, metric=metric, unit=unit, status="diverged",
                    error="non-finite loss at step 30")


def pilot_run(w: RunWriter, seed: int = 10000) -> None:
    c = case("prenorm", seed, mode="pilot")
    with w.unit([c["case_key"]], kind="train") as u:
        evals(u, c, 2 / 30, 0.1, 30)  # stops at the evaluation that set the target
        for metric, value, unit in (("target_loss", TARGET, "nats"), ("target_step", 30, "steps"),
                                    ("train_time", 3.0, "s")):
            u.write(**c, metric=metric, value=value, unit=unit)


def write_race(run_dir, plan=PLAN, diverged=(("block_attnres", 1),), pilot=True) -> None:
    with RunWriter(run_dir, run_id="race", session="s", base={"device": "cpu"}) as w:
        if pilot:
            pilot_run(w)
        for (router, seed), (steps, dt) in plan.items():
            measured_run(w, router, seed, steps, dt)
        for router, seed in diverged:
            diverged_run(w, router, seed)


@pytest.fixture(scope="module")
def race_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("results") / "race"
    write_race(d)
    return d


@pytest.fixture(scope="module")
def df(race_dir):
    return load_frame([race_dir])


@pytest.fixture(scope="module")
def table(df):
    return race.comparison_table(df)


def gmean_ci(ratios):
    logs = np.log(ratios)
    h = sps.t.ppf(0.975, len(logs) - 1) * logs.std(ddof=1) / math.sqrt(len(logs))
    return math.exp(logs.mean()), math.exp(logs.mean() - h), math.exp(logs.mean() + h)


def time_of(router, seed):
    steps, dt = PLAN[(router, seed)]
    return steps * dt


def test_baselines_for():
    assert training.baselines_for(["prenorm", "haares", "mhc"]) == {
        "haares": ("prenorm",), "mhc": ("prenorm",), "prenorm": ()}
    b = training.baselines_for(["prenorm", "haares", "wav_v1", "block_attnres"])
    assert b["haares"] == b["wav_v1"] == ("prenorm", "block_attnres")
    assert b["block_attnres"] == ("prenorm",)


def test_runs_table_marks_pilot_and_every_verdict(df):
    runs = training.runs_table(df)
    assert list(runs.columns) == training.RUNS_COLUMNS and len(runs) == 13
    pilot = row(runs, mode="pilot")
    assert pilot["seed"] == 10000 and pilot["status"] == "ok" and runs.index[0] == pilot.name
    assert "step 30" in pilot["note"] and pilot["target_loss"] == TARGET
    h = row(runs, router="haares", seed=0, mode="train")
    assert h["time_to_target"] == pytest.approx(4.8) and h["steps_to_target"] == 40
    assert h["train_time"] == pytest.approx(7.2) and h["loss_at_token_budget"] == pytest.approx(1.0)
    nc = row(runs, router="haares", seed=2)
    assert nc["status"] == "not converged" and math.isnan(nc["time_to_target"])
    assert "> target" in nc["note"] and nc["loss_at_token_budget"] == pytest.approx(2.2)
    dead = row(runs, router="block_attnres", seed=1)
    assert dead["status"] == "diverged" and "non-finite" in dead["note"]
    assert math.isnan(dead["loss_at_token_budget"]) and math.isnan(dead["time_to_target"])


def test_time_ratio_is_the_geometric_mean_of_the_pairs(table):
    h = row(table, variant="haares", baseline="prenorm")
    ratios = [time_of("haares", s) / time_of("prenorm", s) for s in (0, 1)]
    g, lo, hi = gmean_ci(ratios)
    assert h["n"] == 2 and h["censored"] == 1 and h["diverged"] == 0 and h["seeds"] == "0, 1, 2"
    assert h["time_ratio"] == pytest.approx(g) and h["time_ratio"] == pytest.approx(
        math.exp(np.mean(np.log(ratios))))
    assert (h["time_lo"], h["time_hi"]) == pytest.approx((lo, hi))
    # seed 2: haares never reached the target: its whole clock / prenorm's time, a lower bound
    bound = 60 * 0.13 / time_of("prenorm", 2)
    assert h["time_per_seed"] == f"{ratios[0]:.2f}, {ratios[1]:.2f}, > {bound:.3g}"
    assert h["steps_per_seed"] == f"{40 / 50:.2f}, {45 / 50:.2f}, > {60 / 50:.3g}"
    assert h["dropped"] == (f"seed 2: haares not converged (its time-to-target ratio is above {bound:.3g}: haares "
                            f"trained {bound:.3g}× prenorm's time to target without reaching it)")


def test_decomposition_identity(table):
    for r in table[table["n"] > 0].itertuples():
        assert math.log(r.time_ratio) == pytest.approx(
            math.log(r.steps_ratio) + math.log(r.step_time_ratio))
    h = row(table, variant="haares", baseline="prenorm")
    assert h["steps_ratio"] == pytest.approx(math.sqrt(40 / 50 * 45 / 50))
    assert h["step_time_ratio"] == pytest.approx(math.sqrt(0.12 / 0.10 * 0.12 / 0.11))


def test_one_pair_no_interval_and_diverged_pair_counted(table):
    # haares vs block_attnres: seed 0 a pair, seed 1 diverged (block_attnres), seed 2 censored
    h = row(table, variant="haares", baseline="block_attnres")
    assert h["n"] == 1 and h["diverged"] == 1 and h["censored"] == 1
    assert h["time_ratio"] == pytest.approx(4.8 / (48 * 0.09))
    assert math.isnan(h["time_lo"]) and math.isnan(h["time_hi"])
    assert "seed 1: block_attnres diverged" in h["dropped"]
    s = say.training_sentence(h)
    assert f"in {4.8 / (48 * 0.09):.2f}× the time of block_attnres (1 seed: no interval)" in s
    b = row(table, variant="block_attnres", baseline="prenorm")
    assert b["n"] == 2 and b["diverged"] == 1 and b["loss_n"] == 2


def test_no_pair_says_which_seeds(table):
    w = row(table, variant="wav_v1", baseline="prenorm")
    assert w["n"] == 0 and w["censored"] == 3 and math.isnan(w["time_ratio"])
    s = say.training_sentence(w)
    assert s.startswith("wav_v1 vs prenorm: no seed reached 2.000 nats on both sides")
    for seed in (0, 1, 2):
        assert f"seed {seed}: wav_v1 not converged" in s
    assert set(table.loc[table["variant"] == "wav_v1", "baseline"]) == {"prenorm",
                                                                       "block_attnres"}


def test_loss_at_token_budget_paired_t(table):
    h = row(table, variant="haares", baseline="prenorm")
    treat = [4 - 60 * 2 / 40, 4 - 60 * 2 / 45, 4 - 60 * SLOW_K]  # seed 2 did not converge: kept
    base = [4 - 60 * 2 / 50] * 3
    t = sps.ttest_rel(treat, base)
    d = np.subtract(treat, base)
    assert h["loss_n"] == 3 and h["loss_router"] == pytest.approx(np.mean(treat))
    assert h["loss_diff"] == pytest.approx(d.mean()) and h["loss_p"] == pytest.approx(t.pvalue)
    assert h["ppl_change_pct"] == pytest.approx(100 * (math.exp(d.mean()) - 1))
    with warnings.catch_warnings():  # prenorm's three losses are equal: scipy warns
        warnings.simplefilter("ignore", RuntimeWarning)
        welch = sps.ttest_ind(treat, base, equal_var=False).pvalue
    assert h["loss_welch_p"] == pytest.approx(welch)


def test_loss_at_equal_wall_clock(table):
    # T*: the smallest median clock over routers; block_attnres's live seeds run 5.4 and 5.7 s
    # (its diverged seed is left out), prenorm's median is 6.6, haares's 7.2, wav_v1's 6.0.
    t_star = (60 * 0.09 + 60 * 0.095) / 2
    h = row(table, variant="haares", baseline="prenorm")
    assert h["t_star"] == pytest.approx(t_star) and h["wall_n"] == 3

    def at(router, seed):
        steps, dt = PLAN[(router, seed)]
        return 4 - (2 / steps if steps else SLOW_K) * t_star / dt

    d = [at("haares", s) - at("prenorm", s) for s in range(3)]
    assert h["wall_diff"] == pytest.approx(np.mean(d))
    assert h["wall_p"] == pytest.approx(sps.ttest_1samp(d, 0).pvalue)


def test_sentence_quotes_the_table(df, table):
    h = row(table, variant="haares", baseline="prenorm")
    s = say.training_sentence(h)
    g, lo, hi = h["time_ratio"], h["time_lo"], h["time_hi"]
    assert s.startswith(f"haares reached 2.000 nats in {g:.2f}× the time of prenorm "
                        f"[{lo:.2f}, {hi:.2f}] (2 seeds, 95% t-interval): "
                        f"{h['steps_ratio']:.2f}× the steps at {h['step_time_ratio']:.2f}× the "
                        "step time")
    assert f"(its time-to-target ratio is above {60 * 0.13 / 6.0:.3g}: haares trained" in s
    diff = f"{h['loss_diff']:+.3f}".replace("-", "\u2212")
    ppl = f"{h['ppl_change_pct']:+.1f}".replace("-", "\u2212")
    assert f"loss at the token budget {diff} nats (perplexity {ppl} %, paired t p = " \
           f"{h['loss_p']:.2g})" in s
    assert f"at equal wall-clock ({h['t_star']:#.3g} s; 3 pairs) " in s
    assert race.sentences(df) == [say.training_sentence(r) for r in table.to_dict("records")]


def test_formatting():
    assert say.fmt_signed(-0.0214) == "\u22120.021" and say.fmt_signed(0.5) == "+0.500"
    assert say.fmt_interval(0.00431, 182.58) == "[0.0043, 183]"
    assert say.fmt_pct(-2.14) == "\u22122.1 %" and say.fmt_ratio(0.9149) == "0.91"
    assert say.fmt_p(0.0412) == "0.041" and say.fmt_p(1e-5) == "< 0.001"
    assert say.p_equals(1e-5) == "p < 0.001" and say.p_equals(0.2) == "p = 0.2"
    assert say.fmt_interval(0.8, float("nan")) == "" and say.fmt_interval(0.84, 0.99) == \
        "[0.84, 0.99]"
    assert say.fmt_per_seed({2: "> 1.2", 0: 0.912, 1: "diverged"}) == "0.91, diverged, > 1.2"


def test_diverged_last_finite_loss_appears_nowhere(df, table, race_dir, tmp_path):
    for shown in (training.runs_table(df), table, tables.training_summary(df),
                  race.comparison_display(table)):
        cells = [str(c) for c in shown.to_numpy().ravel()]
        assert not any("3.123" in c for c in cells)
        numbers = shown.select_dtypes("number").to_numpy(dtype=float).ravel()
        assert not np.isclose(numbers, LAST_FINITE).any()
    summary = row(tables.training_summary(df), router="block_attnres", seed=1)
    assert math.isnan(summary["final_val_loss"]) and summary["time_to_target"] == "diverged"
    out = build_report([race_dir], tmp_path)
    for name in ("report.md", "report.html", "training_runs.csv", "training_comparison.csv"):
        assert "3.123" not in out[name].read_text(encoding="utf-8"), name


def test_cost_tables_ignore_the_pilot(df):
    assert tables.overhead_table(df).empty and frame.cost_rows(df).empty


def test_figures_write_png_and_csv(df, tmp_path):
    for fn in (loss_curves, time_to_target, decomposition):
        path = fn(df, tmp_path)
        assert path.read_bytes()[:8] == PNG_MAGIC
        data = path.with_suffix(".csv").read_text().splitlines()
        assert len(data) > 1, path.name
    dec = (tmp_path / "decomposition.csv").read_text()
    assert dec.startswith("run_id,backend,variant,baseline,n,quantity,ratio,lo,hi")
    curves = (tmp_path / "loss_curves.csv").read_text()
    assert ",pilot," in curves and ",diverged," in curves


def test_report_renders_in_order(race_dir, tmp_path):
    out = build_report([race_dir], tmp_path)
    for name in ("loss_curves.png", "time_to_target.png", "decomposition.png",
                 "loss_curves.csv", "time_to_target.csv", "decomposition.csv"):
        assert out[name].is_file(), name
    md = out["report.md"].read_text(encoding="utf-8")
    sec = md.split("## Training race: time to target loss")[1].split("\n## ")[0]
    order = [sec.index("haares reached 2.000 nats"), sec.index("| router"),
             sec.index("](loss_curves.png)"), sec.index("](time_to_target.png)"),
             sec.index("](decomposition.png)"), sec.index("Every run"), sec.index("| pilot "),
             sec.index("Runs: 12 measured and 1 pilot; 7 reached the target; 4 not converged")]
    assert order == sorted(order)
    assert "1 diverged (block_attnres seed 1)" in sec
    assert CPU_RACE_NOTE not in md and "Smoke test" not in md
    page = out["report.html"].read_text(encoding="utf-8")
    assert page.count("data:image/png;base64,") == 3


def test_smoke_race_is_labelled(tmp_path):
    plan = {("prenorm", 0): (50, 0.1), ("haares", 0): (40, 0.12)}
    write_race(tmp_path, plan, diverged=(), pilot=False)
    df = load_frame([tmp_path])
    assert training.smoke_runs(df) == ["race"]
    md = build_report([tmp_path])["report.md"].read_text(encoding="utf-8")
    assert "Smoke test (run race)" in md and CPU_RACE_NOTE in md
    assert f"in {4.8 / 5.0:.2f}× the time of prenorm (1 seed: no interval)" in md


def test_old_format_records_still_load(tmp_path):
    # Before the pilot: no train_time, step_budget or *_eval rows, time_to_target at an
    # evaluation. A not-converged run's bound is then its last evaluation's clock.
    with RunWriter(tmp_path, run_id="old", session="s", base={"device": "cpu"}) as w:
        for router, seed, reached in (("prenorm", 0, 2), ("prenorm", 1, 3), ("haares", 0, 3),
                                      ("haares", 1, None)):
            c = dict(case_key=f"train-{router}-s{seed}", router=router, impl="naive",
                     backend="eager", mode="train", seed=seed, **SHAPE)
            with w.unit([c["case_key"]], kind="train") as u:
                for step, loss in enumerate([3.0, 2.5, 1.9, 1.8]):
                    u.write(**c, repeat=step * 10, metric="val_loss", value=loss, unit="nats")
                    u.write(**c, repeat=step * 10, metric="elapsed", value=step * 1.5, unit="s")
                u.write(**c, metric="target_loss", value=2.0, unit="nats")
                if reached is None:
                    u.write(**c, metric="time_to_target", unit="s", status="not_converged")
                else:
                    u.write(**c, metric="time_to_target", value=reached * 1.5, unit="s")
                    u.write(**c, metric="steps_to_target", value=reached * 10, unit="steps")
                u.write(**c, metric="loss_at_token_budget", value=1.8, unit="nats")
    df = load_frame([tmp_path])
    runs = training.runs_table(df)
    assert runs["train_time"].isna().all() and len(runs) == 4
    h = row(race.comparison_table(df), variant="haares")
    assert h["n"] == 1 and h["time_ratio"] == pytest.approx(4.5 / 3.0)
    assert h["time_per_seed"] == f"1.50, > {4.5 / 4.5:.3g}"
    assert h["steps_per_seed"] == f"1.50, > {30 / 30:.3g}"
    assert "Runs: 4 measured" in build_report([tmp_path])["report.md"].read_text()


def test_no_training_rows(tmp_path):
    (tmp_path / RECORDS_FILE).write_text("")
    df = load_frame([tmp_path])
    assert training.runs_table(df).empty and race.comparison_table(df).empty
    assert race.sentences(df) == [] and training.smoke_runs(df) == []
    assert loss_curves(df, tmp_path) is None and time_to_target(df, tmp_path) is None
    out = build_report([tmp_path])
    md = out["report.md"].read_text(encoding="utf-8")
    assert "## Training race" not in md and NO_DATA["time_to_target"] not in md
    assert "No rows in these runs" in md and "## Cost" not in md
    assert set(out) == {"report.md", "report.html"}  # no header-only CSV


# --- fresh-user review: edge cases and report layout ------------------------------------------

WHY_SKIPPED = "cudagraph captures CUDA work: no CUDA device here"


def at_start_run(w: RunWriter, router: str, seed: int, dt: float = 0.1) -> None:
    """A run at the target from step 0 (a pilot target above this seed's starting loss)."""
    c = case(router, seed)
    with w.unit([c["case_key"]], kind="train") as u:
        for s in range(0, BUDGET + 1, EVERY):
            u.write(**c, repeat=s, metric="val_loss", value=TARGET - 0.01 * s, unit="nats")
            u.write(**c, repeat=s, metric="elapsed", value=s * dt, unit="s")
        for metric, value, unit in (("target_loss", TARGET, "nats"),
                                    ("step_budget", BUDGET, "steps"),
                                    ("train_time", BUDGET * dt, "s"),
                                    ("loss_at_token_budget", TARGET - 0.01 * BUDGET, "nats"),
                                    ("time_to_target", 0.0, "s"), ("steps_to_target", 0, "steps"),
                                    ("tokens_to_target", 0, "tokens")):
            u.write(**c, metric=metric, value=value, unit=unit)


def test_run_at_the_target_from_step_0_forms_no_ratio(tmp_path):
    plan = {k: v for k, v in PLAN.items() if k[0] in ("prenorm", "haares") and k != ("haares", 2)}
    write_race(tmp_path, plan, diverged=(), pilot=False)
    with RunWriter(tmp_path, run_id="race", session="s2", base={"device": "cpu"}) as w:
        at_start_run(w, "haares", 2)
    df = load_frame([tmp_path])
    h = row(race.comparison_table(df), variant="haares", baseline="prenorm")
    ratios = [time_of("haares", s) / time_of("prenorm", s) for s in (0, 1)]
    assert h["n"] == 2 and h["missing"] == 1 and h["censored"] == 0
    assert h["time_ratio"] == pytest.approx(gmean_ci(ratios)[0])
    assert h["time_per_seed"] == f"{ratios[0]:.2f}, {ratios[1]:.2f}, missing"
    assert h["dropped"] == f"seed 2: haares {training.AT_START}"
    assert h["loss_n"] == 3  # its loss at the budget is still a result
    assert row(training.runs_table(df), variant="haares", seed=2)["note"] == training.AT_START
    assert set(race.ratio_points(df)["seed"]) == {0, 1}
    md = build_report([tmp_path])["report.md"].read_text(encoding="utf-8")
    assert "seed 2: haares reached the target at step 0: the target is not below the starting " \
           "loss" in md


def test_loss_at_equal_wall_clock_counts_the_pairs(table):
    # T* = 5.55 s; block_attnres seed 0's clock ends at 5.4 s: that pair cannot be read at T*,
    # seed 1 diverged (no pair), seed 2 is the one pair left.
    h = row(table, variant="haares", baseline="block_attnres")
    assert h["wall_n"] == 1 and h["wall_short"] == 1
    t_star = (60 * 0.09 + 60 * 0.095) / 2
    diff = (4 - SLOW_K * t_star / 0.13) - (4 - 2 / 52 * t_star / 0.095)
    assert h["wall_diff"] == pytest.approx(diff)
    s = say.training_sentence(h)
    assert (f"; at equal wall-clock (5.55 s; 1 of 2 pairs, the other ended sooner) "
            f"{say.fmt_signed(diff)} nats (1 pair: no test).") in s
    assert row(race.comparison_display(table), router="haares",
               baseline="block_attnres")["pairs at T*"] == "1 of 2"
    full = row(table, variant="haares", baseline="prenorm")
    shown = row(race.comparison_display(table), router="haares", baseline="prenorm")
    assert shown["pairs at T*"] == "3"
    assert shown["seed ids"] == "0, 1, 2" and shown["pairs (n)"] == full["n"] == 2  # ids; the pairs counted
    two_short = say.training_sentence({**full, "wall_n": 2, "wall_short": 2})
    assert (f"at equal wall-clock (5.55 s; 2 of 4 pairs, the other 2 ended sooner) "
            f"{say.fmt_signed(full['wall_diff'])} nats [") in two_short
    assert f"(p = {full['wall_p']:.2g})." in two_short


def skipped_race(run_dir, backend="cudagraph", run_id="cg", seeds=(0,)) -> None:
    with RunWriter(run_dir, run_id=run_id, session="s", base={"device": "cpu"}) as w:
        for seed in seeds:
            for router in ("prenorm", "haares"):
                c = dict(case(router, seed), backend=backend)
                with w.unit([c["case_key"]], kind="train") as u:
                    u.write(**c, metric="target_loss", value=2.5, unit="nats")
                    u.write(**c, metric="time_to_target", unit="s", status="skipped",
                            error=WHY_SKIPPED)


def train_manifest(run_dir, run_id, **settings) -> None:
    m = {"run_id": run_id, "command": "train", "backend": "eager", "precision": "fp32",
         "grad_accum": 1, "eval_every": 7, "chunk": 10, "seeds": [0, 1, 2],
         "schedule": {"schedule": "interleaved", "reason": "auto: fits"},
         "target": {"source": "pilot", "router": "prenorm", "seed": 10000, "fraction": 0.5,
                    "step": 154}, **settings}
    (run_dir / "manifest.json").write_text(json.dumps(m))


def test_all_runs_skipped(tmp_path):
    skipped_race(tmp_path)
    train_manifest(tmp_path, "cg", backend="cudagraph", seeds=[0],
                   target={"source": "given", "value": 2.5})
    (tmp_path / "overhead.csv").write_text("run_id\n")  # stale, from an earlier report
    df = load_frame([tmp_path])
    table = race.comparison_table(df)
    h = row(table, variant="haares", baseline="prenorm")
    assert h["not_measured"] == WHY_SKIPPED and h["target_loss"] == 2.5
    assert race.sentences(df) == [f"haares vs prenorm: not measured ({WHY_SKIPPED})."]
    runs = training.runs_table(df)
    assert list(runs["target_loss"]) == [2.5, 2.5]
    assert say.runs_sentence(runs) == f"Runs: 2 measured, both skipped ({WHY_SKIPPED})."
    out = build_report([tmp_path])
    assert "overhead.csv" not in out and not (tmp_path / "overhead.csv").exists()
    md = out["report.md"].read_text(encoding="utf-8")
    assert "no seed reached" not in md and "nats on both sides" not in md
    assert "| 2.5000 " in md  # the target of the runs table
    assert ("Run cg: backend cudagraph, precision fp32, grad-accum 1, evaluation every 7 steps, "
            "schedule interleaved in turns of 10 steps (auto: fits), target 2.5 nats (given), "
            "seed 0.") in md


def test_runs_sentence_of_one_or_many_unmeasured_runs(tmp_path):
    skipped_race(tmp_path, seeds=(0, 1))
    runs = training.runs_table(load_frame([tmp_path]))
    assert say.runs_sentence(runs) == f"Runs: 4 measured, all 4 skipped ({WHY_SKIPPED})."
    assert say.runs_sentence(runs.iloc[:1]) == f"Runs: 1 measured, skipped ({WHY_SKIPPED})."
    md = build_report([tmp_path])["report.md"].read_text(encoding="utf-8")
    assert "Pooled over seeds" not in md and race.METHOD not in md  # nothing to pool


def test_protocol_line_and_run_labels(tmp_path):
    assert training.protocol_line("r1", {
        "backend": "eager", "precision": "fp32", "grad_accum": 1, "eval_every": 7, "chunk": 10,
        "schedule": {"schedule": "interleaved", "reason": "auto: fits"}, "seeds": [0, 1, 2],
        "target": {"source": "pilot", "router": "prenorm", "seed": 10000, "step": 154}}) == (
        "Run r1: backend eager, precision fp32, grad-accum 1, evaluation every 7 steps, schedule "
        "interleaved in turns of 10 steps (auto: fits), target from a prenorm pilot (seed 10000) "
        "at step 154, seeds 0, 1, 2.")
    assert training.protocol_line("old", {}) == "Run old: no protocol settings recorded."
    plan = {("prenorm", 0): (50, 0.1), ("haares", 0): (40, 0.12)}
    dirs = []
    for run_id, precision in (("fp", "fp32"), ("bf1", "bf16-mixed")):
        d = tmp_path / run_id
        with RunWriter(d, run_id=run_id, session="s", base={"device": "cpu"}) as w:
            for (router, seed), (steps, dt) in plan.items():
                measured_run(w, router, seed, steps, dt)
        train_manifest(d, run_id, precision=precision, seeds=[0])
        dirs.append(d)
    df = load_frame(dirs)
    manifests = frame.load_manifests(dirs)
    said = race.sentences(df, manifests=manifests)
    assert [s.split("]")[0] + "]" for s in said] == ["[run bf1, bf16-mixed]", "[run fp, fp32]"]
    assert said[0].startswith("[run bf1, bf16-mixed] haares reached 2.000 nats in 0.96×")
    one = load_frame(dirs[:1])
    assert training.sentence_prefixes(one, race.comparison_table(one), manifests) == [""]
    with RunWriter(tmp_path / "solo", run_id="solo", session="s", base={"device": "cpu"}) as w:
        measured_run(w, "prenorm", 0, 50, 0.1)  # a second run without a comparison of its own
    two = load_frame(dirs[:1] + [tmp_path / "solo"])
    assert training.sentence_prefixes(two, race.comparison_table(two)) == ["[run fp] "]
    md = build_report(dirs, tmp_path / "both")["report.md"].read_text(encoding="utf-8")
    sec = md.split("## Training race: time to target loss\n\n")[1]
    assert sec.startswith("Run bf1: backend eager, precision bf16-mixed, grad-accum 1")
    assert sec.index("Run fp: backend eager, precision fp32") < sec.index("Protocol (docs/MEASUREMENT")
    assert "[run fp, fp32] haares reached" in md


def test_train_only_report_layout(tmp_path):
    plan = {("prenorm", 0): (50, 0.0004), ("haares", 0): (40, 0.0003)}
    write_race(tmp_path, plan, diverged=(), pilot=False)
    (tmp_path / "overhead.csv").write_text("run_id\n")
    out = build_report([tmp_path])
    assert "overhead.csv" not in out and not (tmp_path / "overhead.csv").exists()
    md = out["report.md"].read_text(encoding="utf-8")
    heads = [line for line in md.splitlines() if line.startswith("## ")]
    assert heads == ["## Training race: time to target loss", "## Warnings", "## Skipped and failed cases",
                     "## Environment"]
    assert md.split("\n")[2] == heads[0]  # right after the title
    assert "routerbench run --paired" not in md and "Method: step times" not in md
    # seconds at three significant digits: 0.02, 0.012 s to target, clocks 0.024 and 0.018 s
    for cell in ("| 0.0200 ", "| 0.0120 ", "| 0.0240 ", "| 0.0180 "):
        assert cell in md, cell
    assert "at equal wall-clock (0.0180 s; 1 pair)" in md
    # one protocol paragraph, consistent with the CPU note
    assert md.count(race.METHOD) == 1 and CPU_RACE_NOTE in md
    assert "interpolated linearly" in CPU_RACE_NOTE and "cadence" not in CPU_RACE_NOTE


def test_seconds_keep_three_significant_digits():
    assert [say.fmt_sig(x) for x in (0.01234, 0.0, 6, 12.34, 99.96, 1234.4, -0.5)] == [
        "0.0123", "0.00", "6.00", "12.3", "100", "1234", "\u22120.500"]
    assert say.fmt_seconds(0.0123) == "0.0123 s" and say.fmt_seconds(float("nan")) == "–"
    shown, _ = display_frame(pd.DataFrame({"median_time_to_target": [0.0123],
                                           "min_s": [0.012], "max_s": [250.0]}))
    assert shown.iloc[0].tolist() == ["0.0123", "0.0120", "250"]


def test_failed_case_label(df):
    f = tables.failures(df)
    dead = f[f["case_key"] == "train|block_attnres|s1|train"]
    assert set(dead["case"]) == {"block_attnres, naive, eager, train, d=64 L=2 T=64 B=2, seed 1"}


def test_a_censored_time_ratio_is_said_in_words():
    """A bound of a seed whose run did not reach the target says what the number is: a ratio of
    times to target, above (the router never reached it) or below (the baseline never did)."""
    from reports.race import _bound_words
    assert _bound_words("> 1.53", "haares", "prenorm") == (
        " (its time-to-target ratio is above 1.53: haares trained 1.53× prenorm's time to target without "
        "reaching it)")
    assert _bound_words("< 0.8", "haares", "prenorm") == (
        " (its time-to-target ratio is below 0.8: haares reached the target in 0.8× the time prenorm trained "
        "without reaching it)")
    assert _bound_words("diverged", "haares", "prenorm") == ""
