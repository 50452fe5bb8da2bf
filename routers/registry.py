"""The router registry: ``@register("name")`` fills :data:`ROUTERS` (DESIGN.md, "Registry")."""

from __future__ import annotations

import inspect
from typing import Any, Callable

from workloads.config import ConfigError

#: name -> router class, filled by :func:`register` when ``routers`` is imported.
ROUTERS: dict[str, type] = {}


def register(name: str) -> Callable[[type], type]:
    """Class decorator that adds a router class to :data:`ROUTERS` under ``name``.

    Raises:
        ValueError: ``name`` is already registered to another class.
    """

    def deco(cls: type) -> type:
        if name in ROUTERS and ROUTERS[name] is not cls:
            raise ValueError(f"router name {name!r} is registered twice")
        cls.name = name
        ROUTERS[name] = cls
        return cls

    return deco


def router_class(name: str) -> type:
    """The class registered as ``name``.

    Raises:
        ConfigError: unknown name; the message lists the known routers and names ``--routers``.
    """
    try:
        return ROUTERS[name]
    except KeyError:
        raise ConfigError(f"--routers: unknown router {name!r}; known routers: "
                          f"{', '.join(sorted(ROUTERS))}") from None


def router_options(name: str) -> dict[str, Any]:
    """The keyword options of router ``name`` with their defaults."""
    sig = inspect.signature(router_class(name).__init__)
    return {p.name: p.default for p in sig.parameters.values()
            if p.kind is p.KEYWORD_ONLY}


def build_router(name: str, d_model: int, n_layers: int, **options: Any):
    """Construct router ``name`` for a decoder of width ``d_model`` and ``n_layers`` layers.

    Raises:
        ConfigError: unknown router, unknown option (the message lists the valid ones) or an
            invalid option value.
    """
    cls = router_class(name)
    known = router_options(name)
    unknown = set(options) - set(known)
    if unknown:
        raise ConfigError(f"--router-options: router {name!r} has no option(s) {sorted(unknown)}; "
                          f"its options: {sorted(known) or 'none'}")
    try:
        return cls(d_model, n_layers, **options)
    except (TypeError, ValueError) as exc:
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError(f"--router-options: router {name!r}: invalid option value ({exc})") from None
