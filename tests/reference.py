"""The float64 reference of ROUTERS.md's block routers for the tests: the math is the package's
(:mod:`routers.reference`, what each router's ``reference`` and ``routerbench check`` use), and
this adds the tests' helpers (pools by router name, the weights at init, driving a router)."""

from __future__ import annotations

import math

import torch

from routers import reference as _ref
from routers import route
from routers.reference import EPS, blocks_of, detail_sums, match, mix, rms, rmsnorm  # noqa: F401

KINDS = {"block_attnres": (), "full_attnres": (), "haares": ("split",), "wav_v1": ("phase", "split")}


def pool(name, slots, e, updates, k, *, rho=4.0, partial_details="always"):
    """Sources ``[(V_j, kind_j)]`` of the read of sublayer k of router ``name`` (k = len(slots)
    is the readout): :func:`routers.reference.pool` with the router's detail kinds."""
    return _ref.pool(KINDS[name], slots, e, updates, k, rho=rho, partial_details=partial_details)


def weights_at_init(sources, detail_bias=-2.0):
    """Mixing weights at init: zero pseudo-queries, so softmax of the biases alone."""
    raw = [1.0 if kind == "state" else math.exp(detail_bias) for _, kind in sources]
    return [r / sum(raw) for r in raw]


def drive(router, e, updates):
    """Run a router through all its sublayers with given updates (the decoder's loop without
    sublayers). Returns (every read h_k, h_out, the final state)."""
    return route(router, e, lambda slot, h: updates[slot.index])
