"""Fixtures shared by the tests."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import workloads.decoder

#: The full router × impl matrix of the compile tests runs with ``--compile-matrix`` (or
#: RB_COMPILE_MATRIX=1; ``make test-compile``): cold, it takes about 9 minutes on a 2-core CPU.
#: Without it, the cases marked ``compile_matrix`` are skipped and each compile test keeps a
#: representative subset (docs/DEVELOPING.md, "Tests and make targets").
COMPILE_MATRIX_ENV = "RB_COMPILE_MATRIX"


#: A quiet machine's readings, in the formats of /proc/loadavg, /proc/pressure/cpu and /proc/stat.
QUIET_READINGS = {"loadavg": "0.00 0.00 0.00 1/100 1\n",
                  "pressure": "some avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"
                              "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n",
                  "stat": "cpu  100 0 100 10000 0 0 0 0 0 0\n"}


#: Where the real readings are (what ``real_machine`` puts back).
REAL_FILES = {"loadavg": Path("/proc/loadavg"), "pressure": Path("/proc/pressure/cpu"), "stat": Path("/proc/stat")}


@pytest.fixture(scope="session")
def quiet_readings(tmp_path_factory):
    root = tmp_path_factory.mktemp("quiet-machine")
    for name, text in QUIET_READINGS.items():
        (root / name).write_text(text)
    return root


@pytest.fixture(autouse=True)
def planted_quiet_machine(monkeypatch, quiet_readings):
    """Every reading of the machine's load a test makes in-process is a planted quiet one: the
    load average, the CPU pressure (a static total, so a timing's pressure reads 0) and the CPU
    time other work holds (a static /proc/stat). The test suite's own work, and whatever else
    runs on the machine, would otherwise make a command warn of a busy machine, widen its plan,
    flag or re-time its groups. Tests of the busy case plant their own readings."""
    from harness.timing import noise, others
    monkeypatch.setattr(noise, "LOADAVG_FILE", quiet_readings / "loadavg")
    monkeypatch.setattr(noise, "PRESSURE_FILE", quiet_readings / "pressure")
    monkeypatch.setattr(others, "STAT_FILE", quiet_readings / "stat")


@pytest.fixture
def real_machine(monkeypatch):
    """The machine's own load readings, for the tests that load it on purpose and read what it did."""
    from harness.timing import noise, others
    monkeypatch.setattr(noise, "LOADAVG_FILE", REAL_FILES["loadavg"])
    monkeypatch.setattr(noise, "PRESSURE_FILE", REAL_FILES["pressure"])
    monkeypatch.setattr(others, "STAT_FILE", REAL_FILES["stat"])


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
