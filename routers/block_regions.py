"""The block routers under the layer compile scope (Router's region methods; DESIGN.md, "Backends
and modes"): every slot's read and write as a region whose graph depends only on the slot's role,
never on its index.

Roles: the sublayer kind, whether the slot starts its block (its read has no partial sources),
ends it (its write completes the block), or ends the last block, and which partial details it
sees. Everything else that varies per slot is a tensor of ``region_params``: its pseudo-query row
(the key gain folded in, as :func:`routers.two_phase.queries` does), its detail-bias row, its
detail coefficients c (±1 per kind; a write adds c·u to each detail, which is D ± u exactly), and
under ``two_phase`` the rows of phase 1's outputs at its position and the next block's queries.

- ``naive`` stays tuple-based: the pool grows by one block at a time, so its roles also carry the
  block number (a block router with N blocks has at most 4·N sublayer roles). It computes what
  :meth:`BlockAttnRes.read` computes, op for op.
- ``two_phase`` keeps its completed sources in a tuple of fixed length ``1 + N·(1+K)``, newest
  first (:class:`PaddedState`): a completed block's sources go in front and the last pads drop off,
  so no index depends on the block; pads are views of one zero tensor per forward, masked out of
  every softmax by a −inf logit; the kinds repeat with period 1 + K (C, then its K details; e sits
  where a C would), so the detail-bias pattern does not depend on the block either. Each source
  stays its own tensor (one storage), which a backward that saves each source once needs. Cost of
  the masked slots: each phase 1 mixes over all ``1 + N(1+K)`` slots instead of the completed ones,
  and the last block's details, which nothing reads, are pads rather than skipped
  (:func:`masked_phase1_flops`); the pads add one (B, T, d) zero tensor and one (B, T) zero to the
  live state (:meth:`BlockAttnRes.live_state_bytes` with ``layout="padded"``).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from . import block_plan, lean, two_phase
from .base import Slot
from .mixer import depth_mix, softmax_dtype


class PaddedState(NamedTuple):
    """Region state of ``two_phase`` under the layer scope.

    Attributes:
        values: ``1 + N(1+K)`` sources, newest first: ``C_b, D̃_b…, …, C_1, D̃_1…, e``, then pads.
        inv_rms: their inverse RMS (B, T) in the softmax dtype (0 for a pad).
        valid: (``1 + N(1+K)``,) bool, True for a source, False for a pad.
        partial, partial_details: P and the raw running details of the current block.
        block_out, block_max, block_sum: phase 1 of the current block, as
            :class:`routers.two_phase.TwoPhaseState`.
        updates: ``lean`` only (else ()): a register of the block's length − 1, newest first, of the
            block's sublayer outputs so far, then pads (views of ``zero``), so its length does not
            depend on the position; ``update_coefs`` (block length − 1, K): each one's detail
            coefficients (0 for a pad); ``zero``: the zero tensor the pads are views of.
    """

    values: tuple[Tensor, ...]
    inv_rms: tuple[Tensor, ...]
    valid: Tensor
    partial: Tensor | None
    partial_details: tuple[Tensor, ...]
    block_out: Tensor | None
    block_max: Tensor | None
    block_sum: Tensor | None
    updates: tuple[Tensor, ...] = ()
    update_coefs: Tensor | None = None
    zero: Tensor | None = None


def capacity(r) -> int:
    """Slots of the padded pool: e and every block's C and K details."""
    return 1 + r.n_blocks * (1 + len(r.detail_kinds))


def coefficient_table(r) -> Tensor:
    """(2L, K) float32: c of each slot's update in each detail kind (``r._coefficients``)."""
    return torch.tensor([list(r._coefficients(s)) for s in r.slots], dtype=torch.float32).reshape(
        len(r.slots), len(r.detail_kinds))


def slot_role(r, slot: Slot) -> tuple:
    """The slot's role (module doc). Returns a tuple of Python constants."""
    final = slot.index == len(r.slots) - 1
    nxt = r.slots[slot.index + 1].block_len if slot.last_in_block and not final else 0
    base = (r.schedule, slot.kind, slot.pos == 0, slot.last_in_block, final, r._partial_kinds(slot))
    if r.schedule == "two_phase":
        return base + (slot.block_len, nxt)
    return base + (slot.block,)


