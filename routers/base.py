"""The router contract (DESIGN.md, "The router contract") and the block layout rule.

Sublayers are indexed k = 0 .. 2L-1, attention at even k and MLP at odd k (ROUTERS.md). A router
is written once, in one form that every backend and compile scope runs. The loop (:func:`route`;
``workloads.decoder.Decoder.forward`` runs the same with its sublayers)::

    s = r.init_state(e)
    for slot, f in zip(r.slots, sublayers):
        role, p = r.role(slot), r.params(s, slot)
        s = r.write(s, role, p, f(r.read(s, role, p)))
    h_out = r.output(s, r.output_params())

Under the layer compile scope the decoder also passes ``region=True`` to ``init_state``,
``params`` and ``output_params``, calls :meth:`Router.begin` once after ``init_state``, and packs
the state across each region's boundary (:meth:`Router.pack`, :meth:`Router.unpack`).

A slot's **role** is static (Python constants) and never its index; its **params** are the
tensors that vary per slot (slices of stacked parameters, rows of the state) and Python ints of
the router's static plan. Under the layer compile scope the decoder compiles one region per role
around ``read``, the sublayer and ``write``, and hands it the params, so a region's graph does not
change with depth. Slots are static Python values, so the loop unrolls under
``torch.compile(fullgraph=True)`` and replays inside a CUDA graph.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import Tensor, nn

from . import impls as _impls
from .errors import ConfigError


class Offered:
    """A class attribute computed from the impl registry: ``of(cls.name)`` (a tuple of impl
    names), so that a router's impls follow the impls registered for it (``routers/impls.py``)."""

    def __init__(self, of: Callable[[str], tuple[str, ...]]) -> None:
        self.of = of

    def __get__(self, obj: object, cls: type) -> tuple[str, ...]:
        return self.of(cls.name)


def offered_impls(router: str) -> tuple[str, ...]:
    """The impls ``router`` offers (:attr:`Router.impls`): its family's registered built-ins that
    run on a CPU too (which the tests and sweeps iterate; ``fused`` needs CUDA), or
    ``(REFERENCE,)`` for a router of no family."""
    got = tuple(i.name for i in _impls.impls_for(router) if i.builtin and "cpu" in i.devices)
    return got or (_impls.REFERENCE,)


