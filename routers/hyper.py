"""Hyper-Connections (Zhu et al., arXiv:2409.19606): the stream routers ``shc`` and ``dhc`` on the
n-stream base (:class:`routers.stream.StreamRouter`, whose module states the state, the
coefficients and the contract). Specification: docs/BASELINES.md ("Stream routers").
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .errors import ConfigError
from .registry import register
from .stream import Coefficients, StreamRouter, check_choice, compute_dtype, full_precision


@register("shc")
class StaticHyperConnections(StreamRouter):
    """Static Hyper-Connections (arXiv:2409.19606, Eqs. 10–11): a, W and c are parameters.

    Per sublayer k: ``static_alpha`` α (n, n+1) = [A_m | A_r] (row s = input stream: a_s = α[s, 0],
    W_ts = α[s, 1+t]) and ``static_beta`` β (n) (c = β). Init (PreNorm-equivalent):
    A_m = e_{k mod n}, A_r = I, β = 1, so every read is prenorm's h_k bitwise and h_out = n·h_out
    of prenorm (``readout="sum"``). Parameters per sublayer: n² + 2n.

    Args:
        n: streams (default 4).
        readout: ``"sum"`` or ``"mean"``.

    Raises:
        ConfigError: an invalid option.
    """

    dynamic = False

    def __init__(self, d_model: int, n_layers: int, *, n: int = 4, readout: str = "sum",
                 impl: str = "naive") -> None:
        super().__init__(d_model, n_layers, n=n, readout=readout, impl=impl)
        self._static_init()

    def _static_init(self) -> None:
        n, K = self.n, 2 * self.n_layers
        alpha = torch.zeros(K, n, n + 1)
        for k in range(K):
            alpha[k, self.home(k), 0] = 1.0
            alpha[k, :, 1:] = torch.eye(n)
        self.static_alpha = nn.Parameter(alpha)
        self.static_beta = nn.Parameter(torch.ones(K, n))

    def next_params(self, k: int) -> Coefficients:
        """Sublayer k's static (a (n,), W (n, n), c (n,)): views of α and β."""
        alpha = self.static_alpha[k]
        return Coefficients(alpha[:, 0], alpha[:, 1:].transpose(0, 1), self.static_beta[k])

    def coefficients(self, x: Tensor, params: tuple) -> Coefficients:
        """The static coefficients themselves (they do not depend on X)."""
        return Coefficients(*params)

    def options(self) -> dict:
        return {"n": self.n, "readout": self.readout}


