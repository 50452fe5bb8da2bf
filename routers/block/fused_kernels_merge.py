"""Triton kernels of the ``fused`` two-phase schedule's merge (Attention Residuals, arXiv:2603.15031; WAV v1 /
HAARES, arXiv:2606.06564): phase 2, the online merge of one read, through which a block's running sums may pass,
and the RMS matching of a completed block's details, forward and backward. Phase 1's kernels are in
``routers/block/fused_kernels.py``, whose conventions these follow; ``fused_launch.kernels()`` holds both files.
"""

from __future__ import annotations

import triton
import triton.language as tl

NEG_INF = tl.constexpr(float("-inf"))  # a kernel reads a module global only as a constexpr


@triton.jit
def rms_match(D, C, out, scale, R, d, eps, max_scale, R_BUCKET, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr):
    """A completed block's detail RMS-matched to its C (``routers.mixer.rms_match``), BLOCK_R rows per program: scale
    = min(ρ, rms(C)/(rms(D) + ε)) rounded to D's dtype, as the plain op's, into ``scale`` (R,) and out = D·scale."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.arange(0, BLOCK_D)
    live = rows < R
    mask = live[:, None] & (cols < d)[None, :]
    offs = rows[:, None] * d + cols[None, :]
    x = tl.load(D + offs, mask=mask, other=0.0).to(tl.float32)
    c = tl.load(C + offs, mask=mask, other=0.0).to(tl.float32)
    g = tl.sqrt(tl.sum(c * c, axis=1) / d) / (tl.sqrt(tl.sum(x * x, axis=1) / d) + eps)
    g = tl.minimum(g, max_scale).to(out.dtype.element_ty).to(tl.float32)
    tl.store(scale + rows, g.to(scale.dtype.element_ty), mask=live)
    tl.store(out + offs, (x * g[:, None]).to(out.dtype.element_ty), mask=mask)


@triton.jit
def _details(details, row, d, cols, cm, K: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr):
    """The K detail rows of token ``row`` as one (BLOCK_K, BLOCK_D) float32 tile (zero rows past K)."""
    kk = tl.arange(0, BLOCK_K)
    tile = tl.zeros((BLOCK_K, BLOCK_D), tl.float32)
    for j in tl.static_range(K):
        x = tl.load(details[j] + row * d + cols, mask=cm, other=0.0).to(tl.float32)
        tile = tl.where(kk[:, None] == j, x[None, :], tile)
    return tile


@triton.jit
def _merge_weights(qv, Pv, Dt, mu, sv, bias, d, eps, max_scale, K: tl.constexpr, HAS_BIAS: tl.constexpr,
                   BLOCK_K: tl.constexpr):
    """Phase 2's softmax over (o, P, c·D) of one token: returns the weights w_o, w_P (scalars) and w_D (BLOCK_K,),
    the gains c, the dots t_P = q·P and t_D = q·D, r_P = rsqrt(mean P² + ε) and ρ_D = rsqrt(c²·mean D² + ε)."""
    kk = tl.arange(0, BLOCK_K)
    km = kk < K
    ms_p = tl.sum(Pv * Pv, axis=0) / d
    r_p = tl.rsqrt(ms_p + eps)
    t_p = tl.sum(qv * Pv, axis=0)
    l_p = t_p * r_p
    lse = mu + tl.log(sv)
    ms_d = tl.sum(Dt * Dt, axis=1) / d
    c = tl.minimum(tl.sqrt(ms_p) / (tl.sqrt(ms_d) + eps), max_scale)
    rho = tl.rsqrt(c * c * ms_d + eps)
    t_d = tl.sum(qv[None, :] * Dt, axis=1)
    l_d = c * t_d * rho
    if HAS_BIAS:
        l_d += tl.load(bias + kk, mask=km, other=0.0).to(tl.float32)
    l_d = tl.where(km, l_d, NEG_INF)
    top = tl.maximum(tl.maximum(lse, l_p), tl.max(l_d, axis=0))
    a_o = tl.exp(lse - top)
    a_p = tl.exp(l_p - top)
    a_d = tl.exp(l_d - top)
    z = a_o + a_p + tl.sum(a_d, axis=0)
    return a_o / z, a_p / z, a_d / z, c, t_p, t_d, r_p, rho


@triton.jit
def phase2_fwd(o, mx, s, q, P, u, P_out, details, d_out, bias, h, R, d, eps, max_scale, R_BUCKET, K: tl.constexpr,
               CHAIN: tl.constexpr, KD: tl.constexpr, KLO: tl.constexpr, CSIGN: tl.constexpr, HAS_BIAS: tl.constexpr,
               BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr):
    """h = w_o·o + w_P·P + Σ_j w_j·c_j·D_j for one token row (the merge of ``routers.block.phases.merge``: o's logit
    is phase 1's log-sum-exp μ + log s), over the K seen details. ``CHAIN``: the running sums pass through this
    kernel: P + u into P_out and each of the KD raw details D_j ± u (+ where bit j of ``CSIGN`` is set) into
    d_out[j], each rounded to its dtype as the sums' own adds; the seen details are kinds KLO … KLO + K − 1 of
    those."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_D)
    cm = cols < d
    qv = tl.load(q + cols, mask=cm, other=0.0).to(tl.float32)
    Pv = tl.load(P + row * d + cols, mask=cm, other=0.0)
    if CHAIN:
        uv = tl.load(u + row * d + cols, mask=cm, other=0.0).to(tl.float32)
        Pv = (Pv.to(tl.float32) + uv).to(P_out.dtype.element_ty)
        tl.store(P_out + row * d + cols, Pv, mask=cm)
        kk = tl.arange(0, BLOCK_K)
        Dt = tl.zeros((BLOCK_K, BLOCK_D), tl.float32)
        for j in tl.static_range(KD):
            x = tl.load(details[j] + row * d + cols, mask=cm, other=0.0).to(tl.float32)
            if (CSIGN >> j) & 1:
                x = (x + uv).to(d_out[j].dtype.element_ty)
            else:
                x = (x - uv).to(d_out[j].dtype.element_ty)
            tl.store(d_out[j] + row * d + cols, x, mask=cm)
            if j >= KLO and j < KLO + K:
                Dt = tl.where(kk[:, None] == j - KLO, x.to(tl.float32)[None, :], Dt)
    else:
        Dt = _details(details, row, d, cols, cm, K, BLOCK_K, BLOCK_D)
    Pv = Pv.to(tl.float32)
    ov = tl.load(o + row * d + cols, mask=cm, other=0.0).to(tl.float32)
    w_o, w_p, w_d, c, _, _, _, _ = _merge_weights(qv, Pv, Dt, tl.load(mx + row), tl.load(s + row), bias, d, eps,
                                                  max_scale, K, HAS_BIAS, BLOCK_K)
    out = w_o * ov + w_p * Pv + tl.sum((w_d * c)[:, None] * Dt, axis=0)
    tl.store(h + row * d + cols, out.to(h.dtype.element_ty), mask=cm)


@triton.jit(do_not_specialize=["bits"])
def phase2_bwd(g, g_pn, g_dn, h, mx, s, q, bias, updates, coef_t, bits, k_lo, n_kinds, g_o, g_s, g_p, g_d, g_u,
               part, R, d, eps, max_scale, rows_per_prog, boff, KT, R_BUCKET, K: tl.constexpr, U: tl.constexpr,
               HAS_GPN: tl.constexpr, KD: tl.constexpr, KLO: tl.constexpr, CSIGN: tl.constexpr,
               GD_BITS: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_COEF_T: tl.constexpr, BLOCK_K: tl.constexpr,
               BLOCK_KT: tl.constexpr, BLOCK_D: tl.constexpr):
    """The gradient of :func:`phase2_fwd` over ``rows_per_prog`` rows (``HAS_GPN``: of a chained merge, whose P's
    gradient g_pn is added to ∂P, which is then P_prev's and u's): P and the details are rebuilt from the block's
    updates u_0 … u_{p−1} (oldest first) by the forward's own sums, each rounded to the updates' dtype (coefficient
    of update i in detail kind k_lo + j: bit i·n_kinds + k_lo + j of ``bits``, or ``coef_t[i, k_lo + j]``). The gain
    c is a constant here, as it is detached in ``routers.block.phases.merge``. With every weight w: gℓ_S = w_S(g·S −
    g·h) for S = P, c·D; ∂/∂o = w_o·g; ∂/∂s = −Σ gℓ / s; ∂/∂S = w_S·g + k_q·q + k_s·S with k_q = gℓ·c·ρ and k_s =
    −k_q·c²·t·ρ²/d. ∂/∂q and ∂/∂bias: this program's partial sums, one row of ``part`` (programs, d + KT) float32
    (∂/∂q, then ∂/∂bias at KT columns from ``boff``), which the launcher sums in one reduction. With ``KD`` (a merge
    whose running details pass through it, :func:`phase2_fwd`'s ``CHAIN``): each detail's gradient adds D_j ± u's
    own (``g_dn[j]``, where bit j of ``GD_BITS`` is set) and goes to g_d[j] for all KD kinds, and u's, ∂P + Σ ±∂D_j,
    to g_u."""
    pid = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_D)
    cm = cols < d
    kk = tl.arange(0, BLOCK_K)
    km = kk < K
    qv = tl.load(q + cols, mask=cm, other=0.0).to(tl.float32)
    gq = tl.zeros((BLOCK_D,), tl.float32)
    gb = tl.zeros((BLOCK_K,), tl.float32)
    for t in range(0, rows_per_prog):
        row = pid * rows_per_prog + t
        live = row < R
        lm = cm & live
        u0 = tl.load(updates[0] + row * d + cols, mask=lm, other=0.0)
        Pv = u0
        Dt = tl.zeros((BLOCK_K, BLOCK_D), tl.float32)
        for i in tl.static_range(U):
            if i > 0:
                u = tl.load(updates[i] + row * d + cols, mask=lm, other=0.0)
                Pv = (Pv.to(tl.float32) + u.to(tl.float32)).to(u0.dtype)
            else:
                u = u0
            if HAS_COEF_T:
                ci = tl.load(coef_t + i * n_kinds + k_lo + kk, mask=km, other=0.0).to(tl.float32)
            else:
                ci = tl.where(((bits.to(tl.int64) >> (i * n_kinds + k_lo + kk)) & 1) == 1, 1.0, -1.0)
            Dt = (Dt + ci[:, None] * u.to(tl.float32)[None, :]).to(u0.dtype).to(tl.float32)
        Pv = Pv.to(tl.float32)
        mu = tl.load(mx + row, mask=live, other=0.0)
        sv = tl.load(s + row, mask=live, other=1.0)
        w_o, w_p, w_d, c, t_p, t_d, r_p, rho = _merge_weights(qv, Pv, Dt, mu, sv, bias, d, eps, max_scale, K,
                                                              HAS_BIAS, BLOCK_K)
        gv = tl.load(g + row * d + cols, mask=lm, other=0.0).to(tl.float32)
        gh = tl.sum(gv * tl.load(h + row * d + cols, mask=lm, other=0.0).to(tl.float32), axis=0)
        gl_p = w_p * (tl.sum(gv * Pv, axis=0) - gh)
        gl_d = tl.where(km, w_d * (c * tl.sum(gv[None, :] * Dt, axis=1) - gh), 0.0)
        tl.store(g_o + row * d + cols, (w_o * gv).to(g_o.dtype.element_ty), mask=lm)
        # s = 0 (phase 1 over a fully masked pool): o has no weight, and s no gradient
        tl.store(g_s + row, tl.where(sv == 0.0, 0.0, -(gl_p + tl.sum(gl_d, axis=0)) / tl.where(sv == 0.0, 1.0, sv)),
                 mask=live)
        kq_p = gl_p * r_p
        ks_p = -kq_p * t_p * r_p * r_p / d
        gp = w_p * gv + kq_p * qv + ks_p * Pv
        if HAS_GPN:  # a chained merge: P's own gradient beside the merge's (P = P_prev + u: both get it)
            gp += tl.load(g_pn + row * d + cols, mask=lm, other=0.0).to(tl.float32)
        tl.store(g_p + row * d + cols, gp.to(g_p.dtype.element_ty), mask=lm)
        kq_d = gl_d * c * rho
        ks_d = -kq_d * c * c * t_d * rho * rho / d
        gd = (w_d * c)[:, None] * gv[None, :] + kq_d[:, None] * qv[None, :] + ks_d[:, None] * Dt
        if KD > 0:  # every running detail's gradient, and u's
            gu = gp
            for j in tl.static_range(KD):
                gj = tl.zeros((BLOCK_D,), tl.float32)
                if (GD_BITS >> j) & 1:
                    gj += tl.load(g_dn[j] + row * d + cols, mask=lm, other=0.0).to(tl.float32)
                if j >= KLO and j < KLO + K:
                    gj += tl.sum(tl.where((kk == j - KLO)[:, None], gd, 0.0), axis=0)
                tl.store(g_d + j * R * d + row * d + cols, gj.to(g_d.dtype.element_ty), mask=lm)
                if (CSIGN >> j) & 1:
                    gu += gj
                else:
                    gu -= gj
            tl.store(g_u + row * d + cols, gu.to(g_u.dtype.element_ty), mask=lm)
        else:
            tl.store(g_d + kk[:, None].to(tl.int64) * R * d + row * d + cols[None, :], gd.to(g_d.dtype.element_ty),
                     mask=km[:, None] & lm[None, :])
        gq += kq_p * Pv + tl.sum(kq_d[:, None] * Dt, axis=0)
        gb += gl_d
    tl.store(part + pid * (d + KT) + cols, gq, mask=cm)
    kt = tl.arange(0, BLOCK_KT)  # ∂bias at columns boff … boff + K − 1 of the KT after ∂q, zeros in the others
    if HAS_BIAS:
        tl.store(part + pid * (d + KT) + d + kt, 0.0, mask=(kt < KT) & ((kt < boff) | (kt >= boff + K)))
        tl.store(part + pid * (d + KT) + d + boff + kk, gb, mask=km)
    else:  # a query that carries biases this read does not see
        tl.store(part + pid * (d + KT) + d + kt, 0.0, mask=kt < KT)
