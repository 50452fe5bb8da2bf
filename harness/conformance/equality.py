"""Float64 equality of a router with its own reference, forward and gradients (docs/PLUGINS.md,
"routerbench check").

:func:`reference_equality` builds the router at d = :data:`D` and each depth of :data:`DEPTHS` in
float64 with random parameters (seeded: every parameter moved by 0.3·N(0, 1), so zero-initialised
queries and gates do not hide a wrong formula), a random embedding e (B, T, d) and 2L random updates
u_k, drives it with ``routers.base.route`` with the updates fixed, and compares every read h_k and
h_out with ``router.reference(e, updates)`` elementwise (``|got − want| <= ATOL + RTOL·|want|``).
Then it backpropagates one random cotangent (Σ_k ⟨h_k, w_k⟩ + ⟨h_out, w⟩) through both and compares
the gradients wrt e, every u_k and every parameter the same way (a parameter that gets no gradient
on one side counts as a zero gradient there).

:func:`impl_equality` checks an impl against its family's reference impl ``naive`` on the same
random parameters and inputs (:func:`harness.sweep.parity.router_parity` in float64, gradients too).
"""

from __future__ import annotations

import torch

from harness.sweep.parity import TOLERANCES, router_parity
from routers import build_router, route

from .findings import Finding, rel_err

#: Width, depths (layers), batch and sequence of the equality checks.
D, DEPTHS, B, T = 8, (3, 4), 2, 3
#: Elementwise tolerance of float64 equality: a reordered sum errs by ~1e-15 relative.
RTOL = ATOL = 1e-10
#: Scale of the noise added to every parameter (module doc).
NOISE = 0.3


def random_router(name: str, d: int, n_layers: int, options: dict | None = None, seed: int = 0,
                  dtype: torch.dtype = torch.float64) -> torch.nn.Module:
    """Router ``name`` (its ``options``) in ``dtype`` with every parameter moved by
    :data:`NOISE`·N(0, 1) from its init (seeded).

    Raises:
        ConfigError: an unknown router or option (``build_router``).
    """
    r = build_router(name, d, n_layers, **(options or {})).to(dtype)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in r.parameters():
            p.add_(NOISE * torch.randn(p.shape, generator=g, dtype=torch.float64).to(p.dtype))
    return r


def _inputs(n_layers: int, d: int, seed: int) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
    """e (B, T, d), the 2L updates and the 2L + 1 cotangents, float64, e and u requiring grad."""
    g = torch.Generator().manual_seed(seed + 1)

    def rnd():
        return torch.randn(B, T, d, generator=g, dtype=torch.float64)
    e = rnd().requires_grad_()
    ups = [(rnd() * (0.2 + k % 3)).requires_grad_() for k in range(2 * n_layers)]
    cot = [rnd() for _ in range(2 * n_layers + 1)]
    return e, ups, cot


def _close(got: torch.Tensor, want: torch.Tensor) -> tuple[bool, float, float]:
    """(elementwise within RTOL/ATOL, max |Δ|, norm-relative error)."""
    if got.shape != want.shape:
        return False, float("inf"), float("inf")
    a, b = got.detach().double(), want.detach().double()
    diff = (a - b).abs()
    ok = bool(torch.isfinite(a).all()) and bool((diff <= ATOL + RTOL * b.abs()).all())
    return ok, float(diff.max()) if diff.numel() else 0.0, rel_err(a, b)


def _grads(r, outputs: list[torch.Tensor], cot: list[torch.Tensor], e, ups) -> dict[str, torch.Tensor]:
    loss = sum((h.double() * w).sum() for h, w in zip(outputs, cot))
    named = [(n, p) for n, p in r.named_parameters() if p.requires_grad]
    wrt = [e, *ups, *(p for _, p in named)]
    gs = torch.autograd.grad(loss, wrt, allow_unused=True)
    names = ["e", *(f"u_{k}" for k in range(len(ups))), *(f"parameter {n}" for n, _ in named)]
    return {n: (torch.zeros_like(t, dtype=torch.float64) if g is None else g) for n, t, g in zip(names, wrt, gs)}


