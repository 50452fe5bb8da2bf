"""``routerbench status RUN_DIR``: what is done, what is left, what failed, how to resume."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import click

from harness.rundir.progress import describe, read_progress
from harness.rundir.records import (ABORTED_DIR, PENDING_DIR, RECORDS_FILE, SPEC_FILE, aborted_summary,
                                    completed_cases, end_of_last_unit, iter_units, load_rows, lock_holder,
                                    read_jsonl)
from harness.training.config import TRAIN_MODES
from routers.errors import ConfigError

from . import SHORT_HELP
from ..spec import ProfileSpec, RunSpec, TrainSpec, load
from ..spec.base import tomllib
from ..spec.study import StudySpec
from .common import program, resume_command

SPECS = {"run": RunSpec, "train": TrainSpec, "profile": ProfileSpec, "study depth": StudySpec}


def expected_keys(command: str, spec_path: Path) -> tuple[list[str] | None, int]:
    """The case keys the spec will complete (None when they cannot be known here, e.g. a CUDA
    spec on a CPU machine) and the number of training runs on top of them."""
    try:
        spec, labels = load(SPECS[command], {}, str(spec_path))
        spec = spec.resolve(labels)
    except ConfigError:
        return None, 0
    if command == "run":
        n_train = len(spec.race_routers()) if spec.race.train else 0
        return [c.key for c in spec.cases()], n_train
    if command == "train":
        pilot = 1 if spec.training.target_from_pilot else 0
        return [], len(spec.routers.routers) * spec.training.seeds + pilot
    if command == "study depth":
        return [], len(spec.routers.routers) * len(spec.study.depths) * len(spec.study.seed_list)
    return [spec.case().key], 0


@click.command("status", short_help=SHORT_HELP["status"])
@click.argument("run_dir")
@click.option("--retry-failed", is_flag=True, default=False,
              help="On a study root: put units that failed twice into the command that runs what is missing.")
def status_cmd(run_dir, retry_failed) -> None:
    """Cases done and left, aborted units, the stage now, failure rows, and the command that resumes
    RUN_DIR. On a study root (`study depth --unit/--launcher`'s --out): each unit's state and the one
    command that runs only what is missing."""
    d = Path(run_dir)
    spec_path = d / SPEC_FILE
    from harness.training.units import read_index
    if d.is_dir() and not spec_path.exists() and (index := read_index(d)) is not None:
        study_status(d, index, retry_failed)
        return
    if not d.is_dir() or not (spec_path.exists() or (d / RECORDS_FILE).exists()):
        raise ConfigError(f"RUN_DIR: {d} is not a run directory (no {SPEC_FILE} or {RECORDS_FILE}) nor a study "
                          "root (no study.json); give results/<device>/<run-id>, or a study's --out")
    command = None
    if spec_path.exists():
        try:
            command = tomllib.loads(spec_path.read_text()).get("command")
        except tomllib.TOMLDecodeError:
            command = None
    done = completed_cases(d)
    results = load_rows([d])
    keys, n_train = expected_keys(command, spec_path) if command in SPECS else (None, 0)
    click.echo(f"run dir:   {d}")
    click.echo(f"command:   {command or 'unknown (no readable spec.toml)'}")
    statuses = Counter(done.values())
    if keys is not None:
        cost_done = sum(1 for k in keys if k in done)
        trained = {r["case_key"] for r in results if r.get("mode") in TRAIN_MODES}
        train_done = sum(1 for k in done if k in trained)
        total, n_done = len(keys) + n_train, cost_done + min(train_done, n_train)
        click.echo(f"cases:     {n_done} of {total} done, {total - n_done} left"
                   + (f" ({len(keys)} cost cases, {n_train} training runs)" if n_train else ""))
    else:
        total, n_done = None, len(done)
        click.echo(f"cases:     {n_done} done (the spec cannot be resolved on this machine to count the rest)")
    click.echo("statuses:  " + (", ".join(f"{s} {n}" for s, n in sorted(statuses.items())) or "none yet"))
    # training runs with evaluations committed but no verdict yet: key -> (step, its rows' columns)
    steps: dict[str, tuple[int, dict]] = {}
    for m, unit_rows in iter_units(d / RECORDS_FILE):
        seg = m.get("segment")
        if seg and seg["case"] not in done:
            cols = next((r for r in unit_rows if r.get("case_key") == seg["case"]), {})
            steps[seg["case"]] = (seg["step"], cols)
    for step, cols in steps.values():
        mode = cols.get("mode")
        at = f" L{cols.get('n_layers')}" if mode == "study" else ""
        click.echo(f"training:  {mode}{at} {cols.get('router')} seed {cols.get('seed')} at step {step}: "
                   "resumes from its checkpoint")
    ab = aborted_summary(d)
    click.echo(f"aborted:   {ab['units']} unit(s), {ab['rows']} row(s) in {d / ABORTED_DIR}")
    index = read_jsonl(d / ABORTED_DIR / "index.jsonl")
    if len(index) > 5:
        click.echo(f"           … {len(index) - 5} earlier unit(s), then:")
    for r in index[-5:]:
        click.echo(f"           {r.get('file')}: {r.get('rows')} rows, {r.get('reason')}")
    holder = lock_holder(d)
    click.echo("running:   " + (f"yes, pid {holder.get('pid')} on {holder.get('host')} since "
                                f"{holder.get('started')}" if holder else "no"))
    progress = read_progress(d)  # absent in older runs and in runs of other commands: no line
    if progress is not None:
        click.echo("progress:  " + describe(progress, holder))
    pending = sorted((d / PENDING_DIR).glob("*.jsonl")) if (d / PENDING_DIR).is_dir() else []
    if pending and not holder:
        rows = sum(len(read_jsonl(p)) for p in pending)
        click.echo(f"pending:   {len(pending)} unfinished unit(s), {rows} row(s), left by a process that "
                   f"died; moved to {ABORTED_DIR}/ when the run resumes")
    records = d / RECORDS_FILE
    if records.exists() and not holder:
        torn = records.stat().st_size - end_of_last_unit(records)
        if torn > 0:
            click.echo(f"torn tail: {torn} bytes after the last end marker of {RECORDS_FILE} (a commit cut "
                       f"short), never read as results; moved to {ABORTED_DIR}/ when the run resumes")
    failures = [r for r in results if r.get("status") in ("oom", "error")]
    if failures:
        click.echo(f"failures:  {len(failures)} row(s)")
        for r in failures[:20]:
            # one line per failure: an error's text may run over several (a CUDA error's hints)
            click.echo(f"  {r['status']:5s} {r.get('metric')}  {r.get('case_key')}\n        "
                       f"{' '.join(str(r.get('error')).split())}")
    if holder:
        click.echo("resume:    not now: the run is in progress; look again when it ends")
    elif command in SPECS and (total is None or n_done < total):
        slug = _device_slug(d)
        if slug and d.resolve().parent.name != slug:
            # a copied or moved run directory: run writes <out>/<device>/<run-id>, so the resume
            # command of this path would start a fresh run beside it
            home = d.resolve().parent / slug / d.name
            click.echo(f"resume:    not in place: a run lives at <out>/{slug}/<run-id> and this one's parent "
                       f"is not {slug}/; move it there first (mkdir -p {home.parent} && mv {d} {home.parent}/), "
                       f"then: {resume_command(command, home)}")
        else:
            click.echo(f"resume:    {resume_command(command, d)}")
    elif command in SPECS:
        click.echo("resume:    nothing left to do")


def study_status(root: Path, index: dict, retry_failed: bool) -> None:
    """One line per unit of the study at ``root`` (done / running (lock holder) / failed (attempts,
    the last line of its log) / not started), from the unit directories alone, then the command that
    runs only what is missing; a unit failed :data:`~harness.training.units.MAX_ATTEMPTS` times is
    left out of it unless ``retry_failed``."""
    from harness.training.units import MAX_ATTEMPTS, UNIT_LOG, unit_dirs, unit_state
    from .study_units import unit_command
    try:
        spec, labels = load(StudySpec, {}, str(root / index["spec"]))  # written resolved: its routers
        n_routers = len(spec.routers.routers or spec.resolve(labels).routers.routers)  # are all there
    except (ConfigError, OSError) as exc:
        raise ConfigError(f"RUN_DIR: {root / index['spec']} does not load ({exc}); it is the spec of every "
                          "unit of this study") from None
    from .study_slurm import SBATCH_FILE, queued, read_jobs
    jobs = read_jobs(root)
    queue = queued(index["study_id"]) if jobs else {}
    units = index["units"]
    click.echo(f"study root: {root}")
    click.echo(f"study:      {index['study_id']}, {len(units)} units (seeds outermost, then depths), "
               f"{n_routers} routers each")
    counts: Counter = Counter()
    missing, held_back = [], []
    for u in units:
        dirs = unit_dirs(root, u)
        states = [(dd, unit_state(dd, n_routers)) for dd in dirs] or [(None, unit_state(None, n_routers))]
        dd, st = next(((x, y) for x, y in states if y["state"] == "done"), states[0])
        counts[st["state"]] += 1
        where = f"  {dd.parent.name}/" if dd is not None else ""
        if st["state"] == "done":
            line = "done"
        elif st["state"] == "running":
            h = st["holder"] or {}
            line = (f"running: pid {h.get('pid')} on {h.get('host')} since {h.get('started')}"
                    + (" (lock-free: not verified)" if h.get("unverified") else ""))
        elif st["state"] == "failed":
            line = (f"failed: {st['attempts']} attempt{'s' * (st['attempts'] != 1)}, {st['done_runs']} of "
                    f"{n_routers} runs done; last line of {UNIT_LOG}: {st['last_line'] or '(empty)'}")
        else:
            line = "not started"
        slurm = (queue or {}).get(u.index)
        if slurm and st["state"] != "running":  # pending or requeued in the scheduler: not missing
            line, counts[st["state"]], counts["queued"] = f"{line}; queued: {slurm}", counts[st["state"]] - 1, \
                counts["queued"] + 1
        elif slurm:
            line += f" ({slurm})"
        click.echo(f"  unit {u.index:3d}  L{u.depth:<4d} seed {u.seed:<4d} {line}{where}")
        if st["state"] in ("failed", "not started") and not slurm:
            if st["state"] == "failed" and st["attempts"] >= MAX_ATTEMPTS and not retry_failed:
                held_back.append(u.index)
            else:
                missing.append(u.index)
    click.echo("units:      " + ", ".join(f"{k} {counts[k]}" for k in ("done", "running", "queued", "failed",
                                                                        "not started") if counts[k]))
    if jobs:
        now = sorted({v.split()[1] for v in (queue or {}).values()})
        click.echo(f"slurm:      submitted by routerbench: job{'s' * (len(jobs) != 1)} "
                   f"{', '.join(j['job_id'] for j in jobs)}; in the queue now: {', '.join(now) or 'none'}"
                   + ("; squeue could not be asked: queued tasks show as not started" if queue is None else ""))
    if held_back:
        click.echo(f"held back:  unit{'s' * (len(held_back) != 1)} {','.join(map(str, held_back))} failed "
                   f"{MAX_ATTEMPTS} times or more: left out below; read their {UNIT_LOG}, then add "
                   "--retry-failed to this command to include them")
    if missing and jobs:
        click.echo(f"run:        sbatch --array={','.join(map(str, missing))} {root / SBATCH_FILE}")
    elif missing:
        click.echo(f"run:        {unit_command(root, index['study_id'], missing, None, index.get('unit_flags', []))} "
                   "--launcher local")
    elif counts["running"] or counts["queued"]:
        click.echo("run:        nothing to start: the units left are running; look again when they end")
    elif not held_back:
        click.echo(f"run:        nothing left to do; merge with: {program()} study report {root}")


COMMANDS = (status_cmd,)


def _device_slug(d: Path) -> str | None:
    """The device folder name the run was written under (its manifest's ``device_slug``), or None."""
    import json
    try:
        env = json.loads((d / "manifest.json").read_text()).get("environment") or {}
    except (OSError, ValueError):
        return None
    return env.get("device_slug")