def slot_params(r, state, slot: Slot) -> tuple:
    """(query (d,), key gain (d,) or None, detail-bias row (K,) or None, coefficients (K,),
    *schedule's own): naive adds its pool's kind codes (or None); two_phase the rows of phase 1's
    outputs at the slot's position and, at a block end, the next block's queries and bias rows.
    Ints and slices of the static plan only: no host data."""
    k = slot.index
    two = r.schedule == "two_phase"
    q = two_phase.queries(r, k) if two or r.key_gain is None else r.pseudo_query[k]
    gain = r.key_gain[k] if r.key_gain is not None and not two else None
    bias = r.detail_bias[k] if r.detail_kinds else None
    coefs = r.region_coefs[k].to((state.values[0] if isinstance(state, PaddedState) else state.e).dtype)
    if not two:
        codes = r.plan.read_codes[k]
        return q, gain, bias, coefs, None if codes is None else r.plan_codes[codes]
    rows = (state.block_out[slot.pos], state.block_max[slot.pos], state.block_sum[slot.pos])
    if slot.last_in_block and slot.index < len(r.slots) - 1:
        nxt_rows = r.plan.rows[slot.block + 1]
        nxt = (two_phase.queries(r, nxt_rows), r.detail_bias[nxt_rows] if r.detail_kinds else None)
    else:
        nxt = (None, None)
    return (q, None, bias, coefs, *rows, *nxt)


def _updated(state, update: Tensor, coefs: Tensor, start: bool) -> tuple[Tensor, tuple[Tensor, ...]]:
    """P and the raw details after ``update``: P = u, D = c·u at a block start, else P + u, D + c·u."""
    K = coefs.shape[0]
    if start:
        return update, tuple(coefs[j] * update for j in range(K))
    return state.partial + update, tuple(d + coefs[j] * update for j, d in enumerate(state.partial_details))


# --- naive: tuple-based, the reference's ops ------------------------------------------------------

def naive_read(r, state, role_: tuple, p: tuple) -> Tensor:
    """:meth:`BlockAttnRes.read` with the slot's query, gain, bias row and kind codes as tensors."""
    _, _, start, _, _, seen, _ = role_
    q, gain, bias_row, _, codes = p
    sources = (state.e,) + state.pool
    if not start:
        sources += (state.partial,)
        for j in seen:
            sources += (r._match(state.partial_details[j], state.partial),)
    bias = None if bias_row is None or codes is None else block_plan.code_bias(bias_row, codes)
    return depth_mix(sources, q, bias, gain)


def naive_write(r, state, role_: tuple, p: tuple, update: Tensor):
    """:meth:`BlockAttnRes.write` (naive) with the coefficients as a tensor."""
    _, _, start, last, final, _, _ = role_
    partial, details = _updated(state, update, p[3], start)
    if last:
        matched = () if final and not r.readout_details else tuple(r._match(d, partial) for d in details)
        return state._replace(pool=state.pool + (partial,) + matched, partial=None, partial_details=())
    return state._replace(partial=partial, partial_details=details)


# --- two_phase on the padded pool -----------------------------------------------------------------

def _padded_bias(r, bias_rows: Tensor | None, n: int) -> Tensor | None:
    """(m, n) logit bias of m reads over the first ``n`` slots of the padded pool, whose kinds
    repeat with period 1 + K (C or e, then K details: ``plan.padded_codes``), from their (m, K)
    detail-bias rows; None without details."""
    codes = r.plan.padded_codes
    if bias_rows is None or codes is None:
        return None
    return block_plan.code_bias(bias_rows, r.plan_codes[codes][:n])


def padded_phase1(r, values: tuple[Tensor, ...], inv: tuple[Tensor, ...], valid: Tensor, q: Tensor,
                  bias_rows: Tensor | None) -> tuple:
    """:func:`routers.two_phase.phase1` over every pool slot, pads masked by a −inf logit.

    Args:
        r: the router (its plan, and ``lean``: through :func:`routers.lean.mix`, o a tuple of m).
        values, inv, valid: the padded pool (:class:`PaddedState`).
        q: (m, d) the block's queries, key gain folded in.
        bias_rows: (m, K) their detail-bias rows, or None.

    Returns:
        o (m, B, T, d), μ (m, B, T), s (m, B, T); μ and s in the softmax dtype of the values.
    """
    bias = _padded_bias(r, bias_rows, len(values))
    if r.lean:
        return lean.mix(q, bias, values, inv, valid, contiguous=True)
    V = torch.stack(values)                                            # (n, B, T, d)
    dots = torch.einsum("md,nbtd->mbtn", q, V)
    logits = dots.to(softmax_dtype(V.dtype)) * torch.stack(inv, dim=-1)
    if bias is not None:
        logits = logits + bias[:, None, None, :]
    logits = logits.masked_fill(valid.logical_not(), float("-inf"))
    mx = logits.amax(dim=-1).detach()
    e = torch.exp(logits - mx.unsqueeze(-1))
    s = e.sum(dim=-1)
    o = torch.einsum("mbtn,nbtd->mbtd", (e / s.unsqueeze(-1)).to(V.dtype), V)
    # contiguous: every region that makes them must leave them in one layout (a guard on strides)
    return o.contiguous(), mx.contiguous(), s.contiguous()


