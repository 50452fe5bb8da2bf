"""The n-stream routers' base (Hyper-Connections, Zhu et al., arXiv:2409.19606; mHC, DeepSeek-AI,
arXiv:2512.24880): :class:`StreamRouter`, its state and coefficients, and the plug-in points of
their peers. ``routers/hyper.py`` (``shc``, ``dhc``) and ``routers/mhc.py`` (``mhc``) state each
router's coefficients. Specification: docs/BASELINES.md ("Stream routers").

The state is n copies of the residual stream, X of shape (B, T, n, d), stream-major (x̃ = vec(X)
holds stream i at i·d … i·d+d−1). Sublayer k reads h_k = Σ_s a_s X_s and writes
X'_t = Σ_s W_ts X_s + c_t u_k; the readout is h_out = Σ_s X_s (``readout="sum"``, the HC paper) or
their mean. The coefficients (a, W, c) of sublayer k come from X before it, once: static
parameters (``shc``), or computed from X in ``init_state`` / ``write(k−1)`` and carried in the state
to ``read(k)`` and ``write(k)`` (``dhc``, ``mhc``), in promote(dtype, float32) with autocast off,
applied in the stream's dtype. Every stream router keeps its parameters in float32 when the decoder
is cast to a 16-bit dtype (:meth:`StreamRouter._apply`).

One form under every scope (DESIGN.md, "The router contract"): a slot's params are the static
coefficients of its sublayer (``shc``) or the parameters of the next sublayer (``dhc``, ``mhc``);
the last MLP is a role of its own (it computes no next coefficients), so the layer scope's
regions do not grow with depth.

**Plug-in points** (``routers/impls.py``, family ``stream``). With ``impl="naive"`` nothing of them
is called. A peer impl runs the contract through :func:`peer_init_state`, :func:`peer_read`,
:func:`peer_write` and :func:`peer_output` on the schedule it declares; every point it leaves out
runs ours. Shapes: streams X (B, T, n, d) in the model's dtype; update u (B, T, d); k the sublayer
index (0 … 2L−1).

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

No peer has a region form (``--compile-scope layer`` refuses them before any work).
"""

from __future__ import annotations

import abc
import contextlib
from typing import NamedTuple

import torch
from torch import Tensor

from .base import Router, Slot
from .errors import ConfigError
from . import reference as _ref

_LOW = (torch.float16, torch.bfloat16)


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """promote(dtype, float32): float32 for 16-bit streams, float64 for float64 (decided in
    Python: a ``promote_types`` call is a dispatched op)."""
    return torch.float32 if dtype.is_floating_point and dtype.itemsize < 4 else dtype


def full_precision(x: Tensor):
    """A context with autocast off on ``x``'s device when autocast is on there (else a no-op)."""
    kind = x.device.type
    try:
        on = torch.is_autocast_enabled(kind)
    except RuntimeError:  # a device autocast does not know (meta: a step counted, not run)
        on = False
    return torch.autocast(kind, enabled=False) if on else contextlib.nullcontext()


def check_choice(name: str, value, choices: tuple) -> None:
    """Raises ConfigError naming the option when ``value`` is not one of ``choices``."""
    if value not in choices:
        raise ConfigError(f"{name} must be one of {', '.join(repr(c) for c in choices)}, got {value!r}")


