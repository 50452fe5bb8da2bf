"""``routerbench profile``: torch.profiler traces of one case and the router's share of its step time
(MEASUREMENT.md, "Profiling"). The case and its companions are prepared and timed on the sweep's one
path (:func:`harness.sweep.prepare.prepare_group`, :func:`harness.sweep.timed.time_group`), so a
profiled step is the step ``routerbench run`` times.

The trace comes from ``torch.profiler.profile`` with ``schedule(wait, warmup, active)`` and
``tensorboard_trace_handler``: one ``*.pt.trace.json`` per run that opens in TensorBoard (the
optional ``tb`` extra, torch-tb-profiler), Perfetto / chrome://tracing and Holistic Trace Analysis.

The router's share of step time, by one of three methods (the ``method`` column):

- ``labels`` (eager only): the decoder's ``profile_labels`` (``workloads/decoder.py``) wraps
  every router call in a ``record_function`` label. Forward time per label comes from
  ``key_averages()`` (self + children; CPU time on CPU, kernel time on CUDA). Backward work has
  no labels: each autograd node run in backward (``autograd::engine::evaluate_function: …``) is
  given to the label its forward op ran under, matched by the op's sequence number (the link TensorBoard draws between forward and
  backward), giving ``router.read.backward`` and so on. The step is a ``ProfilerStep#`` span on CPU
  and all kernel time of the step on CUDA, so both sides of the share are the same kind of time.
  It is a share of *profiled* time: on CPU the profiler's cost per op (several µs with
  ``record_shapes``) weighs most on the router's many small ops; ``--methods
  labels,paired_difference`` cross-checks it on eager.
- ``paired_difference`` (any backend): the case and the same-shape ``prenorm`` step are timed
  interleaved in ABBA rounds; per pair (t_router − t_prenorm) / t_router, median over pairs.
- ``router_only`` (any backend): the ``router_only`` workload of the same router (every sublayer
  is its input RMSNorm) timed interleaved with the full step; per pair t_router_only / t_step. It
  still holds the embedding, the LM head and the loss, so it bounds the router's time from above.

Labels do not survive Inductor fusion or CUDA-graph replay, so ``compile`` and ``cudagraph`` use
the last two methods (the trace is still written: it shows the fused kernels or the replay).
"""

from __future__ import annotations

import statistics
from dataclasses import replace
from pathlib import Path
from typing import Iterable

import pandas as pd
import torch

from harness.costs.memory import cuda_memory_snapshot
from harness.rundir.environment import slugify
from harness.rundir.writer import MemoryWriter, StagingWriter
from harness.step import backends
from harness.step.backends import of
from harness.timing.timer import TimingPolicy
from routers import BASELINE

from . import prepare, timed
from .cases import Case
from .options import SweepOptions
from .trace import label_rows, trace

METHODS = ("labels", "paired_difference", "router_only")


TABLE_COLUMNS = ("label", "calls", "ms_per_step", "share_pct", "method")


#: Metric names of the records per method (``labels`` keeps the plain names).
_METRIC_SUFFIX = {"labels": "", "paired_difference": "_paired_difference", "router_only": "_router_only"}


def default_methods(backend: str) -> tuple[str, ...]:
    """``labels`` in eager mode; under ``compile`` / ``cudagraph`` labels do not survive."""
    return ("labels",) if of(backend).plain else ("paired_difference", "router_only")


def check_methods(methods: Iterable[str], backend: str, compile_mode: str | None = None) -> tuple[str, ...]:
    """Validate ``methods`` for ``backend`` (and its ``compile_mode``).

    Raises:
        ValueError: an unknown method; ``labels`` with a backend other than eager; a timed method
            under ``reduce-overhead``, whose CUDA-graph trees share one pool per device, so
            interleaving compiled models may overwrite or re-record them (pytorch/pytorch#170604).
            The message names the option.
    """
    methods = tuple(methods)
    for m in methods:
        if m not in METHODS:
            raise ValueError(f"--methods: unknown method {m!r}; known: {', '.join(METHODS)}")
    if "labels" in methods and not of(backend).plain:
        raise ValueError(f"--methods labels: record_function labels do not survive --backend {backend} "
                         "(fusion / graph replay); use paired_difference,router_only or --backend eager")
    if not methods:
        raise ValueError("--methods: give at least one of " + ", ".join(METHODS))
    if compile_mode == "reduce-overhead" and set(methods) & {"paired_difference", "router_only"}:
        raise ValueError("--compile-mode reduce-overhead: its CUDA-graph trees cannot be interleaved with "
                         "another compiled model; profile --backend cudagraph instead")
    return methods


