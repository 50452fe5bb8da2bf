"""Statistics of paired comparisons, shared by the reports and the CI gate so both read the same
numbers (DESIGN.md, "Layers"): comparisons paired by seed (:mod:`harness.stats.seeds`), the
bootstrap of paired timing ratios (:mod:`harness.stats.bootstrap`), crossings of a target loss
(:mod:`harness.stats.curves`). Pure numpy/scipy: it imports nothing of the project.
"""

#: What this package may import (DESIGN.md, "Layers"; checked by tests/test_layers.py).
MAY_IMPORT = ()
