"""The depth mixer shared by the Attention Residuals family (arXiv:2603.15031) and by WAV v1 /
HAARES (arXiv:2606.06564); ROUTERS.md, "The depth mixer".

    logit_j = w · RMSNorm(V_j) + bias_j        keys RMS-normalised (no 1/√d temperature)
    α       = softmax_j(logit_j)               over the n sources, per token
    h       = Σ_j α_j V_j                      values are the raw sources

Analytic cost of one read over n sources of width d, per token, in the FLOP convention of
docs/FLOPS.md (FLOP = 2·FMA; an elementwise op is 1 FLOP per element):
    keys (RMSNorm without gain): 3·n·d + 2·n   (+ n·d with a key gain)
    logits (dot with w): n·d FMA = 2·n·d
    bias: n (only when a bias is given)
    softmax over n: 5·n
    weighted sum: n·d FMA = 2·n·d
so 7·n·d + 7·n FLOP per token and read (plus n with a bias); a read over one source is the
identity and costs 0.

Precision (ROUTERS.md, "Precision"): for bfloat16 and float16 sources the whole read is computed
in float32 (key RMS, logits, softmax and the weighted sum) and only ``h`` is rounded to the input
dtype, as FLA's and Liger's references do; float32 and float64 are computed in their own dtype.
So a bf16 read errs by about the rounding of its output alone, and the parity allowance of a peer
(harness/sweep/parity.py) rests on that, not on rounding inside the reference.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

#: ε of every RMS in the routers (keys and detail RMS matching), ROUTERS.md "Constants".
EPS = 1e-6


def softmax_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32 for low-precision tensors (softmax statistics in float32), else the dtype itself
    (``torch.promote_types(dtype, float32)`` for floating dtypes, decided in Python: a
    ``promote_types`` call is a dispatched op, one per read)."""
    return torch.float32 if dtype.is_floating_point and dtype.itemsize < 4 else dtype


def depth_mix(sources: Sequence[Tensor], query: Tensor, bias: Tensor | None = None,
              key_gain: Tensor | None = None, eps: float = EPS,
              recorder: Callable[[Tensor], None] | None = None) -> Tensor:
    """Mix ``sources`` with a pseudo-query (the naive reference: stack, then mix).

    Args:
        sources: n tensors V_j of shape (B, T, d), in pool order.
        query: pseudo-query w of shape (d,).
        bias: per-source logit bias of shape (n,), or None.
        key_gain: learnable gain of the key RMSNorm, shape (d,), or None (no gain, the default).
        eps: RMSNorm ε.
        recorder: observation hook (``harness.training.diagnose``), None by default: when given, it is
            called once with the softmax weights α, detached, shape (n, B, T) in the dtype of the
            sources (ones of shape (1, B, T) when n = 1). It changes nothing that is computed.

    Returns:
        h of shape (B, T, d), dtype of the sources (computed in float32 for 16-bit sources).
    """
    if len(sources) == 1:
        if recorder is not None:
            recorder(sources[0].new_ones((1, *sources[0].shape[:-1])))
        return sources[0]  # softmax over one source is 1: the read is the source itself
    values = torch.stack(tuple(sources), dim=0)                      # (n, B, T, d)
    acc = softmax_dtype(values.dtype)                                # float32 for 16-bit sources
    v = values.to(acc)
    keys = F.rms_norm(v, (v.shape[-1],), weight=None if key_gain is None else key_gain.to(acc), eps=eps)
    logits = torch.matmul(keys, query.to(acc))                       # (n, B, T)
    if bias is not None:
        logits = logits + bias.to(acc).view(-1, 1, 1)
    alpha = torch.softmax(logits, dim=0)
    if recorder is not None:
        recorder(alpha.detach().to(values.dtype))
    return torch.einsum("nbt,nbtd->btd", alpha, v).to(values.dtype)


def rms(x: Tensor) -> Tensor:
    """Root mean square over the last dim, keepdim: (…, d) → (…, 1). No ε (callers add it)."""
    return x.square().mean(dim=-1, keepdim=True).sqrt()


def rms_match(detail: Tensor, state: Tensor, max_scale: float, eps: float = EPS) -> Tensor:
    """Detached RMS matching of a detail basis to its state basis (arXiv:2606.06564).

    ``D̃ = D · min(ρ, sg[rms(C)] / (sg[rms(D)] + ε))``, rms over d per token.

    Args:
        detail: D, shape (B, T, d).
        state: C (completed block) or P (partial block), shape (B, T, d).
        max_scale: ρ, the cap on the gain.
        eps: ε of the denominator; keeps a zero detail NaN-free (0 · finite = 0).

    Returns:
        D̃ of shape (B, T, d).
    """
    with torch.no_grad():
        scale = torch.clamp(rms(state) / (rms(detail) + eps), max=max_scale)
    return detail * scale
