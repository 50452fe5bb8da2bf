"""Cases: one router × shape × backend × mode to measure, with a stable key (DESIGN.md, "Results").

A sweep is the product of routers, widths, depths, backends and modes; :func:`expand` builds it
and :func:`validate` checks every option before any model is built, raising :class:`ConfigError`
with a one-line message that names the option to change.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field
from typing import Any, Iterable

from harness.step.backends import BACKENDS, COMPILE_SCOPES, DEFAULT_COMPILE_SCOPE, compiles
from harness.step.modes import MODES
from routers import ROUTERS, build_router, router_class, router_options
from routers.errors import ConfigError
from routers.impls import REFERENCE, impls_for
from routers.impls import names as impl_names
from workloads.config import DecoderConfig


@dataclass(frozen=True)
class Case:
    """One measurement case.

    Attributes:
        router: registered router name.
        cfg: the decoder shape (:class:`DecoderConfig`).
        mode: one of :data:`harness.step.modes.MODES`.
        backend: ``"eager"``.
        compile_mode: compile mode of the ``compile`` backend, else None.
        router_options: options passed to the router (JSON-able values).
        impl: router implementation name.
        seed: seed of the weights and the synthetic batch.
        compile_scope: what one compiled graph holds under the ``compile`` backend (``"layer"``:
            one region per sublayer role; ``"model"``: the whole forward), else None
            (:data:`harness.step.backends.COMPILE_SCOPES`).
    """

    router: str
    cfg: DecoderConfig
    mode: str
    backend: str = "eager"
    compile_mode: str | None = None
    router_options: tuple[tuple[str, Any], ...] = field(default=())
    impl: str = REFERENCE
    seed: int = 0
    compile_scope: str | None = None

    @property
    def options(self) -> dict[str, Any]:
        return dict(self.router_options)

    @property
    def options_json(self) -> str:
        """The router options as canonical JSON (sorted keys): their field of :attr:`key`, and
        what tells two cases' options apart wherever the options are part of an identity."""
        return json.dumps(self.options, sort_keys=True)

    @property
    def key(self) -> str:
        """Stable identity of the case inside a run (used to resume)."""
        c = self.cfg
        return "|".join(str(x) for x in (
            self.router, self.options_json, self.impl, self.backend,
            self.compile_mode, self.compile_scope, self.mode, c.workload, c.vocab_size, c.d_model,
            c.n_layers, c.n_heads, c.mlp, c.seq_len, c.batch_size, c.dtype, c.grad_checkpoint, self.seed))

    def router_kwargs(self) -> dict[str, Any]:
        """Keyword options to build the router with (``impl`` included where the router has it)."""
        kwargs = self.options
        if "impl" in router_options(self.router):
            kwargs["impl"] = self.impl
        return kwargs

    def columns(self) -> dict[str, Any]:
        """The case's columns of a result row."""
        return {"case_key": self.key, "router": self.router, "router_options": self.options,
                "impl": self.impl, "backend": self.backend, "compile_mode": self.compile_mode,
                "compile_scope": self.compile_scope, "mode": self.mode, "seed": self.seed, **self.cfg.shape_columns()}


