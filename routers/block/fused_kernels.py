"""Triton kernels of the ``fused`` two-phase schedule's phase 1 (Attention Residuals, arXiv:2603.15031; WAV v1 /
HAARES, arXiv:2606.06564): a block's m pseudo-queries over the completed pool, forward and backward, launched as
``torch.library`` custom ops by ``routers/block/fused.py``; phase 2 and the RMS matching are in
``routers/block/fused_kernels_merge.py``. Conventions (docs/IMPLS.md,
"Fused kernels"): a token row is one (d,) row of a contiguous (B, T, d) tensor, R = B·T, offsets int64;
``R_BUCKET`` is read by no kernel, it keys the autotuner (``fused_launch.KEYS``); the pool, a block's updates and
a query's own tensors come as tuples of pointers, never stacked; every dot, norm and softmax statistic accumulates
in float32 without ``tl.dot`` (no TF32); a row whose every logit is −inf (pads) gives o = 0, μ = −inf, s = 0 and
zero gradients, never NaN; a sum across rows is two-stage, never atomic (the autotuner re-runs a kernel): each
program writes its partials as one float32 row, which one torch sum reduces (a row loop in phase 1's backward
would keep every source's addresses live and spill on sm_90, so :func:`phase1_bwd_q` loops over the sources
outside its row loop).
"""

from __future__ import annotations

import triton
import triton.language as tl

NEG_INF = tl.constexpr(float("-inf"))  # a kernel reads a module global only as a constexpr


@triton.jit
def _logits(Q, v, rr, bias, codes, valid, mi, mm, i, KB, HAS_BIAS: tl.constexpr, HAS_VALID: tl.constexpr):
    """Logits (BLOCK_M,) of the m queries Q over source i: (q·v)·r + its bias, −inf for a pad; also the raw dots q·v.
    The bias of source i is its kind's column of the queries' detail-bias rows (m, KB): kind code c = codes[i],
    column c − 1, none for a state source (c = 0)."""
    dot = tl.sum(Q * v[None, :], axis=1)
    logit = dot * rr
    if HAS_BIAS:
        code = tl.load(codes + i)
        b = tl.load(bias + mi * KB + tl.maximum(code - 1, 0), mask=mm, other=0.0).to(tl.float32)
        logit += tl.where(code > 0, b, 0.0)
    if HAS_VALID:
        logit = tl.where(tl.load(valid + i) != 0, logit, NEG_INF)
    return logit, dot


@triton.jit
def _bases(ptrs, mi, NQ: tl.constexpr):
    """(BLOCK_M,) pointers: for each query ``mi``, its own tensor of the tuple ``ptrs`` (m tensors, one per query;
    the first past m). A vector of NQ − 1 selects, so a load or store of every query's row is one masked access, as
    over one (m, …) tensor."""
    base = ptrs[0] + tl.zeros_like(mi)
    for j in tl.static_range(1, NQ):
        base = tl.where(mi == j, ptrs[j], base)
    return base


@triton.jit
def _gather(ptrs, row, d, cols, cm, mi, mm, other, NQ: tl.constexpr, BITS: tl.constexpr, ROWS: tl.constexpr):
    """The per-query tensors ``ptrs`` (a tuple of NQ; query i's is absent where bit i of ``BITS`` is 0) of the
    queries ``mi`` at ``row``: their (d,) rows as a (BLOCK_M, BLOCK_D) float32 tile (``ROWS``) or their (R,) entries
    as a (BLOCK_M,) vector; ``other`` where absent."""
    base = _bases(ptrs, mi, NQ)
    live = mm & (((BITS >> mi) & 1) != 0)
    if ROWS:
        out = tl.load(base[:, None] + row * d + cols[None, :], mask=live[:, None] & cm[None, :], other=other)
    else:
        out = tl.load(base + row, mask=live, other=other)
    return out.to(tl.float32)


@triton.jit
def _scatter(ptrs, x, row, d, cols, cm, mi, mm, NQ: tl.constexpr, ROWS: tl.constexpr):
    """Store each query's entry of ``x`` ((BLOCK_M, BLOCK_D) rows with ``ROWS``, else (BLOCK_M,)) into its own tensor
    of the tuple ``ptrs`` at ``row``."""
    base = _bases(ptrs, mi, NQ)
    if ROWS:
        tl.store(base[:, None] + row * d + cols[None, :], x.to(ptrs[0].dtype.element_ty),
                 mask=mm[:, None] & cm[None, :])
    else:
        tl.store(base + row, x.to(ptrs[0].dtype.element_ty), mask=mm)


