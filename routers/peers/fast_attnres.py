"""Fast-AttnRes (``fast-attnres``, import name ``attnres``: ``attnres.attnres``) as the depth mixer of
the naive schedule.

The package's entry point (fast-attnres 2.1.0, ``attnres/api.py``)::

    attnres(values, query, *, eps=2**-23, scale=1.0) -> output

- ``values`` either packed (S, …, D) or an ordered list/tuple of S (…, D) tensors (not stacked:
  the source-list route reads each tensor where it lies); 1 ≤ S ≤ 129, 1 ≤ D ≤ 8192;
- ``query`` (R,), 1 ≤ R ≤ D: the key is the last R coordinates of each source, RMS-normalised
  (no learnable gain), ``score = scale · q·k``; R = D is standard AttnRes (sliced LR-AttnRes for
  R < D); softmax over the sources per token, float32 accumulators;
- values, query, output and first-order gradients are **CUDA bfloat16** only (TypeError for any
  other dtype, RuntimeError for CPU tensors); Triton kernels (``triton`` is only in the package's
  ``[cuda]`` extra), wrapped as ``torch.library.custom_op(device_types="cuda")`` with autograd.
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import _common

DIST = "fast-attnres"
NAME = "fast_attnres"


def probe() -> str | None:
    """None when fast-attnres (and the Triton it needs) import and CUDA is here, else why not."""
    return (_common.import_reason(DIST, "attnres")
            or _common.import_reason(f"triton (needed by {DIST}, only in its [cuda] extra)", "triton")
            or _common.cuda_only_reason(DIST, "attnres raises RuntimeError 'attnres requires CUDA "
                                              "tensors'; custom ops registered for cuda only"))


def kernel(sources: tuple[Tensor, ...], query: Tensor, key_gain: Tensor | None, eps: float) -> Tensor:
    """``routers.mixer.depth_mix`` through ``attnres.attnres`` (module doc; IMPL.conventions)."""
    if sources[0].dtype != torch.bfloat16:
        raise TypeError(f"impl {NAME}: fast-attnres takes bfloat16 sources only, got {sources[0].dtype}")
    from attnres import attnres
    # a key gain folds into the query: w·RMSNorm_g(V) = (g ⊙ w)·RMSNorm(V)
    q = query if key_gain is None else query * key_gain
    return attnres(tuple(sources), q.to(torch.bfloat16), eps=eps, scale=1.0)


IMPL = _common.depth_mixer_impl(NAME, DIST, kernel, probe, dtypes=("bfloat16",),
                                 conventions=(
        "Triton kernels (CUDA custom ops) attnres.attnres(values [n × (B,T,d)], query (R,), eps=2**-23, "
        "scale=1.0): keys = RMSNorm of the last R coordinates, no gain; R = d here (standard AttnRes, "
        "not the sliced LR-AttnRes); logits scale·q·k; softmax with float32 accumulators; CUDA "
        "bfloat16 values, query, output and gradients only. Mapping: eps = our 1e-6 (not the "
        "package's 2**-23); scale = 1.0 (no temperature, as ours); our key gain folded into the "
        "query (g ⊙ w), cast to bfloat16. No per-source bias: no haares / wav_v1. A read over one "
        "source returns that source without calling the kernel, as depth_mix does. CUDA only, even "
        "under TRITON_INTERPRET=1 (RuntimeError 'attnres requires CUDA tensors')."))