def _row(label: str, calls, ms: float, step_ms: float, method: str) -> dict:
    return {"label": label, "calls": calls, "ms_per_step": ms, "share_pct": 100.0 * ms / step_ms,
            "method": method}


def _median_row(label: str, times: list[float], full: list[float], method: str) -> dict:
    return {"label": label, "calls": None, "ms_per_step": statistics.median(times),
            "share_pct": 100.0 * statistics.median(x / a for x, a in zip(times, full)), "method": method}


def share_figure(table: pd.DataFrame, path: Path, title: str) -> Path:
    """Horizontal seaborn bars of ``share_pct`` per label (the ``step`` rows, 100 %, left out)."""
    import matplotlib
    matplotlib.use("Agg")  # files only, never a window
    import matplotlib.pyplot as plt
    import seaborn as sns

    t = table[table.label != "step"]
    fig, ax = plt.subplots(figsize=(7, 0.35 * len(t) + 1.2))
    sns.barplot(data=t, y="label", x="share_pct", hue="method", ax=ax, dodge=t.method.nunique() > 1)
    ax.set_xlabel("share of step time (%)")
    ax.set_ylabel("")
    ax.set_title(title, fontsize=9)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def profile_case(case: Case, device: torch.device, out_dir: Path | str, wait: int = 1, warmup: int = 2,
                 active: int = 3, writer: StagingWriter | None = None,
                 methods: Iterable[str] | None = None, pairs: int = 10,
                 memory_snapshot: bool = False, max_entries: int = 100_000,
                 policy: TimingPolicy = TimingPolicy()) -> dict:
    """Trace ``case`` with torch.profiler and measure the router's share of its step time.

    Args:
        case: the case (router, shape, backend, mode).
        device: where to run it.
        out_dir: gets ``trace/`` (TensorBoard trace JSON), ``router_share.csv`` and
            ``router_share.png`` (and ``memory_snapshot.pickle`` with ``memory_snapshot``).
        wait, warmup, active: the profiler schedule (steps skipped, profiled and dropped, kept).
        writer: where to append the rows: the set-up's (:func:`harness.sweep.prepare.prepare_case`:
            parameters, parity, compile or capture time), the timed methods' (step times and
            noise readings of the case and its companions, :func:`harness.sweep.timed.time_group`),
            and ``profile_router_time`` / ``profile_step_time`` (ms) and ``router_share`` (%);
            methods other than ``labels`` suffix those three metrics with ``_<method>``. None:
            rows are kept in memory and dropped.
        methods: subset of :data:`METHODS` (default :func:`default_methods` of the backend).
        pairs: interleaved rounds of the ``paired_difference`` / ``router_only`` methods.
        memory_snapshot: on CUDA, dump the allocator history of one step
            (:func:`harness.costs.memory.cuda_memory_snapshot`).
        max_entries: allocator events the snapshot keeps.
        policy: warm-up of every step (its ``repeats`` is replaced by ``pairs``).

    Returns:
        ``table`` (a DataFrame with :data:`TABLE_COLUMNS`: per ``method``, a ``router`` row, a
        ``step`` row and the rows behind them; ``calls`` of the labelled region per step (for a
        ``<label>.backward`` row: the forward calls whose backward ran), blank for the timed
        methods, whose times and shares are medians over pairs), ``router_share`` (%, of the
        first method), ``router_share_by_method``, ``trace_dir``, ``trace_files``, ``csv``,
        ``png`` and ``memory_snapshot`` (a path or None).

    Raises:
        ValueError: bad ``methods``, schedule or ``pairs``; the backend cannot run on ``device``.
        RuntimeError: a step could not be set up or timed (its row says why).
    """
    methods = check_methods(methods or default_methods(case.backend), case.backend, case.compile_mode)
    if wait < 0 or warmup < 0 or active < 1:
        raise ValueError(f"--wait/--warmup must be >= 0 and --active >= 1, got {wait}/{warmup}/{active}")
    if pairs < 1:
        raise ValueError(f"--pairs must be >= 1, got {pairs}")
    reason = backends.unavailable_reason(case.backend, case.compile_mode, device)
    if reason:
        raise ValueError(f"--backend {case.backend}: {reason}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    cuda = device.type == "cuda"

    # The case and the companions its timed methods compare it with, prepared and timed on the
    # sweep's path (parity, parameters, compile or capture, warm-up; interleaved ABBA rounds);
    # nothing is counted (no FLOPs, no memory pass): a profile reads time.
    companions = {}
    if "paired_difference" in methods:
        companions["paired_difference"] = Case(BASELINE, case.cfg, case.mode, case.backend, case.compile_mode,
                                               seed=case.seed)
    if "router_only" in methods:
        companions["router_only"] = Case(case.router, case.cfg.replace(workload="router_only"), case.mode,
                                         case.backend, case.compile_mode, case.router_options, case.impl,
                                         case.seed)
    todo = [(case, False)] + [(c, False) for c in companions.values()]
    opts = SweepOptions(flops=False, memory=False, timing=replace(policy, repeats=pairs), max_attempts=1)
    w = writer if writer is not None else MemoryWriter({"device": str(device)})
    trace_dir = out_dir / "trace"
    rows: list[dict] = []
    with prepare.prepare_group(todo, device, w, opts) as group:
        if group.errors:
            key, why = next(iter(group.errors.items()))
            raise RuntimeError(f"{group.status[key]} setting up {key}: {why}")
        step = group.steps[case.key]
        worker = slugify(f"{case.router}-{case.impl}-{case.backend}-{case.mode}")
        events = trace(step, device, trace_dir, wait, warmup, active, labels="labels" in methods,
                       worker_name=worker, model=group.models[case.key])
        if "labels" in methods:
            per_label, step_ms = label_rows(events, cuda)
            router_ms = sum(r["ms_per_step"] for r in per_label if r["label"].startswith("router."))
            rows += [_row(r["label"], r["calls"], r["ms_per_step"], step_ms, "labels") for r in per_label]
            rows += [_row("router", None, router_ms, step_ms, "labels"),
                     _row("step", None, step_ms, step_ms, "labels")]
        if companions:
            got = timed.time_group([c for c, _ in todo], group.steps, device, w, opts)
            failed = [k for k, st in got.status.items() if st != "ok"]
            if failed:
                raise RuntimeError(f"{got.status[failed[0]]} timing {failed[0]} (its step_time row says why)")
            full = got.times[case.key]
            step_ms = statistics.median(full)
            for method, other in companions.items():
                t = got.times[other.key]
                # time and share are medians over pairs of the per-pair difference and ratio
                # (MEASUREMENT.md, "Timing"), not a ratio of two medians
                if method == "paired_difference":
                    router = [a - b for a, b in zip(full, t)]
                    rows.append(_median_row(f"{BASELINE}.step", t, full, method))
                else:
                    router = t
                rows += [_median_row("router", router, full, method), _row("step", None, step_ms, step_ms, method)]
        snapshot = None
        if memory_snapshot and cuda:
            snapshot = cuda_memory_snapshot(step, out_dir / "memory_snapshot.pickle", max_entries)
    table = pd.DataFrame(rows, columns=list(TABLE_COLUMNS)).astype({"calls": float})

    csv = out_dir / "router_share.csv"
    table.to_csv(csv, index=False)
    c = case.cfg
    png = share_figure(table, out_dir / "router_share.png",
                       f"{case.router} [{case.impl}] {case.backend} {case.mode}: d={c.d_model} "
                       f"L={c.n_layers} T={c.seq_len} B={c.batch_size} {c.dtype}, {device.type}")
    shares = {}
    for method in methods:
        m = table[table.method == method].set_index("label")
        shares[method] = float(m.loc["router", "share_pct"])
        if writer is not None:
            cols, sfx = case.columns(), _METRIC_SUFFIX[method]
            writer.write(**cols, metric="profile_router_time" + sfx, value=float(m.loc["router", "ms_per_step"]),
                         unit="ms")
            writer.write(**cols, metric="profile_step_time" + sfx, value=float(m.loc["step", "ms_per_step"]),
                         unit="ms")
            writer.write(**cols, metric="router_share" + sfx, value=shares[method], unit="%")

    return {"table": table, "router_share": shares[methods[0]], "router_share_by_method": shares,
            "trace_dir": trace_dir, "trace_files": sorted(trace_dir.glob("*.json*")), "csv": csv,
            "png": png, "memory_snapshot": snapshot}
