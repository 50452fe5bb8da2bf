"""The router contract (DESIGN.md, "The router contract") and the block layout rule.

Sublayers are indexed k = 0 .. 2L-1, attention at even k and MLP at odd k (ROUTERS.md). The
decoder runs::

    s = r.init_state(e)
    for slot, f in zip(r.slots, sublayers):
        s = r.write(s, slot, f(r.read(s, slot)))
    h_out = r.output(s)

Slots are static Python values, so the loop unrolls under ``torch.compile(fullgraph=True)`` and
replays inside a CUDA graph.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from .errors import ConfigError


@dataclass(frozen=True)
class Slot:
    """Static position of one sublayer.

    Attributes:
        index: sublayer index k, 0 .. 2L-1.
        kind: ``"attn"`` (even k) or ``"mlp"`` (odd k).
        block: block number 1..N (block routers); 1 for the others.
        pos: position p inside its block, from 0.
        block_len: sublayers m in this block.
    """

    index: int
    kind: str
    block: int
    pos: int
    block_len: int

    @property
    def last_in_block(self) -> bool:
        return self.pos == self.block_len - 1


def default_n_blocks(n_layers: int) -> int:
    """The largest divisor of ``n_layers`` that is at most 8 (48 → 8, 24 → 8, 12 → 6, 4 → 4)."""
    return max(n for n in range(1, min(8, n_layers) + 1) if n_layers % n == 0)


def block_layout(n_layers: int, n_blocks: int | None = None, block_unit: str = "layer") -> tuple[Slot, ...]:
    """Cut 2L sublayers into N blocks (Attention Residuals, arXiv:2603.15031, block rule).

    Blocks are runs of whole layers (``block_unit="layer"``, the paper's rule: a boundary falls
    before an attention sublayer) or of sublayers (``block_unit="sublayer"``). A count that does
    not divide the units gives the remainder to the last block (paper rule).

    Args:
        n_layers: transformer layers L.
        n_blocks: N; default :func:`default_n_blocks` (whole-layer blocks in either unit).
        block_unit: ``"layer"`` or ``"sublayer"``.

    Returns:
        2L slots in sublayer order.

    Raises:
        ConfigError: unknown ``block_unit``, or ``n_blocks`` < 1 or more than the units.
    """
    if block_unit not in ("layer", "sublayer"):
        raise ConfigError(f"block_unit must be 'layer' or 'sublayer', got {block_unit!r}")
    units = n_layers if block_unit == "layer" else 2 * n_layers
    per_unit = 2 if block_unit == "layer" else 1
    if n_blocks is None:
        n_blocks = default_n_blocks(n_layers)
    if not isinstance(n_blocks, int) or isinstance(n_blocks, bool):
        raise ConfigError(f"n_blocks must be an integer in 1..{units}, got {n_blocks!r} "
                          f"({type(n_blocks).__name__})")
    if not 1 <= n_blocks <= units:
        raise ConfigError(f"n_blocks={n_blocks} must be in 1..{units} "
                          f"({block_unit}s available with block_unit={block_unit!r})")
    base = units // n_blocks
    sizes = [base] * (n_blocks - 1) + [units - base * (n_blocks - 1)]
    slots, k = [], 0
    for b, size in enumerate(sizes, start=1):
        m = size * per_unit
        for p in range(m):
            slots.append(Slot(index=k, kind="attn" if k % 2 == 0 else "mlp", block=b, pos=p, block_len=m))
            k += 1
    return tuple(slots)


def single_block_slots(n_layers: int) -> tuple[Slot, ...]:
    """Slots of a router without blocks: one block holding all 2L sublayers."""
    return tuple(Slot(index=k, kind="attn" if k % 2 == 0 else "mlp", block=1, pos=k,
                      block_len=2 * n_layers) for k in range(2 * n_layers))


class Router(nn.Module, abc.ABC):
    """Base class of every residual router.

    Subclasses set ``self.slots`` in ``__init__`` and implement :meth:`init_state`, :meth:`read`,
    :meth:`write` and :meth:`output`. Options are keyword-only arguments of ``__init__`` with
    defaults (``routerbench list`` reads them from the signature).

    Args:
        d_model: residual width d.
        n_layers: transformer layers L.
    """

    name: str = "?"
    #: implementations this router offers (``impl=`` option); the first is the default.
    impls: tuple[str, ...] = ("naive",)

    def __init__(self, d_model: int, n_layers: int) -> None:
        super().__init__()
        self.d_model = d_model
        self.n_layers = n_layers
        self.slots: tuple[Slot, ...] = single_block_slots(n_layers)

    @abc.abstractmethod
    def init_state(self, embedding: Tensor) -> Any:
        """State before sublayer 0, from the token embedding e of shape (B, T, d)."""

    @abc.abstractmethod
    def read(self, state: Any, slot: Slot) -> Tensor:
        """h_k, the input of sublayer ``slot.index``, shape (B, T, d)."""

    @abc.abstractmethod
    def write(self, state: Any, slot: Slot, update: Tensor) -> Any:
        """The state after sublayer ``slot.index`` returned ``update`` u_k of shape (B, T, d)."""

    @abc.abstractmethod
    def output(self, state: Any) -> Tensor:
        """h_out, the input of the final RMSNorm, shape (B, T, d)."""

    def options(self) -> dict[str, Any]:
        """The resolved options of this instance (JSON-able), for the ``router_options`` column."""
        return {}

    # --- regions: the layer compile scope (DESIGN.md, "Backends and modes") --------------------
    # Under ``--compile-scope layer`` the decoder compiles one region per sublayer *role* and calls
    # it at every slot of that role: ``region_read``, the sublayer, ``region_write``. A region's
    # graph may depend only on ``region_role(slot)`` (static, never the slot's index) and on the
    # shapes of its tensors; whatever else varies per slot reaches it as a tensor of
    # ``region_params`` (a slice of a stacked parameter, a row of the state), computed outside the
    # region. The region state may have another layout than the eager one (a padded pool of fixed
    # length); ``region_init`` makes it, ``region_output`` reads it.
    def region_role(self, slot: Slot) -> tuple:
        """The static key of ``slot``'s read and write inside a compiled region (hashable; the
        sublayer's kind is added by the decoder). Default: ``()``, the same at every slot."""
        return ()

    def region_params(self, state: Any, slot: Slot) -> tuple:
        """The tensors (or None) a region of ``slot`` takes beside the state, computed outside it:
        per-slot parameter slices (α_k, a pseudo-query row) and state rows chosen by the slot's
        position. Default: ``()``."""
        return ()

    def region_init(self, embedding: Tensor) -> Any:
        """The region state before sublayer 0, from e (B, T, d). Default: :meth:`init_state`."""
        return self.init_state(embedding)

    def region_pack(self, state: Any) -> Any:
        """The region state as it crosses a compiled region's boundary: tensors, None and plain
        tuples only (some torch versions' Dynamo rebuild a NamedTuple output with fields
        missing). Default: ``state``; a router whose region state is a NamedTuple returns
        ``tuple(state)`` and rebuilds it in :meth:`region_unpack`."""
        return state

    def region_unpack(self, state: Any) -> Any:
        """The inverse of :meth:`region_pack`. Default: ``state``."""
        return state

    def region_begin(self, state: Any) -> Any:
        """The region state after the init region, outside any region (eager: a layout whose
        tensors must be distinct objects is made here). Default: ``state``."""
        return state

    def region_read(self, state: Any, role: tuple, params: tuple) -> Tensor:
        """h_k (B, T, d) of a slot of ``role`` with ``params``, inside a region.

        Raises:
            NotImplementedError: the router has no region form (use ``--compile-scope model``).
        """
        raise NotImplementedError(f"router {self.name} has no region form for --compile-scope layer; "
                                  "use --compile-scope model")

    def region_write(self, state: Any, role: tuple, params: tuple, update: Tensor) -> Any:
        """The region state after a slot of ``role`` returned ``update`` (B, T, d).

        Raises:
            NotImplementedError: the router has no region form (use ``--compile-scope model``).
        """
        raise NotImplementedError(f"router {self.name} has no region form for --compile-scope layer; "
                                  "use --compile-scope model")

    def region_output_params(self) -> tuple:
        """The tensors the head region's readout takes (its own parameter rows), computed outside
        it, so the head region does not depend on the depth either. Default: ``()``."""
        return ()

    def region_output(self, state: Any, params: tuple = ()) -> Tensor:
        """h_out (B, T, d) from the region state and :meth:`region_output_params`. Default:
        :meth:`output`."""
        return self.output(state)

    # --- cost models (MEASUREMENT.md "FLOPs" and "Memory"; docs/FLOPS.md) ----------------------
    @abc.abstractmethod
    def analytic_fwd_flops(self, batch_size: int, seq_len: int) -> float:
        """Closed-form forward FLOP of the router's mixing for one forward of B·T tokens.

        Convention of docs/FLOPS.md: FLOP = 2·FMA, elementwise ops 1 FLOP per output element,
        forward only, work whose result nothing reads is not counted (the trace drops it). Covers
        ``init_state``, every ``read`` and ``write`` over ``self.slots`` and the readout, for the
        ``naive`` implementation; equals ``2 * harness.costs.flops.count_router_fma(router, B, T)`` and
        ``2 * count_fwd_flops(decoder, (idx,)).router_fma`` exactly (tests/test_costs.py).

        Args:
            batch_size: B.
            seq_len: T.

        Returns:
            FLOP (a float holding an integer).
        """

    @abc.abstractmethod
    def live_state_bytes(self, batch_size: int, seq_len: int, dtype: "torch.dtype | None" = None,
                         impl: str | None = None) -> int:
        """Peak bytes of router state kept alive between sublayers during one forward.

        The state is what ``init_state`` / ``write`` return and the next ``read`` / ``write`` /
        ``output`` consumes: tensors of shape (B, T, d) (e, running stream h, completed-block
        sources, partial sums …) plus any implementation statistics. The peak is the maximum over
        the states after ``init_state`` and after each ``write`` of the bytes of their distinct
        storages (an alias, e.g. a partial sum that *is* the update, counts once). Temporaries of
        a read or write are not state.

        Args:
            batch_size: B.
            seq_len: T.
            dtype: dtype of the router's tensors (``None``: ``torch.float32``).
            impl: implementation to model (``None``: this instance's ``impl``, else ``"naive"``).

        Returns:
            bytes.

        Raises:
            ValueError: ``impl`` is not an implementation of this router.
        """

    @abc.abstractmethod
    def ideal_io_per_token(self, schedule: int | None = None) -> float:
        """Residual-stream memory traffic per token and per sublayer under the **ideal I/O model**.

        Model of the Attention Residuals paper (Kimi Team, arXiv:2603.15031, Table 1; inference):
        every input of a fused step is read once and every output written once, a block router
        runs the two-phase schedule; parameters (pseudo-queries, gains) are amortised over tokens
        and count 0. The figure is averaged over the 2L sublayers and given in **units of d
        elements** (multiply by d · bytes per element for bytes). It is a model, not a
        measurement: ``harness.costs.traffic.router_bytes_moved`` measures what an implementation moves.

        Args:
            schedule: S, sublayers per two-phase chunk (``full_attnres`` only; others take None).

        Returns:
            elements of width d moved per token and sublayer.

        Raises:
            ValueError: ``schedule`` given to a router that does not take one, or invalid.
        """

    def _cost_impl(self, impl: str | None) -> str:
        """The implementation a cost model describes: ``impl``, else ``self.impl``, else naive.

        Raises:
            ValueError: ``impl`` is not in ``self.impls``.
        """
        if impl is None:  # a peer kernel costs what the schedule it runs costs (routers/impls.py)
            own = getattr(self, "impl", self.impls[0])
            impl = own if own in self.impls else getattr(self, "schedule", None) or own
        if impl not in self.impls:
            raise ValueError(f"impl={impl!r} is not an implementation of {self.name}; "
                             f"choose one of {self.impls}")
        return impl
