"""How stable a timed group was, and when it counts as noisy (MEASUREMENT.md, "Noise on shared
machines").

Absolute times on a shared machine can be off by 50× while paired ratios hold. Every timed group
therefore records, beside its step times, metric rows that say how undisturbed it ran:

========================  ======  ==============================================================
metric                    unit    meaning
========================  ======  ==============================================================
``cpu_util``              ratio   process CPU time / (wall time × torch threads) over the timing;
                                  well below its quiet value when other work takes the cores
``cpu_pressure``          ratio   share of the wall time in which some runnable task waited for a
                                  CPU (``/proc/pressure/cpu``, "some"; Linux ≥ 4.20 only)
``load_avg``              tasks   the 1-minute load average at the end of the timing
``iqr_rel``               ratio   IQR / median of the case's own step times (CUDA: event times)
``ci_width_rel``          ratio   (hi − lo) / ratio of the case's paired ratio to ``prenorm``
``sm_clock_spread``       ratio   CUDA with ``nvidia-ml-py``: (max − min) / max of the SM clock
                                  sampled over the timing (:class:`harness.timing.gpu.GpuProbe`)
``gpu_temp_max``          C       CUDA with ``nvidia-ml-py``: the highest GPU temperature sampled
``throttle_reasons``      bitmask CUDA with ``nvidia-ml-py``: NVML's clock-event reasons seen
                                  (:data:`harness.timing.gpu.THROTTLE_BITS`; a reading, no threshold)
========================  ======  ==============================================================

(on CUDA the SM clock is also recorded before and after each timing as ``sm_clock_mhz``, read by
:func:`sm_clock_mhz`, with or without ``nvidia-ml-py``; on CUDA the host's readings stay, since
the host bounds an eager step.)

A group is **noisy** when any stated threshold of :data:`THRESHOLDS` is crossed
(:func:`noise_reasons`). The harness re-measures a noisy group while its steps are still held
(an attempt only when it fits in ``--remeasure-s`` seconds of re-measuring; ``--max-attempts``), keeping every attempt (the ``attempt``
column); reports use the last attempt, show the count, and derive the flag again from the rows with
thresholds the ``report`` command line can change (``--noise-thresholds``).
"""

from __future__ import annotations

import math
import os
import resource
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import torch

from . import others

#: Default thresholds of a noisy group: ``*_min`` must be reached, ``*_max`` not exceeded.
#: cpu_util_min: torch's intra-op threads of a small CPU step are not all busy even when quiet,
#: so only a large drop counts; cpu_pressure_max: a fifth of the time with a task waiting for a
#: CPU; iqr_rel_max / ci_width_rel_max: spreads that make a 5 % overhead unreadable.
#: sm_clock_spread_max (CUDA with nvidia-ml-py, :mod:`harness.timing.gpu`): the SM clock moved by
#: more than a tenth over the timing (boost, power or thermal throttling).
THRESHOLDS: dict[str, float] = {"cpu_util_min": 0.35, "cpu_pressure_max": 0.20,
                                "iqr_rel_max": 0.15, "ci_width_rel_max": 0.15,
                                "sm_clock_spread_max": 0.10}
PRESSURE_FILE = Path("/proc/pressure/cpu")
LOADAVG_FILE = Path("/proc/loadavg")
#: The unit column of each noise metric.
UNITS = {"cpu_util": "ratio", "cpu_pressure": "ratio", "load_avg": "tasks", "iqr_rel": "ratio",
         "ci_width_rel": "ratio", "sm_clock_spread": "ratio", "gpu_temp_max": "C",
         "throttle_reasons": "bitmask"}


def check_thresholds(values: Mapping[str, Any] | None, label: str = "--noise-thresholds") -> dict[str, float]:
    """:data:`THRESHOLDS` updated with ``values``.

    Raises:
        ValueError: an unknown key or a value that is not a non-negative number (naming ``label``).
    """
    out = dict(THRESHOLDS)
    for k, v in (values or {}).items():
        if k not in THRESHOLDS:
            raise ValueError(f"{label}: unknown threshold {k!r}; known: {', '.join(THRESHOLDS)}")
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise ValueError(f"{label}: {k} must be a finite number >= 0, got {v!r}")
        out[k] = float(v)
    return out


def _psi_some(text: str | None = None) -> dict[str, float] | None:
    """The fields of ``/proc/pressure/cpu``'s "some" line (``avg10``, ``avg60``, ``avg300`` in
    percent, ``total`` in microseconds), from ``text`` or read from :data:`PRESSURE_FILE`; None
    when the file is absent or unreadable (Linux < 4.20, PSI off)."""
    try:
        text = PRESSURE_FILE.read_text() if text is None else text
        some = next(line for line in text.splitlines() if line.startswith("some"))
        return {k: float(v) for k, v in (f.split("=") for f in some.split()[1:])}
    except (OSError, StopIteration, ValueError):
        return None


