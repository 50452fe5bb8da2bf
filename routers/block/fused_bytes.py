"""The byte model of each ``fused`` kernel (``routers/block/fused_kernels.py``), declared beside
its launcher (``routers/block/fused_launch.py``): what one launch loads and stores, from the
arguments it is launched with (MEASUREMENT.md, "The byte rule").

Each model takes the launch's grid and arguments exactly as the launcher passes them and returns a
:class:`Moved`: ``asked``, the bytes of every element a masked ``tl.load`` or ``tl.store`` touches,
once per call, as the kernel asks for them (what Triton's interpreter counts:
``harness.costs.kernel_io``, which ``make test-kernels`` holds each model to, byte for byte); and of
that, ``param_loads``, the bytes loaded from parameters (the pseudo-queries q, the detail biases,
the coefficient table, the pad mask), which every program loads again, and ``param_bytes``, their
distinct bytes. The byte rule counts a parameter once per launch (every program reads the same few
kilobytes, which a cache holds), so a launch moves :attr:`Moved.rule` = asked − param_loads +
param_bytes. Per-program partial sums (phase 2's backward) are written here and read by the torch
op that sums them, which counts as an op of its own.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

from torch import Tensor

from .fused_launch import KEYS


@dataclass(frozen=True)
class Moved:
    """Bytes of one launch: ``read`` and ``write`` as the kernel asks (every masked element of
    every load and store), ``param_loads`` of them loaded from parameters, ``param_bytes`` the
    parameters' distinct bytes."""

    read: int
    write: int
    param_loads: int = 0
    param_bytes: int = 0

    @property
    def asked(self) -> int:
        return self.read + self.write

    @property
    def rule(self) -> int:
        """The byte rule's figure: parameters counted once per launch."""
        return self.asked - self.param_loads + self.param_bytes


def _es(t: Tensor) -> int:
    return t.element_size()


def rms_match(grid, D, C, out, scale, R, d, eps, max_scale, R_BUCKET, BLOCK_R, BLOCK_D) -> Moved:
    """Reads D and C (R, d); writes D̃ (R, d) and the gain (R,)."""
    return Moved(R * d * (_es(D) + _es(C)), R * (d * _es(out) + _es(scale)))


def phase2_fwd(grid, o, mx, s, q, P, u, P_out, details, d_out, bias, h, R, d, eps, max_scale, R_BUCKET, K, CHAIN, KD,
               KLO, CSIGN, HAS_BIAS, BLOCK_K, BLOCK_D) -> Moved:
    """Per row: o, P (and u with ``CHAIN``), the K seen details (or with ``KD`` every kind's running
    detail) (d each), μ and s; q and the K biases (parameters, every row); writes h (d), and with
    ``CHAIN`` P + u and the KD details ± u."""
    params = d * _es(q) + (K * _es(bias) if HAS_BIAS else 0)
    running = details[:KD] if KD else details[:K]
    read = R * (d * (_es(o) + _es(P) + (_es(u) if CHAIN else 0)) + sum(d * _es(t) for t in running) + _es(mx)
                + _es(s) + params)
    write = R * d * (_es(h) + (_es(P_out) if CHAIN else 0) + sum(_es(t) for t in d_out[:KD]))
    return Moved(read, write, R * params, params)


def phase2_bwd(grid, g, g_pn, g_dn, h, mx, s, q, bias, updates, coef_t, bits, k_lo, n_kinds, g_o, g_s, g_p, g_d,
               g_u, part, R, d, eps, max_scale, rows_per_prog, boff, KT, R_BUCKET, K, U, HAS_GPN, KD, KLO, CSIGN,
               GD_BITS, HAS_BIAS, HAS_COEF_T, BLOCK_K, BLOCK_KT, BLOCK_D) -> Moved:
    """q once per program; per live row the U updates (P and the details are rebuilt from them), g,
    h, μ, s; per row the program loops over, live or not, the K biases and the (U, K) coefficients
    (parameters), and with ``KD`` the given gradients of the KD running details; writes per row ∂o, ∂s,
    ∂P and the K ∂D (with ``KD``: the KD ∂D and ∂u), and per program its partial ∂q (d) and ∂bias
    (KT) in float32."""
    progs = grid[0]
    iters = progs * rows_per_prog  # the loop runs rows_per_prog times in every program
    per_iter = (K * _es(bias) if HAS_BIAS else 0) + (U * K * _es(coef_t) if HAS_COEF_T else 0)
    param_loads = progs * d * _es(q) + iters * per_iter
    param_bytes = d * _es(q) + (K * _es(bias) if HAS_BIAS else 0) + (U * K * _es(coef_t) if HAS_COEF_T else 0)
    read = (R * (sum(d * _es(u) for u in updates) + d * (_es(g) + _es(h) + (_es(g_pn) if HAS_GPN else 0)) + _es(mx)
                 + _es(s) + (_present(g_dn, GD_BITS, d) if KD else 0)) + param_loads)
    write = (R * (d * (_es(g_o) + _es(g_p) + (KD * _es(g_d) + _es(g_u) if KD else K * _es(g_d))) + _es(g_s))
             + progs * (d + KT) * _es(part))
    return Moved(read, write, param_loads, param_bytes)


