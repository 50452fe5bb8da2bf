"""Hyper-Connections (Zhu et al., arXiv:2409.19606): the stream routers ``shc`` and ``dhc``, and
the base class of every n-stream router (``mhc``, ``routers/mhc.py``). Specification:
docs/BASELINES.md ("Stream routers").

The state is n copies of the residual stream, X of shape (B, T, n, d), stream-major (x̃ = vec(X)
holds stream i at i·d … i·d+d−1). Sublayer k reads h_k = Σ_s a_s X_s and writes
X'_t = Σ_s W_ts X_s + c_t u_k; the readout is h_out = Σ_s X_s (``readout="sum"``, the HC paper) or
their mean. The coefficients (a, W, c) of sublayer k come from X before it, once: static
parameters (``shc``), or computed from X in ``init_state`` / ``write(k−1)`` and carried in the state
to ``read(k)`` and ``write(k)`` (``dhc``, ``mhc``), in promote(dtype, float32) with autocast off,
applied in the stream's dtype. Every stream router keeps its parameters in float32 when the decoder
is cast to a 16-bit dtype (:meth:`StreamRouter._apply`).

Region form (layer compile scope): the state layout is the eager one; a slot's region takes the
static coefficients of its sublayer (``shc``) or the parameters of the next sublayer (``dhc``,
``mhc``) as tensors from :meth:`region_params`; the last MLP is a role of its own (it computes no
next coefficients), so the regions do not grow with depth.
"""

from __future__ import annotations

import abc
import contextlib

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from . import stream_impls
from .base import Router, Slot
from .errors import ConfigError
from .registry import register
from .stream_impls import Coefficients, StreamState

_LOW = (torch.float16, torch.bfloat16)


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """promote(dtype, float32): float32 for 16-bit streams, float64 for float64 (decided in
    Python: a ``promote_types`` call is a dispatched op)."""
    return torch.float32 if dtype.is_floating_point and dtype.itemsize < 4 else dtype


def full_precision(x: Tensor):
    """A context with autocast off on ``x``'s device when autocast is on there (else a no-op)."""
    kind = x.device.type
    if torch.is_autocast_enabled(kind):
        return torch.autocast(kind, enabled=False)
    return contextlib.nullcontext()


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
            ``routers/stream_impls.py``: lucidrains' ``hyper-connections`` for shc / dhc,
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
        self.peer_schedule, self.peer = stream_impls.resolve(self, impl)
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

    def init_state(self, embedding: Tensor) -> StreamState:
        """X⁰ = n copies of e (an expanded view, (B, T, n, d)), with sublayer 0's coefficients."""
        if self.peer:
            return stream_impls.init_state(self, embedding)
        x = embedding.unsqueeze(-2).expand(*embedding.shape[:-1], self.n, embedding.shape[-1])
        coef = self.coefficients(x, self.next_params(0)) if self.dynamic else None
        return StreamState(x, coef)

    def read(self, state: StreamState, slot: Slot) -> Tensor:
        if self.peer:
            return stream_impls.read(self, state, slot)
        return self.region_read(state, self.region_role(slot), self.region_params(state, slot))

    def write(self, state: StreamState, slot: Slot, update: Tensor) -> StreamState:
        if self.peer:
            return stream_impls.write(self, state, slot, update)
        return self.region_write(state, self.region_role(slot), self.region_params(state, slot), update)

    def output(self, state: StreamState) -> Tensor:
        """h_out = Σ_s X_s (``readout="sum"``) or their mean, (B, T, d)."""
        if self.peer:
            return stream_impls.output(self, state)
        return state.x.sum(-2) if self.readout == "sum" else state.x.mean(-2)

    # --- regions -------------------------------------------------------------------------------
    def region_role(self, slot: Slot) -> tuple:
        """``("last",)`` for a dynamic router's last sublayer (no next coefficients), else ``()``."""
        return ("last",) if self.dynamic and slot.index == len(self.slots) - 1 else ()

    def region_params(self, state: StreamState, slot: Slot) -> tuple:
        """``shc``: (a, W, c) of the slot's sublayer; dynamic routers: the next sublayer's
        parameters (:meth:`next_params`), or () after the last."""
        if not self.dynamic:
            return self.next_params(slot.index)
        k = slot.index + 1
        return self.next_params(k) if k < len(self.slots) else ()

    def region_read(self, state: StreamState, role: tuple, params: tuple) -> Tensor:
        """h = Σ_s a_s X_s, (B, T, d), in the stream's dtype."""
        x = state.x
        if not self.dynamic:
            return torch.einsum("btsd,s->btd", x, params[0].to(x.dtype))
        return torch.einsum("btsd,bts->btd", x, state.coef.a.to(x.dtype))

    def region_write(self, state: StreamState, role: tuple, params: tuple, update: Tensor) -> StreamState:
        """X'_t = Σ_s W_ts X_s + c_t u, then the next sublayer's coefficients from X'."""
        x = state.x
        coef = state.coef if self.dynamic else self.coefficients(x, params)
        mix = "btsd,btos->btod" if self.dynamic else "btsd,os->btod"    # per token, or static
        x = torch.einsum(mix, x, coef.w.to(x.dtype)) + coef.c.to(x.dtype).unsqueeze(-1) * update.unsqueeze(-2)
        if not self.dynamic or role == ("last",):
            return StreamState(x, None)
        return StreamState(x, self.coefficients(x, params))

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


