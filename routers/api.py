"""The public contract of a router or impl written outside routerbench (docs/PLUGINS.md).

A plugin module imports from here only, sets ``ROUTERBENCH_API_VERSION = API_VERSION``'s value
(the version it was written for, as a literal), and registers what it defines at import::

    from routers.api import Router, register_router

    ROUTERBENCH_API_VERSION = 1

    @register_router("gated_residual")
    class GatedResidual(Router):
        \"\"\"h_{k+1} = h_k + sigmoid(g_k) u_k (one line: what `routerbench list` shows).\"\"\"
        def init_state(self, embedding, region=False): ...
        def params(self, state, slot, region=False): ...
        def read(self, state, role, params): ...
        def write(self, state, role, params, update): ...
        def output(self, state, params=()): ...
        def reference(self, embedding, updates): ...   # float64, plain loops: (reads, h_out)

**Must give** (a plugin lacking one is refused with one line, :mod:`routers.plugins`):
``init_state``, ``read``, ``write``, ``output`` (``role`` and ``params`` where a slot needs more
than the state; see :class:`Router`), a docstring, its parameters created and initialised in
``__init__(d_model, n_layers, *, options…)``, and ``reference(embedding, updates)``: the router's
recurrence in float64 with plain Python loops, from e (B, T, d) and the 2L updates u_k (each
(B, T, d)), with this instance's parameters, returning (the 2L reads h_k, h_out).

**May give** (absent: the reports, counts, floor and forecasts say "not declared"):
``analytic_fwd_flops``, ``live_state_bytes``, ``ideal_io_per_token``, ``ideal_io_fwd_per_token``,
``ideal_io_fwd_bwd_per_token``, and ``paper_baseline`` (the router its paper measures it against).

An **impl** plugs into a family of :data:`routers.impls.FAMILIES` (block, stream) by its plug-in
points (:class:`Impl`, ``register_impl``); it is checked against its family's reference impl
(:data:`REFERENCE`), and declares what a caller would otherwise ask by its name (``state``:
:class:`StateModel`, ``no_layer_scope``, ``against``, ``compile_weight``, ``line``, ``marker``).

:data:`API_VERSION` changes whenever a must-give method changes its signature or meaning.
"""

from __future__ import annotations

from .base import Router, Slot, block_layout, default_n_blocks, route, single_block_slots
from .errors import ConfigError
from .impls import FAMILIES, REFERENCE, Impl, StateModel
from .impls import register as register_impl
from .registry import register as register_router

#: The version of this contract; a plugin's ``ROUTERBENCH_API_VERSION`` must equal it.
API_VERSION = 1
#: The methods a router must define (abstract in :class:`Router`).
MUST_GIVE = ("init_state", "read", "write", "output", "reference")
#: The cost models a router may define; where absent, every report says "not declared".
MAY_GIVE = ("analytic_fwd_flops", "live_state_bytes", "ideal_io_per_token", "ideal_io_fwd_per_token",
            "ideal_io_fwd_bwd_per_token")


#: What a table, report, figure or count says of a cost model a router does not declare.
NOT_DECLARED = "not declared"


def declares(router: Router | type, model: str) -> bool:
    """Whether ``router`` (an instance or class) declares cost model ``model`` (one of
    :data:`MAY_GIVE`): its class defines it, not only :class:`Router`'s "not declared" default."""
    cls = router if isinstance(router, type) else type(router)
    if model not in MAY_GIVE:
        raise ValueError(f"{model!r} is not a cost model; one of {', '.join(MAY_GIVE)}")
    return getattr(cls, model, None) is not getattr(Router, model, None)


def not_declared(model: str, router: str | None = None) -> str:
    """The words every report uses for cost model ``model`` (one of :data:`MAY_GIVE`) that
    ``router`` (a name) does not declare: ``"not declared: router X declares no
    analytic_fwd_flops (docs/PLUGINS.md)"``; a ``status="skipped"`` count row's ``error`` starts
    with :data:`NOT_DECLARED`."""
    who = f"router {router} declares" if router else "the router declares"
    return f"{NOT_DECLARED}: {who} no {model} (docs/PLUGINS.md)"


__all__ = ["API_VERSION", "ConfigError", "FAMILIES", "Impl", "MAY_GIVE", "MUST_GIVE", "NOT_DECLARED", "REFERENCE",
           "Router", "Slot", "StateModel", "block_layout", "declares", "default_n_blocks", "not_declared", "register_impl", "register_router", "route",
           "single_block_slots"]
