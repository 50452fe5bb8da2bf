"""Two-phase computation of the block routers (Attention Residuals, arXiv:2603.15031, the
inference schedule of Block AttnRes; used here for training too).

The pseudo-queries are parameters, not activations, so when a block starts all m queries of its
sublayers are known and the completed sources cannot change until the block ends:

- **Phase 1** (once per block, in the ``write`` that completes the previous block): one batched
  pass of the block's m pseudo-queries over the completed sources (e, C_1, D̃_1…, …), returning per
  query the normalised partial output ``o`` (m, B, T, d), the running max ``μ`` and the sum of
  exponentials ``s`` (each (m, B, T), float32 whatever the tensor dtype). A key is never
  materialised: w·RMSNorm(V) = (w·V)·rsqrt(mean(V²) + ε), so each completed source caches only its
  inverse RMS, (B, T), computed once when it enters the pool.
- **Phase 2** (per sublayer at position p ≥ 1): the partial-block sources (P and its visible
  details) are merged into phase 1's result by online softmax:

      M = max(μ_p, max_j ℓ_j),  a_0 = s_p·exp(μ_p − M),  a_j = exp(ℓ_j − M)
      h = (a_0·o_p + Σ_j a_j S_j) / (a_0 + Σ_j a_j)

  At p = 0 the read is ``o_0`` itself. The weights sum to one, so with a single partial source
  (Block AttnRes) the merge is one ``lerp``: h = P + a_0/(a_0 + a_1)·(o_p − P).

A key-norm gain g folds into the query: w·RMSNorm_g(V) = (g ⊙ w)·RMSNorm(V), so the cached
inverse RMS needs no gain. The maxima are detached: softmax is invariant to the shift, so its gradient is zero.
The result equals the naive reference (``routers.mixer.depth_mix``) to float rounding, forward and
backward (tests/test_two_phase.py).
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

import torch
from torch import Tensor, nn

from . import lean
from .base import Slot
from .mixer import EPS, softmax_dtype


class BlockRouter(Protocol):
    """What the two-phase schedule reads of a block router (``routers.attnres.BlockAttnRes`` and
    its subclasses); a protocol, so this module does not import the routers that import it."""

    slots: tuple[Slot, ...]
    n_layers: int
    n_blocks: int
    pseudo_query: nn.Parameter
    key_gain: nn.Parameter | None
    detail_bias: nn.Parameter | None
    detail_kinds: tuple[str, ...]
    readout_details: bool
    max_detail_scale: float  # multi-resolution routers only

    def _match(self, detail: Tensor, state: Tensor) -> Tensor: ...
    def _partial_kinds(self, slot: Slot) -> tuple[int, ...]: ...


class TwoPhaseState(NamedTuple):
    """Router state of the ``two_phase`` implementation.

    Attributes:
        values: completed sources in pool order, the embedding first: (e, C_1, D̃_1…, C_2, …).
        inv_rms: their inverse RMS ``rsqrt(mean(V²) + ε)``, each (B, T), in the softmax dtype.
        partial: P of the current block, or None at a block start.
        partial_details: running raw detail sums of the current block.
        block_out: phase-1 outputs of the current block's queries, (m, B, T, d).
        block_max: phase-1 running max per query, (m, B, T), float32 (or float64).
        block_sum: phase-1 sum of exponentials per query, (m, B, T).
    """

    values: tuple[Tensor, ...]
    inv_rms: tuple[Tensor, ...]
    partial: Tensor | None
    partial_details: tuple[Tensor, ...]
    block_out: Tensor | None
    block_max: Tensor | None
    block_sum: Tensor | None
    #: the current block's sublayer outputs u_0 … u_{p−1}, kept by the ``lean`` impl only (its
    #: backward rebuilds P and the details from them, ``routers/lean.py``); () otherwise.
    updates: tuple[Tensor, ...] = ()


def inv_rms(v: Tensor) -> Tensor:
    """``rsqrt(mean(v²) + ε)`` over d, (B, T), in the softmax dtype (one read of v)."""
    acc = softmax_dtype(v.dtype)
    ms = torch.linalg.vector_norm(v, dim=-1, dtype=acc).square() / v.shape[-1]
    return torch.rsqrt(ms + EPS)


def queries(r: BlockRouter, reads: list[int]) -> Tensor:
    """Pseudo-queries of the given reads with any key gain folded in, (m, d)."""
    q = r.pseudo_query[reads]
    return q if r.key_gain is None else q * r.key_gain[reads]


def bias_matrix(r: BlockRouter, reads: list[int], kinds: tuple[int | None, ...]) -> Tensor | None:
    """Logit bias (m, n) of each read over sources of the given kinds (None = state source)."""
    if all(k is None for k in kinds) or not r.detail_kinds:
        return None
    rows = r.detail_bias[reads]                                   # (m, n_kinds)
    table = torch.cat((rows.new_zeros(len(reads), 1), rows), dim=1)
    return table[:, [0 if k is None else k + 1 for k in kinds]]


def phase1(r: BlockRouter, values: tuple[Tensor, ...], inv: tuple[Tensor, ...],
           block_slots: list[Slot], kinds: tuple[int | None, ...]) -> tuple[Tensor, Tensor, Tensor]:
    """All m queries of a block against the n completed sources in one batched pass.

    Returns:
        o (m, B, T, d) normalised partial outputs, μ (m, B, T) maxima, s (m, B, T) sums of exps.
    """
    reads = [s.index for s in block_slots]
    V = torch.stack(values)                                       # (n, B, T, d)
    dots = torch.einsum("md,nbtd->mbtn", queries(r, reads), V)    # (m, B, T, n)
    logits = dots.to(softmax_dtype(V.dtype)) * torch.stack(inv, dim=-1)
    bias = bias_matrix(r, reads, kinds)
    if bias is not None:
        logits = logits + bias[:, None, None, :]
    mx = logits.amax(dim=-1).detach()
    p = torch.exp(logits - mx.unsqueeze(-1))
    s = p.sum(dim=-1)
    o = torch.einsum("mbtn,nbtd->mbtd", (p / s.unsqueeze(-1)).to(V.dtype), V)
    return o, mx, s


def phase2(r: BlockRouter, st: TwoPhaseState, slot: Slot) -> Tensor:
    """Online-softmax merge of the partial-block sources into phase 1's result for ``slot``
    (:func:`merge` of P and the details the slot sees)."""
    seen = r._partial_kinds(slot)
    bias = bias_matrix(r, [slot.index], (None,) + tuple(seen))
    return merge(st.block_out[slot.pos], st.block_max[slot.pos], st.block_sum[slot.pos],
                 queries(r, [slot.index])[0], st.partial, [st.partial_details[j] for j in seen],
                 None if bias is None else bias[0], getattr(r, "max_detail_scale", 1.0))


def merge(o: Tensor, mx: Tensor, s: Tensor, q: Tensor, P: Tensor, details: list[Tensor],
          bias: Tensor | None, max_detail_scale: float) -> Tensor:
    """Phase 2 of one read: merge P and its visible details into phase 1's result.

    The partial sources are P and its visible details D̃ = c·D with the detached RMS-matching
    gain c = min(ρ, rms(P)/(rms(D) + ε)) (``routers.mixer.rms_match``). D̃ is never materialised:
    its logit is c·(w·D)·rsqrt(c²·mean(D²) + ε) and it enters the sum as (weight·c)·D.

    Args:
        o, mx, s: phase 1's output (B, T, d), running max and sum of exponentials (B, T) for the read.
        q: the read's query (d,), key gain folded in.
        P: the block's partial sum (B, T, d); details: the raw running details it sees.
        bias: logit bias (1 + len(details),) over (P, details…), or None.
        max_detail_scale: ρ.

    Returns:
        h (B, T, d) in the dtype of ``o``.
    """
    d, acc = P.shape[-1], mx.dtype
    ms_p = torch.linalg.vector_norm(P, dim=-1, dtype=acc).square() / d          # (B, T)
    logits, values, gains = [torch.matmul(P, q).to(acc) * torch.rsqrt(ms_p + EPS)], [P], [None]
    for D in details:
        ms_d = torch.linalg.vector_norm(D, dim=-1, dtype=acc).square() / d
        with torch.no_grad():
            c = torch.clamp(ms_p.sqrt() / (ms_d.sqrt() + EPS), max=max_detail_scale)
        logits.append(c * torch.matmul(D, q).to(acc) * torch.rsqrt(c.square() * ms_d + EPS))
        values.append(D)
        gains.append(c)
    logits = torch.stack(logits)                                                  # (J, B, T)
    if bias is not None:
        logits = logits + bias.view(-1, 1, 1)
    m_new = torch.maximum(mx, logits.amax(dim=0)).detach()
    a0 = s * torch.exp(mx - m_new)
    aj = torch.exp(logits - m_new)
    den = a0 + aj.sum(dim=0)
    w0 = (a0 / den).to(o.dtype).unsqueeze(-1)                                     # (B, T, 1)
    if len(values) == 1:                                                          # weights sum to 1
        return torch.lerp(P, o, w0)
    out = w0 * o
    for a, v, c in zip(aj, values, gains):
        w = a / den if c is None else a * c / den
        out = torch.addcmul(out, w.to(o.dtype).unsqueeze(-1), v)
    return out


def lean_phase1(r: BlockRouter, values: tuple[Tensor, ...], inv: tuple[Tensor, ...],
                block_slots: list[Slot], kinds: tuple[int | None, ...]) -> tuple[tuple[Tensor, ...], Tensor, Tensor]:
    """:func:`phase1` through ``lean``'s Function (:func:`routers.lean.mix`): o is a tuple of m
    (B, T, d), the source itself when e is the only one."""
    reads = [s.index for s in block_slots]
    return lean.mix(queries(r, reads), bias_matrix(r, reads, kinds), values, inv)


def lean_phase2(r: BlockRouter, st: TwoPhaseState, slot: Slot) -> Tensor:
    """:func:`phase2` through ``lean``'s Function (:func:`routers.lean.merge`), which rebuilds P
    and the details from ``st.updates`` in its backward."""
    seen = r._partial_kinds(slot)
    bias = bias_matrix(r, [slot.index], (None,) + tuple(seen))
    coefs = [r._coefficients(x) for x in r.slots if x.block == slot.block and x.pos < slot.pos]
    return lean.merge(st.block_out[slot.pos], st.block_max[slot.pos], st.block_sum[slot.pos],
                      queries(r, [slot.index])[0], st.partial, [st.partial_details[j] for j in seen],
                      None if bias is None else bias[0], getattr(r, "max_detail_scale", 1.0),
                      st.updates, coefs, seen)


def _phases(r: BlockRouter) -> tuple:
    """The router's phases: ``lean``'s (:func:`lean_phase1`, :func:`lean_phase2`), a peer
    kernel's (``routers/impls.py``) or :func:`phase1`, :func:`phase2`."""
    if getattr(r, "lean", False):
        return lean_phase1, lean_phase2
    return getattr(r, "peer_phases", None) or (phase1, phase2)