@register("shc")
class StaticHyperConnections(StreamRouter):
    """Static Hyper-Connections (arXiv:2409.19606, Eqs. 10–11): a, W and c are parameters.

    Per sublayer k: ``static_alpha`` α (n, n+1) = [A_m | A_r] (row s = input stream: a_s = α[s, 0],
    W_ts = α[s, 1+t]) and ``static_beta`` β (n) (c = β). Init (PreNorm-equivalent):
    A_m = e_{k mod n}, A_r = I, β = 1, so every read is prenorm's h_k bitwise and h_out = n·h_out
    of prenorm (``readout="sum"``). Parameters per sublayer: n² + 2n.

    Args:
        n: streams (default 4).
        readout: ``"sum"`` or ``"mean"``.

    Raises:
        ConfigError: an invalid option.
    """

    dynamic = False

    def __init__(self, d_model: int, n_layers: int, *, n: int = 4, readout: str = "sum",
                 impl: str = "naive") -> None:
        super().__init__(d_model, n_layers, n=n, readout=readout, impl=impl)
        self._static_init()

    def _static_init(self) -> None:
        n, K = self.n, 2 * self.n_layers
        alpha = torch.zeros(K, n, n + 1)
        for k in range(K):
            alpha[k, self.home(k), 0] = 1.0
            alpha[k, :, 1:] = torch.eye(n)
        self.static_alpha = nn.Parameter(alpha)
        self.static_beta = nn.Parameter(torch.ones(K, n))

    def next_params(self, k: int) -> Coefficients:
        """Sublayer k's static (a (n,), W (n, n), c (n,)): views of α and β."""
        alpha = self.static_alpha[k]
        return Coefficients(alpha[:, 0], alpha[:, 1:].transpose(0, 1), self.static_beta[k])

    def coefficients(self, x: Tensor, params: tuple) -> Coefficients:
        """The static coefficients themselves (they do not depend on X)."""
        return Coefficients(*params)

    def options(self) -> dict:
        return {"n": self.n, "readout": self.readout}


