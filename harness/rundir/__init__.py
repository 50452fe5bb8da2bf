"""The run directory (DESIGN.md, "Results", "Layers"): the records' format and reader
(:mod:`harness.rundir.records`), the one writer with its lock, units of resume and ``aborted/``
(:mod:`harness.rundir.writer`), the manifest and the environment it records
(:mod:`harness.rundir.environment`), the plugins a run recorded, loaded again by its readers
(:mod:`harness.rundir.plugins`), what a run is doing now (``progress.json``,
:mod:`harness.rundir.progress`), and the one test hook for faults a CPU cannot produce
(:mod:`harness.rundir.faults`). It knows rows and units, not what they measure.
"""

#: What this package may import (DESIGN.md, "Layers"; checked by tests/test_layers.py).
MAY_IMPORT = ("routers",)