def padded_init(r, e: Tensor) -> PaddedState:
    """e alone, with phase 1 of block 1 over it (inside the init region; :func:`padded_begin`
    adds the pads)."""
    inv_e = two_phase._inv_rms(r, e)
    valid = e.new_ones(1, dtype=torch.bool)
    rows = r.plan.rows[1]
    bias_rows = r.detail_bias[rows] if r.detail_kinds else None
    o, mx, s = padded_phase1(r, (e,), (inv_e,), valid, two_phase.queries(r, rows), bias_rows)
    return PaddedState((e,), (inv_e,), valid, None, (), o, mx, s)


def padded_begin(r, state: PaddedState) -> PaddedState:
    """The pool padded to :func:`capacity` (outside any region). A region's guards must see the
    same kind of tensor in a slot whether it holds a pad or a source: pads are zeros computed
    from e (so they require grad when the sources do), contiguous like it, and each its own view
    of the one zero tensor (no two inputs are one object, which would be another graph)."""
    e, inv_e = state.values[0], state.inv_rms[0]
    zero, zinv = e * 0, inv_e * 0
    n = capacity(r) - 1
    return state._replace(values=(e,) + tuple(zero.view(zero.shape) for _ in range(n)),
                          inv_rms=(inv_e,) + tuple(zinv.view(zinv.shape) for _ in range(n)),
                          valid=torch.cat((state.valid, state.valid.new_zeros(n))),
                          zero=zero if r.lean else None)


def padded_read(r, state: PaddedState, role_: tuple, p: tuple) -> Tensor:
    """o_0 at a block start, else :func:`routers.two_phase.merge` of P and the seen details."""
    _, _, start, _, _, seen = role_[:6]
    q, _, bias_row, _, o, mx, s = p[:7]
    if start:
        return o
    seen_ = block_plan.span(seen)
    bias = None if bias_row is None or not seen else bias_row[seen_]
    details, rho = list(state.partial_details[seen_]), getattr(r, "max_detail_scale", 1.0)
    if r.lean:  # the register oldest first: pads, then u_0 … u_{p−1} (routers.lean.rebuild)
        return lean.merge(o, mx, s, q, state.partial, details, bias, rho, state.updates[::-1],
                          state.update_coefs.flip(0), seen_)
    return two_phase.merge(o, mx, s, q, state.partial, details, bias, rho)


def padded_write(r, state: PaddedState, role_: tuple, p: tuple, update: Tensor) -> PaddedState:
    """P and the details after ``update``; a completed block goes in front of the pool (its details
    RMS-matched to P, or pads for the last block when nothing reads them), the last pads drop off,
    and phase 1 of the next block runs over the new pool."""
    _, _, start, last, final = role_[:5]
    K = len(r.detail_kinds)
    partial, details = _updated(state, update, p[3], start)
    if not last:
        if not r.lean:
            return state._replace(partial=partial, partial_details=details)
        c = p[3].unsqueeze(0)
        if start:  # a fresh register: u_0, then pads
            n = role_[6] - 2
            reg = (update,) + tuple(state.zero.view(state.zero.shape) for _ in range(n))
            coefs = torch.cat((c, c.new_zeros(n, c.shape[1])))
        else:
            reg, coefs = (update,) + state.updates[:-1], torch.cat((c, state.update_coefs[:-1]))
        return state._replace(partial=partial, partial_details=details, updates=reg, update_coefs=coefs)
    acc = softmax_dtype(partial.dtype)
    keep = len(state.values) - (1 + K)
    if final and not r.readout_details:  # the dropped pads stand for the details nobody reads
        new = (partial,) + state.values[keep:keep + K]
        new_inv = (two_phase._inv_rms(r, partial),) + state.inv_rms[keep:keep + K]
        new_valid = torch.cat((state.valid.new_ones(1), state.valid.new_zeros(K)))
    else:
        new = (partial,) + tuple(r._match(d, partial) for d in details)
        new_inv = tuple(two_phase._inv_rms(r, v).to(acc) for v in new)
        new_valid = state.valid.new_ones(1 + K)
    values, inv = new + state.values[:keep], new_inv + state.inv_rms[:keep]
    valid = torch.cat((new_valid, state.valid[:keep]))
    if final:
        return PaddedState(values, inv, valid, None, (), None, None, None, zero=state.zero)
    o, mx, s = padded_phase1(r, values, inv, valid, p[7], p[8])
    return PaddedState(values, inv, valid, None, (), o, mx, s, zero=state.zero)


def output_params(r) -> tuple:
    """(readout query (d,), its key gain or None, its detail-bias row or None, kind codes of the
    readout's sources or None): the last rows of the stacked parameters (two_phase folds the gain
    into the query, as its reads do) and a slice of the plan's codes (naive: its readout pool;
    two_phase: the padded pool's period)."""
    read = 2 * r.n_layers
    two = r.schedule == "two_phase"
    gain = r.key_gain[read] if r.key_gain is not None and not two else None
    q = two_phase.queries(r, read) if two else r.pseudo_query[read]
    codes = r.plan.padded_codes if two else r.plan.read_codes[read]
    if not r.readout_details and two:
        codes = None
    return q, gain, r.detail_bias[read] if r.detail_kinds else None, None if codes is None else r.plan_codes[codes]


