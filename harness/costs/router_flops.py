"""A router's forward FLOPs for a plan (:mod:`harness.costs.forecast`): its declared
``analytic_fwd_flops``, else counted on the ``meta`` device, else "not declared" (what a router
may give: docs/PLUGINS.md), with the sentence a plan shows for the last two."""

from __future__ import annotations

import functools
import json


#: Where :func:`router_fwd_flops` took a router's FLOPs from.
FLOP_SOURCES = ("analytic", "counted", "not declared")


def router_fwd_flops(cfg, router: str, options: dict) -> tuple[float, str]:
    """The router's forward mixing FLOP for B·T tokens at shape ``cfg`` and where it comes from
    (one of :data:`FLOP_SOURCES`): its ``analytic_fwd_flops``; where it declares none
    (``routers.api.declares``), its forward counted op by op on the ``meta`` device
    (:func:`harness.costs.flop_counter.count_flops_dispatch`, no memory: ``"counted"``); where
    that count fails too, 0 (``"not declared"``: its mixing is left out; :func:`flop_note` says so)."""
    from .estimate import meta_router  # torch: only when a plan is made
    value = meta_router(router, cfg.d_model, cfg.n_layers, options).analytic_fwd_flops(cfg.batch_size, cfg.seq_len)
    if value is not None:
        return float(value), "analytic"
    counted = _counted_router_flops(router, cfg.d_model, cfg.n_layers, cfg.batch_size, cfg.seq_len,
                                    json.dumps(options or {}, sort_keys=True, default=str))
    return (0.0, "not declared") if counted is None else (counted, "counted")


@functools.lru_cache(maxsize=256)
def _counted_router_flops(router: str, d: int, L: int, B: int, T: int, options: str) -> float | None:
    import torch

    from routers import route

    from .estimate import meta_router
    from .flop_counter import count_flops_dispatch
    r = meta_router(router, d, L, json.loads(options))

    class Probe(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.router = r

        def forward(self, e, *updates):
            reads, h_out, _ = route(self.router, e, lambda slot, h: updates[slot.index])
            return (*reads, h_out)
    inputs = tuple(torch.zeros((B, T, d), device="meta") for _ in range(len(r.slots) + 1))
    try:
        return float(count_flops_dispatch(Probe(), inputs, strict=False)["fwd_flops"])
    except Exception:  # noqa: BLE001 - a router the meta device cannot run: its FLOPs are not declared
        return None


def flop_note(router: str, source: str) -> str | None:
    """What a plan says of a router whose FLOPs are not its analytic model (:func:`router_fwd_flops`),
    or None for ``"analytic"``."""
    if source == "counted":
        return (f"router {router}: analytic_fwd_flops not declared; its step estimate uses its forward "
                "FLOPs counted on the meta device")
    if source == "not declared":
        return (f"router {router}: analytic_fwd_flops not declared and its forward could not be counted "
                "on the meta device; its step estimate leaves its mixing out")
    return None


__all__ = ["FLOP_SOURCES", "flop_note", "router_fwd_flops"]
