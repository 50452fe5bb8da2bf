"""The pytest-benchmark suite (``pytest tests/benchmarks --benchmark-only``, ``make bench``).

It runs only with ``--benchmark-only``; ``--bench-suite cpu|gpu`` picks the suite (default: ``gpu``
when a CUDA device is visible, else ``cpu``; :mod:`harness.ci.pairbench`). The JSON's ``machine_info``
(``--benchmark-json``) is routerbench's, generated: GPU, driver, CUDA, cuDNN, torch, Triton, CPU
model, cores and threads, never the hostname or a clock (:mod:`harness.ci.benchplugin`, whose
hooks this file imports).
"""

import pytest

from harness.ci.benchplugin import pytest_benchmark_generate_machine_info, pytest_configure  # noqa: F401


def pytest_addoption(parser):
    parser.addoption("--bench-suite", default=None, choices=("cpu", "gpu"),
                     help="routerbench benchmark suite: cpu (small shape, eager + two compiled "
                          "routers) or gpu (larger shapes, every backend); default: gpu when CUDA is "
                          "visible, else cpu")


def pytest_collection_modifyitems(config, items):
    if config.getoption("benchmark_only", default=False):
        return
    skip = pytest.mark.skip(reason="benchmark: run `pytest tests/benchmarks --benchmark-only` (make bench)")
    for item in items:
        if "benchmarks" in item.nodeid:
            item.add_marker(skip)
