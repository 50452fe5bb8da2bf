"""The pytest-benchmark suite runs only with ``pytest --benchmark-only`` (``make bench``)."""

import pytest


def pytest_collection_modifyitems(config, items):
    if config.getoption("benchmark_only", default=False):
        return
    skip = pytest.mark.skip(reason="benchmark: run `pytest tests/benchmarks --benchmark-only` (make bench)")
    for item in items:
        if "benchmarks" in item.nodeid:
            item.add_marker(skip)
