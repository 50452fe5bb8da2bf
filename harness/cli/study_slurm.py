"""``routerbench study depth --launcher slurm``: the study's units as one SLURM job array.

It writes ``ROOT/study.sbatch``, a script a researcher can read, edit and resubmit: one array task
per unit, each running the unit's command (:func:`harness.cli.study_units.unit_argv`) with
``--unit $SLURM_ARRAY_TASK_ID``, its CPUs as its threads and its log under ``ROOT/slurm/``. Nothing
is pickled: a node needs routerbench and the study root (a shared file system), nothing more.
``sbatch --test-only`` checks the script first (an unknown partition, a refused time limit, account
or QoS is one line naming the ``--slurm-*`` option, exit 2, before anything is submitted); then it
is submitted (``--no-submit``: not), and ``--wait`` waits for the array to end and writes the
merged report.

Requeue and preemption: the script asks for ``--requeue``; SLURM's SIGTERM reaches routerbench
itself (the script ``exec``s it), which commits as any interrupted run does (exit 143), and a
requeued task runs the same unit again, resuming from its last committed evaluation. Every
submission is recorded in ``ROOT/slurm.json`` (job id, indices); ``routerbench status ROOT`` asks
``squeue`` for the study's tasks by the array's job name, so a resubmission by hand is seen too.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import click

from routers.errors import ConfigError

from .common import program

SBATCH_FILE = "study.sbatch"
JOBS_FILE = "slurm.json"
LOG_DIR = "slurm"
#: How often ``--wait`` asks squeue (seconds).
WAIT_POLL_S = 2.0
#: What sbatch says when no controller answers it (no cluster configured or reachable here).
NO_CONTROLLER = ("Unable to contact slurm controller", "Could not establish a configuration source",
                 "fetch_config", "resolve_ctls_from_dns_srv", "Zero Bytes were transmitted or received",
                 "Unable to process configuration file", "No SlurmctldHost")
#: Which option a line of ``sbatch --test-only``'s refusal points at (first match wins).
REFUSALS = (("partition", "slurm_partition"), ("time limit", "slurm_time"), ("account", "slurm_account"),
            ("qos", "slurm_qos"), ("gres", "slurm_gpus_per_task"), ("gpu", "slurm_gpus_per_task"),
            ("cpu", "slurm_cpus_per_task"), ("array", "slurm_array_parallelism"))


def sbatch_text(spec, root: Path, study_id: str, n_units: int, threads: int) -> str:
    """The job array script of the study (every option as an ``#SBATCH`` line)."""
    from .study_units import unit_argv
    la = spec.launch
    array = f"0-{n_units - 1}" + (f"%{la.slurm_array_parallelism}" if la.slurm_array_parallelism else "")
    gpus = la.slurm_gpus_per_task
    if gpus is None and str(spec.output.device).startswith("cuda"):
        gpus = 1
    lines = [f"--job-name={job_name(study_id)}", f"--array={array}", f"--output={root / LOG_DIR}/%x-%A_%a.out",
             f"--cpus-per-task={threads}", "--ntasks=1", "--requeue", "--open-mode=append"]
    lines += [f"--partition={la.slurm_partition}"] if la.slurm_partition else []
    lines += [f"--gpus-per-task={gpus}"] if gpus else []
    lines += [f"--time={la.slurm_time}"] if la.slurm_time else []
    lines += [f"--account={la.slurm_account}"] if la.slurm_account else []
    lines += [f"--qos={la.slurm_qos}"] if la.slurm_qos else []
    lines += shlex.split(la.slurm_extra or "")
    from .study_units import unit_flags
    argv = unit_argv(root, study_id, [0], threads, unit_flags(spec))
    if argv[0] == "routerbench":  # the nodes run this very installation, by its absolute path
        argv[0] = shutil.which("routerbench") or argv[0]
    i = argv.index("--unit")
    command = shlex.join(argv[:i + 1]) + ' "$SLURM_ARRAY_TASK_ID" ' + shlex.join(argv[i + 2:])
    return "\n".join([
        "#!/bin/bash",
        f"# routerbench study {study_id}: one array task per unit (seed outermost, then depth); written by",
        f"# `routerbench study depth --launcher slurm`. Resubmit some units: sbatch --array=3,5 {root / SBATCH_FILE}",
        *[f"#SBATCH {ln}" for ln in lines],
        "",
        "# SLURM's SIGTERM (scancel, preemption, the time limit) reaches routerbench itself, which commits",
        "# what it measured and exits 143; a requeued task resumes the unit from its last evaluation.",
        f"export OMP_NUM_THREADS={threads} MKL_NUM_THREADS={threads}",
        f"exec {command}", ""])


def _sbatch() -> str:
    exe = shutil.which("sbatch")
    if exe is None:
        raise ConfigError("--launcher slurm: no sbatch on PATH here; run this on a SLURM login node (or "
                          "scripts/slurm_local.sh for a one-node cluster), or use --launcher local")
    return exe


def _refusal(spec, labels, text: str) -> ConfigError:
    """One line naming the option that ``sbatch --test-only``'s refusal ``text`` points at."""
    line = _first_error(text)
    low = line.lower()
    opt = next((o for word, o in REFUSALS if word in low), None)
    given = getattr(spec.launch, opt) if opt else None
    what = f"{labels('launch.' + opt)} {given}" if opt and given is not None else \
        (labels("launch." + opt) if opt else "the --slurm-* options or --slurm-extra")
    return ConfigError(f"{what}: sbatch --test-only refused the study's array ({line}); change it "
                       f"(sinfo lists partitions and their limits; sbatch names the first thing it refuses)")


def launch_slurm(spec, labels, root: Path, study_id: str, units: list, indices: list[int] | None) -> None:
    """Check the study's array with ``sbatch --test-only``, then write the study root
    (:func:`harness.cli.study_units.prepare_root`) and ``ROOT/study.sbatch``, submit it (all units, or
    ``indices``) and record the job in ``ROOT/slurm.json``; with ``--wait``, wait for it and write
    the merged report.

    Raises:
        ConfigError: no ``sbatch`` on PATH, or no controller answering it (``--no-submit`` writes the
            script unchecked instead); ``sbatch --test-only`` refuses the script (naming the
            ``--slurm-*`` option it complained of first). Nothing is written or submitted then.
        SystemExit: 1 when ``--wait`` saw units left undone (``routerbench status ROOT`` names them).
    """
    from .study_units import prepare_root
    la = spec.launch
    exe = _sbatch() if la.submit is not False else shutil.which("sbatch")
    threads = la.threads or la.slurm_cpus_per_task or 1
    text = sbatch_text(spec, root, study_id, len(units), threads)
    array = _array_arg(indices, la.slurm_array_parallelism)
    checked = "not checked: no sbatch on PATH here (a login node's `sbatch --test-only` checks it)"
    if exe is not None:
        with tempfile.TemporaryDirectory() as tmp:
            (Path(tmp) / SBATCH_FILE).write_text(text)
            test = subprocess.run([exe, "--test-only", *array, str(Path(tmp) / SBATCH_FILE)], capture_output=True,
                                  text=True, timeout=60)
        said = test.stderr + test.stdout
        if test.returncode != 0 and any(w in said for w in NO_CONTROLLER):
            if la.submit is not False:
                raise ConfigError(f"{labels('launch.launcher')} slurm: sbatch finds no SLURM controller here "
                                  f"({_first_error(said)}); run this on a login node, or give --no-submit to "
                                  "write the array unchecked")
            checked = f"not checked: sbatch finds no SLURM controller here ({_first_error(said)})"
        elif test.returncode != 0:
            raise _refusal(spec, labels, said)
        else:
            checked = f"sbatch --test-only accepted it: {(test.stderr.strip().splitlines() or [''])[-1]}"
    prepare_root(spec, labels, root, study_id, units)
    (root / LOG_DIR).mkdir(parents=True, exist_ok=True)
    path = root / SBATCH_FILE
    tmp_path = path.with_suffix(f".sbatch.{os.getpid()}.tmp")
    tmp_path.write_text(text)
    tmp_path.replace(path)
    click.echo(f"wrote {path} ({len(units)} unit{'s' * (len(units) != 1)}, {threads} CPU{'s' * (threads != 1)} "
               f"each); {checked}")
    if la.submit is False:
        click.echo(f"not submitted (--no-submit); submit with: {shlex.join(['sbatch', *array, str(path)])}")
        return
    job = submit(root, array, indices)
    click.echo(f"submitted job array {job} ({len(indices) if indices is not None else len(units)} tasks); "
               f"`{program()} status {root}` shows each unit with its SLURM state")
    if la.wait:
        click.echo(f"waiting for job {job} to end (squeue --name={job_name(study_id)}) ...")
        wait_for(study_id)
        from .study_units import finish_report
        if not finish_report(spec, root, study_id):
            raise SystemExit(1)


def _first_error(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return next((ln for ln in lines if "error" in ln.lower()), lines[-1] if lines else "no reason given")


def _array_arg(indices: list[int] | None, parallelism: int | None) -> list[str]:
    if indices is None:
        return []
    return [f"--array={','.join(map(str, indices))}" + (f"%{parallelism}" if parallelism else "")]


def submit(root: Path, array: list[str], indices: list[int] | None) -> str:
    """Submit ``ROOT/study.sbatch`` (``array``: an ``--array=`` overriding the script's) and append
    the job to ``ROOT/slurm.json``; returns the job id.

    Raises:
        ConfigError: sbatch refused it (its message in one line).
    """
    res = subprocess.run([_sbatch(), "--parsable", *array, str(root / SBATCH_FILE)], capture_output=True,
                         text=True, timeout=120)
    if res.returncode != 0:
        raise ConfigError(f"sbatch refused {root / SBATCH_FILE}: {' '.join(res.stderr.split()) or res.returncode}")
    job = res.stdout.strip().split(";")[0]
    jobs = read_jobs(root)
    jobs.append({"job_id": job, "indices": indices, "submitted": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
    tmp = root / f"{JOBS_FILE}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(jobs, indent=2))
    tmp.replace(root / JOBS_FILE)
    return job


def read_jobs(root: Path) -> list[dict]:
    """Every submission recorded in ``ROOT/slurm.json`` (oldest first); [] when none."""
    try:
        return json.loads((Path(root) / JOBS_FILE).read_text())
    except (OSError, ValueError):
        return []


def job_name(study_id: str) -> str:
    """The array's ``--job-name``, by which ``squeue`` finds every submission of the study (a
    resubmission by hand included)."""
    return f"rb-{study_id}"


def queued(study_id: str) -> dict[int, str] | None:
    """Array index -> ``job JOB_INDEX STATE`` of the study's tasks ``squeue`` still knows (pending,
    running, requeued); None when squeue cannot be asked (not on PATH, no controller)."""
    if shutil.which("squeue") is None:
        return None
    # %i: an array task's own name, ARRAY_INDEX (%A would be the task's job id, not the array's)
    res = subprocess.run(["squeue", "-h", "-r", f"--name={job_name(study_id)}", "-o", "%i %T"],
                         capture_output=True, text=True, timeout=60)
    if res.returncode != 0:
        return None
    out = {}
    for line in res.stdout.splitlines():
        parts = line.split()
        if len(parts) == 2 and (m := re.fullmatch(r"(\d+)_(\d+)", parts[0])):
            out[int(m.group(2))] = f"job {parts[0]} {parts[1]}"
    return out


def wait_for(study_id: str) -> None:
    """Return when ``squeue`` knows no task of the study (a requeued task is still one).

    Raises:
        ConfigError: squeue could not be asked for a minute on end (the controller is down).
    """
    failed_since = None
    while True:
        q = queued(study_id)
        if q == {}:
            return
        if q is None:
            failed_since = failed_since or time.monotonic()
            if time.monotonic() - failed_since > 60:
                raise ConfigError(f"--wait: squeue has not answered for a minute; the array goes on without "
                                  f"this command: `{program()} status` on the study root follows it")
        else:
            failed_since = None
        time.sleep(WAIT_POLL_S)
