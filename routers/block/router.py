"""The block router (Attention Residuals, arXiv:2603.15031; WAV v1 / HAARES, arXiv:2606.06564):
what ``block_attnres``, ``full_attnres``, ``haares`` and ``wav_v1`` share. Each read mixes, by a
softmax over sources with one pseudo-query per sublayer, the embedding e, the summaries
``C_b = Σ_{i∈b} u_i`` of the completed blocks (with any detail sources of theirs) and, from the
block's second sublayer on, the partial sum P of the current block; the readout mixes
``[e, C_1, …, C_N]`` with one more pseudo-query.

A subclass states its sources: ``detail_kinds``, and the hooks :meth:`BlockRouter._coefficients`,
:meth:`BlockRouter._partial_kinds` and :meth:`BlockRouter._match` (``routers/multires.py``). The
contract's methods (DESIGN.md, "The router contract") hand the slot's role and params to its
schedule: ``routers/block/naive.py`` or ``routers/block/two_phase.py``, whose math is the impl's
:class:`routers.block.phases.Phases`. The static plan (``routers/block/plan.py``) is made here,
once the options that shape the pools are set.
"""

from __future__ import annotations

import functools
from typing import Callable, ContextManager

import torch
from torch import Tensor, nn

from .. import impls as _impls
from ..base import Offered, Router, Slot, block_layout, modelled_impls
from ..errors import ConfigError
from .. import reference as _ref
from . import naive, two_phase
from .costs import BlockCosts
from .phases import PLAIN, Phases, inv_rms, readout
from .plan import BlockPlan


def phases_of(spec: _impls.Impl) -> Phases:
    """The two-phase math ``spec`` runs: its whole :class:`Phases` (a built-in's), a peer's
    ``(phase1, merge)`` with our inverse RMS and readout, or plain autograd (None)."""
    if isinstance(spec.phases, Phases):
        return spec.phases
    return Phases(inv_rms, *spec.phases, readout) if spec.phases is not None else PLAIN


