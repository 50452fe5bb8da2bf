"""Step functions of the measured modes (DESIGN.md, "Backends and modes").

- ``fwd``: inference prefill, ``model(x)`` under ``torch.no_grad()`` in eval mode.
- ``fwd_bwd``: training forward, next-token cross-entropy, backward; gradients are dropped
  (``grad = None``) at the start of each step so every step does the same work.
- ``train_step``: ``fwd_bwd`` plus an AdamW step (weight decay on matrices only).
- ``decode``: one new token at position T−1 against a KV cache holding T−1 tokens (the setting
  of the AttnRes paper's "<2 % inference latency" claim). The cache is filled once by
  :func:`prefill_for_decode`; each step rewrites the same cache slot, so every step does the
  same work.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from workloads.decoder import decay_groups

MODES = ("fwd", "fwd_bwd", "train_step", "decode")


def lm_loss(logits: Tensor, targets: Tensor) -> Tensor:
    """Mean next-token cross-entropy in nats (float32 accumulation); logits (B, T, V), targets (B, T)."""
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())


def eager_module(model: nn.Module) -> nn.Module:
    """The ``nn.Module`` behind a ``torch.compile`` wrapper (its ``_orig_mod``), else ``model``."""
    return getattr(model, "_orig_mod", model)


def prefill_for_decode(model: nn.Module, x: Tensor) -> tuple[Tensor, Tensor]:
    """Set up the KV cache of the eager ``model`` and fill it with x[:, :-1].

    Returns:
        the decode input: the last token (B, 1) and its position (1,) int64.
    """
    model.eval()
    model.setup_kv_cache(x.shape[0])
    with torch.no_grad():
        model(x[:, :-1])
    pos = torch.tensor([x.shape[1] - 1], device=x.device)
    return x[:, -1:].contiguous(), pos


def make_optimizer(model: nn.Module, lr: float = 1e-3, weight_decay: float = 0.1,
                   capturable: bool = False) -> torch.optim.AdamW:
    """AdamW for ``train_step``; with ``capturable`` the LR is a tensor and the step can be
    captured in a CUDA graph (a Python float would be baked into the graph)."""
    module = eager_module(model)
    device = next(module.parameters()).device
    lr_value = torch.tensor(lr, device=device) if capturable else lr
    return torch.optim.AdamW(decay_groups(module, weight_decay), lr=lr_value, betas=(0.9, 0.95),
                             capturable=capturable, foreach=True)


def make_step(model: nn.Module, mode: str, x: Tensor, y: Tensor, clone_outputs: bool = False,
              decode_input: tuple[Tensor, Tensor] | None = None,
              optimizer: torch.optim.Optimizer | None = None) -> Callable[[], Tensor]:
    """A zero-argument step of ``mode`` on the fixed batch (x, y).

    Args:
        model: the (possibly compiled) decoder; its train/eval flag is set here.
        mode: one of :data:`MODES`.
        x, y: token ids (B, T) on the model's device.
        clone_outputs: clone the logits (``compile`` with ``reduce-overhead`` reuses output
            buffers on the next call, pytorch/pytorch#170604).
        decode_input: (token (B, 1), position (1,)) from :func:`prefill_for_decode` (``decode``).
        optimizer: the optimizer of ``train_step`` (default: :func:`make_optimizer`).

    Returns:
        ``step()`` returning the logits (``fwd``, ``decode``) or the loss, without a host sync.

    Raises:
        ValueError: unknown mode, or ``decode`` without ``decode_input``.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    if mode in ("fwd", "decode"):
        model.eval()
        if mode == "decode":
            if decode_input is None:
                raise ValueError("mode decode needs decode_input from prefill_for_decode")
            tok, pos = decode_input
            args: tuple = (tok, pos)
        else:
            args = (x,)

        def step() -> Tensor:
            with torch.no_grad():
                out = model(*args)
                return out.clone() if clone_outputs else out
    elif mode == "fwd_bwd":
        model.train()

        def step() -> Tensor:
            for p in params:
                p.grad = None
            loss = lm_loss(model(x), y)
            loss.backward()
            return loss
    elif mode == "train_step":
        model.train()
        opt = optimizer or make_optimizer(model)

        def step() -> Tensor:
            opt.zero_grad(set_to_none=True)
            loss = lm_loss(model(x), y)
            loss.backward()
            opt.step()
            return loss
    else:
        raise ValueError(f"--modes: unknown mode {mode!r}; known: {', '.join(MODES)}")
    return step
