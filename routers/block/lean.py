"""The ``lean`` implementation of the block routers: the two-phase schedule
(``routers/block/two_phase.py``) with a backward that keeps the sources once and a few float32 statistics
per token, and recomputes the rest (logits, softmax weights, the partial sums).

Plain autograd of the two-phase forward keeps, per read, a stacked copy of the sources, float32
upcasts, logits and weights, and every running P and D; Megatron-LM's AttnRes Function and FLA's
``fused_attnres`` (``checkpoint_level``) save the values and per-token statistics instead. Here
three custom autograd Functions (:class:`InvRms`; :class:`Phase1`, which also serves the readout
as one query; :class:`Phase2`) do the same for every read of ``block_attnres``, ``haares`` and
``wav_v1``; each keeps only what ``ctx.save_for_backward`` holds (tests/test_lean.py fails a
Function whose ctx holds a tensor attribute, which the saved-tensor hooks of ``saved_activation``
would not see). What the backward keeps, in (B, T, d) tensors of the sources' dtype, with N blocks
of m_b sublayers, K detail kinds and 2L sublayers (ROUTERS.md, "Two-phase computation"):

- the sublayer outputs u_{b,0} … u_{b,m_b−2} of every block (P and the details are linear in them,
  so a read's backward rebuilds the P and D it saw, bit for bit, by the forward's own sums; the
  block's last output is never read inside its block): Σ_b (m_b − 1) = 2L − N;
- each completed source once: C_1 … C_N and the RMS-matched details D̃_b of every block but the
  last (of the last too with ``readout_details``): N + K·(N − 1); e and every read's output are
  the sublayer norms' inputs, which prenorm's backward keeps too.

So 2L + K(N − 1) tensors beyond prenorm: 24, 29, 34 at 12 layers and N = 6 (about 1.07, 1.09, 1.10
times prenorm's 29.3 per layer), plus these float32 statistics per token: the inverse RMS of every
completed source (1 + N + K(N−1)) and the RMS-matching gain of every completed detail (K(N−1));
per phase 1 over n sources for m queries (the readout is one with m = 1) the raw query·source dots
(m·n) and the running max and sum (2m); per phase-2 read seeing K' details the softmax weights of
(o, P, its details) (2 + K'), the details' gains (K'), and per partial source its dot with the
query and its inverse RMS (2 + 2K').

Phase 1's output o of a block start is its own tensor (the next sublayer's norm keeps it, and a view
would keep all m outputs); the other outputs are views that nobody keeps. The forward computes what
``two_phase`` computes, in the same order, so the two agree to rounding; the statistics are in the
softmax dtype (float32 for low-precision tensors). Under autocast each backward runs with its
forward's autocast state (what ``torch.amp.custom_bwd`` does, for any device), so its contractions
cast as the forward's did. Each Function's backward runs what it recomputes inside
:func:`recomputing` of the router's ``recompute_scope``, which the FLOP counter sets for the
``recompute_flops_dispatch`` row (``harness/sweep/counts.py``).
"""

from __future__ import annotations

import contextlib
from typing import Callable, ContextManager, Sequence

import torch
from torch import Tensor

from ..mixer import EPS, softmax_dtype
from ..impls import BUILTIN_NOTE, Impl, StateModel
from .phases import Phases, autocast_off, distinct
from .plan import coefficient

#: What a Function's backward runs its recompute in: a factory of a context manager (a FLOP
#: counter, ``harness.sweep.counts``, sets the router's ``recompute_scope``), or None.
Scope = Callable[[], ContextManager] | None


def recomputing(scope: Scope) -> ContextManager:
    """The context in which a backward recomputes forward quantities: ``scope()``, or nothing."""
    return scope() if scope is not None else contextlib.nullcontext()


def _autocast_state(t: Tensor) -> tuple[str, bool, torch.dtype]:
    """The autocast state of ``t``'s device now (kept by a forward for its backward)."""
    dev = t.device.type
    try:
        return dev, torch.is_autocast_enabled(dev), torch.get_autocast_dtype(dev)
    except RuntimeError:  # a device autocast does not know (meta): none
        return dev, False, None


