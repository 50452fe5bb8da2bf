"""Time to a target loss: one training run, advanced in turns, checkpointed at every evaluation
(MEASUREMENT.md, "Time to target loss").

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
   turns (:mod:`harness.schedule`). Every ``eval_every`` steps (and at step 0 and the last step)
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
8. Under ``torchrun`` (:mod:`harness.distributed`) the model is wrapped in DistributedDataParallel.
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
import hashlib
import math
import os
import random
import signal
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from routers import router_options as _router_options
from routers.errors import ConfigError
from workloads.config import DecoderConfig
from workloads.data import CharCorpus, fixed_val_batches, random_batches
from workloads.decoder import Decoder, decay_groups

from . import distributed, faults
from .backends import recompile_guard, unavailable_reason
from .modes import lm_loss
from .stats import crossing
from .timing import synchronize

#: Nats above ln(vocab) (the loss of a uniform prediction) beyond which a run has diverged.
DIVERGENCE_MARGIN = 1.0
#: Seed of the i-th pilot run (never a measured seed).
PILOT_SEED = 10000
#: The baseline every router is compared with (reports/training.py adds block_attnres for the
#: detail routers).
BASELINE = "prenorm"
PRECISIONS = ("fp32", "bf16-mixed")
TRAIN_BACKENDS = ("eager", "compile", "cudagraph")
#: Largest default evaluation cadence, as a fraction of the step budget.
EVAL_FRACTION = 0.025
CHECKPOINT_DIR = "checkpoints"
#: How ``time_to_target`` is computed (written to the manifest).
TIME_TO_TARGET_METHOD = ("the training clock interpolated linearly on the validation loss between the "
                         "two evaluations around the first crossing of the target; the raw first "
                         "evaluation at or below target is time_to_target_eval / steps_to_target_eval")


def default_eval_every(max_steps: int) -> int:
    """The default evaluation cadence: at most 2.5 % of the step budget (at least every step)."""
    return max(1, int(EVAL_FRACTION * max_steps))


@dataclass(frozen=True)
class TrainConfig:
    """The training protocol shared by every run of a command.

    Attributes:
        cfg: decoder shape (``vocab_size`` is taken from the corpus; weights are float32).
        target_loss: validation loss (nats) that stops the target clock; None until a pilot sets it.
        max_steps: step budget; the token budget is ``max_steps · batch_size · seq_len``.
        eval_every: evaluation cadence in optimizer steps (None: :func:`default_eval_every`).
        eval_batches: fixed validation batches per evaluation.
        lr: peak learning rate; ``warmup_steps`` of linear warm-up, then cosine to ``0.1·lr``.
        weight_decay: AdamW decay on weight matrices (never on router parameters or gains).
        grad_clip: global gradient-norm clip (0 disables).
        untimed_warmup: steps run before the clock starts, then undone.
        stop_at_target: end the run at the first evaluation at or below the target.
        backend: ``eager``, ``compile`` or ``cudagraph`` (the whole training step captured).
        precision: ``fp32``, or ``bf16-mixed`` (float32 weights and optimizer, bf16 autocast).
        grad_accum: micro-batches per step; ``batch_size`` must be divisible by it.
        divergence_margin: nats above ln(vocab) that count as diverged.

    Raises:
        ConfigError: a value out of range (naming the option).
    """

    cfg: DecoderConfig
    target_loss: float | None = None
    max_steps: int = 300
    eval_every: int | None = None
    eval_batches: int = 4
    lr: float = 3e-3
    warmup_steps: int = 20
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    untimed_warmup: int = 3
    stop_at_target: bool = False
    backend: str = "eager"
    precision: str = "fp32"
    grad_accum: int = 1
    divergence_margin: float = DIVERGENCE_MARGIN

    def __post_init__(self) -> None:
        if self.target_loss is not None and not (self.target_loss > 0 and math.isfinite(self.target_loss)):
            raise ConfigError(f"--target-loss must be a positive number of nats, got {self.target_loss!r}")
        if self.eval_every is None:
            object.__setattr__(self, "eval_every", default_eval_every(self.max_steps))
        for name in ("max_steps", "eval_every", "eval_batches", "grad_accum"):
            if getattr(self, name) < 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if self.lr <= 0:
            raise ConfigError(f"--lr must be > 0, got {self.lr}")
        if self.backend not in TRAIN_BACKENDS:
            raise ConfigError(f"--backend {self.backend}: one of {', '.join(TRAIN_BACKENDS)}")
        if self.precision not in PRECISIONS:
            raise ConfigError(f"--precision {self.precision}: one of {', '.join(PRECISIONS)}")
        if self.cfg.batch_size % self.grad_accum:
            raise ConfigError(f"--grad-accum {self.grad_accum} does not divide --batch-size "
                              f"{self.cfg.batch_size}; change one of them")

    def lr_at(self, step: int) -> float:
        """Learning rate of optimizer step ``step`` (0-based)."""
        if step < self.warmup_steps:
            return self.lr * (step + 1) / self.warmup_steps
        progress = (step - self.warmup_steps) / max(1, self.max_steps - self.warmup_steps)
        return self.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))

    def eval_steps(self) -> list[int]:
        """The steps evaluated: 0, every ``eval_every``, and the last."""
        return sorted({0, *range(self.eval_every, self.max_steps, self.eval_every), self.max_steps})

    def pilot_stop(self, fraction: float) -> int:
        """The pilot's last step: the first evaluation at or after ``fraction`` of the budget."""
        return next(s for s in self.eval_steps() if s >= fraction * self.max_steps)

    def key_fields(self) -> dict:
        """What identifies a run's protocol (the target is not part of it: it only reads the curve)."""
        return {k: v for k, v in asdict(self).items() if k not in ("cfg", "target_loss")}


