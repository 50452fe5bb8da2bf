"""The runner, one subpackage per stage (DESIGN.md, "Layout", "Layers"). Each stage imports only
the stages below it, as its ``__init__``'s ``MAY_IMPORT`` declares (tests/test_layers.py checks
every import edge):

====================  =======================================================================
``harness.stats``     statistics of paired ratios and tests (pure numpy/scipy)
``harness.rundir``    the run directory: records, the writer and its lock, the manifest and
                      environment, the fault hook
``harness.step``      how a step runs: backends, the CUDA-graph backend, the modes' steps
``harness.timing``    how a step is timed: the timer, paired rounds, noise readings
``harness.costs``     what a step costs, counted: FLOPs, peak FLOP/s and MFU, memory, traffic,
                      bandwidth, memory estimates
``harness.sweep``     the cost sweep: cases, groups, the one prepare and timing path, parity,
                      ``--isolate``, profiling
``harness.training``  training to a target loss: runs, checkpoints, schedule, DDP, the depth
                      study, diagnose
``harness.spec``      the run spec of each command (options, TOML, validation)
``reports``           (a top-level package) tables, figures and the report, from the records
``harness.ci``        the pytest-benchmark suite, benchmark JSON, the gate (reads ``reports``)
``harness.cli``       the ``routerbench`` command, one thin module per command
====================  =======================================================================
"""

#: What this package may import: nothing of its own (every module lives in a stage's subpackage).
MAY_IMPORT = ()