def _autocast(state: tuple[str, bool, torch.dtype]) -> ContextManager:
    """Autocast as the forward ran (what ``torch.amp.custom_bwd`` does, for any device): a
    backward runs outside the forward's autocast, and its contractions must cast alike."""
    dev, enabled, dtype = state
    return torch.autocast(dev, dtype=dtype, enabled=enabled) if dtype is not None else contextlib.nullcontext()


def _dot(a: Tensor, b: Tensor, acc: torch.dtype) -> Tensor:
    """Row-wise dot over d, (…, d) · (…, d) → (…), accumulated in ``acc``."""
    return torch.linalg.vecdot(a.to(acc), b.to(acc))


class InvRms(torch.autograd.Function):
    """``rsqrt(mean(v²) + ε)`` over d, (B, T, d) → (B, T) in the softmax dtype, keeping v (a source,
    kept once anyway) and the result. Backward: ∂r/∂v = −r³·v/d."""

    @staticmethod
    def forward(ctx, v: Tensor) -> Tensor:
        acc = softmax_dtype(v.dtype)
        r = torch.rsqrt(torch.linalg.vector_norm(v, dim=-1, dtype=acc).square() / v.shape[-1] + EPS)
        ctx.save_for_backward(v, r)
        return r

    @staticmethod
    def backward(ctx, g: Tensor) -> Tensor:
        v, r = ctx.saved_tensors
        coef = -g * r.pow(3) / v.shape[-1]
        return (coef.unsqueeze(-1) * v).to(v.dtype)


def inv_rms(v: Tensor) -> Tensor:
    """:func:`routers.block.phases.inv_rms` through :class:`InvRms`."""
    return InvRms.apply(v)


