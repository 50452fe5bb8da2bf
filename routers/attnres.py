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

import functools
from typing import Callable, NamedTuple

import torch
from torch import Tensor, nn

from . import block_costs, block_plan, block_regions, two_phase
from .base import Router, Slot, block_layout
from .errors import ConfigError
from .mixer import EPS, depth_mix
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
class BlockAttnRes(block_regions.BlockRegions, block_costs.BlockCosts, Router):
    """Block Attention Residuals (arXiv:2603.15031, Sec. "Block AttnRes").

    Args:
        d_model: width d.
        n_layers: transformer layers L (2L sublayers).
        n_blocks: N; default the largest divisor of L that is at most 8.
        block_unit: ``"layer"`` (blocks of whole layers, paper rule) or ``"sublayer"``.
        key_norm_gain: add a learnable d-vector gain to each read's key RMSNorm.
        impl: ``"naive"`` stacks the sources and mixes at every read (the reference);
            ``"two_phase"`` batches a block's queries over the completed sources once per block
            and merges the partial block per sublayer by online softmax (``routers/two_phase.py``);
            ``"lean"`` is that schedule with a backward that keeps the sources once and a few
            statistics per token (``routers/lean.py``).

    Raises:
        ConfigError: invalid ``n_blocks``, ``block_unit`` or ``impl``.
    """

    impls = ("naive", "two_phase", "lean")
    #: the naive schedule's state (the layer scope's regions rebuild it, ``region_unpack``)
    naive_state = BlockState
    #: detail bases this router adds per block, in pool order ("phase", "split"); none for AttnRes.
    detail_kinds: tuple[str, ...] = ()
    #: Observation hook of the ``naive`` path (``harness.training.diagnose``); None (the default) costs one
    #: attribute test per read. When an instance sets it to a callable, every naive read and the
    #: readout call ``weight_recorder(read, kinds, alpha)``: ``read`` the pseudo-query index
    #: (sublayer k, or 2L for the readout), ``kinds`` the pool's source kinds in pool order (None
    #: for a state source e, C_b, P; j for a detail of kind ``detail_kinds[j]``), ``alpha`` the
    #: detached softmax weights (n, B, T). The ``two_phase`` path never calls it.
    weight_recorder: Callable[[int, tuple, Tensor], None] | None = None

    def __init__(self, d_model: int, n_layers: int, *, n_blocks: int | None = None,
                 block_unit: str = "layer", key_norm_gain: bool = False, impl: str = "naive") -> None:
        super().__init__(d_model, n_layers)
        from . import impls as _impls
        known = [i.name for i in _impls.impls_for(self.name)] or list(self.impls)
        if impl not in known:
            raise ConfigError(f"impl {impl!r} is not an implementation of {self.name}; "
                              f"choose one of {tuple(known)}")
        spec = _impls.get(impl, self.name)
        self.impl = impl
        #: the schedule this impl runs (a peer kernel plugs into naive or two_phase)
        self.schedule = spec.schedule
        #: a peer's depth mixer (naive schedule) or phases (two_phase schedule); None: ours
        self.peer_mix, self.peer_phases = spec.mix, spec.phases
        #: the two-phase schedule with the memory-lean backward (``routers/lean.py``)
        self.lean = spec.backward == "recompute"
        self.block_unit = block_unit
        self.slots = block_layout(n_layers, n_blocks, block_unit)
        self.n_blocks = self.slots[-1].block
        n_reads = 2 * n_layers + 1  # one pseudo-query per sublayer plus the readout
        self.pseudo_query = nn.Parameter(torch.zeros(n_reads, d_model))
        self.key_gain = nn.Parameter(torch.ones(n_reads, d_model)) if key_norm_gain else None
        self.readout_details = False
        self._build_plan()

    def _build_plan(self) -> None:
        """The static plan (``routers/block_plan.py``) and its buffers; called again by a subclass
        once its options, which change the pools, are set."""
        self.plan = block_plan.BlockPlan(self)
        self.register_buffer("plan_codes", self.plan.codes, persistent=False)
        # c of each slot's update in each detail kind, for the layer scope's regions
        self.register_buffer("region_coefs", block_regions.coefficient_table(self), persistent=False)

    # --- detail hooks (overridden by the multi-resolution routers) -------------------------
    def _coefficients(self, slot: Slot) -> tuple[int, ...]:
        """±1 coefficient of this slot's update in each detail basis (``detail_kinds`` order)."""
        return ()

    def _partial_kinds(self, slot: Slot) -> tuple[int, ...]:
        """Indices of the partial details a read at ``slot`` sees (after P)."""
        return ()

    def _match(self, detail: Tensor, state: Tensor) -> Tensor:
        return detail

    def _bias(self, read: int) -> Tensor | None:
        """Logit bias (n,) of naive read ``read`` over its pool (``plan.read_kinds``), or None
        when the pool holds no detail: a slice of ``plan_codes`` and one gather, no host data."""
        codes = self.plan.read_codes[read]
        return None if codes is None else block_plan.code_bias(self.detail_bias[read], self.plan_codes[codes])

    def _recorder(self, read: int, kinds: tuple[int | None, ...]) -> Callable[[Tensor], None] | None:
        """The ``recorder`` of :func:`depth_mix` for one read (None unless ``weight_recorder``)."""
        rec = self.weight_recorder
        return None if rec is None else functools.partial(rec, read, kinds)

    # --- the contract -------------------------------------------------------------------------
    def init_state(self, embedding: Tensor) -> BlockState | two_phase.TwoPhaseState:
        if self.schedule == "two_phase":
            return two_phase.init_state(self, embedding)
        return BlockState(embedding, (), None, ())

    def read(self, state: BlockState, slot: Slot) -> Tensor:
        if self.schedule == "two_phase":
            return two_phase.read(self, state, slot)
        sources = (state.e,) + state.pool
        if slot.pos >= 1:
            sources += (state.partial,)
            for j in self.plan.seen[slot.index]:
                sources += (self._match(state.partial_details[j], state.partial),)
        return self._mix(sources, slot.index)

    def write(self, state: BlockState, slot: Slot, update: Tensor) -> BlockState:
        coefs = self._coefficients(slot)
        if slot.pos == 0:
            partial = update
            details = tuple(update if c > 0 else -update for c in coefs)
        else:
            partial = state.partial + update
            details = tuple(d + update if c > 0 else d - update
                            for d, c in zip(state.partial_details, coefs))
        if self.schedule == "two_phase":
            return two_phase.write(self, state, slot, partial, details, update)
        if slot.last_in_block:  # P becomes C_b, entering the pool exactly once
            # The last block's details are read by nobody unless the readout reads details.
            final = slot.index == len(self.slots) - 1 and not self.readout_details
            matched = () if final else tuple(self._match(d, partial) for d in details)
            return BlockState(state.e, state.pool + (partial,) + matched, None, ())
        return BlockState(state.e, state.pool, partial, details)

    def output(self, state: BlockState) -> Tensor:
        if self.schedule == "two_phase":
            return two_phase.output(self, state)
        per_block = 1 + len(self.detail_kinds)
        if self.readout_details:
            sources = (state.e,) + state.pool
        else:
            sources = (state.e,) + state.pool[::per_block]
        return self._mix(sources, 2 * self.n_layers)

    def _mix(self, sources: tuple[Tensor, ...], read: int) -> Tensor:
        """One naive-schedule read: ``depth_mix`` (ours, with the diagnose recorder) or the peer
        kernel's mixer with the same arguments (``routers/impls.py``); the pool's kinds are the
        plan's (``plan.read_kinds[read]``)."""
        kinds = self.plan.read_kinds[read]
        query, bias = self.pseudo_query[read], self._bias(read)
        gain = None if self.key_gain is None else self.key_gain[read]
        if self.peer_mix is not None:
            return self.peer_mix(sources, query, bias, gain, EPS)
        return depth_mix(sources, query, bias, gain, recorder=self._recorder(read, kinds))

    def options(self) -> dict:
        return {"n_blocks": self.n_blocks, "block_unit": self.block_unit,
                "key_norm_gain": self.key_gain is not None}


