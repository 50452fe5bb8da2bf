"""The ``fused`` implementation of the block routers (Attention Residuals, arXiv:2603.15031;
WAV v1 / HAARES, arXiv:2606.06564): the two-phase schedule (``routers/block/two_phase.py``) with
its math in Triton kernels (``routers/block/fused_kernels.py``: phase 1; ``fused_kernels_merge.py``:
phase 2 and the RMS matching), registered as ``torch.library``
custom ops so that ``torch.compile`` treats each as one opaque call under both scopes (tested on
CPU under the interpreter) and a CUDA graph can capture its launches (``tests/test_fused.py``'s
CUDA test; no GPU has run it yet).

The ops (namespace ``routerbench``), each with a fake implementation and ``register_autograd``:

- ``fused_phase1(values, q, bias, valid, write_o, write_q) -> [o_0 … o_{m−1}, μ_0 …, s_0 …, q_0 …]``:
  m queries q (m, d) over n sources (B, T, d), bias (m, n) or None, valid (n,) bool or None; each
  key's inverse RMS is computed in the kernel where its row is loaded (none is cached in the state).
  Each query's results are tensors of their own: o_i (B, T, d) in the sources' dtype (none when
  ``write_o`` is off: a pool of one source, whose outputs are that source), μ_i and s_i (B, T)
  float32, and (``write_q``) q_i (d,) float32, the copy of the query that phase 2 takes, so that
  its gradient comes back through this op's backward; last, inv (n, B, T) float32, each key's
  inverse RMS as the kernel computed it, which the backward reads. Backward: ``fused_phase1_bwd``, from the
  sources, q, bias and μ, s, with ∂/∂q and ∂/∂bias reduced in the kernels (one torch sum over the
  programs' partials);
- ``fused_phase2(o, μ, s, q, P, details, bias, updates, coef_t, bits, k_lo, n_kinds, max_scale)
  -> h``: the merge of one read (``routers.block.phases.merge``): o, P (B, T, d) and μ, s (B, T)
  of that read, q (d,), K' raw details (B, T, d) of kinds k_lo … k_lo + K' − 1 and their bias
  (K',) or None, ρ = ``max_scale`` (the cap of the detached RMS-matching gain); h (B, T, d) in
  o's dtype. Its backward (``fused_phase2_bwd``) keeps h, μ, s, q, bias and the block's updates
  (p of them, oldest first, each (B, T, d)), and rebuilds P and the details from the updates as
  ``lean`` does (``routers/block/lean.py``), with their coefficients in every one of ``n_kinds``
  kinds as the bits of ``bits`` (bit i·n_kinds + j; eager and model scope) or the (p, n_kinds)
  tensor ``coef_t`` (the layer scope).

So the backward keeps the tensors ``lean``'s keeps (the sources once, the block's updates, h), and
of its float32 statistics μ, s and the keys' inverse RMS that phase 1 wrote (none in the router's
state): the kernels recompute the logits, weights, dots and gains.
The FLOPs of the ops are counted on the naive twin (``Impl.opaque``). The kernels run on CUDA,
and on CPU tensors under ``TRITON_INTERPRET=1`` (tests at tiny shapes), where every kernel runs
its first config: the autotuner times configs through a GPU driver. On CUDA each kernel is
autotuned over its configs at its first call (``fused_launch.KEYS``: d and the pool and query
counts, or the detail kinds and updates, beside the dtypes), which the harness's warm-up makes
before any capture (``routers/block/fused_launch.py`` holds the configs and launches).
"""

from __future__ import annotations

import importlib.util
import os
from typing import Optional, Sequence

import torch
from torch import Tensor

from ..impls import BUILTIN_NOTE, Impl, StateModel
from .fused_launch import (MAX_PROGRAMS, check_router, contiguous_all, kernels, pow2, run_rms_match,
                           run_phase1, run_phase1_bwd, run_phase2, run_phase2_bwd)
from .phases import Phases, distinct


# --- the custom ops --------------------------------------------------------------------------

def _rms_match(mod, D, C, max_scale):
    return run_rms_match(mod, D.contiguous(), C.contiguous(), max_scale)


