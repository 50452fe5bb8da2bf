"""Attention Residuals (Kimi Team, arXiv:2603.15031): ``block_attnres`` and ``full_attnres``.

Each sublayer k reads a softmax mix (:func:`routers.mixer.depth_mix`) of the embedding e, the
summaries ``C_b = Σ_{i∈b} u_i`` of the completed blocks and, from the block's second sublayer on,
the partial sum P of the current block; the readout mixes ``[e, C_1, …, C_N]`` with one more
pseudo-query. ``full_attnres`` is the one-sublayer-per-block case. The detail routers of
arXiv:2606.06564 (``routers/multires.py``) extend :class:`BlockAttnRes` with zero-sum detail
bases, which is why the detail machinery (``detail_kinds``) lives here, empty for AttnRes.

Invariants kept (ROUTERS.md): zero-initialised pseudo-queries (a read at init is the plain
average of its sources), no 1/√d temperature, RMS-normalised keys and raw values, the embedding
never summed into block 1, and each completed block entering the pool exactly once.

Analytic cost (docs/FLOPS.md convention), per token: a read over n sources costs ≈ 7·n·d FLOP
(see :mod:`routers.mixer`); a write adds d (P += u). Live state at the read of sublayer k in
block b: (1 + (b−1)·(1+n_kinds) + 1 + n_kinds) tensors of (B, T, d).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor, nn

from workloads.config import ConfigError

from .base import Router, Slot, block_layout
from . import two_phase
from .mixer import depth_mix, rms_match
from .registry import register


class BlockState(NamedTuple):
    """Router state between sublayers (structure fixed by the slot).

    Attributes:
        e: token embedding, (B, T, d).
        pool: completed-block sources in pool order: ``C_1, D̃_1…, C_2, D̃_2…`` (details RMS-matched).
        partial: P, the sum of the current block's updates so far, or None at a block start.
        partial_details: running raw detail sums of the current block, one per detail kind.
    """

    e: Tensor
    pool: tuple[Tensor, ...]
    partial: Tensor | None
    partial_details: tuple[Tensor, ...]


@register("block_attnres")
class BlockAttnRes(Router):
    """Block Attention Residuals (arXiv:2603.15031, Sec. "Block AttnRes").

    Args:
        d_model: width d.
        n_layers: transformer layers L (2L sublayers).
        n_blocks: N; default the largest divisor of L that is at most 8.
        block_unit: ``"layer"`` (blocks of whole layers, paper rule) or ``"sublayer"``.
        key_norm_gain: add a learnable d-vector gain to each read's key RMSNorm.
        impl: ``"naive"`` stacks the sources and mixes at every read (the reference);
            ``"two_phase"`` batches a block's queries over the completed sources once per block
            and merges the partial block per sublayer by online softmax (``routers/two_phase.py``).

    Raises:
        ConfigError: invalid ``n_blocks``, ``block_unit`` or ``impl``.
    """

    impls = ("naive", "two_phase")
    #: detail bases this router adds per block, in pool order ("phase", "split"); none for AttnRes.
    detail_kinds: tuple[str, ...] = ()

    def __init__(self, d_model: int, n_layers: int, *, n_blocks: int | None = None,
                 block_unit: str = "layer", key_norm_gain: bool = False, impl: str = "naive") -> None:
        super().__init__(d_model, n_layers)
        if impl not in self.impls:
            raise ConfigError(f"--impls: {impl!r} is not an implementation of {self.name}; "
                              f"choose one of {self.impls}")
        self.impl = impl
        self.block_unit = block_unit
        self.slots = block_layout(n_layers, n_blocks, block_unit)
        self.n_blocks = self.slots[-1].block
        n_reads = 2 * n_layers + 1  # one pseudo-query per sublayer plus the readout
        self.pseudo_query = nn.Parameter(torch.zeros(n_reads, d_model))
        self.key_gain = nn.Parameter(torch.ones(n_reads, d_model)) if key_norm_gain else None
        self.readout_details = False

    # --- detail hooks (overridden by the multi-resolution routers) -------------------------
    def _coefficients(self, slot: Slot) -> tuple[int, ...]:
        """±1 coefficient of this slot's update in each detail basis (``detail_kinds`` order)."""
        return ()

    def _partial_kinds(self, slot: Slot) -> tuple[int, ...]:
        """Indices of the partial details a read at ``slot`` sees (after P)."""
        return ()

    def _match(self, detail: Tensor, state: Tensor) -> Tensor:
        return detail

    def _bias(self, read: int, kinds: tuple[int | None, ...]) -> Tensor | None:
        return None

    # --- the contract -------------------------------------------------------------------------
    def _completed_kinds(self, n_done: int, with_details: bool = True) -> tuple[int | None, ...]:
        per_block = (None,) + (tuple(range(len(self.detail_kinds))) if with_details else ())
        return per_block * n_done

    def init_state(self, embedding: Tensor) -> BlockState | two_phase.TwoPhaseState:
        if self.impl == "two_phase":
            return two_phase.init_state(self, embedding)
        return BlockState(embedding, (), None, ())

    def read(self, state: BlockState, slot: Slot) -> Tensor:
        if self.impl == "two_phase":
            return two_phase.read(self, state, slot)
        sources = (state.e,) + state.pool
        kinds = (None,) + self._completed_kinds(slot.block - 1)
        if slot.pos >= 1:
            sources += (state.partial,)
            kinds += (None,)
            for j in self._partial_kinds(slot):
                sources += (self._match(state.partial_details[j], state.partial),)
                kinds += (j,)
        return depth_mix(sources, self.pseudo_query[slot.index], self._bias(slot.index, kinds),
                         None if self.key_gain is None else self.key_gain[slot.index])

    def write(self, state: BlockState, slot: Slot, update: Tensor) -> BlockState:
        coefs = self._coefficients(slot)
        if slot.pos == 0:
            partial = update
            details = tuple(update if c > 0 else -update for c in coefs)
        else:
            partial = state.partial + update
            details = tuple(d + update if c > 0 else d - update
                            for d, c in zip(state.partial_details, coefs))
        if self.impl == "two_phase":
            return two_phase.write(self, state, slot, partial, details)
        if slot.last_in_block:  # P becomes C_b, entering the pool exactly once
            # The last block's details are read by nobody unless the readout reads details.
            final = slot.index == len(self.slots) - 1 and not self.readout_details
            matched = () if final else tuple(self._match(d, partial) for d in details)
            return BlockState(state.e, state.pool + (partial,) + matched, None, ())
        return BlockState(state.e, state.pool, partial, details)

    def output(self, state: BlockState) -> Tensor:
        if self.impl == "two_phase":
            return two_phase.output(self, state)
        per_block = 1 + len(self.detail_kinds)
        if self.readout_details:
            sources = (state.e,) + state.pool
        else:
            sources = (state.e,) + state.pool[::per_block]
        kinds = (None,) + self._completed_kinds(self.n_blocks, self.readout_details)
        r = 2 * self.n_layers
        return depth_mix(sources, self.pseudo_query[r], self._bias(r, kinds),
                         None if self.key_gain is None else self.key_gain[r])

    def options(self) -> dict:
        return {"n_blocks": self.n_blocks, "block_unit": self.block_unit,
                "key_norm_gain": self.key_gain is not None}


@register("full_attnres")
class FullAttnRes(BlockAttnRes):
    """Full Attention Residuals (arXiv:2603.15031): sublayer k mixes ``[e, u_0, …, u_{k-1}]``.

    Exactly ``block_attnres`` with ``block_unit="sublayer"`` and one sublayer per block.

    Args:
        key_norm_gain: add a learnable d-vector gain to each read's key RMSNorm.
        impl: ``"naive"`` or ``"two_phase"`` (see :class:`BlockAttnRes`).
    """

    def __init__(self, d_model: int, n_layers: int, *, key_norm_gain: bool = False,
                 impl: str = "naive") -> None:
        super().__init__(d_model, n_layers, n_blocks=2 * n_layers, block_unit="sublayer",
                         key_norm_gain=key_norm_gain, impl=impl)

    def options(self) -> dict:
        return {"key_norm_gain": self.key_gain is not None}
