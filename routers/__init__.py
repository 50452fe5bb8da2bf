"""Residual routers and their registry.

Every module of this package is imported on first import, so a router in a new file registers
itself with ``@register`` and appears in ``routerbench list``, sweeps and the parametrised tests
without other edits.
"""

from __future__ import annotations

#: What this package may import (DESIGN.md, "Layers"; checked by tests/test_layers.py): nothing of
#: the project. ``routers.errors.ConfigError`` is the error every layer above raises.
MAY_IMPORT = ()

import importlib  # noqa: E402
import pkgutil  # noqa: E402

from .base import Router, Slot, block_layout, default_n_blocks  # noqa: E402
from .errors import ConfigError  # noqa: E402
from .registry import (  # noqa: E402
    BASELINE,
    ROUTERS,
    build_router,
    check_router_options,
    register,
    router_class,
    router_options,
)

_INFRA = {"base", "errors", "registry", "mixer", "two_phase", "lean", "impls", "peers"}
for _m in pkgutil.iter_modules(__path__):
    if _m.name not in _INFRA and not _m.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_m.name}")

__all__ = ["BASELINE", "ConfigError", "ROUTERS", "Router", "Slot", "block_layout", "build_router",
           "check_router_options", "default_n_blocks", "register", "router_class", "router_options"]