def pressure_total_us() -> float | None:
    """Total microseconds some task waited for a CPU since boot (``/proc/pressure/cpu`` "some
    total"), or None without PSI; the difference of two readings over the seconds between them,
    divided by 1e6, is the CPU pressure of that stretch."""
    return (_psi_some() or {}).get("total")


def pressure_avg10(text: str | None = None) -> float | None:
    """The share (a ratio) of the last 10 s in which some runnable task waited for a CPU:
    ``/proc/pressure/cpu``'s "some avg10" (a percentage there) over 100.

    Args:
        text: the contents of ``/proc/pressure/cpu`` (read from :data:`PRESSURE_FILE` when None).

    Returns:
        the ratio, or None when the file is absent or unreadable (Linux < 4.20, PSI off).
    """
    avg10 = (_psi_some(text) or {}).get("avg10")
    return None if avg10 is None else avg10 / 100.0


def load_average() -> float | None:
    """The 1-minute load average (runnable and uninterruptible tasks), from :data:`LOADAVG_FILE`,
    else :func:`os.getloadavg`; None when neither can be read."""
    try:
        return float(LOADAVG_FILE.read_text().split()[0])
    except (OSError, IndexError, ValueError):
        try:
            return os.getloadavg()[0]
        except OSError:
            return None


