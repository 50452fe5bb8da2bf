"""Step functions of the measured modes (DESIGN.md, "Backends and modes").

- ``fwd``: inference prefill, ``model(x)`` under ``torch.no_grad()`` in eval mode.
- ``fwd_bwd``: training forward, next-token cross-entropy, backward; gradients are dropped
  (``grad = None``) at the start of each step so every step does the same work.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def lm_loss(logits: Tensor, targets: Tensor) -> Tensor:
    """Mean next-token cross-entropy in nats (float32 accumulation); logits (B, T, V), targets (B, T)."""
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())


def make_step(model: nn.Module, mode: str, x: Tensor, y: Tensor,
              clone_outputs: bool = False) -> Callable[[], Tensor]:
    """A zero-argument step of ``mode`` on the fixed batch (x, y).

    Args:
        model: the (possibly compiled) decoder; its train/eval flag is set here.
        mode: ``"fwd"`` or ``"fwd_bwd"``.
        x, y: token ids (B, T) on the model's device.
        clone_outputs: clone the logits (``compile`` with ``reduce-overhead`` reuses output
            buffers on the next call, pytorch/pytorch#170604).

    Returns:
        ``step()`` returning the logits (``fwd``) or the loss (``fwd_bwd``) without a host sync.

    Raises:
        ValueError: unknown mode.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    if mode == "fwd":
        model.eval()

        def step() -> Tensor:
            with torch.no_grad():
                out = model(x)
                return out.clone() if clone_outputs else out
    elif mode == "fwd_bwd":
        model.train()

        def step() -> Tensor:
            for p in params:
                p.grad = None
            loss = lm_loss(model(x), y)
            loss.backward()
            return loss
    else:
        raise ValueError(f"--modes: unknown mode {mode!r}; known: fwd, fwd_bwd")
    return step
