"""Launches of the ``fused`` kernels (``routers/block/fused_kernels.py``): their autotune configs,
checked for sm_90 (tests/fused_compile.py), the grids, the outputs each writes, and the second
stage of their cross-row sums; also the interpreter copy of the kernels and a forward
:class:`~routers.block.phases.Phases` through a given kernels module, which
``harness.costs.kernel_io`` counts bytes with and tests/test_fused.py runs planted bugs through.

``routers/block/fused.py`` wraps these launches in the ``torch.library`` custom ops that the
``fused`` impl runs. Every launch takes the kernels module as its first argument; under Triton's
interpreter (a module defined while ``TRITON_INTERPRET=1``) each kernel runs its first config,
since the autotuner times configs through a GPU driver.
"""

from __future__ import annotations

import contextlib
import functools
import os
from types import ModuleType
from typing import Iterator, Sequence

import torch
from torch import Tensor

from ..errors import ConfigError
from ..mixer import EPS
from .phases import Phases

#: the widest d the kernels are checked for
MAX_D = 4096
#: kernel → (the largest BLOCK_D = pow2(d) of a bucket, the ``num_warps`` of its autotune configs)
#: in increasing BLOCK_D: at most 2 configs, each free of register spills (no stack frame) and
#: within sm_90's shared memory in bfloat16 and float32, under triton 3.6.0 and 3.7.1, at the
#: largest pool, query block and update register of tests/fused_compile.py (which
#: tests/test_fused_compile.py compiles them at, for every BLOCK_D of :data:`WIDTHS`). Which
#: warps spill varies with d and the Triton release, unevenly: these were chosen from a sweep of
#: 2, 4, 8 and 16 warps at every width under both releases.
CONFIGS: dict[str, tuple[tuple[int, tuple[int, ...]], ...]] = {
    "inv_rms_fwd": ((MAX_D, (4, 8)),),
    "inv_rms_bwd": ((MAX_D, (4, 8)),),
    "phase2_fwd": ((MAX_D, (4, 8)),),
    "phase2_bwd": ((256, (8, 16)), (512, (4, 8)), (1024, (4, 16)), (2048, (4, 8)), (MAX_D, (8,))),
    "phase1_fwd": ((256, (2, 4)), (2048, (4, 8)), (MAX_D, (8, 16))),
    "phase1_bwd_dot": ((MAX_D, (4, 8)),),
    "phase1_bwd": ((512, (4, 8)), (1024, (2, 16)), (MAX_D, (4, 8))),
}
#: the BLOCK_D the compile check covers (≤ 128 is the interpreter tests' and holds little)
WIDTHS = (256, 512, 1024, 2048, 4096)


def check_router(d: int, block_len: int, K: int) -> None:
    """What the kernels take, checked when a ``fused`` router is built (before any heavy work):
    width d within :data:`MAX_D` (:func:`configs`), and the coefficients of a block's earlier
    updates in every detail kind within the one int64 phase 2's backward takes them in (bit
    i·K + j: update i, kind j; eager and model scope).

    Raises:
        ConfigError: d > :data:`MAX_D`, or a block of ``block_len`` sublayers with K detail kinds
            needs more than 63 bits.
    """
    configs("phase1_fwd", d)
    if (block_len - 1) * K > 63:
        raise ConfigError(f"--impls fused: a block of {block_len} sublayers with {K} detail kinds needs "
                          f"{(block_len - 1) * K} coefficient bits, more than the 63 of phase 2's int64; "
                          "use more blocks (n_blocks) or --impls lean")


def configs(name: str, d: int) -> tuple[int, ...]:
    """The ``num_warps`` of kernel ``name``'s autotune configs at width d.

    Raises:
        ConfigError: d > :data:`MAX_D` (no config of that width has been checked for spills).
    """
    bd = pow2(d)
    for top, warps in CONFIGS[name]:
        if bd <= top:
            return warps
    raise ConfigError(f"--impls fused: d = {d} (--widths) is wider than the {MAX_D} its kernels are compiled and "
                      "checked for (routers/block/fused_launch.py CONFIGS); use --impls lean at this width")


