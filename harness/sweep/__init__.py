"""The cost sweep (DESIGN.md, "Layers"): cases (:mod:`harness.sweep.cases`), planning them into
units of resume and paired groups (:mod:`harness.sweep.plan`), preparing a group
(:mod:`harness.sweep.prepare`, with parity before timing, :mod:`harness.sweep.parity`, and the
router's counts, :mod:`harness.sweep.counts`), timing it and writing its rows
(:mod:`harness.sweep.timed`), one unit (:mod:`harness.sweep.unit`), the whole sweep
(:mod:`harness.sweep.run`, :mod:`harness.sweep.isolate`), and profiling one case
(:mod:`harness.sweep.profile`, :mod:`harness.sweep.trace`). ``prepare_group`` and
``time_paired`` are the one prepare and the one timing path of ``run``, the benchmark suite and
``profile``.
"""

#: What this package may import (DESIGN.md, "Layers"; checked by tests/test_layers.py).
MAY_IMPORT = ("routers", "workloads", "harness.stats", "harness.rundir", "harness.step", "harness.timing",
              "harness.costs")
