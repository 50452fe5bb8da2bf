"""The spec of ``routerbench train``: time to a target validation loss, per router and seed."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

from harness.step.backends import COMPILE_SCOPES, DEFAULT_COMPILE_SCOPE, compiles
from harness.training.config import (PILOT_SEED, PRECISIONS, TRAIN_BACKENDS, check_world_size,
                                     default_eval_every)
from harness.training.schedule import SCHEDULES
from routers import ROUTERS, check_router_options
from routers.errors import ConfigError

from .base import Labels, given, option
from .parts import (NOT_IN_FILE, Output, RouterSet, Single, absolute, base_shape, check_heads, check_output,
                    check_router_set, preset_base, resolve_device, resolved_shape)

DEFAULT_ROUTERS = ("prenorm", "block_attnres", "haares")
DEFAULT_PILOT = "prenorm"

DEFAULT_PRESET = "cpu-train"


@dataclass(frozen=True)
class Training:
    """The training protocol (``[training]``; ``harness/training/run.py``, ``harness/training/schedule.py``)."""

    data: str | None = option("str", "Corpus dir (`routerbench data prepare`); default: the embedded "
                              "stdlib corpus.", metavar="DIR", path=True)
    target_loss: float | None = option("float", "Validation loss in nats that stops the clock (default: "
                                       "set by a pilot run, --target-from-pilot).", min=0, min_open=True)
    target_from_pilot: str | None = option("str", "Router of the pilot run that sets the target: its "
                                           "val loss at --pilot-fraction of the budget, with its own seed "
                                           f"{PILOT_SEED} (default: prenorm, unless --target-loss).",
                                           choices=lambda: tuple(ROUTERS), metavar="ROUTER")
    pilot_fraction: float | None = option("float", "Where the pilot's target is read: the first "
                                          "evaluation at or after this fraction of the step budget "
                                          "(default: 0.5).", min=0, min_open=True, max=1)
    seeds: int | None = option("int", "Number of seeds, 0..N-1; every router trains once per seed "
                               "(default: 3).", min=1)
    max_steps: int | None = option("int", "Step budget (default: 300, or the preset's).", min=1)
    eval_every: int | None = option("int", "Evaluation cadence in steps (default: 2.5 % of the step "
                                    "budget).", min=1)
    lr: float | None = option("float", "Peak learning rate (default: 0.003, or the preset's).", min=0,
                              min_open=True)
    stop_at_target: bool | None = option("bool", "End each run at the target, without the loss at the "
                                         "token budget (default: off).")
    schedule: str | None = option("str", "interleaved: the runs of a seed advance in turns of --chunk "
                                  "steps in one process; sequential: one after the other; auto "
                                  "(default): interleaved when they fit in half the free memory.",
                                  choices=SCHEDULES)
    chunk: int | None = option("int", "Steps per turn of the interleaved schedule (default: the "
                               "evaluation cadence).", min=1)
    backend: str | None = option("str", "eager (default), compile, or cudagraph (the whole step "
                                 "captured; CUDA only, a skipped row elsewhere).", choices=TRAIN_BACKENDS)
    compile_scope: str | None = option("str", "With --backend compile: layer (one region per sublayer "
                                       "role, compiled once) or model (the whole forward; default: "
                                       f"{DEFAULT_COMPILE_SCOPE}).", choices=COMPILE_SCOPES)
    precision: str | None = option("str", "fp32 (default), or bf16-mixed: float32 weights and "
                                   "optimizer, bf16 autocast.", choices=PRECISIONS)
    grad_accum: int | None = option("int", "Micro-batches per step; --batch-size is split into them "
                                    "(under torchrun each process's rows of it; default: 1, or the preset's).", min=1)
    warmup_steps: int | None = option("int", "Steps of linear learning-rate warm-up before the cosine "
                                      "decay (default: 20, or the preset's).", min=0)


def preset_training(s, tr):
    """The shape and training options with the defaults of ``--preset``'s training settings
    (``workloads.config.TRAINING_PRESETS``: global batch, with the preset's batch as micro-batch
    through ``--grad-accum``; learning rate, warm-up, step budget) where the command line and the
    config file leave them unset; unchanged for a preset without training settings."""
    from workloads.config import TRAINING_PRESETS
    tp = TRAINING_PRESETS.get(s.preset) if s.preset else None
    if tp is None:
        return s, tr
    if s.batch_size is None:
        s = replace(s, batch_size=tp.global_batch.value)
        if tr.grad_accum is None:
            tr = replace(tr, grad_accum=tp.grad_accum)
    return s, replace(tr, lr=tr.lr or tp.lr.value, max_steps=tr.max_steps or tp.max_steps.value,
                      warmup_steps=tp.warmup_steps.value if tr.warmup_steps is None else tr.warmup_steps)


@dataclass(frozen=True)
class TrainSpec:
    """Everything ``routerbench train`` needs; :meth:`resolve` checks it and fills in defaults."""

    COMMAND: ClassVar[str] = "train"
    NOT_IN_FILE: ClassVar[tuple[str, ...]] = NOT_IN_FILE

    shape: Single = Single()
    routers: RouterSet = RouterSet()
    training: Training = Training()
    output: Output = Output()

    def resolve(self, L: Labels) -> "TrainSpec":
        """Check every option and fill in defaults.

        Raises:
            ConfigError: a target given together with a pilot (or a pilot fraction), a dtype other
                than float32 (training uses ``--precision``), the ``router_only`` workload, a bad
                shape, router option or pilot router, ``--grad-accum`` not dividing the batch (or
                under torchrun the batch not splitting over ``WORLD_SIZE`` processes), a
                corpus that cannot be read or whose validation split is shorter than a sequence.
        """
        s, tr, out = self.shape, self.training, self.output
        s, tr = preset_training(s, tr)
        if tr.target_loss is not None and tr.target_from_pilot is not None:
            raise ConfigError(f"{L('training.target_from_pilot')} and {L('training.target_loss')} exclude "
                              "each other: give the target, or the router of the pilot that sets it")
        if tr.target_loss is not None and tr.pilot_fraction is not None:
            raise ConfigError(f"{L('training.pilot_fraction')} applies to a pilot target; "
                              f"{L('training.target_loss')} gives the target itself: drop one of them")
        if s.dtype not in (None, "float32"):
            raise ConfigError(f"{L('shape.dtype')} {s.dtype}: training keeps float32 weights and "
                              f"optimizer state; use {L('training.precision')} bf16-mixed")
        if s.workload not in (None, "decoder"):
            raise ConfigError(f"{L('shape.workload')} {s.workload}: training needs the decoder workload")
        check_output(out, L)
        dev = resolve_device(out.device, L("output.device"))
        pb = preset_base(s, dev, DEFAULT_PRESET)
        d_model, n_layers = s.d_model or pb.d_model, s.n_layers or pb.n_layers
        check_heads([d_model], s.n_heads or pb.n_heads, L, "shape.d_model")
        preset_dtype = pb.dtype
        base = base_shape(replace(s, dtype=None), dev, DEFAULT_PRESET, d_model=d_model, n_layers=n_layers,
                          dtype="float32")
        precision = tr.precision or ("bf16-mixed" if preset_dtype == "bfloat16" else "fp32")
        if tr.grad_accum is not None and base.batch_size % tr.grad_accum:
            raise ConfigError(f"{L('training.grad_accum')} {tr.grad_accum} does not divide "
                              f"{L('shape.batch_size')} {base.batch_size}; change one of them")
        from harness.training.distributed import env_world_size
        world = env_world_size()  # torchrun's WORLD_SIZE: checked before any model is built
        if world > 1:
            origin = ("" if self.shape.batch_size is not None
                      else f" of {L('shape.preset')} {s.preset or DEFAULT_PRESET}")
            check_world_size(base.batch_size, tr.grad_accum or 1, world, L("shape.batch_size"),
                             L("training.grad_accum"), origin)
        routers = self.routers.routers or DEFAULT_ROUTERS
        pilot = None if tr.target_loss is not None else (tr.target_from_pilot or DEFAULT_PILOT)
        check_router_set(self.routers, tuple(dict.fromkeys((*routers, *([pilot] if pilot else [])))),
                         [n_layers], d_model, L)
        if pilot:
            check_router_options(pilot, (self.routers.router_options or {}).get(pilot, {}), d_model, n_layers,
                                 L("training.target_from_pilot"))
        from workloads.data import CharCorpus
        if tr.data is not None:
            corpus = CharCorpus.open(tr.data, L("training.data"))
            if len(corpus.val) < base.seq_len + 1:
                raise ConfigError(f"{L('shape.seq_len')} {base.seq_len}: the validation split of "
                                  f"{tr.data} has only {len(corpus.val)} tokens; lower it")
        if given(tr, "compile_scope") and not compiles(tr.backend):
            raise ConfigError(f"{L('training.compile_scope')} has no effect without {L('training.backend')} "
                              "compile; drop it or add --backend compile")
        if given(tr, "chunk") and tr.schedule == "sequential":
            raise ConfigError(f"{L('training.chunk')} has no effect with {L('training.schedule')} sequential "
                              "(each run trains to its end in one turn); drop one of them")
        max_steps = tr.max_steps or 300
        eval_every = tr.eval_every or default_eval_every(max_steps)
        if eval_every > max_steps:
            raise ConfigError(f"{L('training.eval_every')} {eval_every} is more than {L('training.max_steps')} "
                              f"{max_steps}: the run would be evaluated only at its ends; lower it (default: "
                              f"{default_eval_every(max_steps)}, 2.5 % of the budget)")
        return replace(
            self,
            shape=resolved_shape(s, base, preset=s.preset or DEFAULT_PRESET, d_model=d_model, n_layers=n_layers),
            routers=replace(self.routers, routers=routers, router_options=self.routers.router_options or None),
            training=replace(tr, data=absolute(tr.data), seeds=tr.seeds or 3, max_steps=max_steps,
                             eval_every=eval_every, lr=tr.lr or 3e-3, stop_at_target=bool(tr.stop_at_target),
                             target_from_pilot=pilot,
                             pilot_fraction=None if tr.target_loss is not None else (tr.pilot_fraction or 0.5),
                             schedule=tr.schedule or "auto",
                             chunk=None if tr.schedule == "sequential" else (tr.chunk or eval_every),
                             backend=tr.backend or "eager", precision=precision, grad_accum=tr.grad_accum or 1,
                             compile_scope=(tr.compile_scope or DEFAULT_COMPILE_SCOPE) if compiles(tr.backend)
                             else None,
                             warmup_steps=20 if tr.warmup_steps is None else tr.warmup_steps),
            output=replace(out, device=str(dev), report=out.report is not False, quiet=bool(out.quiet)),
        )

    def decoder_config(self):
        """The decoder shape of a resolved spec (``vocab_size`` is set from the corpus later)."""
        import torch
        s = self.shape
        return base_shape(s, torch.device(self.output.device), DEFAULT_PRESET, d_model=s.d_model,
                          n_layers=s.n_layers)

    def train_config(self):
        """The :class:`harness.training.config.TrainConfig` of a resolved spec (``target_loss`` None when a
        pilot sets it)."""
        from harness.training.config import TrainConfig
        tr = self.training
        return TrainConfig(self.decoder_config(), target_loss=tr.target_loss, max_steps=tr.max_steps,
                           eval_every=tr.eval_every, lr=tr.lr, stop_at_target=tr.stop_at_target,
                           backend=tr.backend, precision=tr.precision, grad_accum=tr.grad_accum,
                           warmup_steps=20 if tr.warmup_steps is None else tr.warmup_steps,
                           compile_scope=tr.compile_scope)