class StreamRouter(Router):
    """Base of the n-stream routers (docs/BASELINES.md, "Stream routers").

    Subclasses set ``dynamic`` and implement :meth:`next_params` and :meth:`coefficients` (and
    :meth:`coefficient_flops` for the cost model).

    Args:
        d_model: width d.
        n_layers: transformer layers L.
        n: streams (≥ 1).
        readout: ``"sum"`` (h_out = Σ_s X_s, the HC paper) or ``"mean"``.
        impl: ``"naive"`` (ours) or a peer of the stream family (``routers/impls.py``,
            the plug-in points below: lucidrains' ``hyper-connections`` for shc / dhc,
            Liger's mHC ops for mhc).

    Raises:
        ConfigError: ``n`` < 1 or not an integer, an unknown ``readout`` or ``impl``.
    """

    #: whether the coefficients depend on X (carried in the state) or are static parameters
    dynamic: bool = True

    def __init__(self, d_model: int, n_layers: int, *, n: int = 4, readout: str = "sum",
                 impl: str = "naive") -> None:
        super().__init__(d_model, n_layers)
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ConfigError(f"n (streams) must be an integer ≥ 1, got {n!r}")
        check_choice("readout", readout, ("sum", "mean"))
        self.n, self.readout = n, readout
        #: the impl; its schedule and plug-in callables (empty for naive: the region methods run)
        self.impl = impl
        self.peer_schedule, self.peer = resolve(self, impl)
        #: the schedule the cost models describe (a peer costs what ours costs)
        self.schedule = "naive"

    def home(self, k: int) -> int:
        """The home stream of sublayer k: k mod n (BASELINES.md)."""
        return k % self.n

    # --- parameters stay float32 in a 16-bit decoder -------------------------------------------
    def _apply(self, fn, recurse=True):
        """``Module._apply`` (``.to``, ``.half()`` …) that keeps this router's parameters in
        float32 when ``fn`` casts them to float16 or bfloat16 (moves and other casts apply): the
        coefficients are computed in float32 (Megatron-LM#6172: bf16 Sinkhorn drifts)."""
        if fn(torch.zeros((), dtype=torch.float32)).dtype not in _LOW:    # a move or a wide cast
            return super()._apply(fn, recurse)
        kept = {name: p.detach().clone() for name, p in self.named_parameters()}
        super()._apply(fn, recurse)
        for name, p in self.named_parameters():
            if p.dtype in _LOW:
                p.data = kept[name].to(device=p.device, dtype=torch.float32)
                if p.grad is not None:
                    p.grad = p.grad.to(torch.float32)
        return self

    # --- the contract ------------------------------------------------------------------------
    @abc.abstractmethod
    def next_params(self, k: int) -> tuple:
        """The tensors sublayer k's coefficients are made of (a static router: its (a (n,),
        W (n, n), c (n,)) themselves), taken outside any compiled region."""

    @abc.abstractmethod
    def coefficients(self, x: Tensor, params: tuple) -> Coefficients:
        """(a, W, c) of a sublayer from the streams X (B, T, n, d) before it and that sublayer's
        :meth:`next_params`; a dynamic router computes them in promote(dtype, float32)."""

    def init_state(self, embedding: Tensor, region: bool = False) -> StreamState:
        """X⁰ = n copies of e ((B, T, n, d)), with sublayer 0's coefficients: an expanded view, or
        under the layer scope (``region``) a contiguous copy, so that every region reads a state of
        the same strides at every slot (a view's strides would recompile the first region)."""
        if self.peer:
            return peer_init_state(self, embedding)
        x = embedding.unsqueeze(-2).expand(*embedding.shape[:-1], self.n, embedding.shape[-1])
        x = x.contiguous() if region else x
        coef = self.coefficients(x, self.next_params(0)) if self.dynamic else None
        return StreamState(x, coef)

    def role(self, slot: Slot) -> tuple:
        """``("last",)`` for a dynamic router's last sublayer (no next coefficients), else ``()``."""
        return ("last",) if self.dynamic and slot.index == len(self.slots) - 1 else ()

    def params(self, state: StreamState, slot: Slot, region: bool = False) -> tuple:
        """``shc``: (a, W, c) of the slot's sublayer; dynamic routers: the next sublayer's
        parameters (:meth:`next_params`), or () after the last. A peer's: the slot itself (its
        hooks take the sublayer index; it runs under the model scope only)."""
        if self.peer:
            return (slot,)
        if not self.dynamic:
            return self.next_params(slot.index)
        k = slot.index + 1
        return self.next_params(k) if k < len(self.slots) else ()

    def read(self, state: StreamState, role: tuple, params: tuple) -> Tensor:
        """h = Σ_s a_s X_s, (B, T, d), in the stream's dtype."""
        if self.peer:
            return peer_read(self, state, params[0])
        x = state.x
        if not self.dynamic:
            return torch.einsum("btsd,s->btd", x, params[0].to(x.dtype))
        return torch.einsum("btsd,bts->btd", x, state.coef.a.to(x.dtype))

    def write(self, state: StreamState, role: tuple, params: tuple, update: Tensor) -> StreamState:
        """X'_t = Σ_s W_ts X_s + c_t u, then the next sublayer's coefficients from X'."""
        if self.peer:
            return peer_write(self, state, params[0], update)
        x = state.x
        coef = state.coef if self.dynamic else self.coefficients(x, params)
        mix = "btsd,btos->btod" if self.dynamic else "btsd,os->btod"    # per token, or static
        x = torch.einsum(mix, x, coef.w.to(x.dtype)) + coef.c.to(x.dtype).unsqueeze(-1) * update.unsqueeze(-2)
        if not self.dynamic or role == ("last",):
            return StreamState(x, None)
        return StreamState(x, self.coefficients(x, params))

    def output(self, state: StreamState, params: tuple = ()) -> Tensor:
        """h_out = Σ_s X_s (``readout="sum"``) or their mean, (B, T, d)."""
        if self.peer:
            return peer_output(self, state)
        return state.x.sum(-2) if self.readout == "sum" else state.x.mean(-2)

    def reference(self, embedding: Tensor, updates: list[Tensor]) -> tuple[list[Tensor], Tensor]:
        """The float64 streams X carried through the 2L sublayers with per-stream loops
        (:func:`routers.reference.streams`; mhc gives its own coefficients)."""
        return _ref.streams(self, embedding, updates, getattr(self, "reference_coefficients", None))

    def check_region_form(self) -> None:
        if self.peer:
            raise NotImplementedError(f"impl {self.impl} of {self.name} has no region form for "
                                      "--compile-scope layer; use --compile-scope model")

    # --- cost models ---------------------------------------------------------------------------
    def coefficient_flops(self) -> int:
        """FLOP per token of one sublayer's coefficients (0 for static routers)."""
        return 0

    def analytic_fwd_flops(self, batch_size: int, seq_len: int) -> float:
        """Forward FLOP over B·T tokens (docs/FLOPS.md; BASELINES.md "Cost per token").

        Per token and sublayer: read Σ_s a_s X_s (2nd), stream mix Σ_s W_ts X_s (2n²d), c ⊗ u
        (nd) and the add (nd), plus :meth:`coefficient_flops` (2L computations: init_state and
        every write but the last); the readout's sum or mean over n streams: nd.
        """
        n, d = self.n, self.d_model
        per = 2 * n * d + 2 * n * n * d + 2 * n * d + self.coefficient_flops()
        return float(batch_size * seq_len * (len(self.slots) * per + n * d))

    def coefficient_elements(self) -> int:
        """Coefficients per token carried in the state: n²+2n (0 for static routers)."""
        return self.n * self.n + 2 * self.n if self.dynamic else 0

    def live_state_bytes(self, batch_size: int, seq_len: int, dtype: torch.dtype = torch.float32,
                         impl: str | None = None) -> int:
        """Peak router state between sublayers: the n streams, n·B·T·d elements of ``dtype``
        (after the first write; X⁰ is a view of e), plus for a dynamic router the next
        sublayer's coefficients, B·T·(n²+2n) elements of promote(dtype, float32)."""
        self._cost_impl(impl)
        dtype = dtype or torch.float32
        item = torch.empty((), dtype=dtype).element_size()
        citem = torch.empty((), dtype=compute_dtype(dtype)).element_size()
        tokens = batch_size * seq_len
        return tokens * (self.n * self.d_model * item + self.coefficient_elements() * citem)

    def ideal_io_per_token(self, schedule: int | None = None) -> float:
        """Ideal I/O per token and sublayer, units of d elements: read n + 1 (X in, h out), write
        2n + 1 (X and u in, X' out): 3n + 2 (14 at n = 4; prenorm 3). Coefficients are n²+2n
        scalars per token (not d-wide) and count 0, as the readout does in Table 1's model."""
        if schedule is not None:
            raise ValueError(f"{self.name} has no two-phase schedule; pass schedule=None")
        return 3.0 * self.n + 2.0

    def ideal_io_fwd_bwd_per_token(self) -> float:
        """6n + 5 (docs/ROUTERS.md, "The ideal fwd+bwd model"; 29 at n = 4): the forward's 3n + 2,
        and a backward that reads the gradients of X' and h (n + 1), re-reads X and u, which the
        coefficients' gradients need (n + 1), and writes the gradients of X and u (n + 1)."""
        return 6.0 * self.n + 5.0


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
            (the plug-in points below). None otherwise.
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


def peer_init_state(r: Router, embedding: Tensor) -> StreamState:
    """X⁰ and sublayer 0's coefficients (naive schedule) or its width connection (width_depth)."""
    if r.peer_schedule == "width_depth":
        h, mixed, c = r.peer["width"](r, 0, r.peer["expand"](r, embedding))
        return StreamState(mixed, c, h)
    x = embedding.unsqueeze(-2).expand(*embedding.shape[:-1], r.n, embedding.shape[-1])
    return StreamState(x, _coefficients(r, 0, x))


def peer_read(r: Router, state: StreamState, slot: Slot) -> Tensor:
    """h_k: the width connection's branch input, or ``pre_mix`` of the carried coefficients."""
    if r.peer_schedule == "width_depth":
        return state.h
    return _pre_mix(r, state.x, state.coef.a)


def peer_write(r: Router, state: StreamState, slot: Slot, update: Tensor) -> StreamState:
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


def peer_output(r: Router, state: StreamState) -> Tensor:
    """h_out (B, T, d): the peer's ``reduce`` (width_depth), else the sum or mean of the streams."""
    if r.peer_schedule == "width_depth":
        return r.peer["reduce"](r, state.x)
    return state.x.sum(-2) if r.readout == "sum" else state.x.mean(-2)
