"""The physical floor of a router's overhead (MEASUREMENT.md, "Noise on shared machines";
docs/ROUTERS.md, "The ideal fwd+bwd model").

A router's extra work is memory-bound, so its least possible cost is its extra bytes over the
device's memory bandwidth. Per paired case of the cost sweep:

    extra bytes = B·T · 2L · d · (model(router) − model(prenorm)) · bytes per element
    floor_ms    = extra bytes / measured bandwidth                   (GB/s = 1e9 bytes/s)

``model`` is, for a ``fwd`` step, :meth:`routers.Router.ideal_io_fwd_per_token` (each input of a
fused step read once, each output written once, what the step reads counted exactly: the Attention
Residuals paper's Table 1 model where that is exact), and for a ``fwd_bwd`` or ``train_step`` step
:meth:`routers.Router.ideal_io_fwd_bwd_per_token` (that forward and its ideal backward; prenorm's
is 6: forward 3, backward one gradient accumulation 3), in units of d elements per token and
sublayer. The floor is a model, never measured bytes (else × floor
would be 1 by construction). Its version is :data:`FLOOR_VERSION`: version 1 charged every step 3×
its forward (prenorm 9); a run records the version it was made under (manifest ``floor_version``)
and the report says which one it shows. The bandwidth is the run's own ``mem_bandwidth`` rows
(:mod:`harness.costs.bandwidth`, a timed device-to-device copy), median over repeats.
"""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from harness.costs.bandwidth import METRIC, NOMINAL_METRIC
from harness.rundir.records import COLUMNS as RECORD_COLUMNS
from routers import BASELINE, ROUTERS, build_router
from workloads.config import DTYPES

from . import frame
from .paired import paired_ratio_table

#: The version of the floor's byte model: 2, the ideal fwd+bwd model of docs/ROUTERS.md, reads
#: counted exactly (1: every training step 3× the paper's Table 1 forward, prenorm 9 units).
FLOOR_VERSION = 2
#: The model of each mode: the forward alone, or a training step (the optimizer touches only the
#: router's parameters, amortised to 0 per token); decode is not modelled.
MODE_MODEL = {"fwd": "forward", "fwd_bwd": "fwd_bwd", "train_step": "fwd_bwd"}
BYTE_MODEL = (
    f"Byte model (floor version {FLOOR_VERSION}, docs/ROUTERS.md \"The ideal fwd+bwd model\"): extra "
    "bytes = B·T tokens × 2L sublayers × d × (model(router) − model(prenorm)) × bytes per element of the "
    "run's dtype, in elements of width d per token and sublayer. fwd: each input of a fused step read "
    "once, each output written once, what the step reads counted exactly (the Attention Residuals "
    "paper's Table 1 model, except that it bounds a block router's phase 1 and full_attnres's chunks "
    "from above; block routers on the two-phase schedule; parameters and the readout count 0; prenorm "
    "3). fwd_bwd and train_step: "
    "that forward plus an ideal backward that, per fused step, reads the gradient of each tensor "
    "written, re-reads each input its gradient needs, writes each input's gradient unless it passes "
    "through unchanged, and reads and writes once more a gradient that gathers a further contribution "
    "(prenorm 6: one gradient accumulation; Block AttnRes 16.5, HAARES 24, WAV v1 31.5 at 12 layers and "
    "6 blocks). A router that declares no such model has no floor. decode is not modelled.")
FLOOR_METHOD = (
    "Physical floor: a router's extra work is memory-bound, so its least possible cost is its "
    "extra bytes over the device's memory bandwidth, measured in the run as a timed "
    "device-to-device copy (read + write, GB/s = 1e9 bytes/s, median of repeats). floor_ms = extra "
    "bytes / bandwidth; floor share = floor_ms / prenorm's median step (same pairs) × 100; "
    "overhead = (paired ratio − 1) × 100; × floor = overhead / floor share, how many times its "
    "floor the implementation pays. " + BYTE_MODEL)
