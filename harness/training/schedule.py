"""Which training runs advance together, and the loop that drives them (MEASUREMENT.md, "Time to
target loss": routers trained one after the other on a shared machine see different load).

- ``interleaved``: the runs of one seed live in one process and advance in turns of ``--chunk K``
  steps, each clock counting only its own steps, so a load spike on the machine falls on every
  router of the seed alike. It holds every run of the seed in memory at once.
- ``sequential``: one run after the other (what fits when the interleaved group does not).
- ``auto`` (the default): ``interleaved`` when the estimate of :func:`estimate_run_bytes` summed
  over the group is at most :data:`MEMORY_FRACTION` of the free memory of the device, else
  ``sequential``. The manifest records the choice and the estimate.

The schedule changes no number but time: a run's data order, initial weights and RNG states are
its own, so both schedules give bitwise-equal loss curves on a CPU with a fixed thread count
(tested).

Under ``torchrun`` (:mod:`harness.training.distributed`) every rank runs the same loop over the same runs:
each run of an interleaved group has its own DDP model (its own gradient buckets, one process
group shared by all), and the ranks issue their collectives in the same order because every
decision that could differ is taken on rank 0 and broadcast (the schedule, :func:`choose_schedule`;
what is already done; the resume point) or is computed from values averaged over ranks (when a
run ends). Only rank 0 writes rows and checkpoints. A run that fails on one rank (an error, an
OOM) cannot be dropped alone while the other ranks wait in its collectives: under DDP a failure
ends the command (rank 0 records it first when it is rank 0's), and torchrun stops the other ranks.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from pathlib import Path
from typing import Iterable

import click
import torch

from harness.costs.estimate import decoder_parameter_count, estimate_bytes
from harness.costs.memory import available_bytes
from harness.rundir.records import RECORDS_FILE, iter_units
from harness.step.backends import compiles, one_dynamo_cache

from . import distributed
from .checkpoint import checkpoint_dir, save_checkpoint, save_final_weights
from .config import train_unavailable_reason
from .run import TrainRun

SCHEDULES = ("auto", "interleaved", "sequential")
#: Share of the device's free memory an interleaved group may be estimated to take.
MEMORY_FRACTION = 0.5
#: Without a progress bar (stderr not a terminal), a line of progress at most this often (s).
PROGRESS_EVERY_S = 30.0


def parameter_count(run: TrainRun) -> int:
    """Parameters of ``run``'s decoder (:func:`harness.costs.estimate.decoder_parameter_count`)."""
    return decoder_parameter_count(run.cfg, run.router, run.options)


def estimate_run_bytes(run: TrainRun) -> int:
    """Estimated peak memory of one training run on one device (one rank under DDP), in bytes (an
    estimate, stated as such; :func:`harness.costs.estimate.estimate_bytes`)."""
    return sum(estimate_bytes(run.cfg, run.router, run.options, run.tc.precision, run.tc.grad_accum,
                              run.world_size).values())


def choose_schedule(schedule: str, group: list[TrainRun], device: torch.device) -> dict:
    """Resolve ``auto`` for a group (the runs of one seed).

    Under DDP the decision is rank 0's, sent to every rank (each rank reads its own free memory,
    and all must follow the same schedule); on a CPU the ranks of a host share its memory, so the
    group's estimate counts every local rank.

    Returns:
        the manifest entry: ``schedule`` (``interleaved`` or ``sequential``), ``requested``,
        ``estimate_bytes`` (per run, per rank), ``group_bytes``, ``available_bytes``, ``fraction``
        and ``reason``.
    """
    decision = None
    if distributed.is_main():
        decision = _choose_schedule(schedule, group, device)
    return distributed.broadcast_object(decision)


def _choose_schedule(schedule: str, group: list[TrainRun], device: torch.device) -> dict:
    per_run = {r.router: estimate_run_bytes(r) for r in group}
    sharing = 1
    if device.type == "cpu" and distributed.world_size() > 1:
        sharing = int(os.environ.get("LOCAL_WORLD_SIZE", distributed.world_size()))
    need, free = sharing * sum(per_run.values()), available_bytes(device)
    fits = need <= MEMORY_FRACTION * free
    chosen = schedule if schedule != "auto" else ("interleaved" if fits else "sequential")
    gib = 2 ** 30
    runs = f"the {len(group)} runs of a seed need" if len(group) != 1 else "the run of a seed needs"
    if sharing > 1:
        runs += f" (on each of {sharing} processes)"
    estimate = f"{runs} an estimated {need / gib:.2f} GiB together, {free / gib:.1f} GiB free on {device}"
    reason = (f"requested; {estimate}" if schedule != "auto" else
              f"auto: {estimate} ({'fits' if fits else 'does not fit'} in {MEMORY_FRACTION:.0%} of it)")
    return {"schedule": chosen, "requested": schedule, "estimate_bytes": per_run, "group_bytes": need,
            "available_bytes": free, "fraction": MEMORY_FRACTION, "reason": reason}