@triton.jit
def phase1_fwd(values, q, bias, codes, valid, o, mx, s, qc, inv, R, d, eps, n_q, KB, R_BUCKET, N: tl.constexpr,
               NQ: tl.constexpr, HAS_BIAS: tl.constexpr, QB: tl.constexpr, HAS_VALID: tl.constexpr,
               WRITE_O: tl.constexpr, WRITE_Q: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr,
               BLOCK_KB: tl.constexpr):
    """m = n_q = NQ queries q (m, d) over the N sources of one token row, by online softmax in one pass over the
    sources, BLOCK_M queries per program (program (row, g): queries g·BLOCK_M …; the launcher keeps a program's
    BLOCK_M × BLOCK_D float32 tiles at 4,096 floats, past which they spill on sm_90). Each query's results go to
    tensors of its own (tuples of m): o_i (R, d) unless ``WRITE_O`` is off, μ_i the max and s_i the sum of exp(logit
    − μ_i) (R,), and with ``WRITE_Q`` the programs of row 0 copy q_i into qc_i (d,) float32, followed with ``QB`` by
    its detail-bias row (KB) (the query and biases phase 2 takes, so that their gradients return through this op's
    backward). The pool's biases: ``HAS_BIAS``, the queries' detail-bias rows bias (m, KB) by the sources' kind codes
    (:func:`_logits`)."""
    row = tl.program_id(0).to(tl.int64)
    grp = tl.program_id(1).to(tl.int64)
    mi = grp * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_D)
    mm = mi < n_q
    cm = cols < d
    Q = tl.load(q + mi[:, None] * d + cols[None, :], mask=mm[:, None] & cm[None, :], other=0.0).to(tl.float32)
    m_run = tl.full((BLOCK_M,), NEG_INF, tl.float32)
    s_run = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)
    for i in tl.static_range(N):
        v = tl.load(values[i] + row * d + cols, mask=cm, other=0.0).to(tl.float32)
        rr = tl.rsqrt(tl.sum(v * v, axis=0) / d + eps)  # the key's inverse RMS, from the row loaded
        tl.store(inv + i * R + row, rr, mask=grp == 0)
        logit, _ = _logits(Q, v, rr, bias, codes, valid, mi, mm, i, KB, HAS_BIAS, HAS_VALID)
        m_new = tl.maximum(m_run, logit)
        m_safe = tl.where(m_new == NEG_INF, 0.0, m_new)
        alpha = tl.exp(m_run - m_safe)
        p = tl.exp(logit - m_safe)
        s_run = s_run * alpha + p
        if WRITE_O:
            acc = acc * alpha[:, None] + p[:, None] * v[None, :]
        m_run = m_new
    _scatter(mx, m_run, row, d, cols, cm, mi, mm, NQ, False)
    _scatter(s, s_run, row, d, cols, cm, mi, mm, NQ, False)
    if WRITE_O:
        _scatter(o, acc / tl.where(s_run == 0.0, 1.0, s_run)[:, None], row, d, cols, cm, mi, mm, NQ, True)
    if WRITE_Q:
        if row == 0:
            _scatter(qc, Q, row, 0, cols, cm, mi, mm, NQ, True)
            if QB:  # each query's detail-bias row after it: (d + KB,)
                kb = tl.arange(0, BLOCK_KB)
                B = tl.load(bias + mi[:, None] * KB + kb[None, :], mask=mm[:, None] & (kb < KB)[None, :], other=0.0)
                _scatter(qc, B, 1, d, kb, kb < KB, mi, mm, NQ, True)


@triton.jit
def _queries_and_stats(q, mx, s, mi, mm, cols, cm, row, d, NQ: tl.constexpr):
    """The queries ``mi`` (BLOCK_M, BLOCK_D) and their phase-1 statistics at ``row`` (μ and s: tuples of m tensors
    (R,)): μ (−inf replaced by 0), s, and s with 0 replaced by 1 (a fully masked row)."""
    Q = tl.load(q + mi[:, None] * d + cols[None, :], mask=mm[:, None] & cm[None, :], other=0.0).to(tl.float32)
    mu = _gather(mx, row, d, cols, cm, mi, mm, 0.0, NQ, (1 << NQ) - 1, False)
    sv = _gather(s, row, d, cols, cm, mi, mm, 1.0, NQ, (1 << NQ) - 1, False)
    return Q, tl.where(mu == NEG_INF, 0.0, mu), sv, tl.where(sv == 0.0, 1.0, sv)


