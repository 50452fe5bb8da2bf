"""The depth study as units (harness/training/units.py, harness/cli/study_units.py, `status` on a
study root): a tiny study (2 routers × 2 depths × 2 seeds, 1 thread each) run in one process and
by the local launcher with 2 workers gives bitwise the same rows on everything but time; a unit
killed after an evaluation is named by `status`, and the command it prints finishes it with no
row doubled and the losses of an uninterrupted run. Bad input is one line, exit 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from harness.cli import main
from harness.rundir.records import load_rows, lock_holder
from harness.training.units import (ATTEMPT_MARK, UNIT_LOG, read_index, study_units, torch_threads,
                                    unit_state)
from workloads.data import prepare_corpus_from_text, stdlib_text

ROOT = Path(__file__).resolve().parents[1]
ARGS = ["study", "depth", "--scale", "tiny", "--routers", "block_attnres,haares", "--depths", "2,4",
        "--blocks", "2", "--max-steps", "10", "--eval-every", "5", "--estimate-steps", "1",
        "--seed-list", "0,1", "--device", "cpu", "--quiet", "--threads", "1"]
#: Row columns that name a process or a session, not a result.
SESSION_COLUMNS = ("run_id", "session", "resume_unit")
#: The haares run at depth 4, seed 1 (unit 3).
UNIT3_HAARES = "study|haares|*n_layers=4,*|1|*"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return prepare_corpus_from_text(stdlib_text(300_000), tmp_path_factory.mktemp("corpus") / "c")


def _cli(*args: str, fault: str | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("ROUTERBENCH_FAULT", "OMP_NUM_THREADS")}
    if fault:
        env["ROUTERBENCH_FAULT"] = fault
    return subprocess.run([sys.executable, "-m", "harness.cli", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)


def _results(dirs) -> list[tuple]:
    """Every row but its time metrics (unit ``s``) and session columns, sorted: what must be
    bitwise equal however the units ran."""
    rows = [tuple((k, v) for k, v in sorted(r.items()) if k not in SESSION_COLUMNS)
            for r in load_rows(dirs) if r.get("unit") != "s"]
    return sorted(rows, key=repr)


def _losses(dirs) -> dict:
    return {(r["router"], r["n_layers"], r["seed"]): r["value"] for r in load_rows(dirs)
            if r["metric"] == "loss_at_token_budget" and r["status"] == "ok"}


@pytest.fixture(scope="module")
def sequential(tmp_path_factory, corpus):
    """The tiny study in one process (no report): its run directory."""
    out = tmp_path_factory.mktemp("seq")
    res = _cli(*ARGS, "--data", str(corpus.path), "--out", str(out), "--run-id", "seq", "--no-report")
    assert res.returncode == 0, res.stderr[-3000:]
    return next(out.glob("*/seq"))


@pytest.fixture(scope="module")
def launched(tmp_path_factory, corpus):
    """The same study by `--launcher local --workers 2`: (study root, its output)."""
    root = tmp_path_factory.mktemp("units")
    res = _cli(*ARGS, "--data", str(corpus.path), "--out", str(root), "--run-id", "S", "--launcher", "local",
               "--workers", "2")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return root, res.stdout


def test_units_of_the_launcher_equal_the_one_process_study_bitwise_but_for_time(sequential, launched):
    root, output = launched
    dirs = sorted(root.glob("*/S-L*-s*"))
    assert [d.name for d in dirs] == ["S-L2-s0", "S-L2-s1", "S-L4-s0", "S-L4-s1"]
    mine, theirs = _results(dirs), _results([sequential])
    assert len(mine) == len(theirs) > 0
    assert mine == theirs  # losses, step and token counts, statuses, case keys: bitwise
    assert {r["case_key"] for r in load_rows(dirs)} == {r["case_key"] for r in load_rows([sequential])}
    assert len(_losses(dirs)) == 8
    for d in dirs:  # each unit recorded its threads and which unit it is
        m = json.loads((d / "manifest.json").read_text())
        assert m["threads"] == 1 and m["unit"]["study_id"] == "S"
        assert d.name == f"S-L{m['unit']['depth']}-s{m['unit']['seed']}"
        assert (d / UNIT_LOG).read_text().startswith(ATTEMPT_MARK)
    assert json.loads((sequential / "manifest.json").read_text())["threads"] == 1
    assert output.count(": done in ") == 4 and "2 workers (CPU), 1 thread each" in output


def test_status_names_each_unit_done_and_nothing_left(launched):
    root, _ = launched
    res = CliRunner().invoke(main, ["status", str(root)])
    assert res.exit_code == 0, res.output
    units = [ln for ln in res.output.splitlines() if ln.startswith("  unit ")]
    assert len(units) == 4 and all(" done " in ln for ln in units) and "units:      done 4" in res.output
    assert "nothing left to do" in res.output


def test_a_killed_unit_is_named_by_status_and_its_command_finishes_it(tmp_path, corpus, sequential):
    killed = _cli(*ARGS, "--data", str(corpus.path), "--out", str(tmp_path), "--run-id", "K", "--launcher",
                  "local", "--workers", "2", fault=f"kill_after_eval=1:{UNIT3_HAARES}")
    assert killed.returncode == 1, killed.stdout[-3000:] + killed.stderr[-3000:]
    assert "unit 3 (L4, seed 1): FAILED (exit -9)" in killed.stdout
    status = CliRunner().invoke(main, ["status", str(tmp_path)])
    assert status.exit_code == 0, status.output
    lines = {ln.split()[1]: ln for ln in status.output.splitlines() if ln.strip().startswith("unit ")}
    assert "failed: 1 attempt, 0 of 2 runs done; last line of unit.log:" in lines["3"]
    assert all(" done " in lines[i] for i in "012")
    cmd = next(ln for ln in status.output.splitlines() if ln.startswith("run:"))[len("run:"):].strip()
    assert "--unit 3 " in cmd + " "
    d = next(tmp_path.glob("*/K-L4-s1"))
    before = {(r["case_key"], r["metric"], r["repeat"]) for r in load_rows([d])}
    assert before  # the evaluations committed before the kill
    rerun = subprocess.run(cmd, shell=True, cwd=ROOT, capture_output=True, text=True, timeout=600,
                           env={k: v for k, v in os.environ.items() if k != "ROUTERBENCH_FAULT"})
    assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-3000:]
    keys = [(r["case_key"], r["metric"], r["repeat"]) for r in load_rows([d])]
    assert len(keys) == len(set(keys)) and before <= set(keys)  # nothing doubled, nothing lost
    assert _losses([d]) == {k: v for k, v in _losses([sequential]).items() if k[1:] == (4, 1)}
    assert (d / UNIT_LOG).read_text().count(ATTEMPT_MARK) == 2
    again = CliRunner().invoke(main, ["status", str(tmp_path)])
    assert "units:      done 4" in again.output


def _units_root(tmp_path: Path) -> Path:
    res = CliRunner().invoke(main, [*ARGS, "--out", str(tmp_path), "--run-id", "F", "--units", "json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert [u["index"] for u in data["units"]] == [0, 1, 2, 3]
    assert [(u["depth"], u["seed"]) for u in data["units"]] == [(2, 0), (4, 0), (2, 1), (4, 1)]
    assert all(f"--unit {u['index']} --threads 1" in u["command"] for u in data["units"])
    assert all(u["estimate_s"][0] <= u["estimate_s"][1] for u in data["units"])
    return tmp_path


def test_a_unit_failed_twice_is_held_back_unless_retry_failed(tmp_path, no_models):
    root = _units_root(tmp_path)
    unit = read_index(root)["units"][2]
    d = root / "cpu-test" / unit.run_id
    d.mkdir(parents=True)
    (d / UNIT_LOG).write_text(f"{ATTEMPT_MARK} 2\nboom one\n{ATTEMPT_MARK} 2\nKilled by boom two\n")
    assert unit_state(d, 2) == {"state": "failed", "attempts": 2, "last_line": "Killed by boom two",
                                "holder": None, "done_runs": 0}
    out = CliRunner().invoke(main, ["status", str(root)]).output
    run = next(ln for ln in out.splitlines() if ln.startswith("run:"))
    assert "--unit 0,1,3 " in run and "held back:  unit 2 failed 2 times" in out
    assert "Killed by boom two" in out
    retry = CliRunner().invoke(main, ["status", str(root), "--retry-failed"]).output
    assert "--unit 0,1,2,3 " in next(ln for ln in retry.splitlines() if ln.startswith("run:"))


def test_the_unit_order_is_seeds_outermost_then_depths():
    us = study_units((3, 7), (12, 48), "X")
    assert [(u.index, u.seed, u.depth, u.run_id) for u in us] == [
        (0, 3, 12, "X-L12-s3"), (1, 3, 48, "X-L48-s3"), (2, 7, 12, "X-L12-s7"), (3, 7, 48, "X-L48-s7")]


def test_threads_are_set_for_the_body_and_restored():
    n = torch.get_num_threads()
    old = os.environ.get("OMP_NUM_THREADS")
    with torch_threads(1):
        assert torch.get_num_threads() == 1 and os.environ["OMP_NUM_THREADS"] == "1"
    assert torch.get_num_threads() == n and os.environ.get("OMP_NUM_THREADS") == old


@pytest.mark.parametrize("extra,words", [
    (["--seed-list", "1,1"], "--seed-list lists a value twice"),
    (["--seed-list", "0,-1"], "--seed-list"),
    (["--seeds", "3", "--seed-list", "0,1"], "--seeds 3 and --seed-list 0,1 disagree"),
    (["--unit", "9", "--run-id", "S"], "--unit 9: the study has 4 units (0..3"),
    (["--unit", "1"], "--unit needs --run-id STUDY"),
    (["--workers", "0"], "--workers"),
    (["--units", "json", "--launcher", "local"], "--units prints the units and exits; drop --launcher"),
])
def test_bad_unit_options_exit_2_in_one_line_naming_the_option(tmp_path, no_models, extra, words):
    args = [a for a in ARGS if a not in ("--seed-list", "0,1")] if "--seed-list" in extra or "--seeds" in extra \
        else ARGS
    res = CliRunner().invoke(main, [*args, "--out", str(tmp_path), *extra])
    assert res.exit_code == 2, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("routerbench: error: ") and words in lines[0], lines
    assert not list(tmp_path.iterdir())  # nothing written


def test_a_root_holding_another_study_is_refused(tmp_path, no_models):
    root = _units_root(tmp_path)
    other = CliRunner().invoke(main, [*ARGS, "--out", str(root), "--run-id", "G", "--units", "json"])
    assert other.exit_code == 2 and "holds study F" in other.output and "--run-id F" in other.output
    args = [a if a != "10" else "20" for a in ARGS]  # --max-steps 20
    changed = CliRunner().invoke(main, [*args, "--out", str(root), "--run-id", "F", "--units", "json"])
    assert changed.exit_code == 2 and "study.max_steps = 10, not 20" in changed.output


def test_a_file_system_refusing_flock_is_one_line_naming_lock_free(tmp_path, corpus, monkeypatch):
    monkeypatch.setenv("ROUTERBENCH_FAULT", f"lock_refused:{tmp_path}/*")
    args = [*ARGS, "--data", str(corpus.path), "--out", str(tmp_path), "--run-id", "L", "--unit", "0"]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 2, res.output
    line = res.output.strip().splitlines()[-1]
    assert line.startswith("routerbench: error: --out: the file system of") and "--lock-free" in line
    assert "refuses flock" in (next(tmp_path.glob("*/L-L2-s0")) / UNIT_LOG).read_text()
    ok = CliRunner().invoke(main, [*args, "--lock-free"])  # no flock: the unit runs, its holder cleared
    assert ok.exit_code == 0, ok.output
    d = next(tmp_path.glob("*/L-L2-s0"))
    assert unit_state(d, 2)["state"] == "done" and lock_holder(d) is None


def test_an_old_spec_with_seeds_only_still_resumes(tmp_path, no_models):
    """A spec.toml written before --seed-list (``seeds = 3``, no ``seed_list``) resolves to the same
    study as today's, so an old run directory resumes."""
    from harness.cli.common import spec_difference
    from harness.spec.base import load, to_toml
    from harness.spec.study import StudySpec
    spec, labels = load(StudySpec, {"scale": "tiny", "seeds": "3", "routers": "prenorm", "device": "cpu"})
    spec = spec.resolve(labels)
    assert spec.study.seed_list == (0, 1, 2)
    import tomli_w

    from harness.spec.base import tomllib
    doc = tomllib.loads(to_toml(spec, spec.NOT_IN_FILE))
    del doc["study"]["seed_list"]
    assert doc["study"]["seeds"] == 3
    (tmp_path / "spec.toml").write_text(tomli_w.dumps(doc))
    assert spec_difference(spec, tmp_path / "spec.toml") is None
    other, labels = load(StudySpec, {"scale": "tiny", "seed_list": "0,1,5", "routers": "prenorm", "device": "cpu"})
    diff = spec_difference(other.resolve(labels), tmp_path / "spec.toml")
    assert diff == ("study.seed_list", [0, 1, 2], [0, 1, 5])