@register("dhc")
class DynamicHyperConnections(StaticHyperConnections):
    """Dynamic Hyper-Connections (arXiv:2409.19606, Eqs. 12–13, App. J Alg. 2).

    Per sublayer k, from the streams X before it: H̄_s = norm(X_s) over d (LayerNorm with gain g
    and bias, ε = ``dyn_norm_eps``; or RMSNorm x/√(mean x²+ε)·g), α = α⁰ + s_α·tanh(H̄ W_α),
    β = B + s_β·tanh(H̄ W_β), with W_α (d, n+1) (``dynamic_alpha_fn``), W_β (d)
    (``dynamic_beta_fn``), scalars s_α, s_β (``dynamic_alpha_scale``, ``dynamic_beta_scale``);
    then a, W, c as in ``shc``. Init: W = 0, s = 0.01, g = 1, bias 0 (so the router starts as
    ``shc`` at its init). Parameters per sublayer: n² + 2n + (n+4)·d + 2 (LayerNorm), one d fewer
    with RMSNorm. lucidrains' ``hyper-connections`` norm x·√d/‖x‖·(1+γ) is ``dyn_norm="rmsnorm",
    dyn_norm_eps=0`` with g = 1 + γ.

    Args:
        n: streams (default 4).
        readout: ``"sum"`` or ``"mean"``.
        tanh: apply tanh to the dynamic projections (Eq. 12; default True).
        dyn_norm: ``"layernorm"`` (Alg. 2) or ``"rmsnorm"``.
        dyn_norm_eps: the norm's ε (≥ 0; default 1e-5, Alg. 2).

    Raises:
        ConfigError: an invalid option.
    """

    dynamic = True

    def __init__(self, d_model: int, n_layers: int, *, n: int = 4, readout: str = "sum",
                 tanh: bool = True, dyn_norm: str = "layernorm", dyn_norm_eps: float = 1e-5,
                 impl: str = "naive") -> None:
        super().__init__(d_model, n_layers, n=n, readout=readout, impl=impl)
        check_choice("dyn_norm", dyn_norm, ("layernorm", "rmsnorm"))
        if not dyn_norm_eps >= 0:
            raise ConfigError(f"dyn_norm_eps must be ≥ 0, got {dyn_norm_eps!r}")
        self.tanh, self.dyn_norm, self.dyn_norm_eps = bool(tanh), dyn_norm, float(dyn_norm_eps)
        K, d = 2 * n_layers, d_model
        self.dynamic_alpha_fn = nn.Parameter(torch.zeros(K, d, n + 1))
        self.dynamic_beta_fn = nn.Parameter(torch.zeros(K, d))
        self.dynamic_alpha_scale = nn.Parameter(torch.full((K,), 0.01))
        self.dynamic_beta_scale = nn.Parameter(torch.full((K,), 0.01))
        self.norm_weight = nn.Parameter(torch.ones(K, d))
        self.norm_bias = nn.Parameter(torch.zeros(K, d)) if dyn_norm == "layernorm" else None

    def next_params(self, k: int) -> tuple:
        """(α⁰ (n, n+1), B (n), [W_α | W_β] (d, n+2), [s_α…, s_β] (n+2), g (d), bias (d) or None)."""
        n = self.n
        fn = torch.cat([self.dynamic_alpha_fn[k], self.dynamic_beta_fn[k].unsqueeze(-1)], -1)
        scale = torch.cat([self.dynamic_alpha_scale[k].expand(n + 1), self.dynamic_beta_scale[k].expand(1)])
        bias = None if self.norm_bias is None else self.norm_bias[k]
        return (self.static_alpha[k], self.static_beta[k], fn, scale, self.norm_weight[k], bias)

    def coefficients(self, x: Tensor, params: tuple) -> Coefficients:
        alpha0, beta0, fn, scale, g, bias = params
        n, d = self.n, self.d_model
        cd = compute_dtype(x.dtype)
        with full_precision(x):
            xs = x.to(cd)
            if self.dyn_norm == "layernorm":
                hn = F.layer_norm(xs, (d,), g.to(cd), bias.to(cd), self.dyn_norm_eps)
            else:
                hn = F.rms_norm(xs, (d,), g.to(cd), self.dyn_norm_eps)
            proj = torch.matmul(hn, fn.to(cd))                       # (B, T, n, n+2)
            if self.tanh:
                proj = torch.tanh(proj)
            proj = proj * scale.to(cd)
            alpha = alpha0.to(cd) + proj[..., : n + 1]               # (B, T, n, n+1)
            beta = beta0.to(cd) + proj[..., n + 1]                   # (B, T, n)
        return Coefficients(alpha[..., 0], alpha[..., 1:].transpose(-1, -2), beta)

    def coefficient_flops(self) -> int:
        """Per token: the norm n·(7d+2) (LayerNorm 5d+2 + gain + bias; RMSNorm 4d+2), the
        projection 2n(n+2)d, tanh n(n+2), the scales n(n+2), + α⁰ n(n+1), + B n."""
        n, d = self.n, self.d_model
        norm = (7 * d + 2) if self.dyn_norm == "layernorm" else (4 * d + 2)
        return (n * norm + 2 * n * (n + 2) * d + (n * (n + 2) if self.tanh else 0)
                + n * (n + 2) + n * (n + 1) + n)

    def options(self) -> dict:
        return {"n": self.n, "readout": self.readout, "tanh": self.tanh, "dyn_norm": self.dyn_norm,
                "dyn_norm_eps": self.dyn_norm_eps}
