"""The two-phase schedule of a block router (Attention Residuals, arXiv:2603.15031; ROUTERS.md,
"Two-phase computation"): the read, write and readout of ``two_phase``, ``lean`` and the peers of
its phases, over :class:`routers.block.state.TwoPhaseState`, in the contract's form (DESIGN.md,
"The router contract"): a slot's read and write see its role and the tensors of its params.

- ``init``: e enters the pool with its inverse RMS, and phase 1 of block 1 runs over it.
- ``read`` at a block start is phase 1's output o_0; later in the block it merges P and the
  details the slot sees into phase 1's result (phase 2).
- ``write`` adds u to P and the details; the write that completes a block puts C_b and its
  RMS-matched details in front of the pool (newest first: under the layer scope the last pads
  drop off the end, so no index depends on the block) and runs phase 1 of the next block.
- ``output`` mixes e and every C (every source with ``readout_details``).

The math of the phases is the router's ``phases`` (:class:`routers.block.phases.Phases`): plain
autograd (``routers/block/phases.py``), the memory-lean Functions (``routers/block/lean.py``) or a
peer's kernels. Nothing here asks which.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..impls import BUILTIN_NOTE, Impl, StateModel
from ..mixer import softmax_dtype
from .phases import PLAIN
from .plan import code_bias, span
from .state import TwoPhaseState, accumulate, pad


def queries(r, rows: int | slice) -> Tensor:
    """Pseudo-queries of read ``rows`` (an int: (d,); a slice of consecutive reads: (m, d)) with
    any key gain folded in. A slice is a view: no op, no host data."""
    q = r.pseudo_query[rows]
    return q if r.key_gain is None else q * r.key_gain[rows]


def _pool_bias(r, bias_rows: Tensor | None, n: int) -> Tensor | None:
    """(m, n) logit bias of m reads over a pool of n sources from their (m, K) detail-bias rows,
    or None where no source is a detail."""
    codes = r.plan.pool_codes[n]
    return None if bias_rows is None or codes is None else code_bias(bias_rows, r.plan_codes[codes])


def _bias(r, bias_rows: Tensor | None, n: int):
    """Phase 1's bias over a pool of n sources as the phases take it: (m, n) (:func:`_pool_bias`), or
    with ``Phases.bias_rows`` the reads' detail-bias rows and the sources' kind codes (None where
    no source is a detail)."""
    if not r.phases.bias_rows:
        return _pool_bias(r, bias_rows, n)
    codes = r.plan.pool_codes[n]
    return bias_rows, None if codes is None or bias_rows is None else r.plan_codes[codes]


def init(r, e: Tensor, region: bool) -> TwoPhaseState:
    """e alone, with phase 1 of block 1 over it (``region``: made for the layer scope, whose
    :func:`begin` pads it)."""
    inv = r.phases.inv_rms(e)
    valid = e.new_ones(1, dtype=torch.bool) if region else None
    step = _step_rows(r, region)
    q, rows = _block_rows(r, step, 1)
    o, mx, s, *qs = r.phases.phase1(q, _bias(r, rows, 1), (e,), (inv,), valid, r.recompute_scope)
    return TwoPhaseState((e,), (inv,), valid, None, (), o, mx, s, block_q=_passed(r, qs), step_rows=step)


def _step_rows(r, region: bool) -> tuple | None:
    """With ``Phases.passes_queries`` (eager and model scope): the pseudo-queries, key gain folded
    in, and the detail-bias rows (or None), each split once per step into the blocks' rows and the
    readout's, so each block's phase 1 takes its own piece (one cat in the backward, not a slice's
    zero-filled gradient and an add per block); else None."""
    if region or not r.phases.passes_queries:
        return None
    sizes = [rows.stop - rows.start for rows in r.plan.rows.values()]
    sizes.append(r.pseudo_query.shape[0] - sum(sizes))
    q = r.pseudo_query if r.key_gain is None else r.pseudo_query * r.key_gain
    return q.split(sizes), r.detail_bias.split(sizes) if r.detail_kinds else None


def _block_rows(r, step: tuple | None, block: int) -> tuple[Tensor, Tensor | None]:
    """(queries (m, d), detail-bias rows (m, K) or None) of a block's phase 1."""
    if step is not None:
        return step[0][block - 1], None if step[1] is None else step[1][block - 1]
    rows = r.plan.rows[block]
    return queries(r, rows), r.detail_bias[rows] if r.detail_kinds else None


def _passed(r, qs: list) -> tuple | None:
    """The queries phase 1 passed on (``Phases.passes_queries``), or None."""
    return qs[0] if r.phases.passes_queries else None


def begin(r, state: TwoPhaseState) -> TwoPhaseState:
    """The layer scope's pool: padded to ``1 + N(1+K)`` sources (:func:`routers.block.state.pad`)."""
    return pad(state, r.plan.capacity, r.phases.keeps_updates)


