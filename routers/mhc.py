"""Manifold-constrained Hyper-Connections, mHC (DeepSeek-AI, arXiv:2512.24880, Eqs. 7–9 and
14–19; init App. A.6): the stream router ``mhc`` and its Sinkhorn-Knopp projection.
Specification and the ports' conventions: docs/BASELINES.md ("mhc").

Per sublayer k, from the streams X (B, T, n, d) before it, with x̃ = vec(X) (B, T, nd):

    r = √(mean(x̃²) + ε)                                    (rms_eps_mode="inside")
    H̄ = (x̃ φ) / r ⊙ [α_pre·1ₙ, α_post·1ₙ, α_res·1ₙ²] + b    φ (nd, n²+2n), b (n²+2n)
    a = σ(H̄_pre) + pre_eps,  c = post_mult·σ(H̄_post),  W = SK(Z) or SK(Z)ᵀ

with columns [pre n | post n | res n², row-major: Z_ij is column 2n + i·n + j]. φ, b and α stay
float32 in a 16-bit decoder; the coefficients and Sinkhorn run in float32 with autocast off.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from .errors import ConfigError
from .stream import Coefficients, StreamRouter, check_choice, compute_dtype, full_precision
from .registry import register
from . import reference as _ref


def sinkhorn(z: Tensor, iters: int, *, init: str = "exp", last: str = "col", eps: float = 1e-6) -> Tensor:
    """Sinkhorn-Knopp projection of logits ``z`` (…, n, n) towards a doubly stochastic matrix.

    ``init="exp"`` (Eq. 9): M = exp(Z − max Z), then ``iters`` times M ← M / clamp(rowsum, eps),
    M ← M / clamp(colsum, eps). ``init="softmax_eps"`` (TileKernels, Liger): M = softmax_row(Z) + eps,
    M ← M / (colsum + eps), then ``iters − 1`` times the row and column steps with + eps. ``last="row"``
    normalises the transposed problem (SK_col(Zᵀ)ᵀ), so rows are normalised last.

    Args:
        z: logits (…, n, n), any float dtype (computed in it).
        iters: t ≥ 1.
        init: ``"exp"`` or ``"softmax_eps"``.
        last: ``"col"`` (the axis that sums to 1 exactly) or ``"row"``.
        eps: ε_sk.

    Returns:
        (…, n, n) in ``z``'s dtype.

    Raises:
        ConfigError: ``iters`` < 1, an unknown ``init`` or ``last``.
    """
    if not isinstance(iters, int) or isinstance(iters, bool) or iters < 1:
        raise ConfigError(f"sk_iters must be an integer ≥ 1, got {iters!r}")
    check_choice("sk_init", init, ("exp", "softmax_eps"))
    check_choice("sk_last", last, ("col", "row"))
    if last == "row":
        return sinkhorn(z.transpose(-1, -2), iters, init=init, last="col", eps=eps).transpose(-1, -2)
    if init == "exp":
        m = torch.exp(z - torch.amax(z, dim=(-2, -1), keepdim=True))
        for _ in range(iters):
            m = m / torch.clamp(m.sum(-1, keepdim=True), min=eps)
            m = m / torch.clamp(m.sum(-2, keepdim=True), min=eps)
        return m
    m = torch.softmax(z, -1) + eps
    m = m / (m.sum(-2, keepdim=True) + eps)
    for _ in range(iters - 1):
        m = m / (m.sum(-1, keepdim=True) + eps)
        m = m / (m.sum(-2, keepdim=True) + eps)
    return m


def sinkhorn_flops(n: int, iters: int, init: str = "exp") -> int:
    """FLOP per token of :func:`sinkhorn` on an n×n matrix (docs/FLOPS.md canonical ops).

    ``exp``: amax, sub, exp (n² each), then per iteration and axis sum (n²), clamp (n), divide (n²):
    3n² + t(4n² + 2n). ``softmax_eps``: softmax 5n², + ε n², the first column step 2n² + n, then
    (t − 1)(4n² + 2n): n² − n more."""
    if init == "exp":
        return 3 * n * n + iters * (4 * n * n + 2 * n)
    return 8 * n * n + n + (iters - 1) * (4 * n * n + 2 * n)


@register("mhc")
class ManifoldHyperConnections(StreamRouter):
    """mHC (arXiv:2512.24880): n streams mixed by a Sinkhorn-projected, doubly stochastic H_res.

    Parameters per sublayer k (float32 even in a cast decoder): ``phi`` φ (nd, n²+2n), ``bias``
    b (n²+2n), ``alpha`` (α_pre, α_post, α_res) (3,). Init (App. A.6): b_pre = −3 except +3 at
    the home stream k mod n, b_post = 0, b_res = 6I − 3 (row-major), α = 0.01; φ by
    ``phi_init``. At that init with φ = 0: H_pre = 0.952574 at home and 0.047426 elsewhere,
    H_post = 1, H_res = 0.992619 on the diagonal and 0.002460 off it (``sk_init="exp"``).
    Defaults are the paper's; the other values reproduce other ports (docs/BASELINES.md table).

    Args:
        n: streams (default 4).
        readout: ``"sum"`` (h_out = Σ_s X_s) or ``"mean"`` (Megatron).
        sk_init: ``"exp"`` (Eq. 9) or ``"softmax_eps"`` (TileKernels, Liger, Megatron @023f5cf).
        sk_iters: Sinkhorn iterations t (20; TileKernels 10).
        sk_last: ``"col"`` (all ports) or ``"row"`` (lucidrains-mHC).
        sk_eps: ε_sk (1e-6).
        res_apply: ``"H"`` (W = H_res, the paper's H_res·x) or ``"HT"`` (W = H_resᵀ, TileKernels).
        post_mult: c = post_mult·σ(H̄_post) (2, Eq. 18; TileKernels 1).
        pre_eps: a = σ(H̄_pre) + pre_eps (0, Eq. 17; TileKernels and Megatron 1e-6).
        rms_eps: ε of r (1e-6; Eq. 15 has none: a NaN guard).
        rms_eps_mode: ``"inside"`` √(mean+ε) (TileKernels, Liger) or ``"outside"`` 1/(r+ε).
        phi_init: ``"xavier_uniform"`` (Megatron, PaddleFleet) or ``"zeros"``.
        impl: ``"naive"`` or a peer (``liger_mhc``: Liger's functional mHC ops).

    Raises:
        ConfigError: an invalid option (one line naming it).
    """

    dynamic = True

    def __init__(self, d_model: int, n_layers: int, *, n: int = 4, readout: str = "sum",
                 sk_init: str = "exp", sk_iters: int = 20, sk_last: str = "col", sk_eps: float = 1e-6,
                 res_apply: str = "H", post_mult: float = 2.0, pre_eps: float = 0.0,
                 rms_eps: float = 1e-6, rms_eps_mode: str = "inside",
                 phi_init: str = "xavier_uniform", impl: str = "naive") -> None:
        super().__init__(d_model, n_layers, n=n, readout=readout, impl=impl)
        sinkhorn(torch.zeros(1, 1), sk_iters, init=sk_init, last=sk_last)   # validates the SK options
        check_choice("res_apply", res_apply, ("H", "HT"))
        check_choice("rms_eps_mode", rms_eps_mode, ("inside", "outside"))
        check_choice("phi_init", phi_init, ("xavier_uniform", "zeros"))
        for name, v in (("sk_eps", sk_eps), ("pre_eps", pre_eps), ("rms_eps", rms_eps)):
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise ConfigError(f"{name} must be a number ≥ 0, got {v!r}")
        if not (isinstance(post_mult, (int, float)) and post_mult > 0):
            raise ConfigError(f"post_mult must be a number > 0, got {post_mult!r}")
        self.sk_init, self.sk_iters, self.sk_last, self.sk_eps = sk_init, sk_iters, sk_last, float(sk_eps)
        self.res_apply, self.post_mult, self.pre_eps = res_apply, float(post_mult), float(pre_eps)
        self.rms_eps, self.rms_eps_mode, self.phi_init = float(rms_eps), rms_eps_mode, phi_init
        K, nd, m = 2 * n_layers, n * d_model, n * n + 2 * n
        self.phi = nn.Parameter(torch.zeros(K, nd, m))
        if phi_init == "xavier_uniform":
            for k in range(K):
                nn.init.xavier_uniform_(self.phi.data[k])
        self.bias = nn.Parameter(torch.stack([self.a6_bias(k) for k in range(K)]))
        self.alpha = nn.Parameter(torch.full((K, 3), 0.01))

    def a6_bias(self, k: int) -> Tensor:
        """b of sublayer k at init (App. A.6): [pre: −3, +3 at home | post: 0 | res: 6I − 3]."""
        n = self.n
        pre = torch.full((n,), -3.0)
        pre[self.home(k)] = 3.0
        return torch.cat([pre, torch.zeros(n), (6 * torch.eye(n) - 3).flatten()])

    def fields(self, hbar: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(pre (…, n), post (…, n), Z (…, n, n)) of H̄ (…, n²+2n): columns [pre | post | res]."""
        n = self.n
        return hbar[..., :n], hbar[..., n:2 * n], hbar[..., 2 * n:].unflatten(-1, (n, n))

    def next_params(self, k: int) -> tuple:
        """(φ (nd, n²+2n), b (n²+2n), the α column scale (n²+2n)) of sublayer k."""
        n = self.n
        a = self.alpha[k]
        scale = torch.cat([a[0].expand(n), a[1].expand(n), a[2].expand(n * n)])
        return (self.phi[k], self.bias[k], scale)

    def coefficients(self, x: Tensor, params: tuple) -> Coefficients:
        phi, b, scale = params
        cd = compute_dtype(x.dtype)
        with full_precision(x):
            xt = x.reshape(*x.shape[:-2], -1).to(cd)                 # (B, T, nd), stream-major
            ms = xt.pow(2).mean(-1, keepdim=True)
            if self.rms_eps_mode == "inside":
                proj = torch.matmul(xt, phi.to(cd)) / torch.sqrt(ms + self.rms_eps)
            else:
                proj = torch.matmul(xt, phi.to(cd)) / (torch.sqrt(ms) + self.rms_eps)
            hbar = proj * scale.to(cd) + b.to(cd)
            pre, post, z = self.fields(hbar)
            a = torch.sigmoid(pre)
            if self.pre_eps:
                a = a + self.pre_eps
            c = torch.sigmoid(post) * self.post_mult
            h_res = sinkhorn(z, self.sk_iters, init=self.sk_init, last=self.sk_last, eps=self.sk_eps)
        return Coefficients(a, h_res if self.res_apply == "H" else h_res.transpose(-1, -2), c)

    #: the float64 coefficients of :meth:`reference`: token by token, Sinkhorn with loops
    reference_coefficients = staticmethod(_ref.mhc_coefficients)

    def coefficient_flops(self) -> int:
        """Per token: r (pow, mean: 2nd; +ε, √: 2), x̃φ 2n²(n+2)d, ÷r, ⊙α, +b 3(n²+2n), two
        sigmoids 8n, post_mult n, pre_eps n when ≠ 0, and Sinkhorn (:func:`sinkhorn_flops`)."""
        n, d = self.n, self.d_model
        return (2 * n * d + 2 + 2 * n * n * (n + 2) * d + 3 * (n * n + 2 * n) + 9 * n
                + (n if self.pre_eps else 0) + sinkhorn_flops(n, self.sk_iters, self.sk_init))

    def options(self) -> dict:
        return {"n": self.n, "readout": self.readout, "sk_init": self.sk_init, "sk_iters": self.sk_iters,
                "sk_last": self.sk_last, "sk_eps": self.sk_eps, "res_apply": self.res_apply,
                "post_mult": self.post_mult, "pre_eps": self.pre_eps, "rms_eps": self.rms_eps,
                "rms_eps_mode": self.rms_eps_mode, "phi_init": self.phi_init}
