"""``routerbench profile``: torch.profiler traces of one case and the router's share of its step time
(MEASUREMENT.md, "Profiling").

The trace comes from ``torch.profiler.profile`` with ``schedule(wait, warmup, active)`` and
``tensorboard_trace_handler``: one ``*.pt.trace.json`` per run that opens in TensorBoard (the
optional ``tb`` extra, torch-tb-profiler), Perfetto / chrome://tracing and Holistic Trace Analysis.

The router's share of step time, by one of three methods (the ``method`` column):

- ``labels`` (eager only): :data:`workloads.decoder.PROFILE_LABELS` wraps every router call in a
  ``record_function`` label. Forward time per label comes from ``key_averages()`` (self + children;
  CPU time on CPU, kernel time on CUDA). Backward work has no labels: each autograd node run in
  backward (``autograd::engine::evaluate_function: …``) is given to the label its forward op ran
  under, matched by the op's sequence number (the link TensorBoard draws between forward and
  backward), giving ``router.read.backward`` and so on. The step is a ``ProfilerStep#`` span on CPU
  and all kernel time of the step on CUDA, so both sides of the share are the same kind of time.
  It is a share of *profiled* time: on CPU the profiler's cost per op (several µs with
  ``record_shapes``) weighs most on the router's many small ops; ``--methods
  labels,paired_difference`` cross-checks it on eager.
- ``paired_difference`` (any backend): the case and the same-shape ``prenorm`` step are timed
  interleaved A B A B; per pair (t_router − t_prenorm) / t_router, median over pairs.
- ``router_only`` (any backend): the ``router_only`` workload of the same router (every sublayer
  is its input RMSNorm) timed interleaved with the full step; per pair t_router_only / t_step. It
  still holds the embedding, the LM head and the loss, so it bounds the router's time from above.

Labels do not survive Inductor fusion or CUDA-graph replay, so ``compile`` and ``cudagraph`` use
the last two methods (the trace is still written: it shows the fused kernels or the replay).
"""

from __future__ import annotations

import contextlib
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Callable, Iterable, Iterator

import pandas as pd
import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, schedule, tensorboard_trace_handler

import workloads.decoder as decoder
from workloads.data import synthetic_batch

from . import backends
from .cases import Case
from .cudagraph import GraphedStep
from .env import slugify
from .memory import cuda_memory_snapshot
from .modes import make_step, prefill_for_decode
from .measure import build_model
from .rundir import StagingWriter
from .timing import TimingPolicy, synchronize, time_steps, warm_up

METHODS = ("labels", "paired_difference", "router_only")
BASELINE = "prenorm"
#: Name of the autograd engine's span around one backward node (its ``sequence_nr`` is the
#: forward op's).
BACKWARD_NODE = "autograd::engine::evaluate_function: "
TABLE_COLUMNS = ("label", "calls", "ms_per_step", "share_pct", "method")
#: Metric names of the records per method (``labels`` keeps the plain names).
_METRIC_SUFFIX = {"labels": "", "paired_difference": "_paired_difference", "router_only": "_router_only"}


def default_methods(backend: str) -> tuple[str, ...]:
    """``labels`` in eager mode; under ``compile`` / ``cudagraph`` labels do not survive."""
    return ("labels",) if backend == "eager" else ("paired_difference", "router_only")


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
    if "labels" in methods and backend != "eager":
        raise ValueError(f"--methods labels: record_function labels do not survive --backend {backend} "
                         "(fusion / graph replay); use paired_difference,router_only or --backend eager")
    if not methods:
        raise ValueError("--methods: give at least one of " + ", ".join(METHODS))
    if compile_mode == "reduce-overhead" and set(methods) & {"paired_difference", "router_only"}:
        raise ValueError("--compile-mode reduce-overhead: its CUDA-graph trees cannot be interleaved with "
                         "another compiled model; profile --backend cudagraph instead")
    return methods


@contextlib.contextmanager
def profile_labels(on: bool = True) -> Iterator[None]:
    """Switch the decoder's ``record_function`` labels on (or off) inside the block."""
    old = decoder.PROFILE_LABELS
    decoder.PROFILE_LABELS = on
    try:
        yield
    finally:
        decoder.PROFILE_LABELS = old


@contextlib.contextmanager
def lines_dropped(prefix: bytes = b"USDT:", fds: tuple[int, ...] = (1, 2)) -> Iterator[None]:
    """Drop the lines starting with ``prefix`` that C code writes straight to the file descriptors
    ``fds`` inside the block; every other line written there meanwhile is printed, in order, when
    it ends. Kineto (torch >= 2.13, pytorch/kineto#1325) writes ``USDT:… profiler_start`` and
    ``profiler_stop`` to the terminal whenever a profiler starts and stops; they tell the user
    nothing."""
    held = []
    for fd in fds:
        try:
            for stream in (sys.stdout, sys.stderr):
                stream.flush()
            tmp = tempfile.TemporaryFile()
            held.append((fd, os.dup(fd), tmp))
            os.dup2(tmp.fileno(), fd)
        except (OSError, ValueError, AttributeError):  # no such descriptor (a daemon): leave it
            continue
    try:
        yield
    finally:
        for fd, old, tmp in reversed(held):
            with contextlib.suppress(OSError, ValueError, AttributeError):
                for stream in (sys.stdout, sys.stderr):
                    stream.flush()
            os.dup2(old, fd)
            os.close(old)
            tmp.seek(0)
            kept = memoryview(b"".join(ln for ln in tmp if not ln.startswith(prefix)))
            tmp.close()
            while kept:
                kept = kept[os.write(fd, kept):]


