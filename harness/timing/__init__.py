"""How a step is timed (DESIGN.md, "Layers"; MEASUREMENT.md, "Timing", "Noise on shared
machines"): the timer of one step and its warm-up (:mod:`harness.timing.timer`), interleaved
paired rounds (:mod:`harness.timing.paired`), and the readings that say how undisturbed a timing
ran (:mod:`harness.timing.noise`). It knows steps as zero-argument callables, not cases or rows:
which cases are timed together, and the rows they write, are the sweep's.
"""

#: What this package may import (DESIGN.md, "Layers"; checked by tests/test_layers.py).
MAY_IMPORT = ("routers",)