def _inv_rms(r: BlockRouter, v: Tensor) -> Tensor:
    """:func:`inv_rms`, through ``lean``'s Function when the router runs that impl."""
    return lean.inv_rms(v) if getattr(r, "lean", False) else inv_rms(v)


def completed_kinds(r: BlockRouter, n_blocks_done: int) -> tuple[int | None, ...]:
    """Kinds of ``values``: the embedding, then per block C and its details."""
    return (None,) + ((None,) + tuple(range(len(r.detail_kinds)))) * n_blocks_done


def block_slots(r: BlockRouter, block: int) -> list[Slot]:
    return [s for s in r.slots if s.block == block]


def init_state(r: BlockRouter, e: Tensor) -> TwoPhaseState:
    values, inv = (e,), (_inv_rms(r, e),)
    o, mx, s = _phases(r)[0](r, values, inv, block_slots(r, 1), completed_kinds(r, 0))
    return TwoPhaseState(values, inv, None, (), o, mx, s)


def read(r: BlockRouter, st: TwoPhaseState, slot: Slot) -> Tensor:
    if slot.pos == 0:
        return st.block_out[0]
    return _phases(r)[1](r, st, slot)


def write(r: BlockRouter, st: TwoPhaseState, slot: Slot, partial: Tensor,
          details: tuple[Tensor, ...], update: Tensor | None = None) -> TwoPhaseState:
    """New state once the block's running sums (P, raw details) include this slot's ``update``
    (kept in ``updates`` by the ``lean`` impl)."""
    if not slot.last_in_block:
        kept = st.updates + (update,) if getattr(r, "lean", False) else ()
        return st._replace(partial=partial, partial_details=details, updates=kept)
    final = slot.index == len(r.slots) - 1
    matched = () if final and not r.readout_details else tuple(r._match(d, partial) for d in details)
    new = (partial,) + matched
    values, inv = st.values + new, st.inv_rms + tuple(_inv_rms(r, v) for v in new)
    if final:
        return TwoPhaseState(values, inv, None, (), None, None, None)
    o, mx, s = _phases(r)[0](r, values, inv, block_slots(r, slot.block + 1), completed_kinds(r, slot.block))
    return TwoPhaseState(values, inv, None, (), o, mx, s)


