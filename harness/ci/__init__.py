"""Continuous integration (DESIGN.md, "Layers", "Commands"): the pytest-benchmark suite's table
(:mod:`harness.ci.suite`) and one benchmark measured on ``run``'s path (:mod:`harness.ci.pairbench`),
a benchmark JSON read as a run directory (:mod:`reports.benchjson`), and the gate on paired
ratios (:mod:`harness.ci.rules`, :mod:`harness.ci.gate`). The gate reads the report's tables, so
this package sits above ``reports``.
"""

#: What this package may import (DESIGN.md, "Layers"; checked by tests/test_layers.py).
MAY_IMPORT = ("routers", "workloads", "harness.stats", "harness.rundir", "harness.step", "harness.timing",
              "harness.costs", "harness.sweep", "harness.training", "harness.spec", "reports")
