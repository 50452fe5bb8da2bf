"""Residual routers and their registry.

Every module of this package is imported on first import, so a router in a new file registers
itself with ``@register`` and appears in ``routerbench list``, sweeps and the parametrised tests
without other edits.
"""

from __future__ import annotations

import importlib
import pkgutil

from .base import Router, Slot, block_layout, default_n_blocks
from .registry import ROUTERS, build_router, register, router_class, router_options

_INFRA = {"base", "registry", "mixer", "two_phase"}
for _m in pkgutil.iter_modules(__path__):
    if _m.name not in _INFRA and not _m.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_m.name}")

__all__ = ["ROUTERS", "Router", "Slot", "block_layout", "build_router", "default_n_blocks",
           "register", "router_class", "router_options"]
