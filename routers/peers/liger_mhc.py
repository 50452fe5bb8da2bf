"""Liger-Kernel's mHC ops (``liger-kernel`` 0.8.5, ``liger_kernel/ops/mhc.py``; the functional
wrappers of ``liger_kernel.transformers.functional``) as the three plug-in points of ``mhc``'s
naive schedule (``routers/stream.py``).

``LigerMHC`` wraps the sublayer, which the router contract forbids (the sublayer belongs to the
workload), so the adapter calls the three functional ops the module is made of::

    h_pre, h_post, h_res = liger_mhc_coeffs(x, phi, b, alpha_pre, alpha_post, alpha_res,
                                            allow_fp32=True, tmax, rms_eps, pre_eps, sinkhorn_eps, post_mult)
    h = liger_mhc_pre(x, h_pre)                       # Σ_s h_pre_s X_s
    x' = liger_mhc_post_res(x, u, h_post, h_res)      # Σ_s h_res_ts X_s + h_post_t u

- x (…, n, d) the streams, phi (nd, n²+2n) in our column order [pre | post | res, row-major],
  b (n²+2n), α's as 0-dim tensors; coefficients in float32 (a fused matmul + RMS, then split,
  sigmoid and Sinkhorn: ``softmax_eps`` start, ``tmax`` iterations, columns last), and the
  outputs of pre and post_res in x's dtype; Triton forward and backward kernels;
- r = √(mean(x̃²) + rms_eps) (``rms_eps_mode="inside"``), h_res applied as H (``res_apply="H"``),
  a = σ(·) + pre_eps, c = post_mult·σ(·): the paper's except the Sinkhorn start, so it matches
  ``mhc`` with ``sk_init="softmax_eps"`` (declared in ``options``);
- plain Triton (no autotuning), so Triton's interpreter runs it on CPU tensors.
"""

from __future__ import annotations

from torch import Tensor

from ..stream import Coefficients
from ..impls import Impl
from . import _common

DIST = "liger-kernel"
NAME = "liger_mhc"


def probe() -> str | None:
    """None when liger-kernel's mHC ops import and CUDA is here (or Triton's interpreter is on)."""
    return (_common.import_reason(DIST, "liger_kernel.ops.mhc")
            or _common.triton_device_reason(DIST))


def coefficients(r, k: int, x: Tensor) -> Coefficients:
    """(a, W, c) of sublayer k by ``liger_mhc_coeffs`` on the streams x (B, T, n, d)."""
    from liger_kernel.transformers.functional import liger_mhc_coeffs
    a_pre, a_post, a_res = r.alpha[k].unbind()
    h_pre, h_post, h_res = liger_mhc_coeffs(
        x, r.phi[k], r.bias[k], a_pre, a_post, a_res, allow_fp32=True, tmax=r.sk_iters,
        rms_eps=r.rms_eps, pre_eps=r.pre_eps, sinkhorn_eps=r.sk_eps, post_mult=r.post_mult)
    return Coefficients(h_pre, h_res, h_post)


def pre_mix(x: Tensor, a: Tensor) -> Tensor:
    """h = Σ_s a_s X_s by ``liger_mhc_pre``."""
    from liger_kernel.transformers.functional import liger_mhc_pre
    return liger_mhc_pre(x, a)


def post_res(x: Tensor, w: Tensor, c: Tensor, u: Tensor) -> Tensor:
    """X' = W X + c ⊗ u by ``liger_mhc_post_res`` (u cast to the streams' dtype)."""
    from liger_kernel.transformers.functional import liger_mhc_post_res
    return liger_mhc_post_res(x, u.to(x.dtype), c, w)


IMPL = Impl(
    NAME, ("mhc",), "naive", package=DIST, probe=probe, devices=("cuda",), interpretable=True,
    dtypes=("float32", "bfloat16", "float16"),
    hooks={"coefficients": coefficients, "pre_mix": pre_mix, "post_res": post_res},
    options={"mhc": {"sk_init": "softmax_eps", "sk_last": "col", "res_apply": "H", "rms_eps_mode": "inside"}},
    conventions=(
        "Triton ops liger_mhc_coeffs (fused x̃φ and RMS, split, sigmoids, Sinkhorn), liger_mhc_pre and "
        "liger_mhc_post_res (liger-kernel 0.8.5; LigerMHC wraps the sublayer, which the contract forbids, "
        "so the adapter calls the three ops it is made of), with our φ (nd, n²+2n), b and α per sublayer "
        "(allow_fp32=True, tmax = sk_iters, rms_eps, pre_eps, sinkhorn_eps = sk_eps, post_mult passed "
        "through). Conventions fixed by the kernel: Sinkhorn from softmax_row(Z)+ε (sk_init=softmax_eps), "
        "columns last, H_res applied as H, ε inside the RMS; its cases run with those options. "
        "Coefficients in float32, outputs in the streams' dtype; float64 is not offered (the kernels "
        "compute in float32). No autotuning: runs on CPU under TRITON_INTERPRET=1."))
