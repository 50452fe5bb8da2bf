"""Sweeps that are killed, interrupted, launched twice or hit by faults never lose, double or orphan
a measurement. These run the real command in subprocesses and send real signals; faults a CPU
cannot produce (CUDA OOM, a crash in a graph, a hang) come through ``ROUTERBENCH_FAULT``."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import torch

from harness.rundir import faults
from harness.rundir.records import (ABORTED_DIR, END, PENDING_DIR, RECORDS_FILE, completed_cases, load_rows,
                                    read_jsonl, units)
from harness.rundir.writer import RunWriter
from harness.sweep.cases import expand
from harness.sweep.options import SweepOptions
from harness.sweep.run import run_sweep
from harness.timing.timer import TimingPolicy
from workloads.config import PRESETS

CLI = [sys.executable, "-m", "harness.cli"]
SWEEP = ["run", "--routers", "prenorm,haares,rezero", "--widths", "16,24", "--depths", "2",
         "--modes", "fwd,fwd_bwd", "--warmup-s", "0.1", "--backends", "eager", "--impls", "naive",
         "--no-train", "--no-report", "--no-flops", "--quiet"]
N_CASES = 3 * 2 * 2


def start(args, out: Path, run_id: str, env=None, repeats=40) -> subprocess.Popen:
    return subprocess.Popen(CLI + args + ["--repeats", str(repeats), "--max-attempts", "1", "--out", str(out), "--run-id", run_id],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **(env or {})})


def run_dir(out: Path, run_id: str) -> Path:
    return next(out.glob(f"*/{run_id}"))


def wait_for(cond, timeout=120.0, proc=None):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"process ended first: {proc.communicate()}")
        time.sleep(0.05)
    raise AssertionError("condition not reached")


def mid_group(out: Path, run_id: str) -> bool:
    """At least one unit committed and rows of the next one staged."""
    dirs = list(out.glob(f"*/{run_id}"))
    if not dirs:
        return False
    d = dirs[0]
    # a group committed (not only the run's bandwidth unit, which holds no case)
    committed = (d / RECORDS_FILE).exists() and any(m["cases"] for m in units(d))
    staged = any(len(read_jsonl(p)) >= 2 for p in (d / PENDING_DIR).glob("*.jsonl")) \
        if (d / PENDING_DIR).exists() else False
    return committed and staged


def signature(d: Path) -> Counter:
    """What a run measured, values aside: (case, metric, repeat, status) with multiplicity."""
    return Counter((r["case_key"], r["metric"], r["repeat"], r["status"]) for r in load_rows([d]))


def assert_no_orphans(d: Path) -> None:
    """Every row of records.jsonl is covered by an end marker of its own unit."""
    objs = [json.loads(ln) for ln in (d / RECORDS_FILE).read_text().splitlines() if ln.strip()]
    markers = {o[END]: o for o in objs if END in o}
    rows = [o for o in objs if END not in o]
    per_unit = Counter(r["resume_unit"] for r in rows)
    assert set(per_unit) == set(markers)
    assert all(markers[u]["rows"] == n for u, n in per_unit.items())
    assert objs and END in objs[-1]
    assert not (d / "done.jsonl").exists()


#: The group killed by the fault hook: every case at d=24 in fwd_bwd (a later group than the first).
KILLED_GROUP = "*|fwd_bwd|*|24|2|*"


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """An uninterrupted run of SWEEP (what a killed and resumed run must equal)."""
    out = tmp_path_factory.mktemp("ref")
    ref = start(SWEEP, out, "ref", repeats=6)
    assert ref.wait(timeout=300) == 0, ref.communicate()
    return run_dir(out, "ref")


def _killed(tmp_path, fault):
    p = start(SWEEP, tmp_path, "killed", repeats=6, env={"ROUTERBENCH_FAULT": fault})
    _, err = p.communicate(timeout=300)
    assert p.returncode == -signal.SIGKILL, err  # killed at the named point, not by a timer
    return run_dir(tmp_path, "killed")


def _resume(tmp_path, reference):
    res = start(SWEEP, tmp_path, "killed", repeats=6)
    _, err = res.communicate(timeout=300)
    assert res.returncode == 0, err
    d = run_dir(tmp_path, "killed")
    # records.jsonl alone (no done.jsonl): exactly the uninterrupted run's rows, none twice
    assert_no_orphans(d)
    assert signature(d) == signature(reference)
    assert len(completed_cases(d)) == N_CASES
    return d


def _aborted_rows(d):
    return [r for f in (d / ABORTED_DIR).glob("*.jsonl") if f.name != "index.jsonl" for r in read_jsonl(f)]


@pytest.mark.slow
def test_sigkill_inside_a_group_then_resume_equals_an_uninterrupted_run(tmp_path, reference):
    d = _killed(tmp_path, f"kill_in_unit=5:{KILLED_GROUP}")  # SIGKILL at the group's 5th staged row
    staged = {r["case_key"] for f in (d / PENDING_DIR).glob("*.jsonl") for r in read_jsonl(f)}
    assert any(m["cases"] for m in units(d))  # a group committed before
    assert staged and not staged & set(completed_cases(d))
    d = _resume(tmp_path, reference)
    # the killed group's partial rows are kept in aborted/, not in the records
    aborted = _aborted_rows(d)
    assert aborted and {r["case_key"] for r in aborted} == staged
    assert {r["resume_unit"] for r in aborted}.isdisjoint({r["resume_unit"] for r in load_rows([d])})


@pytest.mark.slow
def test_sigkill_between_commit_and_cleanup_never_moves_committed_rows_to_aborted(tmp_path, reference):
    d = _killed(tmp_path, f"kill_after_commit:{KILLED_GROUP}")
    left = list((d / PENDING_DIR).glob("*.jsonl"))
    committed = {m[END] for m in units(d)}
    assert len(left) == 1 and left[0].stem in committed  # the committed unit's pending file is left
    d = _resume(tmp_path, reference)
    assert not _aborted_rows(d)  # dropped as committed, not moved to aborted/
    assert not list((d / PENDING_DIR).glob("*.jsonl"))


@pytest.mark.slow
@pytest.mark.parametrize("sig,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_interrupt_prints_the_resume_command_and_it_finishes(tmp_path, sig, code):
    p = start(SWEEP, tmp_path, "int")
    wait_for(lambda: mid_group(tmp_path, "int"), proc=p)
    p.send_signal(sig)
    out, err = p.communicate(timeout=60)
    assert p.returncode == code, (out, err)
    line = [ln for ln in err.splitlines() if ln.startswith("interrupted")]
    assert len(line) == 1 and line[0].startswith("interrupted: ") and f"of {N_CASES} done" in line[0], err
    d = run_dir(tmp_path, "int")
    done_before = len(completed_cases(d))
    assert 0 < done_before < N_CASES
    assert f"{done_before} of {N_CASES} done" in line[0]
    assert not list((d / PENDING_DIR).glob("*.jsonl")) and list((d / ABORTED_DIR).glob("*-*.jsonl"))
    resume = line[0].split("resume with: ", 1)[1]
    res = subprocess.run(shlex.split(resume), capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert len(completed_cases(d)) == N_CASES
    assert_no_orphans(d)
    st = Counter(r["case_key"] for r in load_rows([d]) if r["metric"] == "step_time")
    assert set(st.values()) == {40}  # every case timed once: 40 repeats, never 80


@pytest.mark.slow
def test_a_second_sweep_into_the_same_run_dir_stops_at_once(tmp_path):
    # The first sweep hangs in the set-up of its last group (a fault hook), so it surely holds the
    # lock while the second starts, however fast this machine is.
    first = start(SWEEP, tmp_path, "same", repeats=10, env={"ROUTERBENCH_FAULT": "hang:rezero|*|fwd_bwd|*|24|*"})
    wait_for(lambda: len(units(run_dir(tmp_path, "same"))) >= 3 if list(tmp_path.glob("*/same")) else False,
             proc=first)
    t0 = time.monotonic()
    second = start(SWEEP, tmp_path, "same", repeats=10)
    out, err = second.communicate(timeout=60)
    assert second.returncode == 2 and time.monotonic() - t0 < 30
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and f"pid {first.pid}" in lines[0] and "choose another --run-id" in lines[0], err
    first.terminate()
    assert first.wait(timeout=60) == 143
    third = start(SWEEP, tmp_path, "same", repeats=10)
    assert third.wait(timeout=300) == 0, third.communicate()
    d = run_dir(tmp_path, "same")
    assert_no_orphans(d)
    assert len(completed_cases(d)) == N_CASES
    st = Counter(r["case_key"] for r in load_rows([d]) if r["metric"] == "step_time")
    assert len(st) == N_CASES and set(st.values()) == {10}


@pytest.mark.slow
def test_isolate_pins_a_crash_and_a_hang_on_their_cases_and_keeps_an_oom_row(tmp_path):
    args = ["run", "--routers", "prenorm,haares,rezero,layerscale", "--widths", "16", "--depths", "2",
            "--modes", "fwd", "--warmup-s", "0", "--backends", "eager", "--impls", "naive", "--no-train",
            "--no-report", "--no-flops", "--quiet", "--isolate", "--case-timeout", "8"]
    env = {faults.ENV: "oom:haares|*;crash:rezero|*;hang:layerscale|*"}
    p = start(args, tmp_path, "iso", env=env, repeats=3)
    out, err = p.communicate(timeout=400)
    assert p.returncode == 0, err
    d = run_dir(tmp_path, "iso")
    rows = load_rows([d])
    by = {r: [x for x in rows if x["router"] == r and x["metric"] == "step_time"]
          for r in ("prenorm", "haares", "rezero", "layerscale")}
    assert [x["status"] for x in by["prenorm"]] == ["ok"] * 3
    assert [x["status"] for x in by["haares"]] == ["oom"] and "injected" in by["haares"][0]["error"]
    assert [x["status"] for x in by["rezero"]] == ["error"]
    assert "crashed: killed by SIGSEGV" in by["rezero"][0]["error"]
    assert [x["status"] for x in by["layerscale"]] == ["error"]
    assert "hung: no progress for 8 s (--case-timeout)" in by["layerscale"][0]["error"]
    assert completed_cases(d) == {x[0]["case_key"]: s for x, s in
                                  ((by["prenorm"], "ok"), (by["haares"], "oom"), (by["rezero"], "error"),
                                   (by["layerscale"], "error"))}
    reasons = [r["reason"] for r in read_jsonl(d / ABORTED_DIR / "index.jsonl")]
    assert any("crashed" in r and "4 case(s)" in r for r in reasons), reasons  # the group, abandoned
    assert_no_orphans(d)
    status = subprocess.run(CLI + ["status", str(d)], capture_output=True, text=True, timeout=120)
    assert "4 of 4 done" in status.stdout and "failures:  3 row(s)" in status.stdout, status.stdout


def test_an_injected_oom_is_a_row_and_the_sweep_goes_on(tmp_path, monkeypatch):
    base = PRESETS["cpu-quick"].replace(seq_len=8, batch_size=2)
    cases = expand(["prenorm", "haares", "rezero"], base, [16], [2], modes=["fwd"], impls=["naive"])
    monkeypatch.setenv(faults.ENV, "oom:haares|*")
    with RunWriter(tmp_path, "r", "s") as w:
        stats = run_sweep(cases, torch.device("cpu"), w, SweepOptions(
            flops=False, timing=TimingPolicy(repeats=2, warmup_min_s=0, warmup_min_count=1), max_attempts=1),
            progress=False)
    assert stats == {"resumed": 0, "ok": 2, "oom": 1}
    rows = load_rows([tmp_path])
    oom = [r for r in rows if r["status"] == "oom"]
    assert len(oom) == 1 and oom[0]["router"] == "haares" and "CUDA out of memory" in oom[0]["error"]
    assert completed_cases(tmp_path)[oom[0]["case_key"]] == "oom"
    assert sum(r["metric"] == "step_time" and r["status"] == "ok" for r in rows) == 4


@pytest.mark.slow
def test_status_of_a_copied_run_dir_says_how_to_resume_that_directory(tmp_path):
    """A copy is not at <out>/<device>/<run-id>: status says so and how to put it there; its
    command then resumes the copy (not a fresh run beside it)."""
    one = ["run", "--routers", "prenorm,rezero", "--widths", "16", "--depths", "2", "--modes", "fwd",
           "--warmup-s", "0.1", "--backends", "eager", "--impls", "naive", "--no-train", "--no-report",
           "--no-flops", "--quiet"]
    p = start(one, tmp_path / "out", "orig", repeats=3, env={"ROUTERBENCH_FAULT": "kill_in_unit=3:rezero|*"})
    p.communicate(timeout=300)
    assert p.returncode == -signal.SIGKILL
    copy = tmp_path / "elsewhere" / "mine"
    shutil.copytree(run_dir(tmp_path / "out", "orig"), copy, ignore=shutil.ignore_patterns(".lock"))
    out = subprocess.run(CLI + ["status", str(copy)], capture_output=True, text=True, timeout=120)
    line = [ln for ln in out.stdout.splitlines() if ln.startswith("resume:")]
    assert out.returncode == 0 and len(line) == 1 and "not in place" in line[0], out.stdout
    move, cmd = line[0].split("first (", 1)[1].split("), then: ", 1)
    subprocess.run(move, shell=True, check=True)
    home = next((tmp_path / "elsewhere").glob(f"*/{copy.name}"))
    res = subprocess.run(shlex.split(cmd), capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert len(completed_cases(home)) == 2 and not list((tmp_path / "elsewhere").glob("*/orig"))
    out = subprocess.run(CLI + ["status", str(home)], capture_output=True, text=True, timeout=120)
    assert "resume:    nothing left to do" in out.stdout, out.stdout
