"""lucidrains' ``hyper-connections`` (PyPI 0.4.11, pure PyTorch: ``HyperConnections``) as the
width-depth schedule of ``shc`` and ``dhc`` (``routers/stream.py``).

The package's module of one sublayer (``hyper_connections/hyper_connections.py``)::

    hc = HyperConnections(n, dim=d, layer_index=k, tanh=True)
    branch_input, residuals, kw = hc.width_connection(residuals)   # residuals '(b s) t d'
    residuals = hc.depth_connection(branch_output, residuals, **kw)

- streams folded into the batch, ``(B·n, T, d)``, stream-major per sample; expand = repeat per
  sample, reduce = sum over the streams (``get_expand_reduce_stream_functions``);
- width connection: normed = x/‖x‖·√d·(1+γ) per stream (our ``dyn_norm="rmsnorm",
  dyn_norm_eps=0`` with g = 1+γ), α = tanh(normed W_α)·s_α + α⁰, β = tanh(normed W_β)·s_β + B,
  then one einsum gives the branch input and the mixed streams W X;
- depth connection: residuals + β ⊗ branch output;
- every tensor in the streams' dtype (coefficients too: no float32 inside).

The adapter keeps one package module per sublayer as a template (never registered as a submodule)
and calls it with our parameters by ``torch.func.functional_call``, so gradients reach our
``static_alpha``, ``static_beta``, ``dynamic_*`` and ``norm_weight`` (γ = g − 1). ``shc`` has no
dynamic weights: the package has no static mode, so its width connection runs with W_α, W_β = 0
(the norm and projections are computed, as the package computes them); FLOPs are counted on
naive's maths (``Impl.opaque``).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..impls import Impl
from . import _common

DIST = "hyper-connections"
NAME = "lucidrains_hc"


def probe() -> str | None:
    """None when ``hyper_connections`` imports (pure PyTorch: any device)."""
    return _common.import_reason(DIST, "hyper_connections")


class _Call(nn.Module):
    """Calls a method of the wrapped module, so ``functional_call`` can swap its parameters."""

    def __init__(self, hc: nn.Module) -> None:
        super().__init__()
        self.hc = hc

    def forward(self, method: str, *args, **kwargs):
        return getattr(self.hc, method)(*args, **kwargs)


def _template(r, k: int) -> _Call:
    """The package's module of sublayer k (built once per router instance; its own parameters
    are never used)."""
    cache = r.__dict__.setdefault("_lucidrains_templates", {})
    if k not in cache:
        from hyper_connections import HyperConnections
        cache[k] = _Call(HyperConnections(r.n, dim=r.d_model, layer_index=k, tanh=getattr(r, "tanh", True)))
    return cache[k]


def _params(r, k: int, dtype: torch.dtype) -> dict[str, Tensor]:
    """Our parameters of sublayer k under the package's names, in the streams' dtype (the package
    computes in it)."""
    def cast(t: Tensor) -> Tensor:
        return t.to(dtype)
    alpha, beta = r.static_alpha[k], r.static_beta[k]
    if hasattr(r, "dynamic_alpha_fn"):                           # dhc
        dyn = {"dynamic_alpha_fn": r.dynamic_alpha_fn[k], "dynamic_beta_fn": r.dynamic_beta_fn[k],
               "dynamic_alpha_scale": r.dynamic_alpha_scale[k], "dynamic_beta_scale": r.dynamic_beta_scale[k],
               "norm.gamma": r.norm_weight[k] - 1}
    else:                                                        # shc: no dynamic part
        d, n = r.d_model, r.n
        z = alpha.new_zeros
        dyn = {"dynamic_alpha_fn": z(d, n + 1), "dynamic_beta_fn": z(d), "dynamic_alpha_scale": z(()),
               "dynamic_beta_scale": z(()), "norm.gamma": z(d)}
    return {f"hc.{name}": cast(t) for name, t in {"static_alpha": alpha, "static_beta": beta, **dyn}.items()}


def expand(r, e: Tensor) -> Tensor:
    """(B, T, d) → (B·n, T, d): n copies per sample (the package's expand)."""
    from hyper_connections import HyperConnections
    expand_fn, _ = HyperConnections.get_expand_reduce_stream_functions(r.n)
    return expand_fn(e)


def width(r, k: int, xs: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The package's width connection of sublayer k: (branch input, mixed streams, β)."""
    branch_input, mixed, kw = torch.func.functional_call(_template(r, k), _params(r, k, xs.dtype),
                                                         ("width_connection", xs))
    return branch_input, mixed, kw["beta"]


def depth(r, k: int, mixed: Tensor, beta: Tensor, u: Tensor) -> Tensor:
    """The package's depth connection: mixed streams + β ⊗ u (no parameters of its own)."""
    return _template(r, k).hc.depth_connection(u, mixed, beta=beta)


def reduce(r, xs: Tensor) -> Tensor:
    """(B·n, T, d) → (B, T, d): the package's reduce (the sum over streams; ÷ n for ``mean``)."""
    from hyper_connections import HyperConnections
    _, reduce_fn = HyperConnections.get_expand_reduce_stream_functions(r.n)
    out = reduce_fn(xs)
    return out if r.readout == "sum" else out / r.n


IMPL = Impl(
    NAME, ("shc", "dhc"), "width_depth", package=DIST, probe=probe, devices=("cpu", "cuda"),
    hooks={"expand": expand, "width": width, "depth": depth, "reduce": reduce},
    options={"dhc": {"dyn_norm": "rmsnorm", "dyn_norm_eps": 0.0}},
    conventions=(
        "pure PyTorch HyperConnections (hyper-connections 0.4.11), one per sublayer, called with our "
        "parameters by torch.func.functional_call: streams folded as (B·n, T, d), the width connection "
        "(norm, α, β and one einsum for the branch input and W X) and the depth connection (+ β ⊗ u), "
        "expand = repeat, reduce = sum (÷ n for readout=mean). Its norm is x/‖x‖·√d·(1+γ): dhc runs "
        "with dyn_norm=rmsnorm, dyn_norm_eps=0 (γ = norm_weight − 1). It computes every coefficient in "
        "the streams' dtype (ours: float32 for 16-bit streams); the adapter casts our float32 "
        "parameters to it. shc: the package has no static mode, so its dynamic part runs with zero "
        "weights (the norm and projections cost time; FLOPs are naive's maths)."))