def _groups(grid) -> int:
    return grid[1]


def _pool(R, d, n_q, N, values, bias, codes, valid, HAS_BIAS, HAS_VALID, groups, inv=None) -> tuple[int, int, int]:
    """(bytes read, parameter loads, parameter bytes) of a phase-1 pass over the N sources: each
    program (row, group) loads every source's row (and in the backward its inverse RMS from
    ``inv``; the forward computes it from the row), its kind code and its queries' bias (a state
    source's too, then zeroed), and the pad flag of each source."""
    src = R * groups * sum(d * _es(v) + (0 if inv is None else _es(inv)) for v in values)
    loads = N * (groups * _es(codes) + n_q * _es(bias)) if HAS_BIAS else 0
    p_loads = R * loads + (R * groups * N * _es(valid) if HAS_VALID else 0)
    p_bytes = (bias.numel() * _es(bias) + N * _es(codes) if HAS_BIAS else 0) + (N * _es(valid) if HAS_VALID else 0)
    return src + p_loads, p_loads, p_bytes


def _present(ts, bits: int, d: int = 1) -> int:
    """Bytes of one (d,) row (or one entry, d = 1) of each per-query tensor whose bit is set."""
    return sum(d * _es(t) for j, t in enumerate(ts) if (bits >> j) & 1)


def phase1_fwd(grid, values, q, bias, codes, valid, o, mx, s, qc, inv, R, d, eps, n_q, KB, R_BUCKET, N, NQ, HAS_BIAS,
               QB, HAS_VALID, WRITE_O, WRITE_Q, BLOCK_M, BLOCK_D, BLOCK_KB) -> Moved:
    """Per row: each query once (parameters) and the pool once per group of queries; writes each
    query's μ, s and (``WRITE_O``) output, each source's inverse RMS (group 0), and once
    (``WRITE_Q``) each query's float32 copy with (``QB``) its detail-bias row, read once."""
    pool, p_loads, p_bytes = _pool(R, d, n_q, N, values, bias, codes, valid, HAS_BIAS, HAS_VALID, _groups(grid))
    q_loads = R * n_q * d * _es(q)
    rows = n_q * KB * _es(bias) if WRITE_Q and QB else 0
    write = (R * (_present(mx, -1) + _present(s, -1) + (_present(o, -1, d) if WRITE_O else 0))
             + R * N * _es(inv) + (_present(qc, -1, d + KB) if WRITE_Q else 0))
    return Moved(pool + q_loads + rows, write, p_loads + q_loads, p_bytes + n_q * d * _es(q))


def phase1_bwd_dot(grid, values, inv, q, bias, codes, valid, mx, s, g_o, g_dot, R, d, n_q, KB, R_BUCKET, N, NQ,
                   HAS_BIAS, HAS_VALID, GO_BITS, BLOCK_M, BLOCK_D) -> Moved:
    """Per row: the queries (parameters), their μ, s and given output gradients, and the pool once
    per group; writes g_dot (m)."""
    pool, p_loads, p_bytes = _pool(R, d, n_q, N, values, bias, codes, valid, HAS_BIAS, HAS_VALID, _groups(grid), inv)
    q_loads = R * n_q * d * _es(q)
    read = pool + q_loads + R * (_present(mx, -1) + _present(s, -1) + _present(g_o, GO_BITS, d))
    return Moved(read, R * n_q * _es(g_dot), p_loads + q_loads, p_bytes + n_q * d * _es(q))


