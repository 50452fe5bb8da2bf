"""Implementations of the block routers: the built-in ``naive`` and ``two_phase`` schedules and
peer kernels plugged into them, each registered with its availability (issue: "peer kernels as
implementations, each proven equal to the reference before it is timed").

An implementation runs one of the two schedules of :class:`routers.attnres.BlockAttnRes`:

- ``schedule="naive"``: every read stacks its sources and mixes them. A peer replaces the depth
  mixer of that read (:func:`routers.mixer.depth_mix`) by its ``mix`` callable, with the same
  arguments: ``mix(sources, query, bias, key_gain, eps) -> h`` (sources n × (B, T, d), query (d,),
  bias (n,) or None, key_gain (d,) or None; h (B, T, d) in the sources' dtype). The sublayer's
  own input norm belongs to the workload: a peer must not fuse it.
- ``schedule="two_phase"``: a peer replaces the two phases of ``routers/two_phase.py`` by its
  ``phases = (phase1, phase2)``, with the signatures of :func:`routers.two_phase.phase1` and
  :func:`routers.two_phase.phase2`. The built-in ``lean`` runs this schedule too, with its own
  phases, inverse RMS and readout as custom autograd Functions (``backward="recompute"``).

An adapter is one module of ``routers/peers/`` that defines ``IMPL`` (an :class:`Impl`): it imports
its package lazily inside ``probe`` (any exception, not only ``ImportError``, makes it
unavailable with the reason: Triton without a GPU may raise ``RuntimeError``), declares the
devices, dtypes and modes it supports, and says in ``conventions`` where the kernel's conventions
differ from ours (ε, key-norm weight, temperature, output dtype) and how the adapter maps them.
Every implementation but ``naive`` is checked against ``naive`` before it is timed
(:mod:`harness.sweep.parity`).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import os
import pkgutil
from dataclasses import dataclass, field
from typing import Callable, Iterator

from .errors import ConfigError

#: The routers of the Attention Residuals family that take an ``impl`` (their class's ``impls``
#: lists the built-in ones).
BLOCK_ROUTERS = ("block_attnres", "full_attnres", "haares", "wav_v1")


@dataclass(frozen=True)
class Impl:
    """One implementation of the block routers.

    Attributes:
        name: the ``impl`` option's value (``--impls``).
        routers: routers it implements.
        schedule: ``"naive"`` or ``"two_phase"`` (the schedule it plugs into).
        mix: for the naive schedule, the depth mixer (module doc); None for the built-in.
        phases: for the two_phase schedule, ``(phase1, phase2)``; None for the built-in.
        devices: device types it runs on (``"cpu"``, ``"cuda"``).
        dtypes: dtype names it supports (``"float32"``, ``"bfloat16"``, …).
        modes: modes it supports (``fwd``, ``fwd_bwd``, ``train_step``, ``decode``).
        package: the distribution it comes from (its version goes into the manifest), or None.
        probe: returns None when usable here, else why not (imports the package lazily).
        conventions: where the kernel's conventions differ from ours and what the adapter does.
        builtin: part of routerbench (never unavailable).
        interpretable: a Triton kernel that also runs on CPU tensors under Triton's interpreter
            (``TRITON_INTERPRET=1``); some Triton-based packages refuse CPU tensors even then.
        backward: ``"autograd"`` (autograd differentiates the forward's ops) or ``"recompute"``
            (custom autograd Functions keep the sources once and a few statistics, and recompute
            the rest: ``lean``, ``routers/lean.py``).
    """

    name: str
    routers: tuple[str, ...]
    schedule: str
    mix: Callable | None = None
    phases: tuple[Callable, Callable] | None = None
    devices: tuple[str, ...] = ("cpu", "cuda")
    dtypes: tuple[str, ...] = ("float32", "float64", "bfloat16", "float16")
    modes: tuple[str, ...] = ("fwd", "fwd_bwd", "train_step", "decode")
    package: str | None = None
    probe: Callable[[], str | None] = field(default=lambda: None)
    conventions: str = ""
    builtin: bool = False
    interpretable: bool = False
    backward: str = "autograd"

    @property
    def opaque(self) -> bool:
        """Whether fvcore cannot see this impl's ops (a peer's kernels or custom ops, or custom
        autograd Functions, which its trace records as one opaque call): its FLOPs are counted
        on its naive twin (``harness.sweep.prepare.naive_twin``)."""
        return not self.builtin or self.backward != "autograd"

    def version(self) -> str | None:
        """The installed version of :attr:`package`, or None."""
        if self.package is None:
            return None
        try:
            return importlib.metadata.version(self.package)
        except importlib.metadata.PackageNotFoundError:
            return None

    def unavailable_reason(self, device: str | None = None, dtype: str | None = None,
                           mode: str | None = None) -> str | None:
        """Why this implementation cannot run a case here (package, device, dtype or mode), or
        None when it can. The package probe runs first, lazily; any exception it raises is the
        reason."""
        try:
            why = self.probe()
        except Exception as exc:  # noqa: BLE001 - any failure of a peer package makes it unavailable
            why = f"{self.package or self.name} failed to load: {type(exc).__name__}: {exc}"
        if why:
            return why
        kind = None if device is None else str(device).split(":")[0]
        if kind is not None and kind not in self.devices_here():
            return f"impl {self.name} runs on {', '.join(self.devices_here())}, not {kind}"
        if dtype is not None and dtype not in self.dtypes:
            return f"impl {self.name} supports {', '.join(self.dtypes)}, not {dtype}"
        if mode is not None and mode not in self.modes:
            return f"impl {self.name} supports modes {', '.join(self.modes)}, not {mode}"
        return None

    def devices_here(self) -> tuple[str, ...]:
        """:attr:`devices`, plus ``cpu`` for an :attr:`interpretable` kernel under
        ``TRITON_INTERPRET=1`` (Triton's interpreter runs kernels on CPU tensors: slow, for tests
        at tiny shapes)."""
        if self.interpretable and "cpu" not in self.devices and os.environ.get("TRITON_INTERPRET") == "1":
            return self.devices + ("cpu",)
        return self.devices


#: name -> implementation, built-ins first, then every adapter of ``routers/peers/``.
IMPLS: dict[str, Impl] = {}


def register(impl: Impl) -> Impl:
    """Add ``impl`` to :data:`IMPLS`.

    Raises:
        ValueError: the name is taken, or the schedule is unknown.
    """
    if impl.name in IMPLS and IMPLS[impl.name] is not impl:
        raise ValueError(f"implementation name {impl.name!r} is registered twice")
    if impl.schedule not in ("naive", "two_phase"):
        raise ValueError(f"impl {impl.name}: schedule must be naive or two_phase, got {impl.schedule!r}")
    if impl.backward not in ("autograd", "recompute") or (impl.backward == "recompute" and impl.schedule != "two_phase"):
        raise ValueError(f"impl {impl.name}: backward must be autograd, or recompute on the two_phase "
                         f"schedule, got {impl.backward!r} on {impl.schedule}")
    IMPLS[impl.name] = impl
    return impl


def unregister(name: str) -> None:
    """Remove a registered implementation (tests that plant one)."""
    IMPLS.pop(name, None)


@contextlib.contextmanager
def registered(impl: Impl) -> Iterator[Impl]:
    """``impl`` registered for the body only."""
    register(impl)
    try:
        yield impl
    finally:
        unregister(impl.name)


def get(name: str, router: str | None = None) -> Impl:
    """The implementation ``name`` (of ``router`` when given).

    Raises:
        ConfigError: unknown name, or one that does not implement ``router`` (naming ``--impls``).
    """
    _load_peers()
    impl = IMPLS.get(name)
    if impl is None or (router is not None and router not in impl.routers):
        known = ", ".join(n for n, i in IMPLS.items() if router is None or router in i.routers)
        what = f"of {router}" if router else "known"
        raise ConfigError(f"--impls: {name!r} is not an implementation {what}; known: {known}")
    return impl


def names() -> list[str]:
    """Every registered implementation's name (peers loaded)."""
    _load_peers()
    return list(IMPLS)


