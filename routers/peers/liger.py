"""Liger-Kernel's AttnRes kernel (``liger-kernel``: ``LigerAttnResFunction``) as the depth mixer of
the naive schedule.

The package's entry point (liger-kernel 0.8.5, ``liger_kernel/ops/attn_res.py``; the functional
wrapper ``liger_kernel.transformers.functional.liger_attn_res(V, w_query, w_norm, eps=1e-6)``)::

    LigerAttnResFunction.apply(V, w_query, w_norm, eps) -> h

- ``V`` the sources **stacked**, (n, B, T, D) or (n, B·T, D) (a list is stacked inside the forward,
  where autograd does not see the list's tensors: the adapter stacks itself so gradients reach
  every source);
- ``w_query`` (D,) the pseudo-query; ``w_norm`` (D,) the key RMSNorm weight (required):
  k = (V · rsqrt(mean(V²) + eps)).to(w_norm.dtype) · w_norm, logit = w_query·k, no temperature;
- softmax over the n sources per token in float32 (one program per token; the n scores live in
  registers, ``MAX_BLOCKS = max(4, 2^⌈log2 n⌉)`` unrolled; 0.8.5 sizes it from n, the fix of
  Liger-Kernel#1344 where sources past 32 were dropped); ``h`` (B, T, D) in V's dtype;
- backward: a Triton kernel per token (dV, and dW_query / dW_norm by atomic adds);
- plain Triton (no autotuning), so Triton's interpreter runs it on CPU tensors.
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import _common

DIST = "liger-kernel"
NAME = "liger"


def probe() -> str | None:
    """None when liger-kernel imports and CUDA is here (or Triton's interpreter is on)."""
    return (_common.import_reason(DIST, "liger_kernel.ops.attn_res")
            or _common.triton_device_reason(DIST))


def kernel(sources: tuple[Tensor, ...], query: Tensor, key_gain: Tensor | None, eps: float) -> Tensor:
    """``routers.mixer.depth_mix`` through ``LigerAttnResFunction`` (module doc; IMPL.conventions)."""
    from liger_kernel.ops.attn_res import LigerAttnResFunction
    values = torch.stack(tuple(sources), dim=0)                       # (n, B, T, d), as depth_mix
    # w_norm in float32 (our gain cast, or ones): the kernel casts the normalised key to w_norm's
    # dtype before the gain, so a bfloat16 w_norm would round it and compute the gain in bfloat16
    gain = (key_gain.to(torch.float32) if key_gain is not None
            else torch.ones(query.shape, dtype=torch.float32, device=query.device))
    return LigerAttnResFunction.apply(values, query, gain, eps)


IMPL = _common.depth_mixer_impl(NAME, DIST, kernel, probe, dtypes=("float32", "bfloat16", "float16"), interpretable=True,
                                 conventions=(
        "Triton kernel LigerAttnResFunction.apply(V (n,B,T,d) stacked, w_query (d,), w_norm (d,), eps): "
        "keys RMSNorm(V)·w_norm, logits w_query·k with no temperature (as ours), softmax in float32, "
        "output in V's dtype, Triton backward. Mapping: the adapter stacks the sources (a copy, as "
        "depth_mix does; a list passed to the Function would get no gradients); w_norm = our key "
        "gain cast to float32, float32 ones when None (the kernel casts the normalised key to "
        "w_norm's dtype before the gain: a bfloat16 w_norm would round it, and Triton's "
        "interpreter cannot compute in bfloat16); eps = our 1e-6. No per-source bias: no haares / "
        "wav_v1. A read over one source returns that source without calling the kernel, as "
        "depth_mix does. Needs liger-kernel >= 0.8.5 "
        "(Liger-Kernel#1344: sources past 32 dropped before). float64 is not offered (the kernel "
        "computes in float32). No autotuning: runs on CPU under TRITON_INTERPRET=1."))
