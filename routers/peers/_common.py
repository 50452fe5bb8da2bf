"""Helpers shared by the peer adapters (a private module: ``routers.impls`` loads only the modules
of this package whose name does not start with ``_``).

Nothing here imports a peer package at module import; each helper imports lazily.
"""

from __future__ import annotations

import importlib
import os
from typing import Callable

import torch
from torch import Tensor

from ..impls import Impl


def interpreting() -> bool:
    """Whether Triton's interpreter is on (``TRITON_INTERPRET=1``: kernels run on CPU tensors)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def import_reason(dist: str, module: str) -> str | None:
    """None when ``module`` imports, else why not, naming the distribution ``dist``.

    Any exception counts (a peer package can fail at import for reasons other than being absent:
    an undeclared dependency, a Triton without a driver).
    """
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as exc:
        top = module.split(".")[0]
        if exc.name is not None and (exc.name == top or exc.name.startswith(top + ".")):
            return (f"{dist} is not installed (import {module}: {exc}); "
                    "pip install -e '.[kernels]' in the checkout")
        return f"{dist} failed to import: ModuleNotFoundError: {exc}"
    except Exception as exc:  # noqa: BLE001 - any failure of a peer package makes it unavailable
        return f"{dist} failed to import: {type(exc).__name__}: {exc}"
    return None


def triton_device_reason(dist: str) -> str | None:
    """For a Triton kernel that also runs under Triton's interpreter: None when CUDA is here or
    ``TRITON_INTERPRET=1`` is set (the registry then adds ``cpu`` to its devices), else why not."""
    if torch.cuda.is_available() or interpreting():
        return None
    return (f"{dist}: no CUDA device here (a Triton kernel: set TRITON_INTERPRET=1 to run it on "
            "CPU through Triton's interpreter, slowly, at test sizes)")


def cuda_only_reason(dist: str, refusal: str) -> str | None:
    """For a kernel that refuses CPU tensors even under Triton's interpreter: None when CUDA is
    here, else why not (``refusal``: what the package does with CPU tensors)."""
    if torch.cuda.is_available():
        return None
    if interpreting():
        return (f"{dist}: needs a CUDA device, even under TRITON_INTERPRET=1 ({refusal}), "
                "and none is here")
    return f"{dist}: needs a CUDA device ({refusal}), and none is here"


def no_bias(name: str, bias: Tensor | None) -> None:
    """Refuse a per-source logit bias (the kernel cannot add one).

    Raises:
        ValueError: ``bias`` is given.
    """
    if bias is not None:
        raise ValueError(f"impl {name}: the kernel takes no per-source logit bias "
                         "(haares / wav_v1 detail bias); it implements block_attnres and full_attnres only")


#: Every mode: the naive-schedule peers all have a backward.
ALL_MODES = ("fwd", "fwd_bwd", "train_step", "decode")


def depth_mixer_impl(name: str, dist: str, kernel: Callable[[tuple, Tensor, Tensor | None, float], Tensor],
                     probe: Callable[[], str | None], dtypes: tuple[str, ...], conventions: str,
                     interpretable: bool = False) -> Impl:
    """The :class:`routers.impls.Impl` of a kernel that replaces ``routers.mixer.depth_mix`` in the
    naive schedule of ``block_attnres`` and ``full_attnres`` on CUDA.

    ``kernel(sources, query, key_gain, eps) -> h`` calls the package; the mixer around it refuses a
    per-source bias (:func:`no_bias`; none of the peers takes one, so they implement no detail
    router), returns a read over one source as that source without calling the kernel (as
    ``depth_mix`` does; FLA#883 was a wrong single-source read), and casts the result to the
    sources' dtype (kernels that return bfloat16 whatever the input)."""
    def mix(sources: tuple[Tensor, ...], query: Tensor, bias: Tensor | None, key_gain: Tensor | None,
            eps: float) -> Tensor:
        no_bias(name, bias)
        if len(sources) == 1:
            return sources[0]  # softmax over one source is 1
        return kernel(sources, query, key_gain, eps).to(sources[0].dtype)
    mix.__doc__ = kernel.__doc__
    return Impl(name=name, routers=("block_attnres", "full_attnres"), schedule="naive", mix=mix,
                devices=("cuda",), dtypes=dtypes, modes=ALL_MODES, package=dist, probe=probe,
                conventions=conventions, interpretable=interpretable)