def impls_for(router: str) -> list[Impl]:
    """Every registered implementation of ``router`` (built-ins first)."""
    _load_peers()
    return [i for i in IMPLS.values() if router in i.routers]


_builtin_note = "routerbench's own PyTorch code"
register(Impl("naive", BLOCK_ROUTERS, "naive", conventions=_builtin_note + ": the reference", builtin=True))
register(Impl("two_phase", ("block_attnres", "haares", "wav_v1"), "two_phase",
              conventions=_builtin_note + ": the AttnRes paper's two-phase schedule", builtin=True))
register(Impl("lean", ("block_attnres", "haares", "wav_v1"), "two_phase", backward="recompute",
              conventions=_builtin_note + ": the two-phase schedule with a backward that keeps each "
              "source once and a few float32 statistics per token (routers/lean.py)", builtin=True))

_peers_loaded = False


def _load_peers() -> None:
    """Import every adapter of ``routers/peers/`` once (each registers its ``IMPL``); an adapter
    module that fails to import is a bug of ours and raises."""
    global _peers_loaded
    if _peers_loaded:
        return
    _peers_loaded = True
    from . import peers
    for m in pkgutil.iter_modules(peers.__path__):
        if not m.name.startswith("_"):
            mod = importlib.import_module(f"{peers.__name__}.{m.name}")
            if hasattr(mod, "IMPL"):
                register(mod.IMPL)
