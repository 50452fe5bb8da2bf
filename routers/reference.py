"""The float64 references of the built-in routers (docs/ROUTERS.md, docs/BASELINES.md), written
directly from the equations with plain loops: what each router's ``reference(embedding, updates)``
returns, and what ``routerbench check`` (:mod:`harness.conformance`) and the tests compare the
router with.

Every function takes the embedding e (B, T, d) and the 2L fixed updates u_k (each (B, T, d)) and
returns ``(reads, h_out)``: the 2L reads h_k (the input of sublayer k) and the readout, in float64.
Sources are listed per sublayer and every basis is **recomputed from the stored updates** (the
routers accumulate them online), so agreement also checks the online accumulation. Parameters are
read from the router instance and never detached, so the references give the parameters'
gradients too; a detail's RMS-matching gain is detached as in the routers (``routers.mixer.rms_match``).
"""

from __future__ import annotations

import torch
from torch import Tensor

#: ε of every RMS (routers/mixer.py EPS).
EPS = 1e-6


def _f64(x: Tensor) -> Tensor:
    return x.to(torch.float64)


def prenorm(e: Tensor, ups: list[Tensor], gains: list | None = None) -> tuple[list[Tensor], Tensor]:
    """h_0 = e, h_{k+1} = h_k + g_k u_k (g_k = 1 without ``gains``; a scalar or a (d,) vector)."""
    reads, h = [], _f64(e)
    for k, u in enumerate(ups):
        reads.append(h)
        h = h + (_f64(u) if gains is None else _f64(gains[k]) * _f64(u))
    return reads, h


# --- the block routers (Attention Residuals, HAARES, WAV v1) ------------------------------------

def rmsnorm(v: Tensor) -> Tensor:
    return v / torch.sqrt(v.pow(2).mean(-1, keepdim=True) + EPS)


def rms(v: Tensor) -> Tensor:
    return torch.sqrt(v.pow(2).mean(-1, keepdim=True))


def match(detail: Tensor, state: Tensor, rho: float) -> Tensor:
    """D · min(ρ, rms(state) / (rms(D) + ε)), the gain detached (no gradient through it)."""
    return detail * torch.clamp(rms(state) / (rms(detail) + EPS), max=rho).detach()


def blocks_of(slots) -> dict[int, list]:
    out: dict[int, list] = {}
    for s in slots:
        out.setdefault(s.block, []).append(s)
    return out


