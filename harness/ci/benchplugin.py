"""routerbench's pytest-benchmark hooks: a stable ``machine_info`` and the suite's rounds.

pytest-benchmark's ``--benchmark-compare`` warns "Benchmark machine_info is different" whenever
the saved ``machine_info`` differs from the current one in any key. Its own generated info holds
the hostname and py-cpuinfo's current CPU frequency, and routerbench's used to add the command
line and the SM clock, so the warning fired on every comparison and could no longer tell a
change of hardware. Here ``machine_info`` is *generated* (``pytest_benchmark_generate_machine_info``
replaces pytest-benchmark's): only what identifies the hardware and the software stack
(:func:`machine_info`). What changes from run to run (hostname, command line, SM clock, CPU
frequency, the whole :func:`harness.rundir.environment.environment`) goes to each benchmark's
``extra_info`` (:func:`run_info`), where :mod:`reports.benchjson` reads it.

Rounds (:func:`bench_rounds`): the suite times a fixed number of pairs per benchmark
(:data:`harness.ci.suite.ROUNDS`) unless ``--benchmark-min-rounds`` or ``--benchmark-max-time`` is
given on the command line (or in ``PYTEST_ADDOPTS`` / ini ``addopts``); then pytest-benchmark's
own rule sets them: ``max(min_rounds, ceil(max_time / time of one round))``. A
``--benchmark-min-rounds`` below :data:`harness.stats.bootstrap.MIN_PAIRS_FOR_CI` is refused with
one line (:func:`check_options`): a paired interval needs that many pairs.

``tests/benchmarks/conftest.py`` imports these hooks; another pytest session loads them with
``-p harness.ci.benchplugin``.
"""

from __future__ import annotations

import contextlib
import math
import os
import platform
import shlex
import socket
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from harness.rundir.environment import cpu_model, environment
from harness.stats.bootstrap import MIN_PAIRS_FOR_CI
from harness.timing import noise

#: Version of the ``machine_info`` layout (1: routerbench's keys added to pytest-benchmark's own,
#: with the command line, the environment and the SM clock; 2: generated, stable keys only).
MACHINE_INFO_SCHEMA = 2

#: The command-line options that, when given, set the rounds instead of the suite.
ROUND_OPTIONS = ("--benchmark-min-rounds", "--benchmark-max-time")


def cpu_cores() -> int | None:
    """Physical CPU cores (distinct ``physical id``/``core id`` pairs of /proc/cpuinfo), or None
    where that file cannot tell (not Linux)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    cores, phys = set(), "0"
    for line in text.splitlines():
        key, _, val = line.partition(":")
        key = key.strip().lower()
        if key == "physical id":
            phys = val.strip()
        elif key == "core id":
            cores.add((phys, val.strip()))
    return len(cores) or None


def _triton_version() -> str | None:
    try:
        import triton
        return triton.__version__
    except Exception:  # noqa: BLE001 - absent on CPU builds
        return None


def machine_info(device: torch.device | str | None = None) -> dict[str, Any]:
    """The benchmark JSON's ``machine_info``: what identifies the machine and its software.

    Keys: ``routerbench`` (:data:`MACHINE_INFO_SCHEMA`), ``device`` (``cpu``/``cuda``),
    ``device_name`` (GPU name on CUDA, else the CPU model), ``cpu_model``, ``cpu_cores``
    (physical), ``cpu_threads`` (logical), ``gpu_name`` (None on CPU), ``gpu_count``,
    ``driver`` (NVIDIA driver, None on CPU), ``cuda``, ``cudnn``, ``torch``, ``triton``,
    ``python``, ``machine`` (architecture), ``system``. No hostname, no command line and no
    current clock or frequency: those are in :func:`run_info`, so two runs on the same hardware
    and software compare without pytest-benchmark's machine_info warning."""
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    env = environment(device)
    return {
        "routerbench": MACHINE_INFO_SCHEMA, "device": device.type, "device_name": env["device_name"],
        "cpu_model": cpu_model(), "cpu_cores": cpu_cores(), "cpu_threads": os.cpu_count(),
        "gpu_name": env["device_name"] if device.type == "cuda" else None,
        "gpu_count": env["gpu_count"], "driver": env.get("driver"), "cuda": env["cuda"],
        "cudnn": env["cudnn"], "torch": env["torch"], "triton": _triton_version(),
        "python": sys.version.split()[0], "machine": platform.machine(), "system": platform.system(),
    }


