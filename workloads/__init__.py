"""Workloads: the decoder with a router slot (``workloads.decoder``), shape presets
(``workloads.config``) and data (``workloads.data``).

Only the configuration is imported here: ``routers`` imports ``workloads.config`` for its
errors, and ``workloads.decoder`` imports ``routers``.
"""

from .config import GRIDS, PRESETS, ConfigError, DecoderConfig, preset

__all__ = ["GRIDS", "PRESETS", "ConfigError", "DecoderConfig", "preset"]
