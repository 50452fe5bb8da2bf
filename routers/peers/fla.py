"""FLA's fused AttnRes kernel (``fla-core``: ``fla.ops.attnres.fused_attnres``) as the depth mixer of
the naive schedule.

The package's entry point (fla-core 0.6.0, ``fla/ops/attnres/fused.py``)::

    fused_attnres(query, residuals, rms_weight, output_rms_weight=None, rms_eps=1e-6, scale=1.0,
                  return_weights=False, checkpoint_level=1) -> o

- ``query`` (D,) or (D, 1); ``residuals`` a non-empty sequence of n same-shape (…, D) tensors (not
  stacked: the kernel reads them through a table of pointers, padded to max(8, 2^⌈log2 n⌉)); each
  is flattened to (N, D), made contiguous, and must be 16-byte aligned (asserted);
- ``rms_weight`` (D,) the key RMSNorm weight (required); the kernel folds it into the query:
  logit = (q ⊙ w)·V · rsqrt(mean(V²) + eps), so dq = Σ dqw ⊙ w and dw = Σ dqw ⊙ q;
- ``output_rms_weight``: when given, an RMSNorm of the mixed output is fused in (the sublayer's
  input norm); we pass None: the norm belongs to the workload;
- ``scale`` multiplies the logits (no 1/√d by default); softmax over the n sources per token,
  online, in float32; ``o`` has the residuals' dtype and shape;
- autograd: ``FusedAttnresFunction`` with a Triton backward (dv per source, dq, dw;
  ``checkpoint_level`` 1 recomputes the mix in the backward);
- CUDA only: ``fused_attnres_fwd`` raises ``ValueError("Triton attnres requires CUDA tensors")``
  for CPU tensors, so Triton's interpreter cannot run it on CPU. A Gluon backend exists, opt-in
  (``FLA_GLUON=1``), CUDA only; an Ascend backend for NPUs.
"""

from __future__ import annotations

from torch import Tensor


from . import _common

DIST = "fla-core"
NAME = "fla"


def probe() -> str | None:
    """None when fla-core imports and CUDA is here, else why not."""
    return (_common.import_reason(DIST, "fla.ops.attnres")
            or _common.cuda_only_reason(DIST, "fused_attnres raises ValueError 'Triton attnres "
                                              "requires CUDA tensors' for CPU tensors"))


def kernel(sources: tuple[Tensor, ...], query: Tensor, key_gain: Tensor | None, eps: float) -> Tensor:
    """``routers.mixer.depth_mix`` through ``fused_attnres`` (module doc; IMPL.conventions)."""
    from fla.ops.attnres import fused_attnres
    srcs = [s.contiguous() for s in sources]
    srcs = [s if s.data_ptr() % 16 == 0 else s.clone() for s in srcs]   # the kernel asserts alignment
    gain = key_gain if key_gain is not None else query.new_ones(query.shape)
    return fused_attnres(query, srcs, gain, output_rms_weight=None, rms_eps=eps, scale=1.0,
                         return_weights=False, checkpoint_level=1)


IMPL = _common.depth_mixer_impl(NAME, DIST, kernel, probe, dtypes=("float32", "bfloat16", "float16"),
                                 conventions=(
        "Triton kernel fla.ops.attnres.fused_attnres(query (d,), residuals [n × (B,T,d)], rms_weight, "
        "output_rms_weight, rms_eps, scale): keys RMSNorm(V)·rms_weight, logits scale·q·k, online "
        "softmax in float32, output in the sources' dtype, Triton backward. Mapping: rms_weight = our "
        "key gain (ones when None), folded into the query by the kernel; output_rms_weight=None (FLA "
        "can fuse the sublayer's input RMSNorm; it belongs to the workload, never fused here); "
        "rms_eps = our eps 1e-6; scale = 1.0 (no temperature, as ours). No per-source bias: no "
        "haares / wav_v1. A read over one source returns that source without calling the kernel, "
        "as depth_mix does (FLA#883). Sources made contiguous and 16-byte aligned (the kernel "
        "asserts it). float64 is not offered (the kernel computes in float32). CUDA only, even under "
        "TRITON_INTERPRET=1: the wrapper refuses CPU tensors (ValueError 'Triton attnres requires "
        "CUDA tensors')."))
