"""Multi-resolution block routers (Kehan Wang, arXiv:2606.06564): ``haares`` and ``wav_v1``.

Both extend Block AttnRes with zero-sum **detail bases** per block of m (even) updates:

    C_b       = Σ_p u_{b,p}                                  state basis (block summary)
    D_b^split = Σ_p r_p u_{b,p},  r_p = +1 (p < m/2), −1     first-vs-second half (HAARES, v2)
    D_b^phase = Σ_p a_p u_{b,p},  a_p = +1 (attn),  −1 (mlp)  attention-vs-MLP phase (WAV v1 only)

accumulated online as each update arrives, RMS-matched to their block's state basis with a
detached gain capped at ρ (``max_detail_scale``), and routed by the same depth mixer with a
learnable logit bias per read and basis kind, initialised to β_D = −2 (so at init each detail
source gets e^−2 of a state source's weight). ``(C, D^split)`` is a level-1 Haar pair of the two
half-block sums. Pools (ROUTERS.md, "Pools"): haares ``[e, C_1, D̃_1^split, …, P, P̃^split]``;
wav_v1 ``[e, C_1, D̃_1^phase, D̃_1^split, …, P, P̃^phase, P̃^split]``.

Analytic cost, per token and block of m sublayers: each write adds d per basis (P and each
detail); each completed block adds n_kinds RMS matchings (5·d + 5 FLOP each; the last block's are
skipped unless the readout reads details); each read mixes over its pool (7·n·d + 8·n FLOP with
the bias, :mod:`routers.mixer`).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from .errors import ConfigError

from .base import Slot
from .block.router import BlockRouter
from .mixer import rms_match
from .registry import register

PARTIAL_DETAILS = ("always", "informative", "never")


class MultiResolutionRouter(BlockRouter):
    """The block router plus zero-sum detail bases (arXiv:2606.06564). Subclasses set ``detail_kinds``.

    Args:
        d_model: width d.
        n_layers: transformer layers L.
        n_blocks: N; default the largest divisor of L that is at most 8.
        block_unit: ``"layer"`` or ``"sublayer"`` (every block must then hold an even count).
        max_detail_scale: ρ, the cap of the detached RMS-matching gain. The paper does not state
            its value; 4.0 is this project's default.
        detail_bias_init: β_D, initial logit bias of every detail source (−2.0; ``-inf`` disables
            details, which makes the router equal ``block_attnres``).
        partial_details: which partial-block details a read sees: ``"always"`` (paper pool),
            ``"informative"`` (only when not ±P) or ``"never"``.
        readout_details: let the final readout see the completed blocks' details too.
        key_norm_gain: learnable gain in each read's key RMSNorm.
        impl: ``"naive"``, ``"two_phase"``, ``"lean"`` (:class:`routers.block.router.BlockRouter`).

    Raises:
        ConfigError: an option out of range, or a block with an odd number of sublayers.
    """

    #: the default until ``__init__`` sets the instance's (the base class plans with it first)
    partial_details = "always"
    #: arXiv:2606.06564 measures HAARES and WAV v1 against Block AttnRes (their details off, they
    #: are Block AttnRes: ``detail_bias_init=-inf``).
    paper_baseline = "block_attnres"

    def __init__(self, d_model: int, n_layers: int, *, n_blocks: int | None = None,
                 block_unit: str = "layer", max_detail_scale: float = 4.0,
                 detail_bias_init: float = -2.0, partial_details: str = "always",
                 readout_details: bool = False, key_norm_gain: bool = False,
                 impl: str = "naive") -> None:
        super().__init__(d_model, n_layers, n_blocks=n_blocks, block_unit=block_unit,
                         key_norm_gain=key_norm_gain, impl=impl)
        if partial_details not in PARTIAL_DETAILS:
            raise ConfigError(f"partial_details must be one of {PARTIAL_DETAILS}, "
                              f"got {partial_details!r}")
        if not max_detail_scale > 0:
            raise ConfigError(f"max_detail_scale must be > 0, got {max_detail_scale!r}")
        odd = sorted({s.block_len for s in self.slots if s.block_len % 2})
        if odd:
            raise ConfigError(f"{self.name} needs blocks of an even number of "
                              f"sublayers (zero-sum details); block_unit={block_unit!r}, "
                              f"n_blocks={self.n_blocks} gives lengths {odd}")
        self.max_detail_scale = float(max_detail_scale)
        self.detail_bias_init = float(detail_bias_init)
        self.partial_details = partial_details
        self.readout_details = bool(readout_details)
        self.detail_bias = nn.Parameter(
            torch.full((2 * n_layers + 1, len(self.detail_kinds)), self.detail_bias_init))
        self._build_plan()  # the pools depend on partial_details and readout_details

    def _coefficients(self, slot: Slot) -> tuple[int, ...]:
        coef = {"split": 1 if slot.pos < slot.block_len // 2 else -1,
                "phase": 1 if slot.kind == "attn" else -1}
        return tuple(coef[k] for k in self.detail_kinds)

    def _partial_kinds(self, slot: Slot) -> tuple[int, ...]:
        if self.partial_details == "never":
            return ()
        if self.partial_details == "always":
            return tuple(range(len(self.detail_kinds)))
        # informative: skip a partial detail while it equals ±P
        seen = {"split": slot.pos > slot.block_len // 2, "phase": slot.pos >= 2}
        return tuple(j for j, k in enumerate(self.detail_kinds) if seen[k])

    def _match(self, detail: Tensor, state: Tensor) -> Tensor:
        return rms_match(detail, state, self.max_detail_scale)

    def options(self) -> dict:
        return {**super().options(), "max_detail_scale": self.max_detail_scale,
                "detail_bias_init": (self.detail_bias_init if math.isfinite(self.detail_bias_init)
                                     else str(self.detail_bias_init)),
                "partial_details": self.partial_details, "readout_details": self.readout_details}


@register("haares")
class HAARES(MultiResolutionRouter):
    """HAARES: Half-Split Residual Basis Routing (arXiv:2606.06564 v2): the split detail."""

    detail_kinds = ("split",)


@register("wav_v1")
class WAVv1(MultiResolutionRouter):
    """WAV v1, Waveform Attention (arXiv:2606.06564 v1): phase and split details."""

    detail_kinds = ("phase", "split")