@triton.jit
def phase1_bwd(values, inv, q, bias, codes, valid, mx, s, g_o, g_s, g_dot, g_v, g_l,
               R, d, n_q, KB, row0, RC, R_BUCKET, N: tl.constexpr, NQ: tl.constexpr, HAS_BIAS: tl.constexpr,
               HAS_VALID: tl.constexpr, GO_BITS: tl.constexpr, GS_BITS: tl.constexpr, BLOCK_M: tl.constexpr,
               BLOCK_D: tl.constexpr):
    """The gradient of :func:`phase1_fwd` for one token row and BLOCK_M queries (program (row, g) as
    :func:`phase1_fwd`), recomputed from the sources, their inverse RMS and the float32 μ, s: β = exp(ℓ − μ)/s, gℓ =
    β(g_o·V − g_dot) + β·s·g_s with g_dot = Σβ g_o·V from :func:`phase1_bwd_dot` (a pass of its own: in one kernel
    the compiler keeps every source's row live from one pass to the next, and spills). g_o and g_s are tuples of m,
    query i's present where bit i of ``GO_BITS`` / ``GS_BITS`` is set. Writes ∂/∂V_i = Σ_m β g_o + (gℓ·r) q − (Σ_m
    gℓ·(q·V_i))·r³·V_i/d (the last term through the key's inverse RMS r, which phase 1 wrote) into g_v[g, i] (groups,
    N, R, d), summed over the queries of its group (the launcher sums the groups), and gℓ into g_l (N, m, R), from
    which :func:`phase1_bwd_q` sums ∂/∂q and ∂/∂bias over the rows (a loop over rows here would keep each source's
    addresses live across it, and spill). A launch covers the rows row0 … row0 + programs − 1, and g_v holds RC rows
    from row0 (the launcher's chunk)."""
    row = row0 + tl.program_id(0).to(tl.int64)
    lrow = tl.program_id(0).to(tl.int64)
    grp = tl.program_id(1).to(tl.int64)
    mi = grp * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_D)
    mm = mi < n_q
    cm = cols < d
    Q, mu, sv, s_safe = _queries_and_stats(q, mx, s, mi, mm, cols, cm, row, d, NQ)
    gs = _gather(g_s, row, d, cols, cm, mi, mm, 0.0, NQ, GS_BITS, False)
    if GO_BITS != 0:
        G = _gather(g_o, row, d, cols, cm, mi, mm, 0.0, NQ, GO_BITS, True)
        dsum = tl.load(g_dot + mi * R + row, mask=mm, other=0.0)
    for i in tl.static_range(N):
        v = tl.load(values[i] + row * d + cols, mask=cm, other=0.0).to(tl.float32)
        rr = tl.load(inv + i * R + row)
        logit, dot = _logits(Q, v, rr, bias, codes, valid, mi, mm, i, KB, HAS_BIAS, HAS_VALID)
        beta = tl.where(mm, tl.exp(logit - mu) / s_safe, 0.0)
        gl = beta * sv * gs
        if GO_BITS != 0:
            gl += beta * (tl.sum(G * v[None, :], axis=1) - dsum)
            gv = tl.sum(beta[:, None] * G + (gl * rr)[:, None] * Q, axis=0)
        else:
            gv = tl.sum((gl * rr)[:, None] * Q, axis=0)
        gv -= tl.sum(gl * dot, axis=0) * rr * rr * rr / d * v  # through the key's inverse RMS
        tl.store(g_v + (grp * N + i) * RC * d + lrow * d + cols, gv.to(g_v.dtype.element_ty), mask=cm)
        tl.store(g_l + (i * n_q + mi) * R + row, gl, mask=mm)