def naive_output(r, state, p: tuple) -> Tensor:
    """:meth:`BlockAttnRes.output` (naive) with the readout's rows and kind codes as tensors."""
    q, gain, bias_row, codes = p
    per_block = 1 + len(r.detail_kinds)
    sources = (state.e,) + (state.pool if r.readout_details else state.pool[::per_block])
    bias = None if bias_row is None or codes is None else block_plan.code_bias(bias_row, codes)
    return depth_mix(sources, q, bias, gain)


def padded_output(r, state: PaddedState, p: tuple) -> Tensor:
    """The readout over e and every C (every source with ``readout_details``): the pool's kinds
    repeat with period 1 + K, so e and the C's are a strided slice."""
    K = len(r.detail_kinds)
    keep = slice(None) if r.readout_details else slice(None, None, 1 + K)
    values, inv, valid = state.values[keep], state.inv_rms[keep], state.valid[keep]
    if len(values) == 1:
        return values[0]
    q, _, bias_row, codes = p
    bias = None if bias_row is None or codes is None else block_plan.code_bias(bias_row, codes[:len(values)])
    if r.lean:
        o, _, _ = lean.mix(q[None], None if bias is None else bias[None], values, inv, valid)
        return o[0]
    V = torch.stack(values)
    dots = torch.matmul(V, q)
    logits = dots.to(softmax_dtype(V.dtype)) * torch.stack(inv)
    if bias is not None:
        logits = logits + bias.view(-1, 1, 1)
    logits = logits.masked_fill(valid.logical_not().view(-1, 1, 1), float("-inf"))
    alpha = torch.softmax(logits, dim=0).to(V.dtype)
    return torch.einsum("nbt,nbtd->btd", alpha, V)


def masked_phase1_flops(r, batch_size: int, seq_len: int) -> float:
    """Forward FLOP the padded pool adds over phase 1 on the completed sources alone (docs/FLOPS.md
    convention), over B·T tokens: the phase 1 of each block b ≥ 2 (block 1's runs over e alone)
    mixes ``capacity − (1 + (b−1)(1+K))`` masked slots too, each costing what a source costs,
    per query and token: the dot product 2d, the weighted sum 2d, the inverse-RMS product, the
    max, the shift, the exponential, the sum and the division (6), plus the detail bias (1) when
    the router has details; and one comparison per slot for the mask."""
    d, K = r.d_model, len(r.detail_kinds)
    n_cap, tokens, extra = capacity(r), batch_size * seq_len, 0
    per_query = 4 * d + 6 + (1 if K else 0)
    for b in range(2, r.n_blocks + 1):
        m = sum(1 for s in r.slots if s.block == b)
        masked = n_cap - (1 + (b - 1) * (1 + K))
        extra += masked * (m * tokens * per_query + 1)
    return float(extra)


class BlockRegions:
    """The region methods of :class:`routers.attnres.BlockAttnRes` and its subclasses (Router's
    region docstrings): naive on its growing tuple, two_phase on the padded pool."""

    def _regions(self) -> bool:
        """Whether this impl has a region form (ours; a peer kernel runs under the model scope)."""
        if self.peer_mix is not None or self.peer_phases is not None:
            raise NotImplementedError(f"impl {self.impl} of {self.name} has no region form for "
                                      "--compile-scope layer; use --compile-scope model")
        return self.schedule == "two_phase"

    def region_pack(self, state) -> tuple:
        return tuple(state)

    def region_unpack(self, state):
        return (PaddedState if self._regions() else self.naive_state)(*state)

    def region_role(self, slot: Slot) -> tuple:
        return slot_role(self, slot)

    def region_params(self, state, slot: Slot) -> tuple:
        return slot_params(self, state, slot)

    def region_init(self, embedding: Tensor):
        return padded_init(self, embedding) if self._regions() else self.init_state(embedding)

    def region_begin(self, state):
        return padded_begin(self, state) if self._regions() else state

    def region_read(self, state, role: tuple, params: tuple) -> Tensor:
        return (padded_read if self._regions() else naive_read)(self, state, role, params)

    def region_write(self, state, role: tuple, params: tuple, update: Tensor):
        return (padded_write if self._regions() else naive_write)(
            self, state, role, params, update)

    def region_output_params(self) -> tuple:
        return output_params(self)

    def region_output(self, state, params: tuple = ()) -> Tensor:
        return (padded_output if self._regions() else naive_output)(self, state, params)
