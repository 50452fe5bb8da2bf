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
from .common import resume_command

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
        return [], len(spec.routers.routers) * len(spec.study.depths) * spec.study.seeds
    return [spec.case().key], 0


@click.command("status", short_help=SHORT_HELP["status"])
@click.argument("run_dir")
def status_cmd(run_dir) -> None:
    """Cases done and left, aborted units, the stage now, failure rows, and the command that resumes
    RUN_DIR."""
    d = Path(run_dir)
    spec_path = d / SPEC_FILE
    if not d.is_dir() or not (spec_path.exists() or (d / RECORDS_FILE).exists()):
        raise ConfigError(f"RUN_DIR: {d} is not a run directory (no {SPEC_FILE} or {RECORDS_FILE}); "
                          "give results/<device>/<run-id>")
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


COMMANDS = (status_cmd,)


def _device_slug(d: Path) -> str | None:
    """The device folder name the run was written under (its manifest's ``device_slug``), or None."""
    import json
    try:
        env = json.loads((d / "manifest.json").read_text()).get("environment") or {}
    except (OSError, ValueError):
        return None
    return env.get("device_slug")
