"""The spec of ``routerbench kernels``: each ``fused`` kernel alone, and each peer per op, at a shape
(docs/IMPLS.md, "Each kernel alone")."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

from .base import Labels, option

#: The routers whose fused kernels are measured when none are named.
FUSED_ROUTERS = ("block_attnres", "haares", "wav_v1")
#: The shape on CUDA (the byte rule's reference, docs/MEASUREMENT.md) and on a CPU (the interpreter
#: runs a kernel a program at a time: a tiny shape).
CUDA_SHAPE = {"d_model": 1024, "n_layers": 12, "tokens": 8192, "dtype": "bfloat16"}
CPU_SHAPE = {"d_model": 64, "n_layers": 4, "tokens": 16, "dtype": "float32"}


@dataclass(frozen=True)
class KernelRuns:
    """What is measured (``[kernels]``)."""

    routers: tuple[str, ...] | None = option("strs", "Routers whose fused kernels are measured (default: "
                                             "block_attnres,haares,wav_v1).", choices=FUSED_ROUTERS)
    d_model: int | None = option("int", "Width d (default: 1024 on CUDA, 64 on a CPU).", min=8)
    n_layers: int | None = option("int", "Transformer layers (default: 12 on CUDA, 4 on a CPU).", min=1)
    tokens: int | None = option("int", "Rows B·T (default: 8192 on CUDA, 16 on a CPU).", min=1)
    dtype: str | None = option("str", "float32 or bfloat16 (default: bfloat16 on CUDA, float32 on a CPU).",
                               choices=("float32", "bfloat16"))
    repeats: int | None = option("int", "Timed samples of each kernel, CUDA (default: 20).", min=3)
    peers: bool | None = option("bool", "Time each peer depth mixer available here per op, CUDA (default: on).")


@dataclass(frozen=True)
class KernelsSpec:
    """Everything ``routerbench kernels`` needs; :meth:`resolve` fills in the device's defaults."""

    COMMAND: ClassVar[str] = "kernels"
    NOT_IN_FILE: ClassVar[tuple[str, ...]] = ()

    kernels: KernelRuns = KernelRuns()

    def resolve(self, L: Labels) -> "KernelsSpec":
        """Fill in the device's defaults and check the width.

        Raises:
            ConfigError: a width the fused kernels are not compiled for (over
                ``routers.block.fused_launch.MAX_D``), naming ``--d-model``.
        """
        import torch

        from routers.block import fused_launch
        from routers.errors import ConfigError
        k = self.kernels
        base = CUDA_SHAPE if torch.cuda.is_available() else CPU_SHAPE
        d = k.d_model or base["d_model"]
        if d > fused_launch.MAX_D:
            raise ConfigError(f"{L('kernels.d_model')}: d = {d} is wider than the {fused_launch.MAX_D} the fused "
                              "kernels are compiled and checked for; give a width up to it")
        return replace(self, kernels=replace(
            k, routers=k.routers or FUSED_ROUTERS, d_model=k.d_model or base["d_model"],
            n_layers=k.n_layers or base["n_layers"], tokens=k.tokens or base["tokens"],
            dtype=k.dtype or base["dtype"], repeats=k.repeats or 20, peers=k.peers is not False))