class BlockRouter(BlockCosts, Router):
    """The block routers' construction and contract (module doc).

    Args:
        d_model: width d.
        n_layers: transformer layers L (2L sublayers).
        n_blocks: N; default the largest divisor of L that is at most 8.
        block_unit: ``"layer"`` (blocks of whole layers, paper rule) or ``"sublayer"``.
        key_norm_gain: add a learnable d-vector gain to each read's key RMSNorm.
        impl: ``"naive"`` stacks the sources and mixes at every read (the reference);
            ``"two_phase"`` batches a block's queries over the completed sources once per block
            and merges the partial block per sublayer by online softmax; ``"lean"`` is that
            schedule with a backward that keeps the sources once and a few statistics per token
            (``routers/block/lean.py``); a peer's name runs its kernels (``routers/impls.py``).

    Raises:
        ConfigError: invalid ``n_blocks``, ``block_unit`` or ``impl``.
    """

    #: the impls the cost models describe: the registered impls of this router that declare a
    #: state model (:func:`routers.base.modelled_impls`; also ``fused``, which runs only with Triton on
    #: CUDA or under its interpreter, so is not in :attr:`impls`)
    cost_models = Offered(modelled_impls)
    #: detail bases this router adds per block, in pool order ("phase", "split"); none for AttnRes.
    detail_kinds: tuple[str, ...] = ()
    #: ρ, the cap of a detail's RMS-matching gain (the multi-resolution routers set theirs).
    max_detail_scale = 1.0
    #: Observation hook of the ``naive`` path (``harness.training.diagnose``); None (the default) costs one
    #: attribute test per read. When an instance sets it to a callable, every eager naive read and
    #: the readout call ``weight_recorder(read, kinds, alpha)``: ``read`` the pseudo-query index
    #: (sublayer k, or 2L for the readout), ``kinds`` the pool's source kinds in pool order (None
    #: for a state source e, C_b, P; j for a detail of kind ``detail_kinds[j]``), ``alpha`` the
    #: detached softmax weights (n, B, T). The two-phase schedule never calls it.
    weight_recorder: Callable[[int, tuple, Tensor], None] | None = None
    #: Where ``lean``'s backward runs its recompute: a factory of a context manager (the FLOP
    #: counter of ``harness.sweep.counts`` sets it on the router it counts), or None.
    recompute_scope: Callable[[], ContextManager] | None = None

    def __init__(self, d_model: int, n_layers: int, *, n_blocks: int | None = None,
                 block_unit: str = "layer", key_norm_gain: bool = False, impl: str = "naive") -> None:
        super().__init__(d_model, n_layers)
        known = [i.name for i in _impls.impls_for(self.name)] or list(self.impls)
        if impl not in known:
            raise ConfigError(f"impl {impl!r} is not an implementation of {self.name}; "
                              f"choose one of {tuple(known)}")
        spec = _impls.get(impl, self.name)
        self.impl = impl
        #: the schedule this impl runs (a peer kernel plugs into naive or two_phase)
        self.schedule = spec.schedule
        #: why this impl has no region form (``--compile-scope layer``), or None; a peer's depth
        #: mixer (naive schedule), or None
        self.no_layer_scope, self.peer_mix = spec.no_layer_scope, spec.mix
        #: the two-phase math: the impl's own (lean's Functions, fused's ops), a peer's phases, or
        #: plain autograd
        self.phases = phases_of(spec)
        self.block_unit = block_unit
        self.slots = block_layout(n_layers, n_blocks, block_unit)
        self.n_blocks = self.slots[-1].block
        n_reads = 2 * n_layers + 1  # one pseudo-query per sublayer plus the readout
        self.pseudo_query = nn.Parameter(torch.zeros(n_reads, d_model))
        self.key_gain = nn.Parameter(torch.ones(n_reads, d_model)) if key_norm_gain else None
        self.readout_details = False
        self._build_plan()

    def _build_plan(self) -> None:
        """The static plan and its buffers (integer and float32 tables that follow the model to its
        device; ``Decoder.to(dtype)`` casts neither, and a read takes slices of them); called again
        by a subclass once its options, which change the pools, are set."""
        self.plan = BlockPlan(self)
        check = _impls.get(self.impl, self.name).check
        if check is not None:  # the impl's own limits (fused: its kernels')
            check(self)
        self.register_buffer("plan_codes", self.plan.codes, persistent=False)
        self.register_buffer("coef_table", self.plan.coefficient_table, persistent=False)

    # --- the sources (overridden by the multi-resolution routers) -----------------------------
    def _coefficients(self, slot: Slot) -> tuple[int, ...]:
        """±1 coefficient of this slot's update in each detail basis (``detail_kinds`` order)."""
        return ()

    def _partial_kinds(self, slot: Slot) -> tuple[int, ...]:
        """Indices of the partial details a read at ``slot`` sees (after P)."""
        return ()

    def _match(self, detail: Tensor, state: Tensor) -> Tensor:
        """A detail as it enters a read: RMS-matched to its state basis (identity here)."""
        return detail

    def recorder(self, read: int, kinds: tuple[int | None, ...]) -> Callable[[Tensor], None] | None:
        """The ``recorder`` of :func:`routers.mixer.depth_mix` for one read (None unless
        ``weight_recorder`` is set)."""
        rec = self.weight_recorder
        return None if rec is None else functools.partial(rec, read, kinds)

    # --- the contract ---------------------------------------------------------------------------
    def init_state(self, embedding: Tensor, region: bool = False):
        if self.schedule == "two_phase":
            return two_phase.init(self, embedding, region)
        return naive.init(self, embedding, region)

    def begin(self, state):
        """The layer scope's two-phase pool is padded to a fixed length (naive's grows)."""
        return two_phase.begin(self, state) if self.schedule == "two_phase" else state

    def role(self, slot: Slot) -> tuple:
        return self.plan.roles[slot.index]

    def params(self, state, slot: Slot, region: bool = False) -> tuple:
        if self.schedule == "two_phase":
            return two_phase.params(self, state, slot, region)
        return naive.params(self, state, slot, region)

    def read(self, state, role: tuple, params: tuple) -> Tensor:
        if self.schedule == "two_phase":
            return two_phase.read(self, state, role, params)
        return naive.read(self, state, role, params)

    def write(self, state, role: tuple, params: tuple, update: Tensor):
        if self.schedule == "two_phase":
            return two_phase.write(self, state, role, params, update)
        return naive.write(self, state, role, params, update)

    def output_params(self, region: bool = False) -> tuple:
        if self.schedule == "two_phase":
            return two_phase.output_params(self, region)
        return naive.output_params(self, region)

    def output(self, state, params: tuple = ()) -> Tensor:
        if self.schedule == "two_phase":
            return two_phase.output(self, state, params)
        return naive.output(self, state, params)

    def reference(self, embedding: Tensor, updates: list[Tensor]) -> tuple[list[Tensor], Tensor]:
        """The float64 pools and mixes of every read, the bases recomputed from the updates
        (:func:`routers.reference.block_router`)."""
        return _ref.block_router(self, embedding, updates)

    def pack(self, state) -> tuple:
        return tuple(state)

    def unpack(self, state):
        return (two_phase.TwoPhaseState if self.schedule == "two_phase" else naive.NaiveState)(*state)

    def check_region_form(self) -> None:
        """An impl without a region form (a peer kernel's: ``Impl.no_layer_scope``) runs under the
        model scope only.

        Raises:
            NotImplementedError: this impl has no region form (use ``--compile-scope model``).
        """
        if self.no_layer_scope:
            raise NotImplementedError(f"impl {self.impl} of {self.name} {self.no_layer_scope} for "
                                      "--compile-scope layer; use --compile-scope model")

    def options(self) -> dict:
        return {"n_blocks": self.n_blocks, "block_unit": self.block_unit,
                "key_norm_gain": self.key_gain is not None}
