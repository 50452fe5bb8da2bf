"""What a training run records (DESIGN.md, "Results"): the rows of each evaluation and the
run-level rows written with its last one (time, steps and tokens to target, the loss at the token
budget, a divergence), and its one line for the terminal. A mixin of
:class:`harness.training.run.TrainRun` (``reports/training.py`` reads these rows).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from harness.rundir import faults
from harness.timing import noise


@dataclass
class Evaluation:
    """One evaluation: ``step``, ``val_loss`` (nats), ``elapsed`` (s on the run's clock),
    ``tokens`` seen, ``train_loss`` (nats, mean since the previous evaluation; None at step 0)."""

    step: int
    val_loss: float
    elapsed: float
    tokens: int
    train_loss: float | None = None


class RunRows:
    """The rows of a :class:`harness.training.run.TrainRun` (it provides ``cols``, ``tc``,
    ``evals``, ``mode``, ``status``, ``diverged``, ``tokens_per_step``, ``setup_times``,
    ``key``, ``_waited_us``, ``_read_s`` and ``_crossing``)."""

    def _count_load(self, before_us: float | None, took: float) -> None:
        """Add one timed stretch of ``took`` seconds to :meth:`load`'s reading (``before_us``: the
        CPU pressure total, :func:`harness.timing.noise.pressure_total_us`, as it began)."""
        if before_us is not None and (after := noise.pressure_total_us()) is not None:
            self._waited_us += after - before_us
            self._read_s += took

    def load(self) -> float | None:
        """The CPU pressure over this run's own timed steps (a ratio: the share of that time in
        which some runnable task waited for a CPU, ``/proc/pressure/cpu`` "some"), over the
        stretches trained in this process (a resumed run reads only those since its resume); a
        ``busy=PCT`` fault of the run's key plants PCT % (:mod:`harness.rundir.faults`). None
        without PSI or before a timed step. Two runs of a sequential race that read very
        different loads are not comparable on time (``reports/race.py`` flags them)."""
        planted = faults.planted_pressure(self.key)
        if planted is not None:
            return planted
        if self._read_s <= 0:
            return None
        return min(1.0, self._waited_us / (self._read_s * 1e6))

    def eval_rows(self, ev: Evaluation) -> list[dict]:
        """The rows of one evaluation (``repeat`` = its step)."""
        rows = [("val_loss", ev.val_loss, "nats"), ("elapsed", ev.elapsed, "s"), ("tokens", ev.tokens, "tokens")]
        if ev.train_loss is not None:
            rows.append(("train_loss", ev.train_loss, "nats"))
        return [dict(self.cols, metric=m, value=v if math.isfinite(v) else None, unit=u, repeat=ev.step)
                for m, v, u in rows]

    def final_rows(self) -> list[dict]:
        """The run-level rows written with its last evaluation (see ``reports/training.py``)."""
        c, tc = self.cols, self.tc
        last = self.evals[-1]
        rows = [dict(c, metric=m, value=v, unit="s") for m, v in getattr(self, "setup_times", {}).items()]
        if (load := self.load()) is not None:  # the CPU pressure over the run's own steps
            rows.append(dict(c, metric="train_cpu_pressure", value=load, unit="ratio"))
        rows += [dict(c, metric="train_time", value=last.elapsed, unit="s"),
                dict(c, metric="step_budget", value=tc.max_steps, unit="steps"),
                dict(c, metric="token_budget", value=tc.max_steps * self.tokens_per_step, unit="tokens")]
        if self.mode == "pilot":
            if self.status == "diverged":
                return rows + self._diverged_rows(("target_loss",))
            return rows + [dict(c, metric="target_loss", value=last.val_loss, unit="nats"),
                           dict(c, metric="target_step", value=last.step, unit="steps")]
        rows.append(dict(c, metric="target_loss", value=tc.target_loss, unit="nats"))
        targets = (("time_to_target", "s"), ("steps_to_target", "steps"), ("tokens_to_target", "tokens"))
        if self.status == "diverged":
            return rows + self._diverged_rows([m for m, _ in targets] + ["loss_at_token_budget"])
        x = self._crossing()
        if x is None:
            msg = f"val loss {last.val_loss:.4f} > target {tc.target_loss:.4f} after {last.step} steps"
            rows += [dict(c, metric=m, unit=u, status="not_converged", error=msg) for m, u in targets]
        else:
            rows += [dict(c, metric="time_to_target", value=x["time"], unit="s"),
                     dict(c, metric="steps_to_target", value=x["steps"], unit="steps"),
                     dict(c, metric="tokens_to_target", value=x["steps"] * self.tokens_per_step, unit="tokens"),
                     dict(c, metric="time_to_target_eval", value=x["time_eval"], unit="s"),
                     dict(c, metric="steps_to_target_eval", value=x["steps_eval"], unit="steps")]
        if last.step == tc.max_steps:
            rows.append(dict(c, metric="loss_at_token_budget", value=last.val_loss, unit="nats"))
        else:
            rows.append(dict(c, metric="loss_at_token_budget", unit="nats", status="skipped",
                             error="stopped at target before the token budget (--stop-at-target)"))
        return rows

    def _diverged_rows(self, metrics) -> list[dict]:
        step, loss, why = self.diverged
        return ([dict(self.cols, metric="diverged", value=loss, unit="nats", repeat=step, status="diverged",
                      error=why)] +
                [dict(self.cols, metric=m, unit="s" if m == "time_to_target" else None, status="diverged",
                      error=why) for m in metrics])

    def summary(self) -> str:
        """One line for the terminal."""
        if self.status == "diverged":
            return f"diverged: {self.diverged[2]}"
        last = self.evals[-1]
        if self.mode == "pilot":
            return f"target {last.val_loss:.4f} nats (val loss at step {last.step})"
        x = self._crossing()
        ttt = f"{x['time']:.3g} s ({x['steps']:.1f} steps)" if x else "not reached"
        return f"time to target {ttt}, val loss {last.val_loss:.4f} at step {last.step}"
