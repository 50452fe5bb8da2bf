"""Bytes a Triton kernel moves, counted through its ``tl.load`` and ``tl.store`` under Triton's
interpreter: every element a load or store touches (mask on) counts its element size once, as
the kernel asks for it (what a GPU moves is at least that for each distinct byte, and caches
serve repeats).

:func:`counting` instruments the interpreter; :func:`fused_kernel_bytes` drives a block router's
``fused`` kernels (``routers/block/fused_launch.py``) through the contract's loop at one shape: the
interpreter's count that ``make test-kernels`` holds each kernel's declared byte model
(``routers/block/fused_bytes.py``, which ``router_io_kernel`` and ``routerbench costs`` use) to.
"""

from __future__ import annotations

import contextlib
import copy
from typing import Iterator

import torch

from routers import route


@contextlib.contextmanager
def counting() -> Iterator[dict[str, int]]:
    """Count the bytes of every masked-on element of the interpreter's loads and stores: yields
    ``{"load": bytes, "store": bytes}``, filled while the body runs. Needs Triton."""
    from triton.runtime import interpreter
    builder = interpreter.InterpreterBuilder
    load, store = builder.create_masked_load, builder.create_masked_store
    moved = {"load": 0, "store": 0}

    def _bytes(handle, mask) -> int:
        return int(mask.data.sum()) * (handle.get_element_ty().primitive_bitwidth // 8)

    def counted_load(self, ptrs, mask, *args):
        moved["load"] += _bytes(ptrs, mask)
        return load(self, ptrs, mask, *args)

    def counted_store(self, ptrs, value, mask, *args):
        moved["store"] += _bytes(ptrs, mask)
        return store(self, ptrs, value, mask, *args)
    builder.create_masked_load, builder.create_masked_store = counted_load, counted_store
    try:
        yield moved
    finally:
        builder.create_masked_load, builder.create_masked_store = load, store


def fused_kernel_bytes(router: torch.nn.Module, batch_size: int, seq_len: int,
                       dtype: torch.dtype = torch.float32, seed: int = 0) -> float:
    """Bytes the ``fused`` kernels load and store in one forward of ``router`` (a block router,
    not modified; a CPU copy runs them under the interpreter) with random e and updates, per
    token and sublayer, in units of d elements of ``dtype``, as ``router_io_ideal``. Only the
    kernels count: the running sums' adds and the RMS matching of a completed block's details are
    eager ops, outside them (``router_io_measured`` counts every op).

    Raises:
        ModuleNotFoundError: Triton is not installed.
    """
    from routers.block import fused_interp
    r = copy.deepcopy(router).to(device="cpu", dtype=dtype)
    r.phases = fused_interp.phases_of(fused_interp.interpreted_kernels())
    d = r.d_model
    g = torch.Generator().manual_seed(seed)
    shape = (batch_size, seq_len, d)
    e = torch.randn(shape, generator=g).to(dtype)
    updates = [torch.randn(shape, generator=g).to(dtype) for _ in r.slots]
    with torch.no_grad(), fused_interp.interpreter(), counting() as moved:
        route(r, e, lambda slot, h: updates[slot.index])
    itemsize = torch.empty((), dtype=dtype).element_size()
    return (moved["load"] + moved["store"]) / (batch_size * seq_len * len(r.slots) * d * itemsize)
