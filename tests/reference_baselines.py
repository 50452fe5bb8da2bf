"""A float64 reference of docs/BASELINES.md (shc, dhc, mhc, denseformer), written from the
equations with explicit per-stream and per-token loops where the routers use einsums. It reads
the routers' parameters by name and nothing else of ``routers``."""

from __future__ import annotations

import math

import torch

from routers import route


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
    reads, h = [], e
    for u in ups:
        reads.append(h)
        h = h + u
    return reads, h


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


def _norm(x, g, bias, eps, kind):
    if kind == "layernorm":
        mu = x.mean(-1, keepdim=True)
        var = ((x - mu) ** 2).mean(-1, keepdim=True)
        return (x - mu) / torch.sqrt(var + eps) * g + bias
    return x / torch.sqrt((x ** 2).mean(-1, keepdim=True) + eps) * g


def hc_coefficients(r, k, X):
    """(a (B,T,n), W (B,T,n,n) [t, s], c (B,T,n)) of sublayer k for shc / dhc from X (B,T,n,d)."""
    n = r.n
    B, T = X.shape[:2]
    alpha = r.static_alpha[k].detach().double().expand(B, T, n, n + 1).clone()
    beta = r.static_beta[k].detach().double().expand(B, T, n).clone()
    if r.name == "dhc":
        bias = r.norm_bias[k].detach().double() if r.norm_bias is not None else 0.0
        for s in range(n):
            hs = _norm(X[:, :, s], r.norm_weight[k].detach().double(), bias, r.dyn_norm_eps, r.dyn_norm)
            pa = hs @ r.dynamic_alpha_fn[k].detach().double()
            pb = hs @ r.dynamic_beta_fn[k].detach().double()
            if r.tanh:
                pa, pb = torch.tanh(pa), torch.tanh(pb)
            alpha[:, :, s] += r.dynamic_alpha_scale[k].item() * pa
            beta[:, :, s] += r.dynamic_beta_scale[k].item() * pb
    a = alpha[..., 0]
    W = torch.empty(B, T, n, n, dtype=torch.float64)
    for t in range(n):
        for s in range(n):
            W[:, :, t, s] = alpha[:, :, s, 1 + t]      # row s = input stream, column 1+t = output t
    return a, W, beta


def sinkhorn(Z, iters, init="exp", last="col", eps=1e-6):
    """Sinkhorn on one (n, n) matrix, written with Python loops over rows and columns."""
    if last == "row":
        return sinkhorn(Z.T, iters, init, "col", eps).T
    n = Z.shape[0]
    if init == "exp":
        M = torch.exp(Z - Z.max())
        rounds, add = iters, False
    else:
        M = torch.stack([torch.exp(Z[i] - Z[i].max()) / torch.exp(Z[i] - Z[i].max()).sum() for i in range(n)]) + eps
        M = torch.stack([M[:, j] / (M[:, j].sum() + eps) for j in range(n)], 1)
        rounds, add = iters - 1, True
    for _ in range(rounds):
        M = torch.stack([M[i] / (M[i].sum() + eps if add else max(M[i].sum(), eps)) for i in range(n)])
        M = torch.stack([M[:, j] / (M[:, j].sum() + eps if add else max(M[:, j].sum(), eps)) for j in range(n)], 1)
    return M


def mhc_coefficients(r, k, X):
    """(a, W, c) of sublayer k for mhc from X (B,T,n,d), token by token."""
    n = r.n
    B, T = X.shape[:2]
    phi, b = r.phi[k].detach().double(), r.bias[k].detach().double()
    al = r.alpha[k].detach().double()
    a = torch.empty(B, T, n, dtype=torch.float64)
    c = torch.empty(B, T, n, dtype=torch.float64)
    W = torch.empty(B, T, n, n, dtype=torch.float64)
    for bi in range(B):
        for ti in range(T):
            x = torch.cat([X[bi, ti, s] for s in range(n)])          # vec(X): stream i at i·d
            ms = (x ** 2).mean()
            r_ = math.sqrt(ms + r.rms_eps) if r.rms_eps_mode == "inside" else math.sqrt(ms) + r.rms_eps
            proj = (x @ phi) / r_
            scale = torch.tensor([al[0]] * n + [al[1]] * n + [al[2]] * n * n, dtype=torch.float64)
            hb = proj * scale + b
            a[bi, ti] = torch.sigmoid(hb[:n]) + r.pre_eps
            c[bi, ti] = r.post_mult * torch.sigmoid(hb[n:2 * n])
            Z = torch.stack([hb[2 * n + i * n: 2 * n + (i + 1) * n] for i in range(n)])
            H = sinkhorn(Z, r.sk_iters, r.sk_init, r.sk_last, r.sk_eps)
            W[bi, ti] = H if r.res_apply == "H" else H.T
    return a, W, c


def streams(r, e, updates):
    """Every read and h_out of a stream router (shc, dhc, mhc) driven with fixed updates,
    carrying X through all 2L sublayers."""
    n = r.n
    coef = mhc_coefficients if r.name == "mhc" else hc_coefficients
    X = torch.stack([e] * n, 2)
    reads = []
    for k in range(2 * r.n_layers):
        a, W, c = coef(r, k, X)
        reads.append(sum(a[..., s, None] * X[:, :, s] for s in range(n)))
        X = torch.stack([sum(W[..., t, s, None] * X[:, :, s] for s in range(n)) + c[..., t, None] * updates[k]
                         for t in range(n)], 2)
    out = sum(X[:, :, s] for s in range(n))
    return reads, out if r.readout == "sum" else out / n


def denseformer(r, e, updates):
    """Every read and h_out of ``denseformer``: the bank of unit outputs and the DWA sums."""
    units = r.n_layers if r.unit == "layer" else 2 * r.n_layers
    per = 2 if r.unit == "layer" else 1
    bank, h, reads, q = [e], e, [], 0
    for k in range(2 * r.n_layers):
        reads.append(h)
        h = h + updates[k]
        if (k + 1) % per == 0:
            i = k // per
            bank.append(h)
            if (i + 1) % r.period == 0:
                alpha = r.dwa_weights[q].detach().double()
                js = [j for j in range(i + 2) if j % r.dilation == (i + 1) % r.dilation]
                h = sum(alpha[m] * bank[j] for m, j in enumerate(js))
                q += 1
    assert len(bank) == units + 1
    return reads, h
