"""The two phases of the two-phase schedule in plain autograd (Attention Residuals,
arXiv:2603.15031, the inference schedule of Block AttnRes; used here for training too), over
the sources of :class:`routers.block.state.TwoPhaseState`.

The pseudo-queries are parameters, not activations, so when a block starts all m queries of its
sublayers are known and the completed sources cannot change until the block ends:

- **Phase 1** (:func:`phase1`, once per block): one batched pass of the block's m pseudo-queries
  over the completed sources, returning per query the normalised partial output ``o``
  (m, B, T, d), the running max ``μ`` and the sum of exponentials ``s`` (each (m, B, T), float32
  whatever the tensor dtype). A key is never materialised: w·RMSNorm(V) = (w·V)·rsqrt(mean(V²) + ε),
  so each completed source caches only its inverse RMS (:func:`inv_rms`), computed once when it
  enters the pool.
- **Phase 2** (:func:`merge`, per sublayer at position p ≥ 1): the partial-block sources (P and
  its visible details) are merged into phase 1's result by online softmax:

      λ_p = μ_p + log s_p  (phase 1's log-sum-exp),  (w_o, w_j) = softmax(λ_p, ℓ_j)
      h = w_o·o_p + Σ_j w_j S_j

  the online-softmax merge M = max(μ_p, ℓ_j), a_0 = s_p·exp(μ_p − M), a_j = exp(ℓ_j − M),
  h = (a_0·o_p + Σ_j a_j S_j)/(a_0 + Σ_j a_j), in one softmax op. At p = 0 the read is ``o_0``
  itself. With a single partial source (Block AttnRes) w_o = sigmoid(λ_p − ℓ_P) and the merge is
  one ``lerp``: h = P + w_o·(o_p − P).
- The readout (:func:`readout`) is one more query over the completed sources.

A key-norm gain g folds into the query: w·RMSNorm_g(V) = (g ⊙ w)·RMSNorm(V), so the cached inverse
RMS needs no gain. The maxima are detached: softmax is invariant to the shift, so its gradient is
zero. A pad of the layer scope's pool (``valid`` False) gets a −inf logit. The result equals the
naive reference (``routers.mixer.depth_mix``) to float rounding, forward and backward
(tests/test_two_phase.py).

``routers/block/lean.py`` gives the same four functions, with the same signatures, as custom
autograd Functions with a memory-lean backward; a peer of the schedule (``routers/impls.py``)
gives its own :func:`phase1` and :func:`merge`.
"""

from __future__ import annotations

import contextlib
from typing import Callable, ContextManager, NamedTuple, Sequence

import torch
from torch import Tensor

from ..mixer import EPS, softmax_dtype


def inv_rms(v: Tensor) -> Tensor:
    """``rsqrt(mean(v²) + ε)`` over d: (B, T, d) → (B, T), in the softmax dtype (one read of v)."""
    acc = softmax_dtype(v.dtype)
    ms = torch.linalg.vector_norm(v, dim=-1, dtype=acc).square() / v.shape[-1]
    return torch.rsqrt(ms + EPS)


def autocast_off(device_type: str) -> ContextManager:
    """Autocast off on ``device_type``, or nothing where autocast does not know the device (meta:
    a step counted, not run, ``harness.costs.step_costs``)."""
    try:
        torch.is_autocast_enabled(device_type)
    except RuntimeError:
        return contextlib.nullcontext()
    return torch.autocast(device_type, enabled=False)


def exact_matmul(t: Tensor) -> ContextManager:
    """Phase 1's contractions in the sources' own dtype, also inside an autocast region: the
    schedule takes its dots in the input dtype (ROUTERS.md, "Precision"), which an einsum kept
    (autocast does not reach inside it) and a plain ``matmul`` would cast to the autocast dtype.
    Outside autocast, nothing: a compiled region that enters an autocast context is not cached
    by AOTAutograd ("Unsupported call_function target _enter_autocast")."""
    dev = t.device.type
    try:
        on = torch.is_autocast_enabled(dev)
    except RuntimeError:  # a device autocast does not know (meta: a step counted, not run)
        on = False
    return torch.autocast(dev, enabled=False) if on else contextlib.nullcontext()


