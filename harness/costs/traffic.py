"""Measured memory traffic: the bytes each executed aten op reads and writes (MEASUREMENT.md,
"FLOPs": bytes an implementation actually moves are a separate figure from the ideal I/O model).

Counting rule, per aten op seen by a ``TorchDispatchMode`` (i.e. per kernel that eager PyTorch
runs, after composite ops such as ``rms_norm`` or ``einsum`` have decomposed; no fusion):

- **read**: the bytes of each distinct tensor argument (tensors inside lists too, e.g. ``stack``),
  except write-only destinations (``out=`` arguments; ``self`` of ``copy_``, ``fill_``,
  ``zero_``). An in-place op (``add_``) reads its ``self``.
- **written**: the bytes of each tensor it returns (the mutated ``self`` of an in-place op).
- **0** for view and alias ops, which move nothing: every op whose schema returns an alias that
  is not written (``OpOverload.is_view``: ``view``, ``select``, ``permute``, ``expand``,
  ``unsqueeze``, ``detach``, ``lift_fresh`` …), plus ``_unsafe_view`` (a view without the alias
  annotation) and the allocations ``empty*`` (nothing is written).
- The bytes of a tensor are those of the elements it addresses: numel × element size over its
  dimensions with a non-zero stride (a broadcast by ``expand`` reads its source once).
- Python scalars are not tensors and move 0; 0-d tensors move their element size.

These are the bytes an unfused eager implementation moves between kernels, an upper figure next
to :meth:`routers.Router.ideal_io_per_token` (each input read once, each output written once).
"""

from __future__ import annotations

import copy
import math
from collections import defaultdict
from typing import Any, Callable

import torch
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from routers import route

aten = torch.ops.aten

#: metadata-only ops without an alias annotation in their schema, and pure allocations: 0 bytes.
ZERO_OPS = frozenset({
    aten._unsafe_view.default, aten.empty.memory_format, aten.empty_like.default,
    aten.empty_strided.default, aten.new_empty.default, aten.new_empty_strided.default,
})
#: ops whose ``self`` is written without being read.
WRITE_ONLY_SELF = frozenset({"copy_", "fill_", "zero_"})


def tensor_bytes(t: Tensor) -> int:
    """Bytes of the elements ``t`` addresses: numel over dims with a non-zero stride × itemsize."""
    if t.numel() == 0:
        return 0
    elements = math.prod(n for n, s in zip(t.shape, t.stride()) if s != 0)
    return elements * t.element_size()


def moves_nothing(func: Any) -> bool:
    """True for view/alias ops and allocations (counted 0 bytes, see the module docstring)."""
    return func in ZERO_OPS or bool(getattr(func, "is_view", False))


def _key(t: Tensor) -> tuple:
    """What makes two tensor arguments one read: the same address, shape, strides and dtype; on
    the meta device, which has no addresses, the same tensor object."""
    where = id(t) if t.device.type == "meta" else t.data_ptr()
    return (where, tuple(t.shape), t.stride(), t.dtype)


def op_bytes(func: Any, args: tuple, kwargs: dict, out: Any) -> tuple[int, int]:
    """(bytes read, bytes written) of one aten op call under the rule of this module."""
    if moves_nothing(func):
        return 0, 0
    schema = func._schema
    skip: set[tuple] = set()
    name = schema.name.split("::")[-1]
    for i, arg in enumerate(schema.arguments):
        write_only = arg.is_out or (arg.name == "self" and name in WRITE_ONLY_SELF)
        if not write_only:
            continue
        value = kwargs.get(arg.name, args[i] if i < len(args) and not arg.kwarg_only else None)
        for t in tree_leaves(value):
            if isinstance(t, Tensor):
                skip.add(_key(t))
    seen: set[tuple] = set()
    read = 0
    for t in tree_leaves((args, kwargs)):
        if isinstance(t, Tensor) and (k := _key(t)) not in seen and k not in skip:
            seen.add(k)
            read += tensor_bytes(t)
    written = sum(tensor_bytes(t) for t in tree_leaves(out) if isinstance(t, Tensor))
    return read, written


class TrafficMode(TorchDispatchMode):
    """Sums the bytes read and written by every aten op run inside it (module docstring rule).

    Attributes:
        read, written: totals in bytes.
        by_op: op name (``"aten.add.Tensor"``) → bytes read + written.
        n_ops: ops executed (views included).
    """

    def __init__(self) -> None:
        super().__init__()
        self.read = 0
        self.written = 0
        self.n_ops = 0
        self.by_op: dict[str, int] = defaultdict(int)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        r, w = op_bytes(func, args, kwargs, out)
        self.read += r
        self.written += w
        self.n_ops += 1
        if r or w:
            self.by_op[str(func)] += r + w
        return out


def measured_bytes(fn: Callable[..., Any], *args: Any) -> dict:
    """Run ``fn(*args)`` and measure the bytes its aten ops move (module docstring rule).

    Returns:
        ``read``, ``written``, ``total`` (bytes, ints), ``by_op`` (op name → bytes),
        ``n_ops`` (ops executed, views included) and ``result`` (what ``fn`` returned).
    """
    with TrafficMode() as mode:
        result = fn(*args)
    return {"read": mode.read, "written": mode.written, "total": mode.read + mode.written,
            "by_op": dict(mode.by_op), "n_ops": mode.n_ops, "result": result}


def router_bytes_moved(router: torch.nn.Module, batch_size: int, seq_len: int,
                       dtype: torch.dtype = torch.float32, seed: int = 0) -> float:
    """Measured residual-router traffic per token and per sublayer, in units of d elements.

    Drives a copy of ``router`` (cast to ``dtype``) alone under ``torch.no_grad()``, through the
    contract's loop (:func:`routers.base.route`) with random updates; e and the updates are
    drawn outside the measured region. The bytes of
    :func:`measured_bytes` are divided by B·T tokens, 2L sublayers and d·itemsize(``dtype``), so
    the figure compares with :meth:`routers.Router.ideal_io_per_token` (float32 statistics of a
    bfloat16 router still count their real bytes).

    Args:
        router: a :class:`routers.Router` (not modified).
        batch_size: B.
        seq_len: T.
        dtype: dtype of e, the updates and the router copy.
        seed: seed of the random e and updates.

    Returns:
        bytes moved / (B·T · 2L · d · itemsize), a float.
    """
    r = copy.deepcopy(router).to(device="cpu", dtype=dtype)  # traffic per token is device-free
    d = r.d_model
    g = torch.Generator().manual_seed(seed)
    shape = (batch_size, seq_len, d)
    e = torch.randn(shape, generator=g).to(dtype)
    updates = [torch.randn(shape, generator=g).to(dtype) for _ in r.slots]

    def forward() -> Tensor:
        return route(r, e, lambda slot, h: updates[slot.index])[1]

    with torch.no_grad():
        moved = measured_bytes(forward)["total"]
    itemsize = torch.empty((), dtype=dtype).element_size()
    return moved / (batch_size * seq_len * len(r.slots) * d * itemsize)
