"""Fixtures shared by the tests."""

from __future__ import annotations

import os

import pytest

import workloads.decoder

#: The full router × impl matrix of the compile tests runs with ``--compile-matrix`` (or
#: RB_COMPILE_MATRIX=1; ``make test-compile``): cold, it takes about 9 minutes on a 2-core CPU.
#: Without it, the cases marked ``compile_matrix`` are skipped and each compile test keeps a
#: representative subset (README, "Tests").
COMPILE_MATRIX_ENV = "RB_COMPILE_MATRIX"


@pytest.fixture(scope="session")
def quiet_loadavg(tmp_path_factory):
    path = tmp_path_factory.mktemp("loadavg") / "loadavg"
    path.write_text("0.00 0.00 0.00 1/100 1\n")
    return path


@pytest.fixture(autouse=True)
def planted_quiet_load_average(monkeypatch, quiet_loadavg):
    """The load average every test reads in-process is a planted quiet one (a file in
    ``/proc/loadavg``'s format): the test suite's own work keeps the real one near the CPU count,
    which would make each command warn of a busy machine and widen its plan. Tests of the busy
    case plant their own reading; CPU pressure stays the machine's (tests that depend on it plant
    it too)."""
    from harness.timing import noise
    monkeypatch.setattr(noise, "LOADAVG_FILE", quiet_loadavg)


@pytest.fixture
def no_models(monkeypatch):
    """Fail loudly if anything builds a decoder (errors must come first)."""
    def forbidden(*a, **k):
        raise AssertionError("a model was built before the bad option was reported")
    monkeypatch.setattr(workloads.decoder.Decoder, "__init__", forbidden)


def pytest_addoption(parser):
    parser.addoption("--update-golden", action="store_true", default=False,
                     help="rewrite tests/golden/behaviour.json from this tree (make golden)")
    parser.addoption("--compile-matrix", action="store_true", default=False,
                     help="also run the cases marked compile_matrix: every router x impl under "
                          "torch.compile (make test-compile)")


def pytest_collection_modifyitems(config, items):
    if config.getoption("--compile-matrix") or os.environ.get(COMPILE_MATRIX_ENV) == "1":
        return
    skip = pytest.mark.skip(reason="the full compile matrix: run it with --compile-matrix (make test-compile)")
    for item in items:
        if "compile_matrix" in item.keywords:
            item.add_marker(skip)