class Phase1(torch.autograd.Function):
    """Phase 1 of a block (:func:`routers.block.phases.phase1`): m queries over n completed sources.

    ``apply(n, alias, contiguous, scope, q, bias, valid, *values, *inv)`` (plain int and bools,
    never a tuple: some torch versions' Dynamo misbind a tuple argument of ``apply``; ``scope``
    the :data:`Scope` of the backward's recompute): q (m, d) the queries
    (key gain folded in), bias (m, n) or None, valid (n,) a bool mask of the pool's real sources
    (False for a pad of the layer scope) or None, then n sources (B, T, d) and their inverse RMS (B, T).

    Returns ``(o_0, o_rest, μ, s)``: o_0 (B, T, d) its own tensor, o_rest (m−1, B, T, d), μ and s
    (m, B, T) in the softmax dtype (μ not differentiable: softmax is shift-invariant). With
    ``alias`` (n = 1: every o_i is the source itself, which the caller uses) only ``(μ, s)``; with
    ``contiguous``, o_rest in the standard layout (the layer scope's regions guard on strides).

    Keeps the sources and inverse RMS (kept once anyway), q, bias, valid, the dots q·V (m, B, T, n)
    and μ, s. Backward, with β = softmax weights rebuilt from the dots: gℓ = β(g_o·V − Σβ g_o·V) +
    β·s·g_s, then ∂/∂V = βᵀg_o + (gℓ·r)ᵀq, ∂/∂r = Σ_m gℓ·dots, ∂/∂q = Σ (gℓ·r)V, ∂/∂bias = Σ gℓ.
    """

    @staticmethod
    def forward(ctx, n: int, alias: bool, contiguous: bool, scope: Scope, q: Tensor, bias: Tensor | None,
                valid: Tensor | None, *tensors: Tensor):
        values, inv = tensors[:n], tensors[n:]
        V = torch.stack(values, dim=2)                                # (B, T, n, d), transient
        acc = softmax_dtype(V.dtype)
        with autocast_off(V.device.type):  # as phases.exact_matmul
            dots = torch.matmul(V, q.t()).to(acc)                     # (B, T, n, m)
        logits = dots * torch.stack(inv, dim=-1).unsqueeze(-1)
        if bias is not None:
            logits = logits + bias.t().to(acc)
        if valid is not None:
            logits = logits.masked_fill(valid.logical_not().unsqueeze(-1), float("-inf"))
        # μ and s reduce a (m, B, T, n) view: outputs of their own (not views; some torch
        # versions mishandle a view marked non-differentiable), in the (m, B, T) layout
        mx = logits.permute(3, 0, 1, 2).amax(dim=-1)                   # (m, B, T)
        p = torch.exp(logits - mx.permute(1, 2, 0).unsqueeze(2))       # (B, T, n, m)
        s = p.permute(3, 0, 1, 2).sum(dim=-1)                          # (m, B, T)
        ctx.n, ctx.alias, ctx.scope, ctx.autocast = n, alias, scope, _autocast_state(q)
        # the backward's layout: (m, B, T, n) dots (a view, no copy)
        ctx.save_for_backward(q, bias, valid, dots.permute(3, 0, 1, 2), mx, s, *values, *inv)
        ctx.mark_non_differentiable(mx)
        if alias:
            return mx, s
        with autocast_off(V.device.type):
            w = (p / s.permute(1, 2, 0).unsqueeze(2)).to(V.dtype)
            o = torch.matmul(w.mT, V).movedim(2, 0)                    # (m, B, T, d)
        if contiguous:  # the layer scope: a region guards on the strides of its inputs, which must not
            o = o.contiguous()  # depend on the block
        o0 = o[0] if o.shape[0] == 1 else o[0].clone()
        return o0, o[1:], mx, s

    @staticmethod
    def backward(ctx, *grads):
        with _autocast(ctx.autocast):
            return Phase1._backward(ctx, *grads)

    @staticmethod
    def _backward(ctx, *grads):
        n, alias = ctx.n, ctx.alias
        q, bias, valid, dots, mx, s, *rest = ctx.saved_tensors
        values, inv = rest[:n], rest[n:]
        # the forward's layout: (B, T, n, m) dots, (B, T, 1, m) statistics (views of what was saved)
        dots, mx, s = dots.permute(1, 2, 3, 0), mx.movedim(0, -1).unsqueeze(2), s.movedim(0, -1).unsqueeze(2)
        g_s = grads[-1]
        with recomputing(ctx.scope):
            r = torch.stack(inv, dim=-1).unsqueeze(-1)                # (B, T, n, 1)
            logits = dots * r
            if bias is not None:
                logits = logits + bias.t().to(dots.dtype)
            if valid is not None:
                logits = logits.masked_fill(valid.logical_not().unsqueeze(-1), float("-inf"))
            beta = torch.exp(logits - mx) / s                          # (B, T, n, m)
        V = torch.stack(values, dim=2)                                 # (B, T, n, d)
        g_l = torch.zeros_like(beta) if g_s is None else beta * (g_s.movedim(0, -1).unsqueeze(2) * s)
        g_v = None
        # the contractions in the sources' dtype, as the forward's (phases.exact_matmul)
        with autocast_off(V.device.type):
            if not alias and (grads[0] is not None or grads[1] is not None):
                g_o0, g_rest = grads[0], grads[1]
                m = dots.shape[-1]
                G = torch.cat(((torch.zeros_like(values[0]) if g_o0 is None else g_o0).unsqueeze(0),
                               V.new_zeros(m - 1, *V.shape[:2], V.shape[-1]) if g_rest is None else g_rest))
                G = G.movedim(0, 2)                                    # (B, T, m, d)
                g_beta = torch.matmul(V, G.mT).to(beta.dtype)          # (B, T, n, m)
                g_l = g_l + beta * (g_beta - (beta * g_beta).sum(dim=2, keepdim=True))
                g_v = torch.matmul(beta.to(V.dtype), G)                # (B, T, n, d)
            g_dots = (g_l * r).to(V.dtype)                             # ∂ℓ/∂dots = r
            key = torch.matmul(g_dots, q)                              # (B, T, n, d)
            g_v = key if g_v is None else g_v + key
            g_q = (torch.matmul(g_dots.flatten(0, 2).t(), V.flatten(0, 2))
                   if ctx.needs_input_grad[4] else None)               # (m, d)
        g_b = g_l.sum(dim=(0, 1)).t().to(bias.dtype) if bias is not None and ctx.needs_input_grad[5] else None
        g_r = (g_l * dots).sum(dim=-1)                                 # (B, T, n)
        return (None, None, None, None, g_q, g_b, None, *g_v.unbind(2), *g_r.unbind(-1))


