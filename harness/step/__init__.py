"""How a step runs (DESIGN.md, "Backends and modes", "Layers"): the backends (eager, torch.compile,
CUDA-graph replay; :mod:`harness.step.backends`), the captured CUDA-graph step
(:mod:`harness.step.cudagraph`), the capture-safety guard that finds on any device what would break
a capture (:mod:`harness.step.guard`) and the step functions of each mode (:mod:`harness.step.modes`).
A step is a zero-argument callable over a built model and a batch; building the model for a case
is the sweep's (:mod:`harness.sweep.prepare`).
"""

#: What this package may import (DESIGN.md, "Layers"; checked by tests/test_layers.py).
MAY_IMPORT = ("routers", "workloads")