@torch.library.custom_op("routerbench::fused_rms_match", mutates_args=())
def rms_match_op(D: Tensor, C: Tensor, max_scale: float) -> tuple[Tensor, Tensor]:
    return _rms_match(kernels(), D, C, max_scale)


@rms_match_op.register_fake
def _(D, C, max_scale):
    return torch.empty_like(D, memory_format=torch.contiguous_format), D.new_empty((*D.shape[:-1], 1))


def _rms_match_setup(ctx, inputs, output):
    ctx.set_materialize_grads(False)  # the gain is never read with a gradient: no zeros made for it
    ctx.save_for_backward(output[1])


def _rms_match_backward(ctx, g, g_scale):
    (scale,) = ctx.saved_tensors  # the gain is detached: ∂D = g·scale, and C has no gradient
    return None if g is None else g * scale, None, None


rms_match_op.register_autograd(_rms_match_backward, setup_context=_rms_match_setup)


def rms_match(D: Tensor, C: Tensor, max_scale: float) -> Tensor:
    """:func:`routers.mixer.rms_match` of a completed detail D to C (B, T, d) through
    ``fused_rms_match``: one kernel reads both and writes D̃ and the gain."""
    return rms_match_op(D, C, float(max_scale))[0]


def _phase1(mod, values, q, rows, codes, valid, write_o, write_q):
    o, mx, s, qc, inv = run_phase1(mod, contiguous_all(values), q.contiguous(), None if rows is None else rows.contiguous(),
                                   codes, None if valid is None else valid.contiguous(), write_o, write_q)
    return [*o, *mx, *s, *qc, inv]


@torch.library.custom_op("routerbench::fused_phase1", mutates_args=())
def phase1_op(values: list[Tensor], q: Tensor, rows: Optional[Tensor], codes: Optional[Tensor],
              valid: Optional[Tensor], write_o: bool, write_q: bool) -> list[Tensor]:
    return _phase1(kernels(), values, q, rows, codes, valid, write_o, write_q)


@phase1_op.register_fake
def _(values, q, rows, codes, valid, write_o, write_q):
    v0, (m, d) = values[0], q.shape
    o = [v0.new_empty(v0.shape) for _ in range(m)] if write_o else []
    stats = [v0.new_empty(v0.shape[:-1], dtype=torch.float32) for _ in range(2 * m)]
    kb = 0 if rows is None else rows.shape[1]
    qc = [q.new_empty((d + kb,), dtype=torch.float32) for _ in range(m)] if write_q else []
    return o + stats + qc + [v0.new_empty((len(values), *v0.shape[:-1]), dtype=torch.float32)]


def _phase1_bwd(mod, values, inv, q, rows, codes, valid, mx, s, g_o, g_s, g_qc):
    return run_phase1_bwd(mod, contiguous_all(values), inv.contiguous(), q.contiguous(),
                          None if rows is None else rows.contiguous(), codes,
                          None if valid is None else valid.contiguous(), mx, s, g_o, g_s, g_qc)


@torch.library.custom_op("routerbench::fused_phase1_bwd", mutates_args=())
def phase1_bwd_op(values: list[Tensor], inv: Tensor, q: Tensor, rows: Optional[Tensor], codes: Optional[Tensor],
                  valid: Optional[Tensor], mx: list[Tensor], s: list[Tensor], g_o: list[Optional[Tensor]],
                  g_s: list[Optional[Tensor]], g_qc: list[Optional[Tensor]]) -> tuple[Tensor, Tensor]:
    return _phase1_bwd(kernels(), values, inv, q, rows, codes, valid, mx, s, g_o, g_s, g_qc)


@phase1_bwd_op.register_fake
def _(values, inv, q, rows, codes, valid, mx, s, g_o, g_s, g_qc):
    v0, n, (m, d) = values[0], len(values), q.shape
    kb = 0 if rows is None else rows.shape[1]
    return v0.new_empty((n, *v0.shape)), q.new_empty((m * (d + kb),), dtype=torch.float32)


def _phase1_setup(ctx, inputs, output):
    values, q, rows, codes, valid, write_o, write_q = inputs
    m = q.shape[0]
    ctx.n, ctx.m, ctx.write_o, ctx.write_q = len(values), m, write_o, write_q
    ctx.dtypes = [v.dtype for v in values]
    ctx.set_materialize_grads(False)  # an output nobody read has no gradient, not a zero tensor
    stats = output[m:3 * m] if write_o else output[:2 * m]
    ctx.save_for_backward(q, rows, codes, valid, output[-1], *stats, *values)


