"""Fixed-weight residual routers: PreNorm, ReZero, LayerScale (ROUTERS.md, "Fixed-weight routers").

State is the running residual stream h of shape (B, T, d).
Analytic cost per token and sublayer: one add of d elements (prenorm, d FLOP), plus d multiplies
(rezero, layerscale); live state: one (B, T, d) tensor.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .base import Router, Slot
from .registry import register
from . import reference as _ref


@register("prenorm")
class PreNorm(Router):
    """Standard PreNorm residual: ``h_{k+1} = h_k + u_k``, ``h_0 = e``, ``h_out = h_2L``.

    Args:
        d_model: width d.
        n_layers: transformer layers L.
    """

    def __init__(self, d_model: int, n_layers: int) -> None:
        super().__init__(d_model, n_layers)

    def init_state(self, embedding: Tensor, region: bool = False) -> Tensor:
        """h_0 = e."""
        return embedding

    def read(self, state: Tensor, role: tuple, params: tuple) -> Tensor:
        """h_k is the stream itself."""
        return state

    def write(self, state: Tensor, role: tuple, params: tuple, update: Tensor) -> Tensor:
        """``h + u``."""
        return state + update

    def output(self, state: Tensor, params: tuple = ()) -> Tensor:
        """h_out = h_2L."""
        return state

    def reference(self, embedding: Tensor, updates: list[Tensor]) -> tuple[list[Tensor], Tensor]:
        """The float64 recurrence h_{k+1} = h_k + g_k u_k (:func:`routers.reference.prenorm`;
        g_k = 1 here, ReZero's α_k, LayerScale's γ_k): (the 2L reads, h_out)."""
        gains = getattr(self, "alpha", None)
        gains = getattr(self, "gamma", None) if gains is None else gains
        return _ref.prenorm(embedding, updates, None if gains is None else list(gains))

    # --- cost models (Router docstrings; docs/FLOPS.md) ----------------------------------------
    def analytic_fwd_flops(self, batch_size: int, seq_len: int) -> float:
        """Forward FLOP of ``h_{k+1} = h_k + u_k`` over B·T tokens (docs/FLOPS.md).

        Per token: one add of d elements per sublayer (d FLOP); init, reads and readout return
        the state itself (0). Total: 2L · d · B·T.
        """
        tokens = batch_size * seq_len
        return float(len(self.slots)          # 2L writes
                     * self.d_model           # h + u: 1 FLOP per element
                     * tokens)

    def live_state_bytes(self, batch_size: int, seq_len: int, dtype: torch.dtype = torch.float32,
                         impl: str | None = None) -> int:
        """Peak router state between sublayers: the stream h alone, one (B, T, d) tensor.

        (α_k / γ_k are parameters, not state.) See :meth:`Router.live_state_bytes`.
        """
        self._cost_impl(impl)
        itemsize = torch.empty((), dtype=dtype or torch.float32).element_size()
        return batch_size * seq_len * self.d_model * itemsize

    def ideal_io_per_token(self, schedule: int | None = None) -> float:
        """Ideal I/O per token and sublayer, units of d elements (AttnRes paper Table 1: 3d).

        One fused step per sublayer: read h (1), read u (1), write h (1) = 3. ReZero's α_k and
        LayerScale's γ_k are per-sublayer parameters, amortised over tokens: 0. The readout reads
        nothing extra (h_out is h_2L). See :meth:`Router.ideal_io_per_token`.
        """
        if schedule is not None:
            raise ValueError(f"{self.name} has no two-phase schedule; pass schedule=None")
        return 3.0

    def ideal_io_fwd_bwd_per_token(self) -> float:
        """6 = forward 3 + backward 3: h' = h + u passes its gradient to h and u unchanged (no
        read, no write), and h's gradient gathers the sublayer's input gradient beside it: read
        both, write the sum (3). See :meth:`Router.ideal_io_fwd_bwd_per_token`."""
        return 6.0


@register("rezero")
class ReZero(PreNorm):
    """ReZero (Bachlechner et al. 2020, arXiv:2003.04887): ``h_{k+1} = h_k + α_k u_k``.

    One scalar α_k per sublayer, initialised to 0 (the network starts as the identity).
    """

    def __init__(self, d_model: int, n_layers: int) -> None:
        super().__init__(d_model, n_layers)
        self.alpha = nn.Parameter(torch.zeros(2 * n_layers))

    def params(self, state: Tensor, slot: Slot, region: bool = False) -> tuple:
        """α_k, a 0-d slice of the stacked α."""
        return (self.alpha[slot.index],)

    def ideal_io_fwd_bwd_per_token(self) -> float:
        """8 = prenorm's 6 + 2: the update's gradient, scaled, is written (1), and the scale's
        gradient Σ u·g re-reads u (1)."""
        return 8.0

    def write(self, state: Tensor, role: tuple, params: tuple, update: Tensor) -> Tensor:
        """``h + α_k u``."""
        return state + params[0] * update

    def analytic_fwd_flops(self, batch_size: int, seq_len: int) -> float:
        """Forward FLOP of ``h_{k+1} = h_k + α_k u_k`` over B·T tokens (docs/FLOPS.md).

        Per token and sublayer: α_k · u (d multiplies, α_k is a 0-d select: free) and the add
        (d). Total: 2L · 2d · B·T.
        """
        tokens = batch_size * seq_len
        return float(len(self.slots)          # 2L writes
                     * 2 * self.d_model       # α_k · u (d) + add (d)
                     * tokens)


def cait_init(n_layers: int) -> float:
    """CaiT's LayerScale init (arXiv:2103.17239): 0.1 for L ≤ 18, 1e-5 for L ≤ 24, 1e-6 deeper."""
    if n_layers <= 18:
        return 0.1
    if n_layers <= 24:
        return 1e-5
    return 1e-6