def _cpu_mhz() -> float | None:
    """The current frequency of the first CPU in MHz (/proc/cpuinfo), or None."""
    with contextlib.suppress(OSError, ValueError):  # not Linux, or no MHz line: unknown
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("cpu mhz"):
                return float(line.split(":", 1)[1])
    return None


def run_info(device: torch.device | str) -> dict[str, Any]:
    """What a benchmark's ``extra_info`` gets of this run (it differs between runs on one
    machine): ``hostname``, ``argv`` (the command line), ``sm_clock_mhz`` (CUDA, read now; None on
    CPU), ``cpu_mhz`` (now), ``environment`` (:func:`harness.rundir.environment.environment`,
    the device identity :mod:`reports.benchjson` and the gate read) and ``plugins`` (the plugins
    this process loaded, :func:`routers.plugins.records`, which the gate and reports load again)."""
    from routers import plugins
    device = torch.device(device)
    return {"hostname": socket.gethostname(), "argv": list(sys.argv),
            "sm_clock_mhz": noise.sm_clock_mhz(device), "cpu_mhz": _cpu_mhz(),
            "environment": environment(device), "plugins": plugins.records()}


def given(config: pytest.Config, option: str) -> bool:
    """Whether ``option`` (e.g. ``--benchmark-max-time``) was given on the command line, in
    ``PYTEST_ADDOPTS`` or in the ini file's ``addopts``, rather than left at its default."""
    args = list(config.invocation_params.args)
    args += shlex.split(os.environ.get("PYTEST_ADDOPTS", ""))
    with contextlib.suppress(ValueError, KeyError):  # a config without an addopts ini key
        args += list(config.getini("addopts"))
    return any(a == option or a.startswith(option + "=") for a in map(str, args))


def check_options(config: pytest.Config) -> None:
    """Refuse a ``--benchmark-min-rounds`` below the pairs a paired interval needs.

    Raises:
        pytest.UsageError: ``--benchmark-min-rounds`` given and below
            :data:`harness.stats.bootstrap.MIN_PAIRS_FOR_CI` (one line naming the option).
    """
    if given(config, "--benchmark-min-rounds"):
        n = config.getoption("benchmark_min_rounds")
        if n < MIN_PAIRS_FOR_CI:
            raise pytest.UsageError(
                f"--benchmark-min-rounds {n}: a paired ratio's interval needs at least "
                f"{MIN_PAIRS_FOR_CI} pairs; give --benchmark-min-rounds {MIN_PAIRS_FOR_CI} or more")


def bench_rounds(config: pytest.Config, suite_rounds: int, round_s: float) -> int:
    """Timed pairs of one benchmark.

    Args:
        config: the pytest session's config.
        suite_rounds: the suite's own rounds (:data:`harness.ci.suite.ROUNDS`).
        round_s: the time of one round of the pair (both sides), s, from its untimed warm round.

    Returns:
        ``suite_rounds`` unless a round option (:data:`ROUND_OPTIONS`) was given; then
        ``max(min_rounds, ceil(max_time / round_s))`` as pytest-benchmark computes rounds, never
        below :data:`harness.stats.bootstrap.MIN_PAIRS_FOR_CI`.
    """
    if not any(given(config, o) for o in ROUND_OPTIONS):
        return suite_rounds
    min_rounds = max(int(config.getoption("benchmark_min_rounds")), MIN_PAIRS_FOR_CI)
    max_time = float(config.getoption("benchmark_max_time"))
    by_time = math.ceil(max_time / round_s) if round_s > 0 else min_rounds
    return max(min_rounds, by_time)


@pytest.hookimpl(tryfirst=True)
def pytest_benchmark_generate_machine_info(config: pytest.Config) -> dict[str, Any]:
    """pytest-benchmark hook (first result wins, and this one runs first): routerbench's
    :func:`machine_info` replaces pytest-benchmark's generated one."""
    return machine_info()


def pytest_configure(config: pytest.Config) -> None:
    """pytest hook: :func:`check_options` before anything is collected or timed."""
    if config.getoption("benchmark_only", default=False):
        check_options(config)
