"""The pytest-benchmark suite (``pytest tests/benchmarks --benchmark-only``, ``make bench``).

It runs only with ``--benchmark-only``; ``--bench-suite cpu|gpu`` picks the suite (default: ``gpu``
when a CUDA device is visible, else ``cpu``; :mod:`harness.ci.pairbench`). The machine info of the JSON
(``--benchmark-json``) gets the GPU, driver, CUDA, cuDNN, torch, Triton, CPU and SM clock.
"""

import pytest


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


def pytest_benchmark_update_machine_info(config, machine_info):
    from harness.ci.pairbench import machine_info as routerbench_info
    machine_info.update(routerbench_info())
