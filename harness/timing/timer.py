"""Step timing (MEASUREMENT.md, "Timing").

CUDA work is timed with CUDA events around each step and one synchronize per step read *after*
the step's end event; CPU work with ``time.perf_counter_ns``. Warm-up runs until both a minimum
count and a minimum time have passed (triton ``do_bench`` / optimum-benchmark style); every timed
repeat is kept and returned, so the report gives median and IQR, never a lone mean.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable

import torch

from routers.errors import ConfigError


@dataclass(frozen=True)
class TimingPolicy:
    """How long to warm up and how many repeats to keep.

    Attributes:
        warmup_min_count: at least this many untimed steps.
        warmup_min_s: and at least this many seconds of untimed steps.
        repeats: timed steps kept (each one a ``step_time`` row).
        max_warmup_count: stop warming up after this many steps even if the time is not reached.
    """

    warmup_min_count: int = 3
    warmup_min_s: float = 0.5
    repeats: int = 10
    max_warmup_count: int = 200

    def __post_init__(self) -> None:
        if self.repeats < 1:
            raise ConfigError(f"--repeats must be >= 1, got {self.repeats}")
        if self.warmup_min_count < 0 or self.warmup_min_s < 0:
            raise ConfigError(f"--warmup-s must be >= 0, got {self.warmup_min_s}")


def synchronize(device: torch.device) -> None:
    """Wait for queued work on ``device`` (no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def warm_up(step: Callable[[], object], device: torch.device, policy: TimingPolicy) -> int:
    """Run ``step`` untimed until the policy's count and time minimums are both met.

    Returns:
        the number of warm-up steps run.
    """
    n, start = 0, time.perf_counter()
    while n < policy.max_warmup_count and (
            n < policy.warmup_min_count or time.perf_counter() - start < policy.warmup_min_s):
        step()
        synchronize(device)
        n += 1
    return n


def time_steps(step: Callable[[], object], device: torch.device, repeats: int) -> list[float]:
    """Time ``repeats`` calls of ``step``; returns one duration per call in milliseconds.

    On CUDA each call is bracketed by CUDA events recorded on the current stream; the host waits
    on the end event only after recording it, so no sync happens inside the timed region. On CPU
    ``perf_counter_ns`` brackets the call.
    """
    out: list[float] = []
    if device.type == "cuda":
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            step()
            end.record()
            end.synchronize()
            out.append(start.elapsed_time(end))
    else:
        for _ in range(repeats):
            t0 = time.perf_counter_ns()
            step()
            out.append((time.perf_counter_ns() - t0) / 1e6)
    return out


def median_iqr(samples: list[float]) -> tuple[float, float]:
    """Median and inter-quartile range (q75 − q25, inclusive quantiles) of ``samples``.

    Raises:
        ValueError: empty ``samples``.
    """
    if not samples:
        raise ValueError("no samples")
    if len(samples) == 1:
        return samples[0], 0.0
    q = statistics.quantiles(samples, n=4, method="inclusive")
    return statistics.median(samples), q[2] - q[0]
