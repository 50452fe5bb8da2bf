"""What a router adds to a step, against prenorm on the same tiny decoder (4 layers, d = 16):

- ``ops``: ops dispatched by one eager training step, forward and backward
  (:func:`harness.costs.ops.count_ops_step`), as a ratio to prenorm's;
- ``saved activations``: bytes the forward saves for the backward
  (:func:`harness.costs.memory.saved_activation_bytes`, the model's own tensors excluded), per
  sublayer, as a ratio to prenorm's per sublayer.

Each is a figure; it fails only past its bound (:data:`BOUNDS`), set above the costliest published
router at this shape: mhc (4 streams, 20 Sinkhorn iterations per token) saves 5.8x prenorm's bytes
per sublayer and dispatches 8.6x its ops here (d = 16 inflates its per-token coefficients beside
the sublayers), the block routers under 2x. A router past 8x the saved bytes or 12x the ops costs
more than any published router: it most likely saves what it could recompute, or loops in Python
over what one op could do. The ratios fall with d for costs per token that do not grow with d, so
they flag, they do not measure.
``cost models`` lists which cost models the router declares; of them, ``analytic_fwd_flops`` is
compared with the router's forward FLOPs counted op by op (:func:`harness.costs.flops.count_router_fma`,
the convention of docs/FLOPS.md) at two shapes, and fails where they differ: a model left stale after
its router's math changed would put a wrong number in every FLOP table, MFU and forecast. The other
models are information (reports say "not declared" for those absent).
"""

from __future__ import annotations

from harness.costs.memory import model_tensors, saved_activation_bytes
from harness.costs.ops import count_ops_step
from routers import build_router
from routers.api import MAY_GIVE, declares
from routers.registry import BASELINE

from .capture import CFG, tiny_model, tokens
from .findings import Finding

#: The decoder of the budget checks: 4 layers (8 sublayers), so a cost that grows with depth shows.
BUDGET_CFG = CFG.replace(n_layers=4)
#: Largest ratio to prenorm that passes: (saved activation bytes per sublayer, ops per step).
BOUNDS = {"saved activations": 8.0, "ops": 12.0}


def _measure(name: str, options: dict | None, device: str) -> tuple[int, int]:
    model = tiny_model(name, options, BUDGET_CFG, device)
    x, y = tokens(BUDGET_CFG, device)
    ops = count_ops_step(model, x, y)
    saved = saved_activation_bytes(lambda: model(x), exclude=model_tensors(model))
    return ops["fwd"] + ops["bwd"], saved


def ops_and_saved(name: str, options: dict | None = None, device: str = "cpu") -> list[Finding]:
    """``ops`` and ``saved activations`` against prenorm (module doc): two findings, each failed
    only past its :data:`BOUNDS` ratio."""
    ops, saved = _measure(name, options, device)
    ops0, saved0 = _measure(BASELINE, None, device)
    per = 2 * BUDGET_CFG.n_layers
    out = []
    ratio = saved / max(saved0, 1)
    bound = BOUNDS["saved activations"]
    fig = f"{saved / per / 1024:.1f} KiB per sublayer, {ratio:.2f}x prenorm"
    out.append(Finding("saved activations", ratio <= bound, "" if ratio <= bound else
                       f"saves {ratio:.1f}x prenorm's activation bytes per sublayer (bound {bound:g}x): recompute "
                       "in the backward what is cheap (a custom autograd Function saving its inputs only) or "
                       "keep one copy of what several reads share", fig))
    ratio = ops / max(ops0, 1)
    bound = BOUNDS["ops"]
    fig = f"{ops} ops per step, {ratio:.2f}x prenorm"
    out.append(Finding("ops", ratio <= bound, "" if ratio <= bound else
                       f"dispatches {ratio:.1f}x prenorm's ops per step (bound {bound:g}x): batch per-source or "
                       "per-stream Python loops into one op (stack, einsum)", fig))
    return out


def declared_models(name: str) -> list[Finding]:
    """Which cost models of ``routers.api.MAY_GIVE`` router ``name`` declares: one information
    line (reports say "not declared" for the others)."""
    router = build_router(name, 8, 2)
    have = [m for m in MAY_GIVE if declares(router, m)]
    missing = [m for m in MAY_GIVE if m not in have]
    fig = f"declared: {', '.join(have) or 'none'}" + (f"; not declared: {', '.join(missing)}" if missing else "")
    out = [Finding("cost models", True, "", fig, info=True)]
    if "analytic_fwd_flops" in have:
        out.append(analytic_flops(name))
    return out


def analytic_flops(name: str, options: dict | None = None) -> Finding:
    """``analytic_fwd_flops`` of router ``name`` against its counted forward FLOPs (module doc), at
    (d, L, B, T) = (8, 2, 2, 3) and (16, 3, 1, 5): passes where they are equal at both."""
    from harness.costs.flops import count_router_fma
    for d, n_layers, b, t in ((8, 2, 2, 3), (16, 3, 1, 5)):
        router = build_router(name, d, n_layers, **(options or {}))
        declared, counted = router.analytic_fwd_flops(b, t), 2 * count_router_fma(router, b, t)
        if declared is None or float(declared) != float(counted):
            return Finding("flop model", False,
                           f"analytic_fwd_flops({b}, {t}) at d={d}, L={n_layers} is {declared}, but the forward "
                           f"counts {counted:g} FLOP (docs/FLOPS.md's convention): update the model to the "
                           f"router's math, or remove it (reports then say \"not declared\")",
                           f"{declared} declared vs {counted:g} counted")
    return Finding("flop model", True, "", f"{counted:g} FLOP at d=16, L=3, B·T=5: declared = counted")
