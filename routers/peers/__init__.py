"""Adapters of peer kernels (one module each, defining ``IMPL``: :class:`routers.impls.Impl`).

Each imports its package lazily, inside ``IMPL.probe`` and its ``mix`` / ``phases``, so a missing or
broken package makes only that implementation unavailable (``routerbench list`` says why).
"""

#: What this package may import (DESIGN.md, "Layers"; checked by tests/test_layers.py).
MAY_IMPORT = ("routers",)
