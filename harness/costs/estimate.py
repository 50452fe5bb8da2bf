"""Memory a decoder will take, estimated before it is built (for splitting a paired group and for
choosing a training schedule): its parameter count in closed form (the router's counted on the
``meta`` device), a warm step's bytes, and a training run's bytes by term. Estimates, stated as
such; what was measured is :mod:`harness.costs.memory`.
"""

from __future__ import annotations

import functools
import json

import torch

from routers import build_router


def meta_router(router: str, d_model: int, n_layers: int, options: dict) -> torch.nn.Module:
    """The router of that shape built on the ``meta`` device (no memory), built once per router,
    shape and options (a plan asks for the same one hundreds of times); read it, never change it."""
    return _meta_router(router, d_model, n_layers, json.dumps(options or {}, sort_keys=True, default=str))


@functools.lru_cache(maxsize=512)
def _meta_router(router: str, d_model: int, n_layers: int, options: str) -> torch.nn.Module:
    with torch.device("meta"):
        return build_router(router, d_model, n_layers, **json.loads(options))


def decoder_parameter_count(cfg, router: str, options: dict) -> int:
    """Parameters of a decoder of shape ``cfg`` with ``router``: the shared part in closed form
    (per layer 4d² attention, 12d² SwiGLU or 8d² GELU MLP, two norm gains; embedding and LM head
    V·d each unless tied; the final norm), the router's counted on the ``meta`` device (no memory
    is allocated)."""
    n_router = sum(p.numel() for p in meta_router(router, cfg.d_model, cfg.n_layers, options).parameters())
    d, L, V = cfg.d_model, cfg.n_layers, cfg.vocab_size
    mlp = 12 * d * d if cfg.mlp == "swiglu" else 8 * d * d
    return L * (4 * d * d + mlp + 2 * d) + V * d * (1 if cfg.tie_embeddings else 2) + d + n_router


def estimate_bytes(cfg, router: str, options: dict, precision: str = "fp32", grad_accum: int = 1,
                   world_size: int = 1) -> dict[str, int]:
    """Estimated peak memory of one training run on one device, by term, in bytes:

    - ``states``: weights, gradients and AdamW's two moments in float32, 16 bytes per parameter
      (:func:`decoder_parameter_count`). DDP replicates all four on every rank (its gradients are
      views of its all-reduce buckets, so no second copy), so this term does not shrink with the
      world size;
    - ``activations`` per layer of a micro-batch of b = batch / (world_size · grad_accum) rows:
      s·b·d·(34 + 5·h·s/d) bytes at 2 bytes per value (Korthikanti et al. 2022, "Reducing
      Activation Recomputation in Large Transformer Models", eq. 1), doubled for float32;
    - ``logits``: the logits and their gradient in float32, 2·b·s·V·4 bytes.

    The last two shrink with the world size (each rank holds its slice of the global batch).
    """
    b, s, d, h = cfg.batch_size // (world_size * grad_accum), cfg.seq_len, cfg.d_model, cfg.n_heads
    per_value = 1.0 if precision == "bf16-mixed" else 2.0
    return {"states": 16 * decoder_parameter_count(cfg, router, options),
            "activations": int(cfg.n_layers * s * b * d * (34 + 5 * h * s / d) * per_value),
            "logits": 2 * b * s * cfg.vocab_size * 4}


def step_bytes(cfg, router: str, options: dict, mode: str) -> int:
    """Estimated memory a step of ``mode`` holds once built and warm, in bytes (an estimate, stated
    as such): weights (by dtype); for ``fwd_bwd`` and ``train_step`` their gradients and the
    activations of a step (Korthikanti et al. 2022, eq. 1, at this dtype's bytes); AdamW's two
    float32 moments for ``train_step``; one layer's activations otherwise. What one case of a
    paired group holds while the group is timed (:func:`harness.sweep.plan.split_group`)."""
    if cfg.workload == "router_only":
        n = decoder_parameter_count(cfg, router, options) - 16 * cfg.d_model ** 2 * cfg.n_layers
    else:
        n = decoder_parameter_count(cfg, router, options)
    item = torch.tensor([], dtype=cfg.torch_dtype).element_size()
    b, t, d, h = cfg.batch_size, cfg.seq_len, cfg.d_model, cfg.n_heads
    layer = t * b * d * (34 + 5 * h * t / d) * item / 2
    total = n * item + 2 * b * t * cfg.vocab_size * 4
    if mode in ("fwd_bwd", "train_step"):
        total += n * item + cfg.n_layers * layer
    else:
        total += layer
    if mode == "train_step":
        total += 8 * n
    return int(total)