def cpu_count() -> int:
    """The CPUs this process may run on (its affinity mask where the OS has one)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return max(1, os.cpu_count() or 1)


#: A machine counts as busy before a command starts when other work holds more than this share
#: of its CPUs: a step using every core must then wait for them, even while no task waits yet
#: (two busy loops on two idle cores read a CPU pressure near 0 until the command starts).
LOAD_SHARE_MAX = 0.5


def machine_load(text: str | None = None) -> dict[str, Any]:
    """The machine's load now: ``pressure`` (:func:`pressure_avg10`, None without PSI),
    ``others`` (the CPUs work outside this process tree held since the command started,
    :func:`harness.timing.others.held_by_others`; None without ``/proc/stat``), ``load_avg``
    (:func:`load_average`, kept for the manifest), ``cpus`` (:func:`cpu_count`) and ``busy``, the
    readings past their thresholds in words (``[]`` on a quiet machine): CPU pressure above
    ``cpu_pressure_max``, or other work holding more than :data:`LOAD_SHARE_MAX` of the CPUs.
    Where ``/proc/stat`` cannot be read the load average stands in for ``others`` (it also holds
    the tail of a command that just ended).

    Args:
        text: the contents of ``/proc/pressure/cpu`` (read from :data:`PRESSURE_FILE` when None).
    """
    p, load, cpus, held = pressure_avg10(text), load_average(), cpu_count(), others.held_by_others()
    busy = []
    if p is not None and p > THRESHOLDS["cpu_pressure_max"]:
        busy.append(f"a task waited for a CPU {p * 100:.0f} % of the last 10 s (/proc/pressure/cpu avg10, "
                    f"busy above {THRESHOLDS['cpu_pressure_max'] * 100:.0f} %)")
    if held is not None and held > LOAD_SHARE_MAX * cpus:
        busy.append(f"other work holds {held:.1f} of {cpus} CPUs (/proc/stat since this command started, "
                    f"busy above {LOAD_SHARE_MAX * cpus:g})")
    elif held is None and load is not None and load > LOAD_SHARE_MAX * cpus:
        busy.append(f"the load average is {load:.1f} on {cpus} CPUs (busy above {LOAD_SHARE_MAX * cpus:g})")
    return {"pressure": p, "others": held, "load_avg": load, "cpus": cpus, "busy": busy}


def busy_warning(text: str | None = None) -> str | None:
    """One line to print at the start of a measuring command when the machine is already busy
    (:func:`machine_load`: CPU pressure or load average past its threshold), saying what the run
    will do about it.

    Args:
        text: the contents of ``/proc/pressure/cpu`` (read from :data:`PRESSURE_FILE` when None).

    Returns:
        the warning, or None when the machine is quiet or no reading is available.
    """
    busy = machine_load(text)["busy"]
    if not busy:
        return None
    return (f"warning: this machine is busy before the start: {'; '.join(busy)}; a noisy group is timed "
            "again only once the load has dropped, else it keeps its first timing, flagged noisy; run "
            "again when nothing else runs for numbers you can quote")


@dataclass
class Probe:
    """Machine-level readings over one timed stretch; use as a context manager.

    Attributes (after exit): ``wall_s``, ``cpu_util``, ``cpu_pressure`` (None without PSI),
    ``load_avg``.
    """

    threads: int = 0
    wall_s: float = 0.0
    cpu_util: float | None = None
    cpu_pressure: float | None = None
    load_avg: float | None = None

    def __enter__(self) -> "Probe":
        self.threads = max(1, torch.get_num_threads())
        self._t0 = time.perf_counter()
        ru = resource.getrusage(resource.RUSAGE_SELF)
        self._cpu0 = ru.ru_utime + ru.ru_stime
        self._p0 = pressure_total_us()
        return self

    def __exit__(self, *exc) -> None:
        self.wall_s = time.perf_counter() - self._t0
        ru = resource.getrusage(resource.RUSAGE_SELF)
        cpu = ru.ru_utime + ru.ru_stime - self._cpu0
        if self.wall_s > 0:
            self.cpu_util = cpu / (self.wall_s * self.threads)
            p1 = pressure_total_us()
            if self._p0 is not None and p1 is not None:
                self.cpu_pressure = min(1.0, (p1 - self._p0) / (self.wall_s * 1e6))
        try:
            self.load_avg = os.getloadavg()[0]
        except OSError:
            self.load_avg = None

    def metrics(self, device: torch.device) -> dict[str, float]:
        """The machine-level rows of the stretch (``cpu_util`` only on a CPU device, where the
        process's own CPU time is the work being timed)."""
        out = {"cpu_pressure": self.cpu_pressure, "load_avg": self.load_avg}
        if device.type == "cpu":
            out["cpu_util"] = self.cpu_util
        return {k: v for k, v in out.items() if v is not None}


def iqr_rel(samples: list[float]) -> float:
    """IQR / median of ``samples`` (NaN for fewer than 2 or a zero median)."""
    if len(samples) < 2:
        return float("nan")
    q1, med, q3 = np.percentile(samples, [25, 50, 75])
    return float((q3 - q1) / med) if med > 0 else float("nan")


#: Readings of the spread of the case's own times (the others read the machine).
SPREAD_READINGS = ("iqr_rel", "ci_width_rel")


def noise_reasons(m: Mapping[str, Any], thresholds: Mapping[str, float] = THRESHOLDS,
                  precise: bool = False) -> list[str]:
    """Why a group's readings ``m`` (metric -> value; absent or NaN readings are ignored) count as
    noisy under ``thresholds``; empty when it is not noisy. With ``precise`` (the timing stopped
    because its stopping rule's interval reached the precision target) the spread readings
    (:data:`SPREAD_READINGS`) do not count: the interval already holds that spread; only the
    machine's readings, disturbances the interval does not cover, do."""
    if precise:
        m = {k: v for k, v in m.items() if k not in SPREAD_READINGS}
    out = []

    def val(k):
        v = m.get(k)
        return None if v is None or (isinstance(v, float) and np.isnan(v)) else float(v)

    if (v := val("cpu_util")) is not None and v < thresholds["cpu_util_min"]:
        out.append(f"cpu_util {v:.3f} < {thresholds['cpu_util_min']:g}")
    if (v := val("cpu_pressure")) is not None and v > thresholds["cpu_pressure_max"]:
        out.append(f"cpu_pressure {v:.3f} > {thresholds['cpu_pressure_max']:g}")
    if (v := val("iqr_rel")) is not None and v > thresholds["iqr_rel_max"]:
        out.append(f"iqr_rel {v:.3f} > {thresholds['iqr_rel_max']:g}")
    if (v := val("ci_width_rel")) is not None and v > thresholds["ci_width_rel_max"]:
        out.append(f"ci_width_rel {v:.3f} > {thresholds['ci_width_rel_max']:g}")
    top = thresholds.get("sm_clock_spread_max", THRESHOLDS["sm_clock_spread_max"])
    if (v := val("sm_clock_spread")) is not None and v > top:
        out.append(f"sm_clock_spread {v:.3f} > {top:g}")
    return out


def sm_clock_mhz(device: torch.device) -> float | None:
    """The SM clock of a CUDA ``device`` in MHz (NVML via ``torch.cuda.clock_rate``, else
    ``nvidia-smi`` matched by PCI bus id); ``None`` on CPU or when neither can tell. Read only:
    clocks are never changed."""
    if device.type != "cuda":
        return None
    try:
        return float(torch.cuda.clock_rate(device))
    except Exception:  # pynvml missing or NVML unusable: ask nvidia-smi
        pass
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=pci.bus_id,clocks.sm",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True,
                             timeout=10, check=True).stdout.strip().splitlines()
        props = torch.cuda.get_device_properties(device)
        want = (getattr(props, "pci_domain_id", None), getattr(props, "pci_bus_id", None),
                getattr(props, "pci_device_id", None))
        for line in out:
            bus, mhz = (s.strip() for s in line.split(","))
            dom, b, dev = bus.split(":")[0], bus.split(":")[1], bus.split(":")[2].split(".")[0]
            if (int(dom, 16), int(b, 16), int(dev, 16)) == want or len(out) == 1:
                return float(mhz)
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        pass
    return None
