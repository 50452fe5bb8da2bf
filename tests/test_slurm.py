"""The depth study on a real SLURM (harness/cli/study_slurm.py): `make test-slurm` starts a one-node
cluster with scripts/slurm_local.sh and runs this file against it.

A tiny CPU study (2 routers × 2 depths × 2 seeds, 1 thread per task, 20 steps) is submitted as a
job array with `--launcher slurm --wait`. One task dies after an evaluation (`kill_after_eval`),
one is `scancel`led and one is requeued (`scontrol requeue`) while it runs, each after it
committed an evaluation. `status` names the two missing units with their attempts, the resubmission
it prints finishes them, and every row but time equals the one-process study's, bitwise, with
nothing lost or doubled.

Without a cluster (no `sbatch`, no `SLURM_CONF`, or a controller that does not answer) every test
here is skipped with the reason, unless ROUTERBENCH_REQUIRE_SLURM=1 (`make test-slurm`), where that
fails instead.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from harness.cli import main
from harness.rundir.records import load_rows
from harness.training.units import ATTEMPT_MARK, UNIT_LOG
from workloads.data import prepare_corpus_from_text, stdlib_text

pytestmark = pytest.mark.slurm

ROOT = Path(__file__).resolve().parents[1]
ARGS = ["study", "depth", "--scale", "tiny", "--routers", "block_attnres,haares", "--depths", "2,4",
        "--blocks", "2", "--max-steps", "20", "--eval-every", "5", "--estimate-steps", "1",
        "--seed-list", "0,1", "--device", "cpu", "--quiet", "--threads", "1"]
#: unit 1 (L4, seed 0) and unit 2 (L2, seed 1) are slowed so they can be cancelled and requeued
#: mid-run; haares of unit 3 (L4, seed 1) is killed after its first evaluation.
FAULTS = ("slow=150:study|*n_layers=4,*|0|*;slow=150:study|*n_layers=2,*|1|*;"
          "kill_after_eval=1:study|haares|*n_layers=4,*|1|*")
SESSION_COLUMNS = ("run_id", "session", "resume_unit")
DEADLINE_S = 600


def _cluster_problem() -> str | None:
    if shutil.which("sbatch") is None:
        return "no sbatch on PATH"
    if not os.environ.get("SLURM_CONF"):
        return "SLURM_CONF is not set (eval the export line of scripts/slurm_local.sh)"
    res = subprocess.run(["sinfo", "-h", "-o", "%a %t"], capture_output=True, text=True, timeout=30)
    if res.returncode != 0 or not res.stdout.strip():
        return f"sinfo does not answer ({' '.join(res.stderr.split()) or res.returncode})"
    return None


@pytest.fixture(scope="module", autouse=True)
def cluster():
    problem = _cluster_problem()
    if problem and os.environ.get("ROUTERBENCH_REQUIRE_SLURM") == "1":
        pytest.fail(f"no SLURM cluster: {problem}")
    if problem:
        pytest.skip(f"no SLURM cluster: {problem}; `make test-slurm` starts one")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return prepare_corpus_from_text(stdlib_text(300_000), tmp_path_factory.mktemp("corpus") / "c")


def _env(fault: str | None = None, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("ROUTERBENCH_FAULT", "OMP_NUM_THREADS")}
    if fault:
        env["ROUTERBENCH_FAULT"] = fault
    return {**env, **extra}


def _cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness.cli", *args], cwd=ROOT, env=env or _env(),
                          capture_output=True, text=True, timeout=DEADLINE_S)


def _results(dirs) -> list[tuple]:
    rows = [tuple((k, v) for k, v in sorted(r.items()) if k not in SESSION_COLUMNS)
            for r in load_rows(dirs) if r.get("unit") != "s"]
    return sorted(rows, key=repr)


def _tasks(study_id: str) -> dict[int, str]:
    res = subprocess.run(["squeue", "-h", "-r", f"--name=rb-{study_id}", "-o", "%K %T"], capture_output=True,
                         text=True, timeout=30)
    return {int(k): v for k, v in (ln.split() for ln in res.stdout.splitlines()) if k.isdigit()}


def _committed(d: Path) -> bool:
    return d.is_dir() and any(r["metric"] == "val_loss" and r["value"] is not None for r in load_rows([d]))


def _job_of(root: Path) -> str:
    from harness.cli.study_slurm import read_jobs
    jobs = read_jobs(root)
    return jobs[-1]["job_id"] if jobs else ""


@pytest.fixture(scope="module")
def sequential(tmp_path_factory, corpus):
    out = tmp_path_factory.mktemp("seq")
    res = _cli(*ARGS, "--data", str(corpus.path), "--out", str(out), "--run-id", "seq", "--no-report")
    assert res.returncode == 0, res.stderr[-3000:]
    return next(out.glob("*/seq"))


def test_bad_slurm_options_are_one_line_before_anything_is_submitted(tmp_path, corpus):
    base = [*ARGS, "--data", str(corpus.path), "--out", str(tmp_path), "--run-id", "B", "--launcher", "slurm"]
    for extra, words in ((["--slurm-partition", "nosuch"], "--slurm-partition nosuch: sbatch --test-only refused"),
                         (["--slurm-time", "3:00:00"], "--slurm-time 3:00:00: sbatch --test-only refused")):
        res = _cli(*base, *extra)
        assert res.returncode == 2, res.stdout + res.stderr
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("routerbench: error: ") and words in lines[0], lines
    empty = tmp_path / "bin"
    empty.mkdir()
    res = _cli(*base, env=_env(PATH=str(empty)))
    assert res.returncode == 2 and "--launcher slurm: no sbatch on PATH" in res.stderr
    (tmp_path / "no.conf").write_text("ClusterName=none\n")
    res = _cli(*base, env=_env(SLURM_CONF=str(tmp_path / "no.conf")))
    assert res.returncode == 2 and "sbatch finds no SLURM controller here" in res.stderr, res.stderr
    unchecked = _cli(*base, "--no-submit", env=_env(SLURM_CONF=str(tmp_path / "no.conf")))
    assert unchecked.returncode == 0 and "not checked: sbatch finds no SLURM controller" in unchecked.stdout
    (tmp_path / "study.sbatch").unlink()
    for f in ("study.toml", "study.json", "slurm"):
        (tmp_path / f).unlink() if (tmp_path / f).is_file() else shutil.rmtree(tmp_path / f)
    res = _cli(*base, "--slurm-partition", "nosuch")
    assert res.returncode == 2
    assert _tasks("B") == {} and sorted(p.name for p in tmp_path.iterdir()) == ["bin", "no.conf"]  # nothing


def test_no_submit_writes_an_array_a_researcher_can_read_and_resubmit(tmp_path, corpus):
    res = _cli(*ARGS, "--data", str(corpus.path), "--out", str(tmp_path), "--run-id", "W", "--launcher", "slurm",
               "--no-submit", "--slurm-array-parallelism", "2", "--slurm-time", "0:30:00",
               "--slurm-extra", "--comment=routerbench-test --nice=10")
    assert res.returncode == 0, res.stderr
    text = (tmp_path / "study.sbatch").read_text()
    for line in ("#SBATCH --array=0-3%2", "#SBATCH --cpus-per-task=1", "#SBATCH --time=0:30:00",
                 "#SBATCH --requeue", "#SBATCH --comment=routerbench-test", "#SBATCH --nice=10",
                 "#SBATCH --job-name=rb-W", '--unit "$SLURM_ARRAY_TASK_ID" --threads 1 --estimate-steps 1'):
        assert line in text, line
    assert "sbatch --test-only accepted it" in res.stdout and "not submitted (--no-submit)" in res.stdout
    assert _tasks("W") == {} and not (tmp_path / "slurm.json").exists()


def test_a_study_on_slurm_survives_a_kill_a_cancel_and_a_requeue(tmp_path, corpus, sequential):
    root = tmp_path / "root"
    p = subprocess.Popen([sys.executable, "-m", "harness.cli", *ARGS, "--data", str(corpus.path), "--out", str(root),
                          "--run-id", "T", "--launcher", "slurm", "--wait"], cwd=tmp_path, env=_env(FAULTS),
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    slug_dirs = lambda name: list(root.glob(f"*/{name}"))  # noqa: E731
    acted: dict[str, str] = {}
    seen_missing: dict[int, str] = {}
    deadline = time.monotonic() + DEADLINE_S
    while p.poll() is None and time.monotonic() < deadline:
        job, tasks = _job_of(root), _tasks("T")
        for index, name, how in ((1, "T-L4-s0", "scancel"), (2, "T-L2-s1", "requeue")):
            if how in acted or tasks.get(index) != "RUNNING" or not any(_committed(d) for d in slug_dirs(name)):
                continue
            if how == "scancel":
                subprocess.run(["scancel", f"{job}_{index}"], check=True, timeout=30)
            else:  # requeued tasks wait for a begin time; let it start again at once
                subprocess.run(["scontrol", "requeue", f"{job}_{index}"], check=True, timeout=30)
                for _ in range(50):
                    if _tasks("T").get(index) == "PENDING":
                        break
                    time.sleep(0.1)
                subprocess.run(["scontrol", "update", f"JobId={job}_{index}", "BeginTime=now"], timeout=30)
            acted[how] = job
        time.sleep(0.2)
    out, _ = p.communicate(timeout=60)
    assert p.returncode == 1, out[-4000:]  # two units are not done
    assert set(acted) == {"scancel", "requeue"}, out[-4000:]
    assert "2 of 4 units are not done" in out
    status = CliRunner().invoke(main, ["status", str(root)])
    assert status.exit_code == 0, status.output
    for ln in status.output.splitlines():
        if ln.startswith("  unit "):
            seen_missing[int(ln.split()[1])] = ln
    assert "failed: 1 attempt" in seen_missing[1] and "failed: 1 attempt" in seen_missing[3], status.output
    assert " done " in seen_missing[0] and " done " in seen_missing[2]
    resubmit = next(ln for ln in status.output.splitlines() if ln.startswith("run:"))[len("run:"):].strip()
    assert resubmit == f"sbatch --array=1,3 {root / 'study.sbatch'}"
    subprocess.run(resubmit, shell=True, check=True, cwd=tmp_path, env=_env(), capture_output=True, timeout=60)
    while _tasks("T") and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _tasks("T") == {}
    again = CliRunner().invoke(main, ["status", str(root)])
    assert "units:      done 4" in again.output, again.output
    dirs = sorted(d for d in root.glob("*/T-L*-s*"))
    assert len(dirs) == 4
    keys = [(r["case_key"], r["metric"], r["repeat"]) for r in load_rows(dirs)]
    assert len(keys) == len(set(keys))  # nothing doubled
    assert _results(dirs) == _results([sequential])  # nothing lost, every loss bitwise
    requeued = (next(root.glob("*/T-L2-s1")) / UNIT_LOG).read_text()
    assert requeued.count(ATTEMPT_MARK) == 2 and "resumed at step" in requeued  # from its last evaluation
    cancelled = (next(root.glob("*/T-L4-s0")) / UNIT_LOG).read_text()
    assert "interrupted:" in cancelled and "resumed at step" in cancelled  # SIGTERM committed, then resumed
    report = _cli("study", "report", str(root))
    assert report.returncode == 0, report.stderr
    assert (root / "report" / "study.md").exists() and "not run" not in report.stdout and "not finished" not in report.stdout