@register("dhc")
class DynamicHyperConnections(StaticHyperConnections):
    """Dynamic Hyper-Connections (arXiv:2409.19606, Eqs. 12–13, App. J Alg. 2).

    Per sublayer k, from the streams X before it: H̄_s = norm(X_s) over d (LayerNorm with gain g
    and bias, ε = ``dyn_norm_eps``; or RMSNorm x/√(mean x²+ε)·g), α = α⁰ + s_α·tanh(H̄ W_α),
    β = B + s_β·tanh(H̄ W_β), with W_α (d, n+1) (``dynamic_alpha_fn``), W_β (d)
    (``dynamic_beta_fn``), scalars s_α, s_β (``dynamic_alpha_scale``, ``dynamic_beta_scale``);
    then a, W, c as in ``shc``. Init: W = 0, s = 0.01, g = 1, bias 0 (so the router starts as
    ``shc`` at its init). Parameters per sublayer: n² + 2n + (n+4)·d + 2 (LayerNorm), one d fewer
    with RMSNorm. lucidrains' ``hyper-connections`` norm x·√d/‖x‖·(1+γ) is ``dyn_norm="rmsnorm",
    dyn_norm_eps=0`` with g = 1 + γ.

    Args:
        n: streams (default 4).
        readout: ``"sum"`` or ``"mean"``.
        tanh: apply tanh to the dynamic projections (Eq. 12; default True).
        dyn_norm: ``"layernorm"`` (Alg. 2) or ``"rmsnorm"``.
        dyn_norm_eps: the norm's ε (≥ 0; default 1e-5, Alg. 2).

    Raises:
        ConfigError: an invalid option.
    """

    dynamic = True

    def __init__(self, d_model: int, n_layers: int, *, n: int = 4, readout: str = "sum",
                 tanh: bool = True, dyn_norm: str = "layernorm", dyn_norm_eps: float = 1e-5,
                 impl: str = "naive") -> None:
        super().__init__(d_model, n_layers, n=n, readout=readout, impl=impl)
        check_choice("dyn_norm", dyn_norm, ("layernorm", "rmsnorm"))
        if not dyn_norm_eps >= 0:
            raise ConfigError(f"dyn_norm_eps must be ≥ 0, got {dyn_norm_eps!r}")
        self.tanh, self.dyn_norm, self.dyn_norm_eps = bool(tanh), dyn_norm, float(dyn_norm_eps)
        K, d = 2 * n_layers, d_model
        self.dynamic_alpha_fn = nn.Parameter(torch.zeros(K, d, n + 1))
        self.dynamic_beta_fn = nn.Parameter(torch.zeros(K, d))
        self.dynamic_alpha_scale = nn.Parameter(torch.full((K,), 0.01))
        self.dynamic_beta_scale = nn.Parameter(torch.full((K,), 0.01))
        self.norm_weight = nn.Parameter(torch.ones(K, d))
        self.norm_bias = nn.Parameter(torch.zeros(K, d)) if dyn_norm == "layernorm" else None

    def next_params(self, k: int) -> tuple:
        """(α⁰ (n, n+1), B (n), [W_α | W_β] (d, n+2), [s_α…, s_β] (n+2), g (d), bias (d) or None)."""
        n = self.n
        fn = torch.cat([self.dynamic_alpha_fn[k], self.dynamic_beta_fn[k].unsqueeze(-1)], -1)
        scale = torch.cat([self.dynamic_alpha_scale[k].expand(n + 1), self.dynamic_beta_scale[k].expand(1)])
        bias = None if self.norm_bias is None else self.norm_bias[k]
        return (self.static_alpha[k], self.static_beta[k], fn, scale, self.norm_weight[k], bias)

    def coefficients(self, x: Tensor, params: tuple) -> Coefficients:
        alpha0, beta0, fn, scale, g, bias = params
        n, d = self.n, self.d_model
        cd = compute_dtype(x.dtype)
        with full_precision(x):
            xs = x.to(cd)
            if self.dyn_norm == "layernorm":
                hn = F.layer_norm(xs, (d,), g.to(cd), bias.to(cd), self.dyn_norm_eps)
            else:
                hn = F.rms_norm(xs, (d,), g.to(cd), self.dyn_norm_eps)
            proj = torch.matmul(hn, fn.to(cd))                       # (B, T, n, n+2)
            if self.tanh:
                proj = torch.tanh(proj)
            proj = proj * scale.to(cd)
            alpha = alpha0.to(cd) + proj[..., : n + 1]               # (B, T, n, n+1)
            beta = beta0.to(cd) + proj[..., n + 1]                   # (B, T, n)
        return Coefficients(alpha[..., 0], alpha[..., 1:].transpose(-1, -2), beta)

    def coefficient_flops(self) -> int:
        """Per token: the norm n·(7d+2) (LayerNorm 5d+2 + gain + bias; RMSNorm 4d+2), the
        projection 2n(n+2)d, tanh n(n+2), the scales n(n+2), + α⁰ n(n+1), + B n."""
        n, d = self.n, self.d_model
        norm = (7 * d + 2) if self.dyn_norm == "layernorm" else (4 * d + 2)
        return (n * norm + 2 * n * (n + 2) * d + (n * (n + 2) if self.tanh else 0)
                + n * (n + 2) + n * (n + 1) + n)

    def options(self) -> dict:
        return {"n": self.n, "readout": self.readout, "tanh": self.tanh, "dyn_norm": self.dyn_norm,
                "dyn_norm_eps": self.dyn_norm_eps}
