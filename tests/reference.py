"""A float64 reference of ROUTERS.md, written directly from the equations.

Sources are listed explicitly per sublayer and every basis is **recomputed from the stored
updates** (the routers accumulate them online), so agreement also checks the online
accumulation. Nothing here is imported from ``routers`` except the static slot layout.
"""

from __future__ import annotations

import math

import torch

from routers import route

EPS = 1e-6


def rmsnorm(v: torch.Tensor) -> torch.Tensor:
    return v / torch.sqrt(v.pow(2).mean(-1, keepdim=True) + EPS)


def rms(v: torch.Tensor) -> torch.Tensor:
    return torch.sqrt(v.pow(2).mean(-1, keepdim=True))


def match(detail, state, rho):
    return detail * torch.clamp(rms(state) / (rms(detail) + EPS), max=rho)


def blocks_of(slots):
    out: dict[int, list] = {}
    for s in slots:
        out.setdefault(s.block, []).append(s)
    return out


def detail_sums(kinds, slots_in_block, m, updates):
    """Raw detail bases of the given updates of one block (m = full block length)."""
    out = {}
    for kind in kinds:
        if kind == "split":
            out[kind] = sum((1 if s.pos < m // 2 else -1) * updates[s.index] for s in slots_in_block)
        else:
            out[kind] = sum((1 if s.kind == "attn" else -1) * updates[s.index] for s in slots_in_block)
    return out


def pool(name, slots, e, updates, k, *, rho=4.0, partial_details="always"):
    """Sources ``[(V_j, kind_j)]`` of the read of sublayer k (k = len(slots) is the readout)."""
    kinds = {"block_attnres": (), "full_attnres": (), "haares": ("split",),
             "wav_v1": ("phase", "split")}[name]
    blocks = blocks_of(slots)
    readout = k == len(slots)
    b = len(blocks) + 1 if readout else slots[k].block
    p = 0 if readout else slots[k].pos
    src = [(e, "state")]
    for bb in range(1, b):
        members = blocks[bb]
        C = sum(updates[s.index] for s in members)
        src.append((C, "state"))
        for kind, D in detail_sums(kinds, members, len(members), updates).items():
            src.append((match(D, C, rho), kind))
    if p >= 1:
        members = blocks[b][:p]
        m = slots[k].block_len
        P = sum(updates[s.index] for s in members)
        src.append((P, "state"))
        for kind, D in detail_sums(kinds, members, m, updates).items():
            visible = {"always": True, "never": False,
                       "informative": (p > m // 2) if kind == "split" else (p >= 2)}[partial_details]
            if visible:
                src.append((match(D, P, rho), kind))
    return src


def mix(sources, query, bias_of_kind):
    """``Σ_j softmax_j(w·RMSNorm(V_j) + bias_j) V_j``, written out per source."""
    if len(sources) == 1:
        return sources[0][0]
    logits = torch.stack([(rmsnorm(v) * query).sum(-1) + bias_of_kind(kind) for v, kind in sources])
    alpha = torch.softmax(logits, dim=0)
    return sum(a.unsqueeze(-1) * v for a, (v, _) in zip(alpha, sources))


def weights_at_init(sources, detail_bias=-2.0):
    """Mixing weights at init: zero pseudo-queries, so softmax of the biases alone."""
    raw = [1.0 if kind == "state" else math.exp(detail_bias) for _, kind in sources]
    return [r / sum(raw) for r in raw]


def drive(router, e, updates):
    """Run a router through all its sublayers with given updates (the decoder's loop without
    sublayers). Returns (every read h_k, h_out, the final state)."""
    return route(router, e, lambda slot, h: updates[slot.index])
