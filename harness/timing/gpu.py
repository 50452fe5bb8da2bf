"""What the GPU did while a step was timed: how busy it was, and its clocks, temperature and
throttling (MEASUREMENT.md, "Noise on shared machines", "Host-bound eager steps").

Two readings that a CPU's noise readings (:mod:`harness.timing.noise`) cannot give on CUDA:

- **Device-busy share of an eager step** (:func:`device_busy_share`): the union of the device's
  kernel and copy intervals over the span of a few back-to-back steps, from a
  ``torch.profiler`` trace (CUPTI). An eager step launches one kernel per op from Python; when the
  host is slower than the device, the device idles between launches and the eager step time is the
  host's. A share well below 1 says the eager step time, and its ratio to prenorm, measures Python
  and dispatch, not the router's device cost (graph replay and compile measure that). CUPTI's
  tracing slows the host a little, so the share is a lower bound of the untraced one.
- **NVML readings over a timing** (:class:`GpuProbe`, needs ``nvidia-ml-py``, imported as
  ``pynvml``): the SM clock sampled every :data:`SAMPLE_S` seconds on a host thread (NVML reads the
  driver, never the CUDA stream: no sync with the step), its relative spread
  ``(max − min) / max`` (``sm_clock_spread``), the highest temperature (``gpu_temp_max``, °C) and
  the clock-event (throttle) reasons seen (``throttle_reasons``, NVML's bitmask OR-ed over the
  samples; :data:`THROTTLE_BITS` names them). Without ``pynvml`` nothing of this is read; the
  timing keeps the SM clock before and after (:func:`harness.timing.noise.sm_clock_mhz`) and the
  report says which readings the run had.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Iterable

import torch

#: Seconds between two NVML samples of a timing.
SAMPLE_S = 0.02
#: NVML's clock-event (throttle) reason bits (``nvmlClocksEventReason*``).
THROTTLE_BITS = {0x1: "gpu idle", 0x2: "applications clocks setting", 0x4: "software power cap",
                 0x8: "hardware slowdown", 0x10: "sync boost", 0x20: "software thermal slowdown",
                 0x40: "hardware thermal slowdown", 0x80: "hardware power brake",
                 0x100: "display clock setting"}


def throttle_text(mask: int) -> str:
    """NVML's throttle bitmask as words, e.g. ``0x44`` -> ``software power cap, hardware thermal
    slowdown``; ``none`` for 0; unknown bits as hex."""
    mask = int(mask)
    words = [w for bit, w in THROTTLE_BITS.items() if mask & bit]
    rest = mask & ~sum(THROTTLE_BITS)
    return ", ".join(words + ([hex(rest)] if rest else [])) or "none"


def busy_union_share(intervals: Iterable[tuple[float, float]]) -> float | None:
    """The share of the span from the first start to the last end covered by at least one
    interval (overlapping kernels on several streams count once).

    Args:
        intervals: (start, end) pairs in one clock (µs in a profiler trace); pairs with
            ``end <= start`` are ignored.

    Returns:
        a fraction in (0, 1]; None without a positive-length interval.
    """
    iv = sorted((float(s), float(e)) for s, e in intervals if e > s)
    if not iv:
        return None
    busy, cur_s, cur_e = 0.0, iv[0][0], iv[0][1]
    for s, e in iv[1:]:
        if s > cur_e:
            busy += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    busy += cur_e - cur_s
    span = max(e for _, e in iv) - iv[0][0]
    return min(1.0, busy / span) if span > 0 else None


def device_intervals(events: Iterable[Any]) -> list[tuple[float, float]]:
    """(start, end) in µs of every device-side event of a ``torch.profiler`` trace
    (``prof.events()``: kernels, copies and sets, ``device_type`` CUDA)."""
    cuda = torch.autograd.DeviceType.CUDA
    out = []
    for e in events:
        if getattr(e, "device_type", None) == cuda:
            tr = e.time_range
            out.append((tr.start, tr.end))
    return out


def device_busy_share(step: Callable[[], Any], device: torch.device, steps: int = 5) -> float | None:
    """The device-busy share of ``steps`` back-to-back calls of a warm ``step`` on a CUDA
    ``device``: :func:`busy_union_share` of the trace's device intervals (see the module doc).

    Args:
        step: a warm step (its first call's lazy work already done).
        device: where it runs; on anything but CUDA nothing is traced.
        steps: calls traced (≥ 2: the gaps between steps are part of the eager cost).

    Returns:
        a fraction in (0, 1] (1 = the device never idled between the first kernel and the last);
        None on a CPU or when the trace holds no device event (CUPTI unavailable).

    Raises:
        ValueError: ``steps`` < 2.
    """
    if steps < 2:
        raise ValueError(f"device_busy_share: steps must be >= 2, got {steps}")
    if device.type != "cuda":
        return None
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize(device)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize(device)
    return busy_union_share(device_intervals(prof.events()))


def _nvml() -> Any | None:
    """The ``pynvml`` module (``nvidia-ml-py``), initialised; None when absent or unusable."""
    try:
        import pynvml
        pynvml.nvmlInit()
        return pynvml
    except Exception:  # noqa: BLE001 - not installed, no driver, no permission: no NVML readings
        return None


def nvml_handle(nvml: Any, device: torch.device) -> Any:
    """NVML's handle of the CUDA ``device``, found by PCI bus id (CUDA and NVML number devices
    differently under ``CUDA_VISIBLE_DEVICES``)."""
    p = torch.cuda.get_device_properties(device)
    bus = f"{p.pci_domain_id:08x}:{p.pci_bus_id:02x}:{p.pci_device_id:02x}.0"
    return nvml.nvmlDeviceGetHandleByPciBusId(bus)


class GpuProbe:
    """NVML readings of one timed stretch on a CUDA device; use as a context manager.

    A host thread samples the SM clock (MHz), the temperature (°C) and the throttle reasons every
    :data:`SAMPLE_S` seconds while the body runs. :meth:`metrics` gives ``sm_clock_spread``
    (ratio), ``gpu_temp_max`` (°C) and ``throttle_reasons`` (bitmask), or nothing on a CPU or
    without ``pynvml``.

    Args:
        device: the timed device.
        nvml: an initialised ``pynvml``-like module (default: :func:`_nvml`); ``handle`` its device
            handle (default: :func:`nvml_handle`).
    """

    def __init__(self, device: torch.device, nvml: Any | None = None, handle: Any | None = None,
                 sample_s: float = SAMPLE_S) -> None:
        self.nvml = nvml if nvml is not None else (_nvml() if device.type == "cuda" else None)
        self.handle = handle
        if self.nvml is not None and self.handle is None:
            try:
                self.handle = nvml_handle(self.nvml, device)
            except Exception:  # noqa: BLE001 - an unknown bus id: no readings
                self.nvml = None
        self.sample_s = sample_s
        self.clocks: list[float] = []
        self.temps: list[float] = []
        self.reasons = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def available(self) -> bool:
        """Whether NVML is read (``pynvml`` present and the device found)."""
        return self.nvml is not None

    def sample(self) -> None:
        """Read the clock, temperature and throttle reasons once (errors skip that reading)."""
        n, h = self.nvml, self.handle
        try:
            self.clocks.append(float(n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM)))
        except Exception:  # noqa: BLE001
            pass
        try:
            self.temps.append(float(n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU)))
        except Exception:  # noqa: BLE001
            pass
        get = (getattr(n, "nvmlDeviceGetCurrentClocksEventReasons", None)
               or getattr(n, "nvmlDeviceGetCurrentClocksThrottleReasons", None))
        try:
            self.reasons |= int(get(h)) if get is not None else 0
        except Exception:  # noqa: BLE001
            pass

    def _run(self) -> None:
        while not self._stop.wait(self.sample_s):
            self.sample()

    def __enter__(self) -> "GpuProbe":
        if self.available:
            self.sample()
            self._thread = threading.Thread(target=self._run, name="routerbench-nvml", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self.sample()

    def metrics(self) -> dict[str, float]:
        """``sm_clock_spread`` ((max − min) / max of the sampled SM clocks), ``gpu_temp_max`` and
        ``throttle_reasons``; empty without NVML readings."""
        if not self.available:
            return {}
        out: dict[str, float] = {"throttle_reasons": float(self.reasons)}
        if self.clocks and max(self.clocks) > 0:
            out["sm_clock_spread"] = (max(self.clocks) - min(self.clocks)) / max(self.clocks)
        if self.temps:
            out["gpu_temp_max"] = max(self.temps)
        return out


__all__ = ["GpuProbe", "SAMPLE_S", "THROTTLE_BITS", "busy_union_share", "device_busy_share",
           "device_intervals", "nvml_handle", "throttle_text"]