#: software-pipelining stages of every config: 1, as the kernels stream rows (with the default 3
#: the compiler prefetches the next rows of the backward's loop into registers, and spills)
NUM_STAGES = 1
#: autotune key of each kernel (beside the dtypes, which Triton's autotuner always keys on): the
#: width, the pool's and queries' counts, and the row bucket ``R_BUCKET`` (the least power of two
#: ≥ B·T), so a case timed at 8,192 rows is tuned there, not at the 128 rows of its parity check
KEYS: dict[str, tuple[str, ...]] = {
    "inv_rms_fwd": ("d", "R_BUCKET"), "inv_rms_bwd": ("d", "R_BUCKET"), "phase2_fwd": ("d", "K", "R_BUCKET"),
    "phase2_bwd": ("d", "K", "U", "R_BUCKET"), "phase1_fwd": ("d", "N", "n_q", "R_BUCKET"),
    "phase1_bwd_dot": ("d", "N", "n_q", "R_BUCKET"), "phase1_bwd": ("d", "N", "n_q", "R_BUCKET"),
}


#: programs of phase 2's backward: each sums ∂/∂q and ∂/∂bias over its rows, the launcher over
#: the programs (two-stage, no atomics)
MAX_PROGRAMS = 256

def kernels() -> ModuleType:
    """``routers/block/fused_kernels.py`` (imported on first use: it imports Triton)."""
    from . import fused_kernels
    return fused_kernels


def launcher(mod, name: str, d: int):
    """Kernel ``name`` of ``mod`` at width d, ready to index with a grid: autotuned over its
    :func:`configs` on a GPU, or their first under the interpreter (a kernel defined while
    ``TRITON_INTERPRET=1``); recorded with its bytes where ``mod`` is a
    :class:`routers.block.fused_bytes.RecordedLaunches`. A kernels module's launcher is made once
    per (module, kernel, width)."""
    if getattr(mod, "records_launches", False):
        configs(name, d)  # a width the kernels do not take is refused as on a device
        return lambda grid: (lambda *a, **k: mod.record(name, grid, a, k))
    run = _launcher(mod, name, d)
    if not _WATCHERS:
        return run

    def at(grid):
        go = run(grid)

        def launch(*a, **k):
            for watch in tuple(_WATCHERS):
                watch(name, d, tuple(grid), a, k)
            return go(*a, **k)
        return launch
    return at


#: what :func:`watching` installed: each is told of every launch before it runs
_WATCHERS: list = []


@contextlib.contextmanager
def watching(watch) -> Iterator[None]:
    """Call ``watch(name, d, grid, args, kwargs)`` before every kernel launch of the body (what
    ``routerbench kernels`` captures each launch with)."""
    _WATCHERS.append(watch)
    try:
        yield
    finally:
        _WATCHERS.remove(watch)


@functools.lru_cache(maxsize=None)
def _launcher(mod: ModuleType, name: str, d: int):
    import triton
    from triton.runtime.interpreter import InterpretedFunction
    fn, warps = getattr(mod, name), configs(name, d)
    if isinstance(fn, InterpretedFunction):
        return lambda grid: (lambda *a, **k: fn[grid](*a, num_warps=warps[0], num_stages=NUM_STAGES, **k))
    return triton.autotune([triton.Config({}, num_warps=w, num_stages=NUM_STAGES) for w in warps],
                           key=list(KEYS[name]))(fn).__getitem__


def pow2(n: int) -> int:
    """The least power of two ≥ max(n, 1)."""
    return 1 << max(n - 1, 0).bit_length()


def contiguous_all(ts: Sequence[Tensor]) -> list[Tensor]:
    """Each tensor of ``ts`` contiguous (a view where it is already)."""
    return [t.contiguous() for t in ts]


def _rows(t: Tensor) -> tuple[int, int]:
    d = t.shape[-1]
    return t.numel() // d, d


