"""Time to target: pairing by seed, schedules, resume, divergence, pilot (harness/training/run.py,
harness/training/schedule.py, ``routerbench train``). CPU eager at a tiny shape, fixed thread count."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
from click.testing import CliRunner

from harness.cli import main
from harness.rundir.records import load_rows, units
from harness.rundir.writer import RunWriter
from harness.training.config import TrainConfig, default_eval_every
from harness.training.run import TrainRun
from harness.training.schedule import Trainer, choose_schedule, parameter_count
from workloads.config import DecoderConfig
from workloads.data import prepare_corpus_from_text, stdlib_text
from workloads.decoder import Decoder

ROOT = Path(__file__).resolve().parents[1]
TINY = DecoderConfig(d_model=32, n_layers=2, n_heads=2, seq_len=32, batch_size=8)
TC = TrainConfig(TINY, target_loss=3.7, max_steps=12, eval_every=3, untimed_warmup=1, warmup_steps=2, lr=1e-2)
SHAPE_ARGS = ["--d-model", "32", "--n-layers", "2", "--n-heads", "2", "--seq-len", "32", "--batch-size", "8",
              "--max-steps", "12", "--eval-every", "3", "--seeds", "1", "--lr", "0.01", "--no-report", "--quiet"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return prepare_corpus_from_text(stdlib_text(300_000), tmp_path_factory.mktemp("corpus") / "c")


@pytest.fixture(autouse=True)
def fixed_threads():
    n = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(n)


def curves(run_dir: Path) -> dict:
    """(router, seed, metric, step) -> value of the evaluation rows."""
    rows = load_rows([run_dir])
    return {(r["router"], r["seed"], r["metric"], r["repeat"]): r["value"] for r in rows
            if r["metric"] in ("val_loss", "train_loss")}


def train(run_dir: Path, routers, schedule="sequential", chunk=2, tc=TC, seed=0, corpus=None) -> Path:
    with RunWriter(run_dir, "r", "s") as w:
        Trainer(w, run_dir, torch.device("cpu"), quiet=True).run_group(
            [TrainRun(r, {}, corpus, tc, seed, torch.device("cpu")) for r in routers], schedule, chunk)
    return run_dir


def test_a_seed_gives_every_router_the_same_shared_weights_and_data():
    torch.manual_seed(0)
    a = Decoder(TINY, "prenorm", init_seed=3).state_dict()
    torch.manual_seed(0)
    b = Decoder(TINY, "haares", init_seed=3).state_dict()
    shared = [k for k in a if not k.startswith("router.")]
    assert len(shared) > 10 and all(torch.equal(a[k], b[k]) for k in shared)
    c = Decoder(TINY, "prenorm", init_seed=4).state_dict()
    assert not torch.equal(a["embed.weight"], c["embed.weight"])


def test_interleaved_and_sequential_give_bitwise_equal_curves(tmp_path, corpus):
    seq = curves(train(tmp_path / "seq", ["prenorm", "haares"], "sequential", corpus=corpus))
    inter = curves(train(tmp_path / "int", ["prenorm", "haares"], "interleaved", chunk=2, corpus=corpus))
    assert len(seq) == 2 * (5 + 4) and seq == inter  # 5 evaluations (0,3,6,9,12), 4 train losses
    # Paired by seed: the two routers start from the same loss only where their outputs agree at
    # init; what must differ is the curve after training begins.
    assert seq[("prenorm", 0, "val_loss", 12)] != seq[("haares", 0, "val_loss", 12)]


def test_records_of_a_run_interpolate_the_clock_and_keep_the_raw_evaluation(tmp_path, corpus):
    d = train(tmp_path / "r", ["prenorm"], corpus=corpus)
    df = pd.DataFrame(load_rows([d]))
    val = df[df.metric == "val_loss"].set_index("repeat").value
    clock = df[df.metric == "elapsed"].set_index("repeat").value
    one = lambda m: df[df.metric == m].value.iloc[0]  # noqa: E731
    s_eval = one("steps_to_target_eval")
    prev = s_eval - 3
    assert val[s_eval] <= TC.target_loss < val[prev]
    f = (val[prev] - TC.target_loss) / (val[prev] - val[s_eval])
    assert one("steps_to_target") == pytest.approx(prev + 3 * f)
    assert one("time_to_target") == pytest.approx(clock[prev] + f * (clock[s_eval] - clock[prev]))
    assert one("time_to_target_eval") == clock[s_eval] and one("train_time") == clock[12]
    assert one("loss_at_token_budget") == val[12] and one("token_budget") == 12 * 8 * 32
    assert clock.is_monotonic_increasing and clock[0] == 0
    # One segment unit per evaluation before the last, then the run's own unit; only its final weights left.
    kinds = [u["kind"] for u in units(d)]
    assert kinds == ["train_segment"] * 4 + ["train"]
    assert {f.name[:11] for f in (d / "checkpoints").rglob("*.pt")} == {"final-step-"}  # weights only


def test_a_forced_non_finite_loss_is_a_diverged_row_while_the_other_run_finishes(tmp_path, corpus, monkeypatch):
    monkeypatch.setenv("ROUTERBENCH_FAULT", "nan_loss:train|haares|*")
    d = train(tmp_path / "r", ["prenorm", "haares"], "interleaved", corpus=corpus)
    df = pd.DataFrame(load_rows([d]))
    h, p = df[df.router == "haares"], df[df.router == "prenorm"]
    div = h[h.metric == "diverged"].iloc[0]
    assert div.status == "diverged" and div["repeat"] == 6 and "non-finite" in div.error  # after eval 1
    assert set(h[h.metric.isin(["time_to_target", "loss_at_token_budget"])].status) == {"diverged"}
    assert h[h.metric == "loss_at_token_budget"].value.isna().all()
    assert p[p.metric == "loss_at_token_budget"].status.iloc[0] == "ok"
    assert p[p.metric == "val_loss"].repeat.max() == 12
    assert {u["statuses"].get(k) for u in units(d) for k in u["cases"]} == {"ok", "diverged"}


def test_a_loss_worse_than_uniform_is_divergence(tmp_path, corpus):
    tc = TrainConfig(TINY, target_loss=3.3, max_steps=6, eval_every=3, untimed_warmup=1, divergence_margin=-1.0)
    d = train(tmp_path / "r", ["prenorm"], tc=tc, corpus=corpus)
    div = [r for r in load_rows([d]) if r["metric"] == "diverged"][0]
    # At init the loss is ln(vocab), above ln(vocab) - 1: diverged at step 0, with its loss.
    assert div["repeat"] == 0 and div["value"] == pytest.approx(math.log(corpus.vocab_size), abs=0.1)
    assert "a uniform prediction" in div["error"]


def test_cudagraph_training_is_a_skipped_row_on_cpu(tmp_path, corpus):
    tc = TrainConfig(TINY, target_loss=3.3, max_steps=3, backend="cudagraph")
    rows = load_rows([train(tmp_path / "r", ["prenorm"], tc=tc, corpus=corpus)])
    assert [(r["metric"], r["status"], r["backend"]) for r in rows] == [
        ("target_loss", "ok", "cudagraph"), ("time_to_target", "skipped", "cudagraph")]
    assert "no CUDA device" in rows[1]["error"]


def test_gradient_accumulation_changes_memory_not_the_step(tmp_path, corpus):
    tc2 = TrainConfig(TINY, target_loss=3.3, max_steps=6, eval_every=3, untimed_warmup=1, grad_accum=2)
    tc1 = TrainConfig(TINY, target_loss=3.3, max_steps=6, eval_every=3, untimed_warmup=1)
    a = curves(train(tmp_path / "a", ["prenorm"], tc=tc1, corpus=corpus))
    b = curves(train(tmp_path / "b", ["prenorm"], tc=tc2, corpus=corpus))
    assert a.keys() == b.keys() and all(b[k] == pytest.approx(a[k], rel=1e-4) for k in a)


def test_the_memory_estimate_counts_parameters_exactly_and_picks_a_schedule(corpus):
    for r in ("prenorm", "haares", "block_attnres", "rezero"):
        run = TrainRun(r, {}, corpus, TC, 0, torch.device("cpu"))
        assert parameter_count(run) == sum(p.numel() for p in Decoder(run.cfg, r).parameters())
    runs = [TrainRun(r, {}, corpus, TC, 0, torch.device("cpu")) for r in ("prenorm", "haares")]
    auto = choose_schedule("auto", runs, torch.device("cpu"))
    assert auto["schedule"] == "interleaved" and auto["group_bytes"] < auto["available_bytes"] / 2
    assert choose_schedule("sequential", runs, torch.device("cpu"))["schedule"] == "sequential"


def test_default_evaluation_cadence_is_at_most_2_5_percent_of_the_budget():
    for steps in (1, 40, 300, 1000, 12345):
        e = default_eval_every(steps)
        assert 1 <= e and (e <= 0.025 * steps or e == 1)
    assert TrainConfig(TINY, max_steps=300).eval_steps()[:3] == [0, 7, 14]
    assert TrainConfig(TINY, max_steps=300).pilot_stop(0.5) == 154


def _cli(tmp_path: Path, run_id: str, extra: list[str], fault: str | None = None, data: Path | None = None):
    env = {k: v for k, v in os.environ.items() if k != "ROUTERBENCH_FAULT"}
    if fault:
        env["ROUTERBENCH_FAULT"] = fault
    args = [sys.executable, "-m", "harness.cli", "train", "--data", str(data), "--out", str(tmp_path),
            "--run-id", run_id, "--device", "cpu", *SHAPE_ARGS, *extra]
    return subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def _run_dir(tmp_path: Path, run_id: str) -> Path:
    return next(tmp_path.glob(f"*/{run_id}"))


@pytest.mark.parametrize("backend,rel", [("eager", 0.0), ("compile", 1e-6)])
def test_a_killed_run_resumes_to_the_losses_of_an_uninterrupted_one(tmp_path, corpus, backend, rel):
    routers = "prenorm,haares" if backend == "eager" else "prenorm"
    extra = ["--routers", routers, "--target-loss", "3.7", "--schedule", "interleaved", "--chunk", "2",
             "--backend", backend]
    data = Path(corpus.path)
    killed = _cli(tmp_path, "k", extra, "kill_after_eval=2:train|prenorm|*", data)
    assert killed.returncode == -9, killed.stderr[-2000:]
    d = _run_dir(tmp_path, "k")
    assert list((d / "checkpoints").rglob("step-00000006.pt"))  # the checkpoint of evaluation 2
    status = CliRunner().invoke(main, ["status", str(d)]).output
    assert "training:  train prenorm seed 0 at step 6: resumes from its checkpoint" in status
    assert "resume:    " in status and "train --config" in status and "--run-id k" in status
    resumed = _cli(tmp_path, "k", extra, None, data)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "prenorm seed 0: resumed at step 6" in resumed.stdout + resumed.stderr
    whole = _cli(tmp_path, "w", extra, None, data)
    assert whole.returncode == 0, whole.stderr[-2000:]
    a, b = curves(d), curves(_run_dir(tmp_path, "w"))
    assert a.keys() == b.keys() and len(a) == 9 * len(routers.split(","))
    if rel == 0:
        assert a == b
    else:
        assert all(a[k] == pytest.approx(b[k], rel=rel) for k in a)
    rows = load_rows([d])
    keys = [(r["case_key"], r["metric"], r["repeat"]) for r in rows]
    assert len(keys) == len(set(keys))  # nothing doubled
    clock = [r["value"] for r in rows if r["metric"] == "elapsed" and r["router"] == "prenorm"]
    assert clock == sorted(clock)  # the clock went on from the checkpoint
    assert {f.name[:11] for f in (d / "checkpoints").rglob("*.pt")} == {"final-step-"}  # weights only
    setup = {r["metric"] for r in rows if r["metric"] in ("compile_time", "warmup_time") and r["value"] > 0}
    assert setup == {"compile_time" if backend == "compile" else "warmup_time"}


def test_cudagraph_without_cuda_skips_every_run_and_the_pilot(tmp_path, corpus):
    res = CliRunner().invoke(main, ["train", "--data", str(corpus.path), "--out", str(tmp_path), "--run-id", "g",
                                    "--device", "cpu", "--routers", "prenorm,haares", "--backend", "cudagraph",
                                    *SHAPE_ARGS])
    assert res.exit_code == 0, res.output
    rows = load_rows([_run_dir(tmp_path, "g")])
    verdicts = [(r["mode"], r["router"], r["status"]) for r in rows if r["metric"] == "time_to_target"]
    assert verdicts == [("pilot", "prenorm", "skipped"), ("train", "prenorm", "skipped"),
                        ("train", "haares", "skipped")]
    assert all("no CUDA device" in r["error"] for r in rows if r["status"] == "skipped")


def test_the_pilot_sets_the_target_and_a_rerun_reads_it_back(tmp_path, corpus):
    base = ["train", "--data", str(corpus.path), "--out", str(tmp_path), "--run-id", "p", "--device", "cpu",
            "--routers", "prenorm,haares", *SHAPE_ARGS]
    res = CliRunner().invoke(main, base)
    assert res.exit_code == 0, res.output
    d = _run_dir(tmp_path, "p")
    df = pd.DataFrame(load_rows([d]))
    pilot = df[df["mode"] == "pilot"]
    assert set(pilot.seed) == {10000} and set(pilot.router) == {"prenorm"}
    step = pilot[pilot.metric == "target_step"].value.iloc[0]
    assert step == 6  # the first evaluation at or after half of 12 steps
    target = pilot[pilot.metric == "target_loss"].value.iloc[0]
    assert target == pilot[(pilot.metric == "val_loss") & (pilot.repeat == 6)].value.iloc[0]
    assert pilot[pilot.metric == "val_loss"].repeat.max() == 6  # the pilot stops there
    measured = df[(df["mode"] == "train") & (df.metric == "target_loss")]
    assert len(measured) == 2 and (measured.value == target).all()
    manifest = json.loads((d / "manifest.json").read_text())
    assert manifest["target"] == {"source": "pilot", "router": "prenorm", "seed": 10000, "fraction": 0.5,
                                  "step": 6}
    again = CliRunner().invoke(main, base)
    assert again.exit_code == 0 and f"target: {target:.4f}" in again.output and "already done" in again.output


def test_rows_staged_after_the_last_committed_checkpoint_go_to_aborted(tmp_path, corpus):
    """Killed after evaluation 2's checkpoint was written and its rows staged, before the commit:
    the resumed run goes back to evaluation 1's checkpoint, the staged rows go to aborted/, and
    the curves equal an uninterrupted run's."""
    extra = ["--routers", "prenorm", "--target-loss", "3.7"]
    data = Path(corpus.path)
    assert _cli(tmp_path, "k", extra, "kill_in_eval=2:train|prenorm|*", data).returncode == -9
    d = _run_dir(tmp_path, "k")
    assert sorted(p.name for p in (d / "checkpoints").rglob("*.pt")) == ["step-00000003.pt", "step-00000006.pt"]
    resumed = _cli(tmp_path, "k", extra, None, data)
    assert resumed.returncode == 0 and "resumed at step 3" in resumed.stdout + resumed.stderr
    aborted = [json.loads(line) for f in (d / "aborted").glob("*.jsonl") if f.name != "index.jsonl"
               for line in f.read_text().splitlines()]
    assert sorted(r["metric"] for r in aborted if r["repeat"] == 6) == ["elapsed", "tokens", "train_loss", "val_loss"]
    assert _cli(tmp_path, "w", extra, None, data).returncode == 0
    assert curves(d) == curves(_run_dir(tmp_path, "w"))


