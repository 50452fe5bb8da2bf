"""Conformance checks of a router or impl (``routerbench check NAME``; docs/PLUGINS.md,
"routerbench check"): the functions the project's tests and the command both run.

- :mod:`.findings`: :class:`~harness.conformance.findings.Finding`, what every check returns;
- :mod:`.equality`: float64 equality (reads, h_out and every gradient) with the router's own
  ``reference(embedding, updates)``, or, for an impl, with its family's reference impl;
- :mod:`.capture`: no host synchronisation (the capture guard, :mod:`harness.step.guard`);
- :mod:`.graphs`: graph breaks (Dynamo's eager backend), recompiles across depths under the layer
  scope, and with ``inductor`` the compiled step against eager;
- :mod:`.budget`: ops per step and saved activations against prenorm, and the declared cost models;
- :mod:`.run`: every check of one name, in order (:func:`harness.conformance.run.run_checks`).
"""

from __future__ import annotations

#: What this package may import (DESIGN.md, "Layers"; checked by tests/test_layers.py): the
#: routers, the decoder, how a step runs (the guard, the compile scopes), what it costs and the
#: sweep's parity check of an impl.
MAY_IMPORT = ("routers", "workloads", "harness.step", "harness.costs", "harness.sweep")