def _phase1_backward(ctx, grads):
    m = ctx.m
    q, rows, codes, valid, inv, *rest = ctx.saved_tensors
    mx, s, values = rest[:m], rest[m:2 * m], rest[2 * m:]
    grads = list(grads)
    g_o = grads[:m] if ctx.write_o else []
    g_s = grads[len(g_o) + m:len(g_o) + 2 * m]
    g_qc = grads[len(g_o) + 2 * m:len(g_o) + 3 * m] if ctx.write_q else []
    g_v, g_qb = phase1_bwd_op(values, inv, q, rows, codes, valid, list(mx), list(s), g_o, g_s, g_qc)
    d = q.shape[1]
    g_q = g_qb[:m * d].view(m, d).to(q.dtype)
    g_rows = None if rows is None else g_qb[m * d:].view(m, rows.shape[1]).to(rows.dtype)
    gv = [g.to(dt) for g, dt in zip(g_v.unbind(0), ctx.dtypes)]
    return gv, g_q, g_rows, None, None, None, None


phase1_op.register_autograd(_phase1_backward, setup_context=_phase1_setup)


def _phase2(mod, o, mx, s, q, P, details, bias, updates, coef_t, bits, k_lo, n_kinds, max_scale):
    return run_phase2(mod, o.contiguous(), mx.contiguous(), s.contiguous(), q.contiguous(), P.contiguous(),
                      contiguous_all(details), None if bias is None else bias.contiguous(), max_scale, k_lo=k_lo)[0]


@torch.library.custom_op("routerbench::fused_phase2", mutates_args=())
def phase2_op(o: Tensor, mx: Tensor, s: Tensor, q: Tensor, P: Tensor, details: list[Tensor], bias: Optional[Tensor],
              updates: list[Tensor], coef_t: Optional[Tensor], bits: int, k_lo: int, n_kinds: int,
              max_scale: float) -> Tensor:
    return _phase2(kernels(), o, mx, s, q, P, details, bias, updates, coef_t, bits, k_lo, n_kinds, max_scale)


@phase2_op.register_fake
def _(o, mx, s, q, P, details, bias, updates, coef_t, bits, k_lo, n_kinds, max_scale):
    return torch.empty_like(o, memory_format=torch.contiguous_format)


def _phase2_chain(mod, o, mx, s, q, P, u, running, bias, updates, coef_t, bits, k_lo, n_kinds, max_scale, seen, csign):
    h, P_new, D_new = run_phase2(mod, o.contiguous(), mx.contiguous(), s.contiguous(), q.contiguous(), P.contiguous(),
                                 contiguous_all(running), None if bias is None else bias.contiguous(), max_scale,
                                 u.contiguous(), k_lo, seen if running else None, csign)
    return [h, P_new, *D_new]


@torch.library.custom_op("routerbench::fused_phase2_chain", mutates_args=())
def phase2_chain_op(o: Tensor, mx: Tensor, s: Tensor, q: Tensor, P: Tensor, u: Tensor, running: list[Tensor],
                    bias: Optional[Tensor], updates: list[Tensor], coef_t: Optional[Tensor], bits: int, k_lo: int,
                    n_kinds: int, max_scale: float, seen: int, csign: int) -> list[Tensor]:
    return _phase2_chain(kernels(), o, mx, s, q, P, u, running, bias, updates, coef_t, bits, k_lo, n_kinds, max_scale,
                         seen, csign)


@phase2_chain_op.register_fake
def _(o, mx, s, q, P, u, running, bias, updates, coef_t, bits, k_lo, n_kinds, max_scale, seen, csign):
    return [torch.empty_like(t, memory_format=torch.contiguous_format) for t in (o, P, *running)]


def _phase2_bwd(mod, g, h, mx, s, q, bias, updates, coef_t, bits, k_lo, n_kinds, K, max_scale, g_pn, g_dn, kd, csign):
    return run_phase2_bwd(mod, g, h.contiguous(), mx.contiguous(), s.contiguous(), q.contiguous(),
                          None if bias is None else bias.contiguous(), contiguous_all(updates),
                          None if coef_t is None else coef_t.contiguous(), bits, k_lo, n_kinds, K, max_scale, g_pn,
                          g_dn, kd, csign)