def test_options_no_file_holds_travel_in_every_units_command(tmp_path, no_models):
    """--lock-free and --estimate-steps are in no spec file, so each unit's command carries them: the
    printed commands, the local launcher's and the one `status` prints."""
    res = CliRunner().invoke(main, [*ARGS, "--out", str(tmp_path), "--run-id", "E", "--units", "json",
                                    "--lock-free"])
    assert res.exit_code == 0, res.output
    for u in json.loads(res.output)["units"]:
        assert u["command"].endswith(f"--unit {u['index']} --threads 1 --estimate-steps 1 --lock-free")
    assert read_index(tmp_path)["unit_flags"] == ["--estimate-steps", "1", "--lock-free"]
    run = next(ln for ln in CliRunner().invoke(main, ["status", str(tmp_path)]).output.splitlines()
               if ln.startswith("run:"))
    assert "--unit 0,1,2,3 --estimate-steps 1 --lock-free --launcher local" in run


def test_each_local_worker_sees_its_own_gpu_and_threads(monkeypatch):
    from harness.cli.study_units import worker_env
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,5")
    envs = [worker_env(w, ["2", "5"], 3) for w in (0, 1)]
    assert [e["CUDA_VISIBLE_DEVICES"] for e in envs] == ["2", "5"]
    assert all(e["OMP_NUM_THREADS"] == e["MKL_NUM_THREADS"] == "3" for e in envs)
    assert worker_env(0, [], 1)["CUDA_VISIBLE_DEVICES"] == "2,5"  # a CPU worker: left as it was
