"""One validated run spec per long command (``run``, ``train``, ``profile``).

Frozen dataclasses of shared parts (``shape``, ``routers``, ``output``) and command parts
(``sweep``, ``timing``, ``race``, ``training``, ``profile``), declared once (:mod:`.base`): the
command-line options, the ``--config FILE.toml`` keys and every check come from the same
declaration, and each spec's ``resolve()`` checks the whole of it before any model is built. A
resolved spec is written beside the manifest as ``spec.toml``; ``routerbench <command> --config
<that file>`` repeats the run.
"""

#: What this package may import (DESIGN.md, "Layers"; checked by tests/test_layers.py): a spec
#: validates against the registries of every stage it configures.
MAY_IMPORT = ("routers", "workloads", "harness.stats", "harness.rundir", "harness.step", "harness.timing",
              "harness.costs", "harness.sweep", "harness.training")

from .base import Labels, load, to_toml, write_toml
from .profile import ProfileSpec
from .run import RunSpec
from .train import TrainSpec

__all__ = ["Labels", "ProfileSpec", "RunSpec", "TrainSpec", "load", "to_toml", "write_toml"]
