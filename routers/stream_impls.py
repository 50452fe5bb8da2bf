"""The stream family's plug-in points (``routers/impls.py``, family ``stream``): how a peer's
callables replace parts of :class:`routers.hyper.StreamRouter` (``shc``, ``dhc``, ``mhc``).

With ``impl="naive"`` the router runs its own region methods and nothing here is called. A peer
impl runs the router contract through :func:`init_state`, :func:`read`, :func:`write` and
:func:`output` on the schedule it declares; every point it leaves out runs ours. Shapes: streams
X (B, T, n, d) in the model's dtype; update u (B, T, d); k the sublayer index (0 … 2L−1).

``schedule="naive"`` (the coefficients of sublayer k are computed once, from the X it reads, and
carried in the state as ours are):

- ``coefficients(router, k, x) -> Coefficients``: (a (B, T, n), W (B, T, n, n) with W_ts the
  weight of input stream s in output stream t, c (B, T, n)), float32 for 16-bit streams;
- ``pre_mix(x, a) -> h``: h = Σ_s a_s X_s, (B, T, d) in x's dtype;
- ``post_res(x, w, c, u) -> x'``: X'_t = Σ_s W_ts X_s + c_t u, (B, T, n, d) in x's dtype.

``schedule="width_depth"`` (HC paper App. J, Alg. 2; the streams stay in the peer's own layout
``xs`` from ``expand`` to ``reduce``):

- ``expand(router, e) -> xs``: the n streams of the embedding e (B, T, d);
- ``width(router, k, xs) -> (h, mixed, c)``: sublayer k's branch input h (B, T, d), the mixed
  streams W X (peer layout) and whatever ``depth`` needs of the write weights (``c``);
- ``depth(router, k, mixed, c, u) -> xs'``: the streams after sublayer k;
- ``reduce(router, xs) -> h_out``: the readout (B, T, d) (``readout="sum"`` or ``"mean"``).

The state and coefficient tuples of every stream router (:class:`StreamState`,
:class:`Coefficients`) live here too (``routers.hyper`` re-exports them), so this module imports
nothing of ``routers.hyper``. No peer has a region form (``--compile-scope layer`` refuses them before any work).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from .base import Router, Slot
from .errors import ConfigError


class Coefficients(NamedTuple):
    """The mixing of one sublayer, per token (or static: without the leading (B, T)).

    Attributes:
        a: read weights a_s, (B, T, n), float32 (float64 in a float64 model).
        w: stream mix W_ts (output t, input s), (B, T, n, n).
        c: write weights c_t of the update, (B, T, n).
    """

    a: Tensor
    w: Tensor
    c: Tensor


class StreamState(NamedTuple):
    """Router state between sublayers.

    Attributes:
        x: the n streams X, (B, T, n, d) in the model's dtype (at init an expanded view of e).
        coef: the next sublayer's :class:`Coefficients` (dynamic routers), or None (``shc``, and
            after the last sublayer).
        h: a ``width_depth`` peer's branch input of the next sublayer (B, T, d); ``x`` is then the
            mixed streams in the peer's layout and ``coef`` what its depth connection needs
            (``routers/stream_impls.py``). None otherwise.
    """

    x: Tensor
    coef: Coefficients | None
    h: Tensor | None = None


def resolve(router: Router, impl: str) -> tuple[str, dict]:
    """The schedule and plug-in callables of ``impl`` for ``router`` (({}) for ``naive``).

    Raises:
        ConfigError: ``impl`` is not an implementation of the router (naming the known ones).
    """
    from . import impls
    known = [i.name for i in impls.impls_for(router.name)]
    if impl not in known:
        raise ConfigError(f"impl {impl!r} is not an implementation of {router.name}; choose one of {tuple(known)}")
    spec = impls.get(impl, router.name)
    if spec.builtin:
        return "naive", {}
    points = impls.FAMILIES["stream"].points[spec.schedule]
    return spec.schedule, {p: spec.point(p) for p in points if spec.point(p) is not None}


def _coefficients(r: Router, k: int, x: Tensor) -> Coefficients:
    hook = r.peer.get("coefficients")
    return hook(r, k, x) if hook is not None else r.coefficients(x, r.next_params(k))


def _pre_mix(r: Router, x: Tensor, a: Tensor) -> Tensor:
    hook = r.peer.get("pre_mix")
    if hook is not None:
        return hook(x, a)
    return torch.einsum("btsd,bts->btd" if a.dim() == 3 else "btsd,s->btd", x, a.to(x.dtype))


def _post_res(r: Router, x: Tensor, w: Tensor, c: Tensor, u: Tensor) -> Tensor:
    hook = r.peer.get("post_res")
    if hook is not None:
        return hook(x, w, c, u)
    mix = "btsd,btos->btod" if w.dim() == 4 else "btsd,os->btod"
    return torch.einsum(mix, x, w.to(x.dtype)) + c.to(x.dtype).unsqueeze(-1) * u.unsqueeze(-2)


def init_state(r: Router, embedding: Tensor) -> StreamState:
    """X⁰ and sublayer 0's coefficients (naive schedule) or its width connection (width_depth)."""
    if r.peer_schedule == "width_depth":
        h, mixed, c = r.peer["width"](r, 0, r.peer["expand"](r, embedding))
        return StreamState(mixed, c, h)
    x = embedding.unsqueeze(-2).expand(*embedding.shape[:-1], r.n, embedding.shape[-1])
    return StreamState(x, _coefficients(r, 0, x))


def read(r: Router, state: StreamState, slot: Slot) -> Tensor:
    """h_k: the width connection's branch input, or ``pre_mix`` of the carried coefficients."""
    if r.peer_schedule == "width_depth":
        return state.h
    return _pre_mix(r, state.x, state.coef.a)


def write(r: Router, state: StreamState, slot: Slot, update: Tensor) -> StreamState:
    """The streams after sublayer k, with sublayer k+1's coefficients (none after the last)."""
    k, last = slot.index, slot.index == len(r.slots) - 1
    if r.peer_schedule == "width_depth":
        xs = r.peer["depth"](r, k, state.x, state.coef, update)
        return StreamState(xs, None) if last else StreamState(*_wd(r.peer["width"](r, k + 1, xs)))
    x = _post_res(r, state.x, state.coef.w, state.coef.c, update)
    return StreamState(x, None if last else _coefficients(r, k + 1, x))


def _wd(width_out: tuple) -> tuple:
    h, mixed, c = width_out
    return mixed, c, h


def output(r: Router, state: StreamState) -> Tensor:
    """h_out (B, T, d): the peer's ``reduce`` (width_depth), else the sum or mean of the streams."""
    if r.peer_schedule == "width_depth":
        return r.peer["reduce"](r, state.x)
    return state.x.sum(-2) if r.readout == "sum" else state.x.mean(-2)
