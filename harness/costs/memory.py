"""Memory metrics (MEASUREMENT.md, "Memory").

- ``saved_activation``: bytes of the tensors autograd saves for backward during one forward,
  counted with ``torch.autograd.graph.saved_tensors_hooks``. Each storage is counted once at its
  full size (a saved view of a larger buffer costs the buffer), and storages of the model's own
  parameters and buffers are excluded (they are resident anyway). Device-independent: CPU runs
  compare routers' activation memory exactly. With gradient checkpointing, the input each
  checkpointed sublayer keeps for its recomputation is held by the checkpoint itself, not saved
  through autograd's hooks, so it is not counted unless the router saves the same tensor: the
  figure is then a lower bound by at most 2L tensors of (B, T, d).
- ``peak_allocated`` / ``peak_reserved`` (CUDA only): ``max_memory_allocated`` /
  ``max_memory_reserved`` after ``reset_peak_memory_stats`` around one untimed step. Neither
  counts the CUDA context.
- ``cuda_memory_snapshot`` (on demand, ``routerbench profile --memory-snapshot``): the allocator's
  history over one step, for https://pytorch.org/memory_viz. Python stacks only and a bounded
  history: full C++ stacks made one snapshot take 461 s instead of 4 s (pytorch/torchtitan#3628).
- :func:`available_bytes`: the device's free memory now, against which estimates
  (:mod:`harness.costs.estimate`) are held.
"""

from __future__ import annotations

import contextlib
import os
import weakref
from pathlib import Path
from typing import Callable, Iterable

import torch
from torch import Tensor


def saved_activation_bytes(forward: Callable[[], object], exclude: Iterable[Tensor] = ()) -> int:
    """Bytes saved for backward by ``forward()`` (which must build an autograd graph) and still
    held by its graph when it returns.

    Args:
        forward: runs one forward pass with grad enabled; its result is dropped afterwards.
        exclude: tensors whose storages are not activations (the model's parameters, buffers).

    Returns:
        the sum of ``untyped_storage().nbytes()`` over the distinct storages the graph of the
        result still saves, in bytes. A branch that does not reach the result dies during the
        forward, and what it saved is not counted (its storage may be reused by a later tensor).
    """
    skip = {t.untyped_storage().data_ptr() for t in exclude}
    packed: list[weakref.ref] = []

    def pack(t: Tensor) -> Tensor:
        # detached: a live ``t`` that is its node's output would close a cycle through C++
        # (output -> grad_fn -> saved variable -> output) that gc cannot walk, and with no
        # backward the whole saved graph would leak (pytorch/pytorch#115255, #189025)
        saved = t.detach()
        packed.append(weakref.ref(saved))
        return saved

    with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = forward()
    alive = [t for t in (r() for r in packed) if t is not None]
    storages = {s.data_ptr(): s.nbytes() for s in (t.untyped_storage() for t in alive)}
    del alive, out
    return sum(n for ptr, n in storages.items() if ptr and ptr not in skip)


def model_tensors(model: torch.nn.Module) -> list[Tensor]:
    """Parameters and buffers of ``model`` (to exclude from :func:`saved_activation_bytes`)."""
    return [*model.parameters(), *model.buffers()]


def cuda_peak_memory(step: Callable[[], object], device: torch.device) -> dict[str, int]:
    """Peak CUDA memory of one untimed ``step()``.

    Returns:
        ``peak_allocated`` and ``peak_reserved`` in bytes, ``alloc_retries`` and ``ooms`` counts
        (from ``torch.cuda.memory_stats``) of that step.

    Raises:
        ValueError: ``device`` is not a CUDA device.
    """
    if device.type != "cuda":
        raise ValueError(f"cuda_peak_memory needs a CUDA device, got {device}")
    torch.cuda.synchronize(device)
    before = torch.cuda.memory_stats(device)
    torch.cuda.reset_peak_memory_stats(device)
    step()
    torch.cuda.synchronize(device)
    after = torch.cuda.memory_stats(device)
    return {
        "peak_allocated": torch.cuda.max_memory_allocated(device),
        "peak_reserved": torch.cuda.max_memory_reserved(device),
        "alloc_retries": after.get("num_alloc_retries", 0) - before.get("num_alloc_retries", 0),
        "ooms": after.get("num_ooms", 0) - before.get("num_ooms", 0),
    }


def cuda_memory_snapshot(step: Callable[[], object], path: Path | str, max_entries: int = 100_000) -> Path:
    """Record the CUDA allocator's history over one ``step()`` and dump it to ``path`` (a pickle
    that https://pytorch.org/memory_viz opens). Recording is switched off afterwards, also on error.

    Args:
        step: one step on a CUDA device.
        path: the ``.pickle`` file to write.
        max_entries: allocator events kept (the oldest are dropped).

    Raises:
        ValueError: no CUDA device is available.
    """
    if not torch.cuda.is_available():
        raise ValueError("cuda_memory_snapshot needs a CUDA device")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.cuda.synchronize()
    torch.cuda.memory._record_memory_history(max_entries=max_entries, stacks="python")
    try:
        step()
        torch.cuda.synchronize()
        torch.cuda.memory._dump_snapshot(str(path))
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    return path


def available_bytes(device: torch.device) -> int:
    """Free memory of ``device`` in bytes: ``cudaMemGetInfo`` on CUDA, ``MemAvailable`` of
    ``/proc/meminfo`` on a CPU (else the free physical pages)."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    with contextlib.suppress(OSError):  # no /proc (not Linux): the free physical pages below
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
