"""How busy the GPU was during an eager step: measured by the sweep, or inferred from the same
run's graph replay.

Since the sweep records ``device_busy`` for every eager case on CUDA
(:func:`harness.timing.gpu.device_busy_share`: kernel time in a ``torch.profiler`` trace over its
span), :func:`recorded_busy` reads that first. Runs without those rows (recorded before the metric
existed) fall back on the inference below.

On a GPU an eager step launches one kernel per op from Python; when the host is slower than the
device, the device idles between launches and the step time is the host's, not the device's. A
CUDA graph replays the same kernels without the host, so prenorm's replayed step is (about) its
device time, and

    busy share = prenorm's replayed median step (ms) / prenorm's eager median step (ms)

at the same run, device, mode and shape is the fraction of the eager step during which the GPU
worked (e.g. 4.95 ms / 13.6 ms = 36 % on an H200). Below :data:`HOST_BOUND` the eager ratios of
that mode and shape measure Python and dispatch overhead; graph replay and compile measure the
device's cost. No graph rows, no share: nothing is guessed.
"""

from __future__ import annotations

import math

import pandas as pd

from harness.step.backends import CUDAGRAPH, EAGER, captures, plain

from . import frame

#: A busy share below this flags an eager ratio as host-bound.
HOST_BOUND = 0.8
#: The columns one busy share is keyed by (the paired table's).
KEYS = ["run_id", "device", "mode", *frame.SHAPE_COLS]


def busy_share(eager_ms: float, replay_ms: float) -> float | None:
    """The device-busy share of an eager step: ``replay_ms / eager_ms``, capped at 1.

    Args:
        eager_ms: prenorm's median eager step time (ms).
        replay_ms: prenorm's median step time replayed from a CUDA graph (ms), same run, device,
            mode and shape.

    Returns:
        a fraction in (0, 1] (1.0 = the GPU never idled); ``None`` when either time is missing,
        NaN or not positive.
    """
    if any(x is None or x != x or not x > 0 or math.isinf(x) for x in (eager_ms, replay_ms)):
        return None
    return min(1.0, replay_ms / eager_ms)


def busy_shares(paired: pd.DataFrame) -> pd.DataFrame:
    """Per run, CUDA device, mode and shape (:data:`KEYS`) of a
    :func:`reports.paired.paired_ratio_table`: ``busy_share`` (:func:`busy_share` of the medians,
    over that key's paired groups, of prenorm's ``prenorm_ms`` under ``eager`` and under
    ``cudagraph``). Only keys with both backends on a ``cuda`` device have a row; no such key, an
    empty frame with the columns."""
    cols = [*KEYS, "busy_share"]
    if paired.empty or not {"backend", "prenorm_ms", "device"} <= set(paired.columns):
        return pd.DataFrame(columns=cols)
    t = paired[paired["device"].astype(str).str.startswith("cuda")
               & paired["backend"].map(lambda b: plain(b) or captures(b)).astype(bool)]
    if t.empty:
        return pd.DataFrame(columns=cols)
    med = (t.assign(prenorm_ms=t["prenorm_ms"].astype(float))
           .groupby([*KEYS, "backend"], dropna=False)["prenorm_ms"].median().unstack("backend"))
    if not {EAGER.name, CUDAGRAPH.name} <= set(med.columns):
        return pd.DataFrame(columns=cols)
    med["busy_share"] = [busy_share(e, g) for e, g in zip(med[EAGER.name], med[CUDAGRAPH.name])]
    med = med.dropna(subset=["busy_share"]).reset_index()
    return med[cols].reset_index(drop=True)


def recorded_busy(df: pd.DataFrame) -> pd.DataFrame:
    """Per run, CUDA device, mode, shape (:data:`KEYS`), router and impl: the median of the eager
    cases' recorded ``device_busy`` rows (a fraction of the step, :mod:`harness.timing.gpu`) as
    ``busy_share``; an empty frame with the columns when the records hold none."""
    cols = [*KEYS, "router", "impl", "busy_share"]
    if df.empty or "metric" not in df:
        return pd.DataFrame(columns=cols)
    t = df[(df["metric"] == "device_busy") & (df["status"] == "ok") & df["backend"].map(plain).astype(bool)
           & df["value"].notna()]
    if t.empty:
        return pd.DataFrame(columns=cols)
    t = (t.assign(busy_share=t["value"].astype(float))
         .groupby([*KEYS, "router", "impl"], dropna=False)["busy_share"].median().reset_index())
    return t[cols].reset_index(drop=True)


__all__ = ["HOST_BOUND", "KEYS", "busy_share", "busy_shares", "recorded_busy"]
