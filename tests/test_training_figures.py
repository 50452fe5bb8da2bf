"""The training figures read right (reports/training_figures.py; issue 24, item 8): the per-seed
dots and the geometric mean of ``time_to_target`` on the comparison's own row, the loss legend
naming every router when every run diverged (runs made to diverge by the documented fault hook,
``ROUTERBENCH_FAULT=nan_loss:…``) and Warnings saying so, the loss panels titled by their axis,
and labels that name a router's impl once."""

from __future__ import annotations

import base64

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
import torch
from matplotlib.collections import PathCollection
from test_reports_training import write_race

from harness.rundir.faults import ENV
from harness.rundir.writer import RunWriter
from harness.training.config import TrainConfig
from harness.training.run import TrainRun
from harness.training.schedule import Trainer
from reports import build_report, load_frame, plotting, race, training
from reports.training_figures import loss_figure, time_to_target, time_to_target_figure
from workloads.config import DecoderConfig
from workloads.data import prepare_corpus_from_text, stdlib_text

TINY = DecoderConfig(d_model=32, n_layers=2, n_heads=2, seq_len=32, batch_size=8)
TC = TrainConfig(TINY, target_loss=3.7, max_steps=9, eval_every=3, untimed_warmup=1, warmup_steps=2, lr=1e-2)
ROUTERS = ("prenorm", "haares")
SEEDS = (0, 1)


@pytest.fixture(scope="module")
def diverged_dir(tmp_path_factory):
    """A real tiny race (2 routers x 2 seeds, CPU eager) where every run diverges: the fault
    hook makes every training run's loss non-finite after its first evaluation."""
    corpus = prepare_corpus_from_text(stdlib_text(200_000), tmp_path_factory.mktemp("corpus") / "c")
    d = tmp_path_factory.mktemp("diverged") / "run"
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with pytest.MonkeyPatch.context() as mp, RunWriter(d, "alldiv", "s", base={"device": "cpu"}) as w:
            mp.setenv(ENV, "nan_loss:train|*")
            for seed in SEEDS:
                Trainer(w, d, torch.device("cpu"), quiet=True).run_group(
                    [TrainRun(r, {}, corpus, TC, seed, torch.device("cpu")) for r in ROUTERS],
                    "sequential", 2)
    finally:
        torch.set_num_threads(threads)
    return d


@pytest.fixture(scope="module")
def race_frame(tmp_path_factory):
    """The synthetic race of tests/test_reports_training.py (block_attnres seed 1 diverged)."""
    d = tmp_path_factory.mktemp("results") / "race"
    write_race(d)
    return load_frame([d])


def _legend_texts(fig) -> list[str]:
    return [t.get_text() for ax in fig.axes if ax.get_legend() for t in ax.get_legend().get_texts()]


def test_every_run_diverged_legend_names_each_router(diverged_dir):
    df = load_frame([diverged_dir])
    runs = training.run_frame(df)
    assert len(runs) == 4 and set(runs["status"]) == {"diverged"}  # the hook did its work
    fig, data = loss_figure(df)
    texts = _legend_texts(fig)
    plt.close(fig)
    assert "prenorm: diverged (2 runs, until divergence)" in texts
    assert "haares: diverged (2 runs, until divergence)" in texts
    assert set(data["status"]) == {"diverged"}


def test_every_run_diverged_is_a_warning(diverged_dir, tmp_path):
    md = build_report([diverged_dir], tmp_path)["report.md"].read_text(encoding="utf-8")
    warnings = md.split("## Warnings\n")[1].split("\n## ")[0]
    line = next(x for x in warnings.splitlines() if x.startswith("Diverged:"))
    assert line.startswith("Diverged: every training run diverged (prenorm seed 0, prenorm seed 1, "
                           "haares seed 0, haares seed 1): non-finite loss (nan) at step ")
    assert "no comparison reads it" in line


def test_some_runs_diverged_warning_names_them(race_frame):
    assert race.diverged_warnings(race_frame) == [
        "Diverged: 1 of 13 training runs diverged (block_attnres seed 1): non-finite loss at step 30. "
        "A diverged run has no time to target and none of its losses is a result, so no comparison "
        "reads it (a lower --lr or more --warmup-steps may help)."]


def test_loss_panels_are_titled_by_their_axis(race_frame):
    fig, _ = loss_figure(race_frame)
    titles = [ax.get_title() for ax in fig.axes if ax.get_xlabel()]
    xlabels = [ax.get_xlabel() for ax in fig.axes if ax.get_xlabel()]
    suptitle = fig._suptitle.get_text()
    plt.close(fig)
    assert titles == ["validation loss vs tokens seen", "validation loss vs training clock"]
    assert xlabels == ["tokens seen (tokens)", "training clock (s, evaluation excluded)"]
    assert "(run race, backend eager)" in suptitle  # the one run and backend, said once


def _ttt_positions(fig):
    """(y of every per-seed marker, y of every mean diamond, tick label by row) read back from
    the drawn Axes."""
    ax = fig.axes[0]
    dots = np.concatenate([c.get_offsets()[:, 1] for c in ax.collections
                           if isinstance(c, PathCollection)])
    means = [float(line.get_ydata()[0]) for line in ax.lines if line.get_marker() == "D"]
    rows = {round(t): lbl.get_text() for t, lbl in zip(ax.get_yticks(), ax.get_yticklabels())}
    return dots, means, rows, ax.get_ylim()


