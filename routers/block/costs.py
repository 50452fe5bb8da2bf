"""The cost models of the block routers (:class:`routers.block.router.BlockRouter`),
beside their code as the Router contract asks: analytic forward FLOPs of the naive schedule, the
live router state of every impl (naive, two_phase, lean; tuple or padded layout) and the ideal I/O
of the AttnRes paper's Table 1 (docs/FLOPS.md; ROUTERS.md; the tests in tests/test_costs.py hold
them against measured counts).
"""

from __future__ import annotations

import torch

from .. import impls as _impls
from ..base import Slot


class BlockCosts:
    """Cost-model methods of :class:`routers.block.router.BlockRouter` (Router's cost docstrings)."""

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

    def _state_counts(self, impl: str, padded: bool = False) -> list[tuple[int, int, int]]:
        """Router state after ``init_state`` and after each ``write``, as triples (distinct (B, T, d)
        tensors, (B, T) statistics, (d,) float32 query copies), from ``impl``'s :class:`routers.impls.StateModel`. Aliases count once: at p = 0 the partial sum P *is* the
        update u, and so is every detail with coefficient +1.

        naive: e, the completed pool (C_b and K matched details per block; the last block
        without its details unless ``readout_details``), P and the K running details.
        two_phase (``routers/block/two_phase.py``): the same plus, per completed source (e included),
        its inverse RMS (a (B, T) statistic), and the current block's phase-1 outputs (one
        (m, B, T, d) tensor = m (B, T, d)) with two (m, B, T) statistics (max and sum of exps).
        fused (``routers/block/fused.py``): lean's, but phase 1 writes each of the m outputs as a
        tensor of its own (m), caches no inverse RMS (its kernels compute each where they load the
        row: ``StateModel.key_rms_cached``) and keeps the m queries' float32 copies it passed on,
        each (d + K,) with its detail-bias row (``StateModel.query_copies``); a write inside a block
        (p ≥ 1, not its last) leaves the next read's input in the state (its phases' ``chain``).
        lean (``routers/block/lean.py``): two_phase's, plus the block's updates u_0 … u_p it keeps
        after the write at position p ≥ 1 (at p = 0, u_0 is P); none of block 1's phase-1
        outputs (over e alone, each is e itself); in a later block of m ≥ 2, phase 1's o_0 is a
        tensor of its own (the one a norm keeps for the backward) and o_1 … are views of the
        whole (m, B, T, d) result: m + 1.
        ``padded`` (two_phase or lean under the layer scope, :func:`routers.block.state.pad`): also the one
        zero tensor and the one zero statistic every pad is a view of, and at p = 0 each detail is
        c·u, a new tensor whatever c (the region graph does not know the sign).
        """
        spec = _impls.get(impl, self.name)
        K, model = len(self.detail_kinds), spec.state
        two, lean = model.phase1, model.keeps_updates
        chains = getattr(spec.phases, "chain", None) is not None and not padded  # eager and model scope
        inv = 1 if model.key_rms_cached else 0          # a cached inverse RMS per source
        copies = 1 if model.query_copies else 0

        def outputs(m: int, block: int) -> int:   # phase 1's outputs of a block of m, in (B, T, d)
            if not lean or m == 0:
                return m                          # one (m, B, T, d) tensor
            if block == 1:                        # lean, fused: block 1's are e itself
                return 0
            # lean: o_0 its own tensor, and o_1… views of all m; fused: o_0 and the other m − 1
            return m + (1 if m >= 2 and model.first_output_apart else 0)

        m1 = self.slots[0].block_len if two else 0
        counts = [(1 + outputs(m1, 1), (inv + 2 * m1) if two else 0, copies * m1)]   # after init_state: e (+ phase 1)
        for slot in self.slots:
            if slot.last_in_block:
                pool = slot.block * (1 + K)
                if slot.block == self.n_blocks and not self.readout_details:
                    pool -= K                                 # the last details are never built
                nxt = slot.index + 1
                m = self.slots[nxt].block_len if two and nxt < len(self.slots) else 0
                counts.append((1 + pool + outputs(m, slot.block + 1), (inv * (1 + pool) + 2 * m) if two else 0,
                               copies * m))
            else:
                pool = (slot.block - 1) * (1 + K)
                # P + u and each D ± u are new tensors, and each c·u of a padded state at p = 0;
                # else at p = 0 P = u, +u aliases it and −u is new
                running = 1 + (K if slot.pos >= 1 or padded else sum(c < 0 for c in self._coefficients(slot)))
                m = slot.block_len if two else 0
                # lean keeps u_0 … u_p (u_0 is P at p = 0); its block-1 outputs are e itself
                kept = slot.pos + 1 if lean and slot.pos >= 1 else 0
                ahead = 1 if chains and slot.pos >= 1 else 0  # the next read's input, made by this write
                counts.append((1 + pool + running + outputs(m, slot.block) + kept + ahead,
                               (inv * (1 + pool) + 2 * m) if two else 0, copies * m))
        return [(n + 1, k + inv, c) for n, k, c in counts] if padded else counts

    def live_state_bytes(self, batch_size: int, seq_len: int, dtype: torch.dtype = torch.float32,
                         impl: str | None = None, layout: str = "tuple") -> int:
        """Peak bytes of router state between sublayers (:meth:`Router.live_state_bytes`).

        ``layout="padded"``: ``two_phase``'s state under the layer compile scope, whose pool of
        fixed length holds views of one zero tensor (and its inverse RMS one zero statistic) where
        a block has not completed yet, and a mask of its valid slots (:meth:`_state_counts`;
        ``plan.capacity`` values in the softmax dtype; the padded phase 1 costs
        :meth:`masked_phase1_flops` more).

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
        if layout not in ("tuple", "padded") or (layout == "padded" and not _impls.get(impl, self.name).state.phase1):
            padded = ", ".join(i for i in self.cost_models if _impls.get(i).state.phase1)
            raise ValueError(f"layout={layout!r}: 'tuple', or 'padded' for impl {padded} "
                             f"(got impl {impl})")
        dtype, tokens = dtype or torch.float32, batch_size * seq_len
        item = torch.empty((), dtype=dtype).element_size()
        stat_item = torch.empty((), dtype=torch.promote_types(dtype, torch.float32)).element_size()
        mask = self.plan.capacity * stat_item if layout == "padded" else 0  # valid, (1+N(1+K),)
        per_copy = (self.d_model + len(self.detail_kinds)) * 4  # a query's float32 copy and its detail biases
        return mask + self._step_bytes(impl, layout, item) + max(
            n * tokens * self.d_model * item + n_stats * tokens * stat_item + copies * per_copy
            for n, n_stats, copies in self._state_counts(impl, layout == "padded"))

    def _step_bytes(self, impl: str, layout: str, item: int) -> int:
        """Bytes the state holds for the whole step whatever the tokens: the pseudo-queries with the
        key gain folded in, made once per step where the phases pass queries on (fused, eager and
        model scope: ``routers.block.two_phase._step_rows``; without a key gain they are views of
        the parameter, which is no state)."""
        phases = _impls.get(impl, self.name).phases
        if layout == "padded" or not getattr(phases, "passes_queries", False) or self.key_gain is None:
            return 0
        return self.pseudo_query.numel() * item

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

        ``layout="padded"`` (the layer scope's pool, :func:`routers.block.state.pad`): phase 1 reads
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
            phase1 = (1 + (self.n_blocks - 1) * self.plan.capacity) / len(self.slots)
        elif layout == "tuple":
            phase1 = n_bases * self.n_blocks * self.n_blocks / len(self.slots)   # (1+K)·N/S
        else:
            raise ValueError(f"layout={layout!r}: 'tuple' or 'padded'")
        phase2 = 3 + 2 * n_bases                              # u, o, h; P, D read and written
        return phase1 + phase2

    def ideal_io_fwd_per_token(self, layout: str = "tuple") -> float:
        """The forward of the floor's model (docs/ROUTERS.md, "The ideal fwd+bwd model"), units of
        d per token and sublayer: :meth:`ideal_io_per_token` with phase 1 counted exactly, where the
        paper's model bounds it by the full pool at every block. Block b reads the embedding and
        the (b−1)(1+K) sources of the completed blocks, so phase 1 moves
        ``(N + (1+K)N(N−1)/2) / 2L``; the layer scope's padded pool (``layout="padded"``) as
        there, ``(1 + (N−1)(1 + N(1+K))) / 2L``, never less. At L = 12, N = 6: Block AttnRes
        5.875, haares 8.5, wav_v1 11.125 (the paper's model: 6.5, 10, 13.5).

        Raises:
            ValueError: an unknown ``layout``.
        """
        if layout == "tuple":
            n_bases = 1 + len(self.detail_kinds)
            phase1 = (self.n_blocks + n_bases * self.n_blocks * (self.n_blocks - 1) / 2) / len(self.slots)
            return phase1 + 3 + 2 * n_bases
        return self.ideal_io_per_token(layout=layout)

    def ideal_io_fwd_bwd_per_token(self, layout: str = "tuple") -> float:
        """Ideal traffic of a training step per token and sublayer, units of d (docs/ROUTERS.md,
        "The ideal fwd+bwd model"): 4·phase1 + 8 + 5(1+K), with phase1 the forward's phase-1 share
        (:meth:`ideal_io_fwd_per_token`, ``layout`` as there). Block AttnRes at L = 12, N = 6:
        16.5; haares 24; wav_v1 31.5 (prenorm 6).

        - forward: phase1 + 3 + 2(1+K) (:meth:`ideal_io_fwd_per_token`);
        - phase 2's backward, per sublayer: read ∂h (1) and the gradients of the new running sums
          (1+K); re-read o, P and the details its weights need (1 + (1+K)); write ∂o (1), ∂u (1)
          and the gradients of the old running sums (1+K): 4 + 3(1+K);
        - phase 1's backward, per block: read the m output gradients (1 per sublayer), re-read the
          completed sources (phase1) and read and write each one's gradient, which every later
          block's phase 1 adds to (2·phase1): 1 + 3·phase1.
        """
        fwd = self.ideal_io_fwd_per_token(layout=layout)
        n_bases = 1 + len(self.detail_kinds)
        phase1 = fwd - (3 + 2 * n_bases)
        return fwd + (4 + 3 * n_bases) + (1 + 3 * phase1)

    def masked_phase1_flops(self, batch_size: int, seq_len: int) -> float:
        """Forward FLOP the padded pool adds over phase 1 on the completed sources alone (docs/FLOPS.md
        convention), over B·T tokens: the phase 1 of each block b ≥ 2 (block 1's runs over e alone)
        mixes ``capacity − (1 + (b−1)(1+K))`` masked slots too, each costing what a source costs,
        per query and token: the dot product 2d, the weighted sum 2d, the inverse-RMS product, the
        max, the shift, the exponential, the sum and the division (6), plus the detail bias (1) when
        the router has details; and one comparison per slot for the mask."""
        d, K = self.d_model, len(self.detail_kinds)
        n_cap, tokens, extra = self.plan.capacity, batch_size * seq_len, 0
        per_query = 4 * d + 6 + (1 if K else 0)
        for b in range(2, self.n_blocks + 1):
            m = sum(1 for s in self.slots if s.block == b)
            masked = n_cap - (1 + (b - 1) * (1 + K))
            extra += masked * (m * tokens * per_query + 1)
        return float(extra)