class Trainer:
    """Drives training runs against a run directory: resume points, checkpoints, commits, and
    errors that end one run while the others go on.

    Args:
        writer: the run's :class:`harness.rundir.writer.RunWriter` (or a null writer on ranks ≠ 0, which
            also print nothing: rank 0 speaks for all).
        run_dir: the run directory (checkpoints live in ``checkpoints/``).
        device: where runs train.
        quiet: no progress bar (without ``quiet``, a terminal gets a bar, a log a line of each
            run's step and loss at most every :data:`PROGRESS_EVERY_S` seconds).
        label: how the terminal lines start (``train``, ``pilot``, ``smoke race``).
    """

    def __init__(self, writer, run_dir: Path, device: torch.device, quiet: bool = False,
                 label: str = "train") -> None:
        self.writer, self.run_dir, self.device, self.quiet, self.label = writer, Path(run_dir), device, quiet, label
        self.segments: dict[str, int] = {}  # run key -> step of its last committed evaluation
        self.main = distributed.is_main()
        for marker, _ in iter_units(self.run_dir / RECORDS_FILE) if self.main else ():
            seg = marker.get("segment")
            if seg:
                self.segments[seg["case"]] = max(seg["step"], self.segments.get(seg["case"], -1))
        self.bar = None
        self._said = time.monotonic()  # when the last progress line was printed (no bar)
        self._live: list[TrainRun] = []  # the runs of the group in progress

    def done(self, run: TrainRun) -> bool:
        """Whether ``run`` is complete in the records (rank 0's answer, on every rank)."""
        return distributed.broadcast_object(run.key in self.writer.completed)

    def _echo(self, run: TrainRun, text: str, err: bool = False) -> None:
        if not self.main:
            return
        msg = f"{self.label} {run.router} seed {run.seed}: {text}"
        (self.bar.write if self.bar is not None and not err else lambda m: click.echo(m, err=err))(msg)

    # --- the callback of every evaluation ---------------------------------------------------
    def on_eval(self, run: TrainRun) -> None:
        """Commit the evaluation's rows (with the run's final rows when it ended); checkpoint a
        run that goes on before its rows are committed, and delete the older checkpoint after."""
        ev = run.evals[-1]
        rows = run.eval_rows(ev)
        ckpt_dir = checkpoint_dir(self.run_dir, run.key)
        if run.done:
            with self.writer.unit([run.key], kind="train") as u:
                for r in rows + run.final_rows():
                    u.write(**r)
                u.commit({run.key: run.status})
            if self.main:  # rank 0 owns the files (a shared file system is assumed)
                # the run's last weights stay for `routerbench diagnose`; its resume state goes
                final = save_final_weights(run, self.run_dir) if run.status != "diverged" else None
                for p in ckpt_dir.glob("*"):
                    if p != final:
                        p.unlink()
                with contextlib.suppress(OSError):
                    ckpt_dir.rmdir()  # a diverged run keeps nothing
                    ckpt_dir.parent.rmdir()
            self._echo(run, run.summary())
        else:
            keep = save_checkpoint(run, self.run_dir) if self.writer.records is not None else None
            with self.writer.unit([], kind="train_segment") as u:
                for r in rows:
                    u.write(**r)
                if run.fault == ("kill_in_eval", len(run.evals) - 1):
                    os.kill(os.getpid(), signal.SIGKILL)  # the test hook: checkpoint and rows staged
                u.commit(extra={"segment": {"case": run.key, "step": ev.step}})
            self.segments[run.key] = ev.step
            for old in ckpt_dir.glob("step-*.pt") if keep is not None else ():
                if old != keep:
                    old.unlink()
        if self.bar is not None and not self.bar.disable:
            self.bar.update(ev.step - self._shown.get(run.key, ev.step))
            self._shown[run.key] = ev.step
            self.bar.set_postfix_str(f"{run.router} s{run.seed} val {ev.val_loss:.3f}")
        elif not run.done and not self.quiet and self.main and time.monotonic() - self._said >= PROGRESS_EVERY_S:
            # no bar (stderr is not a terminal: a log, CI): a line at most every PROGRESS_EVERY_S,
            # of every run of the group still training (an interleaved group advances together)
            self._said = time.monotonic()
            live = [r for r in self._live if not r.done and r.evals] or [run]
            click.echo(f"{self.label}: " + "; ".join(
                f"{r.router} seed {r.seed} step {r.evals[-1].step} of {r.stop_step}, val loss "
                f"{r.evals[-1].val_loss:.3f} nats, {r.clock:.0f} s on its clock" for r in live))

    # --- starting and failing ----------------------------------------------------------------
    def resume_point(self, run: TrainRun) -> Path | None:
        """The checkpoint to resume ``run`` from (that of its last committed evaluation), or None
        to start afresh; stale checkpoints (written, never committed) are deleted.

        Raises:
            FileNotFoundError: evaluations were committed but their checkpoint is gone.
        """
        step = self.segments.get(run.key)
        d = checkpoint_dir(self.run_dir, run.key)
        keep = d / f"step-{step:08d}.pt" if step is not None else None
        for p in d.glob("step-*"):
            if p != keep:
                p.unlink()
        if keep is not None and not keep.exists():
            raise FileNotFoundError(f"evaluations up to step {step} are recorded but their checkpoint "
                                    f"{keep} is gone: the run cannot resume without doubling rows")
        return keep

    def start(self, run: TrainRun) -> bool:
        """Set ``run`` up (from its checkpoint if one is due); False when it ended with a row.

        Under DDP the resume point is rank 0's, and every rank loads that checkpoint (the run
        directory must be on a file system every rank sees)."""
        why = train_unavailable_reason(run.tc.backend, self.device)
        if why:
            self.fail(run, status="skipped", message=why)
            return False
        ckpt, err = None, None
        if self.main:
            try:
                ckpt = self.resume_point(run)
            except Exception as exc:  # noqa: BLE001 - a missing checkpoint: a row, then go on
                err = exc
        if distributed.world_size() > 1:
            ckpt, err = distributed.broadcast_object((ckpt, err))
        if err is not None:
            self.fail(run, err)
            return False
        try:
            run.setup(ckpt)
        except Exception as exc:  # noqa: BLE001 - an OOM, a failed capture: a row, then go on
            self.fail(run, exc)
            self._fatal_under_ddp(run, exc)
            return False
        if ckpt is not None:
            self._echo(run, f"resumed at step {run.step} ({run.clock:.1f} s on its clock)")
        return True

    def fail(self, run: TrainRun, exc: BaseException | None = None, status: str | None = None,
             message: str | None = None) -> None:
        """End ``run`` with one ``time_to_target`` row of status ``oom``, ``error`` or ``skipped``."""
        if exc is not None:
            status = "oom" if isinstance(exc, torch.cuda.OutOfMemoryError) else "error"
            first = (str(exc).strip().splitlines() or [""])[0][:300]
            message = f"{type(exc).__name__}: {first}"
        with self.writer.unit([run.key], kind="train") as u:
            if run.mode == "train" and run.tc.target_loss is not None:
                u.write(**run.cols, metric="target_loss", value=run.tc.target_loss, unit="nats")
            u.write(**run.cols, metric="time_to_target", unit="s", status=status, error=message)
            u.commit({run.key: status})
        run.release()
        self._echo(run, f"{status}: {message}", err=status != "skipped")

    def _fatal_under_ddp(self, run: TrainRun, exc: BaseException) -> None:
        """Under DDP a run that failed on this rank cannot be dropped alone (the other ranks may
        wait in its collectives): end this process (status 1), so torchrun stops the others. Rank
        0 recorded the failure first (:meth:`fail`), so the resumed command goes on without it."""
        if distributed.world_size() <= 1:
            return
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        click.echo(f"routerbench: error: rank {distributed.rank()}: {run.router} seed {run.seed} failed "
                   f"({type(exc).__name__}: {first}); under torchrun a run cannot fail on one process "
                   "alone, so the command stops here"
                   + ("; the failure is recorded, resume to go on with the other runs" if self.main else ""),
                   err=True)
        sys.exit(1)

    # --- the loop ------------------------------------------------------------------------------
    def run_group(self, runs: Iterable[TrainRun], schedule: str = "sequential", chunk: int = 10) -> None:
        """Train every run of ``runs`` not yet complete: all at once in turns of ``chunk`` steps
        (``interleaved``) or one after the other (``sequential``)."""
        todo = []
        for r in runs:
            if self.done(r):
                self._echo(r, "already done, skipped")
            else:
                todo.append(r)
        if not todo:
            return
        groups = [todo] if schedule == "interleaved" else [[r] for r in todo]
        from tqdm import tqdm
        for group in groups:
            compiled = any(compiles(r.tc.backend) for r in group)
            with one_dynamo_cache() if compiled else contextlib.nullcontext():
                self._shown = {}
                names = ", ".join(f"{r.router} seed {r.seed}" for r in group)
                active = [r for r in group if self.start(r)]
                self._live = list(active)
                self.bar = tqdm(total=sum(r.stop_step for r in active), initial=sum(r.step for r in active),
                                desc=f"{self.label} {names}"[:60], unit="step",
                                disable=self.quiet or not self.main or not active or not sys.stderr.isatty(),
                                leave=False)
                self._shown = {r.key: r.step for r in active}
                try:
                    while active:
                        for r in list(active):
                            try:
                                r.advance(chunk if len(group) > 1 else r.stop_step, self.on_eval)
                            except (KeyboardInterrupt, SystemExit):
                                raise
                            except Exception as exc:  # noqa: BLE001 - one run fails, the others go on
                                active.remove(r)
                                self.fail(r, exc)
                                self._fatal_under_ddp(r, exc)
                                continue
                            if r.done:
                                active.remove(r)
                                r.release()
                finally:
                    self.bar.close()
                    self.bar = None
