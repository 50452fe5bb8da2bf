"""The ``fused`` kernels off a GPU: Triton's interpreter for a body, fresh copies of the kernels'
files loaded by their paths (:func:`load_kernels`: interpreted, or a planted-bug test's mutant) and a
forward :class:`~routers.block.phases.Phases` through a given kernels module, which
``harness.costs.kernel_io`` counts each kernel's loads and stores with.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
from types import ModuleType
from typing import Iterator

from . import fused
from .fused_launch import KERNEL_FILES, Kernels, contiguous_all, run_phase1, run_phase2
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


def load_kernels(paths: dict[str, str] | None = None, tag: str = "interpreted") -> Kernels:
    """Fresh copies of the kernels' files (:data:`routers.block.fused_launch.KERNEL_FILES`), each
    loaded from its path, or from ``paths[file name]`` where given (a planted-bug test's mutant),
    as modules named by ``tag`` (Triton reads ``TRITON_INTERPRET`` as each kernel is defined)."""
    mods = []
    for name in KERNEL_FILES:
        path = (paths or {}).get(name, os.path.join(os.path.dirname(__file__), name))
        spec = importlib.util.spec_from_file_location(f"routerbench_{name[:-3]}_{tag}", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        mods.append(mod)
    return Kernels(*mods)


def interpreted_kernels() -> Kernels:
    """Fresh copies of the kernels whose kernels run under Triton's interpreter on CPU tensors
    (inside :func:`interpreter`), whatever ``TRITON_INTERPRET`` was: what ``harness.costs.kernel_io``
    counts the kernels' bytes with, on a GPU machine too."""
    with interpreter():
        return load_kernels()


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
