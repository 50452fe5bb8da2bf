"""Each ``fused`` kernel alone, and each peer kernel per op: what ``routerbench kernels`` measures
(docs/IMPLS.md, "Each kernel alone").

:func:`capture` runs one training step of a block router's ``fused`` impl alone (``route()``, each
sublayer an identity) at a shape and keeps, of each kernel and autotune key, the first launch with
its arguments. :func:`time_launch` re-runs one such launch, a sample at a time, between CUDA events,
with or without an L2 flush (a write of :data:`FLUSH_BYTES`) before each sample: its median and IQR in
µs, its bytes by the byte rule (``routers.block.fused_bytes``) and so its GB/s. The config the
autotuner chose for the launch is read back from its cache. On a CPU each captured launch runs once
under Triton's interpreter instead, its loads and stores counted beside its byte model
(:func:`harness.costs.kernel_io.counting`): no time.

:func:`time_peer` times a peer depth mixer's forward, and its forward and backward, over the
shape's largest pool (a read of the last block), as a sweep would call it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from harness.timing.timer import median_iqr, time_steps
from routers import build_router, route

#: The impl whose Triton kernels this module captures and times (``routers/block/fused.py``; its
#: launches are ``routers/block/fused_launch.py``'s).
KERNELS_OF = "fused"

#: Bytes written between two samples to evict the L2 cache (H100: 50 MB, H200: 60 MB of L2).
FLUSH_BYTES = 256 * 2**20


@dataclass
class Launch:
    """One captured launch: the kernel, its grid, arguments, autotune key and how often a step
    launches it under that key."""

    name: str
    d: int
    grid: tuple
    args: tuple
    kwargs: dict
    key: tuple
    per_step: int = 1
    config: str = ""
    rule_bytes: int = 0
    asked_bytes: int = 0
    times: dict[str, tuple[float, float]] = field(default_factory=dict)
    counted_bytes: int | None = None


class _Sublayer(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, u):
        return u.view_as(u)

    @staticmethod
    def backward(ctx, g):
        return g.view_as(g), None


def capture(router: str, d: int, n_layers: int, tokens: int, dtype: torch.dtype, device: torch.device,
            options: dict[str, Any] | None = None, on_launch: Callable[[Launch], None] | None = None) -> list[Launch]:
    """One training step of ``router``'s ``fused`` impl at width ``d``, ``n_layers`` layers and
    ``tokens`` rows on ``device``, every kernel launch run (on a CPU under the interpreter), and the
    first launch of each (kernel, autotune key) kept with its arguments and how often the step
    launched it (``on_launch``: called with each one kept, while it runs).

    Raises:
        routers.errors.ConfigError: the router or the width ``fused`` refuses.
    """
    from routers.block import fused_bytes, fused_launch
    g = torch.Generator().manual_seed(0)
    r = build_router(router, d, n_layers, impl=KERNELS_OF, **(options or {}))
    r = r.to(device=device, dtype=dtype)
    e = torch.randn((1, tokens, d), generator=g).to(device, dtype).requires_grad_()
    updates = [torch.randn((1, tokens, d), generator=g).to(device, dtype) for _ in r.slots]
    kept: dict[tuple, Launch] = {}

    def watch(name, width, grid, a, k):
        key = (name, fused_bytes.autotune_key(name, a, k))
        if key in kept:
            kept[key].per_step += 1
            return
        m = fused_bytes.moved(name, grid, a, k)
        kept[key] = Launch(name, width, grid, a, k, key[1], rule_bytes=m.rule, asked_bytes=m.asked)
        if on_launch is not None:
            on_launch(kept[key])

    with fused_launch.watching(watch):
        _, out, _ = route(r, e, lambda slot, h: _Sublayer.apply(h, updates[slot.index]))
        out.backward(torch.randn(out.shape, generator=g).to(device, dtype))
    return list(kept.values())


def chosen_config(launch: Launch) -> str:
    """``num_warps=8`` as the autotuner chose it for ``launch``'s key on a GPU, or "" (the
    interpreter runs every kernel's first config)."""
    from routers.block import fused_launch
    tuner = getattr(fused_launch._launcher(fused_launch.kernels(), launch.name, launch.d), "__self__", None)
    for key, cfg in getattr(tuner, "cache", {}).items():
        if tuple(key[:len(launch.key)]) == tuple(launch.key):
            return f"num_warps={cfg.num_warps}"
    return ""


def time_launch(launch: Launch, device: torch.device, repeats: int = 20, flush: bool = False) -> tuple[float, float]:
    """(median, IQR) in µs of ``repeats`` samples of ``launch`` re-run alone (CUDA events, one
    launch a sample), after 3 warm-up runs; with ``flush`` each sample follows a write of
    :data:`FLUSH_BYTES`, so its data come from memory, not L2. CUDA only."""
    from routers.block import fused_launch
    go = fused_launch.launcher(fused_launch.kernels(), launch.name, launch.d)(launch.grid)
    buf = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device=device) if flush else None
    for _ in range(3):
        go(*launch.args, **launch.kwargs)
    samples = []
    for _ in range(repeats):
        if buf is not None:
            buf.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        go(*launch.args, **launch.kwargs)
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3)
    return median_iqr(samples)


def count_launch(launch: Launch) -> int:
    """The bytes Triton's interpreter counts when ``launch`` runs once (CPU tensors)."""
    from harness.costs.kernel_io import counting
    from routers.block import fused_launch
    go = fused_launch.launcher(fused_launch.kernels(), launch.name, launch.d)(launch.grid)
    with counting() as moved:
        go(*launch.args, **launch.kwargs)
    return moved["load"] + moved["store"]


def time_peer(mix: Callable, n_sources: int, d: int, tokens: int, dtype: torch.dtype, device: torch.device,
              repeats: int = 20) -> dict[str, tuple[float, float]]:
    """A depth mixer ``mix(sources, query, bias, key_gain, eps)`` (a peer impl's ``mix`` plug-in
    point, ``routers.impls.Impl.point``) over ``n_sources`` sources of (1, ``tokens``, ``d``):
    {"fwd": (median, IQR) µs, "fwd_bwd": …} of one call, and of one call and its backward, by CUDA
    events. CUDA only."""
    g = torch.Generator().manual_seed(0)
    src = [torch.randn((1, tokens, d), generator=g).to(device, dtype).requires_grad_() for _ in range(n_sources)]
    q = torch.randn((d,), generator=g).to(device, dtype).requires_grad_()
    gout = torch.randn((1, tokens, d), generator=g).to(device, dtype)

    def fwd():
        with torch.no_grad():
            mix(tuple(src), q, None, None, 1e-6)

    def both():
        mix(tuple(src), q, None, None, 1e-6).backward(gout)

    out = {}
    for name, fn in (("fwd", fwd), ("fwd_bwd", both)):
        time_steps(fn, device, 3)  # warm-up
        med, iqr = median_iqr(time_steps(fn, device, repeats))
        out[name] = (med * 1e3, iqr * 1e3)
    return out
