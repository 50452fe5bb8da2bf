"""What a step costs, counted (DESIGN.md, "Layers"; MEASUREMENT.md; docs/FLOPS.md): FLOPs by
fvcore (:mod:`harness.costs.flops`) and at dispatch (:mod:`harness.costs.flop_counter`), peak
FLOP/s and MFU (:mod:`harness.costs.peak`), saved activations and CUDA memory
(:mod:`harness.costs.memory`), measured traffic (:mod:`harness.costs.traffic`; a Triton kernel's
loads and stores under the interpreter, :mod:`harness.costs.kernel_io`), ops and kernel
launches per eager step (:mod:`harness.costs.ops`), what one step of ``route()`` dispatches and
moves by the byte rule, counted on the meta device (:mod:`harness.costs.step_costs`), each
``fused`` kernel alone, timed on CUDA or counted under the interpreter
(:mod:`harness.costs.kernel_times`), the device's
memory bandwidth (:mod:`harness.costs.bandwidth`) and memory estimates made before a model is built
(:mod:`harness.costs.estimate`). Each takes a model, a step or a shape; none knows a case.
"""

#: What this package may import (DESIGN.md, "Layers"; checked by tests/test_layers.py). The
#: bandwidth is timed as a step is (harness.timing) and recorded as its own unit (harness.rundir);
#: ops are counted on the step the sweep runs (harness.step: its loss and ``fwd_bwd`` step).
MAY_IMPORT = ("routers", "workloads", "harness.rundir", "harness.step", "harness.timing")
