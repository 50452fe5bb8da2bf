"""Workloads: the decoder with a router slot (:mod:`workloads.decoder`), shape and training
presets (:mod:`workloads.config`), corpora on disk (:mod:`workloads.data`, :mod:`workloads.corpora`,
:mod:`workloads.text8`) and their batches (:mod:`workloads.batches`).

Only the configuration is imported here; ``workloads.decoder`` imports ``routers``.
"""

#: What this package may import (DESIGN.md, "Layers"; checked by tests/test_layers.py).
MAY_IMPORT = ("routers",)

from .config import GRIDS, PRESETS, DecoderConfig, preset  # noqa: E402

__all__ = ["GRIDS", "PRESETS", "DecoderConfig", "preset"]
