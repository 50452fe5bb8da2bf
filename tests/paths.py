"""Paths shared by the tests."""

from __future__ import annotations

import os
from pathlib import Path

#: Real text for the data tests: ``$ROUTERBENCH_SHARED_DATA/tinyshakespeare.txt``, by default
#: ``../shared/data/`` beside the checkout. Tests that need it skip when it is absent.
SHARED_DATA = Path(os.environ.get("ROUTERBENCH_SHARED_DATA",
                                  Path(__file__).resolve().parents[2] / "shared" / "data"))
SHAKESPEARE = SHARED_DATA / "tinyshakespeare.txt"
#: The H200 runs of 2026-12-04 (eager and CUDA-graph timings): ``../shared/gpu-runs/`` beside the
#: checkout. Tests that need it skip when it is absent.
H200_RUNS = SHARED_DATA.parent / "gpu-runs" / "2026-12-04-h200" / "runs.tgz"