@torch.library.custom_op("routerbench::fused_phase2_bwd", mutates_args=())
def phase2_bwd_op(g: Tensor, h: Tensor, mx: Tensor, s: Tensor, q: Tensor, bias: Optional[Tensor],
                  updates: list[Tensor], coef_t: Optional[Tensor], bits: int, k_lo: int, n_kinds: int, K: int,
                  max_scale: float, g_pn: Optional[Tensor], g_dn: list[Optional[Tensor]], kd: int,
                  csign: int) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    return _phase2_bwd(kernels(), g, h, mx, s, q, bias, updates, coef_t, bits, k_lo, n_kinds, K, max_scale, g_pn,
                       g_dn, kd, csign)


@phase2_bwd_op.register_fake
def _(g, h, mx, s, q, bias, updates, coef_t, bits, k_lo, n_kinds, K, max_scale, g_pn, g_dn, kd, csign):
    u0, d = updates[0], h.shape[-1]
    width = q.shape[0] if q.shape[0] > d else d + (K if bias is not None else 0)  # run_phase2_bwd's
    return (torch.empty_like(h, memory_format=torch.contiguous_format), mx.new_empty(mx.shape),
            u0.new_empty(u0.shape), u0.new_empty((kd or K, *u0.shape)), mx.new_empty((width,)),
            u0.new_empty(u0.shape if kd else (0,)))


def _phase2_setup(ctx, inputs, output):
    chain = len(inputs) == 16  # fused_phase2_chain: u after P, the seen count and the signs of u last
    o, mx, s, q, P, *rest = inputs
    if chain:
        _, details, bias, updates, coef_t, bits, k_lo, n_kinds, max_scale, seen, csign = rest
        K, kd = (seen, len(details)) if details else (0, 0)
        ctx.set_materialize_grads(False)  # a running sum no later op read has no gradient
    else:
        details, bias, updates, coef_t, bits, k_lo, n_kinds, max_scale = rest
        K, kd, csign = len(details), 0, 0
    ctx.meta = (chain, K, kd, csign, len(updates), bits, k_lo, n_kinds, max_scale, o.dtype, P.dtype,
                [t.dtype for t in details])
    ctx.save_for_backward(output[0] if chain else output, mx, s, q, bias, coef_t, *updates)


def _phase2_backward(ctx, g, *g_sums):
    chain, K, kd, csign, U, bits, k_lo, n_kinds, max_scale, o_dtype, p_dtype, d_dtypes = ctx.meta
    h, mx, s, q, bias, coef_t, *updates = ctx.saved_tensors
    if chain:  # (g, [g_h, g_P, g_D…]): a list output's gradients come as one list
        g, g_pn, *g_dn = g
    else:
        g_pn, g_dn = None, []
    g_o, g_s, g_p, g_d, g_qb, g_u = phase2_bwd_op(g, h, mx, s, q, bias, updates, coef_t, bits, k_lo, n_kinds, K,
                                                  max_scale, g_pn, g_dn, kd, csign)
    d = h.shape[-1]
    if q.shape[0] > d:  # q carries the detail biases (phase 1's copy): its gradient carries theirs
        g_q, g_b = g_qb.to(q.dtype), None
    else:
        g_q, g_b = g_qb[:d].to(q.dtype), g_qb[d:d + K]
    g_p = g_p.to(p_dtype)
    g_d = [g.to(dt) for g, dt in zip(g_d.unbind(0), d_dtypes)]
    head = (g_o.to(o_dtype), None, g_s, g_q, g_p)
    if chain:  # P + u and D ± u: u's gradient is P's with no details, else the kernel's
        return (*head, g_u.to(p_dtype) if kd else g_p, g_d, None if bias is None else g_b.to(bias.dtype),
                [None] * U, *(None,) * 7)
    return (*head, g_d, None if bias is None else g_b.to(bias.dtype), [None] * U, *(None,) * 5)


phase2_op.register_autograd(_phase2_backward, setup_context=_phase2_setup)
phase2_chain_op.register_autograd(_phase2_backward, setup_context=_phase2_setup)


