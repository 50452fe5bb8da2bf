"""The training protocol shared by every run of a command (:class:`TrainConfig`), what identifies a
run (:func:`train_case_key`), and the checks of its settings that come before any model is built
(MEASUREMENT.md, "Time to target loss").
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch

from harness.step import backends
from harness.step.backends import captures, compiles
from routers import router_options as _router_options
from routers.errors import ConfigError
from workloads.config import DecoderConfig
from workloads.data import CharCorpus

from . import distributed

#: Nats above ln(vocab) (the loss of a uniform prediction) beyond which a run has diverged.
DIVERGENCE_MARGIN = 1.0


#: Seed of the i-th pilot run (never a measured seed).
PILOT_SEED = 10000


#: The ``mode`` of a training run (its rows' column and the first field of :func:`train_case_key`).
TRAIN_MODES = ("train", "pilot", "study")


PRECISIONS = ("fp32", "bf16-mixed")


TRAIN_BACKENDS = ("eager", "compile", "cudagraph")


#: Largest default evaluation cadence, as a fraction of the step budget.
EVAL_FRACTION = 0.025


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
        compile_scope: under ``compile``, ``layer`` (one region per sublayer role) or ``model``
            (:data:`harness.step.backends.COMPILE_SCOPES`); None otherwise.
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
    compile_scope: str | None = None

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
        if compiles(self.backend) and self.compile_scope is None:
            object.__setattr__(self, "compile_scope", backends.DEFAULT_COMPILE_SCOPE)
        if self.compile_scope not in ((None,) if not compiles(self.backend) else backends.COMPILE_SCOPES):
            raise ConfigError(f"--compile-scope {self.compile_scope}: one of {', '.join(backends.COMPILE_SCOPES)}, "
                              "with --backend compile only")
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
    why = backends.unavailable_reason(backend, None, device)
    if why is None and captures(backend) and distributed.world_size() > 1:
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
