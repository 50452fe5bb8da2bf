"""Memory bandwidth of the device, measured in the run: the physical floor of MEASUREMENT.md
("Noise on shared machines").

A router's extra work is memory-bound, so its least possible cost is its extra bytes over the
device's memory bandwidth (:mod:`reports.floor`). The bandwidth is measured here the way a step is
timed (:mod:`harness.timing`: warm-up to a count and a time, CUDA events on CUDA, every repeat
kept): a device-to-device copy ``dst.copy_(src)`` of a buffer well beyond the last-level cache,
which reads ``nbytes`` and writes ``nbytes``. On CUDA the datasheet figure is recorded beside it
(:func:`nominal_bandwidth`). Units: **GB/s = 1e9 bytes/s**, as the datasheets give them.
"""

from __future__ import annotations

import os
import re
from typing import Any

import torch

from harness.rundir.environment import device_name
from harness.rundir.records import units
from harness.timing.timer import TimingPolicy, median_iqr, time_steps, warm_up

__all__ = ["NOMINAL_GBS", "KIND", "METRIC", "NOMINAL_METRIC", "UNIT", "bandwidth_key",
           "default_nbytes", "measure_bandwidth", "nominal_bandwidth", "record_bandwidth"]

KIND = "bandwidth"
METRIC = "mem_bandwidth"
NOMINAL_METRIC = "mem_bandwidth_nominal"
UNIT = "GB/s"
#: Copy buffer per device type: far beyond any last-level cache (H100 50 MB L2, server CPUs
#: ~100-300 MB L3 per socket), so the copy streams from memory.
DEFAULT_NBYTES = {"cpu": 256 * 2**20, "cuda": 2**30}

#: (regex searched case-insensitively in ``torch.cuda.get_device_name``, nominal memory bandwidth
#: in GB/s, source). First match wins, so a specific name precedes a name it contains. Sources: the
#: vendors' datasheets (NVIDIA H100/H200/B200/A100/L4/L40S/A10/T4/V100 datasheets, NVIDIA Ada
#: architecture whitepaper for the RTX 4090, AMD Instinct MI300X datasheet).
NOMINAL_GBS: tuple[tuple[str, float, str], ...] = (
    (r"gb200", 8000.0, "NVIDIA GB200 NVL72 datasheet, per GPU (HBM3e)"),
    (r"b200", 8000.0, "NVIDIA HGX B200 datasheet (HBM3e)"),
    (r"h200", 4800.0, "NVIDIA H200 datasheet, SXM and NVL (HBM3e)"),
    (r"h100.*\bnvl\b", 3900.0, "NVIDIA H100 NVL datasheet (HBM3)"),
    (r"h100.*\bpcie\b", 2000.0, "NVIDIA H100 PCIe datasheet (HBM2e)"),
    (r"h100", 3350.0, "NVIDIA H100 SXM datasheet (e.g. 'NVIDIA H100 80GB HBM3')"),
    (r"a100.*(80\s*gb.*pcie|pcie.*80\s*gb)", 1935.0, "NVIDIA A100 datasheet, 80GB PCIe"),
    (r"a100.*80\s*gb", 2039.0, "NVIDIA A100 datasheet, 80GB SXM"),
    (r"a100", 1555.0, "NVIDIA A100 datasheet, 40GB (SXM and PCIe)"),
    (r"\ba10g?\b", 600.0, "NVIDIA A10 datasheet (AWS gives the A10G the same 600 GB/s)"),
    (r"\bl40s\b", 864.0, "NVIDIA L40S datasheet"),
    (r"\bl4\b", 300.0, "NVIDIA L4 datasheet"),
    (r"rtx 4090", 1008.0, "NVIDIA Ada GPU architecture whitepaper"),
    (r"rtx 3090", 936.0, "NVIDIA GeForce RTX 3090 specifications"),
    (r"\bv100", 900.0, "NVIDIA V100 datasheet (SXM2 and PCIe)"),
    (r"\bt4\b", 320.0, "NVIDIA T4 datasheet"),
    (r"mi300x", 5300.0, "AMD Instinct MI300X datasheet"),
)


def nominal_bandwidth(device_name: str | None) -> float | None:
    """Nominal (datasheet) memory bandwidth of a GPU by name, in GB/s (1e9 bytes/s).

    Args:
        device_name: e.g. ``"NVIDIA H200"`` (``torch.cuda.get_device_name``).

    Returns:
        GB/s, or None for an empty name or a device not in :data:`NOMINAL_GBS` (every CPU).
    """
    for pattern, gbs, _ in NOMINAL_GBS if device_name else ():
        if re.search(pattern, device_name, flags=re.IGNORECASE):
            return gbs
    return None


def _available_bytes(device: torch.device) -> int | None:
    """Free memory of ``device`` in bytes (CUDA: free device memory; CPU: available RAM)."""
    try:
        if device.type == "cuda":
            return int(torch.cuda.mem_get_info(device)[0])
        return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError, RuntimeError):
        return None