#: Each custom op's implementation, with the kernels module as its first argument: what a launch
#: recorder runs in place of the op (``harness.costs.step_costs``), its launches recorded, not run.
IMPLEMENTATIONS = {"routerbench::fused_rms_match": _rms_match, "routerbench::fused_phase1": _phase1, "routerbench::fused_phase1_bwd": _phase1_bwd,
                   "routerbench::fused_phase2": _phase2, "routerbench::fused_phase2_chain": _phase2_chain,
                   "routerbench::fused_phase2_bwd": _phase2_bwd}


# --- the Phases of the two-phase schedule ----------------------------------------------------

def inv_rms(v: Tensor) -> Tensor:
    """No inverse RMS is cached: phase 1's kernels compute each key's where they load its row. The
    schedule's slot for it holds a float32 tensor of no elements (an allocation, no launch)."""
    return v.new_empty((0,), dtype=torch.float32)


def _rows_and_codes(bias, n: int) -> tuple[Tensor | None, Tensor | None]:
    """Phase 1's bias as the kernels take it: the schedule's (detail-bias rows (m, K), kind codes (n,)
    or None) as they are; a plain (m, n) bias (``routers.block.phases.phase1``'s) as rows with each
    source its own kind (codes 1 … n)."""
    if bias is None or isinstance(bias, tuple):
        return bias if bias is not None else (None, None)
    return bias, torch.arange(1, n + 1, device=bias.device)


def phase1(q: Tensor, bias, values: Sequence[Tensor], inv: Sequence[Tensor], valid: Tensor | None,
           scope: object = None, write_q: bool = True) -> tuple[tuple[Tensor, ...], ...]:
    """:func:`routers.block.phases.phase1` through ``fused_phase1``: each query's tensors of its own,
    (o_0, …, o_{m−1}) each (B, T, d), (μ_i) detached and (s_i) each (B, T), and (``write_q``) the
    queries' float32 copies (d + K,), each with its detail-bias row after it, that phase 2 takes
    (:data:`FUSED` passes them on), so the gradients of a query and its biases return through this
    op, not by a select of the parameters per read. ``bias``: (detail-bias rows (m, K) or None,
    the sources' kind codes (n,) or None) from the schedule (``Phases.bias_rows``), or an (m, n)
    bias, or None. A pool of one source gives that source's views as the outputs (``lean.phase1``).
    ``scope`` is unused: the recompute is inside the kernels."""
    m, n = q.shape[0], len(values)
    rows, codes = _rows_and_codes(bias, n)
    out = phase1_op(list(values), q, rows, codes, valid, n > 1, write_q)
    o = tuple(out[:m]) if n > 1 else tuple(values[0].view_as(values[0]) for _ in range(m))
    stats = out[m:] if n > 1 else out
    return o, tuple(x.detach() for x in stats[:m]), tuple(stats[m:2 * m]), tuple(stats[2 * m:-1])


def readout(q: Tensor, bias, values: Sequence[Tensor], inv: Sequence[Tensor], valid: Tensor | None,
            scope: object = None) -> Tensor:
    """:func:`routers.block.phases.readout` as one query of :func:`phase1`; ``bias`` (its detail-bias
    row (K,), the kind codes) or an (n,) bias, or None."""
    if isinstance(bias, tuple):
        bias = (None if bias[0] is None else bias[0][None], bias[1])
    elif bias is not None:
        bias = bias[None]
    return phase1(q[None], bias, values, inv, valid, scope, write_q=False)[0][0]


def merge(o: Tensor, mx: Tensor, s: Tensor, q: Tensor, P: Tensor, details: list[Tensor],
          bias: Tensor | None, max_detail_scale: float, updates: Sequence[Tensor] = (),
          coefs: int | Tensor = 0, kinds: slice = slice(0, 0), n_kinds: int = 0, scope: object = None) -> Tensor:
    """:func:`routers.block.phases.merge` through ``fused_phase2``; ``updates`` (oldest first),
    ``coefs`` (bits of ``n_kinds`` kinds, or a (p, K) tensor) and ``kinds`` as
    :func:`routers.block.lean.merge` takes them."""
    b = None if bias is None or not details else bias
    o, P, *rest = distinct([o, P, *details, *updates])
    details, updates = rest[:len(details)], rest[len(details):]
    coef_t, bits = (coefs, 0) if isinstance(coefs, Tensor) else (None, int(coefs))
    return phase2_op(o, mx, s, q, P, list(details), b, list(updates), coef_t, bits, kinds.start, n_kinds,
                     float(max_detail_scale))


