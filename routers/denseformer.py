"""DenseFormer's depth-weighted averaging, DWA (Pagliardini et al., arXiv:2402.02622;
epfml/DenseFormer ``denseformer/denseformer.py``): the router ``denseformer``. Specification:
docs/BASELINES.md ("denseformer").

The N units are the L layers (``unit="layer"``, the paper) or the 2L sublayers. The state is the
running stream h and the bank [x_0 = e, x_1, …] of unit outputs. Every write adds: h ← h + u_k.
When sublayer k ends unit i, x_{i+1} = h joins the bank and, if (i+1) mod p = 0 (``period``),

    h ← Σ_j α_{i,j} x_j   over j ≤ i+1 with j ≡ i+1 (mod k) (``dilation``), ascending j,

m_i = ⌊(i+1)/k⌋ + 1 weights, initialised to (0, …, 0, 1) (the identity: every read and h_out are
prenorm's bitwise at init). The last write drops the bank; h_out = h. Parameters: Σ m_i over the
DWA units (L(L+3)/2 at k = p = 1).

Region form (layer compile scope): the bank is a fixed pool of N + 1 slots, newest first, that
each unit end shifts by one; α_i reaches the region padded to N + 1 weights (zeros where no
source is: the mask), built outside it, so the regions do not grow with depth.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor, nn

from .base import Router, Slot
from .errors import ConfigError
from .registry import register
from . import reference as _ref


class DenseState(NamedTuple):
    """Router state between sublayers.

    Attributes:
        h: the running stream, (B, T, d).
        bank: eager: the tuple (x_0 = e, x_1, …) of unit outputs so far; regions: the pool
            (N + 1, B, T, d), newest first (zeros where no output is yet); () after the last write.
    """

    h: Tensor
    bank: tuple[Tensor, ...] | Tensor


@register("denseformer")
class DenseFormer(Router):
    """DenseFormer DWA (arXiv:2402.02622) on the router contract.

    Args:
        dilation: k ≥ 1, DWA averages every k-th earlier unit output (1: all).
        period: p ≥ 1, a DWA after every p-th unit (1: every unit).
        unit: ``"layer"`` (N = L, the paper) or ``"sublayer"`` (N = 2L).

    Raises:
        ConfigError: an invalid option (one line naming it).
    """

    def __init__(self, d_model: int, n_layers: int, *, dilation: int = 1, period: int = 1,
                 unit: str = "layer") -> None:
        super().__init__(d_model, n_layers)
        for name, v in (("dilation", dilation), ("period", period)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ConfigError(f"{name} must be an integer ≥ 1, got {v!r}")
        if unit not in ("layer", "sublayer"):
            raise ConfigError(f"unit must be 'layer' or 'sublayer', got {unit!r}")
        self.dilation, self.period, self.unit = dilation, period, unit
        self.n_units = n_layers if unit == "layer" else 2 * n_layers
        #: α_i of each DWA unit i (unit index → position in ``dwa_weights``)
        self.dwa_units = {i: q for q, i in enumerate(i for i in range(self.n_units) if (i + 1) % period == 0)}
        self.dwa_weights = nn.ParameterList(
            nn.Parameter(torch.eye(self.sources(i))[-1]) for i in self.dwa_units)

    def sources(self, i: int) -> int:
        """m_i = ⌊(i+1)/k⌋ + 1, the sources of unit i's DWA."""
        return (i + 1) // self.dilation + 1

    def unit_end(self, slot: Slot) -> int | None:
        """The unit i that sublayer ``slot`` ends, or None."""
        if self.unit == "sublayer":
            return slot.index
        return slot.index // 2 if slot.kind == "mlp" else None

    def _dwa(self, bank: tuple[Tensor, ...], i: int) -> Tensor:
        alpha = self.dwa_weights[self.dwa_units[i]]
        src = bank[(i + 1) % self.dilation::self.dilation]            # j ≡ i+1 (mod k), ascending
        if len(src) == 1:                                             # one source: a plain product
            return alpha[0].to(src[0].dtype) * src[0]
        return torch.einsum("mbtd,m->btd", torch.stack(src), alpha.to(src[0].dtype))

    # --- the contract ------------------------------------------------------------------------
    def init_state(self, embedding: Tensor, region: bool = False) -> DenseState:
        """h = e, and the bank (e,); under the layer scope (``region``) the pool of N + 1 outputs,
        e first and zeros where no output is yet, so no region's graph depends on the unit."""
        if not region:
            return DenseState(embedding, (embedding,))
        empty = embedding.new_zeros(self.n_units, *embedding.shape)
        return DenseState(embedding, torch.cat([embedding.unsqueeze(0), empty]))

    def role(self, slot: Slot) -> tuple:
        """``("add",)``, ``("append",)`` (a unit end without DWA) or ``("dwa",)``, with
        ``"last"`` added at the last sublayer."""
        i = self.unit_end(slot)
        kind = "add" if i is None else ("dwa" if i in self.dwa_units else "append")
        return (kind, "last") if slot.index == len(self.slots) - 1 else (kind,)

    def padded_weights(self, i: int) -> Tensor:
        """α_i spread over the N + 1 pool slots, newest first (slot q holds x_{i+1−q}), zeros
        elsewhere; (N + 1,)."""
        alpha = self.dwa_weights[self.dwa_units[i]]
        idx = torch.arange(0, self.dilation * len(alpha), self.dilation, device=alpha.device)
        return alpha.new_zeros(self.n_units + 1).index_put((idx,), alpha.flip(0))

    def params(self, state: DenseState, slot: Slot, region: bool = False) -> tuple:
        """At a DWA unit end, the unit i (its weights are read from the bank), or under the layer
        scope (``region``) α_i padded, (N + 1,); else ()."""
        i = self.unit_end(slot)
        if i is None or i not in self.dwa_units:
            return ()
        return (self.padded_weights(i),) if region else (i,)

    def read(self, state: DenseState, role: tuple, params: tuple) -> Tensor:
        return state.h

    def write(self, state: DenseState, role: tuple, params: tuple, update: Tensor) -> DenseState:
        """h + u; at a unit end the output joins the bank, and a DWA replaces h by its average."""
        h, bank = state.h + update, state.bank
        if role[0] != "add":
            if isinstance(bank, Tensor):  # the layer scope's pool, newest first
                bank = torch.cat([h.unsqueeze(0), bank[:-1]])
                if role[0] == "dwa":
                    h = torch.einsum("mbtd,m->btd", bank, params[0].to(h.dtype))
            else:
                bank = (*bank, h)
                if role[0] == "dwa":
                    h = self._dwa(bank, params[0])
        return DenseState(h, () if role[-1] == "last" else bank)

    def output(self, state: DenseState, params: tuple = ()) -> Tensor:
        return state.h

    def reference(self, embedding: Tensor, updates: list[Tensor]) -> tuple[list[Tensor], Tensor]:
        """The float64 bank of unit outputs and DWA sums (:func:`routers.reference.denseformer`)."""
        return _ref.denseformer(self, embedding, updates)

    def options(self) -> dict:
        return {"dilation": self.dilation, "period": self.period, "unit": self.unit}

    # --- cost models ---------------------------------------------------------------------------
    def analytic_fwd_flops(self, batch_size: int, seq_len: int) -> float:
        """Forward FLOP over B·T tokens (docs/FLOPS.md): every write's add (d), every DWA over
        m_i sources 2·m_i·d (a single source: one product, d). At k = p = 1 with layer units:
        (L² + 5L)·d per token."""
        d = self.d_model
        dwa = sum(2 * self.sources(i) * d if self.sources(i) > 1 else d for i in self.dwa_units)
        return float(batch_size * seq_len * (len(self.slots) * d + dwa))

    def live_state_bytes(self, batch_size: int, seq_len: int, dtype: torch.dtype = torch.float32,
                         impl: str | None = None) -> int:
        """Peak router state between sublayers: the distinct tensors of (h, bank) over the
        writes (e; each unit output x_{i+1}, which *is* h until a DWA makes a new h; h): at most
        N + 1 tensors of (B, T, d) (N + 1 at k = p = 1)."""
        self._cost_impl(impl)
        peak, bank, h_in_bank = 1, 1, True          # after init: h is e, the bank (e,)
        for slot in self.slots:
            i = self.unit_end(slot)
            h_in_bank = False                       # h + u: a new tensor
            if i is not None:
                bank, h_in_bank = bank + 1, True    # x_{i+1} = h
                if i in self.dwa_units:
                    h_in_bank = False               # the DWA's output is a new h
            if slot.index == len(self.slots) - 1:
                bank, h_in_bank = 0, False          # the last write drops the bank
            peak = max(peak, bank + (0 if h_in_bank else 1))
        item = torch.empty((), dtype=dtype or torch.float32).element_size()
        return peak * batch_size * seq_len * self.d_model * item

    def ideal_io_per_token(self, schedule: int | None = None) -> float:
        """Ideal I/O per token and sublayer, units of d: prenorm's 3, plus per DWA m_i (the
        older bank entries and y, read once; its output replaces h's write), averaged over the
        2L sublayers: 3 + Σ m_i / 2L ((L + 15)/4 at k = p = 1, layer units)."""
        if schedule is not None:
            raise ValueError(f"{self.name} has no two-phase schedule; pass schedule=None")
        return 3.0 + sum(self.sources(i) for i in self.dwa_units) / len(self.slots)

    def ideal_io_fwd_bwd_per_token(self) -> float:
        """6 + 4·Σ m_i / 2L (docs/ROUTERS.md, "The ideal fwd+bwd model"): prenorm's 6, and per
        DWA its forward's m_i reads plus a backward that re-reads its m_i sources (the weights'
        gradients need them) and reads and writes each one's gradient (3·m_i)."""
        return 6.0 + 4.0 * sum(self.sources(i) for i in self.dwa_units) / len(self.slots)
