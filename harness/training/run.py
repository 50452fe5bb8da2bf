"""Time to a target loss: one training run, advanced in turns, checkpointed at every evaluation
(MEASUREMENT.md, "Time to target loss"; the protocol's settings are :mod:`harness.training.config`,
its checkpoints :mod:`harness.training.checkpoint`).

Protocol, modelled on MLPerf Training and the modded-nanogpt speedrun:

1. The model is built with the run's seed: the weights every router shares come from a generator
   seeded with it (:class:`workloads.decoder.Decoder`'s ``init_seed``), the data order from
   another, so runs of one seed are **paired**: same data, same shared initial weights.
2. Untimed warm-up steps (allocator, kernels, the compile, the CUDA-graph capture), then weights,
   optimizer and data order are reset to their seeded initial state, so the warm-up cannot help
   the timed run.
3. AdamW (fused where the device has it; weight decay on matrices only), linear LR warm-up then
   cosine decay to 10 %; ``--grad-accum N`` splits each step's batch into N micro-batches (it
   changes memory, not the step).
4. The clock counts only this run's own steps (synchronised on CUDA), so runs can advance in
   turns (:mod:`harness.training.schedule`). Every ``eval_every`` steps (and at step 0 and the last step)
   the mean loss on fixed validation batches is computed **off the clock**, by the uncompiled
   module with the same weights, so it never recompiles the timed graph.
5. At every evaluation a checkpoint (weights, optimizer, every RNG state, the data generator, the
   clock, the evaluations so far) is written atomically, then the evaluation's rows are committed
   as a unit (kind ``train_segment``), then the previous checkpoint is deleted. A killed run
   resumes from the checkpoint of its last committed evaluation; the restart costs nothing on the
   clock.
6. Time to target is the clock interpolated linearly on the loss between the two evaluations
   around the crossing (``time_to_target``, ``steps_to_target``); the raw first evaluation at or
   below target is kept (``time_to_target_eval``, ``steps_to_target_eval``). Training goes on to
   the step budget (unless ``stop_at_target``) so the loss at the fixed token budget, the papers'
   own metric, is known. A run that never reaches the target is ``not_converged``, never dropped.
7. A non-finite loss, or a validation loss above ln(vocab) + :data:`DIVERGENCE_MARGIN` (worse than
   a uniform prediction), ends the run as ``diverged`` (step and loss recorded); its last finite
   loss is never reported as a result.
8. Under ``torchrun`` (:mod:`harness.training.distributed`) the model is wrapped in DistributedDataParallel.
   Every rank draws the same global batch and trains on its own contiguous slice of rows, its loss
   the mean over its slice, so DDP's average of the gradients is the gradient of the mean loss over
   the global batch (and the clipped norm is the global one): a run's numbers do not depend on the
   world size beyond float rounding. The validation batches are split the same way; losses are
   averaged over ranks so every rank takes the same decisions. Tokens are global; the clock is rank
   0's, with every rank waiting for the others at both ends of a timed stretch. Checkpoints hold the
   underlying module (not the DDP wrapper), so a run resumes on any world size. ``cudagraph`` is a
   ``skipped`` row under DDP (:func:`train_unavailable_reason`).
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from harness.rundir import faults
from harness.stats.curves import crossing
from harness.step.backends import captures, compiles, recompile_guard
from harness.step.cudagraph import CaptureError
from harness.step.modes import lm_loss
from harness.timing import noise
from harness.timing.timer import synchronize
from workloads.batches import fixed_val_batches, random_batches
from workloads.data import CharCorpus
from workloads.decoder import Decoder, Regions, decay_groups

from . import checkpoint as checkpoint_
from . import distributed
from .config import TrainConfig, check_world_size, train_case_key, train_options
from .rows import Evaluation, RunRows


@contextlib.contextmanager
def _autocast(device: torch.device, precision: str, cache: bool = True):
    """bf16 autocast for ``bf16-mixed`` (silencing RMSNorm's warning that its float32 weight meets a
    bf16 input, which autocast handles), nothing for ``fp32``. ``cache=False`` for a step captured
    in a CUDA graph: autocast's cache of bf16 weight copies is cleared when the context exits, and a
    graph must not read copies made during its capture and freed after it (PyTorch's CUDA-graph notes
    ask for ``cache_enabled=False``)."""
    if precision != "bf16-mixed":
        yield
        return
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*[Mm]ismatch dtype.*")
        with torch.autocast(device.type, dtype=torch.bfloat16, cache_enabled=cache):
            yield


@torch.no_grad()
def evaluate(model: Decoder, batches: list, device: torch.device, precision: str = "fp32") -> float:
    """Mean loss in nats over fixed validation batches (eval mode, no grad; the uncompiled module;
    under DDP this rank's slices of them, :meth:`TrainRun._evaluate` averages over ranks)."""
    model.eval()
    total = torch.zeros((), device=device)
    with _autocast(device, precision), model.without_regions():
        for x, y in batches:
            total += lm_loss(model(x.to(device)), y.to(device))
    model.train()
    return float(total) / len(batches)


def _fused_ok(device: torch.device) -> bool:
    """Whether this torch has a fused AdamW for ``device`` (CUDA; CPU from torch 2.4)."""
    try:
        p = torch.nn.Parameter(torch.zeros(1, device=device))
        torch.optim.AdamW([p], fused=True)
        return True
    except (RuntimeError, TypeError, ValueError):
        return False


@dataclass
class TrainRun(RunRows):
    """One training run: model, optimizer, data generator, clock and evaluations.

    Built lazily (:meth:`setup`), advanced in turns (:meth:`advance`); after each evaluation the
    ``on_eval`` callback given to :meth:`advance` commits its rows and checkpoint.

    Under a process group (:mod:`harness.training.distributed`) ``model`` is the underlying module, ``ddp``
    its DistributedDataParallel wrapper (trained through ``fwd``); every rank builds the same run.

    Args:
        router, options: the router and its options.
        corpus: the training corpus.
        tc: the protocol.
        seed: the run's seed (data order and shared initial weights).
        device: where it trains.
        mode: ``train`` (measured) or ``pilot`` (sets the target; stops at ``stop_step``).
        stop_step: the last step (default: ``tc.max_steps``).
    """

    router: str
    options: dict
    corpus: CharCorpus
    tc: TrainConfig
    seed: int
    device: torch.device
    mode: str = "train"
    stop_step: int | None = None
    step: int = 0
    clock: float = 0.0
    evals: list[Evaluation] = field(default_factory=list)
    status: str | None = None       # None while running; ok | not_converged | diverged
    diverged: tuple[int, float | None, str] | None = None

    def __post_init__(self) -> None:
        self.options = train_options(self.router, self.options)
        self.cfg = self.tc.cfg.replace(vocab_size=self.corpus.vocab_size, dtype="float32")
        self.key = train_case_key(self.router, self.options, self.tc, self.seed, self.corpus, self.mode)
        self.cols = {"case_key": self.key, "router": self.router, "router_options": self.options,
                     "impl": self.options.get("impl", "naive"), "backend": self.tc.backend,
                     "mode": self.mode, "seed": self.seed, **self.cfg.shape_columns()}
        self.stop_step = self.stop_step or self.tc.max_steps
        self.world_size, self.rank = distributed.world_size(), distributed.rank()
        check_world_size(self.cfg.batch_size, self.tc.grad_accum, self.world_size)
        self.rows = distributed.rank_slice(self.cfg.batch_size)  # this rank's rows of a global batch
        self.tokens_per_step = self.cfg.batch_size * self.cfg.seq_len  # global
        self.fault = faults.fault_entry(self.key)
        self.model = self.ddp = None
        self.grad_norm = None  # the last step's gradient norm before clipping (a tensor)
        self._pending_steps = 0  # steps since the last evaluation
        # CPU pressure over this run's own timed stretches in this process (:meth:`load`)
        self._waited_us, self._read_s = 0.0, 0.0

    # --- set-up ---------------------------------------------------------------------------
    def setup(self, checkpoint: Path | None = None) -> None:
        """Build the model, warm up untimed, reset to the seeded initial state, then restore
        ``checkpoint`` if given.

        Raises:
            CaptureError: the CUDA-graph capture failed (backend ``cudagraph``).
            torch.cuda.OutOfMemoryError: the run does not fit.
        """
        faults.maybe_inject(self.key)
        dev, tc = self.device, self.tc
        torch.manual_seed(self.seed)
        self.model = Decoder(self.cfg, self.router, self.options, init_seed=self.seed).to(dev)
        self.model.train()
        compiled = self.model
        if compiles(tc.backend) and tc.compile_scope == "layer":  # regions (workloads.decoder)
            self.model.regions = Regions(lambda f: torch.compile(f, fullgraph=True))
        elif compiles(tc.backend):
            compiled = torch.compile(self.model, fullgraph=True)
        self.ddp = None
        if self.world_size > 1:
            # DDP around the compiled module (dynamo cannot trace DDP's own forward in one graph);
            # dynamo's DDPOptimizer still splits the graph at DDP's buckets, so the all-reduce
            # overlaps the backward. DDP sends rank 0's weights to every rank (equal anyway).
            self.ddp = distributed.wrap(compiled, dev)
        # The seeded initial state, kept on the host so it costs no device memory.
        self.initial = {k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items()}
        self.val = [(x[self.rows], y[self.rows]) for x, y in
                    fixed_val_batches(self.corpus.val, self.cfg.batch_size, self.cfg.seq_len, tc.eval_batches)]
        capturable = captures(tc.backend)
        self.lr = torch.tensor(tc.lr, device=dev) if capturable else tc.lr
        self.opt = self._optimizer()
        self.fwd = self.ddp if self.ddp is not None else compiled
        self.gen = torch.Generator().manual_seed(self.seed)
        self.train_sum = torch.zeros((), device=dev)
        self.graphed = None
        # Untimed: allocator, kernels, the compile; on a side stream before a CUDA-graph capture.
        side = torch.cuda.Stream(dev) if capturable else None
        synchronize(dev)
        t0 = time.perf_counter()
        with torch.cuda.stream(side) if side is not None else contextlib.nullcontext():
            for i in range(tc.untimed_warmup):
                self._one_step(i)
        if side is not None:
            torch.cuda.current_stream(dev).wait_stream(side)
        synchronize(dev)
        # Under compile the warm-up holds the compile: its time is the compile time (off the clock).
        warm = "compile_time" if compiles(tc.backend) else "warmup_time"
        self.setup_times = {warm: time.perf_counter() - t0}
        if capturable:
            t0 = time.perf_counter()
            self._capture()
            self.setup_times["capture_time"] = time.perf_counter() - t0
        self._reset()
        if checkpoint is not None:
            got = checkpoint_.restore(self, checkpoint)
            self.step, self.clock = got["step"], got["clock"]
            self.evals = [Evaluation(**e) for e in got["evals"]]
            self._pending_steps = 0

    def _optimizer(self) -> torch.optim.AdamW:
        capturable = captures(self.tc.backend)
        fused = _fused_ok(self.device)
        return torch.optim.AdamW(decay_groups(self.model, self.tc.weight_decay), lr=self.lr,
                                 betas=(0.9, 0.95), fused=fused or None, foreach=None if fused else True,
                                 capturable=capturable)

    def _reset(self) -> None:
        """Weights, optimizer state and data order back to their seeded initial state (in place,
        so a captured graph's addresses stay valid).

        Under DDP the wrapper keeps the same parameters (overwritten in place, equal on every
        rank), gradients are dropped (``zero_grad`` at the next step), and no collective is in
        flight: every warm-up step ended with its all-reduce. What DDP keeps across the reset is
        its bucket layout (rebuilt after its first step from the order gradients arrived), which
        changes no number."""
        with torch.no_grad():
            for k, v in self.model.state_dict().items():
                v.copy_(self.initial[k])
        if self.graphed is None:
            self.opt = self._optimizer()
        else:
            for st in self.opt.state.values():
                for v in st.values():
                    if torch.is_tensor(v):
                        v.zero_()
        self.gen = torch.Generator().manual_seed(self.seed)
        self.train_sum.zero_()
        self.grad_norm = None

    # --- one step -------------------------------------------------------------------------
    def _loss_and_backward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Mean loss over this rank's rows ``x``/``y`` (micro-batches of ``grad_accum``), backward.
        Under DDP the gradients are all-reduced (averaged) once, with the last micro-batch."""
        n = self.tc.grad_accum
        total = torch.zeros((), device=self.device)
        for j, (xm, ym) in enumerate(zip(x.chunk(n), y.chunk(n))):
            hold = self.ddp is not None and j < n - 1
            with self.ddp.no_sync() if hold else contextlib.nullcontext():
                with _autocast(self.device, self.tc.precision, cache=not captures(self.tc.backend)):
                    loss = lm_loss(self.fwd(xm), ym) / n
                loss.backward()
            total = total + loss.detach()
        return total

    def _update(self) -> None:
        """Clip (after DDP's all-reduce: the global norm, the same on every rank), AdamW."""
        if self.tc.grad_clip:
            self.grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.tc.grad_clip)
        self.opt.step()

    def _one_step(self, i: int) -> torch.Tensor:
        """Optimizer step ``i`` (0-based): draw the global batch, take this rank's rows, forward,
        backward, clip, AdamW. Returns the mean loss over this rank's rows."""
        x, y = random_batches(self.corpus.train, self.cfg.batch_size, self.cfg.seq_len, self.gen)
        x, y = x[self.rows], y[self.rows]
        x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
        if self.graphed is not None:
            self.lr.fill_(self.tc.lr_at(i))
            self.static_x.copy_(x)
            self.static_y.copy_(y)
            self.graphed.replay()
            loss = self.graphed_loss
        else:
            for g in self.opt.param_groups:
                g["lr"] = self.tc.lr_at(i)
            self.opt.zero_grad(set_to_none=True)
            loss = self._loss_and_backward(x, y)
            self._update()
        return faults.in_training_step(self.fault, i, self.tc.eval_every, loss)  # the test hook, if named

    def _capture(self) -> None:
        """Capture forward, backward, clip and AdamW of one step in a CUDA graph (static inputs,
        tensor LR, capturable AdamW; gradients set to None before the captured backward)."""
        x, y = random_batches(self.corpus.train, self.cfg.batch_size, self.cfg.seq_len, self.gen)
        self.static_x, self.static_y = x[self.rows].to(self.device), y[self.rows].to(self.device)
        self.graphed = torch.cuda.CUDAGraph()
        torch.cuda.synchronize(self.device)
        try:
            self.opt.zero_grad(set_to_none=True)
            with torch.cuda.graph(self.graphed):
                self.graphed_loss = self._loss_and_backward(self.static_x, self.static_y)
                self._update()
        except Exception as exc:
            self.graphed = None
            raise CaptureError(f"capture of the training step failed: {type(exc).__name__}: {exc}") from exc
        torch.cuda.synchronize(self.device)

    # --- turns ----------------------------------------------------------------------------
    @property
    def done(self) -> bool:
        return self.status is not None

    def advance(self, n: int, on_eval: Callable[["TrainRun"], None]) -> None:
        """Train up to ``n`` steps on this run's clock, evaluating (off the clock) where due and
        calling ``on_eval(self)`` after each evaluation; stops early when the run ends.

        Under DDP every rank waits for the others before the clock starts and before it stops, so
        the stretch timed is the slowest rank's; the clock recorded is rank 0's (:meth:`_evaluate`)."""
        if not self.evals:
            self._evaluate(on_eval)
        end = min(self.step + n, self.stop_step)
        while self.step < end and not self.done:
            stop = min(end, self.next_eval_due())
            synchronize(self.device)
            distributed.barrier(self.device)
            p0 = noise.pressure_total_us()
            t0 = time.perf_counter()
            with recompile_guard(self.tc.backend):
                for i in range(self.step, stop):
                    self.train_sum += self._one_step(i)
            synchronize(self.device)
            distributed.barrier(self.device)
            took = time.perf_counter() - t0
            self.clock += took
            self._count_load(p0, took)
            self._pending_steps += stop - self.step
            self.step = stop
            if self.step == self.next_eval_due():
                self._evaluate(on_eval)

    def next_eval_due(self) -> int:
        """The step of this run's next evaluation (0, every ``eval_every``, its last step)."""
        prev = self.evals[-1].step if self.evals else -1
        return next(s for s in (*self.tc.eval_steps(), self.stop_step) if s > prev)

    def _evaluate(self, on_eval: Callable[["TrainRun"], None]) -> None:
        val = evaluate(self.model, self.val, self.device, self.tc.precision)
        train = None
        if self.step > 0:
            n = self._pending_steps
            train = float(self.train_sum) / n
            self.train_sum.zero_()
            self._pending_steps = 0
        if self.world_size > 1:
            # One gather: the means over ranks (summed in rank order, the same bits everywhere, so
            # every rank takes the same decision below) and rank 0's clock.
            got = distributed.gather_floats([val, math.nan if train is None else train, self.clock])
            val = sum(g[0] for g in got) / len(got)
            train = None if train is None else sum(g[1] for g in got) / len(got)
            self.clock = got[0][2]
        self.evals.append(Evaluation(self.step, val, self.clock, self.step * self.tokens_per_step, train))
        limit = math.log(self.corpus.vocab_size) + self.tc.divergence_margin
        if not math.isfinite(val) or (train is not None and not math.isfinite(train)):
            bad = val if not math.isfinite(val) else train
            self.diverged = (self.step, None, f"non-finite loss ({bad}) at step {self.step}")
        elif val > limit:
            self.diverged = (self.step, val, f"val loss {val:.4g} above ln(vocab) + {self.tc.divergence_margin:g} "
                                             f"= {limit:.3f} (a uniform prediction) at step {self.step}")
        if self.diverged:
            self.status = "diverged"
        elif self.step >= self.stop_step:
            self.status = "ok" if self.mode == "pilot" else self._verdict()
        elif (self.mode == "train" and self.tc.stop_at_target and self.tc.target_loss is not None
              and val <= self.tc.target_loss):
            self.status = "ok"
        on_eval(self)
        if self.fault and self.fault[0] == "kill_after_eval" and len(self.evals) - 1 == self.fault[1]:
            os.kill(os.getpid(), signal.SIGKILL)  # the test hook of resume: right after the commit

    def _verdict(self) -> str:
        return "ok" if self._crossing() is not None else "not_converged"

    def _crossing(self) -> dict | None:
        if self.tc.target_loss is None:
            return None
        e = self.evals
        return crossing([v.step for v in e], [v.elapsed for v in e], [v.val_loss for v in e], self.tc.target_loss)

    def release(self) -> None:
        """Drop the model and optimizer (a finished run in an interleaved group)."""
        self.model = self.ddp = self.fwd = self.opt = self.graphed = self.initial = self.val = None