def params(r, state: TwoPhaseState, slot, region: bool) -> tuple:
    """(query (d,), bias of the seen details (K',) or None, coefficients, o, μ, s of phase 1 at
    the slot's position (at a block start o_0 alone: query, μ and s None), then at a block end the
    next block's queries (m, d) and detail-bias rows (m, K) (else None, None), then ``lean``'s
    coefficient bits of the block's earlier updates, then where the write chains the next read
    (:func:`write`) that read's (query, bias, o, μ, s, coefficient bits, seen kinds), else None):
    views of the parameters and the state, and Python ints of the plan. The coefficients are the
    plan's Python ±1, or under the layer scope (``region``) a (K,) row of the coefficient table in
    the state's dtype."""
    k, plan = slot.index, r.plan
    coefs = r.coef_table[k].to(state.values[0].dtype) if region else plan.coefs[k]
    nxt = (None, None)
    if slot.last_in_block and k < len(r.slots) - 1:
        nxt = _block_rows(r, state.step_rows, slot.block + 1)
    chained = None
    if r.phases.chain is not None and not region and slot.pos >= 1 and not slot.last_in_block:
        chained = (*_read_params(r, state, k + 1, slot.pos + 1), plan.coef_bits[k + 1], plan.seen_span[k + 1])
    q, bias, *rows = _read_params(r, state, k, slot.pos)
    return (q, bias, coefs, *rows, *nxt, plan.coef_bits[k], chained)


def _read_params(r, state: TwoPhaseState, k: int, pos: int) -> tuple:
    """(query, bias of the seen details or None, o, μ, s) of read k at block position ``pos``
    (a block start: o_0 alone, the others None)."""
    if pos == 0:
        return None, None, state.block_out[0], None, None
    seen = r.plan.seen_span[k]
    carried = state.block_q is not None and r.phases.bias_rows  # the query phase 1 passed on holds them
    bias = r.detail_bias[k, seen] if seen.stop > seen.start and not carried else None
    q = queries(r, k) if state.block_q is None else state.block_q[pos]
    return q, bias, state.block_out[pos], state.block_max[pos], state.block_sum[pos]


def read(r, state: TwoPhaseState, role: tuple, p: tuple) -> Tensor:
    """o_0 at a block start, the input the last write made (``Phases.chain``), else phase 2: the
    merge of P and the seen details."""
    _, _, start, _, _, seen = role[:6]
    q, bias, _, o, mx, s = p[:6]
    if start:
        return o
    if state.h_next is not None:
        return state.h_next
    kinds = span(seen)
    updates, coefs = (), 0
    if state.updates:  # lean: the block's updates, oldest first, to rebuild P and the details from
        updates = state.updates[::-1]
        coefs = p[8] if state.update_coefs is None else state.update_coefs.flip(0)
    return r.phases.merge(o, mx, s, q, state.partial, list(state.partial_details[kinds]), bias,
                          r.max_detail_scale, updates, coefs, kinds, r.plan.K, r.recompute_scope)


def write(r, state: TwoPhaseState, role: tuple, p: tuple, update: Tensor) -> TwoPhaseState:
    """P and the details after ``update``; a completed block goes in front of the pool (its details
    RMS-matched to P, none for the last block when nothing reads them), and phase 1 of the next
    block runs over the new pool."""
    _, _, start, last, final = role[:5]
    if p[9] is not None:  # the next read's merge makes P + u (Phases.chain)
        return _chain(r, state, role, p, update)
    partial, details = accumulate(state.partial, state.partial_details, update, p[2], start)
    if not last:
        state = state._replace(partial=partial, partial_details=details, h_next=None)
        return _keep(state, role, p, update) if r.phases.keeps_updates else state
    if state.valid is None:
        values, inv, valid = _complete(r, state, final, partial, details)
    else:
        values, inv, valid = _complete_padded(r, state, final, partial, details)
    if final:
        return TwoPhaseState(values, inv, valid, None, (), None, None, None, zero=state.zero,
                             step_rows=state.step_rows)
    o, mx, s, *qs = r.phases.phase1(p[6], _bias(r, p[7], len(values)), values, inv, valid, r.recompute_scope)
    return TwoPhaseState(values, inv, valid, None, (), o, mx, s, zero=state.zero, block_q=_passed(r, qs),
                         step_rows=state.step_rows)


