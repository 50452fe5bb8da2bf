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

from . import block_regions, two_phase
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
class BlockAttnRes(block_regions.BlockRegions, Router):
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
        self.block_unit = block_unit
        self.slots = block_layout(n_layers, n_blocks, block_unit)
        self.n_blocks = self.slots[-1].block
        n_reads = 2 * n_layers + 1  # one pseudo-query per sublayer plus the readout
        self.pseudo_query = nn.Parameter(torch.zeros(n_reads, d_model))
        self.key_gain = nn.Parameter(torch.ones(n_reads, d_model)) if key_norm_gain else None
        self.readout_details = False
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

    def _bias(self, read: int, kinds: tuple[int | None, ...]) -> Tensor | None:
        return None

    def _recorder(self, read: int, kinds: tuple[int | None, ...]) -> Callable[[Tensor], None] | None:
        """The ``recorder`` of :func:`depth_mix` for one read (None unless ``weight_recorder``)."""
        rec = self.weight_recorder
        return None if rec is None else functools.partial(rec, read, kinds)

    # --- the contract -------------------------------------------------------------------------
    def _completed_kinds(self, n_done: int, with_details: bool = True) -> tuple[int | None, ...]:
        per_block = (None,) + (tuple(range(len(self.detail_kinds))) if with_details else ())
        return per_block * n_done

    def init_state(self, embedding: Tensor) -> BlockState | two_phase.TwoPhaseState:
        if self.schedule == "two_phase":
            return two_phase.init_state(self, embedding)
        return BlockState(embedding, (), None, ())

    def read(self, state: BlockState, slot: Slot) -> Tensor:
        if self.schedule == "two_phase":
            return two_phase.read(self, state, slot)
        sources = (state.e,) + state.pool
        kinds = (None,) + self._completed_kinds(slot.block - 1)
        if slot.pos >= 1:
            sources += (state.partial,)
            kinds += (None,)
            for j in self._partial_kinds(slot):
                sources += (self._match(state.partial_details[j], state.partial),)
                kinds += (j,)
        return self._mix(sources, slot.index, kinds)

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
            return two_phase.write(self, state, slot, partial, details)
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
        kinds = (None,) + self._completed_kinds(self.n_blocks, self.readout_details)
        return self._mix(sources, 2 * self.n_layers, kinds)

    def _mix(self, sources: tuple[Tensor, ...], read: int, kinds: tuple[int | None, ...]) -> Tensor:
        """One naive-schedule read: ``depth_mix`` (ours, with the diagnose recorder) or the peer
        kernel's mixer with the same arguments (``routers/impls.py``)."""
        query, bias = self.pseudo_query[read], self._bias(read, kinds)
        gain = None if self.key_gain is None else self.key_gain[read]
        if self.peer_mix is not None:
            return self.peer_mix(sources, query, bias, gain, EPS)
        return depth_mix(sources, query, bias, gain, recorder=self._recorder(read, kinds))

    def options(self) -> dict:
        return {"n_blocks": self.n_blocks, "block_unit": self.block_unit,
                "key_norm_gain": self.key_gain is not None}

    # --- cost models (Router docstrings; docs/FLOPS.md; ROUTERS.md) ----------------------------
    def _detail_write_live(self, slot: Slot, j: int) -> bool:
        """Whether the running detail sum of kind j after ``write(slot)`` is ever read.

        A completed block other than the last one RMS-matches its details into the pool, which
        every later read mixes; in the last block a detail is read only by a later read of that
        block that sees partial detail j (``_partial_kinds``), or by a readout with
        ``readout_details``. Dead work is dropped by tracing and not counted (docs/FLOPS.md).
        """
        return slot.block < self.n_blocks or self.readout_details or any(
            j in self._partial_kinds(s) for s in self.slots if s.block == slot.block and s.pos > slot.pos)

    def analytic_fwd_flops(self, batch_size: int, seq_len: int) -> float:
        """Forward FLOP of the ``naive`` implementation over B·T tokens (docs/FLOPS.md).

        Per token, with d the width, K = ``len(detail_kinds)`` (0 for AttnRes, 1 haares, 2
        wav_v1), N blocks, g = d with ``key_norm_gain`` (else 0), summed over ``self.slots``:

        - read at position p of block b over n = 1 + (b−1)(1+K) + [p ≥ 1](1 + |partial kinds|)
          sources (e, each completed block's C and K details, then P and its visible details):
          0 when n = 1 (the read is e itself), else n·(7d + 7 + g), plus n for the detail-bias
          add when the pool holds a detail source (:mod:`routers.mixer`);
        - each partial detail a read sees is RMS-matched to P at the read: 5d + 5;
        - write: P + u (d) at p ≥ 1; each detail D ± u (d) at p ≥ 1, or −u (d) at p = 0 when its
          coefficient is −1 (P = u and +u are free); only when the detail is ever read
          (:meth:`_detail_write_live`);
        - block completion: K RMS matchings (5d + 5 each), except the last block's when the
          readout reads no details (nothing reads them);
        - readout over 1 + N sources (1 + N(1+K) with ``readout_details``, plus the bias then).

        The ``two_phase`` implementation computes the same mixes in another order and costs
        differently; this formula is the naive one.
        """
        d, K = self.d_model, len(self.detail_kinds)
        gain = d if self.key_gain is not None else 0
        match = 5 * d + 5                     # rms_match: two rms (2d+1 each), +ε, ÷, clamp, scale d

        def mix(n: int, bias: bool) -> int:   # one depth_mix over n sources, per token
            if n == 1:
                return 0                      # softmax over one source: the read is the source
            return n * (3 * d + 2 + gain      # keys: RMSNorm without gain 3d+2 (+d with gain)
                        + 2 * d               # logits w·key: d FMA
                        + (1 if bias else 0)  # + detail bias per source
                        + 5                   # softmax over n
                        + 2 * d)              # Σ_j α_j V_j: d FMA

        flop = 0
        for slot in self.slots:
            done = (slot.block - 1) * (1 + K)                 # completed pool: C and K details each
            seen = self._partial_kinds(slot) if slot.pos >= 1 else ()
            n = 1 + done + (1 + len(seen) if slot.pos >= 1 else 0)
            flop += mix(n, bias=K > 0 and (done > 0 or len(seen) > 0))    # the read
            flop += len(seen) * match                         # P̃ matched to P inside the read
            if slot.pos >= 1:
                flop += d                                     # write P + u
            for j, c in enumerate(self._coefficients(slot)):
                if (slot.pos >= 1 or c < 0) and self._detail_write_live(slot, j):
                    flop += d                                 # write D ± u (−u at p = 0)
            if slot.last_in_block and (slot.block < self.n_blocks or self.readout_details):
                flop += K * match                             # D̃_b matched to C_b at completion
        n_out = 1 + self.n_blocks * (1 + K if self.readout_details else 1)
        flop += mix(n_out, bias=K > 0 and self.readout_details)            # the readout
        return float(flop * batch_size * seq_len)

    def _state_counts(self, impl: str, padded: bool = False) -> list[tuple[int, int]]:
        """Router state after ``init_state`` and after each ``write``, as pairs (distinct (B, T, d)
        tensors, (B, T) statistics). Aliases count once: at p = 0 the partial sum P *is* the
        update u, and so is every detail with coefficient +1.

        naive: e, the completed pool (C_b and K matched details per block; the last block
        without its details unless ``readout_details``), P and the K running details.
        two_phase (``routers/two_phase.py``): the same plus, per completed source (e included),
        its inverse RMS (a (B, T) statistic), and the current block's phase-1 outputs (one
        (m, B, T, d) tensor = m (B, T, d)) with two (m, B, T) statistics (max and sum of exps).
        ``padded`` (two_phase under the layer scope, ``routers/block_regions.py``): also the one
        zero tensor and the one zero statistic every pad is a view of, and at p = 0 each detail is
        c·u, a new tensor whatever c (the region graph does not know the sign).
        """
        K = len(self.detail_kinds)
        two = impl == "two_phase"
        m0 = self.slots[0].block_len if two else 0
        counts = [(1 + m0, (1 + 2 * m0) if two else 0)]       # after init_state: e (+ phase 1)
        for slot in self.slots:
            if slot.last_in_block:
                pool = slot.block * (1 + K)
                if slot.block == self.n_blocks and not self.readout_details:
                    pool -= K                                 # the last details are never built
                nxt = slot.index + 1
                m = self.slots[nxt].block_len if two and nxt < len(self.slots) else 0
                counts.append((1 + pool + m, (1 + pool + 2 * m) if two else 0))
            else:
                pool = (slot.block - 1) * (1 + K)
                # P + u and each D ± u are new tensors, and each c·u of a padded state at p = 0;
                # else at p = 0 P = u, +u aliases it and −u is new
                running = 1 + (K if slot.pos >= 1 or padded else sum(c < 0 for c in self._coefficients(slot)))
                m = slot.block_len if two else 0
                counts.append((1 + pool + running + m, (1 + pool + 2 * m) if two else 0))
        return [(n + 1, k + 1) for n, k in counts] if padded else counts

    def live_state_bytes(self, batch_size: int, seq_len: int, dtype: torch.dtype = torch.float32,
                         impl: str | None = None, layout: str = "tuple") -> int:
        """Peak bytes of router state between sublayers (:meth:`Router.live_state_bytes`).

        ``layout="padded"``: ``two_phase``'s state under the layer compile scope, whose pool of
        fixed length holds views of one zero tensor (and its inverse RMS one zero statistic) where
        a block has not completed yet, and a mask of its valid slots (:meth:`_state_counts`;
        :func:`routers.block_regions.capacity` values in the softmax dtype; the padded phase 1 costs
        :func:`routers.block_regions.masked_phase1_flops` more).

        ``naive``: max over the states of (1 + pool + running sums) tensors of (B, T, d): e,
        the completed pool (C_b and its K RMS-matched details per block, 1 + K each; the last
        block only C_N unless ``readout_details``), and within a block P plus the K running
        detail sums (aliases of u at p = 0 count once). Typically 1 + N(1+K) tensors.
        ``two_phase``: also the current block's m phase-1 outputs (B, T, d) in ``dtype``, and,
        in the softmax dtype (float32, or float64 for float64 tensors), 2m (B, T) statistics
        plus one cached inverse RMS (B, T) per completed source (e included).
        See :meth:`_state_counts`.
        """
        impl = self._cost_impl(impl)
        if layout not in ("tuple", "padded") or (layout == "padded" and impl != "two_phase"):
            raise ValueError(f"layout={layout!r}: 'tuple', or 'padded' for impl two_phase (got impl {impl})")
        dtype, tokens = dtype or torch.float32, batch_size * seq_len
        item = torch.empty((), dtype=dtype).element_size()
        stat_item = torch.empty((), dtype=torch.promote_types(dtype, torch.float32)).element_size()
        mask = block_regions.capacity(self) * stat_item if layout == "padded" else 0  # valid, (1+N(1+K),)
        return mask + max(n * tokens * self.d_model * item + n_stats * tokens * stat_item
                          for n, n_stats in self._state_counts(impl, layout == "padded"))

    def ideal_io_per_token(self, schedule: int | None = None, layout: str = "tuple") -> float:
        """Ideal I/O per token and sublayer, units of d elements (AttnRes paper, Table 1).

        With N blocks over 2L sublayers (S = 2L/N sublayers per block on average) and
        1 + K sources per completed block (C_b and K details; K = 0 for Block AttnRes):

        - phase 1, once per block, reads the completed sources once: upper bound the full
          pool of (1+K)·N, so (1+K)·N·N / 2L = (1+K)·N/S per sublayer;
        - phase 2, one fused step per sublayer: read u (1), read the phase-1 output o (1),
          write h (1), and read and write each running sum P, D (2 each): 3 + 2(1+K).

        Block AttnRes: N/S + 5 (5.5 at 128 sublayers, N = 8, S = 16, the paper's figure);
        haares: 2N/S + 7; wav_v1: 3N/S + 9. The readout is not counted (per-sublayer figure).

        ``layout="padded"`` (the layer scope's pool, :mod:`routers.block_regions`): phase 1 reads
        e, then at each later block all ``1 + N(1+K)`` slots, masked ones too, so phase 1 moves
        ``(1 + (N−1)(1 + N(1+K))) / 2L``: more than the completed sources' ``N + (1+K)N(N−1)/2``
        reads, within the full-pool bound above.

        Raises:
            ValueError: ``schedule`` is given (the block length is the schedule here), or an
                unknown ``layout``.
        """
        if schedule is not None:
            raise ValueError(f"{self.name}: the two-phase schedule is the block layout "
                             "(n_blocks); pass schedule=None")
        n_bases = 1 + len(self.detail_kinds)                  # C_b and its detail sources
        if layout == "padded":
            phase1 = (1 + (self.n_blocks - 1) * block_regions.capacity(self)) / len(self.slots)
        elif layout == "tuple":
            phase1 = n_bases * self.n_blocks * self.n_blocks / len(self.slots)   # (1+K)·N/S
        else:
            raise ValueError(f"layout={layout!r}: 'tuple' or 'padded'")
        phase2 = 3 + 2 * n_bases                              # u, o, h; P, D read and written
        return phase1 + phase2


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