NO_TABLE = ("No floor: it needs paired step times of prenorm and another router in modes "
            "fwd, fwd_bwd or train_step (a run with a mem_bandwidth row gives the floor in ms).")

COLUMNS = ["run_id", "router", "options", "impl", "variant", "backend", "compile_mode", "compile_scope", "mode",
           "workload", *frame.SHAPE_COLS, "device", "extra_bytes", "bandwidth_gbs", "nominal_gbs",
           "floor_ms", "prenorm_ms", "floor_share_pct", "paired_overhead_pct", "over_floor", "floor_version"]
#: Report headers and number formats (for :data:`reports.render.COLUMN_STYLE`).
COLUMN_STYLE = {
    "extra_bytes": ("extra router bytes / step (model)", "{:.3g}"),
    "bandwidth_gbs": ("measured bandwidth (GB/s)", "{:.0f}"),
    "nominal_gbs": ("nominal bandwidth (GB/s)", "{:.0f}"),
    "floor_ms": ("floor (ms)", "{:.4f}"), "floor_share_pct": ("floor (% of prenorm)", "{:.2f}"),
    "paired_overhead_pct": ("paired overhead vs prenorm (%)", "{:+.1f}"),
    "over_floor": ("× floor", "{:.1f}"), "floor_version": ("floor version", None),
}


@functools.lru_cache(maxsize=None)
def _io(router: str, d_model: int, n_layers: int, options: str, model: str) -> float:
    if router not in ROUTERS:  # a plugin's router whose plugin is not loaded here: not declared
        return math.nan
    r = build_router(router, d_model, n_layers, **json.loads(options or "{}"))
    value = r.ideal_io_fwd_per_token() if model == "forward" else r.ideal_io_fwd_bwd_per_token()
    return math.nan if value is None else float(value)


def extra_io_per_token(router: str, d_model: int, n_layers: int, options: dict | None = None,
                       model: str = "forward") -> float:
    """model(router) − model(prenorm): extra elements of width d per token and sublayer, of the
    forward (``model="forward"``, :meth:`routers.Router.ideal_io_fwd_per_token`) or of a training step
    (``"fwd_bwd"``, :meth:`routers.Router.ideal_io_fwd_bwd_per_token`; NaN where the router
    declares none).

    Args:
        router: a registered router name.
        options: its options (``impl`` is ignored: the model is implementation-independent).

    Raises:
        routers.errors.ConfigError: unknown router or invalid option.
    """
    opts = {k: v for k, v in (options or {}).items() if k != "impl"}
    key = json.dumps(opts, sort_keys=True)
    return _io(router, d_model, n_layers, key, model) - _io(BASELINE, d_model, n_layers, "{}", model)


def extra_router_bytes(router: str, *, d_model: int, n_layers: int, seq_len: int, batch_size: int,
                       dtype: str, mode: str, options: dict | None = None) -> float:
    """Ideal extra bytes of one step of ``router`` over prenorm (:data:`BYTE_MODEL`).

    Args:
        dtype: a key of :data:`workloads.config.DTYPES` (``"bfloat16"``: 2 bytes per element).
        mode: a key of :data:`MODE_MODEL`.

    Returns:
        bytes (float); NaN for a mode the model does not cover (``decode``) or a router that
        declares no fwd+bwd model.
    """
    if mode not in MODE_MODEL:
        return math.nan
    itemsize = DTYPES[dtype].itemsize
    return (batch_size * seq_len * 2 * n_layers * d_model * itemsize
            * extra_io_per_token(router, d_model, n_layers, options, MODE_MODEL[mode]))


def _bandwidth(df: pd.DataFrame, metric: str, name: str) -> pd.DataFrame:
    """Median of the run-level ``metric`` rows (``df.attrs["run_rows"]`` of a loaded frame) per run
    and device."""
    run_rows = df.attrs.get("run_rows")
    rows = frame.ok_rows(pd.DataFrame(run_rows, columns=df.columns.intersection(list(RECORD_COLUMNS)))
                          if run_rows is not None else df, metric)
    return rows.groupby(["run_id", "device"])["value"].median().rename(name).reset_index()


