"""Residual routers and their registry.

Each router module registers itself with ``@register``; the registry imports every module of this
package (:func:`routers.registry.load_routers`) on first use of a router: reading ``ROUTERS``,
``Router`` or a registry function from this package, or looking a name up. So a router in a new
file appears in ``routerbench list``, sweeps and the parametrised tests without other edits, and
``import routers.errors`` (what the command line needs to print ``--help``) does not load torch.
"""

from __future__ import annotations

#: What this package may import (DESIGN.md, "Layers"; checked by tests/test_layers.py): nothing of
#: the project. ``routers.errors.ConfigError`` is the error every layer above raises.
MAY_IMPORT = ()

import importlib  # noqa: E402
from typing import Any  # noqa: E402

from .errors import ConfigError  # noqa: E402
from .registry import BASELINE  # noqa: E402

#: Names of the package loaded on first use: name -> the module that defines it.
_LAZY = {"Router": "base", "Slot": "base", "block_layout": "base", "default_n_blocks": "base",
         "ROUTERS": "registry", "build_router": "registry", "check_router_options": "registry",
         "paper_baseline": "registry", "register": "registry", "route": "base", "router_class": "registry", "router_options": "registry"}


def __getattr__(name: str) -> Any:
    """PEP 562: load the router modules, then give ``name`` (see the module docstring).

    Raises:
        AttributeError: ``name`` is neither one of the package's names nor a submodule loaded.
    """
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    registry = importlib.import_module(f"{__name__}.registry")
    registry.load_routers()
    value = getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    globals()[name] = value
    return value


__all__ = ["BASELINE", "ConfigError", "ROUTERS", "Router", "Slot", "block_layout", "build_router",
           "check_router_options", "default_n_blocks", "paper_baseline", "register", "route", "router_class", "router_options"]