@register("full_attnres")
class FullAttnRes(BlockAttnRes):
    """Full Attention Residuals (arXiv:2603.15031): sublayer k mixes ``[e, u_0, …, u_{k-1}]``.

    Exactly ``block_attnres`` with ``block_unit="sublayer"`` and one sublayer per block. Only the
    naive implementation: with one sublayer per block the block two-phase schedule degenerates
    to the naive read (the paper's chunked schedule for Full AttnRes merges individual outputs,
    a different algorithm that is not implemented here).

    Args:
        key_norm_gain: add a learnable d-vector gain to each read's key RMSNorm.
        impl: ``"naive"``.
    """

    impls = ("naive",)

    def __init__(self, d_model: int, n_layers: int, *, key_norm_gain: bool = False,
                 impl: str = "naive") -> None:
        super().__init__(d_model, n_layers, n_blocks=2 * n_layers, block_unit="sublayer",
                         key_norm_gain=key_norm_gain, impl=impl)

    def options(self) -> dict:
        return {"key_norm_gain": self.key_gain is not None}

    def ideal_io_per_token(self, schedule: int | None = None) -> float:
        """Ideal I/O per token and sublayer, units of d elements (AttnRes paper, Table 1).

        Two-phase schedule with chunks of S sublayers (``schedule``):

        - phase 1, once per chunk, reads the ≤ 2L completed outputs once: 2L/S per sublayer;
        - phase 2 merges the ≤ S outputs of the current chunk one by one: S per sublayer.

        Total S + 2L/S: 24 at 128 sublayers with S = 16 (the paper's (S + N)d with N = 2L/S = 8).

        Args:
            schedule: S; default 16 where it divides 2L, else the largest divisor of 2L ≤ 16.

        Raises:
            ValueError: S is not a positive divisor of 2L.
        """
        sublayers = len(self.slots)
        if schedule is None:
            schedule = max(s for s in range(1, 17) if sublayers % s == 0)
        if not isinstance(schedule, int) or schedule < 1 or sublayers % schedule:
            raise ValueError(f"full_attnres: schedule={schedule!r} must be a positive divisor of "
                             f"2L = {sublayers}")
        return schedule + sublayers / schedule
