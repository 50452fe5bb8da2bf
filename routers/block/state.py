"""The state of a block router between sublayers (Block AttnRes, arXiv:2603.15031; WAV v1 /
HAARES, arXiv:2606.06564): the sources a read mixes and the running sums a write updates.

One layout per schedule, the same under every compile scope:

- :class:`NaiveState` (``naive`` and the peers of its depth mixer): the pool grows oldest first,
  the paper's order;
- :class:`TwoPhaseState` (``two_phase``, ``lean`` and the peers of its phases): the pool newest
  first (``routers/block/plan.py``), each source with its cached inverse RMS, and the current
  block's phase-1 result. Eager and model scope hold only the sources that exist (``valid`` is
  None); the layer scope pads the pool to a fixed length once (:func:`pad`), so no region's
  graph depends on the block, and masks the pads out of every softmax.

A write adds the update u to the block's partial sum P and to each running detail
(:func:`accumulate`): ``D ± u`` with the slot's ±1 coefficients as Python ints where the scope
allows (no multiply, and at a block start P and every +1 detail *are* u), ``D + c·u`` with c a
tensor row under the layer scope, where a region does not know the slot's position.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor


class NaiveState(NamedTuple):
    """The ``naive`` schedule's state.

    Attributes:
        e: token embedding, (B, T, d).
        pool: completed-block sources, oldest first: ``C_1, D̃_1…, C_2, D̃_2…`` (details RMS-matched).
        partial: P, the sum of the current block's updates so far, or None at a block start.
        partial_details: running raw detail sums of the current block, one per detail kind.
    """

    e: Tensor
    pool: tuple[Tensor, ...]
    partial: Tensor | None
    partial_details: tuple[Tensor, ...]


class TwoPhaseState(NamedTuple):
    """The two-phase schedule's state.

    Attributes:
        values: completed sources newest first: ``C_b, D̃_b…, …, C_1, D̃_1…, e`` (then pads, under
            the layer scope).
        inv_rms: their inverse RMS ``rsqrt(mean(V²) + ε)``, each (B, T), in the softmax dtype (0
            for a pad).
        valid: None (no pads), or (``1 + N(1+K)``,) bool, True for a source, False for a pad.
        partial, partial_details: P and the raw running details of the current block.
        block_out: phase-1 outputs of the current block's m queries, (m, B, T, d) or a tuple of m.
        block_max, block_sum: phase-1 running max and sum of exponentials per query, (m, B, T),
            in the softmax dtype (float32 for 16-bit tensors).
        updates: ``lean`` only (else ()): the block's sublayer outputs so far, newest first (its
            backward rebuilds P and the details from them); under the layer scope a register of
            the block's length − 1 led by them and filled with pads, with ``update_coefs``
            (length − 1, K) each one's detail coefficients (0 for a pad).
        zero: under the layer scope, the zero tensor every pad is a view of; else None.
        block_q: the current block's m queries as its phase 1 passed them on, a tuple of m (d,)
            (``Phases.passes_queries``), or None: phase 2 then takes the parameter's row.
        h_next: the next read's input where the last write made it (``Phases.chain``), else None.
        step_rows: (pseudo-queries, detail-bias rows or None) split once per step into the blocks'
            rows and the readout's (``routers.block.two_phase._step_rows``), or None.
    """

    values: tuple[Tensor, ...]
    inv_rms: tuple[Tensor, ...]
    valid: Tensor | None
    partial: Tensor | None
    partial_details: tuple[Tensor, ...]
    block_out: Tensor | tuple[Tensor, ...] | None
    block_max: Tensor | None
    block_sum: Tensor | None
    updates: tuple[Tensor, ...] = ()
    update_coefs: Tensor | None = None
    zero: Tensor | None = None
    block_q: tuple[Tensor, ...] | None = None
    h_next: Tensor | None = None
    step_rows: tuple | None = None


def accumulate(partial: Tensor | None, details: tuple[Tensor, ...], update: Tensor,
               coefs: tuple[int, ...] | Tensor, start: bool) -> tuple[Tensor, tuple[Tensor, ...]]:
    """P and the raw details after ``update`` (B, T, d): P = u and D = ±u at a block start, else
    P + u and D ± u.

    Args:
        coefs: the slot's coefficient in each detail kind: Python ±1 (``D + u`` or ``D − u``, and
            u itself where +1 at a start) or a (K,) tensor of ±1 (``D + c·u``: the layer scope).
    """
    if isinstance(coefs, Tensor):
        if start:
            return update, tuple(coefs[j] * update for j in range(coefs.shape[0]))
        return partial + update, tuple(d + coefs[j] * update for j, d in enumerate(details))
    if start:
        return update, tuple(update if c > 0 else -update for c in coefs)
    return partial + update, tuple(d + update if c > 0 else d - update for d, c in zip(details, coefs))


def pad(state: TwoPhaseState, capacity: int, lean: bool) -> TwoPhaseState:
    """The pool of an initial state (e alone, made with ``valid`` given) padded to ``capacity``
    sources (the layer scope; outside any region). A region's
    guards must see the same kind of tensor in a slot whether it holds a pad or a source: pads
    are zeros computed from e (so they require grad when the sources do), contiguous like it, and
    each its own view of the one zero tensor (no two inputs are one object, which would be
    another graph). ``lean`` keeps the zero for its register of updates."""
    e, inv_e = state.values[0], state.inv_rms[0]
    zero, zinv = e * 0, inv_e * 0
    n = capacity - 1
    return state._replace(values=(e,) + tuple(zero.view(zero.shape) for _ in range(n)),
                          inv_rms=(inv_e,) + tuple(zinv.view(zinv.shape) for _ in range(n)),
                          valid=torch.cat((state.valid, state.valid.new_zeros(n))),
                          zero=zero if lean else None)