def phase1(q: Tensor, bias: Tensor | None, values: Sequence[Tensor], inv: Sequence[Tensor],
           valid: Tensor | None, scope: Callable[[], ContextManager] | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """m queries over n completed sources in one batched pass.

    Args:
        q: (m, d) the block's pseudo-queries, key gain folded in.
        bias: (m, n) logit bias of each query over each source, or None.
        values: n sources (B, T, d); inv: their inverse RMS (B, T).
        valid: (n,) bool, False for a pad (layer scope), or None.
        scope: where a backward that recomputes runs its recompute (``lean``: a FLOP counter
            sets the router's ``recompute_scope``); plain autograd has none and ignores it.

    Returns:
        o (m, B, T, d) normalised partial outputs, μ (m, B, T) maxima, s (m, B, T) sums of
        exponentials; μ and s in the softmax dtype. Under the layer scope (``valid`` given) each
        is contiguous: every region that makes them must leave them in one layout.
    """
    V = torch.stack(tuple(values), dim=2)                             # (B, T, n, d)
    with exact_matmul(V):
        dots = torch.matmul(V, q.t())                                 # (B, T, n, m)
    logits = dots.to(softmax_dtype(V.dtype)) * torch.stack(tuple(inv), dim=-1).unsqueeze(-1)
    if bias is not None:
        logits = logits + bias.t()
    if valid is not None:
        logits = logits.masked_fill(valid.logical_not().unsqueeze(-1), float("-inf"))
    mx = logits.amax(dim=2, keepdim=True).detach()                    # (B, T, 1, m)
    p = torch.exp(logits - mx)
    s = p.sum(dim=2, keepdim=True)
    with exact_matmul(V):
        o = torch.matmul((p / s).to(V.dtype).mT, V)                  # (B, T, m, d)
    o, mx, s = o.movedim(2, 0), mx.squeeze(2).movedim(-1, 0), s.squeeze(2).movedim(-1, 0)
    if valid is not None:
        return o.contiguous(), mx.contiguous(), s.contiguous()
    return o, mx, s


def merge(o: Tensor, mx: Tensor, s: Tensor, q: Tensor, P: Tensor, details: list[Tensor],
          bias: Tensor | None, max_detail_scale: float, updates: Sequence[Tensor] = (),
          coefs: int | Tensor = 0, kinds: slice = slice(0, 0), n_kinds: int = 0,
          scope: Callable[[], ContextManager] | None = None) -> Tensor:
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
        updates, coefs, kinds, n_kinds: what ``lean``'s merge rebuilds P and the details from
            (:func:`routers.block.lean.merge`); unused here, as ``scope`` (:func:`phase1`).

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


def readout(q: Tensor, bias: Tensor | None, values: Sequence[Tensor], inv: Sequence[Tensor],
            valid: Tensor | None, scope: Callable[[], ContextManager] | None = None) -> Tensor:
    """h_out (B, T, d): one query q (d,) over n ≥ 2 completed sources with their cached inverse
    RMS; ``bias`` (n,) or None; ``valid`` (n,) and ``scope`` as :func:`phase1`."""
    V = torch.stack(tuple(values))
    dots = torch.matmul(V, q)                                         # (n, B, T)
    logits = dots.to(softmax_dtype(V.dtype)) * torch.stack(tuple(inv))
    if bias is not None:
        logits = logits + bias.view(-1, 1, 1)
    if valid is not None:
        logits = logits.masked_fill(valid.logical_not().view(-1, 1, 1), float("-inf"))
    alpha = torch.softmax(logits, dim=0).to(V.dtype)
    return torch.einsum("nbt,nbtd->btd", alpha, V)


def distinct(tensors: list[Tensor]) -> list[Tensor]:
    """``tensors`` with every repeat of an object replaced by a view of it: at p = 1, P is u_0 (and
    so is a +1 detail), and Dynamo cannot trace a Function given one tensor twice. Compared with
    ``is``, never ``id()``: under the layer scope Dynamo would guard a region on the ids of its
    inputs, which are new objects at every step."""
    out: list[Tensor] = []
    for t in tensors:
        out.append(t.view_as(t) if any(t is x for x in tensors[:len(out)]) else t)
    return out


class Phases(NamedTuple):
    """The math a two-phase router runs (``routers/block/two_phase.py``), one signature for every
    implementation: :func:`inv_rms`, :func:`phase1`, :func:`merge`, :func:`readout`, and what the
    schedule does differently for it:

    - ``keeps_updates``: its merge rebuilds P and the details from the block's updates (``lean``),
      which the state then keeps;
    - ``passes_queries``: its phase 1 returns a fourth tuple, the m queries as phase 2 is to take
      them (``fused``: copies whose gradients return through phase 1's backward), which the state
      keeps in place of a select of the parameter per read;
    - ``match(D, C, ρ)``: its own RMS matching of a completed block's detail to its C
      (``routers.mixer.rms_match``; None: the router's);
    - ``chain``: :func:`merge` of the next read that also adds the update to the running sums and
      returns (h, P + u, (D_j ± u)), which a write inside a block runs (eager and model scope) so each
      running sum has one consumer;
    - ``bias_rows``: phase 1 and the readout take their bias as (the reads' detail-bias rows, the
      sources' kind codes) rather than an (m, n) bias; with ``passes_queries``, phase 2 finds its
      detail biases in the query phase 1 passed on.
    """

    inv_rms: Callable[[Tensor], Tensor]
    phase1: Callable[..., tuple]
    merge: Callable[..., Tensor]
    readout: Callable[..., Tensor]
    keeps_updates: bool = False
    passes_queries: bool = False
    match: Callable[[Tensor, Tensor, float], Tensor] | None = None
    chain: Callable[..., tuple] | None = None
    bias_rows: bool = False


#: ``two_phase``: plain autograd of the functions above.
PLAIN = Phases(inv_rms, phase1, merge, readout)
