"""Ops per step: what an eager step dispatches, and on CUDA the kernels it launches (DESIGN.md,
"Metrics": ``ops_fwd``, ``ops_bwd``, ``kernels_fwd_bwd``).

On a GPU the eager step of a router is host-bound: each dispatched op costs a kernel launch plus
Python and dispatcher overhead whatever its FLOPs or bytes, so when the host is slower than the
device an eager step takes about (ops per step) × (host cost per op). These counts explain eager
time ratios; graph replay and ``torch.compile`` remove that host cost and measure the device's.

What is counted (:class:`OpCounter`, a ``TorchDispatchMode``, so below autograd):

- every aten (and prims) op call, views (``view``, ``expand``, ``t``, ``transpose``, ``detach``…)
  and factory functions included, as the device runs them: composite ops arrive decomposed as on
  that device (``F.rms_norm`` is several ops on a CPU, one fused op on CUDA);
- the ops of custom ``torch.autograd.Function`` forwards and backwards (they dispatch as any op);
- a ``torch.library.custom_op`` (also ``triton_op``) call counts as **one** op, and its Python
  implementation for the tensors' device is then run under the counter, so the aten ops it calls
  count too (a Triton kernel launch inside it is no aten op and is not counted). An op of another
  namespace with no such Python implementation (a C++ extension's) counts as one op: its insides
  are not seen (the mode is off inside its own handling).

Counts depend on the device type and on the torch version (decompositions, fused kernels and
autograd formulas change between releases): compare them within one device and one torch.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from typing import Any, Callable, Iterable, Iterator

import torch
from torch import Tensor, nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from harness.step.modes import lm_loss, make_step

#: Namespaces of the ops the device runs directly (anything else is a custom op).
CORE_NAMESPACES = ("aten", "prims")
#: Substrings of the names of CUDA runtime / driver calls that launch work on the device
#: (``cudaLaunchKernelExC`` and ``cuLaunchKernelEx`` match too).
LAUNCH_NAMES = ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchCooperativeKernel", "cudaGraphLaunch",
                "cuGraphLaunch")


def _custom_impl(func: Any, args: tuple, kwargs: dict) -> Callable | None:
    """The Python implementation of a ``torch.library.custom_op`` for the device of its tensors,
    or None (an aten op, or a custom op without one)."""
    if getattr(func, "namespace", "aten") in CORE_NAMESPACES:
        return None
    from torch._library.custom_ops import _maybe_get_opdef
    try:
        opdef = _maybe_get_opdef(func)
    except Exception:  # noqa: BLE001 - not an OpOverload (e.g. a higher-order op): counted once
        return None
    if opdef is None:
        return None
    device = next((t.device.type for t in tree_flatten((args, kwargs))[0] if isinstance(t, Tensor)), None)
    fns = opdef._backend_fns
    return fns.get(device) or fns.get(None)


class OpCounter(TorchDispatchMode):
    """Counts the ops dispatched while it is active (see the module docstring for what counts).

    Attributes:
        total: ops counted (int).
        by_op: op name (``aten.add.Tensor``) -> calls.
        custom: the custom ops among them (name -> calls), each also in ``by_op``.
    """

    def __init__(self) -> None:
        super().__init__()
        self.total = 0
        self.by_op: Counter[str] = Counter()
        self.custom: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = str(func)
        self.total += 1
        self.by_op[name] += 1
        if getattr(func, "namespace", "aten") not in CORE_NAMESPACES:
            self.custom[name] += 1
        impl = _custom_impl(func, args, kwargs)
        if impl is None:
            return func(*args, **kwargs)
        with self:  # the mode is off while it handles an op: re-enter it for the op's insides
            return impl(*args, **kwargs)


def count_ops(fn: Callable[[], object]) -> int:
    """Ops dispatched by ``fn()`` (:class:`OpCounter`), e.g. ``(x + 1).view(-1).sum()`` is 3
    (add, view, sum). Count of ops, an int; depends on the device and the torch version."""
    with OpCounter() as counter:
        fn()
    return counter.total


@contextlib.contextmanager
def _untouched(model: nn.Module, device: torch.device) -> Iterator[None]:
    """Leave ``model``'s train flag, its parameters' ``.grad`` and the RNG state (CPU and, on
    CUDA, ``device``'s) as they were before the block."""
    params = list(model.parameters())
    grads = [p.grad for p in params]
    training = model.training
    on = [device] if device.type == "cuda" else []
    try:
        with torch.random.fork_rng(devices=on):
            for p in params:
                p.grad = None
            yield
    finally:
        for p, g in zip(params, grads):
            p.grad = g
        model.train(training)


def count_ops_step(model: nn.Module, x: Tensor, y: Tensor,
                   loss_fn: Callable[[Tensor, Tensor], Tensor] = lm_loss) -> dict[str, int]:
    """Ops dispatched by one eager training step of ``model``, forward and backward apart.

    Args:
        model: an eager (uncompiled) decoder; put in train mode for the count.
        x: token ids (B, T) on the model's device; the counts hold for this shape, the model's
            dtype and this device.
        y: targets (B, T).
        loss_fn: logits (B, T, V), targets (B, T) -> scalar loss (default: the project's
            :func:`harness.step.modes.lm_loss`, what ``fwd_bwd`` runs).

    Returns:
        ``{"fwd": n, "bwd": n}``: ops (counts, :class:`OpCounter`) of ``model(x)`` with grad
        enabled, and of ``loss.backward()`` (its seed gradient, the loss's and the model's backward
        formulas, the accumulation into ``.grad``, a checkpointed recompute). The loss's own forward
        is in neither. Counts depend on the device and the torch version.

    The model is left as it was: train flag, parameters, their ``.grad`` (set to None for the
    count, then restored) and the RNG state (forked).
    """
    with _untouched(model, x.device):
        model.train()
        with torch.enable_grad():
            with OpCounter() as fwd:
                logits = model(x)
            loss = loss_fn(logits, y)
            del logits
            with OpCounter() as bwd:
                loss.backward()
    return {"fwd": fwd.total, "bwd": bwd.total}


def launch_count(events: Iterable[Any]) -> int:
    """Kernel launches among profiler events (``torch.profiler.profile(...).events()``, or any
    objects with ``name`` and ``device_type``): the CUDA runtime / driver launch calls
    (:data:`LAUNCH_NAMES`) on the host; when the trace holds none of those, the device's kernel
    events (``device_type`` CUDA, memory copies and sets left out)."""
    events = list(events)
    host = sum(any(n in str(e.name) for n in LAUNCH_NAMES) for e in events)
    if host:
        return host
    cuda = torch.autograd.DeviceType.CUDA
    return sum(getattr(e, "device_type", None) == cuda and not str(e.name).lower().startswith(("memcpy", "memset"))
               for e in events)


def count_kernel_launches(model: nn.Module, x: Tensor, y: Tensor) -> int | None:
    """Kernel launches of one eager ``fwd_bwd`` step (:func:`harness.step.modes.make_step`) of
    ``model`` on (x, y), from ``torch.profiler`` (:func:`launch_count`), after one unprofiled step
    (lazy initialisation, cuBLAS handles). A count; None unless ``x`` is on a CUDA device. The
    model is left as it was (see :func:`count_ops_step`). Depends on the device and the torch
    version."""
    if x.device.type != "cuda":
        return None
    from torch.profiler import ProfilerActivity, profile
    with _untouched(model, x.device):
        step = make_step(model, "fwd_bwd", x, y)
        step()
        torch.cuda.synchronize(x.device)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            step()
            torch.cuda.synchronize(x.device)
        return launch_count(prof.events())