@triton.jit
def phase1_bwd_dot(values, inv, q, bias, codes, valid, mx, s, g_o, g_dot, R, d, n_q, KB, R_BUCKET, N: tl.constexpr,
                   NQ: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_VALID: tl.constexpr, GO_BITS: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
    """g_dot (m, R) = Σ_i β_i·(g_o·V_i) = g_o·o per query and row, recomputed from the sources (the first pass of
    :func:`phase1_bwd`; program (row, g) as :func:`phase1_fwd`)."""
    row = tl.program_id(0).to(tl.int64)
    grp = tl.program_id(1).to(tl.int64)
    mi = grp * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_D)
    mm = mi < n_q
    cm = cols < d
    Q, mu, sv, s_safe = _queries_and_stats(q, mx, s, mi, mm, cols, cm, row, d, NQ)
    G = _gather(g_o, row, d, cols, cm, mi, mm, 0.0, NQ, GO_BITS, True)
    acc = tl.zeros((BLOCK_M,), tl.float32)
    for i in tl.static_range(N):
        v = tl.load(values[i] + row * d + cols, mask=cm, other=0.0).to(tl.float32)
        logit, _ = _logits(Q, v, tl.load(inv + i * R + row), bias, codes, valid, mi, mm, i, KB, HAS_BIAS, HAS_VALID)
        acc += tl.exp(logit - mu) / s_safe * tl.sum(G * v[None, :], axis=1)
    tl.store(g_dot + mi * R + row, acc, mask=mm)


@triton.jit
def phase1_bwd_q(values, inv, g_l, g_qc, codes, part, R, d, n_q, KB, width, rows_per_prog, R_BUCKET,
                 N: tl.constexpr, NQ: tl.constexpr, GQ_BITS: tl.constexpr, HAS_BIAS: tl.constexpr, QB: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_KB: tl.constexpr):
    """This program's partial sums, over its ``rows_per_prog`` rows, of ∂/∂q = Σ_rows Σ_i (gℓ_i·r_i) V_i (m, d) and,
    with the detail-bias rows (``QB``), ∂/∂rows (m, KB): Σ_rows gℓ_i into source i's kind column (``HAS_BIAS``: the
    pool has details, kind codes ``codes``), from :func:`phase1_bwd`'s gℓ (N, m, R): one row of ``part`` (programs,
    ``width`` = m·d, + m·KB with the rows) float32, which the launcher sums in one reduction. Program (p, g) takes
    the queries of group g; the sources are the outer loop, so one source's addresses are live in the row loop.
    Program 0 adds the gradients of the query copies (``g_qc``, a tuple of m (d + KB,) float32, query i's present
    where bit i of ``GQ_BITS`` is set: phase 2's ∂/∂q and ∂/∂bias)."""
    pid = tl.program_id(0).to(tl.int64)
    grp = tl.program_id(1).to(tl.int64)
    mi = grp * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_D)
    kb = tl.arange(0, BLOCK_KB)
    mm = mi < n_q
    cm = cols < d
    acc = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)
    gbk = tl.zeros((BLOCK_M, BLOCK_KB), tl.float32)
    if GQ_BITS != 0:
        if pid == 0:
            acc += _gather(g_qc, 0, 0, cols, cm, mi, mm, 0.0, NQ, GQ_BITS, True)
            if QB:
                gbk += _gather(g_qc, 1, d, kb, kb < KB, mi, mm, 0.0, NQ, GQ_BITS, True)
    for i in tl.static_range(N):
        gb = tl.zeros((BLOCK_M,), tl.float32)
        for t in range(0, rows_per_prog):
            row = pid * rows_per_prog + t
            live = row < R
            v = tl.load(values[i] + row * d + cols, mask=cm & live, other=0.0).to(tl.float32)
            gl = tl.load(g_l + (i * n_q + mi) * R + row, mask=mm & live, other=0.0)
            acc += (gl * tl.load(inv + i * R + row, mask=live, other=0.0))[:, None] * v[None, :]
            gb += gl
        if HAS_BIAS:
            gbk += tl.where(kb[None, :] == tl.load(codes + i) - 1, gb[:, None], 0.0)
    if QB:
        tl.store(part + pid * width + n_q * d + mi[:, None] * KB + kb[None, :], gbk,
                 mask=mm[:, None] & (kb < KB)[None, :])
    tl.store(part + pid * width + mi[:, None] * d + cols[None, :], acc, mask=mm[:, None] & cm[None, :])