def test_a_frequent_evaluation_cadence_states_its_cost(tmp_path, corpus):
    """--eval-every 3 (< 5 steps): train says how many evaluations and checkpoints each run makes."""
    out = _cli(tmp_path, "often", ["--routers", "prenorm", "--target-loss", "3.9"], data=Path(corpus.path))
    assert out.returncode == 0, out.stderr
    note = [ln for ln in out.stdout.splitlines() if ln.startswith("note: evaluating and checkpointing")]
    assert len(note) == 1 and "every 3 steps: 4 evaluations and checkpoints" in note[0], out.stdout
    from harness.cli.train import _n_params
    from workloads.config import DecoderConfig
    cfg = DecoderConfig(d_model=32, n_layers=2, n_heads=2, seq_len=32, batch_size=8)
    assert _n_params(cfg) == sum(p.numel() for p in __import__("workloads.decoder", fromlist=["Decoder"])
                                 .Decoder(cfg).parameters())


def test_a_captured_steps_autocast_keeps_no_cache():
    """A graphed bf16-mixed step must not read autocast's cached weight copies, freed when its
    context exits after the capture: the captured step's autocast runs with its cache off."""
    import torch

    from harness.training.run import _autocast
    with _autocast(torch.device("cpu"), "bf16-mixed"):
        assert torch.is_autocast_cache_enabled()
    with _autocast(torch.device("cpu"), "bf16-mixed", cache=False):
        assert torch.is_autocast_cpu_enabled() and not torch.is_autocast_cache_enabled()
    assert torch.is_autocast_cache_enabled()  # restored