def build_step(case: Case, device: torch.device) -> Callable[[], object]:
    """The case's step on its backend, as the sweep builds it (compilation happens at the first
    call; a ``cudagraph`` step is captured here)."""
    model = build_model(case, device)
    x, y = synthetic_batch(case.cfg.vocab_size, case.cfg.batch_size, case.cfg.seq_len,
                           seed=case.seed, device=device)
    decode_input = prefill_for_decode(model, x) if case.mode == "decode" else None
    if case.backend == "cudagraph":
        return GraphedStep(model, case.mode, x, y, decode_input=decode_input)
    prepared = backends.prepare(model, case.backend, case.compile_mode)
    return make_step(prepared.model, case.mode, x, y, clone_outputs=prepared.clone_outputs,
                     decode_input=decode_input)


def trace(step: Callable[[], object], device: torch.device, trace_dir: Path, wait: int, warmup: int,
          active: int, labels: bool, worker_name: str | None = None):
    """Profile ``wait + warmup + active`` steps; the active ones go to a TensorBoard trace file.

    Returns:
        the profiler's events of the active steps (``torch.autograd.profiler_util.EventList``).
    """
    trace_dir.mkdir(parents=True, exist_ok=True)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    write = tensorboard_trace_handler(str(trace_dir), worker_name=worker_name)
    got = {}

    def on_trace_ready(prof) -> None:
        write(prof)
        got["events"] = prof.events()

    with lines_dropped(b"USDT:"), profile_labels(labels), torch.profiler.profile(
            activities=activities, schedule=schedule(wait=wait, warmup=warmup, active=active, repeat=1),
            on_trace_ready=on_trace_ready, record_shapes=True, with_stack=False) as prof:
        for _ in range(wait + warmup + active):
            step()
            synchronize(device)  # so each step's kernels land inside its ProfilerStep span
            prof.step()
    return got["events"]


def _time(ev, cuda: bool) -> float:
    """Self + children time of a CPU-side event in µs: CPU time, or its kernels' time on CUDA."""
    return ev.device_time_total if cuda else ev.cpu_time_total


def _label_of(ev):
    """The innermost ``router.*`` / ``sublayer.*`` label event around ``ev`` (one call of the
    labelled region); None outside any, and ``BACKWARD_NODE`` for events inside a backward node
    (not forward work)."""
    while ev is not None:
        if ev.name.startswith(("router.", "sublayer.")):
            return ev
        if ev.name.startswith(BACKWARD_NODE):
            return BACKWARD_NODE
        ev = ev.cpu_parent
    return None


def label_rows(events, cuda: bool) -> tuple[list[dict], float]:
    """Per-label time per step of the traced active steps (method ``labels``).

    Returns:
        rows (label, calls, ms_per_step) for forward labels and ``<label>.backward`` (backward
        nodes matched to the forward label by sequence number), and the step time in ms. ``calls``
        counts calls of the labelled region per step, for ``<label>.backward`` too: the forward
        calls whose backward ran (not the autograd nodes, a few per call).

    Raises:
        RuntimeError: the events hold no ``ProfilerStep#`` span or no router label.
    """
    cpu = [e for e in events if e.device_type == DeviceType.CPU and not e.is_async]
    steps = [e for e in cpu if e.name.startswith("ProfilerStep")]
    if not steps:
        raise RuntimeError("the trace holds no ProfilerStep# span: nothing was recorded")
    n = len(steps)
    if cuda:  # all kernel time of the step: every kernel hangs under exactly one root CPU event
        step_us = sum(e.device_time_total for e in cpu if e.cpu_parent is None)
    else:
        step_us = sum(e.cpu_time_total for e in steps)
    rows = []
    for avg in events.key_averages():
        if avg.key.startswith(("router.", "sublayer.")) and avg.device_type == DeviceType.CPU:
            rows.append({"label": avg.key, "calls": avg.count / n, "ms_per_step": _time(avg, cuda) / 1e3 / n})
    if not any(r["label"].startswith("router.") for r in rows):
        raise RuntimeError("the trace holds no router.* label: was the step run eagerly with "
                           "workloads.decoder.PROFILE_LABELS on?")
    # Forward op -> label, by (thread, sequence number). The op that creates an autograd node is
    # the last one to carry its number (the counter moves on after it), so the last wins.
    owner: dict[tuple[int, int], object] = {}
    for e in sorted(cpu, key=lambda e: e.time_range.start):
        if e.sequence_nr >= 0 and not e.name.startswith(BACKWARD_NODE):
            label = _label_of(e)
            if label is not BACKWARD_NODE:
                owner[(e.thread, e.sequence_nr)] = label
    bwd_us: dict[str, float] = {}
    bwd_calls: dict[str, set[int]] = {}  # the forward calls (label events) whose nodes ran
    for e in cpu:
        if e.name.startswith(BACKWARD_NODE) and e.sequence_nr >= 0:
            label = owner.get((e.fwd_thread if e.fwd_thread is not None else e.thread, e.sequence_nr))
            if label is not None:
                key = label.name + ".backward"
                bwd_us[key] = bwd_us.get(key, 0.0) + _time(e, cuda)
                bwd_calls.setdefault(key, set()).add(id(label))
    rows += [{"label": k, "calls": len(bwd_calls[k]) / n, "ms_per_step": us / 1e3 / n}
             for k, us in bwd_us.items()]
    return sorted(rows, key=lambda r: (not r["label"].startswith("router."), r["label"])), step_us / 1e3 / n


