"""The block routers' one form (Attention Residuals, arXiv:2603.15031; WAV v1 / HAARES,
arXiv:2606.06564), its files in the order a read goes through them:

- ``router.py``: :class:`~routers.block.router.BlockRouter`, the construction and the contract
  (``routers/attnres.py`` and ``routers/multires.py`` state each router's sources and options);
- ``plan.py``: the static plan made at construction, and each slot's role;
- ``state.py``: the state of each schedule, the running sums a write adds to, the layer scope's pads;
- ``naive.py`` and ``two_phase.py``: the two schedules' read, write and readout;
- ``phases.py`` and ``lean.py``: the two-phase math in plain autograd, and as custom autograd
  Functions with a memory-lean backward (a peer's kernels plug in here, ``routers/impls.py``);
- ``fused.py``, ``fused_launch.py``, ``fused_kernels.py`` (phase 1) and ``fused_kernels_merge.py``
  (phase 2, the RMS matching): the same math in Triton kernels, as ``torch.library`` custom ops (the
  ``fused`` impl); ``fused_bytes.py``: each kernel's byte model, and a stand-in that records
  launches instead of running them; ``fused_interp.py``: the kernels under Triton's interpreter;
- ``costs.py``: the cost models (analytic FLOPs, live state, ideal I/O).
"""

#: What this package may import (DESIGN.md, "Layers"; checked by tests/test_layers.py): the
#: contract, the depth mixer, the errors and the impls of its parent.
MAY_IMPORT = ("routers",)
