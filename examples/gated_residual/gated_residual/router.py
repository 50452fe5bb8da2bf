"""GatedResidual: a gated residual router, h_{k+1} = h_k + sigmoid(g_k) * u_k, for routerbench.

Installed (``pip install --no-build-isolation -e .``), routerbench finds it through the
``routerbench.routers`` entry point of pyproject.toml and loads this module, which registers the
router at import. The contract is routerbench's ``routers.api`` (docs/PLUGINS.md): what a router
must give (init_state, params, read, write, output, a docstring, a float64 ``reference``) and what
it may give (the cost models below).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from routers.api import Router, Slot, register_router

#: The routerbench plugin API this module was written for (``routers.api.API_VERSION``).
ROUTERBENCH_API_VERSION = 1

#: The initial gate logit g_k. sigmoid(2.0) = 0.881: each sublayer starts with most of its update
#: (between ReZero's 0 and PreNorm's 1), and the gate's slope sigmoid'(2.0) = 0.105 is not saturated.
GATE_INIT = 2.0


@register_router("gated_residual")
class GatedResidual(Router):
    """Gated residual: h_{k+1} = h_k + sigmoid(g_k) * u_k, one learned gate g_k per sublayer.

    h_0 = e (the embedding), h_out = h_2L. g_k starts at ``gate_init`` (:data:`GATE_INIT`).

    Args:
        d_model: width d.
        n_layers: transformer layers L (2L sublayers, attention and MLP).
        gate_init: the initial value of every g_k.
    """

    def __init__(self, d_model: int, n_layers: int, *, gate_init: float = GATE_INIT) -> None:
        super().__init__(d_model, n_layers)
        self.gate_init = float(gate_init)
        #: g_k, one logit per sublayer, shape (2L,)
        self.gate = nn.Parameter(torch.full((2 * n_layers,), self.gate_init))

    def options(self) -> dict:
        return {"gate_init": self.gate_init}

    def init_state(self, embedding: Tensor, region: bool = False) -> Tensor:
        """h_0 = e, (B, T, d)."""
        return embedding

    def params(self, state: Tensor, slot: Slot, region: bool = False) -> tuple:
        """g_k, a 0-d slice of the stacked gates (a tensor, never a Python number)."""
        return (self.gate[slot.index],)

    def read(self, state: Tensor, role: tuple, params: tuple) -> Tensor:
        """The sublayer's input h_k is the stream itself."""
        return state

    def write(self, state: Tensor, role: tuple, params: tuple, update: Tensor) -> Tensor:
        """h + sigmoid(g_k) * u."""
        return state + torch.sigmoid(params[0]) * update

    def output(self, state: Tensor, params: tuple = ()) -> Tensor:
        """h_out = h_2L."""
        return state

    def reference(self, embedding: Tensor, updates: list[Tensor]) -> tuple[list[Tensor], Tensor]:
        """The recurrence in float64 with plain loops: e (B, T, d) and the 2L updates u_k (each
        (B, T, d)) -> (the 2L reads h_k, h_out), with this instance's gates."""
        h = embedding.double()
        reads = []
        for k, u in enumerate(updates):
            reads.append(h)
            gate = 1.0 / (1.0 + torch.exp(-self.gate[k].double()))
            h = h + gate * u.double()
        return reads, h

    # --- cost models (optional; where absent, routerbench says "not declared") ----------------
    # They describe the math above: change them with it, or delete them. `routerbench check`
    # compares analytic_fwd_flops with the forward's counted FLOPs and fails where they differ.
    def analytic_fwd_flops(self, batch_size: int, seq_len: int) -> float:
        """Forward FLOP over B*T tokens (routerbench's docs/FLOPS.md convention): per sublayer,
        sigmoid(g_k) on a 0-d gate (4), sigmoid(g_k) * u (d per token) and the add (d per token).
        Total: 2L * (2d * B*T + 4)."""
        return float(len(self.slots) * (2 * self.d_model * batch_size * seq_len + 4))

    def live_state_bytes(self, batch_size: int, seq_len: int, dtype: torch.dtype | None = None,
                         impl: str | None = None) -> int:
        """Router state alive between sublayers: the stream h alone, one (B, T, d) tensor (the
        gates are parameters, not state)."""
        itemsize = torch.empty((), dtype=dtype or torch.float32).element_size()
        return batch_size * seq_len * self.d_model * itemsize

    def ideal_io_per_token(self, schedule: int | None = None) -> float:
        """3 (units of d per token and sublayer): read h, read u, write h; g_k is a parameter,
        amortised over tokens."""
        if schedule is not None:
            raise ValueError(f"{self.name} has no two-phase schedule; pass schedule=None")
        return 3.0

    def ideal_io_fwd_per_token(self) -> float:
        """3, the forward of the fwd+bwd model: the same reads and write as ideal_io_per_token."""
        return 3.0

    def ideal_io_fwd_bwd_per_token(self) -> float:
        """8 = prenorm's 6 + 2: the update's gradient sigmoid(g_k) * dh is written (1), and the
        gate's gradient sum(u * dh) re-reads u (1)."""
        return 8.0