def phase1(q: Tensor, bias: Tensor | None, values: Sequence[Tensor], inv: Sequence[Tensor],
           valid: Tensor | None, scope: Scope = None) -> tuple[tuple[Tensor, ...], Tensor, Tensor]:
    """:func:`routers.block.phases.phase1` through :class:`Phase1` (under the layer scope, ``valid``
    given, o in the standard layout).

    Returns:
        (o_0, …, o_{m−1}) each (B, T, d) (views of the source when n = 1), μ and s (m, B, T).
    """
    n, m, contiguous = len(values), q.shape[0], valid is not None
    if n == 1:  # each o_i is the source: a view of it each (one storage; no object twice, which a
        # layer-scope region would see as an input aliasing the pool's e and guard on)
        mx, s = Phase1.apply(1, True, contiguous, scope, q, bias, valid, *values, *inv)
        return tuple(values[0].view_as(values[0]) for _ in range(m)), mx, s
    o0, rest, mx, s = Phase1.apply(n, False, contiguous, scope, q, bias, valid, *values, *inv)
    return (o0, *rest.unbind(0)), mx, s


def readout(q: Tensor, bias: Tensor | None, values: Sequence[Tensor], inv: Sequence[Tensor],
            valid: Tensor | None, scope: Scope = None) -> Tensor:
    """:func:`routers.block.phases.readout` through :class:`Phase1` as one query."""
    o, _, _ = phase1(q[None], None if bias is None else bias[None], values, inv, valid, scope)
    return o[0]


def rebuild(updates: Sequence[Tensor], coefs: int | Tensor, kinds: Sequence[int],
            n_kinds: int = 0) -> tuple[Tensor, list[Tensor]]:
    """P and the raw details of ``kinds`` from the block's updates, by the forward's own sums
    (:func:`routers.block.state.accumulate`: P = u_0, D = ±u_0, then P + u, D ± u), so bit for bit the same.

    Args:
        updates: u_0 … u_{p−1} oldest first, each (B, T, d); under the layer scope led by zero pads
            (0 + x = x exactly, so the pads change no bit).
        coefs: the updates' coefficients in every detail kind: a Python int of bits
            (:func:`routers.block.plan.coefficient_bits` over ``n_kinds`` kinds; Python constants,
            so D ± u with no multiply), or a (p, K) tensor of ±1 (0 for a pad) under the layer
            scope, which adds c·u (D ± u exactly).
        kinds: the detail kinds to rebuild (detail indices).
        n_kinds: K, the detail kinds per update of ``coefs`` given as bits.
    """
    if isinstance(coefs, Tensor):
        P, D = updates[0], [coefs[0, j] * updates[0] for j in kinds]
        for i, u in enumerate(updates[1:], start=1):
            P, D = P + u, [d + coefs[i, j] * u for d, j in zip(D, kinds)]
        return P, D
    P = updates[0]
    D = [updates[0] if coefficient(coefs, n_kinds, 0, j) > 0 else -updates[0] for j in kinds]
    for i, u in enumerate(updates[1:], start=1):
        P = P + u
        D = [d + u if coefficient(coefs, n_kinds, i, j) > 0 else d - u for d, j in zip(D, kinds)]
    return P, D