def split_impl(router: str, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """Split ``impl`` out of a router's options (the impl has its own column)."""
    options = dict(options)
    impl = options.pop("impl", None) or router_class(router).impls[0]
    return impl, options


def offered_impls(router: str) -> tuple[str, ...]:
    """The implementations ``router`` offers: its class's built-ins, then the peer kernels
    registered for it (``routers/impls.py``; available here or not: an unavailable one becomes a
    ``skipped`` row with the reason)."""
    own = tuple(router_class(router).impls)
    return own + tuple(i.name for i in impls_for(router) if i.name not in own)


def impl_variants(router: str, chosen: list[str], opts: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(impl, options) of each case of ``router``: every chosen impl with ``opts``, a peer that
    declares conventions (``options`` of :class:`routers.impls.Impl`) with them added, and then every chosen
    built-in under those conventions too, so the peer is compared with ours on the same function
    (``--impls naive,liger_mhc`` on mhc: naive with the paper's options, naive and liger_mhc with
    ``sk_init=softmax_eps``).

    Raises:
        ConfigError: the user's options contradict a chosen peer's conventions.
    """
    from routers import impls
    if impls.family_of(router) is None:
        return [(i, opts) for i in chosen]
    out: list[tuple[str, dict[str, Any]]] = []
    builtins = [i for i in chosen if impls.get(i, router).builtin]
    for i in chosen:
        spec = impls.get(i, router)
        o = impls.case_options(spec, router, opts, router_options(router))
        out += [(i, o)] if o == opts else [(b, o) for b in builtins] + [(i, o)]
    seen: set = set()
    return [(i, o) for i, o in out if not ((i, tuple(sorted(o.items()))) in seen
                                            or seen.add((i, tuple(sorted(o.items())))))]


def expand(routers: Iterable[str], base: DecoderConfig, widths: Iterable[int], depths: Iterable[int],
           modes: Iterable[str], backends: Iterable[str] = ("eager",),
           options: dict[str, dict[str, Any]] | None = None, seed: int = 0,
           impls: Iterable[str] | None = None, compile_modes: Iterable[str] | None = None,
           overrides: dict[str, Any] | None = None, compile_scopes: Iterable[str] | None = None) -> list[Case]:
    """The cross product of a sweep, validated (see :func:`validate`).

    Args:
        options: per-router options, ``{"haares": {"partial_details": "never"}}``.
        impls: implementations to sweep; each router runs those it offers (a router offering
            none of them runs its default). None: each router's impl from ``options`` or default.
        compile_modes: modes of the ``compile`` backend (default: ``"default"`` only).
        compile_scopes: scopes of the ``compile`` backend (default:
            :data:`harness.step.backends.DEFAULT_COMPILE_SCOPE` only).
        overrides: other :class:`DecoderConfig` fields set with each width and depth (e.g.
            ``n_heads``), validated together with them.
    """
    options = options or {}
    known_impls = {i for r in ROUTERS.values() for i in r.impls} | set(impl_names())
    for impl in impls or ():
        if impl not in known_impls:
            raise ConfigError(f"--impls: unknown implementation {impl!r}; known: {', '.join(sorted(known_impls))}")
    for cm in compile_modes or ():
        if cm not in BACKENDS["compile"]:
            raise ConfigError(f"--compile-modes: unknown mode {cm!r}; known: {', '.join(BACKENDS['compile'])}")
    for sc in compile_scopes or ():
        if sc not in COMPILE_SCOPES:
            raise ConfigError(f"--compile-scope: unknown scope {sc!r}; known: {', '.join(COMPILE_SCOPES)}")
    cases = []
    for d, L, backend, mode, r in itertools.product(widths, depths, backends, modes, routers):
        impl, opts = split_impl(r, options.get(r, {})) if r in ROUTERS else (REFERENCE, {})
        offered = offered_impls(r) if r in ROUTERS else (impl,)
        named = "impl" in options.get(r, {})  # a router's options naming its impl run only that one
        chosen = [impl] if named else ([i for i in (impls or [impl]) if i in offered] or [offered[0]])
        try:
            cfg = base.replace(d_model=d, n_layers=L, **(overrides or {}))
        except ConfigError as exc:
            heads = (overrides or {}).get("n_heads", base.n_heads)
            raise ConfigError(f"--widths {d} / --depths {L} with {heads} heads: {exc}") from None
        cms = (compile_modes or BACKENDS["compile"][:1]) if compiles(backend) else (None,)
        scopes = (compile_scopes or (DEFAULT_COMPILE_SCOPE,)) if compiles(backend) else (None,)
        for cm, sc in itertools.product(cms, scopes):
            for i, o in impl_variants(r, chosen, opts):
                cases.append(Case(r, cfg, mode, backend, cm, tuple(sorted(o.items())), i, seed, sc))
    validate(cases, options)
    return cases


def validate(cases: list[Case], options: dict[str, dict[str, Any]] | None = None) -> None:
    """Check every name and option of a sweep without building a model.

    Raises:
        ConfigError: unknown router (``--routers``), backend (``--backends``), mode (``--modes``),
            router option (``--router-options``), or an invalid shape (named option).
    """
    for name in options or {}:
        if name not in ROUTERS:
            raise ConfigError(f"--router-options: unknown router {name!r}; known routers: "
                              f"{', '.join(sorted(ROUTERS))}")
    if not cases:
        raise ConfigError("the sweep is empty: check --routers, --widths, --depths, --modes")
    for case in cases:
        router_class(case.router)
        if case.backend not in BACKENDS:
            raise ConfigError(f"--backends: unknown backend {case.backend!r}; known: {', '.join(BACKENDS)}")
        if case.mode not in MODES:
            raise ConfigError(f"--modes: unknown mode {case.mode!r}; known: {', '.join(MODES)}")
        case.cfg.validate()
        # Routers are tiny: building one checks its options (n_blocks, partial_details, …).
        build_router(case.router, case.cfg.d_model, case.cfg.n_layers, **case.router_kwargs())
