"""torch.profiler traces of a step, and the router's time read from their labels (MEASUREMENT.md,
"Profiling"; the ``labels`` method of :mod:`harness.sweep.profile`).

The trace comes from ``torch.profiler.profile`` with ``schedule(wait, warmup, active)`` and
``tensorboard_trace_handler``: one ``*.pt.trace.json`` per run that opens in TensorBoard (the
optional ``tb`` extra, torch-tb-profiler), Perfetto / chrome://tracing and Holistic Trace Analysis.
The decoder's ``profile_labels`` (``workloads/decoder.py``) wraps every router call in a
``record_function`` label; :func:`label_rows` gives each label its forward time and the backward nodes its forward ops
created (matched by sequence number).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Callable, Iterator

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, schedule, tensorboard_trace_handler

from workloads.decoder import Decoder
from harness.timing.timer import synchronize

#: Name of the autograd engine's span around one backward node (its ``sequence_nr`` is the
#: forward op's).
BACKWARD_NODE = "autograd::engine::evaluate_function: "


@contextlib.contextmanager
def profile_labels(model: Decoder | None, on: bool = True) -> Iterator[None]:
    """Switch ``model``'s ``record_function`` labels (:attr:`Decoder.profile_labels`) on (or off)
    inside the block; None: nothing to switch."""
    if model is None:
        yield
        return
    old = model.profile_labels
    model.profile_labels = on
    try:
        yield
    finally:
        model.profile_labels = old


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


def trace(step: Callable[[], object], device: torch.device, trace_dir: Path, wait: int, warmup: int,
          active: int, labels: bool, worker_name: str | None = None, model: Decoder | None = None):
    """Profile ``wait + warmup + active`` steps; the active ones go to a TensorBoard trace file.

    The trace carries ``distributedInfo`` (:func:`distributed_info`: rank 0 and world size 1 in a
    single process), which Holistic Trace Analysis reads for the rank instead of guessing it.
    With ``labels``, ``model`` (the eager decoder ``step`` runs) labels its router's and
    sublayers' calls while it is traced.

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

    with lines_dropped(b"USDT:"), profile_labels(model, labels), torch.profiler.profile(
            activities=activities, schedule=schedule(wait=wait, warmup=warmup, active=active, repeat=1),
            on_trace_ready=on_trace_ready, record_shapes=True, with_stack=False) as prof:
        for i in range(wait + warmup + active):
            if i == wait:  # Kineto keeps metadata added once it is collecting (warm-up on), not before
                prof.add_metadata_json("distributedInfo", json.dumps(distributed_info()))
            step()
            synchronize(device)  # so each step's kernels land inside its ProfilerStep span
            prof.step()
    return got["events"]


def distributed_info() -> dict:
    """The trace's ``distributedInfo`` as Kineto writes it under ``torch.distributed``: backend, rank
    and world size of the process group, or rank 0 of world size 1 when there is none."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return {"backend": dist.get_backend(), "rank": dist.get_rank(), "world_size": dist.get_world_size()}
    return {"backend": "none", "rank": 0, "world_size": 1}


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
                           "Decoder.profile_labels on?")
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