def reference_equality(name: str, options: dict | None = None, *, d: int = D,
                       depths: tuple[int, ...] = DEPTHS, seed: int = 0) -> list[Finding]:
    """Router ``name`` against its own ``reference(embedding, updates)`` in float64 (module doc).

    Returns:
        two findings: ``reference`` (every read and h_out) and ``gradients`` (wrt e, each u_k and
        each parameter); a failure names the first quantity and depth that differ, its largest
        absolute and relative error, and what to change. The figure is the largest norm-relative
        error over every depth.
    """
    worst = {"reference": 0.0, "gradients": 0.0}
    bad: dict[str, str] = {}
    for L in depths:
        r = random_router(name, d, L, options, seed)
        e, ups, cot = _inputs(L, d, seed)
        try:
            reads, out, _ = route(r, e, lambda slot, h: ups[slot.index])
        except Exception as exc:  # noqa: BLE001 - a plugin's error is a finding, not a crash
            return [Finding("reference", False, f"driving {name} at L={L} raised {type(exc).__name__}: {exc}; "
                                                "fix init_state/params/read/write/output"),
                    Finding("gradients", False, "not checked: the forward raised")]
        try:
            want_reads, want_out = r.reference(e, ups)
            want = [*want_reads, want_out]
        except Exception as exc:  # noqa: BLE001
            return [Finding("reference", False, f"{name}.reference(embedding, updates) raised {type(exc).__name__}: "
                                                f"{exc}; it must return (the 2L reads, h_out) in float64"),
                    Finding("gradients", False, "not checked: the reference raised")]
        got = [*reads, out]
        if len(want) != len(got):
            return [Finding("reference", False, f"{name}.reference returned {len(want) - 1} reads at L={L}, the router "
                                                f"made {len(got) - 1}; return one read per sublayer (2L) and h_out"),
                    Finding("gradients", False, "not checked: the reference's reads do not match")]
        for k, (g_, w_) in enumerate(zip(got, want)):
            ok, dmax, rel = _close(g_, w_)
            worst["reference"] = max(worst["reference"], rel)
            what = "h_out" if k == len(got) - 1 else f"read h_{k}"
            if not ok and "reference" not in bad:
                bad["reference"] = (f"{what} at L={L} differs from {name}.reference(e, updates): max |Δ| {dmax:.1e} "
                                    f"> {ATOL:.0e} + {RTOL:.0e}·|ref| (rel {rel:.1e}); make init_state/read/write/"
                                    "output compute the recurrence reference() states (or correct the reference)")
        if "reference" in bad:
            continue
        try:
            g_got = _grads(r, got, cot, e, ups)
            g_want = _grads(r, [w.double() for w in want], cot, e, ups)
        except Exception as exc:  # noqa: BLE001
            bad["gradients"] = f"the backward at L={L} raised {type(exc).__name__}: {exc}; fix the router's backward"
            continue
        for q, gw in g_want.items():
            ok, dmax, rel = _close(g_got[q], gw)
            worst["gradients"] = max(worst["gradients"], rel)
            if not ok and "gradients" not in bad:
                bad["gradients"] = (f"gradient wrt {q} at L={L} differs from the reference's: max |Δ| {dmax:.1e} "
                                    f"(rel {rel:.1e}); a .detach()/.data, an in-place op on a saved tensor or a "
                                    "custom autograd backward is wrong on its path")
    out = []
    for check in ("reference", "gradients"):
        fig = f"max rel err {worst[check]:.1e} (L={','.join(map(str, depths))}, d={d}, float64)"
        if check == "gradients" and "reference" in bad:
            out.append(Finding(check, False, "not checked: the forward differs from the reference", ""))
        else:
            out.append(Finding(check, check not in bad, bad.get(check, ""), fig))
    return out


def impl_equality(router: str, impl: str, options: dict | None = None, *, d: int = D,
                  depths: tuple[int, ...] = DEPTHS, device: str = "cpu", seed: int = 0) -> list[Finding]:
    """``impl`` of ``router`` against ``naive`` in float64 on random parameters and inputs, output
    and gradients (:func:`harness.sweep.parity.router_parity`, its tolerance
    ``TOLERANCES[float64]`` norm-relative). One finding ``reference`` naming the worst quantity."""
    worst, bad = 0.0, ""
    for L in depths:
        try:
            res = router_parity(router, options or {}, impl, d, L, B, 8, torch.float64, device,
                                backward=True, seed=seed)
        except Exception as exc:  # noqa: BLE001
            return [Finding("reference", False, f"impl {impl} of {router} at L={L} raised {type(exc).__name__}: {exc}")]
        worst = max(worst, res.max_rel_err) if res.max_rel_err == res.max_rel_err else float("nan")
        if not res.ok and not bad:
            bad = (f"impl {impl} of {router} at L={L}: {res.message()}; make it compute what naive computes "
                   f"({res.worst} is where it differs)")
    fig = f"max rel err {worst:.1e} vs naive (<= {TOLERANCES[torch.float64]:.0e}, float64)"
    return [Finding("reference", not bad, bad, fig)]
