"""The router registry: ``@register("name")`` fills :data:`ROUTERS` (DESIGN.md, "Where does it go")."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import types
import typing
from pathlib import Path
from typing import Any, Callable

from .errors import ConfigError

#: name -> router class, filled by :func:`register` as :func:`load_routers` imports the router
#: modules (on first use of a router name or of ``routers.ROUTERS``), and by a plugin's
#: :func:`register` as :mod:`routers.plugins` loads it.
ROUTERS: dict[str, type] = {}
#: name -> where the router comes from: ``"built-in"``, or its plugin's label
#: (:attr:`routers.plugins.Plugin.label`: distribution and version, or file).
ORIGINS: dict[str, str] = {}
#: The label of the plugin being loaded (:func:`routers.plugins.loading`), None for the built-ins.
_plugin: list[str] = []
#: The router every other router is compared with: the standard PreNorm residual (a paired
#: group's ``A``, the baseline of every ratio and of the training race).
BASELINE = "prenorm"


#: Modules of ``routers`` that define no router (infrastructure, imported where needed).
INFRA_MODULES = frozenset({"base", "errors", "registry", "mixer", "impls", "peers", "stream", "block"})
#: None (not loaded), "loading" (an import under way: a nested call returns at once) or "done".
_state: str | None = None


def load_routers() -> dict[str, type]:
    """Import every router module of the package once, so that each registers itself
    (``@register``): a router in a new file appears in ``routerbench list``, sweeps and the
    parametrised tests without other edits. Called on first use, not on ``import routers``, so that
    a light import (``routers.errors``, ``routerbench --help``) does not load torch.

    Returns:
        :data:`ROUTERS`.

    Raises:
        ImportError: (or any error) a router module failed to import; the next call tries again.
    """
    global _state
    if _state is None:
        _state = "loading"
        try:
            for m in pkgutil.iter_modules([str(Path(__file__).parent)]):
                if m.name not in INFRA_MODULES and not m.name.startswith("_"):
                    importlib.import_module(f"{__package__}.{m.name}")
        except BaseException:
            _state = None  # a module that failed to import fails every use, never a part registry
            raise
        _state = "done"
    return ROUTERS


def register(name: str, cls: type | None = None) -> Callable[[type], type] | type:
    """Add a router class to :data:`ROUTERS` under ``name``: the one registration of built-ins
    and plugins alike (``routers.api.register_router``). As a class decorator
    (``@register("name")``) or a call (``register("name", cls)``).

    Raises:
        ValueError: ``name`` is not an identifier, or is already registered to another class (a
            plugin's message names the router it clashes with and where that one comes from).
    """

    def deco(cls: type) -> type:
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"router name {name!r} must be a Python identifier (letters, digits, _)")
        if name in ROUTERS and ROUTERS[name] is not cls:
            raise ValueError(f"router name {name!r} is taken by the {ORIGINS.get(name, 'built-in')} router "
                             f"{ROUTERS[name].__module__}.{ROUTERS[name].__qualname__}; register it under another name")
        cls.name = name
        ROUTERS[name] = cls
        ORIGINS[name] = _plugin[-1] if _plugin else "built-in"
        return cls

    return deco if cls is None else deco(cls)


def origin(name: str) -> str:
    """Where router ``name`` comes from: ``"built-in"``, a plugin's label, or ``"not loaded"``."""
    load_routers()
    return ORIGINS.get(name, "not loaded")


def router_class(name: str) -> type:
    """The class registered as ``name``.

    Raises:
        ConfigError: unknown name; the message lists the known routers and names ``--routers``.
    """
    load_routers()
    try:
        return ROUTERS[name]
    except KeyError:
        raise ConfigError(f"--routers: unknown router {name!r}; known routers: "
                          f"{', '.join(sorted(ROUTERS))}") from None


def paper_baseline(name: str) -> str | None:
    """The router ``name``'s paper measures it against beside prenorm (its class's
    ``paper_baseline``, e.g. ``block_attnres`` for ``haares`` and ``wav_v1``); None for a router
    without one and for a name this process does not know (records of a router not loaded here)."""
    load_routers()
    cls = ROUTERS.get(name)
    return getattr(cls, "paper_baseline", None) if cls is not None else None


def router_options(name: str) -> dict[str, Any]:
    """The keyword options of router ``name`` with their defaults."""
    sig = inspect.signature(router_class(name).__init__)
    return {p.name: p.default for p in sig.parameters.values()
            if p.kind is p.KEYWORD_ONLY}


def option_types(name: str) -> dict[str, Any]:
    """The type hint of each keyword option of router ``name`` (``int | None`` for ``n_blocks``)."""
    hints = typing.get_type_hints(router_class(name).__init__)
    return {k: hints.get(k, Any) for k in router_options(name)}


def _accepts(hint: Any, value: Any) -> bool:
    if hint is Any:
        return True
    args = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    for t in args:
        if t is type(None) and value is None:
            return True
        if t is bool and isinstance(value, bool):
            return True
        if t is int and isinstance(value, int) and not isinstance(value, bool):
            return True
        if t is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            return True
        if t is str and isinstance(value, str):
            return True
    return False


def _type_name(hint: Any) -> str:
    names = {int: "an integer", float: "a number", str: "a string", bool: "true or false",
             type(None): "null"}
    args = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    return " or ".join(names.get(a, getattr(a, "__name__", str(a))) for a in args if a is not type(None))


def check_router_options(name: str, options: dict[str, Any], d_model: int, n_layers: int,
                         label: str = "--router-options") -> None:
    """Check the options of router ``name`` for a ``d_model`` × ``n_layers`` decoder: their names,
    their types (from the router's signature) and their values (by building the router, which is
    tiny). Messages start with ``label`` (the flag, or the TOML key and file).

    Raises:
        ConfigError: unknown router, unknown option (listing the valid ones), a value of the
            wrong type or out of range.
    """
    known = router_options(name)
    unknown = set(options) - set(known)
    if unknown:
        raise ConfigError(f"{label}: router {name!r} has no option(s) {sorted(unknown)}; "
                          f"its options: {', '.join(sorted(known)) or 'none'}")
    for key, hint in option_types(name).items():
        if key in options and not _accepts(hint, options[key]):
            v = options[key]
            raise ConfigError(f"{label}: {name}.{key} must be {_type_name(hint)}, got {v!r} "
                              f"({type(v).__name__})")
    try:
        router_class(name)(d_model, n_layers, **options)
    except ConfigError as exc:
        raise ConfigError(f"{label}: {name}: {exc}") from None
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{label}: {name}: invalid option value ({exc})") from None


def build_router(name: str, d_model: int, n_layers: int, **options: Any):
    """Construct router ``name`` for a decoder of width ``d_model`` and ``n_layers`` layers.

    Raises:
        ConfigError: unknown router, unknown option (the message lists the valid ones) or an
            invalid option value (:func:`check_router_options`).
    """
    cls = router_class(name)
    known = router_options(name)
    unknown = set(options) - set(known)
    if unknown:
        raise ConfigError(f"--router-options: router {name!r} has no option(s) {sorted(unknown)}; "
                          f"its options: {', '.join(sorted(known)) or 'none'}")
    try:
        return cls(d_model, n_layers, **options)
    except ConfigError as exc:
        raise ConfigError(f"--router-options: {name}: {exc}") from None
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"--router-options: {name}: invalid option value ({exc})") from None