def detail_sums(kinds, slots_in_block, m: int, updates) -> dict[str, Tensor]:
    """Raw detail bases of the given updates of one block (m = full block length)."""
    out = {}
    for kind in kinds:
        if kind == "split":
            out[kind] = sum((1 if s.pos < m // 2 else -1) * updates[s.index] for s in slots_in_block)
        else:
            out[kind] = sum((1 if s.kind == "attn" else -1) * updates[s.index] for s in slots_in_block)
    return out


def pool(kinds, slots, e, updates, k: int, *, rho: float = 4.0, partial_details: str = "always"):
    """Sources ``[(V_j, kind_j)]`` of the read of sublayer k (k = len(slots) is the readout, with
    every completed block's details), ``kinds`` the router's detail kinds ("phase", "split")."""
    blocks = blocks_of(slots)
    readout = k == len(slots)
    b = len(blocks) + 1 if readout else slots[k].block
    p = 0 if readout else slots[k].pos
    src = [(e, "state")]
    for bb in range(1, b):
        members = blocks[bb]
        C = sum(updates[s.index] for s in members)
        src.append((C, "state"))
        for kind, D in detail_sums(kinds, members, len(members), updates).items():
            src.append((match(D, C, rho), kind))
    if p >= 1:
        members = blocks[b][:p]
        m = slots[k].block_len
        P = sum(updates[s.index] for s in members)
        src.append((P, "state"))
        for kind, D in detail_sums(kinds, members, m, updates).items():
            visible = {"always": True, "never": False,
                       "informative": (p > m // 2) if kind == "split" else (p >= 2)}[partial_details]
            if visible:
                src.append((match(D, P, rho), kind))
    return src


def mix(sources, query: Tensor, bias_of_kind, key_gain: Tensor | None = None) -> Tensor:
    """``Σ_j softmax_j(w·(RMSNorm(V_j)·g) + bias_j) V_j``, written out per source."""
    if len(sources) == 1:
        return sources[0][0]
    gain = 1.0 if key_gain is None else _f64(key_gain)
    logits = torch.stack([(rmsnorm(v) * gain * _f64(query)).sum(-1) + bias_of_kind(kind) for v, kind in sources])
    alpha = torch.softmax(logits, dim=0)
    return sum(a.unsqueeze(-1) * v for a, (v, _) in zip(alpha, sources))


def block_router(r, e: Tensor, updates: list[Tensor]) -> tuple[list[Tensor], Tensor]:
    """Every read and h_out of a block router ``r`` (block_attnres, full_attnres, haares, wav_v1)."""
    e, updates = _f64(e), [_f64(u) for u in updates]
    kinds = tuple(getattr(r, "detail_kinds", ()))
    rho = float(getattr(r, "max_detail_scale", 1.0))
    partial = getattr(r, "partial_details", "always")
    out = []
    for k in range(len(r.slots) + 1):
        src = pool(kinds, r.slots, e, updates, k, rho=rho, partial_details=partial)
        if k == len(r.slots) and not getattr(r, "readout_details", False):
            src = [s for s in src if s[1] == "state"]
        bias = (lambda kind, k=k: 0.0 if kind == "state" else _f64(r.detail_bias[k, kinds.index(kind)]))
        gain = None if getattr(r, "key_gain", None) is None else r.key_gain[k]
        out.append(mix(src, r.pseudo_query[k], bias, gain))
    return out[:-1], out[-1]


# --- the stream routers (shc, dhc, mhc) and denseformer ------------------------------------------

def _norm(x, g, bias, eps, kind):
    if kind == "layernorm":
        mu = x.mean(-1, keepdim=True)
        var = ((x - mu) ** 2).mean(-1, keepdim=True)
        return (x - mu) / torch.sqrt(var + eps) * g + bias
    return x / torch.sqrt((x ** 2).mean(-1, keepdim=True) + eps) * g


def hc_coefficients(r, k: int, X: Tensor):
    """(a (B,T,n), W (B,T,n,n) [t, s], c (B,T,n)) of sublayer k for shc / dhc from X (B,T,n,d)."""
    n = r.n
    B, T = X.shape[:2]
    alpha = _f64(r.static_alpha[k]).expand(B, T, n, n + 1).clone()
    beta = _f64(r.static_beta[k]).expand(B, T, n).clone()
    if hasattr(r, "dynamic_alpha_fn"):
        bias = _f64(r.norm_bias[k]) if r.norm_bias is not None else 0.0
        for s in range(n):
            hs = _norm(X[:, :, s], _f64(r.norm_weight[k]), bias, r.dyn_norm_eps, r.dyn_norm)
            pa = hs @ _f64(r.dynamic_alpha_fn[k])
            pb = hs @ _f64(r.dynamic_beta_fn[k])
            if r.tanh:
                pa, pb = torch.tanh(pa), torch.tanh(pb)
            alpha[:, :, s] += _f64(r.dynamic_alpha_scale[k]) * pa
            beta[:, :, s] += _f64(r.dynamic_beta_scale[k]) * pb
    a = alpha[..., 0]
    W = X.new_empty(B, T, n, n)
    for t in range(n):
        for s in range(n):
            W[:, :, t, s] = alpha[:, :, s, 1 + t]      # row s = input stream, column 1+t = output t
    return a, W, beta


def sinkhorn(Z: Tensor, iters: int, init: str = "exp", last: str = "col", eps: float = 1e-6) -> Tensor:
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
        M = torch.stack([M[i] / (M[i].sum() + eps if add else M[i].sum().clamp_min(eps)) for i in range(n)])
        M = torch.stack([M[:, j] / (M[:, j].sum() + eps if add else M[:, j].sum().clamp_min(eps))
                         for j in range(n)], 1)
    return M


def mhc_coefficients(r, k: int, X: Tensor):
    """(a, W, c) of sublayer k for mhc from X (B,T,n,d), token by token."""
    n = r.n
    B, T = X.shape[:2]
    phi, b, al = _f64(r.phi[k]), _f64(r.bias[k]), _f64(r.alpha[k])
    a = X.new_empty(B, T, n)
    c = X.new_empty(B, T, n)
    W = X.new_empty(B, T, n, n)
    scale = torch.cat([al[0].expand(n), al[1].expand(n), al[2].expand(n * n)])
    for bi in range(B):
        for ti in range(T):
            x = torch.cat([X[bi, ti, s] for s in range(n)])          # vec(X): stream i at i·d
            ms = (x ** 2).mean()
            r_ = torch.sqrt(ms + r.rms_eps) if r.rms_eps_mode == "inside" else torch.sqrt(ms) + r.rms_eps
            hb = (x @ phi) / r_ * scale + b
            a[bi, ti] = torch.sigmoid(hb[:n]) + r.pre_eps
            c[bi, ti] = r.post_mult * torch.sigmoid(hb[n:2 * n])
            Z = torch.stack([hb[2 * n + i * n: 2 * n + (i + 1) * n] for i in range(n)])
            H = sinkhorn(Z, r.sk_iters, r.sk_init, r.sk_last, r.sk_eps)
            W[bi, ti] = H if r.res_apply == "H" else H.T
    return a, W, c


def streams(r, e: Tensor, updates: list[Tensor], coefficients=None) -> tuple[list[Tensor], Tensor]:
    """Every read and h_out of a stream router (shc, dhc: :func:`hc_coefficients`; mhc:
    :func:`mhc_coefficients`) driven with fixed updates, carrying X through all 2L sublayers."""
    coef = coefficients or hc_coefficients
    e, updates = _f64(e), [_f64(u) for u in updates]
    n = r.n
    X = torch.stack([e] * n, 2)
    reads = []
    for k in range(2 * r.n_layers):
        a, W, c = coef(r, k, X)
        reads.append(sum(a[..., s, None] * X[:, :, s] for s in range(n)))
        X = torch.stack([sum(W[..., t, s, None] * X[:, :, s] for s in range(n)) + c[..., t, None] * updates[k]
                         for t in range(n)], 2)
    out = sum(X[:, :, s] for s in range(n))
    return reads, out if r.readout == "sum" else out / n


def denseformer(r, e: Tensor, updates: list[Tensor]) -> tuple[list[Tensor], Tensor]:
    """Every read and h_out of ``denseformer``: the bank of unit outputs and the DWA sums."""
    e, updates = _f64(e), [_f64(u) for u in updates]
    per = 2 if r.unit == "layer" else 1
    bank, h, reads, q = [e], e, [], 0
    for k in range(2 * r.n_layers):
        reads.append(h)
        h = h + updates[k]
        if (k + 1) % per == 0:
            i = k // per
            bank.append(h)
            if (i + 1) % r.period == 0:
                alpha = _f64(r.dwa_weights[q])
                js = [j for j in range(i + 2) if j % r.dilation == (i + 1) % r.dilation]
                h = sum(alpha[m] * bank[j] for m, j in enumerate(js))
                q += 1
    return reads, h