@register("layerscale")
class LayerScale(PreNorm):
    """LayerScale (Touvron et al. 2021, CaiT, arXiv:2103.17239): ``h_{k+1} = h_k + γ_k ⊙ u_k``.

    γ_k ∈ R^d per sublayer, initialised by :func:`cait_init` unless ``init`` is given.

    Args:
        init: initial value of every γ, or None for the CaiT depth rule.
    """

    def __init__(self, d_model: int, n_layers: int, *, init: float | None = None) -> None:
        super().__init__(d_model, n_layers)
        #: the initial value of every γ (the ``init`` option)
        self.gamma_init = cait_init(n_layers) if init is None else float(init)
        self.gamma = nn.Parameter(torch.full((2 * n_layers, d_model), self.gamma_init))

    def params(self, state: Tensor, slot: Slot, region: bool = False) -> tuple:
        """γ_k (d,), a row of the stacked γ."""
        return (self.gamma[slot.index],)

    def ideal_io_fwd_bwd_per_token(self) -> float:
        """8 = prenorm's 6 + 2: the update's gradient, scaled, is written (1), and the scale's
        gradient Σ u·g re-reads u (1)."""
        return 8.0

    def write(self, state: Tensor, role: tuple, params: tuple, update: Tensor) -> Tensor:
        """``h + γ_k ⊙ u``."""
        return state + params[0] * update

    def options(self) -> dict:
        return {"init": self.gamma_init}

    def analytic_fwd_flops(self, batch_size: int, seq_len: int) -> float:
        """Forward FLOP of ``h_{k+1} = h_k + γ_k ⊙ u_k`` over B·T tokens (docs/FLOPS.md).

        Per token and sublayer: γ_k ⊙ u (d multiplies) and the add (d). Total: 2L · 2d · B·T.
        """
        tokens = batch_size * seq_len
        return float(len(self.slots)          # 2L writes
                     * 2 * self.d_model       # γ_k ⊙ u (d) + add (d)
                     * tokens)
