"""Residual routers and their registry.

Every module of this package is imported on first import, so a router in a new file registers
itself with ``@register`` and appears in ``routerbench list``, sweeps and the parametrised tests
without other edits.
"""

from __future__ import annotations

import importlib
import pkgutil

from .base import Router, Slot, block_layout, default_n_blocks
from .errors import ConfigError
from .registry import (ROUTERS, build_router, check_router_options, register, router_class,
                       router_options)

_INFRA = {"base", "errors", "registry", "mixer", "two_phase", "impls", "peers"}
for _m in pkgutil.iter_modules(__path__):
    if _m.name not in _INFRA and not _m.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_m.name}")

__all__ = ["ConfigError", "ROUTERS", "Router", "Slot", "block_layout", "build_router",
           "check_router_options", "default_n_blocks", "register", "router_class", "router_options"]
