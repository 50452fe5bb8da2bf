"""The float64 reference of docs/BASELINES.md (shc, dhc, mhc, denseformer) for the tests: the math
is the package's (:mod:`routers.reference`, written from the equations with explicit per-stream and
per-token loops where the routers use einsums); this adds the tests' inputs and helpers."""

from __future__ import annotations

import math

import torch

from routers import reference as _ref
from routers import route
from routers.reference import denseformer, hc_coefficients, mhc_coefficients, sinkhorn  # noqa: F401


B, T, D = 2, 3, 8
SIG3, SIGM3 = 1 / (1 + math.exp(-3)), 1 / (1 + math.exp(3))     # σ(3), σ(−3): A.6's H_pre


def inputs(L, seed=0, d=D, dtype=torch.float64):
    """e (B, T, d) and 2L fixed updates of different scales."""
    g = torch.Generator().manual_seed(seed)
    e = torch.randn(B, T, d, generator=g, dtype=dtype)
    return e, [torch.randn(B, T, d, generator=g, dtype=dtype) * (0.2 + k % 3) for k in range(2 * L)]


def drive(r, e, ups):
    """Every read and h_out of router ``r`` driven with the fixed updates ``ups``."""
    reads, h_out, _ = route(r, e, lambda slot, h: ups[slot.index])
    return reads, h_out


def prenorm(e, ups):
    """PreNorm's reads h_k = h_{k−1} + u_{k−1} (h_0 = e) and h_out, in the same order of adds."""
    return _ref.prenorm(e, ups)


def streams(r, e, updates):
    """Every read and h_out of a stream router (shc, dhc, mhc) driven with fixed updates,
    carrying X through all 2L sublayers (the router's float64 ``reference``)."""
    return _ref.streams(r, e, updates, mhc_coefficients if r.name == "mhc" else hc_coefficients)


def a6(r, k=0, X=None):
    """mhc's (a, W, c) of sublayer k from a random X (1, 1, n, d) (φ = 0 makes them X-free)."""
    X = torch.randn(1, 1, r.n, r.d_model, dtype=torch.float64) if X is None else X
    return r.coefficients(X, r.next_params(k))


def randomised(r, seed=1, scale=0.3):
    """``r`` with every parameter moved by ``scale``·N(0, 1) (a router away from its init)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in r.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return r
