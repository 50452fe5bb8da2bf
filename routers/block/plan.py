"""The static plan of a block router (Block AttnRes, arXiv:2603.15031; WAV v1 / HAARES,
arXiv:2606.06564): every per-slot fact a read or write needs, made once at construction, and
each slot's **role**, the static key of its read and write (DESIGN.md, "The router contract").

A read never computes an index from host data and never indexes a tensor with a Python list (a
list index is a pageable host-to-device copy on a GPU, which blocks the host and which CUDA-graph
capture refuses). What a read needs is therefore, per slot:

- its pseudo-query rows as a Python int or a ``slice`` (a block's reads are consecutive sublayers,
  so ``pseudo_query[a:b]`` is a view and costs no op);
- the kinds of its sources (None for a state source e, C_b, P; j for a detail of kind
  ``detail_kinds[j]``) as Python tuples, for the naive pool, each block's phase 1 and the readout;
- the same kinds as **kind codes** (0 for a state source, j + 1 for detail j) in one
  non-persistent int64 buffer, ``plan_codes``, of which each read takes a slice: a detail-bias row
  (K,) padded with a leading 0 and gathered by codes is the read's logit bias
  (:func:`code_bias`), one op whatever the depth. An integer buffer follows the model to its
  device and is never cast by ``Decoder.to(dtype)``;
- the partial details it sees as a ``slice`` of the detail kinds (the ``partial_details`` rules
  always give a contiguous run: all, none, or a prefix in ``detail_kinds`` order);
- for ``lean``, the ±1 coefficients of the block's earlier updates as one Python int of bits
  (:func:`coefficient_bits`), which a custom autograd Function takes as a plain argument.

Python work per read is O(1) in the depth: nothing scans the slots at a read.

The two-phase pool is kept newest first: ``C_b, D̃_b…, C_{b−1}, …, C_1, D̃_1…, e`` (and, under the
layer scope, pads after e). Its kinds repeat with period 1 + K from the front (e sits where a C
would), so the logit bias of a phase 1 over the first n sources is ``pool_codes[:n]`` whether the
pool is exact or padded. The naive pool keeps the paper's order, oldest first.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

Kinds = tuple  # tuple[int | None, ...]


def codes_of(kinds: Kinds) -> list[int]:
    """Kind codes of source kinds: 0 for a state source (None), j + 1 for detail j."""
    return [0 if k is None else k + 1 for k in kinds]


def code_bias(rows: Tensor, codes: Tensor) -> Tensor:
    """The logit bias of reads over sources of the given kind codes.

    Args:
        rows: detail-bias rows, (K,) for one read or (m, K) for m reads.
        codes: (n,) int64 kind codes of the n sources (0: state source, whose bias is 0).

    Returns:
        (n,) or (m, n) in the dtype of ``rows``.
    """
    return F.pad(rows, (1, 0)).index_select(-1, codes)


def span(kinds: tuple[int, ...]) -> slice:
    """``kinds`` (a contiguous increasing run of detail indices) as a slice.

    Raises:
        ValueError: the run is not contiguous (no ``partial_details`` rule gives one).
    """
    if not kinds:
        return slice(0, 0)
    if list(kinds) != list(range(kinds[0], kinds[-1] + 1)):
        raise ValueError(f"partial detail kinds {kinds} are not a contiguous run")
    return slice(kinds[0], kinds[-1] + 1)


def coefficient_bits(rows: list[tuple[int, ...]], K: int) -> int:
    """±1 coefficients (p updates × K kinds) as one int: bit ``i·K + j`` set when update i enters
    detail j with +1. The inverse is :func:`coefficient`."""
    bits = 0
    for i, row in enumerate(rows):
        for j, c in enumerate(row):
            if c > 0:
                bits |= 1 << (i * K + j)
    return bits


def coefficient(bits: int, K: int, i: int, j: int) -> int:
    """+1 or −1: the coefficient of update i in detail j of :func:`coefficient_bits`."""
    return 1 if bits >> (i * K + j) & 1 else -1


class BlockPlan:
    """Per-slot static facts of a block router (module doc). Built by the router once its
    options are set; the router registers :attr:`codes` as its ``plan_codes`` buffer.

    Attributes:
        K: detail kinds per block.
        blocks: block b → its slots.
        rows: block b → the slice of its reads' sublayer indices (pseudo-query rows).
        completed: block b → kinds of the two-phase pool when b starts: e, then per completed
            block C and its K details.
        read_kinds: read k (0 .. 2L; 2L is the readout) → kinds of its naive pool.
        seen: slot k → the partial detail kinds its read sees (a tuple), ``seen_span`` the same
            as a slice.
        coef_bits: slot k → :func:`coefficient_bits` of the updates before it in its block.
        readout_newest: indices of the exact two-phase pool (newest first) the readout mixes.
        capacity: sources of a full pool, ``1 + N(1+K)`` (the padded pool's length).
        coefs: slot k → its update's ±1 coefficient in each detail kind.
        read_codes: per naive read (its pool, oldest first), a slice of :attr:`codes`, or None
            where no source is a detail.
        pool_codes: n → the slice of :attr:`codes` of a two-phase pool of n sources, newest first
            (period 1 + K), or None where none is a detail.
        codes: the int64 tensor the slices index.
    """

    def __init__(self, r) -> None:
        K = self.K = len(r.detail_kinds)
        slots = r.slots                       # the router's routers.base.Slot tuple
        n_blocks = slots[-1].block
        self.blocks = {b: tuple(s for s in slots if s.block == b) for b in range(1, n_blocks + 1)}
        self.rows = {b: slice(blk[0].index, blk[-1].index + 1) for b, blk in self.blocks.items()}
        per_block = (None,) + tuple(range(K))
        self.completed = {b: (None,) + per_block * (b - 1) for b in range(1, n_blocks + 2)}
        self.seen = tuple(tuple(r._partial_kinds(s)) if s.pos >= 1 else () for s in slots)
        self.seen_span = tuple(span(seen) for seen in self.seen)
        self.coefs = tuple(tuple(r._coefficients(s)) for s in slots)
        self.coef_bits = tuple(coefficient_bits([r._coefficients(x) for x in self.blocks[s.block][:s.pos]], K)
                               for s in slots)
        read_kinds = []
        for s, seen in zip(slots, self.seen):
            kinds = (None,) + ((None,) + tuple(range(K))) * (s.block - 1)
            read_kinds.append(kinds + (((None,) + seen) if s.pos >= 1 else ()))
        readout = (None,) + (per_block if r.readout_details else (None,)) * n_blocks
        self.read_kinds = tuple(read_kinds) + (readout,)
        # the exact two-phase pool at the readout, newest first: the last block's details exist
        # only with readout_details
        newest = (None,) + (tuple(range(K)) if r.readout_details else ())
        for _ in range(n_blocks - 1):
            newest += per_block
        newest += (None,)
        self.readout_newest = tuple(i for i, k in enumerate(newest) if r.readout_details or k is None)
        self.capacity = 1 + n_blocks * (1 + K)
        flat: list[int] = []

        def add(kinds: Kinds) -> slice | None:
            if K == 0 or all(k is None for k in kinds):
                return None
            start = len(flat)
            flat.extend(codes_of(kinds))
            return slice(start, len(flat))

        self.read_codes = tuple(add(kinds) for kinds in self.read_kinds)
        pool = add(tuple(None if i % (1 + K) == 0 else i % (1 + K) - 1 for i in range(self.capacity)))
        #: n → the slice of :attr:`codes` of a two-phase pool of n sources (None without details)
        self.pool_codes = {n: None if pool is None or n == 1 else slice(pool.start, pool.start + n)
                           for n in range(1, self.capacity + 1)}
        self.codes = torch.tensor(flat, dtype=torch.int64)
        #: (2L, K) float32: c of each slot's update in each detail kind (the layer scope's writes
        #: take it as a tensor: the role of a slot does not say its position)
        self.coefficient_table = torch.tensor([list(r._coefficients(s)) for s in slots],
                                              dtype=torch.float32).reshape(len(slots), K)
        self.roles = tuple(role(r, s) for s in slots)


def role(r, slot) -> tuple:
    """The static key of ``slot``'s read and write, never the slot's index, so a layer scope
    compiles one region per role (at most 4·N for naive), not one per slot. By position:

    0. the schedule (``"naive"`` or ``"two_phase"``);
    1. the sublayer kind (``"attn"``, ``"mlp"``);
    2. ``start``: the slot starts its block (its read has no partial sources);
    3. ``last``: it ends its block (its write completes the block);
    4. ``final``: it ends the last block;
    5. ``seen``: the partial detail kinds its read sees (a tuple of detail indices);
    6. two-phase: the block's length (the phase-1 rows and lean's register of updates);
       naive: the block number (its pool grows by one block at a time);
    7. two-phase only: the next block's length at a block end, else 0.
    """
    final = slot.index == len(r.slots) - 1
    nxt = r.slots[slot.index + 1].block_len if slot.last_in_block and not final else 0
    base = (r.schedule, slot.kind, slot.pos == 0, slot.last_in_block, final, tuple(r._partial_kinds(slot)))
    if r.schedule == "two_phase":
        return base + (slot.block_len, nxt)
    return base + (slot.block,)
