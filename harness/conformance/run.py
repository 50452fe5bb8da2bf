"""Every conformance check of one router or impl, in order (``routerbench check NAME``)."""

from __future__ import annotations

from typing import Callable

from routers import ROUTERS, impls
from routers.errors import ConfigError

from . import budget, capture, equality, graphs
from .findings import Finding

#: The checks, in the order of the table; ``inductor`` runs only when asked for.
CHECKS = ("reference", "gradients", "capture", "graph breaks", "layer recompiles", "inductor", "ops",
          "saved activations", "cost models", "flop model")


def resolve(name: str, impl: str | None = None, device: str = "cpu") -> tuple[str, str | None]:
    """(router, impl or None) of ``check NAME [--impl IMPL]``: NAME is a router, or an impl
    (then its first router; ``naive``, the reference itself, is refused).

    Raises:
        ConfigError: NAME is neither a router nor an impl (one line listing the known routers and
            impls), ``--impl`` does not implement the router, or NAME is an impl and ``--impl``
            is given too, or the impl cannot run on ``device`` here (its package, its devices).
    """
    known = impls.names()
    if name not in ROUTERS and name not in known:
        raise ConfigError(f"check: unknown router or impl {name!r}; known routers: {', '.join(sorted(ROUTERS))}; "
                          f"impls: {', '.join(n for n in known if n != impls.REFERENCE)} (load yours with --plugin)")
    if name not in ROUTERS:
        if impl is not None:
            raise ConfigError(f"--impl: {name!r} is an impl already; give a router as NAME with --impl {impl}")
        if impls.lookup(name).reference is None:
            raise ConfigError(f"check: {name} is every family's reference impl; check a router or another impl")
        name, impl = impls.get(name).routers[0], name
    if impl is not None:
        offered = [i.name for i in impls.impls_for(name)]
        if impl not in offered:
            raise ConfigError(f"--impl: {impl!r} is not an implementation of {name}; "
                              + (f"its impls: {', '.join(offered)}" if offered else f"{name} has no impls; drop --impl"))
        why = impls.get(impl, name).unavailable_reason(device, "float64")
        if why:
            raise ConfigError(f"--impl {impl}: cannot be checked here: {why}")
        if impls.lookup(impl).reference is None:  # the reference impl: the router itself
            impl = None
    return name, impl


def run_checks(name: str, impl: str | None = None, *, inductor: bool = False, device: str = "cpu",
               only: tuple[str, ...] | None = None) -> list[Finding]:
    """Run the checks of router ``name`` (with ``impl``; see :func:`resolve`) on ``device``.

    Args:
        name: a registered router.
        impl: an impl of it other than naive, or None (the router itself).
        inductor: add the ``inductor`` check (compiles with Inductor: tens of seconds on a CPU).
        device: where the step checks run (``cpu``, ``cuda``); the float64 checks run on the CPU.
        only: run these checks of :data:`CHECKS` only (None: all).

    Returns:
        the findings in :data:`CHECKS` order. A check that raises gives one failed finding with
        the error, never an exception.
    """
    options = {"impl": impl} if impl else None
    plan: list[tuple[tuple[str, ...], Callable[[], list[Finding]]]] = [
        (("reference", "gradients"),
         (lambda: equality.impl_equality(name, impl)) if impl else (lambda: equality.reference_equality(name))),
        (("capture",), lambda: capture.capture_safety(name, options, device)),
        (("graph breaks",), lambda: graphs.graph_breaks(name, options, device)),
        (("layer recompiles",), lambda: graphs.layer_recompiles(name, options, device)),
        (("inductor",), lambda: graphs.inductor_equality(name, options, device)),
        (("ops", "saved activations"), lambda: budget.ops_and_saved(name, options, device)),
        (("cost models", "flop model"), lambda: budget.declared_models(name)),
    ]
    found: list[Finding] = []
    for checks, fn in plan:
        if (only is not None and not set(checks) & set(only)) or ("inductor" in checks and not inductor):
            continue
        try:
            found += fn()
        except Exception as exc:  # noqa: BLE001 - one line per failed check, the others still run
            head = " ".join(str(exc).split())[:240]
            found += [Finding(c, False, f"the check raised {type(exc).__name__}: {head}") for c in checks[:1]]
    order = {c: i for i, c in enumerate(CHECKS)}
    return sorted(found, key=lambda f: order.get(f.check, len(order)))
