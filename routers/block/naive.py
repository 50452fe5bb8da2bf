"""The naive schedule of a block router (Attention Residuals, arXiv:2603.15031; WAV v1 / HAARES,
arXiv:2606.06564): every read stacks its sources and mixes them (``routers.mixer.depth_mix``).
It is the plain reference of the math, the parity reference of the other implementations and
the FLOP identity of the cost model (``routers/block/costs.py``).

Over :class:`routers.block.state.NaiveState`, in the contract's form (DESIGN.md, "The router
contract"). Read k mixes e, the completed pool (C_b and its RMS-matched details, oldest first)
and, from the block's second sublayer on, P and the partial details it sees, RMS-matched to P at
the read; the readout mixes e and every C (every source with ``readout_details``). The pool grows
by one block at a time, so under the layer scope a role carries its block number.
"""

from __future__ import annotations

from torch import Tensor

from ..mixer import EPS, depth_mix
from .plan import code_bias
from .state import NaiveState, accumulate


def init(r, e: Tensor, region: bool) -> NaiveState:
    """e, an empty pool, no partial block."""
    return NaiveState(e, (), None, ())


def _read_params(r, read: int, region: bool) -> tuple:
    """(query (d,), key gain (d,) or None, detail-bias row (K,) or None, kind codes of the pool or
    None, recorder or None) of naive read ``read``: views of the parameters, a slice of the plan's
    codes, and (eager only) the diagnose recorder with the pool's kinds."""
    codes = r.plan.read_codes[read]
    return (r.pseudo_query[read], None if r.key_gain is None else r.key_gain[read],
            None if codes is None else r.detail_bias[read], None if codes is None else r.plan_codes[codes],
            None if region else r.recorder(read, r.plan.read_kinds[read]))


def params(r, state: NaiveState, slot, region: bool) -> tuple:
    """:func:`_read_params` of the slot's read, then its coefficients: the plan's Python ±1, or
    under the layer scope (``region``) a (K,) row of the coefficient table in the state's dtype."""
    k = slot.index
    coefs = r.coef_table[k].to(state.e.dtype) if region else r.plan.coefs[k]
    return (*_read_params(r, k, region), coefs)


def _mix(r, sources: tuple[Tensor, ...], p: tuple) -> Tensor:
    """One read: ``depth_mix`` (ours, with the recorder) or a peer kernel's mixer with the same
    arguments (``routers/impls.py``)."""
    q, gain, bias_row, codes, rec = p[:5]
    bias = None if codes is None else code_bias(bias_row, codes)
    if r.peer_mix is not None:
        return r.peer_mix(sources, q, bias, gain, EPS)
    return depth_mix(sources, q, bias, gain, recorder=rec)


def read(r, state: NaiveState, role: tuple, p: tuple) -> Tensor:
    """h_k: the mix of e, the pool and (past a block start) P and the seen details."""
    _, _, start, _, _, seen = role[:6]
    sources = (state.e,) + state.pool
    if not start:
        sources += (state.partial,) + tuple(r._match(state.partial_details[j], state.partial) for j in seen)
    return _mix(r, sources, p)


def write(r, state: NaiveState, role: tuple, p: tuple, update: Tensor) -> NaiveState:
    """P and the details after ``update``; at a block end P becomes C_b and enters the pool exactly
    once, with its details RMS-matched to it (the last block's only when the readout reads them)."""
    _, _, start, last, final = role[:5]
    partial, details = accumulate(state.partial, state.partial_details, update, p[5], start)
    if not last:
        return NaiveState(state.e, state.pool, partial, details)
    matched = () if final and not r.readout_details else tuple(r._match(d, partial) for d in details)
    return NaiveState(state.e, state.pool + (partial,) + matched, None, ())


def output_params(r, region: bool) -> tuple:
    """:func:`_read_params` of the readout (read 2L)."""
    return _read_params(r, 2 * r.n_layers, region)


def output(r, state: NaiveState, p: tuple) -> Tensor:
    """The readout over e and every C (every source with ``readout_details``)."""
    pool = state.pool if r.readout_details else state.pool[::1 + r.plan.K]
    return _mix(r, (state.e,) + pool, p)
