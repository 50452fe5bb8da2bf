"""Backends: the same decoder run eagerly, through ``torch.compile``, or captured in a CUDA graph
(``harness/step/cudagraph.py``) (DESIGN.md, "Backends").

Rules (MEASUREMENT.md, "torch.compile"): ``fullgraph=True`` so a graph break is an error, not a
silent eager island; ``torch._dynamo.reset()`` and a fresh model per case; the first call (the
compile) is timed on its own as ``compile_time`` and never folded into step time; during timing
``error_on_recompile`` turns a recompile (e.g. a shape change after warm-up) into an error row
instead of a silently re-compiled or eager step.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Callable, Iterator

import torch
from torch import nn

#: backend -> its compile modes (``None`` where not applicable); the first is the default.
BACKENDS: dict[str, tuple[str | None, ...]] = {
    "eager": (None,),
    "compile": ("default", "max-autotune-no-cudagraphs", "reduce-overhead"),
    "cudagraph": (None,),
}


def unavailable_reason(backend: str, compile_mode: str | None, device: torch.device) -> str | None:
    """Why ``backend``/``compile_mode`` cannot run on ``device``, or None when it can."""
    if backend == "compile" and compile_mode == "reduce-overhead" and device.type != "cuda":
        return "compile mode reduce-overhead uses CUDA graphs: no CUDA device here"
    if backend == "cudagraph" and device.type != "cuda":
        return "cudagraph captures CUDA work: no CUDA device here"
    return None


@dataclass
class Prepared:
    """A model ready to time.

    Attributes:
        model: the module to call (compiled or not).
        clone_outputs: whether kept outputs must be cloned (CUDA-graph trees reuse their buffers).
    """

    model: Callable
    clone_outputs: bool = False


_reset_per_case = True


@contextlib.contextmanager
def one_dynamo_cache() -> Iterator[None]:
    """Inside, :func:`prepare` does not reset dynamo, so several compiled models can live side
    by side (a paired group); dynamo is reset once on entry and once on exit."""
    global _reset_per_case
    torch._dynamo.reset()
    _reset_per_case = False
    try:
        yield
    finally:
        _reset_per_case = True
        torch._dynamo.reset()


def prepare(model: nn.Module, backend: str, compile_mode: str | None) -> Prepared:
    """Wrap ``model`` for ``backend``; compilation itself happens at the first call.

    Raises:
        ValueError: unknown backend.
    """
    if backend in ("eager", "cudagraph"):  # cudagraph captures the eager step (harness.step.cudagraph)
        return Prepared(model)
    if backend == "compile":
        if _reset_per_case:
            torch._dynamo.reset()  # no compiled code reused from an earlier case
        return Prepared(torch.compile(model, fullgraph=True, mode=compile_mode),
                        clone_outputs=compile_mode == "reduce-overhead")
    raise ValueError(f"--backends: unknown backend {backend!r}; known: {', '.join(BACKENDS)}")


def graph_breaks() -> int:
    """Graph breaks dynamo counted since the last ``torch._dynamo.reset()``."""
    from torch._dynamo.utils import counters
    return int(sum(counters["graph_break"].values()))


def first_call_seconds(step: Callable[[], object], device: torch.device) -> float:
    """Wall time of one call including compilation, synchronised, in seconds."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - t0


@contextlib.contextmanager
def recompile_guard(backend: str) -> Iterator[None]:
    """While timing a compiled model, a recompile raises instead of running new code."""
    if backend == "compile":
        with torch._dynamo.config.patch(error_on_recompile=True):
            yield
    else:
        yield
