"""The ``fused`` kernels off a GPU: Triton's interpreter for a body, a fresh interpreted copy of
``routers/block/fused_kernels.py`` (loaded by its file path, as the planted-bug tests load their
mutants) and a forward :class:`~routers.block.phases.Phases` through a given kernels module, which
``harness.costs.kernel_io`` counts each kernel's loads and stores with.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
from types import ModuleType
from typing import Iterator

from . import fused
from .fused_launch import contiguous_all, run_phase1, run_phase2
from .phases import Phases


@contextlib.contextmanager
def interpreter() -> Iterator[None]:
    """``TRITON_INTERPRET=1`` for the body (Triton reads it when a kernel is defined and while it
    runs), then as it was."""
    before = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("TRITON_INTERPRET")
        else:
            os.environ["TRITON_INTERPRET"] = before


def interpreted_kernels() -> ModuleType:
    """A fresh copy of ``routers/block/fused_kernels.py`` whose kernels run under Triton's interpreter
    on CPU tensors (inside :func:`interpreter`), whatever ``TRITON_INTERPRET`` was: what
    ``harness.costs.kernel_io`` counts the kernels' bytes with, on a GPU machine too."""
    path = os.path.join(os.path.dirname(__file__), "fused_kernels.py")
    spec = importlib.util.spec_from_file_location("routerbench_fused_kernels_interpreted", path)
    mod = importlib.util.module_from_spec(spec)
    with interpreter():
        spec.loader.exec_module(mod)
    return mod


def phases_of(mod: ModuleType) -> Phases:
    """The forward of :data:`FUSED` through the launches of kernels module ``mod``, without the
    custom ops (no autograd): for counting a kernels module's loads and stores
    (``harness.costs.kernel_io``)."""
    def _phase1(q, bias, values, inv, valid, scope=None):
        write = len(values) > 1
        o, mx, s, _, _ = run_phase1(mod, contiguous_all(values), q.contiguous(),
                                 None if bias is None else bias.contiguous(),
                                 None if valid is None else valid.contiguous(), write)
        return (tuple(o) if write else tuple(values[0] for _ in range(q.shape[0]))), tuple(mx), tuple(s)

    def _readout(q, bias, values, inv, valid, scope=None):
        return _phase1(q[None], None if bias is None else bias[None], values, inv, valid)[0][0]

    def _merge(o, mx, s, q, P, details, bias, max_detail_scale, *lean):
        b = None if bias is None or not details else bias.contiguous()
        return run_phase2(mod, o.contiguous(), mx.contiguous(), s.contiguous(), q.contiguous(), P.contiguous(),
                          contiguous_all(details), b, float(max_detail_scale))[0]
    return Phases(fused.inv_rms, _phase1, _merge, _readout, keeps_updates=True)
