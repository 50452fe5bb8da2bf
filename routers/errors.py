"""The error every layer raises for a bad option (the bottom of the dependency graph).

``routers`` imports nothing else of this project, ``workloads`` imports ``routers``, ``harness``
both and ``reports`` all three, so the one error type they share lives here.
"""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration value is invalid.

    The message is one line that names the option (``--widths``) or the TOML key
    (``shape.widths``) to change and the values it allows; the CLI prints it as
    ``routerbench: error: <message>`` and exits with status 2.
    """