def test_a_sequential_race_under_a_planted_load_change_is_flagged(tmp_path, corpus, monkeypatch):
    """prenorm trains under a planted load (CPU pressure 0.70 over its steps), haares after the
    load dropped (0.00): every sentence quoting their time ratio says so, with the readings; the
    same race with one load on both sides is not flagged."""
    from reports import race
    monkeypatch.setenv("ROUTERBENCH_FAULT", "busy=70:train|prenorm|*;busy=0:train|haares|*")
    d = train(tmp_path / "changed", ["prenorm", "haares"], "sequential", corpus=corpus)
    df = pd.DataFrame(load_rows([d]))
    loads = df[df.metric == "train_cpu_pressure"].set_index("router").value
    assert loads.to_dict() == {"prenorm": pytest.approx(0.70), "haares": pytest.approx(0.0)}
    from reports.frame import load_frame
    said = race.sentences(load_frame([d]))
    assert len(said) == 1 and "(under different load, seed 0: CPU pressure haares 0.00, prenorm 0.70 over " \
                                "their own steps: the time ratios measure the load too" in said[0], said
    monkeypatch.setenv("ROUTERBENCH_FAULT", "busy=70:train|*")
    same = race.sentences(load_frame([train(tmp_path / "same", ["prenorm", "haares"], "sequential",
                                            corpus=corpus)]))
    assert len(same) == 1 and "different load" not in same[0]


