"""What one step of a router dispatches and moves, counted on the meta device and never timed
(MEASUREMENT.md, "The byte rule"): the instrument of ``routerbench costs``.

A router runs alone through the contract's loop (:func:`routers.base.route`; ``region=True`` is the
layer scope's padded pool) on meta tensors of the case's shape, one forward and (``backward``) its
backward, each sublayer an identity whose backward hands the update's gradient to its input, as a
real sublayer does, with no op of its own. A ``TorchDispatchMode`` sees every op:

- a ``fused`` custom op (``routers.block.fused.IMPLEMENTATIONS``) runs its own implementation with a
  :class:`routers.block.fused_bytes.RecordedLaunches` for the kernels module, so its Triton
  launches are recorded, not run (no Triton needed), each with the bytes of its declared byte model
  (:mod:`routers.block.fused_bytes`), and the torch ops of its launcher are seen as other ops;
- every other op that launches work (not a view, an alias or an allocation) is one launch, its
  bytes by :func:`harness.costs.traffic.op_bytes` (each distinct tensor read once, each output
  written once).

Bytes per token and sublayer are the step's bytes over R = B·T tokens and 2L sublayers; units are
that over d elements of the step's dtype. Saved activations are the distinct tensors autograd saves
in the forward (views counted at their base), the router's parameters left out.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode

from routers import build_router, route

from .traffic import moves_nothing, op_bytes


@dataclass
class StepCosts:
    """What one step of a router launches and moves (bytes by the byte rule), and what it saves.

    Attributes:
        launches_kernel, launches_other: Triton launches (``fused``) and other ops that launch work.
        bytes_kernel, bytes_other: their bytes; ``asked_kernel`` the kernels' bytes as asked (every
            load of a parameter counted, what Triton's interpreter counts).
        saved_bytes: what autograd saves in the forward.
        tokens, sublayers, d, itemsize: R = B·T, 2L, the width and the bytes of an element.
        kernels, others: launches and bytes per kernel or op name; ``tuning_keys`` the distinct
            (kernel, autotune key) pairs of the step.
    """

    tokens: int
    sublayers: int
    d: int
    itemsize: int
    launches_kernel: int = 0
    launches_other: int = 0
    bytes_kernel: int = 0
    bytes_other: int = 0
    asked_kernel: int = 0
    saved_bytes: int = 0
    kernels: Counter = field(default_factory=Counter)
    others: Counter = field(default_factory=Counter)
    kernel_bytes: Counter = field(default_factory=Counter)
    #: (kernel name, autotune key) of every launch (``routers.block.fused_bytes.autotune_key``)
    tuning_keys: set = field(default_factory=set)
    other_bytes: Counter = field(default_factory=Counter)

    @property
    def launches(self) -> int:
        return self.launches_kernel + self.launches_other

    @property
    def bytes(self) -> int:
        return self.bytes_kernel + self.bytes_other

    def per_token_sublayer(self, nbytes: float) -> float:
        """``nbytes`` per token and sublayer, in bytes."""
        return nbytes / (self.tokens * self.sublayers)

    def units(self, nbytes: float) -> float:
        """``nbytes`` per token and sublayer in units of d elements of the step's dtype."""
        return self.per_token_sublayer(nbytes) / (self.d * self.itemsize)


class _Recorder(TorchDispatchMode):
    def __init__(self, costs: StepCosts) -> None:
        super().__init__()
        self.costs = costs

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        from routers.block import fused, fused_bytes
        impl = fused.IMPLEMENTATIONS.get(func._schema.name)
        c = self.costs
        if impl is not None:  # the op's launches recorded, its launcher's torch ops seen as ops
            rec = fused_bytes.RecordedLaunches()
            with self:
                out = impl(rec, *args, **kwargs)
            c.tuning_keys.update(rec.keys)
            for name, _, moved in rec.launches:
                c.launches_kernel += 1
                c.bytes_kernel += moved.rule
                c.asked_kernel += moved.asked
                c.kernels[name] += 1
                c.kernel_bytes[name] += moved.rule
            return out
        out = func(*args, **kwargs)
        if not moves_nothing(func) and func is not torch.ops.aten.detach.default:
            r, w = op_bytes(func, args, kwargs, out)
            c.launches_other += 1
            c.bytes_other += r + w
            c.others[str(func)] += 1
            c.other_bytes[str(func)] += r + w
        return out


class _Sublayer(torch.autograd.Function):
    """A sublayer that returns the slot's update and hands the update's gradient to its input, with
    no op of its own (what a real sublayer's backward does, less its own work)."""

    @staticmethod
    def forward(ctx, h: Tensor, u: Tensor) -> Tensor:
        return u.view_as(u)

    @staticmethod
    def backward(ctx, g: Tensor):
        return g.view_as(g), None  # a tensor of its own, as a real sublayer's input gradient is


def _saved(params: set[int]):
    """saved_tensors_hooks that collect the distinct saved tensors' bytes (views at their base)."""
    seen: dict[int, int] = {}

    def pack(t: Tensor) -> Tensor:
        base = t._base if t._base is not None else t
        if id(base) not in params:
            seen[id(base)] = base.numel() * base.element_size()
        return t
    return seen, pack


def step_costs(router: str, d_model: int, n_layers: int, tokens: int, dtype: torch.dtype = torch.bfloat16,
               impl: str | None = None, options: dict[str, Any] | None = None, region: bool = False,
               backward: bool = True) -> StepCosts:
    """Count one step of ``route()`` of ``router`` at width ``d_model``, ``n_layers`` layers and
    ``tokens`` = B·T rows, in ``dtype``, on the meta device.

    Args:
        impl: the router's ``impl`` option (None: its default).
        options: its other options.
        region: the layer compile scope's state (a block router's padded pool).
        backward: count the backward too (a ``fwd_bwd`` step); else the forward alone.

    Returns:
        the :class:`StepCosts` of the step.

    Raises:
        routers.errors.ConfigError: an unknown router, impl or option, or a shape the impl refuses
            (``fused`` past its widest d).
    """
    from routers import router_options
    opts = dict(options or {})
    if impl is not None and "impl" in router_options(router):  # a router of one implementation takes none
        opts["impl"] = impl
    with torch.device("meta"):
        r = build_router(router, d_model, n_layers, **opts).to(dtype=dtype)
        e = torch.empty((1, tokens, d_model), dtype=dtype, requires_grad=backward)
        updates = [torch.empty((1, tokens, d_model), dtype=dtype) for _ in r.slots]
    costs = StepCosts(tokens=tokens, sublayers=len(r.slots), d=d_model, itemsize=e.element_size())
    seen, pack = _saved({id(p) for p in r.parameters()})
    with torch.set_grad_enabled(backward), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), \
            _Recorder(costs):
        _, out, _ = route(r, e, lambda slot, h: _Sublayer.apply(h, updates[slot.index]), region=region)
        costs.saved_bytes = sum(seen.values())
        if backward:
            torch.autograd.backward([out], [torch.empty_like(out)])
    return costs
