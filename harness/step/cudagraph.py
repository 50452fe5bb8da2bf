"""The ``cudagraph`` backend: a whole step captured in one ``torch.cuda.CUDAGraph`` and replayed.

Protocol (PyTorch "CUDA semantics: CUDA Graphs"; TorchBench ``util/backends/cudagraph.py``;
MEASUREMENT.md, "CUDA graphs"):

1. Static input buffers (:class:`StaticInputs`): the graph reads fixed addresses, so new data is
   copied in with ``copy_`` and a different shape is an error, never a silent re-capture.
2. Warm-up on a side stream (lazy initialisation, cuBLAS workspaces, autograd buffers).
3. Pre-flight: one step under ``torch.cuda.set_sync_debug_mode("error")``, so a host sync (an
   ``.item()``, a data-dependent shape) fails with its cause instead of breaking the capture; a
   failing one is run again under :func:`harness.step.guard.capture_findings`, whose findings
   (file and line) the error adds.
4. Capture of the whole step: ``fwd``, ``fwd_bwd``, ``decode`` (static KV cache) or
   ``train_step`` (forward, loss, backward and AdamW with ``capturable=True`` and a tensor LR).
   Gradients are set to None before the captured backward, so each replay writes them afresh.
5. The capture time is its own metric; a failure raises :class:`CaptureError` naming the stage
   and the cause, which the sweep records as an ``error`` row.
"""

from __future__ import annotations

import inspect
import time
from typing import Callable

import torch
from torch import Tensor, nn

from .guard import capture_findings
from .modes import make_optimizer, make_step


class CaptureError(RuntimeError):
    """A step could not be captured in a CUDA graph; the message names the stage and cause."""


class StaticInputs:
    """Fixed-address copies of a step's input tensors (what a captured graph reads).

    Args:
        tensors: the inputs; each is cloned once.

    Raises:
        ValueError: from :meth:`refill`, when a new input's shape or dtype differs.
    """

    def __init__(self, *tensors: Tensor) -> None:
        self.buffers = tuple(t.clone() for t in tensors)

    def refill(self, *tensors: Tensor) -> None:
        """Copy new data into the buffers in place (their addresses never change)."""
        if len(tensors) != len(self.buffers):
            raise ValueError(f"expected {len(self.buffers)} inputs, got {len(tensors)}")
        for buf, t in zip(self.buffers, tensors):
            if buf.shape != t.shape or buf.dtype != t.dtype:
                raise ValueError(f"a captured graph has fixed inputs {tuple(buf.shape)} {buf.dtype}, "
                                 f"got {tuple(t.shape)} {t.dtype}: capture again for a new shape")
            buf.copy_(t, non_blocking=True)


def preflight(step: Callable[[], object], device: torch.device) -> None:
    """Run ``step`` once with host syncs turned into errors (CUDA only; on CPU it just runs).

    When it fails, the step is run once more under :func:`harness.step.guard.capture_findings`
    and the message also names what would break the capture by file and line (that extra run
    never hides the original error).

    Raises:
        CaptureError: the step synchronised with the host or failed, with the cause.
    """
    if device.type != "cuda":
        step()
        return
    torch.cuda.synchronize(device)
    torch.cuda.set_sync_debug_mode("error")
    try:
        step()
    except RuntimeError as exc:
        torch.cuda.set_sync_debug_mode("default")
        raise CaptureError(f"pre-flight: the step synchronises with the host or fails: {exc}"
                           + _findings_of(step, device)) from exc
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize(device)


def _findings_of(step: Callable[[], object], device: torch.device) -> str:
    """What :func:`harness.step.guard.capture_findings` finds in ``step``, as text to append to an
    error message (one line: a row's ``error`` stays one line); the empty string when it finds
    nothing or fails itself."""
    try:
        findings = capture_findings(step, device)
    except Exception:  # noqa: BLE001 - never mask the pre-flight's own error
        return ""
    if not findings:
        return ""
    return "; what would break the capture (harness.step.guard): " + "; ".join(map(str, findings))


