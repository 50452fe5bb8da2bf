"""Multi-process training with DistributedDataParallel under ``torchrun`` (``routerbench train``).

``torchrun --nproc_per_node=N $(which routerbench) train …`` starts N processes with ``RANK``,
``LOCAL_RANK``, ``WORLD_SIZE`` (and the rendezvous address) in their environment. The train command
calls :func:`init` once: when ``WORLD_SIZE`` > 1 it joins the process group (NCCL on CUDA, each rank
on ``cuda:LOCAL_RANK``; gloo on a CPU). Without torchrun nothing happens: world size 1, rank 0, no
process group, and every helper here is a no-op that returns its input.

What is global and what is per rank (``harness/training/run.py``):

- every rank draws the **same** global batch from the run's seeded generator and trains on its own
  contiguous slice of rows (:func:`rank_slice`), so the data a run sees does not depend on the world
  size, and a run may resume on another world size;
- DDP averages gradients over ranks: with equal slices the average of the slice means is the mean
  over the global batch, so the gradient (and the clipped norm) is that of a single process;
- losses are reduced by :func:`mean_over_ranks`, which gathers the values and sums them in rank
  order on every rank, so every rank holds bitwise the same number and takes the same
  divergence/target decision (a rank that stopped alone would deadlock the others);
- decisions that read local state (the schedule, the resume point, what is already done) are made
  on rank 0 and sent with :func:`broadcast_object`;
- only rank 0 writes (records, checkpoints, manifest, report): the others hold a
  :class:`harness.rundir.writer.NullRunWriter`.
"""

from __future__ import annotations

import os
from typing import Any, Sequence

import torch
import torch.distributed as dist

#: The environment variables torchrun sets (``WORLD_SIZE`` > 1 turns DDP on).
ENV_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def env_world_size() -> int:
    """The world size torchrun asked for (``WORLD_SIZE``; 1 without torchrun), readable before
    :func:`init` (options are checked against it before any model is built)."""
    try:
        return max(1, int(os.environ.get("WORLD_SIZE", "1")))
    except ValueError:
        return 1


def env_rank() -> int:
    """This process's rank as torchrun set it (``RANK``; 0 without torchrun), readable before
    :func:`init`."""
    try:
        return int(os.environ.get("RANK", "0"))
    except ValueError:
        return 0


def active() -> bool:
    """Whether this process is in an initialised process group."""
    return dist.is_available() and dist.is_initialized()


def world_size() -> int:
    """Processes training together (1 without a process group)."""
    return dist.get_world_size() if active() else 1


def rank() -> int:
    """This process's rank (0 without a process group)."""
    return dist.get_rank() if active() else 0


def is_main() -> bool:
    """Rank 0: the process that writes and decides."""
    return rank() == 0


def backend_for(device: torch.device) -> str:
    """The collective backend of ``device``: ``nccl`` on CUDA, ``gloo`` elsewhere."""
    return "nccl" if torch.device(device).type == "cuda" else "gloo"


def init(device: torch.device) -> torch.device:
    """Join torchrun's process group when ``WORLD_SIZE`` > 1 (once per process) and return the
    device this rank trains on: ``cuda:LOCAL_RANK`` on CUDA (whatever index ``--device`` named),
    ``device`` itself on a CPU. Without torchrun: ``device``, and nothing else happens."""
    device = torch.device(device)
    if env_world_size() <= 1:
        return device
    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    if not active():
        kwargs = {"device_id": device} if device.type == "cuda" else {}
        dist.init_process_group(backend_for(device), **kwargs)
    return device


def shutdown() -> None:
    """Leave the process group (all ranks together, at the end of the command)."""
    if active():
        dist.destroy_process_group()


def describe(device: torch.device) -> dict[str, Any]:
    """The manifest's entry: ``world_size`` and the collective ``backend`` (None when alone)."""
    n = world_size()
    return {"world_size": n, "backend": backend_for(device) if n > 1 else None}


def barrier(device: torch.device | None = None) -> None:
    """Wait for every rank (and, on CUDA, for the work queued on ``device``)."""
    if not active():
        return
    dist.barrier()
    if device is not None and torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def _device_of_group() -> torch.device:
    """Where collective tensors must live: the current CUDA device under NCCL, else the CPU."""
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def gather_floats(values: Sequence[float]) -> list[list[float]]:
    """Every rank's ``values`` (float64), indexed by rank; ``[values]`` without a process group."""
    if not active():
        return [list(map(float, values))]
    mine = torch.tensor([float(v) for v in values], dtype=torch.float64, device=_device_of_group())
    out = [torch.empty_like(mine) for _ in range(world_size())]
    dist.all_gather(out, mine)
    return [t.tolist() for t in out]


def mean_over_ranks(value: float) -> float:
    """The mean of ``value`` over ranks, the same bits on every rank (gathered, then summed in rank
    order everywhere); ``value`` itself without a process group."""
    if not active():
        return value
    vals = [v[0] for v in gather_floats([value])]
    return sum(vals) / len(vals)


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """Rank ``src``'s ``obj`` on every rank (picklable); ``obj`` itself without a process group."""
    if not active():
        return obj
    box = [obj if rank() == src else None]
    dist.broadcast_object_list(box, src=src,
                               device=_device_of_group() if dist.get_backend() == "nccl" else None)
    return box[0]


def rank_slice(batch_size: int) -> slice:
    """This rank's contiguous rows of a global batch: ``[r·B/W, (r+1)·B/W)``.

    Raises:
        ValueError: ``batch_size`` not divisible by the world size (the options are checked
            before, with a message naming them).
    """
    n, r = world_size(), rank()
    if batch_size % n:
        raise ValueError(f"a global batch of {batch_size} does not split over {n} processes")
    per = batch_size // n
    return slice(r * per, (r + 1) * per)


def wrap(model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """``model`` in DistributedDataParallel: gradients as views of its all-reduce buckets (no
    second copy of them), buffers (the rotary tables, equal on every rank) not synchronised at
    each forward."""
    import inspect

    from torch.nn.parallel import DistributedDataParallel
    params = inspect.signature(DistributedDataParallel.__init__).parameters
    buffers = {"forward_sync_buffers": False} if "forward_sync_buffers" in params else {"broadcast_buffers": False}
    return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None,
                                   gradient_as_bucket_view=True, **buffers)
