"""A sticky device error costs one case (harness/step/device_errors.py, harness/sweep/run.py,
harness/sweep/isolate.py, harness/cli/supervise.py).

A CPU cannot poison its device context, so the sweeps here name a case ``device_error`` in the
fault hook (harness/rundir/faults.py): its set-up raises "an illegal memory access was
encountered" as ``torch.AcceleratorError``, and so does every later set-up in the same process, as
on a poisoned CUDA context. The sweep is 3 paired groups (prenorm and rezero at 1, 2 and 3
layers, eager ``fwd``) with the fault on rezero in group 2.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from harness.cli.supervise import EXIT_DEVICE_LOST
from harness.rundir import faults
from harness.rundir.records import load_rows
from harness.rundir.writer import RunWriter
from harness.step.device_errors import DeviceContextLost, poisons_context
from harness.sweep import timed
from harness.sweep.cases import expand
from harness.sweep.options import SweepOptions
from harness.timing.timer import TimingPolicy
from workloads.config import DecoderConfig

ROOT = Path(__file__).resolve().parents[1]
FAULT = "device_error:rezero|*|24|2|*"  # rezero at d=24, 2 layers: group 2
SWEEP = ["run", "--routers", "prenorm,rezero", "--widths", "24", "--depths", "1,2,3", "--n-heads", "2",
         "--seq-len", "8", "--batch-size", "2", "--modes", "fwd", "--backends", "eager", "--smallest-backends", "",
         "--no-train", "--no-report", "--quiet", "--no-flops", "--repeats", "3", "--warmup-s", "0",
         "--remeasure-s", "0"]
STICKY = "CUDA error: an illegal memory access was encountered"


def _env(fault: str | None = FAULT) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in (faults.ENV, "ROUTERBENCH_SUPERVISED")}
    env["OMP_NUM_THREADS"] = "1"
    if fault:
        env[faults.ENV] = fault
    return env


def _routerbench(*args: str, fault: str | None = FAULT, timeout: int = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness.cli", *args], cwd=ROOT, env=_env(fault),
                          capture_output=True, text=True, timeout=timeout)


def _step_times(out: Path) -> dict[tuple[str, int], list[tuple[str, str]]]:
    """(router, layers) -> [(status, session)] of each ``step_time`` row, in record order."""
    got: dict[tuple[str, int], list[tuple[str, str]]] = {}
    for r in load_rows(sorted(out.glob("*/t"))):
        if r["metric"] == "step_time":
            got.setdefault((r["router"], r["n_layers"]), []).append((r["status"], r["session"]))
    return got


def _check_one_case_lost(out: Path, new_session: bool = True) -> None:
    """Groups 1 and 3 measured; group 2's rezero one error row and its prenorm measured; every
    case once (its 3 timed rows from one session); one run directory; the abandoned unit in
    ``aborted/``. ``new_session``: the rest was measured in a session of its own (a supervised
    restart or a resume; ``--isolate`` children write in their parent's session)."""
    assert len(list(out.glob("*/*"))) == 1
    got = _step_times(out)
    assert sorted(got) == [(r, n) for r in ("prenorm", "rezero") for n in (1, 2, 3)]
    for key, rows in got.items():
        if key == ("rezero", 2):
            assert [s for s, _ in rows] == ["error"]
        else:
            assert [s for s, _ in rows] == ["ok"] * 3, key
            assert len({s for _, s in rows}) == 1, key  # no case measured twice
    err = next(r for r in load_rows(sorted(out.glob("*/t")))
               if r["metric"] == "step_time" and r["status"] == "error")
    assert STICKY in err["error"] and "sticky device error" in err["error"]
    if new_session:  # measured again in a new process
        assert got[("prenorm", 2)][0][1] != got[("prenorm", 1)][0][1]
    index = [json.loads(ln) for ln in (next(out.glob("*/t")) / "aborted" / "index.jsonl").read_text().splitlines()]
    assert len(index) == 1 and index[0]["reason"].startswith("DeviceContextLost:")


def test_supervised_sweep_loses_only_the_case_that_poisoned_its_process(tmp_path):
    res = _routerbench(*SWEEP, "--out", str(tmp_path), "--run-id", "t", "--supervise")
    assert res.returncode == 0, res.stderr[-3000:]
    _check_one_case_lost(tmp_path)
    lines = res.stderr.splitlines()
    assert sum("resuming the rest of the run in a new process (restart 1)" in ln for ln in lines) == 1
    assert any("a sticky device error" in ln and "the supervisor resumes the run" in ln for ln in lines)
    assert lines[-1] == (f"supervisor: the run finished after 1 restart in a new process; 1 case lost to a sticky "
                         f"device error is an error row (rezero): {sys.executable} -m harness.cli status "
                         f"{next(tmp_path.glob('*/t'))}")
    manifest = json.loads((next(tmp_path.glob("*/t")) / "manifest.json").read_text())
    assert len(manifest["sessions"]) == 2


def test_unsupervised_sweep_stops_with_75_and_its_resume_finishes_it(tmp_path):
    res = _routerbench(*SWEEP, "--out", str(tmp_path), "--run-id", "t", "--no-supervise")
    assert res.returncode == EXIT_DEVICE_LOST, res.stderr[-3000:]
    got = _step_times(tmp_path)
    # group 1 kept, rezero's error row kept; group 2's prenorm in aborted/, group 3 never started
    assert sorted(got) == [("prenorm", 1), ("rezero", 1), ("rezero", 2)]
    last = [ln for ln in res.stderr.splitlines() if ln.strip()][-1]
    # done: group 1's two cases and rezero's error row
    assert last.startswith("routerbench: a sticky device error: ") and "3 of 6 done; resume with: " in last
    resume = last.split("resume with: ", 1)[1].split()
    assert resume[resume.index("--run-id") + 1] == "t"
    res = _routerbench("run", *resume[resume.index("--config"):], fault=None)
    assert res.returncode == 0, res.stderr[-3000:]
    _check_one_case_lost(tmp_path)


def test_isolated_sweep_loses_only_that_case(tmp_path):
    res = _routerbench(*SWEEP, "--out", str(tmp_path), "--run-id", "t", "--isolate", "--no-supervise")
    assert res.returncode == 0, res.stderr[-3000:]
    _check_one_case_lost(tmp_path, new_session=False)


def test_the_supervisor_passes_sigterm_on_to_its_child_once(tmp_path):
    """SIGTERM to the supervisor interrupts the child (exit 143, its resume line), as without one."""
    proc = subprocess.Popen([sys.executable, "-m", "harness.cli", *SWEEP, "--out", str(tmp_path), "--run-id", "t",
                             "--supervise"], cwd=ROOT, env=_env("hang:rezero|*|24|2|*"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    progress = None
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:  # until group 2 is being set up
        progress = next(tmp_path.glob("*/t/progress.json"), None)
        if progress is not None and '"k": 2' in progress.read_text():
            break
        time.sleep(0.2)
    time.sleep(1.0)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err[-3000:]
    assert sum(ln.startswith("interrupted") for ln in err.splitlines()) == 1, err[-3000:]
    assert "resume with:" in err and "supervisor:" not in err
    assert sorted(_step_times(tmp_path)) == [("prenorm", 1), ("rezero", 1)]


# --- the parts -------------------------------------------------------------------------------------
def test_poisons_context_reads_the_sticky_errors_only():
    sticky = getattr(torch, "AcceleratorError", RuntimeError)
    assert poisons_context(sticky(STICKY))
    assert poisons_context(RuntimeError("CUDA error: unspecified launch failure\nCompile with TORCH_USE_CUDA_DSA"))
    assert poisons_context(RuntimeError("CUDA error: device-side assert triggered"))
    try:  # raised from a sticky error, e.g. by a wrapper that rewords it
        try:
            raise sticky(STICKY)
        except RuntimeError as inner:
            raise ValueError("the backward failed") from inner
    except ValueError as outer:
        assert poisons_context(outer)
    assert not poisons_context(torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert not poisons_context(sticky("CUDA error: invalid argument"))
    assert not poisons_context(RuntimeError("mat1 and mat2 shapes cannot be multiplied (4x8 and 16x8)"))


def test_the_fault_poisons_every_later_set_up_of_its_process(monkeypatch):
    monkeypatch.setenv(faults.ENV, "device_error:rezero|*")
    monkeypatch.setattr(faults, "_device_lost", None)
    faults.maybe_inject("prenorm|x")  # not named, nothing lost yet: a no-op
    for key in ("rezero|x", "prenorm|x"):  # the named case, then any case after it
        with pytest.raises(RuntimeError, match="an illegal memory access") as got:
            faults.maybe_inject(key)
        assert poisons_context(got.value)


def test_a_sticky_error_while_timing_is_pinned_on_the_step_that_raised_it(tmp_path):
    """The interleaved timing stops at the first sticky error and names its case; no other step
    is called after it (timing them alone would only raise it again)."""
    cfg = DecoderConfig(vocab_size=32, d_model=16, n_layers=2, n_heads=2, seq_len=8, batch_size=2)
    cases = expand(["prenorm", "rezero", "layerscale"], cfg, [16], [2], ["fwd"])
    calls = {c.key: 0 for c in cases}
    bad = cases[1].key

    def step_of(key):
        def step():
            calls[key] += 1
            if key == bad and calls[key] == 3:
                raise getattr(torch, "AcceleratorError", RuntimeError)(STICKY)
        return step

    opts = SweepOptions(flops=False, memory=False, timing=TimingPolicy(repeats=5, warmup_min_count=1,
                                                                       warmup_min_s=0.0), max_attempts=1)
    with RunWriter(tmp_path, "run", "s") as w, pytest.raises(DeviceContextLost) as got:
        with w.unit([c.key for c in cases], kind="group") as u:
            timed.time_group(cases, {c.key: step_of(c.key) for c in cases}, torch.device("cpu"), u, opts)
    assert got.value.case_key == bad and STICKY in got.value.error
    n = calls[bad]
    assert all(v <= n + 1 for v in calls.values())  # the round stopped there: no step was timed alone after
    assert not [r for r in load_rows([tmp_path]) if r["metric"] == "step_time"]  # the unit was abandoned