def output(r: BlockRouter, st: TwoPhaseState) -> Tensor:
    """Readout over (e, C_1…C_N) (+ details with ``readout_details``) with the cached inverse RMS."""
    if r.readout_details:
        kinds = completed_kinds(r, r.n_blocks)
    else:  # the last block's details were never built (see write)
        kinds = completed_kinds(r, r.n_blocks - 1) + (None,)
    keep = [i for i, k in enumerate(kinds) if r.readout_details or k is None]
    if len(keep) == 1:
        return st.values[0]
    read = 2 * r.n_layers
    if getattr(r, "lean", False):
        bias = bias_matrix(r, [read], tuple(kinds[i] for i in keep))
        o, _, _ = lean.mix(queries(r, [read]), bias, [st.values[i] for i in keep], [st.inv_rms[i] for i in keep])
        return o[0]
    V = torch.stack([st.values[i] for i in keep])
    dots = torch.matmul(V, queries(r, [read])[0])                  # (n, B, T)
    logits = dots.to(softmax_dtype(V.dtype)) * torch.stack([st.inv_rms[i] for i in keep])
    bias = bias_matrix(r, [read], tuple(kinds[i] for i in keep))
    if bias is not None:
        logits = logits + bias[0].view(-1, 1, 1)
    alpha = torch.softmax(logits, dim=0).to(V.dtype)
    return torch.einsum("nbt,nbtd->btd", alpha, V)
