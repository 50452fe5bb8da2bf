"""Training to a target loss (DESIGN.md, "Layers"; MEASUREMENT.md, "Time to target loss"): the
protocol's settings (:mod:`harness.training.config`), one run advanced in turns
(:mod:`harness.training.run`, its rows :mod:`harness.training.rows`, its checkpoints
:mod:`harness.training.checkpoint`), the schedule that drives runs against a run directory
(:mod:`harness.training.schedule`), DDP under ``torchrun`` (:mod:`harness.training.distributed`),
the papers' depth study (:mod:`harness.training.study`) and what a trained router learned
(:mod:`harness.training.diagnose`).
"""

#: What this package may import (DESIGN.md, "Layers"; checked by tests/test_layers.py).
MAY_IMPORT = ("routers", "workloads", "harness.stats", "harness.rundir", "harness.step", "harness.timing",
              "harness.costs")