# --- launches (the kernels module is an argument: tests run planted-bug copies through these) ---

def run_inv_rms(mod: ModuleType, v: Tensor, eps: float = EPS) -> Tensor:
    """r (…) float32 of v (…, d), contiguous."""
    R, d = _rows(v)
    bd = pow2(d)
    br = max(1, min(16, 4096 // bd))
    r = v.new_empty(v.shape[:-1], dtype=torch.float32)
    launcher(mod, "inv_rms_fwd", d)(((R + br - 1) // br,))(v, r, R, d, eps, R_BUCKET=pow2(R), BLOCK_R=br, BLOCK_D=bd)
    return r


def run_inv_rms_bwd(mod: ModuleType, v: Tensor, r: Tensor, g: Tensor) -> Tensor:
    R, d = _rows(v)
    bd = pow2(d)
    br = max(1, min(16, 4096 // bd))
    gv = torch.empty_like(v)
    launcher(mod, "inv_rms_bwd", d)(((R + br - 1) // br,))(v, r, g.contiguous(), gv, R, d, R_BUCKET=pow2(R), BLOCK_R=br,
                                                             BLOCK_D=bd)
    return gv


def query_block(m: int, d: int) -> int:
    """Queries per phase-1 program: an (m, d) float32 tile per program is at most 4,096 floats
    (larger tiles spill registers on sm_90: tests/fused_compile.py)."""
    return max(1, min(pow2(m), 4096 // pow2(d)))


def _split(R: int) -> tuple[int, int]:
    """(programs, rows per program) of phase 2's backward over R rows."""
    per = -(-R // MAX_PROGRAMS)
    return -(-R // per), per


def run_phase1(mod: ModuleType, values: Sequence[Tensor], inv: Sequence[Tensor], q: Tensor, bias: Tensor | None,
               valid: Tensor | None, write_o: bool) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    v0 = values[0]
    R, d = _rows(v0)
    m, n = q.shape[0], len(values)
    lead = v0.shape[:-1]
    o0 = v0.new_empty(v0.shape if write_o else (0,))
    rest = v0.new_empty((m - 1, *v0.shape) if write_o else (0,))
    mx = v0.new_empty((m, *lead), dtype=torch.float32)
    s = torch.empty_like(mx)
    bm = query_block(m, d)
    launcher(mod, "phase1_fwd", d)((R, -(-m // bm)))(
        tuple(values), tuple(inv), q, q if bias is None else bias, q if valid is None else valid.view(torch.uint8),
        o0, o0 if m == 1 or not write_o else rest, mx, s, R, d, m, R_BUCKET=pow2(R), N=n, HAS_BIAS=bias is not None,
        HAS_VALID=valid is not None, WRITE_O=write_o, BLOCK_M=bm, BLOCK_D=pow2(d))
    return o0, rest, mx, s


def run_phase1_bwd(mod: ModuleType, values: Sequence[Tensor], inv: Sequence[Tensor], q: Tensor,
                   bias: Tensor | None, valid: Tensor | None, mx: Tensor, s: Tensor, g_o0: Tensor | None,
                   g_rest: Tensor | None, g_s: Tensor | None) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    """(∂/∂values (n, …, d), ∂/∂inv (n, …) float32, ∂/∂q (m, d) float32, ∂/∂bias (m, n) float32 or
    None). ∂/∂q and ∂/∂bias are the second stage of the kernel's sums: Σ_rows (gℓ·r)ᵀV_i per
    source as a torch matmul in the sources' dtype (as the plain backward's; in float32 on CUDA it
    follows ``torch.backends.cuda.matmul.allow_tf32``, off by default), and Σ_rows gℓ.

    Temporary memory, at most the pool's own size (n × B·T × d elements of the sources' dtype):
    gℓ (n, m, B·T) float32, and where the queries take more than one program per row
    (``query_block``: m·d past 4,096 floats, e.g. m > 4 at d = 1024) each group's partial ∂/∂values
    and ∂/∂inv in float32 for a chunk of rows (:func:`phase1_bwd_chunk`: as many rows as fit in the
    pool's size less gℓ), summed over the groups into the result chunk by chunk; one launch per
    chunk. With one group the kernel writes the result directly."""
    v0 = values[0]
    R, d = _rows(v0)
    m, n = q.shape[0], len(values)
    bm = query_block(m, d)
    groups = -(-m // bm)
    g_l = v0.new_empty((n, m, R), dtype=torch.float32)
    chunk = phase1_bwd_chunk(n, m, R, d, v0.element_size(), groups)
    if groups == 1:  # ∂/∂V written in the sources' dtype, in place
        g_v = v0.new_empty((1, n, *v0.shape))
        g_r = v0.new_empty((1, n, *v0.shape[:-1]), dtype=torch.float32)
    else:  # each group's partial in float32 for one chunk of rows at a time, summed after
        out_v = v0.new_empty((n, *v0.shape))
        out_r = v0.new_empty((n, *v0.shape[:-1]), dtype=torch.float32)
        g_v = v0.new_empty((groups, n, chunk, d), dtype=torch.float32)
        g_r = v0.new_empty((groups, n, chunk), dtype=torch.float32)
    has_go = g_o0 is not None or (g_rest is not None and m > 1)
    if has_go:
        g_o0 = torch.zeros_like(v0) if g_o0 is None else g_o0.contiguous()
        g_rest = g_o0 if m == 1 else torch.zeros((m - 1, *v0.shape), dtype=v0.dtype, device=v0.device) \
            if g_rest is None else g_rest.contiguous()
    pool = (tuple(values), tuple(inv), q, q if bias is None else bias,
            q if valid is None else valid.view(torch.uint8), mx, s)
    g_dot = mx
    if has_go:
        g_dot = torch.empty_like(mx)
        launcher(mod, "phase1_bwd_dot", d)((R, groups))(
            *pool, g_o0, g_rest, g_dot, R, d, m, R_BUCKET=pow2(R), N=n, HAS_BIAS=bias is not None, HAS_VALID=valid is not None,
            BLOCK_M=bm, BLOCK_D=pow2(d))
    rest = (g_o0 if has_go else mx, g_rest if has_go else mx, mx if g_s is None else g_s.contiguous(), g_dot)
    flags = dict(R_BUCKET=pow2(R), N=n, HAS_BIAS=bias is not None, HAS_VALID=valid is not None, HAS_GO=has_go,
                 HAS_GS=g_s is not None, BLOCK_M=bm, BLOCK_D=pow2(d))
    if groups == 1:
        launcher(mod, "phase1_bwd", d)((R, 1))(*pool, *rest, g_v, g_r, g_l, R, d, m, 0, R, **flags)
        g_v, g_r = g_v[0], g_r[0]
    else:  # the second stage of the sum over query groups, a chunk of rows at a time
        for r0 in range(0, R, chunk):
            rc = min(chunk, R - r0)
            launcher(mod, "phase1_bwd", d)((rc, groups))(*pool, *rest, g_v, g_r, g_l, R, d, m, r0, chunk, **flags)
            out_v.view(n, R, d)[:, r0:r0 + rc] = g_v[:, :, :rc].sum(0)
            out_r.view(n, R)[:, r0:r0 + rc] = g_r[:, :, :rc].sum(0)
        g_v, g_r = out_v, out_r
    g_q = q.new_zeros((m, d), dtype=torch.float32)
    for i, (v, r) in enumerate(zip(values, inv)):
        g_q += torch.matmul((g_l[i] * r.reshape(1, R)).to(v.dtype), v.reshape(R, d)).float()
    return g_v, g_r, g_q, g_l.sum(-1).t().contiguous() if bias is not None else None


def phase1_bwd_chunk(n: int, m: int, R: int, d: int, itemsize: int, groups: int) -> int:
    """Rows per launch of phase 1's backward over ``groups`` query groups: all R with one group;
    else as many as keep its float32 partials and their sum over the groups ((groups + 1) × n ×
    rows × (d + 1) × 4 bytes) and gℓ (n × m × R × 4) within the pool's own size (n × R × d ×
    ``itemsize``), at least one."""
    if groups == 1:
        return R
    room = n * R * d * itemsize - n * m * R * 4
    return max(1, min(R, room // ((groups + 1) * n * (d + 1) * 4)))


def run_phase2(mod: ModuleType, o: Tensor, mx: Tensor, s: Tensor, q: Tensor, P: Tensor,
               details: Sequence[Tensor], bias: Tensor | None, max_scale: float) -> Tensor:
    R, d = _rows(P)
    K = len(details)
    if o.shape != P.shape or mx.shape != P.shape[:-1] or s.shape != mx.shape or q.shape != (d,):
        raise ValueError(f"phase 2 of one read takes o and P {tuple(P.shape)}, mu and s {tuple(P.shape[:-1])} and "
                         f"q ({d},); got o {tuple(o.shape)}, mu {tuple(mx.shape)}, s {tuple(s.shape)}, q {tuple(q.shape)}")
    h = torch.empty_like(o)
    launcher(mod, "phase2_fwd", d)((R,))(
        o, mx, s, q, P, tuple(details) or (P,), q if bias is None else bias, h, R, d, EPS, max_scale, R_BUCKET=pow2(R), K=K,
        HAS_BIAS=bias is not None, BLOCK_K=pow2(max(K, 2)), BLOCK_D=pow2(d))
    return h


def run_phase2_bwd(mod: ModuleType, g: Tensor, h: Tensor, mx: Tensor, s: Tensor, q: Tensor, bias: Tensor | None,
                   updates: Sequence[Tensor], coef_t: Tensor | None, bits: int, k_lo: int, n_kinds: int, K: int,
                   max_scale: float) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor | None]:
    R, d = _rows(h)
    progs, per = _split(R)
    bk = pow2(max(K, 2))
    u0 = updates[0]
    g_o, g_p = torch.empty_like(h), torch.empty_like(u0)
    g_s = mx.new_empty(mx.shape)
    g_d = u0.new_empty((K, *u0.shape))
    gq = mx.new_empty((progs, d))
    gb = mx.new_empty((progs, bk))
    launcher(mod, "phase2_bwd", d)((progs,))(
        g.contiguous(), h, mx, s, q, q if bias is None else bias, tuple(updates), q if coef_t is None else coef_t,
        bits, k_lo, n_kinds, g_o, g_s, g_p, g_d if K else g_p, gq, gb, R, d, EPS, max_scale, per, R_BUCKET=pow2(R), K=K, U=len(updates),
        HAS_BIAS=bias is not None, HAS_COEF_T=coef_t is not None, BLOCK_K=bk, BLOCK_D=pow2(d))
    return g_o, g_s, g_p, g_d, gq.sum(0), gb.sum(0)[:K] if bias is not None else None


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
    import importlib.util
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
    def _inv(v: Tensor) -> Tensor:
        return run_inv_rms(mod, v.contiguous())

    def _phase1(q, bias, values, inv, valid, scope=None):
        write = len(values) > 1
        o0, rest, mx, s = run_phase1(mod, contiguous_all(values), contiguous_all(inv), q.contiguous(),
                                     None if bias is None else bias.contiguous(),
                                     None if valid is None else valid.contiguous(), write)
        outs = (o0, *rest.unbind(0)) if write else tuple(values[0] for _ in range(q.shape[0]))
        return outs, mx, s

    def _readout(q, bias, values, inv, valid, scope=None):
        return _phase1(q[None], None if bias is None else bias[None], values, inv, valid)[0][0]

    def _merge(o, mx, s, q, P, details, bias, max_detail_scale, *lean):
        b = None if bias is None or not details else bias.contiguous()
        return run_phase2(mod, o.contiguous(), mx.contiguous(), s.contiguous(), q.contiguous(), P.contiguous(),
                          contiguous_all(details), b, float(max_detail_scale))
    return Phases(_inv, _phase1, _merge, _readout, keeps_updates=True)
