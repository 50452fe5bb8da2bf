"""``routerbench study depth`` as units: ``--units`` (print them), ``--unit I[,J]`` (run them here)
and ``--launcher local`` (run them in parallel worker processes), over the layout of
:mod:`harness.training.units`.

Every unit runs the same command, ``routerbench study depth --config ROOT/study.toml --out ROOT
--run-id STUDY --unit I --threads N``, whoever starts it (a shell, ``xargs -P``, the local
launcher, a scheduler), so a unit's rows are the same whichever ran it: with equal thread counts
they are bitwise those of the same seed and depth in a one-process study.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import click

from harness.rundir.environment import device_slug, new_run_id
from harness.training.units import (MAX_ATTEMPTS, STUDY_INDEX, STUDY_SPEC, Unit, default_threads, read_index,
                                    study_units, torch_threads, unit_dirs, unit_log, unit_state, write_index)
from routers.errors import ConfigError

from ..spec.base import to_toml
from .common import DEFAULT_OUT, Interrupted, interruptible, program, spec_difference

#: How often the local launcher looks at its workers (seconds).
POLL_S = 0.2


def study_root(spec, labels) -> tuple[Path, str, list[Unit]]:
    """The study root (``--out``), the study id (``--run-id``, else a new one) and every unit, after
    :func:`prepare_root` wrote or checked ``study.toml`` and ``study.json``."""
    root, study_id, units = plan_root(spec)
    prepare_root(spec, labels, root, study_id, units)
    return root, study_id, units


def plan_root(spec) -> tuple[Path, str, list[Unit]]:
    """The study root (``--out``, made absolute: the units' commands run from anywhere), the study
    id (``--run-id``, else a new one) and every unit; nothing is written."""
    root = Path(spec.output.out or DEFAULT_OUT).absolute()
    study_id = spec.output.run_id or new_run_id()
    return root, study_id, study_units(spec.study.seed_list, spec.study.depths, study_id)


def run_here(spec, labels, root: Path, units: list[Unit], device) -> None:
    """``--unit I,J`` without a launcher: train each unit in this process, one after another, each
    into its own run directory with its output also in its ``unit.log``."""
    from .study_train import train_study
    from .train import load_corpus
    corpus = load_corpus(spec.study.data, labels("study.data"))
    threads = spec.launch.threads or default_threads()
    for u in units:
        with torch_threads(threads), unit_log(root / device_slug(device) / u.run_id, u, threads):
            train_study(spec, labels, corpus, device, threads, time.perf_counter(), unit=u)


def prepare_root(spec, labels, root: Path, study_id: str, units: list[Unit]) -> None:
    """Write ``ROOT/study.toml`` and ``ROOT/study.json`` (atomically; the same bytes from every
    unit), or check that the ones there are this study's.

    Raises:
        ConfigError: ``--out`` holds another study (another id, or options that change a result),
            naming the option and the file; ``--out`` cannot be written.
    """
    index = read_index(root)
    if index is not None and index.get("study_id") != study_id:
        raise ConfigError(f"{labels('output.out')} {root} holds study {index.get('study_id')} "
                          f"({root / STUDY_INDEX}), not {study_id}: give {labels('output.run_id')} "
                          f"{index.get('study_id')} to add to it, or another {labels('output.out')}")
    path = root / STUDY_SPEC
    if path.exists():
        diff = spec_difference(spec, path)
        if diff:
            raise ConfigError(f"{labels('output.out')} {root}: study {study_id} was started with {diff[0]} = "
                              f"{json.dumps(diff[1])}, not {json.dumps(diff[2])}; run its units with --config "
                              f"{path}, or choose another {labels('output.out')}")
    try:
        root.mkdir(parents=True, exist_ok=True)
        if not path.exists():
            from routers import plugins
            text = (f"# routerbench study depth, study {study_id}: the spec of every unit\n"
                    f"# each unit I runs: {unit_command(root, study_id, [0], None).replace('--unit 0', '--unit I')}\n"
                    + to_toml(spec, spec.NOT_IN_FILE, plugins.records()))
            tmp = path.with_suffix(f".toml.{os.getpid()}.tmp")
            tmp.write_text(text, encoding="utf-8")
            tmp.replace(path)
        if index is None:
            write_index(root, study_id, units, unit_flags(spec))
    except OSError as exc:
        raise ConfigError(f"{labels('output.out')}: cannot write {root} ({exc.strerror or exc}); give a "
                          "writable directory") from None


def unit_flags(spec) -> list[str]:
    """The options of this command that every unit's command must carry though no file holds
    them: ``--estimate-steps`` and ``--lock-free``."""
    return ["--estimate-steps", str(spec.study.estimate_steps)] + (["--lock-free"] if spec.launch.lock_free else [])


def unit_argv(root: Path, study_id: str, indices: list[int], threads: int | None,
              flags: list[str] | tuple[str, ...] = ()) -> list[str]:
    """The command that runs ``indices`` of the study at ``root``, as an argument list; ``flags``:
    :func:`unit_flags` of the command that made the study."""
    argv = [*shlex.split(program()), "study", "depth", "--config", str(root / STUDY_SPEC), "--out", str(root),
            "--run-id", study_id, "--unit", ",".join(map(str, indices))]
    return argv + (["--threads", str(threads)] if threads else []) + list(flags)


def unit_command(root: Path, study_id: str, indices: list[int], threads: int | None,
                 flags: list[str] | tuple[str, ...] = ()) -> str:
    """:func:`unit_argv` as one shell line."""
    return shlex.join(unit_argv(root, study_id, indices, threads, flags))


def unit_estimates(spec, vocab: int, device) -> dict[tuple[int, int], tuple[float, float]]:
    """``(depth, seed)`` -> the plan's range of seconds for that unit on ``device`` (set-up, steps,
    evaluations of every router; the plan's assumed step times, uncalibrated; no model built)."""
    from harness.costs import forecast as fc
    from harness.training.forecast import PlannedRun, run_seconds
    from .forecast import _device_name
    out = {}
    for depth in spec.study.depths:
        tc = spec.train_config(depth)
        span = (0.0, 0.0)
        for r, o in spec.options_at(depth).items():
            span = fc.add(span, *run_seconds(PlannedRun(r, o, tc, tc.max_steps), vocab, device.type,
                                             _device_name(device)).values())
        for seed in spec.study.seed_list:
            out[(depth, seed)] = span
    return out


def print_units(spec, labels, root: Path, study_id: str, units: list[Unit], device, fmt: str) -> None:
    """``--units json|commands``: every unit with its exact command, its directory on this device
    and its share of the plan's estimate."""
    from harness.costs.forecast import fmt_span
    from .forecast import corpus_vocab
    threads = spec.launch.threads or default_threads()
    est = unit_estimates(spec, corpus_vocab(spec.study.data, labels("study.data")), device)
    slug = device_slug(device)
    rows = [{"index": u.index, "depth": u.depth, "seed": u.seed, "run_id": u.run_id,
             "dir": str(root / slug / u.run_id), "command": unit_command(root, study_id, [u.index], threads, unit_flags(spec)),
             "estimate_s": list(est[(u.depth, u.seed)])} for u in units]
    if fmt == "json":
        click.echo(json.dumps({"study_id": study_id, "root": str(root), "spec": str(root / STUDY_SPEC),
                               "threads": threads, "units": rows}, indent=2))
        return
    total = (sum(r["estimate_s"][0] for r in rows), sum(r["estimate_s"][1] for r in rows))
    click.echo(f"# study {study_id}: {len(rows)} unit{'s' * (len(rows) != 1)} (seeds outermost, then depths), {threads} thread"
               f"{'s' * (threads != 1)} each; estimate {fmt_span(total)} in all on {slug} (the plan's "
               "assumed step times, uncalibrated)")
    for r in rows:
        click.echo(f"# unit {r['index']}: L{r['depth']} seed {r['seed']} -> {r['dir']}, "
                   f"estimate {fmt_span(tuple(r['estimate_s']))}")
        click.echo(r["command"])


def _gpus() -> list[str]:
    """The GPUs this process sees, as ``CUDA_VISIBLE_DEVICES`` entries (ids or UUIDs)."""
    import torch
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    return visible[:n] if visible else [str(i) for i in range(n)]


def worker_env(worker: int, gpus: list[str], threads: int) -> dict[str, str]:
    """The environment of local worker ``worker``: this one with its threads and, given ``gpus``
    (``CUDA_VISIBLE_DEVICES`` entries), that worker's GPU alone, which it sees as ``cuda:0``."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    if gpus:
        env["CUDA_VISIBLE_DEVICES"] = gpus[worker]
    return env


def launch_local(spec, labels, root: Path, study_id: str, units: list[Unit], device) -> None:
    """``--launcher local``: run ``units`` in worker processes here, one per visible GPU
    (``CUDA_VISIBLE_DEVICES`` set per worker) or ``--workers`` on a CPU; a line per unit as it ends.
    Units done already are skipped. The merged report is written to ``ROOT/report`` when every
    unit of the study is done (``--no-report``: not).

    Raises:
        ConfigError: more workers than visible GPUs; a CUDA device with an index.
        SystemExit: 1 when a unit failed (``routerbench status ROOT`` names it and the command that
            reruns what is missing); 130/143 when interrupted (the workers are stopped with SIGTERM
            and commit as an interrupted run does).
    """
    la = spec.launch
    gpus = _gpus() if device.type == "cuda" else []
    if device.type == "cuda" and device.index not in (None, 0):
        raise ConfigError(f"{labels('output.device')} {device}: the local launcher gives each worker its own "
                          f"GPU (CUDA_VISIBLE_DEVICES); give {labels('output.device')} cuda")
    workers = la.workers or (len(gpus) if gpus else 2)
    if gpus and workers > len(gpus):
        raise ConfigError(f"{labels('launch.workers')} {workers}: {len(gpus)} GPU{'s' * (len(gpus) != 1)} visible "
                          f"here, one worker per GPU; give {labels('launch.workers')} {len(gpus)} or fewer")
    threads = la.threads or default_threads(workers)
    slug = device_slug(device)
    n_routers = len(spec.routers.routers)
    queue = []
    for u in units:
        if unit_state(root / slug / u.run_id, n_routers)["state"] == "done":
            click.echo(f"{u.label()}: done already, skipped")
        else:
            queue.append(u)
    where = f"{len(gpus)} GPU{'s' * (len(gpus) != 1)}" if gpus else "CPU"
    click.echo(f"launcher local: {len(queue)} unit{'s' * (len(queue) != 1)} of study {study_id} on {workers} "
               f"worker{'s' * (workers != 1)} ({where}), {threads} thread{'s' * (threads != 1)} each; "
               f"each unit's output in <unit dir>/unit.log under {root / slug}")
    running: dict[int, tuple[subprocess.Popen, Unit, float, object]] = {}
    failed, done = [], 0
    total = len(queue)
    try:
        with interruptible():
            while queue or running:
                for w in range(workers):
                    if w not in running and queue:
                        u = queue.pop(0)
                        env = worker_env(w, gpus, threads)
                        err = tempfile.TemporaryFile(mode="w+", encoding="utf-8")
                        # its own session: a terminal's ^C reaches the launcher alone, which stops
                        # each worker with one SIGTERM (an interrupt it commits through)
                        p = subprocess.Popen(unit_argv(root, study_id, [u.index], threads, unit_flags(spec)), env=env,
                                             stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
                        running[w] = (p, u, time.perf_counter(), err)
                for w, (p, u, t0, err) in list(running.items()):
                    if p.poll() is None:
                        continue
                    del running[w]
                    took = time.perf_counter() - t0
                    state = unit_state(root / slug / u.run_id, n_routers)
                    if p.returncode == 0 and state["state"] == "done":
                        done += 1
                        click.echo(f"[{done + len(failed)}/{total}] {u.label()}: done in {took:.0f} s "
                                   f"(worker {w})")
                    else:
                        err.seek(0)
                        tail = [ln for ln in err.read().splitlines() if ln.strip()]
                        last = state["last_line"] or (tail[-1] if tail else "")
                        failed.append(u)
                        click.echo(f"[{done + len(failed)}/{total}] {u.label()}: FAILED (exit {p.returncode}) "
                                   f"after {took:.0f} s (worker {w}): {last}")
                    err.close()
                time.sleep(POLL_S)
    except Interrupted as exc:
        for p, *_ in running.values():
            p.send_signal(signal.SIGTERM)
        for p, *_ in running.values():
            p.wait()
        click.echo(f"\ninterrupted: {done} of {total} units done; `{program()} status {root}` says what is left "
                   "and the command that runs it", err=True)
        raise SystemExit(128 + exc.signum) from None
    if failed:
        click.echo(f"{len(failed)} unit{'s' * (len(failed) != 1)} failed "
                   f"({', '.join(str(u.index) for u in failed)}): `{program()} status {root}` names "
                   f"{'them' if len(failed) > 1 else 'it'} and the command that reruns what is missing "
                   f"(a unit failed {MAX_ATTEMPTS} times is left out unless --retry-failed)", err=True)
        raise SystemExit(1)
    finish_report(spec, root, study_id)


def finish_report(spec, root: Path, study_id: str) -> bool:
    """After a launcher: write the merged report to ``ROOT/report`` when every unit of the study is
    done (and ``--report`` is on), else say how many are not; returns whether every unit is done."""
    n_routers = len(spec.routers.routers)
    units = study_units(spec.study.seed_list, spec.study.depths, study_id)
    n_done = sum(any(unit_state(d, n_routers)["state"] == "done" for d in unit_dirs(root, u)) for u in units)
    if n_done < len(units):
        click.echo(f"{len(units) - n_done} of {len(units)} units are not done: `{program()} status {root}` names "
                   f"them and the command that runs them; `{program()} study report {root}` merges what is done")
        return False
    if spec.output.report:
        from reports.study_merge import write_merged
        paths, text = write_merged([root], root / "report")
        click.echo(text)
        click.echo("study report: " + ", ".join(str(paths[k]) for k in ("study.md", "study.html") if k in paths))
    return True
