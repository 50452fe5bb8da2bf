"""Launches of the ``fused`` kernels (``routers/block/fused_kernels*.py``): their autotune configs, checked for
sm_90 (tests/fused_compile.py), the grids, the outputs each writes, and the second stage of their cross-row sums,
which ``routers/block/fused.py`` wraps in ``torch.library`` custom ops. Every launch takes the kernels as its first
argument (:func:`kernels`, or copies: ``routers/block/fused_interp.py``); under Triton's interpreter (kernels
defined while ``TRITON_INTERPRET=1``) each runs its first config: the autotuner times configs on a GPU.
"""

from __future__ import annotations

import contextlib
import functools
from types import ModuleType
from typing import Iterator, Sequence

import torch
from torch import Tensor

from ..errors import ConfigError
from ..mixer import EPS

#: the widest d the kernels are checked for
MAX_D = 4096
#: kernel → (the largest BLOCK_D = pow2(d) of a bucket, the ``num_warps`` of its autotune configs) in increasing
#: BLOCK_D: at most 2 configs, each free of register spills (no stack frame) and within sm_90's shared memory in
#: bfloat16 and float32, under triton 3.6.0 and 3.7.1, at the largest shapes of tests/fused_compile.py (which
#: tests/test_fused_compile.py compiles them at, for every BLOCK_D of :data:`WIDTHS`), chosen from a sweep of 2, 4,
#: 8 and 16 warps at every width under both releases (which warps spill varies with d and the release, unevenly).
CONFIGS: dict[str, tuple[tuple[int, tuple[int, ...]], ...]] = {
    "rms_match": ((MAX_D, (4, 8)),),
    "phase2_fwd": ((MAX_D, (4, 8)),),
    "phase2_bwd": ((256, (4, 16)), (512, (2, 8)), (2048, (4, 8)), (MAX_D, (8,))),
    "phase1_fwd": ((256, (2, 4)), (1024, (4, 8)), (2048, (8,)), (MAX_D, (16,))),
    "phase1_bwd_dot": ((256, (2, 4)), (512, (8,)), (MAX_D, (4, 8))),
    "phase1_bwd": ((512, (4, 8)), (2048, (2, 16)), (MAX_D, (8,))),
    "phase1_bwd_q": ((MAX_D, (4, 8)),),
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
    "rms_match": ("d", "R_BUCKET"), "phase2_fwd": ("d", "K", "R_BUCKET"),
    "phase2_bwd": ("d", "K", "U", "R_BUCKET"), "phase1_fwd": ("d", "N", "n_q", "R_BUCKET"),
    "phase1_bwd_dot": ("d", "N", "n_q", "R_BUCKET"), "phase1_bwd": ("d", "N", "n_q", "R_BUCKET"),
    "phase1_bwd_q": ("d", "N", "n_q", "R_BUCKET"),
}


#: programs of a row-looping kernel (phase 2's backward, phase 1's ∂/∂q) off CUDA, and at least
#: that many on CUDA: each sums ∂/∂q and ∂/∂bias over its rows, the launcher over the programs
#: (two-stage, no atomics)
MAX_PROGRAMS = 256
#: on CUDA, programs of a row-looping kernel per multiprocessor (so that every SM holds several,
#: whose loads hide each other's latency: the kernels prefetch nothing, ``NUM_STAGES``)
PROGRAMS_PER_SM = 4

#: the files of the kernels, beside this one: phase 1's, and phase 2's with the RMS matching
KERNEL_FILES = ("fused_kernels.py", "fused_kernels_merge.py")


class Kernels:
    """The kernels of the modules of :data:`KERNEL_FILES` as one namespace (a kernel by its name),
    hashable by identity: what every launch takes as its kernels module."""

    def __init__(self, *modules: ModuleType) -> None:
        self.modules = modules

    def __getattr__(self, name: str):
        for mod in self.modules:
            if hasattr(mod, name):
                return getattr(mod, name)
        raise AttributeError(f"no kernel {name!r} in {[m.__name__ for m in self.modules]}")


@functools.lru_cache(maxsize=None)
def kernels() -> Kernels:
    """The kernels of ``routers/block/fused_kernels.py`` and ``fused_kernels_merge.py`` (imported on
    first use: they import Triton)."""
    from . import fused_kernels, fused_kernels_merge
    return Kernels(fused_kernels, fused_kernels_merge)


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