def modelled_impls(router: str) -> tuple[str, ...]:
    """The impls of ``router`` its cost models describe: those that declare a state model
    (:class:`routers.impls.StateModel`)."""
    return tuple(i.name for i in _impls.impls_for(router) if i.state is not None)


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
    """Base class of every residual router (the module doc's contract).

    Subclasses implement :meth:`init_state`, :meth:`read`, :meth:`write`, :meth:`output`, and
    may declare the cost models (:meth:`analytic_fwd_flops`, :meth:`live_state_bytes`,
    :meth:`ideal_io_per_token`, …; every built-in does; a default returns None, "not declared",
    ``routers/api.py``), and where a slot's read or write needs more than the state,
    :meth:`role` and :meth:`params`. ``self.slots`` defaults to one block of all 2L sublayers; a
    block router sets its own layout in ``__init__``. Options are keyword-only arguments of ``__init__`` with
    defaults (``routerbench list`` reads them from the signature).

    Args:
        d_model: residual width d.
        n_layers: transformer layers L.
    """

    name: str = "?"
    #: implementations this router offers (``impl=`` option); the first is the default: the
    #: registered built-in impls of its family that run anywhere (:func:`offered_impls`),
    #: or the reference alone for a router of no family.
    impls = Offered(offered_impls)
    #: The router its paper measures it against, beside the PreNorm residual every router is
    #: compared with (``None``: prenorm only). Where both ran in one paired group, the sweep times
    #: it as a partner (:func:`harness.sweep.timed.partners`) and the reports quote the paired
    #: ratio to it (:func:`reports.paper_baseline.paired_vs_paper_table`).
    paper_baseline: str | None = None

    def __init__(self, d_model: int, n_layers: int) -> None:
        super().__init__()
        self.d_model = d_model
        self.n_layers = n_layers
        self.slots: tuple[Slot, ...] = single_block_slots(n_layers)

    @abc.abstractmethod
    def init_state(self, embedding: Tensor, region: bool = False) -> Any:
        """The state before sublayer 0, from the token embedding e of shape (B, T, d).

        ``region``: made for the layer compile scope, whose state may be laid out for a fixed
        length (:meth:`begin` finishes it outside any region)."""

    def begin(self, state: Any) -> Any:
        """The layer scope's state, from :meth:`init_state`'s, outside any region (a fixed-length pool
        whose tensors must be distinct objects is made here). Default: ``state``."""
        return state

    def role(self, slot: Slot) -> tuple:
        """The static key of ``slot``'s read and write: hashable Python constants, never the
        slot's index. The layer scope compiles one region per (sublayer kind, *role); ``read``
        and ``write`` get the role itself, without the kind. Default: ``()``, the same at every
        slot."""
        return ()

    def params(self, state: Any, slot: Slot, region: bool = False) -> tuple:
        """What ``slot``'s read and write take beside the state and role: tensors (a slice of a
        stacked parameter, a row of the state; views, no host data) and Python values of the
        static plan. Under the layer scope (``region``) every per-slot value must be a tensor,
        since the region is shared by every slot of the role. Default: ``()``."""
        return ()

    @abc.abstractmethod
    def read(self, state: Any, role: tuple, params: tuple) -> Tensor:
        """h_k, the input of the slot's sublayer, shape (B, T, d)."""

    @abc.abstractmethod
    def write(self, state: Any, role: tuple, params: tuple, update: Tensor) -> Any:
        """The state after the slot's sublayer returned ``update`` u_k of shape (B, T, d)."""

    def output_params(self, region: bool = False) -> tuple:
        """The tensors the readout takes (its own parameter rows), as :meth:`params`. Default: ``()``."""
        return ()

    @abc.abstractmethod
    def output(self, state: Any, params: tuple = ()) -> Tensor:
        """h_out, the input of the final RMSNorm, shape (B, T, d)."""

    def pack(self, state: Any) -> Any:
        """The state as it crosses a compiled region's boundary: tensors, None and plain tuples
        only (some torch versions' Dynamo rebuild a NamedTuple output with fields missing).
        Default: ``state``; a router whose state is a NamedTuple returns ``tuple(state)`` and
        rebuilds it in :meth:`unpack`."""
        return state

    def unpack(self, state: Any) -> Any:
        """The inverse of :meth:`pack`. Default: ``state``."""
        return state

    def check_region_form(self) -> None:
        """Raise where this instance cannot run under the layer compile scope (a peer kernel that
        reads the slot itself). Default: nothing.

        Raises:
            NotImplementedError: no region form (use ``--compile-scope model``).
        """

    def options(self) -> dict[str, Any]:
        """The resolved options of this instance (JSON-able), for the ``router_options`` column."""
        return {}

    # --- cost models (MEASUREMENT.md "FLOPs" and "Memory"; docs/FLOPS.md) ----------------------
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
            FLOP (a float holding an integer); None where the router declares no model (the
            default: reports say "not declared", ``routers.api.declares``).
        """
        return None

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
            bytes; None where the router declares no model (the default: "not declared").

        Raises:
            ValueError: ``impl`` is not an implementation of this router.
        """
        return None

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
            elements of width d moved per token and sublayer; None where the router declares no
            model (the default: "not declared").

        Raises:
            ValueError: ``schedule`` given to a router that does not take one, or invalid.
        """
        return None

    def ideal_io_fwd_per_token(self) -> float:
        """The forward of the **ideal fwd+bwd model** (docs/ROUTERS.md, "The ideal fwd+bwd model"),
        the floor of a forward step, units of d elements per token and sublayer: every input of a
        fused step read once and every output written once, what a step reads counted exactly.
        It is :meth:`ideal_io_per_token` (the paper's Table 1 model) except where that model
        bounds the reads from above: a block router's phase 1 (the full pool at every block) and
        ``full_attnres``'s chunks, which count less here."""
        return self.ideal_io_per_token()

    def ideal_io_fwd_bwd_per_token(self) -> float | None:
        """Residual-stream traffic of one training step (forward and backward) per token and per
        sublayer under the **ideal fwd+bwd model** (docs/ROUTERS.md, "The ideal fwd+bwd model"),
        units of d elements: the forward of :meth:`ideal_io_fwd_per_token`, plus a backward that, for
        each fused step, reads the gradient of each tensor the step wrote, re-reads each input its
        gradient needs (the sources of a softmax mix, the factor of a product; not the operands
        of a sum), writes the gradient of each input unless it passes through unchanged, and
        reads and writes once more a gradient that gathers a further contribution. prenorm: 6.
        The physical floor of a training step is (this − prenorm's) × d × bytes / bandwidth.

        Returns:
            elements of width d per token and sublayer; None where the router declares no model
            (the floor then says "not declared").
        """
        return None

    def _cost_impl(self, impl: str | None) -> str:
        """The implementation a cost model describes: ``impl``, else ``self.impl``, else naive.

        Raises:
            ValueError: ``impl`` is not in ``self.cost_models`` (the impls a cost model describes;
                ``self.impls`` where a router sets none).
        """
        modelled = getattr(self, "cost_models", self.impls)
        if impl is None:  # a peer kernel costs what the schedule it runs costs (routers/impls.py)
            own = getattr(self, "impl", self.impls[0])
            impl = own if own in modelled else getattr(self, "schedule", None) or own
        if impl not in modelled:
            raise ValueError(f"impl={impl!r} is not an implementation of {self.name}; "
                             f"choose one of {modelled}")
        return impl


def route(router: Router, embedding: Tensor, sublayer: Callable[[Slot, Tensor], Tensor],
          region: bool = False) -> tuple[list[Tensor], Tensor, Any]:
    """The contract's loop (module doc) outside a decoder: drives ``router`` over its slots.

    Args:
        router: any router.
        embedding: e, (B, T, d).
        sublayer: ``(slot, h) -> u``, the update of the slot's sublayer from its input (B, T, d).
        region: run the state and parameters of the layer compile scope (``init_state(region=True)``,
            :meth:`Router.begin`; a block router's padded pool), eagerly, without compiling.

    Returns:
        (the 2L reads h_k, h_out, the final state).
    """
    state, reads = router.init_state(embedding, region), []
    if region:
        state = router.begin(state)
    for slot in router.slots:
        role = router.role(slot)
        p = router.params(state, slot, region)
        h = router.read(state, role, p)
        reads.append(h)
        state = router.write(state, role, p, sublayer(slot, h))
    return reads, router.output(state, router.output_params(region)), state