def interleaved_times(steps: list[Callable[[], object]], device: torch.device, pairs: int,
                      backend: str, policy: TimingPolicy = TimingPolicy()) -> list[list[float]]:
    """Warm each step up, then time them interleaved (A B C A B C …) ``pairs`` rounds.

    Returns:
        one list of ``pairs`` step times (ms) per step, in the order given.
    """
    for s in steps:
        warm_up(s, device, policy)
    out: list[list[float]] = [[] for _ in steps]
    with backends.recompile_guard(backend):
        for _ in range(pairs):
            for times, s in zip(out, steps):
                times.extend(time_steps(s, device, 1))
    return out


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
        writer: where to append ``profile_router_time`` / ``profile_step_time`` (ms) and
            ``router_share`` (%) rows; methods other than ``labels`` suffix the metric with
            ``_<method>``.
        methods: subset of :data:`METHODS` (default :func:`default_methods` of the backend).
        pairs: interleaved rounds of the ``paired_difference`` / ``router_only`` methods.
        memory_snapshot: on CUDA, dump the allocator history of one step
            (:func:`harness.memory.cuda_memory_snapshot`).
        max_entries: allocator events the snapshot keeps.
        policy: warm-up of the interleaved timings.

    Returns:
        ``table`` (a DataFrame with :data:`TABLE_COLUMNS`: per ``method``, a ``router`` row, a
        ``step`` row and the rows behind them; ``calls`` of the labelled region per step (for a
        ``<label>.backward`` row: the forward calls whose backward ran), blank for the timed
        methods, whose times and shares are medians over pairs), ``router_share`` (%, of the
        first method), ``router_share_by_method``, ``trace_dir``, ``trace_files``, ``csv``,
        ``png`` and ``memory_snapshot`` (a path or None).

    Raises:
        ValueError: bad ``methods``, schedule or ``pairs``; the backend cannot run on ``device``.
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

    # Every step is built before any runs: backends.prepare resets dynamo, which would drop code
    # compiled for an earlier step.
    step = build_step(case, device)
    others = {}
    if "paired_difference" in methods:
        others["paired_difference"] = build_step(Case(
            BASELINE, case.cfg, case.mode, case.backend, case.compile_mode, seed=case.seed), device)
    if "router_only" in methods:
        others["router_only"] = build_step(Case(
            case.router, case.cfg.replace(workload="router_only"), case.mode, case.backend,
            case.compile_mode, case.router_options, case.impl, case.seed), device)
    step()  # untimed first call: compilation, lazy initialisation
    synchronize(device)

    trace_dir = out_dir / "trace"
    worker = slugify(f"{case.router}-{case.impl}-{case.backend}-{case.mode}")
    events = trace(step, device, trace_dir, wait, warmup, active, labels="labels" in methods,
                   worker_name=worker)
    rows: list[dict] = []
    if "labels" in methods:
        per_label, step_ms = label_rows(events, cuda)
        router_ms = sum(r["ms_per_step"] for r in per_label if r["label"].startswith("router."))
        rows += [_row(r["label"], r["calls"], r["ms_per_step"], step_ms, "labels") for r in per_label]
        rows += [_row("router", None, router_ms, step_ms, "labels"),
                 _row("step", None, step_ms, step_ms, "labels")]
    if others:
        times = interleaved_times([step, *others.values()], device, pairs, case.backend, policy)
        full = times[0]
        step_ms = statistics.median(full)
        for method, t in zip(others, times[1:]):
            # time and share are medians over pairs of the per-pair difference and ratio
            # (MEASUREMENT.md, "Timing"), not a ratio of two medians
            if method == "paired_difference":
                router = [a - b for a, b in zip(full, t)]
                rows.append(_median_row(f"{BASELINE}.step", t, full, method))
            else:
                router = t
            rows += [_median_row("router", router, full, method), _row("step", None, step_ms, step_ms, method)]
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

    snapshot = None
    if memory_snapshot and cuda:
        snapshot = cuda_memory_snapshot(step, out_dir / "memory_snapshot.pickle", max_entries)
    return {"table": table, "router_share": shares[methods[0]], "router_share_by_method": shares,
            "trace_dir": trace_dir, "trace_files": sorted(trace_dir.glob("*.json*")), "csv": csv,
            "png": png, "memory_snapshot": snapshot}