def phase1_bwd(grid, values, inv, q, bias, codes, valid, mx, s, g_o, g_s, g_dot, g_v, g_l, R, d, n_q, KB, row0, RC,
               R_BUCKET, N, NQ, HAS_BIAS, HAS_VALID, GO_BITS, GS_BITS, BLOCK_M, BLOCK_D) -> Moved:
    """Per row of the launch (``grid[0]`` rows from ``row0``): the queries (parameters), μ, s, the
    given ∂s and output gradients, g_dot (with an output gradient), and the pool once per group;
    writes per group and source ∂V (d), and gℓ (N, m)."""
    rows, groups = grid[0], _groups(grid)
    pool, p_loads, p_bytes = _pool(rows, d, n_q, N, values, bias, codes, valid, HAS_BIAS, HAS_VALID, groups, inv)
    q_loads = rows * n_q * d * _es(q)
    read = (pool + q_loads + rows * (_present(mx, -1) + _present(s, -1) + _present(g_s, GS_BITS)
                                     + (_present(g_o, GO_BITS, d) + n_q * _es(g_dot) if GO_BITS else 0)))
    write = rows * (groups * N * d * _es(g_v) + N * n_q * _es(g_l))
    return Moved(read, write, p_loads + q_loads, p_bytes + n_q * d * _es(q))


def phase1_bwd_q(grid, values, inv, g_l, g_qc, codes, part, R, d, n_q, KB, width, rows_per_prog, R_BUCKET, N, NQ,
                 GQ_BITS, HAS_BIAS, QB, BLOCK_M, BLOCK_D, BLOCK_KB) -> Moved:
    """Per row: the pool and its inverse RMS once per group of queries, gℓ (N, m); per program each
    source's kind code (``HAS_BIAS``, a parameter); once, the given query copies' gradients (d, and
    KB with ``QB``); writes per program its partial ∂q (m, d) and ∂rows (m, KB) in float32."""
    groups = _groups(grid)
    read = R * (groups * sum(d * _es(v) + _es(inv) for v in values) + N * n_q * _es(g_l))
    code_loads = grid[0] * groups * N * _es(codes) if HAS_BIAS else 0
    read += code_loads + _present(g_qc, GQ_BITS, d + (KB if QB else 0))
    return Moved(read, grid[0] * width * _es(part), code_loads, N * _es(codes) if HAS_BIAS else 0)


#: kernel name -> its byte model
MODELS = {"rms_match": rms_match, "phase2_fwd": phase2_fwd,
          "phase2_bwd": phase2_bwd, "phase1_fwd": phase1_fwd, "phase1_bwd_dot": phase1_bwd_dot,
          "phase1_bwd": phase1_bwd, "phase1_bwd_q": phase1_bwd_q}


def autotune_key(name: str, args: tuple, kwargs: dict) -> tuple:
    """The values of kernel ``name``'s :data:`KEYS` in a launch with ``args`` and ``kwargs`` (its
    parameters named as the kernel's, :data:`MODELS`): what the autotuner keys
    its choice of config on, beside the dtypes."""
    bound = inspect.signature(MODELS[name]).bind(None, *args, **kwargs).arguments
    return tuple(bound[k] for k in KEYS[name])


class RecordedLaunches:
    """A stand-in for the kernels module whose launches are recorded, not run (no Triton needed):
    each launch appends ``(kernel name, grid, Moved)`` to :attr:`launches`, with the bytes of the
    kernel's declared byte model (:data:`MODELS`). The launchers' outputs are
    left as allocated (on the meta device, shapes only): ``harness.costs.step_costs`` counts a
    step's launches and bytes through it."""

    records_launches = True

    def __init__(self) -> None:
        self.launches: list[tuple[str, tuple, object]] = []
        #: (kernel name, its :func:`autotune_key` in the launch), one per launch
        self.keys: list[tuple[str, tuple]] = []

    def record(self, name: str, grid: tuple, args: tuple, kwargs: dict) -> None:
        self.launches.append((name, tuple(grid), moved(name, grid, args, kwargs)))
        self.keys.append((name, autotune_key(name, args, kwargs)))


def moved(name: str, grid: tuple, args: tuple, kwargs: dict) -> Moved:
    """The :class:`Moved` of one launch of kernel ``name`` with ``grid``, ``args`` and ``kwargs``
    as the launcher passed them."""
    return MODELS[name](grid, *args, **kwargs)
