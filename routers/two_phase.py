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

      λ_p = μ_p + log s_p  (phase 1's log-sum-exp),  (w_o, w_j) = softmax(λ_p, ℓ_j)
      h = w_o·o_p + Σ_j w_j S_j

  which is the online-softmax merge M = max(μ_p, ℓ_j), a_0 = s_p·exp(μ_p − M), a_j = exp(ℓ_j − M),
  h = (a_0·o_p + Σ_j a_j S_j)/(a_0 + Σ_j a_j), in one softmax op. At p = 0 the read is ``o_0``
  itself. With a single partial source (Block AttnRes) w_o = sigmoid(λ_p − ℓ_P) and the merge is
  one ``lerp``: h = P + w_o·(o_p − P).

A key-norm gain g folds into the query: w·RMSNorm_g(V) = (g ⊙ w)·RMSNorm(V), so the cached
inverse RMS needs no gain. The maxima are detached: softmax is invariant to the shift, so its gradient is zero.
The result equals the naive reference (``routers.mixer.depth_mix``) to float rounding, forward and
backward (tests/test_two_phase.py).
"""

from __future__ import annotations

from typing import ContextManager, NamedTuple, Protocol

import torch
from torch import Tensor, nn

from . import block_plan, lean
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
    plan: block_plan.BlockPlan
    plan_codes: Tensor

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


def exact_matmul(t: Tensor) -> ContextManager:
    """Phase 1's contractions in the sources' own dtype, also inside an autocast region: the
    schedule takes its dots in the input dtype (ROUTERS.md, "Precision"), which an einsum kept
    (autocast does not reach inside it) and a plain ``matmul`` would cast to the autocast dtype."""
    return torch.autocast(t.device.type, enabled=False)


def queries(r: BlockRouter, rows: int | slice) -> Tensor:
    """Pseudo-queries of read ``rows`` (an int: (d,); a slice of consecutive reads: (m, d)) with
    any key gain folded in. A slice is a view: no op, no host data."""
    q = r.pseudo_query[rows]
    return q if r.key_gain is None else q * r.key_gain[rows]


def bias_matrix(r: BlockRouter, block: int) -> Tensor | None:
    """Logit bias (m, n) of block ``block``'s m reads over the n completed sources of its phase 1
    (``plan.completed[block]``), or None when none is a detail."""
    codes = r.plan.phase1_codes[block]
    if codes is None:
        return None
    return block_plan.code_bias(r.detail_bias[r.plan.rows[block]], r.plan_codes[codes])


def seen_bias(r: BlockRouter, slot: Slot) -> Tensor | None:
    """Logit bias (K',) of the partial details the read at ``slot`` sees, or None."""
    seen = r.plan.seen_span[slot.index]
    return None if seen.stop == seen.start else r.detail_bias[slot.index, seen]


def phase1(r: BlockRouter, values: tuple[Tensor, ...], inv: tuple[Tensor, ...],
           block: int) -> tuple[Tensor, Tensor, Tensor]:
    """All m queries of block ``block`` against the n completed sources in one batched pass.

    Returns:
        o (m, B, T, d) normalised partial outputs, μ (m, B, T) maxima, s (m, B, T) sums of exps.
    """
    V = torch.stack(values, dim=2)                                # (B, T, n, d)
    with exact_matmul(V):
        dots = torch.matmul(V, queries(r, r.plan.rows[block]).t())    # (B, T, n, m)
    logits = dots.to(softmax_dtype(V.dtype)) * torch.stack(inv, dim=-1).unsqueeze(-1)
    bias = bias_matrix(r, block)
    if bias is not None:
        logits = logits + bias.t()
    mx = logits.amax(dim=2, keepdim=True).detach()                # (B, T, 1, m)
    p = torch.exp(logits - mx)
    s = p.sum(dim=2, keepdim=True)
    with exact_matmul(V):
        o = torch.matmul((p / s).to(V.dtype).mT, V)              # (B, T, m, d)
    return o.movedim(2, 0), mx.squeeze(2).movedim(-1, 0), s.squeeze(2).movedim(-1, 0)


def phase2(r: BlockRouter, st: TwoPhaseState, slot: Slot) -> Tensor:
    """Online-softmax merge of the partial-block sources into phase 1's result for ``slot``
    (:func:`merge` of P and the details the slot sees)."""
    seen = r.plan.seen_span[slot.index]
    return merge(st.block_out[slot.pos], st.block_max[slot.pos], st.block_sum[slot.pos],
                 queries(r, slot.index), st.partial, list(st.partial_details[seen]),
                 seen_bias(r, slot), getattr(r, "max_detail_scale", 1.0))


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
        bias: logit bias (len(details),) of the details, or None (P's is 0).
        max_detail_scale: ρ.

    Returns:
        h (B, T, d) in the dtype of ``o``.
    """
    d, acc = P.shape[-1], mx.dtype
    ms_p = torch.linalg.vector_norm(P, dim=-1, dtype=acc).square() / d          # (B, T)
    logit_p = torch.matmul(P, q).to(acc) * torch.rsqrt(ms_p + EPS)
    lse = mx + torch.log(s)                   # phase 1's log-sum-exp: o's logit in the merge
    if not details:  # two sources: the weight of o is a sigmoid (what flash-attn-res merges)
        w0 = torch.sigmoid(lse - logit_p)
        return torch.lerp(P, o, w0.to(o.dtype).unsqueeze(-1))
    logits, gains = [lse, logit_p], []
    for D in details:
        ms_d = torch.linalg.vector_norm(D, dim=-1, dtype=acc).square() / d
        with torch.no_grad():
            c = torch.clamp(ms_p.sqrt() / (ms_d.sqrt() + EPS), max=max_detail_scale)
        logits.append(c * torch.matmul(D, q).to(acc) * torch.rsqrt(c.square() * ms_d + EPS))
        gains.append(c)
    logits = torch.stack(logits)                                                  # (2 + K', B, T)
    if bias is not None:
        logits = torch.cat((logits[:2], logits[2:] + bias.view(-1, 1, 1)))
    w = torch.softmax(logits, dim=0)          # over (o, P, details): the online merge in one op
    out = torch.addcmul(w[0].to(o.dtype).unsqueeze(-1) * o, w[1].to(o.dtype).unsqueeze(-1), P)
    for wj, c, D in zip(w[2:], gains, details):
        out = torch.addcmul(out, (wj * c).to(o.dtype).unsqueeze(-1), D)
    return out


def lean_phase1(r: BlockRouter, values: tuple[Tensor, ...], inv: tuple[Tensor, ...],
                block: int) -> tuple[tuple[Tensor, ...], Tensor, Tensor]:
    """:func:`phase1` through ``lean``'s Function (:func:`routers.lean.mix`): o is a tuple of m
    (B, T, d), the source itself when e is the only one."""
    return lean.mix(queries(r, r.plan.rows[block]), bias_matrix(r, block), values, inv)


def lean_phase2(r: BlockRouter, st: TwoPhaseState, slot: Slot) -> Tensor:
    """:func:`phase2` through ``lean``'s Function (:func:`routers.lean.merge`), which rebuilds P
    and the details from ``st.updates`` in its backward (their coefficients: ``plan.coef_bits``)."""
    seen = r.plan.seen_span[slot.index]
    return lean.merge(st.block_out[slot.pos], st.block_max[slot.pos], st.block_sum[slot.pos],
                      queries(r, slot.index), st.partial, list(st.partial_details[seen]),
                      seen_bias(r, slot), getattr(r, "max_detail_scale", 1.0),
                      st.updates, r.plan.coef_bits[slot.index], seen, r.plan.K)


def _phases(r: BlockRouter) -> tuple:
    """The router's phases: ``lean``'s (:func:`lean_phase1`, :func:`lean_phase2`), a peer
    kernel's (``routers/impls.py``) or :func:`phase1`, :func:`phase2`."""
    if getattr(r, "lean", False):
        return lean_phase1, lean_phase2
    return getattr(r, "peer_phases", None) or (phase1, phase2)


def _inv_rms(r: BlockRouter, v: Tensor) -> Tensor:
    """:func:`inv_rms`, through ``lean``'s Function when the router runs that impl."""
    return lean.inv_rms(v) if getattr(r, "lean", False) else inv_rms(v)


def init_state(r: BlockRouter, e: Tensor) -> TwoPhaseState:
    values, inv = (e,), (_inv_rms(r, e),)
    o, mx, s = _phases(r)[0](r, values, inv, 1)
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
    o, mx, s = _phases(r)[0](r, values, inv, slot.block + 1)
    return TwoPhaseState(values, inv, None, (), o, mx, s)


def output(r: BlockRouter, st: TwoPhaseState) -> Tensor:
    """Readout over (e, C_1…C_N) (+ details with ``readout_details``) with the cached inverse RMS."""
    keep = r.plan.readout_keep
    if len(keep) == 1:
        return st.values[0]
    read = 2 * r.n_layers
    codes = r.plan.readout_codes
    bias = None if codes is None else block_plan.code_bias(r.detail_bias[read], r.plan_codes[codes])
    if getattr(r, "lean", False):
        o, _, _ = lean.mix(queries(r, slice(read, read + 1)), None if bias is None else bias[None],
                           [st.values[i] for i in keep], [st.inv_rms[i] for i in keep])
        return o[0]
    V = torch.stack([st.values[i] for i in keep])
    dots = torch.matmul(V, queries(r, read))                       # (n, B, T)
    logits = dots.to(softmax_dtype(V.dtype)) * torch.stack([st.inv_rms[i] for i in keep])
    if bias is not None:
        logits = logits + bias.view(-1, 1, 1)
    alpha = torch.softmax(logits, dim=0).to(V.dtype)
    return torch.einsum("nbt,nbtd->btd", alpha, V)