class Phase2(torch.autograd.Function):
    """Phase 2 of one read at block position p ≥ 1 (:func:`routers.block.phases.merge`).

    ``apply(k_lo, k_hi, n_kinds, bits, scope, o, μ, s, q, bias, c, coef_t, P, *details, *updates)``
    (plain ints, never a tuple: some torch versions' Dynamo misbind a tuple argument of
    ``apply``), with the seen detail kinds ``range(k_lo, k_hi)`` of ``n_kinds``, and ``bits`` the
    updates' coefficients (:func:`rebuild`; ignored when ``coef_t`` is given): o (B, T, d), μ and s (B, T) of phase 1 for this read, q (d,), bias (K',) of the seen
    details or None, c (K', B, T) their detached RMS-matching gains (not differentiable) or None,
    coef_t the updates' coefficients as a (p, K) tensor (the layer scope; ``coefs`` is then None)
    or None, P and the K' raw details (B, T, d) seen, then the block's updates u_0 … u_{p−1} (kept
    to rebuild P and the details in the backward; ``kinds`` and ``coefs`` or ``coef_t`` say how,
    :func:`rebuild`).

    Returns h (B, T, d). Keeps the updates, h, s, q, bias, c, the softmax weights of
    (o, P, details) (2 + K', B, T), and per source S = P, c·D the dot q·S/c and its inverse RMS
    factor ρ = rsqrt(c²·mean(D²) + ε) (2·(1 + K'), B, T); it rebuilds P and the details only. Backward, with every weight w: gℓ_j = w_j(g·S_j − g·h) for
    S_j = P, c·D; ∂/∂o = w_o·g; ∂/∂s = −Σ_j gℓ_j / s (softmax's gradient sums to zero over its
    logits, so o need not be kept); ∂/∂P = w_P g + gℓ_P(r q − (q·P) r³ P/d) with r = rsqrt(mean P² + ε),
    likewise for c·D; ∂/∂q, ∂/∂bias sum those over tokens.
    """

    @staticmethod
    def forward(ctx, k_lo: int, k_hi: int, n_kinds: int, bits: int, scope: Scope, o: Tensor, mx: Tensor, s: Tensor,
                q: Tensor, bias: Tensor | None, c: Tensor | None, coef_t: Tensor | None, P: Tensor,
                *tensors: Tensor) -> Tensor:
        kinds = range(k_lo, k_hi)
        details, updates = tensors[:len(kinds)], tensors[len(kinds):]
        d, acc = P.shape[-1], mx.dtype
        # per source S = P, c·D: its dot t = q·S... (c folded in below) and ρ = rsqrt(c²·mean(S²) + ε)
        t = torch.stack([torch.matmul(x, q).to(acc) for x in (P, *details)])            # (1 + K', B, T)
        ms = torch.stack([torch.linalg.vector_norm(x, dim=-1, dtype=acc).square() / d for x in (P, *details)])
        rho = torch.rsqrt(ms + EPS) if not details else torch.rsqrt(
            torch.cat((ms[:1], c.square() * ms[1:])) + EPS)
        logits = t * rho if not details else torch.cat((t[:1] * rho[:1], c * t[1:] * rho[1:]))
        if bias is not None:
            logits = torch.cat((logits[:1], logits[1:] + bias.view(-1, 1, 1).to(acc)))
        # (2 + K', B, T): o (its logit phase 1's log-sum-exp μ + log s), P, details
        w = torch.softmax(torch.cat(((mx + torch.log(s)).unsqueeze(0), logits)), dim=0)
        if not details:
            h = torch.lerp(P, o, w[0].to(o.dtype).unsqueeze(-1))
        else:
            h = w[0].to(o.dtype).unsqueeze(-1) * o
            h = torch.addcmul(h, w[1].to(o.dtype).unsqueeze(-1), P)
            for j, D in enumerate(details):
                h = torch.addcmul(h, (w[2 + j] * c[j]).to(o.dtype).unsqueeze(-1), D)
        ctx.kinds, ctx.n_kinds, ctx.bits, ctx.scope, ctx.autocast = kinds, n_kinds, bits, scope, _autocast_state(q)
        ctx.save_for_backward(h, s, q, bias, c, coef_t, w, t, rho, *updates)
        return h

    @staticmethod
    def backward(ctx, g: Tensor):
        with _autocast(ctx.autocast):
            return Phase2._backward(ctx, g)

    @staticmethod
    def _backward(ctx, g: Tensor):
        kinds = ctx.kinds
        h, s, q, bias, c, coef_t, w, ts, rhos, *updates = ctx.saved_tensors
        acc, d = w.dtype, h.shape[-1]
        with recomputing(ctx.scope):
            P, details = rebuild(updates, ctx.bits if coef_t is None else coef_t, kinds, ctx.n_kinds)
        srcs = [P] + details
        gains = [None] + [c[j] for j in range(len(kinds))]
        gh = _dot(g, h, acc)
        g_l = []
        for j, (S, cj) in enumerate(zip(srcs, gains)):
            gs = _dot(g, S, acc)
            g_l.append(w[1 + j] * ((gs if cj is None else cj * gs) - gh))
        g_o = (w[0].to(g.dtype).unsqueeze(-1) * g) if ctx.needs_input_grad[5] else None
        g_s = -torch.stack(g_l).sum(dim=0) / s
        grads, g_q = [], torch.zeros_like(q, dtype=acc)
        for j, (S, cj, t, rho, gl) in enumerate(zip(srcs, gains, ts, rhos, g_l)):
            # ℓ = c·t·ρ with t = q·S, ρ = rsqrt(c²·mean(S²) + ε) (c = 1 for P):
            # ∂ℓ/∂q = cρ·S, ∂ℓ/∂S = cρ·q − c³tρ³·S/d; the value path adds w·c·g
            k_q = gl * rho if cj is None else gl * cj * rho
            k_s = -k_q * t * rho.square() / d if cj is None else -k_q * cj.square() * t * rho.square() / d
            val = w[1 + j] if cj is None else w[1 + j] * cj
            grad = val.to(g.dtype).unsqueeze(-1) * g                  # a fresh tensor: in place below
            grad.addcmul_(k_q.to(g.dtype).unsqueeze(-1), q.to(g.dtype)).addcmul_(k_s.to(g.dtype).unsqueeze(-1), S)
            grads.append(grad)
            g_q = g_q + torch.einsum("bt,btd->d", k_q, S.to(acc))
        g_b = torch.stack([gl.sum() for gl in g_l[1:]]).to(bias.dtype) if bias is not None else None
        return (None, None, None, None, None, g_o, None, g_s, g_q.to(q.dtype), g_b, None, None, grads[0], *grads[1:],
                *(None for _ in updates))


