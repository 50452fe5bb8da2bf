"""The parts every command's spec shares: shape, routers and their options, output."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Iterable

import torch

from routers import ROUTERS, check_router_options, router_class
from routers.errors import ConfigError
from workloads.config import DTYPES, GRIDS, PRESETS, WORKLOADS, DecoderConfig, preset

from .base import Labels, option


#: Sanity bounds of the shape options (far beyond any model this harness measures; they turn a
#: typo such as an extra zero into a one-line error instead of an allocation failure).
MAX_WIDTH, MAX_DEPTH, MAX_TOKENS = 1 << 16, 1 << 12, 1 << 24


@dataclass(frozen=True)
class Shape:
    """The decoder shape options shared by every command (``[shape]``)."""

    preset: str | None = option("str", "Base shape, one of `routerbench list`'s presets: its sizes are the "
                                "defaults of the other shape options. Default: cpu-train for train; for run "
                                "and profile, the base shape of this device's grid (cpu-quick on a CPU).",
                                choices=lambda: tuple(PRESETS), metavar="NAME")
    n_heads: int | None = option("int", "Attention heads (default: the base shape's).", min=1, max=MAX_WIDTH)
    seq_len: int | None = option("int", "Tokens per sequence (default: the base shape's).", min=1,
                                 max=MAX_TOKENS)
    batch_size: int | None = option("int", "Sequences per step (default: the base shape's).", min=1,
                                    max=MAX_TOKENS)
    dtype: str | None = option("str", "float32, bfloat16, float16 or float64 (default: the base "
                               "shape's).", choices=tuple(DTYPES), metavar="DTYPE")
    workload: str | None = option("str", "decoder (default), or router_only (every sublayer is its "
                                  "input RMSNorm: routing cost alone).", choices=WORKLOADS)
    grad_checkpoint: bool | None = option("bool", "Recompute sublayers in backward (saves "
                                          "activations); default off.")


@dataclass(frozen=True)
class Grid(Shape):
    """A width × depth grid (``routerbench run``)."""

    widths: tuple[int, ...] | None = option("ints", "Comma-separated d_model values (default: this "
                                            "device's grid).", min=1, max=MAX_WIDTH)
    depths: tuple[int, ...] | None = option("ints", "Comma-separated n_layers values (default: this "
                                            "device's grid).", min=1, max=MAX_DEPTH)


@dataclass(frozen=True)
class Single(Shape):
    """One shape (``routerbench train`` and ``profile``)."""

    d_model: int | None = option("int", "Width (default: the base shape's).", min=1, max=MAX_WIDTH)
    n_layers: int | None = option("int", "Layers (default: the base shape's).", min=1, max=MAX_DEPTH)


@dataclass(frozen=True)
class RouterSet:
    """Routers and their options (``[routers]``; ``[routers.router_options.haares]`` in TOML)."""

    routers: tuple[str, ...] | None = option("strs", "Comma-separated routers (`routerbench list`).",
                                             choices=lambda: tuple(sorted(ROUTERS)))
    router_options: dict | None = option("table", 'JSON per router: \'{"haares": {"n_blocks": 2}}\'.')


@dataclass(frozen=True)
class Output:
    """Where results go and how the command talks (``[output]``; ``out`` and ``run_id`` are never
    written to ``spec.toml``, so a spec repeats a run into a new directory)."""

    device: str | None = option("str", "cpu or cuda[:N] (default: cuda if visible).", metavar="DEV")
    out: str | None = option("str", "Results root (default: results).", metavar="DIR")
    run_id: str | None = option("str", "Run id, one name of letters, digits, '.', '_', '-'; an existing "
                                "run is resumed (default: UTC time and pid).", metavar="ID")
    report: bool | None = option("bool", "Write the report at the end (default: on).")
    quiet: bool | None = option("bool", "No progress bars (default: off).")


#: Output options never written to ``spec.toml``: a spec repeats a run into a new directory.
NOT_IN_FILE = ("output.out", "output.run_id")

#: The shape options every command shares, as :class:`DecoderConfig` fields.
SHARED_SHAPE = ("n_heads", "seq_len", "batch_size", "dtype", "workload", "grad_checkpoint")


RUN_ID_CHARS = "at most 120 of A-Z a-z 0-9 . _ -"


def check_output(out: "Output", L: Labels) -> None:
    """``--run-id`` is one path component of letters, digits, ``.``, ``_`` and ``-``, and
    ``--out`` is not empty.

    Raises:
        ConfigError: naming the option.
    """
    import re
    rid = out.run_id
    if rid is not None and (not re.fullmatch(r"[A-Za-z0-9._-]{1,120}", rid) or rid.startswith(".")):
        raise ConfigError(f"{L('output.run_id')} {rid!r}: a run id is one name of {RUN_ID_CHARS} "
                          "(no '/', not starting with '.'); e.g. --run-id baseline-1")
    if out.out is not None and not out.out.strip():
        raise ConfigError(f"{L('output.out')} must name a directory, got {out.out!r}")


def resolve_device(name: str | None, label: str = "--device") -> torch.device:
    """The torch device named by ``--device`` (default: CUDA when visible, else CPU).

    Raises:
        ConfigError: not a device name, or CUDA asked for where none is visible.
    """
    if name is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(name)
    except (RuntimeError, ValueError):
        raise ConfigError(f"{label} {name!r} is not a torch device (cpu, cuda, cuda:1)") from None
    if dev.type not in ("cpu", "cuda"):
        raise ConfigError(f"{label} {name!r}: only cpu and cuda[:N] are measured")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"{label} {name}: no CUDA device is visible; use --device cpu")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ConfigError(f"{label} {name}: only {torch.cuda.device_count()} CUDA device(s) visible")
    return dev


def default_grid(device: torch.device) -> dict:
    """The width × depth grid of ``routerbench run`` for this kind of device."""
    return GRIDS["cuda-default" if device.type == "cuda" else "cpu-default"]


def preset_base(shape: Shape, device: torch.device, default_preset: str | None = None) -> DecoderConfig:
    """The preset the shape starts from: ``--preset``, else ``default_preset``, else the device
    grid's base, before any option is applied."""
    name = shape.preset or default_preset
    return preset(name) if name else default_grid(device)["base"]


