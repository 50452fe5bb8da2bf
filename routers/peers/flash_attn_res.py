"""Flash Attention Residuals (``flash-attn-res``) as the two phases of the two-phase schedule.

The package's entry points (flash-attn-res 0.1.12, ``flash_attn_res/ops/phase_{1,2}.py``;
``torch.library.triton_op`` wrappers with registered autograd)::

    phase_1_batched_attention_triton_op(block_representations, pseudo_queries, eps) -> (o, lse)
    phase_2_online_softmax_merge_triton_op(P, pseudo_query, o, lse, eps) -> h

- phase 1: ``block_representations`` the completed sources **stacked** and contiguous (n, B, T, D);
  ``pseudo_queries`` (m, D); logits w·V·rsqrt(mean(V²) + eps) (no gain, no temperature, no bias);
  returns ``o`` (m, B, T, D) the normalised mix, **always bfloat16**, and ``lse`` (m, B, T) the
  log-sum-exp of the logits, float32; backward takes gradients of both;
- phase 2: merges **one** partial source P (B, T, D) into (o, lse) of one query:
  h = o + sigmoid(ℓ_P − lse)·(P − o), ℓ_P = w·P·rsqrt(mean(P²) + eps); h in o's dtype, its values
  rounded to bfloat16 by the kernel whatever that dtype;
- D must be a power of two (``tl.arange(0, D)`` without a mask); all n sources of a token are
  held at once (n padded to a power of two);
- every kernel is ``triton.autotune``d over several configs; the package exposes
  ``set_autotune_configs(kernel, configs)``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..impls import Impl
from ..mixer import EPS
from . import _common

DIST = "flash-attn-res"
NAME = "flash_attn_res"

_pinned = False


def probe() -> str | None:
    """None when flash-attn-res imports and CUDA is here (or Triton's interpreter is on)."""
    return _common.import_reason(DIST, "flash_attn_res") or _common.triton_device_reason(DIST)


def _ops():
    """The package's phase modules. Under Triton's interpreter every autotuned kernel is pinned
    to its first config once (the autotuner benchmarks its configs through the GPU driver, which
    the interpreter does not have: RuntimeError '0 active drivers')."""
    global _pinned
    import flash_attn_res as far
    from flash_attn_res.ops import phase_1, phase_2
    if _common.interpreting() and not _pinned:
        for kernel in (far.phase_1_batched_attention_forward_kernel,
                       far.phase_1_batched_attention_backward_kernel,
                       far.phase_2_online_softmax_merge_forward_kernel,
                       far.phase_2_online_softmax_merge_backward_kernel,
                       far.reduce_grad_queries_kernel):
            far.set_autotune_configs(kernel, kernel.configs[:1])
        _pinned = True
    return phase_1, phase_2


def _check_width(d: int) -> None:
    if d & (d - 1):
        raise ValueError(f"impl {NAME}: flash-attn-res needs a power-of-two width d, got {d}")


def phase1(q: Tensor, bias: Tensor | None, values: tuple[Tensor, ...], inv: tuple[Tensor, ...],
           valid: Tensor | None, scope: object = None) -> tuple[Tensor, Tensor, Tensor]:
    """:func:`routers.block.phases.phase1` through the package's phase 1 (IMPL.conventions).

    ``inv`` (our cached inverse RMS) is not used: the kernel recomputes it. Returns ``o`` in the
    sources' dtype, μ = lse (detached) and s = exp(lse − μ) (= 1, carrying lse's gradient), so
    that μ + log s = lse, the form :func:`merge` and ours merge.
    """
    if bias is not None or valid is not None:
        raise ValueError(f"impl {NAME}: no detail sources and no padded pool (block_attnres, model scope)")
    phase_1, _ = _ops()
    V = torch.stack(tuple(values))                                    # (n, B, T, d)
    _check_width(V.shape[-1])
    o, lse = phase_1.phase_1_batched_attention_triton_op(V, q.contiguous(), EPS)
    mx = lse.detach()
    return o.to(V.dtype), mx, torch.exp(lse - mx)


def merge(o: Tensor, mx: Tensor, s: Tensor, q: Tensor, P: Tensor, details: list[Tensor],
          bias: Tensor | None, max_detail_scale: float, *lean: object) -> Tensor:
    """:func:`routers.block.phases.merge` through the package's phase 2 (IMPL.conventions)."""
    if details:
        raise ValueError(f"impl {NAME}: no partial detail sources (block_attnres only)")
    _, phase_2 = _ops()
    lse = (mx + torch.log(s)).to(torch.float32).contiguous()
    P = P.contiguous()
    _check_width(P.shape[-1])
    h = phase_2.phase_2_online_softmax_merge_triton_op(P, q.contiguous(), o.contiguous(), lse, EPS)
    return h.to(P.dtype)


IMPL = Impl(
    name=NAME,
    routers=("block_attnres",),
    schedule="two_phase",
    phases=(phase1, merge),
    devices=("cuda",),
    dtypes=("bfloat16",),
    modes=("fwd", "fwd_bwd", "train_step", "decode"),
    package=DIST,
    probe=probe,
    interpretable=True,
    conventions=(
        "Triton kernels (torch.library.triton_op) phase_1_batched_attention_triton_op(V (n,B,T,d) "
        "stacked, Q (m,d), eps) -> (o (m,B,T,d) bfloat16, lse (m,B,T) float32) and "
        "phase_2_online_softmax_merge_triton_op(P, q, o, lse, eps) -> h (o + sigmoid(l_P - lse)(P - o)). "
        "No temperature, no key gain, no bias, one partial source: block_attnres only (no haares / "
        "wav_v1, whose details and detail bias it cannot take). Mapping: our key gain folded into "
        "the queries (g ⊙ w, as ours); eps = our 1e-6; phase 1's (o, lse) become our (o, mu, s) with "
        "mu = lse detached and s = exp(lse - mu), so mu + log s = lse keeps lse's gradient; o and h "
        "cast back to the sources' dtype (the kernels round them to bfloat16 whatever the input "
        "dtype, so only bfloat16 is offered: float32 inputs give bfloat16-accurate results, "
        "~4e-3 relative). Our cached inverse RMS is not used (the kernel recomputes it). d must be "
        "a power of two (ValueError otherwise). Under TRITON_INTERPRET=1 the adapter pins every "
        "autotuned kernel to its first config (the autotuner needs a GPU driver)."),
)