def default_nbytes(device: torch.device | str) -> int:
    """Copy buffer size: :data:`DEFAULT_NBYTES` of the device type, cut to a quarter of the free
    memory (two buffers must fit with room to spare) and rounded down to MiB; at least 1 MiB."""
    device = torch.device(device)
    nbytes = DEFAULT_NBYTES.get(device.type, DEFAULT_NBYTES["cpu"])
    free = _available_bytes(device)
    if free is not None:
        nbytes = min(nbytes, free // 4)
    return max(2**20, nbytes // 2**20 * 2**20)


def _time_copy(device: torch.device, n: int, policy: TimingPolicy) -> list[float]:
    """Milliseconds of each timed ``dst.copy_(src)`` of two float32 buffers of ``n`` elements."""
    src = torch.ones(n, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    step = lambda: dst.copy_(src)  # noqa: E731
    warm_up(step, device, policy)
    return time_steps(step, device, policy.repeats)


def measure_bandwidth(device: torch.device | str, nbytes: int | None = None, repeats: int = 10,
                      policy: TimingPolicy | None = None) -> dict[str, Any]:
    """Time ``dst.copy_(src)`` of two ``nbytes`` buffers; each copy moves 2·nbytes (read + write).

    Warm-up and timing are those of a step (:func:`harness.timing.timer.warm_up`,
    :func:`harness.timing.timer.time_steps`). Each repeat gives 2·nbytes / its time; the median and IQR
    are over those rates.

    Args:
        device: where to copy.
        nbytes: bytes of one buffer (``None``: :func:`default_nbytes`; rounded down to whole
            4-byte elements).
        repeats: timed copies (overridden by ``policy.repeats`` when a policy is given).
        policy: warm-up policy (default: at least 3 copies and 0.2 s).

    Returns:
        ``device`` (str), ``device_name``, ``nbytes`` (one buffer), ``bytes_per_copy``
        (2·nbytes), ``repeats``, ``samples_gbs`` (one rate per repeat), ``median_gbs``,
        ``iqr_gbs`` (GB/s = 1e9 bytes/s) and ``nominal_gbs`` (:func:`nominal_bandwidth` on CUDA,
        else None).

    Raises:
        ValueError: ``nbytes`` below 4 or ``repeats`` below 1.
        torch.OutOfMemoryError / RuntimeError: the buffers do not fit.
    """
    device = torch.device(device)
    nbytes = default_nbytes(device) if nbytes is None else int(nbytes)
    if nbytes < 4 or (policy.repeats if policy else repeats) < 1:
        raise ValueError(f"nbytes must be >= 4 and repeats >= 1, got {nbytes} and "
                         f"{policy.repeats if policy else repeats}")
    policy = policy or TimingPolicy(warmup_min_count=3, warmup_min_s=0.2, repeats=repeats)
    n = nbytes // 4
    try:
        times_ms = _time_copy(device, n, policy)
    finally:
        if device.type == "cuda":
            torch.cuda.empty_cache()  # give the buffers back before the sweep
    moved = 2 * 4 * n
    samples = [moved / (ms / 1e3) / 1e9 for ms in times_ms if ms > 0]
    med, iqr = median_iqr(samples) if samples else (float("nan"), float("nan"))
    name = device_name(device)
    return {"device": str(device), "device_name": name, "nbytes": 4 * n, "bytes_per_copy": moved,
            "repeats": len(times_ms), "samples_gbs": samples, "median_gbs": med, "iqr_gbs": iqr,
            "nominal_gbs": nominal_bandwidth(name) if device.type == "cuda" else None}


def bandwidth_key(device: torch.device | str) -> str:
    """Case key of a run's bandwidth unit: ``bandwidth|<device>`` (e.g. ``bandwidth|cuda``)."""
    return f"{KIND}|{torch.device(device)}"


def record_bandwidth(writer: Any, device: torch.device | str,
                     policy: TimingPolicy | None = None) -> dict[str, Any] | None:
    """Measure the bandwidth once per run and record it as its own unit of resume.

    The unit has kind ``bandwidth`` and covers no case (its marker's ``cases`` is empty, as a
    training segment's), so case counts, ``routerbench status`` and "N of M done" are unchanged;
    a run directory holding a complete ``bandwidth`` unit is not measured again (a resume). Rows
    (``case_key`` :func:`bandwidth_key`, no router or shape): one ``mem_bandwidth`` row per repeat
    (``repeat`` 0.., unit ``GB/s``, status ``ok``), plus one ``mem_bandwidth_nominal`` row on CUDA
    when :func:`nominal_bandwidth` knows the device. A failure (out of memory) is one
    ``mem_bandwidth`` row with status ``oom`` or ``error``, and the run goes on.

    Args:
        writer: the run's :class:`harness.rundir.writer.RunWriter` (a ``NullRunWriter``, a torchrun rank
            that does not write, measures nothing).
        device: the run's device.
        policy: warm-up and repeats (the sweep's, so the copy is timed like a step).

    Returns:
        the result of :func:`measure_bandwidth`, ``{"error": …}`` on failure, or None when nothing
        was measured (a resume, or a writer that does not write).
    """
    if writer.records is None or any(m.get("kind") == KIND for m in units(writer.run_dir)):
        return None
    key = bandwidth_key(device)
    with writer.unit([], kind=KIND) as u:
        cols = {"case_key": key, "metric": METRIC, "unit": UNIT}
        try:
            res = measure_bandwidth(device, policy=policy)
        except (torch.OutOfMemoryError, RuntimeError, MemoryError) as exc:
            status = "oom" if isinstance(exc, (torch.OutOfMemoryError, MemoryError)) else "error"
            u.write(**cols, status=status, error=f"{type(exc).__name__}: {exc}"[:500])
            u.commit(extra={"status": status})
            return {"error": str(exc)}
        for i, gbs in enumerate(res["samples_gbs"]):
            u.write(**cols, value=gbs, repeat=i)
        if res["nominal_gbs"] is not None:
            u.write(**{**cols, "metric": NOMINAL_METRIC}, value=res["nominal_gbs"])
        u.commit(extra={"status": "ok"})
    return res
