"""The spec of ``routerbench train``: time to a target validation loss, per router and seed."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

from routers.errors import ConfigError

from .base import Labels, option
from .parts import (NOT_IN_FILE, absolute, Output, RouterSet, Single, base_shape, preset_base, check_heads, check_router_set,
                    check_output, resolve_device, resolved_shape)

DEFAULT_ROUTERS = ("prenorm", "haares")

DEFAULT_PRESET = "cpu-train"


@dataclass(frozen=True)
class Training:
    """The training protocol (``[training]``; ``harness/train.py``)."""

    data: str | None = option("str", "Corpus dir (`routerbench data prepare`); default: the embedded "
                              "stdlib corpus.", metavar="DIR", path=True)
    target_loss: float | None = option("float", "Validation loss in nats that stops the clock (required).",
                                       min=0, min_open=True)
    seeds: int | None = option("int", "Number of seeds, 0..N-1 (default: 1).", min=1)
    max_steps: int | None = option("int", "Step budget (default: 300).", min=1)
    eval_every: int | None = option("int", "Evaluation cadence in steps (default: 20).", min=1)
    lr: float | None = option("float", "Peak learning rate (default: 0.003).", min=0, min_open=True)
    stop_at_target: bool | None = option("bool", "End each run at the target, without the loss at the "
                                         "token budget (default: off).")


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
            ConfigError: no target, the ``router_only`` workload, a bad shape or router option, a
                corpus that cannot be read or whose validation split is shorter than a sequence.
        """
        s, tr, out = self.shape, self.training, self.output
        if tr.target_loss is None:
            raise ConfigError(f"{L('training.target_loss')} is required (nats), e.g. --target-loss 1.6 "
                              "or target_loss = 1.6 under [training] in the --config file")
        if s.workload not in (None, "decoder"):
            raise ConfigError(f"{L('shape.workload')} {s.workload}: training needs the decoder workload")
        check_output(out, L)
        dev = resolve_device(out.device, L("output.device"))
        pb = preset_base(s, dev, DEFAULT_PRESET)
        d_model, n_layers = s.d_model or pb.d_model, s.n_layers or pb.n_layers
        check_heads([d_model], s.n_heads or pb.n_heads, L, "shape.d_model")
        base = base_shape(s, dev, DEFAULT_PRESET, d_model=d_model, n_layers=n_layers)
        routers = self.routers.routers or DEFAULT_ROUTERS
        check_router_set(self.routers, routers, [n_layers], d_model, L)
        from workloads.data import CharCorpus
        if tr.data is not None:
            corpus = CharCorpus.open(tr.data, L("training.data"))
            if len(corpus.val) < base.seq_len + 1:
                raise ConfigError(f"{L('shape.seq_len')} {base.seq_len}: the validation split of "
                                  f"{tr.data} has only {len(corpus.val)} tokens; lower it")
        return replace(
            self,
            shape=resolved_shape(s, base, preset=s.preset or DEFAULT_PRESET, d_model=d_model, n_layers=n_layers),
            routers=replace(self.routers, routers=routers, router_options=self.routers.router_options or None),
            training=replace(tr, data=absolute(tr.data), seeds=tr.seeds or 1, max_steps=tr.max_steps or 300,
                             eval_every=tr.eval_every or 20, lr=tr.lr or 3e-3,
                             stop_at_target=bool(tr.stop_at_target)),
            output=replace(out, device=str(dev), report=out.report is not False, quiet=bool(out.quiet)),
        )

    def decoder_config(self):
        """The decoder shape of a resolved spec (``vocab_size`` is set from the corpus later)."""
        import torch
        s = self.shape
        return base_shape(s, torch.device(self.output.device), DEFAULT_PRESET, d_model=s.d_model,
                          n_layers=s.n_layers)