def train_unavailable_reason(backend: str, device: torch.device) -> str | None:
    """Why a training run with ``backend`` cannot run here (a ``skipped`` row), or None."""
    why = unavailable_reason(backend, None, device)
    if why is None and backend == "cudagraph" and distributed.world_size() > 1:
        why = ("cudagraph with DistributedDataParallel is not supported: the captured step would have "
               "to hold DDP's gradient all-reduce; use --backend eager or compile under torchrun")
    return why


def check_world_size(batch_size: int, grad_accum: int, world: int, batch_label: str = "--batch-size",
                     accum_label: str = "--grad-accum", origin: str = "") -> None:
    """The global batch must split into ``world`` equal slices, and each slice into ``grad_accum``
    micro-batches.

    Args:
        origin: where the batch size came from when not given (`` of --preset NAME``).

    Raises:
        ConfigError: naming ``batch_label`` (and ``accum_label``) and the world size.
    """
    if batch_size % world:
        raise ConfigError(f"{batch_label} {batch_size}{origin} (the global batch) does not split over world "
                          f"size {world} (torchrun --nproc_per_node {world}): give a multiple of {world}")
    if (batch_size // world) % grad_accum:
        raise ConfigError(f"{accum_label} {grad_accum} does not divide the {batch_size // world} rows of each "
                          f"process ({batch_label} {batch_size}{origin} over world size {world}); change one "
                          "of them")


def train_options(router: str, options: dict) -> dict:
    """The options a training run of ``router`` is built with (``impl`` dropped where the router
    has a single implementation)."""
    if "impl" not in _router_options(router):
        return {k: v for k, v in options.items() if k != "impl"}
    return dict(options)


def train_case_key(router: str, options: dict, tc: TrainConfig, seed: int, corpus: CharCorpus,
                   mode: str = "train") -> str:
    """Identity of one training run inside a results directory (its unit of resume):
    ``mode|router|options|backend|precision|shape|protocol|seed|corpus`` (the shape with the
    corpus's vocabulary, the one the model is built with)."""
    options = train_options(router, options)
    cfg = tc.cfg.replace(vocab_size=corpus.vocab_size, dtype="float32")
    return (f"{mode}|{router}|{sorted(options.items())}|{tc.backend}|{tc.precision}|{cfg}|"
            f"{sorted(tc.key_fields().items())}|{seed}|{corpus.sha256[:12]}")


@contextlib.contextmanager
def _autocast(device: torch.device, precision: str):
    """bf16 autocast for ``bf16-mixed`` (silencing RMSNorm's warning that its float32 weight meets a
    bf16 input, which autocast handles), nothing for ``fp32``."""
    if precision != "bf16-mixed":
        yield
        return
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*[Mm]ismatch dtype.*")
        with torch.autocast(device.type, dtype=torch.bfloat16):
            yield


@torch.no_grad()
def evaluate(model: Decoder, batches: list, device: torch.device, precision: str = "fp32") -> float:
    """Mean loss in nats over fixed validation batches (eval mode, no grad; the uncompiled module;
    under DDP this rank's slices of them, :meth:`TrainRun._evaluate` averages over ranks)."""
    model.eval()
    total = torch.zeros((), device=device)
    with _autocast(device, precision):
        for x, y in batches:
            total += lm_loss(model(x.to(device)), y.to(device))
    model.train()
    return float(total) / len(batches)


def _ddp(model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """``model`` in DistributedDataParallel: gradients as views of its all-reduce buckets (no
    second copy of them), buffers (the rotary tables, equal on every rank) not synchronised at
    each forward."""
    import inspect

    from torch.nn.parallel import DistributedDataParallel
    params = inspect.signature(DistributedDataParallel.__init__).parameters
    buffers = {"forward_sync_buffers": False} if "forward_sync_buffers" in params else {"broadcast_buffers": False}
    return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None,
                                   gradient_as_bucket_view=True, **buffers)


def _fused_ok(device: torch.device) -> bool:
    """Whether this torch has a fused AdamW for ``device`` (CUDA; CPU from torch 2.4)."""
    try:
        p = torch.nn.Parameter(torch.zeros(1, device=device))
        torch.optim.AdamW([p], fused=True)
        return True
    except (RuntimeError, TypeError, ValueError):
        return False


@dataclass
class Evaluation:
    """One evaluation: ``step``, ``val_loss`` (nats), ``elapsed`` (s on the run's clock),
    ``tokens`` seen, ``train_loss`` (nats, mean since the previous evaluation; None at step 0)."""

    step: int
    val_loss: float
    elapsed: float
    tokens: int
    train_loss: float | None = None


@dataclass
class TrainRun:
    """One training run: model, optimizer, data generator, clock and evaluations.

    Built lazily (:meth:`setup`), advanced in turns (:meth:`advance`); after each evaluation the
    ``on_eval`` callback given to :meth:`advance` commits its rows and checkpoint.

    Under a process group (:mod:`harness.distributed`) ``model`` is the underlying module, ``ddp``
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
        compiled = torch.compile(self.model, fullgraph=True) if tc.backend == "compile" else self.model
        self.ddp = None
        if self.world_size > 1:
            # DDP around the compiled module (dynamo cannot trace DDP's own forward in one graph);
            # dynamo's DDPOptimizer still splits the graph at DDP's buckets, so the all-reduce
            # overlaps the backward. DDP sends rank 0's weights to every rank (equal anyway).
            self.ddp = _ddp(compiled, dev)
        # The seeded initial state, kept on the host so it costs no device memory.
        self.initial = {k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items()}
        self.val = [(x[self.rows], y[self.rows]) for x, y in
                    fixed_val_batches(self.corpus.val, self.cfg.batch_size, self.cfg.seq_len, tc.eval_batches)]
        capturable = tc.backend == "cudagraph"
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
        warm = "compile_time" if tc.backend == "compile" else "warmup_time"
        self.setup_times = {warm: time.perf_counter() - t0}
        if capturable:
            t0 = time.perf_counter()
            self._capture()
            self.setup_times["capture_time"] = time.perf_counter() - t0
        self._reset()
        if checkpoint is not None:
            self._restore(checkpoint)

    def _optimizer(self) -> torch.optim.AdamW:
        capturable = self.tc.backend == "cudagraph"
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
                with _autocast(self.device, self.tc.precision):
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
        if self.fault and self.fault[0] == "nan_loss" and i >= self.tc.eval_every:
            loss = loss * float("nan")  # the test hook: a run diverging after its first evaluation
        return loss

    def _capture(self) -> None:
        """Capture forward, backward, clip and AdamW of one step in a CUDA graph (static inputs,
        tensor LR, capturable AdamW; gradients set to None before the captured backward)."""
        from .cudagraph import CaptureError
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
            t0 = time.perf_counter()
            with recompile_guard(self.tc.backend):
                for i in range(self.step, stop):
                    self.train_sum += self._one_step(i)
            synchronize(self.device)
            distributed.barrier(self.device)
            self.clock += time.perf_counter() - t0
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

    # --- rows -----------------------------------------------------------------------------
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

    # --- checkpoints ----------------------------------------------------------------------
    def checkpoint_dir(self, run_dir: Path) -> Path:
        return Path(run_dir) / CHECKPOINT_DIR / hashlib.sha1(self.key.encode()).hexdigest()[:16]

    def save_checkpoint(self, run_dir: Path) -> Path:
        """Write the state after the last evaluation atomically (temp file, fsync, rename); under
        DDP rank 0 alone writes it, with the underlying module's weights (no ``module.`` prefix),
        which every rank loads on resume, whatever the world size then.

        Returns:
            the checkpoint path, ``checkpoints/<run hash>/step-<step>.pt``.
        """
        d = self.checkpoint_dir(run_dir)
        d.mkdir(parents=True, exist_ok=True)
        path = d / f"step-{self.step:08d}.pt"
        state = {"format": 1, "key": self.key, "step": self.step, "clock": self.clock,
                 "evals": [asdict(e) for e in self.evals], "model": self.model.state_dict(),
                 "optimizer": self.opt.state_dict(), "data_rng": self.gen.get_state(),
                 "torch_rng": torch.get_rng_state(), "python_rng": random.getstate(),
                 "numpy_rng": np.random.get_state(),
                 "cuda_rng": torch.cuda.get_rng_state_all() if self.device.type == "cuda" else None}
        tmp = path.with_suffix(".tmp")
        with open(tmp, "wb") as fh:
            torch.save(state, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        fd = os.open(d, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        return path

    def save_final_weights(self, run_dir: Path) -> Path:
        """Write the weights a finished run ended with (no optimizer or RNG state: a finished run
        never resumes), atomically, for ``routerbench diagnose``.

        Returns:
            ``checkpoints/<run hash>/final-step-<step>.pt``.
        """
        d = self.checkpoint_dir(run_dir)
        d.mkdir(parents=True, exist_ok=True)
        path = d / f"final-step-{self.step:08d}.pt"
        tmp = path.with_suffix(".tmp")
        with open(tmp, "wb") as fh:
            torch.save({"format": 1, "key": self.key, "step": self.step, "final": True,
                        "model": self.model.state_dict()}, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        return path

    def _restore(self, path: Path) -> None:
        state = torch.load(path, map_location="cpu", weights_only=False)  # our own file
        if state.get("key") != self.key:
            raise ConfigError(f"checkpoint {path} belongs to another run; remove it or choose another --run-id")
        with torch.no_grad():
            for k, v in self.model.state_dict().items():
                v.copy_(state["model"][k])
        if self.graphed is None:
            self.opt.load_state_dict(state["optimizer"])
        else:  # in place: the captured graph holds the addresses of the optimizer state
            saved = state["optimizer"]["state"]
            for i, st in enumerate(self.opt.state[p] for g in self.opt.param_groups for p in g["params"]):
                for name, v in st.items():
                    if torch.is_tensor(v):
                        v.copy_(saved[i][name])
        self.gen.set_state(state["data_rng"])
        torch.set_rng_state(state["torch_rng"])
        random.setstate(state["python_rng"])
        np.random.set_state(state["numpy_rng"])
        if state.get("cuda_rng") is not None and self.device.type == "cuda":
            torch.cuda.set_rng_state_all(state["cuda_rng"])
        self.step, self.clock = state["step"], state["clock"]
        self.evals = [Evaluation(**e) for e in state["evals"]]
        self._pending_steps = 0

    def release(self) -> None:
        """Drop the model and optimizer (a finished run in an interleaved group)."""
        self.model = self.ddp = self.fwd = self.opt = self.graphed = self.initial = self.val = None
