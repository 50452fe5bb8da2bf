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


class GraphedStep:
    """A step of ``mode`` captured in a CUDA graph; calling it replays the graph.

    Args:
        model: the eager decoder on a CUDA device.
        mode: ``fwd``, ``fwd_bwd``, ``train_step`` or ``decode``.
        x, y: token ids (B, T); copied into static buffers.
        decode_input: (token, position) for ``decode`` (:func:`harness.step.modes.prefill_for_decode`).
        warmup: side-stream warm-up steps before the pre-flight and the capture.

    Attributes:
        capture_time_s: wall time of the capture (synchronised), seconds.
        static: the :class:`StaticInputs` (x, y) the graph reads; refill them to feed new data.

    Raises:
        CaptureError: no CUDA device, a host sync in the pre-flight, or a failed capture.
    """

    def __init__(self, model: nn.Module, mode: str, x: Tensor, y: Tensor,
                 decode_input: tuple[Tensor, Tensor] | None = None, warmup: int = 3) -> None:
        device = x.device
        if device.type != "cuda" or not torch.cuda.is_available():
            raise CaptureError("cudagraph needs a CUDA device")
        self.static = StaticInputs(x, y)
        sx, sy = self.static.buffers
        optimizer = make_optimizer(model, capturable=True) if mode == "train_step" else None
        if decode_input is not None:
            decode_input = StaticInputs(*decode_input).buffers
        step = make_step(model, mode, sx, sy, decode_input=decode_input, optimizer=optimizer)
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for _ in range(warmup):
                step()
        torch.cuda.current_stream(device).wait_stream(side)
        preflight(step, device)
        self.graph = torch.cuda.CUDAGraph()
        torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        try:
            with torch.cuda.graph(self.graph):
                self.output = step()
        except Exception as exc:
            raise CaptureError(f"capture of mode {mode} failed: {type(exc).__name__}: {exc}") from exc
        torch.cuda.synchronize(device)
        self.capture_time_s = time.perf_counter() - t0

    def __call__(self) -> Tensor:
        self.graph.replay()
        return self.output