def test_time_to_target_dots_sit_on_their_mean_row(race_frame, tmp_path):
    fig, data = time_to_target_figure(race_frame)
    dots, means, rows, ylim = _ttt_positions(fig)
    plt.close(fig)
    assert rows == {0: "block_attnres vs prenorm (eager)", 1: "haares vs prenorm (eager)",
                    2: "haares vs block_attnres (eager)"}
    assert means == [0.0, 1.0, 2.0] and ylim == (2.5, -0.5)  # one row each, the first on top
    # block_attnres vs prenorm: 2 pairs (seed 1 diverged); haares vs prenorm: 2 pairs and a bound
    # (seed 2); vs block_attnres: 1 pair and a bound: every marker on its comparison's row
    assert sorted(dots.tolist()) == [0.0, 0.0, 1.0, 1.0, 1.0, 2.0, 2.0]
    assert sorted(data.loc[data["kind"] != "gmean", "y"]) == sorted(dots.tolist())
    csv = pd.read_csv(time_to_target(race_frame, tmp_path).with_suffix(".csv"))
    for (variant, baseline), g in csv.groupby(["variant", "baseline"]):
        mean_y = g.loc[g["kind"] == "gmean", "y"]
        assert len(mean_y) == 1 and (g["y"] == mean_y.iloc[0]).all(), (variant, baseline)
    assert csv.groupby("kind").size().to_dict() == {"=": 5, ">": 2, "gmean": 3}


# --- a router trained with an explicit impl: named once --------------------------------------

SHAPE = dict(workload="decoder", d_model=64, n_layers=2, n_heads=4, seq_len=64, batch_size=2,
             dtype="float32")


def _run(w, router, impl, options, seed, steps, dt=0.1, budget=60):
    c = dict(case_key=f"train|{router}|{impl}|s{seed}", router=router, router_options=options,
             impl=impl, backend="eager", mode="train", seed=seed, **SHAPE)
    k = 2 / steps
    with w.unit([c["case_key"]], kind="train") as u:
        for s in range(0, budget + 1, 10):
            u.write(**c, repeat=s, metric="val_loss", value=4 - k * s, unit="nats")
            u.write(**c, repeat=s, metric="elapsed", value=s * dt, unit="s")
            u.write(**c, repeat=s, metric="tokens", value=s * 128, unit="tokens")
        for metric, value, unit in (("target_loss", 2.0, "nats"), ("step_budget", budget, "steps"),
                                    ("train_time", budget * dt, "s"),
                                    ("loss_at_token_budget", 4 - k * budget, "nats"),
                                    ("time_to_target", steps * dt, "s"),
                                    ("steps_to_target", steps, "steps")):
            u.write(**c, metric=metric, value=value, unit=unit)


@pytest.fixture(scope="module")
def impl_frame(tmp_path_factory):
    """prenorm, haares trained as two_phase (its options naming the impl, as the race of
    ``routerbench run`` does) and haares naive, 2 seeds each."""
    d = tmp_path_factory.mktemp("impls") / "race"
    with RunWriter(d, run_id="impl", session="s", base={"device": "cpu"}) as w:
        for seed in SEEDS:
            _run(w, "prenorm", "naive", {}, seed, 50)
            _run(w, "haares", "two_phase", {"impl": "two_phase", "n_blocks": 2}, seed, 40 + seed)
            _run(w, "haares", "naive", {}, seed, 45)
    return load_frame([d])


def test_labels_name_router_impl_and_options_once(impl_frame):
    assert set(impl_frame["variant"]) == {"prenorm", "haares [naive]", "haares [two_phase] (n_blocks=2)"}
    names = plotting.variant_labels(impl_frame)
    assert names == {"prenorm": "prenorm", "haares [naive]": "haares [naive]",
                     "haares [two_phase] (n_blocks=2)": "haares [two_phase] (n_blocks=2)"}
    assert sorted(set(plotting.family(impl_frame))) == ["haares", "haares (n_blocks=2)", "prenorm"]
    fig, _ = loss_figure(impl_frame)
    texts = _legend_texts(fig)
    plt.close(fig)
    assert "haares [two_phase] (n_blocks=2) (2 seeds)" in texts and "haares [naive] (2 seeds)" in texts
    fig, _ = time_to_target_figure(impl_frame)
    _, means, rows, _ = _ttt_positions(fig)
    plt.close(fig)
    assert sorted(rows.values()) == ["haares [naive] vs prenorm (eager)",
                                     "haares [two_phase] (n_blocks=2) vs prenorm (eager)"]
    shown = race.comparison_display(race.comparison_table(impl_frame), names)
    assert sorted(shown["router"]) == ["haares [naive]", "haares [two_phase] (n_blocks=2)"]
    assert all(text.count("two_phase") <= 1 for text in [*texts, *rows.values(), *shown["router"]])


def test_report_shows_labels_once(tmp_path):
    d = tmp_path / "race"
    with RunWriter(d, run_id="impl", session="s", base={"device": "cpu"}) as w:
        _run(w, "prenorm", "naive", {}, 0, 50)
        _run(w, "haares", "two_phase", {"impl": "two_phase"}, 0, 40)
        _run(w, "haares", "naive", {}, 0, 45)
    out = build_report([d], tmp_path / "out")
    md = out["report.md"].read_text(encoding="utf-8")
    assert "(impl=" not in md and "haares [two_phase]" in md  # sentences, tables, captions
    table = md[md.index("| router "):].split("\n\n")[0].splitlines()  # the comparison table
    assert [line.split("|")[1:3] for line in table[2:]] == [
        [" haares [naive]     ", " prenorm    "], [" haares [two_phase] ", " prenorm    "]]
    page = out["report.html"].read_text(encoding="utf-8")
    assert base64.b64encode(out["time_to_target.png"].read_bytes()).decode() in page
