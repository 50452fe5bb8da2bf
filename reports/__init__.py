"""Results -> pandas tables, seaborn figures and the per-GPU report (DESIGN.md, "Results").

``build_report(run_dirs, out_dir)`` is the entry point of ``routerbench report``; the tables and
figures it is made of are importable on their own from :mod:`reports.tables` and
:mod:`reports.figures`.
"""

from __future__ import annotations

from .figures import compile_vs_eager, flops_vs_depth, loss_curves, step_time_overhead_vs_width
from .paired import paired_ratio_figure, paired_ratio_table
from .render import build_report, environment_table
from .tables import (failures, load_frame, overhead_table, step_time_summary,
                     training_by_router, training_summary)

__all__ = [
    "build_report", "load_frame", "step_time_summary", "overhead_table", "training_summary",
    "training_by_router", "failures", "environment_table", "step_time_overhead_vs_width",
    "flops_vs_depth", "loss_curves", "compile_vs_eager", "paired_ratio_table", "paired_ratio_figure",
]