def base_shape(shape: Shape, device: torch.device, default_preset: str | None = None,
               **fields: Any) -> DecoderConfig:
    """:func:`preset_base` with the shared shape options and ``fields`` (``d_model``,
    ``n_layers``) applied at once, so it is validated with the width it will run at.

    Raises:
        ConfigError: an invalid shape (call :func:`check_heads` first for a message that names
            the command's options).
    """
    return preset_base(shape, device, default_preset).replace(
        **{k: getattr(shape, k) for k in SHARED_SHAPE if getattr(shape, k) is not None}, **fields)


def resolved_shape(shape: Shape, base: DecoderConfig, **fields: Any) -> Shape:
    """``shape`` with every shared option set to the base config's effective value, plus ``fields``."""
    return replace(shape, **{k: getattr(base, k) for k in SHARED_SHAPE}, **fields)


def absolute(path: str | None) -> str | None:
    """A path as written to ``spec.toml``: absolute, so the spec repeats the run from anywhere."""
    return None if path is None else str(Path(path).expanduser().resolve())


def check_heads(widths: Iterable[int], heads: int, L: Labels, width_path: str) -> None:
    """Every width must split into ``heads`` heads of an even size (rotary positions).

    Raises:
        ConfigError: naming the width option (``--widths`` or ``--d-model``) and ``--n-heads``.
    """
    for d in widths:
        if d % heads:
            raise ConfigError(f"{L(width_path)} {d} is not divisible by {L('shape.n_heads')} {heads}; "
                              "change one of them")
        if (d // heads) % 2:
            raise ConfigError(f"{L(width_path)} {d} with {L('shape.n_heads')} {heads} gives head size "
                              f"{d // heads}; rotary positions need an even head size: change one of them")


def offered_impls(selected: Iterable[str]) -> set[str]:
    """The implementations offered by at least one of the ``selected`` routers (their own and the
    peers' adapters)."""
    from routers.impls import impls_for
    selected = list(selected)
    return {i.name for r in selected for i in impls_for(r)} | {i for r in selected for i in router_class(r).impls}


def check_router_set(rs: RouterSet, selected: tuple[str, ...], depths: Iterable[int], width: int,
                     L: Labels, impls: tuple[str, ...] | None = None) -> None:
    """Router options: known routers, selected routers only, known option names, types and values.

    Raises:
        ConfigError: naming ``--router-options`` (or its TOML key).
    """
    label = L("routers.router_options")
    if impls is not None:  # an impl that no selected router offers would be dropped without a word
        offered = offered_impls(selected)
        unused = [i for i in impls if i not in offered]
        if unused:
            raise ConfigError(f"{L('sweep.impls')}: {', '.join(unused)} is offered by none of "
                              f"{L('routers.routers')} ({', '.join(selected)}); add a router that has it or drop it")
    for name, opts in (rs.router_options or {}).items():
        if name not in ROUTERS:
            raise ConfigError(f"{label}: unknown router {name!r}; known routers: {', '.join(sorted(ROUTERS))}")
        if name not in selected:
            raise ConfigError(f"{label}: options for {name!r}, which {L('routers.routers')} does not select "
                              f"({', '.join(selected)}); add it there or drop its options")
        if not isinstance(opts, dict):
            raise ConfigError(f"{label}: the options of {name!r} must be an object of option names, "
                              f"got {opts!r}")
        if impls is not None and "impl" in opts and opts["impl"] not in impls:
            raise ConfigError(f"{label}: {name}.impl = {opts['impl']!r} contradicts --impls "
                              f"{','.join(impls)}; drop one of them")
        for n_layers in sorted(set(depths)):
            check_router_options(name, opts, width, n_layers, label)


def impl_names() -> tuple[str, ...]:
    """Every implementation name some router offers: the routers' built-ins and every registered
    peer kernel (``routers/impls.py``; available here or not)."""
    from routers.impls import names
    return tuple(sorted({i for n in ROUTERS for i in router_class(n).impls} | set(names())))
