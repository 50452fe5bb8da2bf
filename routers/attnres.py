"""Attention Residuals (Kimi Team, arXiv:2603.15031): ``block_attnres`` and ``full_attnres``.

Each sublayer k reads a softmax mix (:func:`routers.mixer.depth_mix`) of the embedding e, the
summaries ``C_b = Σ_{i∈b} u_i`` of the completed blocks and, from the block's second sublayer on,
the partial sum P of the current block; the readout mixes ``[e, C_1, …, C_N]`` with one more
pseudo-query. ``full_attnres`` is the one-sublayer-per-block case. Both are the block router of
``routers/block/`` with no detail sources; the detail routers of arXiv:2606.06564
(``routers/multires.py``) add theirs.

Invariants kept (ROUTERS.md): zero-initialised pseudo-queries (a read at init is the plain
average of its sources), no 1/√d temperature, RMS-normalised keys and raw values, the embedding
never summed into block 1, and each completed block entering the pool exactly once.

Analytic cost (docs/FLOPS.md convention), per token: a read over n sources costs ≈ 7·n·d FLOP
(see :mod:`routers.mixer`); a write adds d (P += u). Live state at the read of sublayer k in
block b: (1 + (b−1)·(1+n_kinds) + 1 + n_kinds) tensors of (B, T, d).
"""

from __future__ import annotations

from .block.router import BlockRouter
from .registry import register


@register("block_attnres")
class BlockAttnRes(BlockRouter):
    """Block Attention Residuals (arXiv:2603.15031, Sec. "Block AttnRes"), no detail sources.

    The block router of :class:`routers.block.router.BlockRouter`, whose arguments it takes.
    """


@register("full_attnres")
class FullAttnRes(BlockRouter):
    """Full Attention Residuals (arXiv:2603.15031): sublayer k mixes ``[e, u_0, …, u_{k-1}]``.

    Exactly the block router with ``block_unit="sublayer"`` and one sublayer per block. Only the
    naive implementation: with one sublayer per block the block two-phase schedule degenerates
    to the naive read (the paper's chunked schedule for Full AttnRes merges individual outputs,
    a different algorithm that is not implemented here).

    Args:
        key_norm_gain: add a learnable d-vector gain to each read's key RMSNorm.
        impl: ``"naive"``.
    """

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
        schedule = self._schedule(schedule)
        return schedule + len(self.slots) / schedule

    def _schedule(self, schedule: int | None) -> int:
        sublayers = len(self.slots)
        if schedule is None:
            schedule = max(s for s in range(1, 17) if sublayers % s == 0)
        if not isinstance(schedule, int) or schedule < 1 or sublayers % schedule:
            raise ValueError(f"full_attnres: schedule={schedule!r} must be a positive divisor of "
                             f"2L = {sublayers}")
        return schedule

    def ideal_io_fwd_per_token(self, schedule: int | None = None) -> float:
        """The forward of the floor's model (docs/ROUTERS.md, "The ideal fwd+bwd model"): the
        two-phase schedule's reads counted exactly, where the paper's model
        (:meth:`ideal_io_per_token`) counts every chunk at its most. With C = 2L/S chunks of S
        sublayers: phase 1 of chunk j reads the embedding and the (j−1)·S completed outputs,
        (C + S·C(C−1)/2) / 2L per sublayer; phase 2 at the i-th sublayer of a chunk reads phase 1's
        result and the chunk's i−1 outputs so far, (S+1)/2 on average. At L = 12 (S = 12): 7.08
        (the paper's model: 14).

        Raises:
            ValueError: S is not a positive divisor of 2L.
        """
        S = self._schedule(schedule)
        C = len(self.slots) // S
        return (C + S * C * (C - 1) / 2) / len(self.slots) + (S + 1) / 2

    def ideal_io_fwd_bwd_per_token(self, schedule: int | None = None) -> float:
        """4·F + 2, F the forward of :meth:`ideal_io_fwd_per_token` (docs/ROUTERS.md, "The ideal
        fwd+bwd model"): a backward that per sublayer reads ∂h and writes ∂o (2), and re-reads
        every source the forward read and reads and writes its gradient (3F). At L = 12: 30.3."""
        fwd = self.ideal_io_fwd_per_token(schedule)
        return fwd + 2 + 3 * fwd