def floor_table(df: pd.DataFrame, paired: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per paired case (modes fwd, fwd_bwd, train_step; every backend): the floor beside the
    measured overhead.

    Args:
        df: a frame of :func:`reports.frame.load_frame`.
        paired: :func:`reports.paired.paired_ratio_table` of ``df``, when already computed.

    Returns:
        :data:`COLUMNS`: the case, ``extra_bytes`` (model, per step), ``bandwidth_gbs`` (median
        ``mem_bandwidth`` of the case's run and device), ``nominal_gbs``, ``floor_ms``,
        ``prenorm_ms`` (prenorm's median over the pairs), ``floor_share_pct`` (floor / prenorm
        × 100), ``paired_overhead_pct`` ((paired ratio − 1) × 100), ``over_floor`` (paired_overhead_pct /
        floor_share_pct). NaN where the run has no bandwidth row or the prenorm time is missing;
        ``over_floor`` NaN where the model adds no bytes (a floor of 0) or the overhead is not
        positive. Empty frame with the
        columns when nothing is paired.
    """
    t = paired_ratio_table(df) if paired is None else paired
    t = t[t["mode"].isin(list(MODE_MODEL))]
    if t.empty:
        return pd.DataFrame(columns=COLUMNS)
    # the paired table labels options as text; take the JSON of the same router and label
    raw = df.drop_duplicates(["router", "options"]).set_index(["router", "options"])["router_options"]
    t = t.assign(extra_bytes=[
        extra_router_bytes(r.router, d_model=int(r.d_model), n_layers=int(r.n_layers),
                           seq_len=int(r.seq_len), batch_size=int(r.batch_size), dtype=r.dtype,
                           mode=r.mode, options=json.loads(raw.get((r.router, r.options)) or "{}"))
        for r in t.itertuples()])
    t = t.merge(_bandwidth(df, METRIC, "bandwidth_gbs"), on=["run_id", "device"], how="left")
    t = t.merge(_bandwidth(df, NOMINAL_METRIC, "nominal_gbs"), on=["run_id", "device"], how="left")
    t["floor_ms"] = t["extra_bytes"] / (t["bandwidth_gbs"].astype(float) * 1e9) * 1e3
    prenorm = t["prenorm_ms"].astype(float).where(t["prenorm_ms"].astype(float) > 0)
    t["floor_share_pct"] = t["floor_ms"] / prenorm * 100
    t["paired_overhead_pct"] = (t["ratio"].astype(float) - 1) * 100
    # times the floor paid: only meaningful for a positive overhead over a positive floor
    t["over_floor"] = (t["paired_overhead_pct"].where(t["paired_overhead_pct"] > 0)
                       / t["floor_share_pct"].where(t["floor_share_pct"] > 0))
    t["floor_version"] = FLOOR_VERSION
    return t[COLUMNS].replace([np.inf, -np.inf], np.nan).reset_index(drop=True)


def write_floor(df: pd.DataFrame, out_dir: Path | str) -> Path | None:
    """Write :func:`floor_table` of ``df`` to ``<out_dir>/floor.csv``.

    Returns:
        the path, or None when the table is empty (nothing is written).
    """
    t = floor_table(df)
    if t.empty:
        return None
    path = Path(out_dir) / "floor.csv"
    path.parent.mkdir(parents=True, exist_ok=True)
    t.to_csv(path, index=False)
    return path


__all__ = ["BYTE_MODEL", "COLUMNS", "COLUMN_STYLE", "FLOOR_METHOD", "FLOOR_VERSION", "MODE_MODEL", "NO_TABLE",
           "extra_io_per_token", "extra_router_bytes", "floor_table", "write_floor"]