@pytest.mark.skipif(not Path("/proc/pressure/cpu").exists(), reason="no /proc/pressure/cpu (Linux PSI) here")
def test_a_run_records_the_cpu_pressure_over_its_own_steps(tmp_path, corpus, monkeypatch):
    monkeypatch.delenv("ROUTERBENCH_FAULT", raising=False)
    df = pd.DataFrame(load_rows([train(tmp_path / "r", ["prenorm"], corpus=corpus)]))
    got = df[df.metric == "train_cpu_pressure"]
    assert len(got) == 1 and got.unit.iloc[0] == "ratio" and 0.0 <= got.value.iloc[0] <= 1.0


def test_without_a_terminal_a_run_prints_its_progress_at_most_every_interval(tmp_path, corpus, monkeypatch,
                                                                                capsys):
    """No bar where stderr is a log: a line of step, loss and clock at most every
    PROGRESS_EVERY_S seconds (0 here: at each evaluation before the last; a huge one: none)."""
    from harness.training import schedule
    monkeypatch.setattr(schedule, "PROGRESS_EVERY_S", 0.0)
    with RunWriter(tmp_path / "r", "r", "s") as w:
        Trainer(w, tmp_path / "r", torch.device("cpu"), label="smoke race").run_group(
            [TrainRun("prenorm", {}, corpus, TC, 0, torch.device("cpu"))])
    said = capsys.readouterr().out.splitlines()
    steps = [line for line in said if "val loss" in line and "nats," in line]
    assert [s.split(",")[0] for s in steps] == [f"smoke race: prenorm seed 0 step {k} of 12" for k in (0, 3, 6, 9)]
    assert all(s.endswith(" s on its clock") for s in steps)
    with RunWriter(tmp_path / "i", "r", "s") as w:  # an interleaved group: one line names every run
        Trainer(w, tmp_path / "i", torch.device("cpu"), label="smoke race").run_group(
            [TrainRun(r, {}, corpus, TC, 0, torch.device("cpu")) for r in ("prenorm", "haares")],
            "interleaved", 3)
    both = [line for line in capsys.readouterr().out.splitlines() if "; haares seed 0 step" in line]
    assert both and all(line.startswith("smoke race: prenorm seed 0 step ") for line in both)
    monkeypatch.setattr(schedule, "PROGRESS_EVERY_S", 1e9)
    with RunWriter(tmp_path / "q", "r", "s") as w:
        Trainer(w, tmp_path / "q", torch.device("cpu")).run_group(
            [TrainRun("prenorm", {}, corpus, TC, 0, torch.device("cpu"))])
    assert not [line for line in capsys.readouterr().out.splitlines() if "of 12" in line]


def test_a_race_on_a_busy_cpu_trains_on_the_cores_other_work_left():
    """Read at the start: a load average of 1.9 on 2 CPUs leaves 1 core; a quiet machine, a GPU, a
    load that leaves every thread a core, or no load reading keep the threads."""
    from harness.cli.train import race_threads
    busy = {"busy": ["the load average is 1.9 on 2 CPUs (busy above 1)"], "load_avg": 1.9, "cpus": 2,
            "pressure": 0.02}
    assert race_threads(busy, "cpu", 2) == 1
    assert race_threads({**busy, "load_avg": 3.7}, "cpu", 2) == 1  # never below one
    assert race_threads({**busy, "load_avg": 1.2, "cpus": 8}, "cpu", 8) == 7
    assert race_threads({**busy, "load_avg": 0.4}, "cpu", 2) is None  # busy by pressure, cores free
    assert race_threads({**busy, "busy": []}, "cpu", 2) is None
    assert race_threads(busy, "cuda", 2) is None and race_threads(None, "cpu", 2) is None
    assert race_threads({**busy, "load_avg": None}, "cpu", 2) is None