def _chain(r, state: TwoPhaseState, role: tuple, p: tuple, update: Tensor) -> TwoPhaseState:
    """A write inside a block (position ≥ 1, not its last) through ``Phases.chain``: the next read's
    merge adds u to P and to each running detail (with the slot's signs), so each sum has one
    consumer (the next write's merge, or the adds that complete the block) and no add of its own."""
    q, bias, o, mx, s, bits, kinds = p[9]
    updates = ((update,) + state.updates)[::-1]
    h, partial, details = r.phases.chain(o, mx, s, q, state.partial, update, state.partial_details, bias,
                                         r.max_detail_scale, updates, bits, kinds, r.plan.K, p[2])
    return _keep(state._replace(partial=partial, partial_details=details, h_next=h), role, p, update)


def _keep(state: TwoPhaseState, role: tuple, p: tuple, update: Tensor) -> TwoPhaseState:
    """``lean``: the update joins the block's register (newest first). Under the layer scope the
    register has the block's length − 1 (pads, views of ``zero``, where no update is yet), with
    each one's coefficients in ``update_coefs``."""
    if state.zero is None:
        return state._replace(updates=(update,) + state.updates)
    c, start, block_len = p[2].unsqueeze(0), role[2], role[6]
    if start:  # a fresh register of block_len − 1: u_0, then pads
        n = block_len - 2
        return state._replace(updates=(update,) + tuple(state.zero.view(state.zero.shape) for _ in range(n)),
                              update_coefs=torch.cat((c, c.new_zeros(n, c.shape[1]))))
    return state._replace(updates=(update,) + state.updates[:-1],
                          update_coefs=torch.cat((c, state.update_coefs[:-1])))


def _matched(r, detail: Tensor, partial: Tensor) -> Tensor:
    """A completed detail RMS-matched to C (only routers with details have any): the phases' own
    matching where they have one (``Phases.match``), else the router's."""
    if r.phases.match is None:
        return r._match(detail, partial)
    return r.phases.match(detail, partial, r.max_detail_scale)


def _complete(r, state: TwoPhaseState, final: bool, partial: Tensor, details: tuple) -> tuple:
    """The exact pool once a block completes: C_b and its matched details in front (the last
    block's details only with ``readout_details``)."""
    new = (partial,) if final and not r.readout_details else (partial,) + tuple(_matched(r, d, partial) for d in details)
    return new + state.values, tuple(r.phases.inv_rms(v) for v in new) + state.inv_rms, None


def _complete_padded(r, state: TwoPhaseState, final: bool, partial: Tensor, details: tuple) -> tuple:
    """The padded pool once a block completes: its 1 + K sources in front, as many pads off the
    end (for the last block's details that nobody reads, the dropped pads stay in their place)."""
    K, acc = r.plan.K, softmax_dtype(partial.dtype)
    keep = len(state.values) - (1 + K)
    if final and not r.readout_details:
        new = (partial,) + state.values[keep:keep + K]
        new_inv = (r.phases.inv_rms(partial),) + state.inv_rms[keep:keep + K]
        new_valid = torch.cat((state.valid.new_ones(1), state.valid.new_zeros(K)))
    else:
        new = (partial,) + tuple(_matched(r, d, partial) for d in details)
        new_inv = tuple(r.phases.inv_rms(v).to(acc) for v in new)
        new_valid = state.valid.new_ones(1 + K)
    return (new + state.values[:keep], new_inv + state.inv_rms[:keep],
            torch.cat((new_valid, state.valid[:keep])))


def output_params(r, region: bool) -> tuple:
    """(readout query (d,), key gain folded in; its detail-bias row (K,) when the readout reads
    details, else None)."""
    read = 2 * r.n_layers
    return queries(r, read), r.detail_bias[read] if r.readout_details and r.detail_kinds else None


def output(r, state: TwoPhaseState, p: tuple) -> Tensor:
    """The readout over e and every C (every source with ``readout_details``): in the padded pool
    the kinds repeat with period 1 + K, so e and the C's are a strided slice."""
    q, bias_row = p
    if state.step_rows is not None:  # the readout's piece of the step's split (a view: no op)
        q = state.step_rows[0][-1].view(-1)
        bias_row = None if bias_row is None else state.step_rows[1][-1].view(-1)
    if state.valid is None:
        keep = r.plan.readout_newest
        values, inv, valid = tuple(state.values[i] for i in keep), tuple(state.inv_rms[i] for i in keep), None
    else:
        keep = slice(None) if r.readout_details else slice(None, None, 1 + r.plan.K)
        values, inv, valid = state.values[keep], state.inv_rms[keep], state.valid[keep]
    if len(values) == 1:
        return values[0]
    return r.phases.readout(q, _bias(r, bias_row, len(values)), values, inv, valid, r.recompute_scope)


IMPL = Impl("two_phase", ("block_attnres", "haares", "wav_v1"), "two_phase", phases=PLAIN,
            conventions=BUILTIN_NOTE + ": the AttnRes paper's two-phase schedule", builtin=True, no_layer_scope=None,
            state=StateModel(phase1=True), compile_weight=1.5, line="--", marker="s")
