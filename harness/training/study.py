"""The depth study (``routerbench study depth``): routers × depths × seeds, paired by seed.

Every run is a :class:`harness.training.run.TrainRun` driven by :class:`harness.training.schedule.Trainer`, so a
study inherits the training protocol whole (MEASUREMENT.md, "Time to target loss"): the shared
weights and the data order of a run come from its seed, so the routers of one seed and depth are
paired; untimed warm-up, then a reset; an evaluation on fixed validation batches every
``eval_every`` steps, checkpointed atomically before its rows are committed, so an interrupted
study resumes from its last committed evaluation and redoes nothing committed.

What differs from ``routerbench train``: the study has no target loss. Its result is the papers'
own metric, the validation loss at the token budget (``loss_at_token_budget``), so its runs
(:class:`StudyRun`, mode ``study``, case keys ``study|router|…``) record no time-to-target rows.

Before training, :func:`estimate_cost` times a few steps of every router at every depth that
still has runs to do and prints what the rest of the study should cost.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Iterator

import torch

from harness.timing.noise import Probe

from .run import TrainRun

STUDY_MODE = "study"
ESTIMATE_MODE = "estimate"
#: How the estimate is made (written to the manifest).
ESTIMATE_METHOD = ("per router and depth: one run set up (its untimed warm-up included), one "
                   "evaluation timed, then N steps timed on the run's own clock; a run's estimate = "
                   "set-up + step time × step budget + evaluation time × evaluations; checkpoint "
                   "writes and the report are not counted")


@dataclass
class StudyRun(TrainRun):
    """One run of the depth study: a :class:`TrainRun` without a target, whose result is the
    validation loss at the token budget. Its final rows: set-up times, ``train_time``,
    ``step_budget``, ``token_budget`` and ``loss_at_token_budget`` (or ``diverged`` rows)."""

    mode: str = STUDY_MODE

    def _verdict(self) -> str:
        return "ok"  # no target to reach: a run that trained to its budget is ok

    def final_rows(self) -> list[dict]:
        """The run-level rows written with its last evaluation."""
        c, tc, last = self.cols, self.tc, self.evals[-1]
        rows = [dict(c, metric=m, value=v, unit="s") for m, v in getattr(self, "setup_times", {}).items()]
        rows += [dict(c, metric="train_time", value=last.elapsed, unit="s"),
                 dict(c, metric="step_budget", value=tc.max_steps, unit="steps"),
                 dict(c, metric="token_budget", value=tc.max_steps * self.tokens_per_step, unit="tokens")]
        if self.status == "diverged":
            return rows + self._diverged_rows(("loss_at_token_budget",))
        return rows + [dict(c, metric="loss_at_token_budget", value=last.val_loss, unit="nats")]

    def summary(self) -> str:
        """One line for the terminal."""
        if self.status == "diverged":
            return f"diverged: {self.diverged[2]}"
        last = self.evals[-1]
        return f"val loss {last.val_loss:.4f} at step {last.step} (the token budget), {last.elapsed:.1f} s"


def groups(spec, corpus, device: torch.device, unit=None) -> Iterator[tuple[int, int, list[StudyRun]]]:
    """``(seed, depth, runs)`` in training order: seeds outermost (an interrupted study holds whole
    seeds first), then depths; one run per router, with the study's layout options. ``unit`` (a
    :class:`harness.training.units.Unit`): its seed and depth alone."""
    for seed in spec.study.seed_list:
        for depth in spec.study.depths:
            if unit is not None and (seed, depth) != (unit.seed, unit.depth):
                continue
            tc = spec.train_config(depth)
            yield seed, depth, [StudyRun(r, opts, corpus, tc, seed, device)
                                for r, opts in spec.options_at(depth).items()]


def all_runs(spec, corpus, device: torch.device, unit=None) -> list[StudyRun]:
    """Every run of the study, or of ``unit`` (nothing is built)."""
    return [r for *_, g in groups(spec, corpus, device, unit) for r in g]


def estimate_cost(spec, corpus, device: torch.device, left: dict[tuple[int, str], float],
                  echo=print) -> dict:
    """Time ``spec.study.estimate_steps`` steps of each (depth, router) that has runs left and
    estimate what those runs cost (:data:`ESTIMATE_METHOD`).

    Args:
        left: ``(depth, router)`` -> runs of it not yet complete, each counted by the fraction of
            its steps left (a run resumed at step 150 of 200 counts 0.25).
        echo: where each depth's line goes (printed as soon as the depth is timed).

    Returns:
        the manifest entry: ``method``, ``timed_steps``, ``cases`` (depth, router, ``setup_s``,
        ``step_s`` (median), ``eval_s``, ``run_s``, ``runs_left``), ``machine`` (CPU pressure, load
        and, on a CPU, utilisation over the timing: :class:`harness.timing.noise.Probe`), ``runs_left``
        and ``total_s``.
    """
    k = spec.study.estimate_steps
    cases = []
    probe = Probe().__enter__()
    for depth in spec.study.depths:
        if not any(left.get((depth, r)) for r in spec.routers.routers):
            continue
        tc = spec.train_config(depth)
        n_evals = len(tc.eval_steps())
        line = []
        for router, opts in spec.options_at(depth).items():
            n = left.get((depth, router), 0)
            if not n:
                continue
            run = StudyRun(router, opts, corpus, tc, 0, device, mode=ESTIMATE_MODE,
                           stop_step=min(k, tc.max_steps))
            t0 = time.perf_counter()
            run.setup()
            t1 = time.perf_counter()
            run.advance(0, lambda r: None)  # the evaluation at step 0 alone
            t2 = time.perf_counter()
            steps = []
            for _ in range(min(k, tc.max_steps)):  # one by one: the median resists a load spike
                c0 = run.clock
                run.advance(1, lambda r: None)
                steps.append(run.clock - c0)
            step_s = statistics.median(steps)
            run.release()
            per_run = (t1 - t0) + step_s * tc.max_steps + (t2 - t1) * n_evals
            cases.append({"depth": depth, "router": router, "setup_s": t1 - t0, "step_s": step_s,
                          "eval_s": t2 - t1, "run_s": per_run, "runs_left": n})
            line.append(cases[-1])
        if line:
            total = sum(c["run_s"] * c["runs_left"] for c in line)
            fast, slow = min(line, key=lambda c: c["step_s"]), max(line, key=lambda c: c["step_s"])
            n = sum(c['runs_left'] for c in line)
            echo(f"  depth {depth:3d}: {n:g} run{'s' * (n != 1)}, {fmt_duration(total)} "
                 f"(step {fast['step_s'] * 1e3:.1f} ms {fast['router']} .. {slow['step_s'] * 1e3:.1f} ms "
                 f"{slow['router']})")
    probe.__exit__(None, None, None)
    return {"method": ESTIMATE_METHOD, "timed_steps": k, "cases": cases, "machine": probe.metrics(device),
            "runs_left": sum(c["runs_left"] for c in cases),
            "total_s": sum(c["run_s"] * c["runs_left"] for c in cases)}


def fmt_duration(seconds: float) -> str:
    """``"42 s"``, ``"3.5 min"``, ``"2.1 h"``."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"