def gains(P: Tensor, details: Sequence[Tensor], max_detail_scale: float) -> Tensor | None:
    """c = min(ρ, rms(P)/(rms(D) + ε)) of each detail (K', B, T), detached, in the softmax dtype
    (:func:`routers.block.phases.merge`'s gain), or None without details."""
    if not details:
        return None
    acc, d = softmax_dtype(P.dtype), P.shape[-1]
    with torch.no_grad():
        rp = (torch.linalg.vector_norm(P, dim=-1, dtype=acc).square() / d).sqrt()
        return torch.stack([torch.clamp(rp / ((torch.linalg.vector_norm(D, dim=-1, dtype=acc).square() / d).sqrt() + EPS),
                                        max=max_detail_scale) for D in details])


def merge(o: Tensor, mx: Tensor, s: Tensor, q: Tensor, P: Tensor, details: list[Tensor],
          bias: Tensor | None, max_detail_scale: float, updates: Sequence[Tensor],
          coefs: int | Tensor, kinds: slice, n_kinds: int = 0, scope: Scope = None) -> Tensor:
    """:func:`routers.block.phases.merge` through :class:`Phase2`; ``bias`` (K',) of the seen details
    as there; ``updates`` oldest first and ``coefs`` (bits of ``n_kinds`` kinds, or a tensor) as
    :func:`rebuild` takes them, and ``kinds`` the seen detail kinds as a slice."""
    c = gains(P, details, max_detail_scale)
    b = None if bias is None or not details else bias
    o, P, *rest = distinct([o, P, *details, *updates])
    details, updates = rest[:len(details)], rest[len(details):]
    if isinstance(coefs, Tensor):
        return Phase2.apply(kinds.start, kinds.stop, n_kinds, 0, scope, o, mx, s, q, b, c, coefs, P, *details,
                            *updates)
    return Phase2.apply(kinds.start, kinds.stop, n_kinds, coefs, scope, o, mx, s, q, b, c, None, P, *details, *updates)


#: ``lean``: the two-phase schedule through the Functions above.
LEAN = Phases(inv_rms, phase1, merge, readout, keeps_updates=True)

IMPL = Impl("lean", ("block_attnres", "haares", "wav_v1"), "two_phase", phases=LEAN, backward="recompute",
            conventions=BUILTIN_NOTE + ": the two-phase schedule with a backward that keeps each source once "
            "and a few float32 statistics per token (routers/block/lean.py)", builtin=True, no_layer_scope=None,
            state=StateModel(phase1=True, keeps_updates=True, first_output_apart=True), against="two_phase",
            compile_weight=1.8, line=":", marker="D")