def chain(o: Tensor, mx: Tensor, s: Tensor, q: Tensor, P: Tensor, u: Tensor, running: Sequence[Tensor],
          bias: Tensor | None, max_detail_scale: float, updates: Sequence[Tensor], coefs: int, kinds: slice,
          n_kinds: int, signs: Sequence[int]) -> tuple[Tensor, Tensor, tuple[Tensor, ...]]:
    """(h, P + u, (D_j ± u)): :func:`merge` of the next read, seeing the details of ``kinds``, with the
    block's running sums P + u and every running detail D_j + signs[j]·u (``running``, all kinds,
    before u) made inside the kernel (``fused_phase2_chain``), so each sum has one consumer, forward
    and backward; ``updates`` (oldest first) end with u, ``coefs`` their coefficient bits."""
    seen = kinds.stop - kinds.start
    b = None if bias is None or not seen else bias
    o, P, u, *rest = distinct([o, P, u, *running, *updates])
    running, updates = rest[:len(running)], rest[len(running):]
    csign = sum(1 << j for j, c in enumerate(signs) if c > 0)
    h, P, *D = phase2_chain_op(o, mx, s, q, P, u, list(running), b, list(updates), None, int(coefs), kinds.start,
                               n_kinds, float(max_detail_scale), seen, csign)
    return h, P, tuple(D)


#: ``fused``: the two-phase schedule through the custom ops above (it keeps the block's updates,
#: as ``lean``, to rebuild P and the details in phase 2's backward; its phase 1 passes each
#: query on to phase 2; a write inside a block makes the next read's merge with the running sum).
FUSED = Phases(inv_rms, phase1, merge, readout, keeps_updates=True, passes_queries=True, match=rms_match,
               chain=chain, bias_rows=True)


def _reason() -> str | None:
    """None when Triton imports and CUDA is here or Triton's interpreter is on, else why not."""
    if importlib.util.find_spec("triton") is None:
        return "triton is not installed: pip install -e '.[kernels]' in the checkout (make test-kernels does)"
    if torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1":
        return None
    return ("impl fused: no CUDA device here (Triton kernels: set TRITON_INTERPRET=1 to run them on CPU "
            "through Triton's interpreter, slowly, at test sizes)")


def _check(r) -> None:
    """:func:`routers.block.fused_launch.check_router` on a built router's width, longest block and
    detail kinds."""
    check_router(r.d_model, max(slot.block_len for slot in r.slots), r.plan.K)


def _parity_tokens(tokens: int, device: str) -> int | None:
    """On CUDA, the case's own B·T and at least 2 × ``MAX_PROGRAMS`` + 1 rows, so its kernels run
    the row loop and the tuned configs they will be timed with (phase 2's backward takes several
    rows per program past ``MAX_PROGRAMS`` rows, and the autotuner keys on the row bucket)."""
    return max(tokens, 2 * MAX_PROGRAMS + 1) if device == "cuda" else None


IMPL = Impl("fused", ("block_attnres", "haares", "wav_v1"), "two_phase", phases=FUSED, backward="recompute",
            devices=("cuda",), dtypes=("float32", "bfloat16"), probe=_reason, interpretable=True,
            conventions=BUILTIN_NOTE + ": the two-phase schedule in Triton kernels (routers/block/"
            "fused_kernels*.py) as torch.library custom ops: phase 1 over the pool passed as a tuple of "
            "pointers (each key's inverse RMS computed where its row is loaded), phase 2's merge (through which "
            "a block's running sums pass), the RMS matching of the details; float32 accumulation, no TF32; the "
            "backward recomputes from the sources, the block's updates and float32 statistics", builtin=True,
            no_layer_scope=None, check=_check,
            state=StateModel(phase1=True, keeps_updates=True, key_rms_cached=False, query_copies=True),
            parity_tokens=_parity_tokens)