def _graph_kwargs(api) -> dict:
    """``check_input_liveness=True`` where this torch's ``graph`` takes it (it checks at capture
    that every tensor the graph reads is alive); nothing on a torch without it."""
    try:
        params = inspect.signature(api.graph).parameters
    except (TypeError, ValueError):
        return {}
    return {"check_input_liveness": True} if "check_input_liveness" in params else {}


class GraphedStep:
    """A step of ``mode`` captured in a CUDA graph; calling it replays the graph.

    Everything the graph reads lives as long as it may replay: the instance holds the model (its
    parameters and gradients), the optimizer of ``train_step`` and so its state (moments, step
    counts, the tensor LR), the static inputs, the step function and the stream it was captured
    on. Each graph is captured on a stream of its own: graphs captured on one stream share that
    stream's cuBLAS workspace, which the destruction of any of them frees under the others
    (pytorch/pytorch#193402, an illegal memory access at a later replay).

    Args:
        model: the eager decoder on a CUDA device.
        mode: ``fwd``, ``fwd_bwd``, ``train_step`` or ``decode``.
        x, y: token ids (B, T); copied into static buffers.
        decode_input: (token, position) for ``decode`` (:func:`harness.step.modes.prefill_for_decode`).
        warmup: side-stream warm-up steps before the pre-flight and the capture, at least 1: the
            step at the captured shape runs eagerly first, so the Triton autotuner chooses each
            kernel's config for that shape's row bucket there, never inside the capture.
        optimizer: the optimizer of ``train_step`` (default: AdamW with ``capturable=True``,
            :func:`harness.step.modes.make_optimizer`).
        api: the CUDA-graph API (``torch.cuda``; a test double runs the protocol on a CPU).

    Attributes:
        capture_time_s: wall time of the capture (synchronised), seconds.
        static: the :class:`StaticInputs` (x, y) the graph reads; refill them to feed new data.
        model, optimizer: what the graph reads (kept alive with it).

    Raises:
        CaptureError: no CUDA device, a host sync in the pre-flight, or a failed capture.
        ValueError: ``warmup`` < 1.
    """

    def __init__(self, model: nn.Module, mode: str, x: Tensor, y: Tensor,
                 decode_input: tuple[Tensor, Tensor] | None = None, warmup: int = 3,
                 optimizer: torch.optim.Optimizer | None = None, api=torch.cuda) -> None:
        if warmup < 1:
            raise ValueError(f"warmup must be at least 1 (got {warmup}): the autotuner and the allocator "
                             "settle in an eager step at the captured shape before the capture")
        device = x.device
        if api is torch.cuda and (device.type != "cuda" or not torch.cuda.is_available()):
            raise CaptureError("cudagraph needs a CUDA device")
        self.static = StaticInputs(x, y)
        sx, sy = self.static.buffers
        if mode == "train_step" and optimizer is None:
            optimizer = make_optimizer(model, capturable=True)
        self.model, self.optimizer = model, optimizer
        self.decode_input = None if decode_input is None else StaticInputs(*decode_input).buffers
        self.step = make_step(model, mode, sx, sy, decode_input=self.decode_input, optimizer=optimizer)
        self.stream = api.Stream(device)          # warm-up and capture, this graph's own
        self.stream.wait_stream(api.current_stream(device))
        with api.stream(self.stream):
            for _ in range(warmup):
                self.step()
        api.current_stream(device).wait_stream(self.stream)
        preflight(self.step, device)
        self.graph = api.CUDAGraph()
        api.synchronize(device)
        t0 = time.perf_counter()
        try:
            with api.graph(self.graph, stream=self.stream, **_graph_kwargs(api)):
                self.output = self.step()
        except Exception as exc:
            raise CaptureError(f"capture of mode {mode} failed: {type(exc).__name__}: {exc}") from exc
        api.synchronize(device)
        self.capture_time_s = time.perf_counter() - t0

    def __call__(self) -> Tensor:
        self.graph.replay()
        return self.output