def run_rms_match(mod: ModuleType, D: Tensor, C: Tensor, max_scale: float) -> tuple[Tensor, Tensor]:
    """(D̃ (…, d), its gain (…, 1) in D's dtype) of a detail D RMS-matched to C, both contiguous."""
    R, d = _rows(D)
    bd = pow2(d)
    br = max(1, min(16, 4096 // bd))
    out, scale = torch.empty_like(D), D.new_empty((*D.shape[:-1], 1))
    launcher(mod, "rms_match", d)((-(-R // br),))(D, C, out, scale, R, d, EPS, max_scale, R_BUCKET=pow2(R), BLOCK_R=br,
                                                BLOCK_D=bd)
    return out, scale


def query_block(m: int, d: int) -> int:
    """Queries per phase-1 program: an (m, d) float32 tile per program is at most 4,096 floats
    (larger tiles spill registers on sm_90: tests/fused_compile.py)."""
    return max(1, min(pow2(m), 4096 // pow2(d)))


def row_programs(device: torch.device) -> int:
    """Programs of a kernel that loops over rows (phase 2's backward, phase 1's ∂/∂q): on CUDA
    :data:`PROGRAMS_PER_SM` per multiprocessor of the device, at least :data:`MAX_PROGRAMS`
    (the device's properties are host data, read once: no sync); elsewhere :data:`MAX_PROGRAMS`."""
    if device.type != "cuda":
        return MAX_PROGRAMS
    return max(MAX_PROGRAMS, PROGRAMS_PER_SM * _multiprocessors(device.index or 0))


@functools.lru_cache(maxsize=None)
def _multiprocessors(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def _split(R: int, device: torch.device) -> tuple[int, int]:
    """(programs, rows per program) of a row-looping kernel over R rows (:func:`row_programs`)."""
    per = -(-R // row_programs(device))
    return -(-R // per), per


def run_phase1(mod: ModuleType, values: Sequence[Tensor], q: Tensor, rows: Tensor | None, codes: Tensor | None,
               valid: Tensor | None, write_o: bool, write_q: bool = False) -> tuple[list[Tensor], ...]:
    """(o, μ, s, q copies, inv): the first four lists of m tensors of their own, one per query: o_i
    (B, T, d) in the sources' dtype (none without ``write_o``), μ_i and s_i (B, T) float32, and with
    ``write_q`` q_i as a float32 copy followed by its detail-bias row, (d + K,) (none without); inv
    (n, B, T) float32, each key's inverse RMS, for the backward. ``rows`` (m, K): the queries'
    detail-bias rows, or None; ``codes`` (n,) int64: the sources' kind codes
    (``routers.block.plan.code_bias``), where the pool has details and ``rows`` are given, else None."""
    v0 = values[0]
    R, d = _rows(v0)
    m, n = q.shape[0], len(values)
    o = [v0.new_empty(v0.shape) for _ in range(m)] if write_o else []
    mx = [v0.new_empty(v0.shape[:-1], dtype=torch.float32) for _ in range(m)]
    s = [v0.new_empty(v0.shape[:-1], dtype=torch.float32) for _ in range(m)]
    kb = 0 if rows is None else rows.shape[1]
    qc = [q.new_empty((d + kb,), dtype=torch.float32) for _ in range(m)] if write_q else []
    inv = v0.new_empty((n, *v0.shape[:-1]), dtype=torch.float32)
    bm = query_block(m, d)
    launcher(mod, "phase1_fwd", d)((R, -(-m // bm)))(
        tuple(values), q, q if rows is None else rows, inv if codes is None else codes,
        q if valid is None else valid.view(torch.uint8), tuple(o or mx), tuple(mx), tuple(s), tuple(qc or mx), inv, R, d,
        EPS, m, kb, R_BUCKET=pow2(R), N=n, NQ=m, HAS_BIAS=codes is not None, QB=rows is not None,
        HAS_VALID=valid is not None, WRITE_O=write_o, WRITE_Q=write_q, BLOCK_M=bm, BLOCK_D=pow2(d),
        BLOCK_KB=pow2(max(kb, 2)))
    return o, mx, s, qc, inv


def _bits(ts: Sequence[Tensor | None]) -> int:
    """Bit i set where ``ts[i]`` is a tensor (a kernel's mask of the per-query tensors given)."""
    return sum(1 << i for i, t in enumerate(ts) if t is not None)


def _present(ts: Sequence[Tensor | None], m: int, dummy: Tensor) -> tuple[Tensor, ...]:
    """``ts`` as a tuple of m pointers of one dtype (a kernel selects among them): where a tensor is
    absent, the first one given, or ``dummy`` where none is (never read: its bit is 0)."""
    ts = list(ts) or [None] * m
    fill = next((t for t in ts if t is not None), dummy)
    return tuple((fill if t is None else t).contiguous() for t in ts)


def run_phase1_bwd(mod: ModuleType, values: Sequence[Tensor], inv: Tensor, q: Tensor, rows: Tensor | None,
                   codes: Tensor | None, valid: Tensor | None, mx: Sequence[Tensor], s: Sequence[Tensor], g_o: Sequence[Tensor | None],
                   g_s: Sequence[Tensor | None], g_qc: Sequence[Tensor | None] = ()) -> tuple[Tensor, Tensor]:
    """(∂/∂values (n, …, d) (through the keys' inverse RMS too, ``inv`` (n, B, T) as phase 1 wrote
    it), ∂/∂q and ∂/∂rows as one float32 vector (m·d, then m·K with the detail-bias rows)). μ, s, the output gradients g_o, ∂s and the query copies' gradients
    g_qc are lists of m (a None where a gradient is absent; g_o and g_qc may be empty).
    ∂/∂q = Σ_rows Σ_i (gℓ_i·r_i) V_i + ∂q_copy and ∂/∂bias = Σ_rows gℓ are reduced in the kernel
    :func:`phase1_bwd_q` per program over its rows, and over the programs by one torch sum.

    Temporary memory, at most the pool's own size (n × B·T × d elements of the sources' dtype):
    gℓ (n, m, B·T) float32, and where the queries take more than one program per row
    (``query_block``: m·d past 4,096 floats, e.g. m > 4 at d = 1024) each group's partial ∂/∂values
    in float32 for a chunk of rows (:func:`phase1_bwd_chunk`: as many rows as fit in the
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
    else:  # each group's partial in float32 for one chunk of rows at a time, summed after
        out_v = v0.new_empty((n, *v0.shape))
        g_v = v0.new_empty((groups, n, chunk, d), dtype=torch.float32)
    go_bits, dummy = _bits(g_o), mx[0]
    kb = 0 if rows is None else rows.shape[1]
    pool = (tuple(values), inv, q, q if rows is None else rows, inv if codes is None else codes,
            q if valid is None else valid.view(torch.uint8), tuple(mx), tuple(s))
    g_o = _present(g_o, m, dummy)
    g_dot = dummy
    if go_bits:
        g_dot = v0.new_empty((m, *v0.shape[:-1]), dtype=torch.float32)
        launcher(mod, "phase1_bwd_dot", d)((R, groups))(
            *pool, g_o, g_dot, R, d, m, kb, R_BUCKET=pow2(R), N=n, NQ=m, HAS_BIAS=codes is not None,
            HAS_VALID=valid is not None, GO_BITS=go_bits, BLOCK_M=bm, BLOCK_D=pow2(d))
    rest = (g_o, _present(g_s, m, dummy), g_dot)
    flags = dict(R_BUCKET=pow2(R), N=n, NQ=m, HAS_BIAS=codes is not None, HAS_VALID=valid is not None,
                 GO_BITS=go_bits, GS_BITS=_bits(g_s), BLOCK_M=bm, BLOCK_D=pow2(d))
    if groups == 1:
        launcher(mod, "phase1_bwd", d)((R, 1))(*pool, *rest, g_v, g_l, R, d, m, kb, 0, R, **flags)
        g_v = g_v[0]
    else:  # the second stage of the sum over query groups, a chunk of rows at a time
        for r0 in range(0, R, chunk):
            rc = min(chunk, R - r0)
            launcher(mod, "phase1_bwd", d)((rc, groups))(*pool, *rest, g_v, g_l, R, d, m, kb, r0, chunk, **flags)
            out_v.view(n, R, d)[:, r0:r0 + rc] = g_v[:, :, :rc].sum(0)
        g_v = out_v
    progs, per = _split(R, v0.device)
    width = m * (d + kb)
    part = v0.new_empty((progs, width), dtype=torch.float32)
    launcher(mod, "phase1_bwd_q", d)((progs, groups))(
        tuple(values), inv, g_l, _present(g_qc, m, dummy), inv if codes is None else codes, part, R, d, m, kb, width,
        per, R_BUCKET=pow2(R), N=n, NQ=m, GQ_BITS=_bits(g_qc), HAS_BIAS=codes is not None, QB=rows is not None,
        BLOCK_M=bm, BLOCK_D=pow2(d), BLOCK_KB=pow2(max(kb, 2)))
    return g_v, part.sum(0)


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
               details: Sequence[Tensor], bias: Tensor | None, max_scale: float,
               u: Tensor | None = None, k_lo: int = 0, seen: int | None = None,
               csign: int = 0) -> tuple[Tensor, Tensor | None, list[Tensor]]:
    """(h, P + u, the details ± u) of one read. Without ``u``: (h, None, []), the merge of P and the seen
    ``details``. With ``u`` (a chained merge) the partial sum is P + u, written out beside h; and with
    ``seen`` (the count of seen kinds, from ``k_lo``) ``details`` are every kind's running detail D_j,
    each D_j + u (bit j of ``csign``) or D_j − u written out too, the merge taking the seen ones. q is
    (d,), or (d + K,) with the detail biases of every kind after the query (phase 1's copy): ``bias``
    is then None."""
    R, d = _rows(P)
    kd = len(details) if seen is not None else 0
    K = seen if seen is not None else len(details)
    bias = _carried_bias(q, d, k_lo, K, bias)
    if o.shape != P.shape or mx.shape != P.shape[:-1] or s.shape != mx.shape or q.dim() != 1 or q.shape[0] < d:
        raise ValueError(f"phase 2 of one read takes o and P {tuple(P.shape)}, mu and s {tuple(P.shape[:-1])} and "
                         f"q ({d},); got o {tuple(o.shape)}, mu {tuple(mx.shape)}, s {tuple(s.shape)}, q {tuple(q.shape)}")
    h = torch.empty_like(o)
    P_out = None if u is None else torch.empty_like(P)
    d_out = [torch.empty_like(t) for t in details] if kd else []
    launcher(mod, "phase2_fwd", d)((R,))(
        o, mx, s, q, P, P if u is None else u, h if P_out is None else P_out, tuple(details) or (P,),
        tuple(d_out) or (h,), q if bias is None else bias, h, R, d, EPS, max_scale, R_BUCKET=pow2(R), K=K,
        CHAIN=u is not None, KD=kd, KLO=k_lo if kd else 0, CSIGN=csign, HAS_BIAS=bias is not None,
        BLOCK_K=pow2(max(K, 2)), BLOCK_D=pow2(d))
    return h, P_out, d_out


def _carried_bias(q: Tensor, d: int, k_lo: int, K: int, bias: Tensor | None) -> Tensor | None:
    """The seen details' biases: ``bias``, or where q carries every kind's after it, their view."""
    return q[d + k_lo:d + k_lo + K] if q.shape[0] > d and K else bias


def run_phase2_bwd(mod: ModuleType, g: Tensor, h: Tensor, mx: Tensor, s: Tensor, q: Tensor, bias: Tensor | None,
                   updates: Sequence[Tensor], coef_t: Tensor | None, bits: int, k_lo: int, n_kinds: int, K: int,
                   max_scale: float, g_pn: Tensor | None = None, g_dn: Sequence[Tensor | None] = (), kd: int = 0,
                   csign: int = 0) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(∂o, ∂s, ∂P, ∂details (K, …), ∂q and ∂bias as one float32 vector: (d, then K) with ``bias``,
    or q's own shape (d + every kind's bias) where q carries them, zero for the kinds not seen; ∂u);
    with ``g_pn`` (a chained merge: the gradient of its P + u) ∂P includes it. With ``kd`` (a merge
    the kd running details passed through, ``csign`` their signs of u): ∂details is every kind's
    (kd, …), with the gradients ``g_dn`` of D_j ± u (a None where absent), and ∂u = ∂P + Σ ±∂D_j;
    else ∂u is empty."""
    R, d = _rows(h)
    carried = q.shape[0] > d
    bias = _carried_bias(q, d, k_lo, K, bias)
    kt = q.shape[0] - d if carried else (K if bias is not None else 0)
    progs, per = _split(R, h.device)
    bk = pow2(max(K, 2))
    u0 = updates[0]
    g_o, g_p = torch.empty_like(h), torch.empty_like(u0)
    g_s = mx.new_empty(mx.shape)
    g_d = u0.new_empty((kd or K, *u0.shape))
    g_u = torch.empty_like(u0) if kd else u0.new_empty((0,))
    part = mx.new_empty((progs, d + kt))
    launcher(mod, "phase2_bwd", d)((progs,))(
        g.contiguous(), g if g_pn is None else g_pn.contiguous(), _present(g_dn, kd, g) if kd else (g,), h, mx, s,
        q, q if bias is None else bias, tuple(updates), q if coef_t is None else coef_t, bits, k_lo, n_kinds, g_o, g_s,
        g_p, g_d if kd or K else g_p, g_u if kd else g_p, part, R, d, EPS, max_scale, per, k_lo if carried else 0, kt,
        R_BUCKET=pow2(R), K=K, U=len(updates), HAS_GPN=g_pn is not None, KD=kd, KLO=k_lo if kd else 0, CSIGN=csign,
        GD_BITS=_bits(g_dn), HAS_BIAS=bias is not None, HAS_COEF_T=coef_t is not None, BLOCK_K=bk,
        BLOCK_KT=pow2(max(kt, 2)), BLOCK_D=pow2(d))
    return g_o, g_s, g_p, g_d, part.sum(0), g_u
