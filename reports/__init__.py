"""Results -> pandas tables, seaborn figures and the per-GPU report (DESIGN.md, "Results").

``build_report(run_dirs, out_dir)`` (:mod:`reports.report`) is the entry point of ``routerbench
report``. Results are read with ``load(RESULTS…)`` (:mod:`reports.loading`: the tidy case frame, with
``run_rows``, ``damaged`` and ``export_frame`` beside it). What the report is made of is importable
on its own: the long frame (:mod:`reports.frame`),
tables (:mod:`reports.tables`, :mod:`reports.paired`, :mod:`reports.paper_baseline`, :mod:`reports.floor`,
:mod:`reports.impls`; what a router's cost models leave "not declared": :mod:`reports.declared`),
the training race (:mod:`reports.training`, :mod:`reports.race`), figures
(:mod:`reports.time_figures`, :mod:`reports.count_figures`, :mod:`reports.training_figures`, on
:mod:`reports.plotting`), sentences (:mod:`reports.sentences`, :mod:`reports.summary`), and the
documents (:mod:`reports.sections`, :mod:`reports.render`).
"""

from __future__ import annotations

#: What this package may import (DESIGN.md, "Layers"; checked by tests/test_layers.py): the
#: records and what counts and trains, never how a sweep runs.
MAY_IMPORT = ("routers", "workloads", "harness.stats", "harness.rundir", "harness.step", "harness.timing",
              "harness.costs", "harness.training")

from .count_figures import flops_vs_depth  # noqa: E402
from .environment import environment_table  # noqa: E402
from .frame import load_frame  # noqa: E402
from .loading import damaged, export_frame, load, run_rows  # noqa: E402
from .paired import paired_ratio_figure, paired_ratio_table  # noqa: E402
from .paper_baseline import paired_vs_paper_table  # noqa: E402
from .report import build_report  # noqa: E402
from .tables import failures, overhead_table, step_time_summary, training_by_router, training_summary  # noqa: E402
from .time_figures import compile_vs_eager, step_time_overhead_vs_width  # noqa: E402
from .training_figures import loss_curves  # noqa: E402

__all__ = [
    "load", "run_rows", "damaged", "export_frame", "build_report", "load_frame", "step_time_summary", "overhead_table", "training_summary",
    "training_by_router", "failures", "environment_table", "step_time_overhead_vs_width",
    "flops_vs_depth", "loss_curves", "compile_vs_eager", "paired_ratio_table", "paired_ratio_figure",
    "paired_vs_paper_table",
]
