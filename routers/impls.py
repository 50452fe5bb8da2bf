"""Implementations of the routers that have more than one: the built-ins and peer kernels
plugged into them, each registered with its availability and proven equal to ``naive`` before it
is timed (:mod:`harness.sweep.parity`).

Routers come in **families** (:data:`FAMILIES`); a family names its routers, its schedules and,
per schedule, its **plug-in points**: the callables a peer may replace. ``naive`` is every family's
reference (routerbench's own PyTorch code).

**block** (``block_attnres``, ``full_attnres``, ``haares``, ``wav_v1``): the two schedules of
:class:`routers.block.router.BlockRouter`:

- ``schedule="naive"``: every read stacks its sources and mixes them. A peer replaces the depth
  mixer of that read (:func:`routers.mixer.depth_mix`) by its ``mix`` callable, with the same
  arguments: ``mix(sources, query, bias, key_gain, eps) -> h`` (sources n × (B, T, d), query (d,),
  bias (n,) or None, key_gain (d,) or None; h (B, T, d) in the sources' dtype). The sublayer's
  own input norm belongs to the workload: a peer must not fuse it.
- ``schedule="two_phase"``: a peer replaces the two phases of ``routers/block/two_phase.py`` by
  its ``phases = (phase1, merge)``, with the signatures of :func:`routers.block.phases.phase1`
  (m queries over the completed sources, newest first: ``phase1(q, bias, values, inv, valid,
  scope) -> (o, μ, s)``) and :func:`routers.block.phases.merge` (phase 2 of one read: ``merge(o,
  μ, s, q, P, details, bias, max_detail_scale, updates, coefs, kinds, n_kinds, scope) -> h``);
  ours computes the inverse RMS and the readout. The built-in ``lean`` runs this schedule too, with its own phases,
  inverse RMS and readout as custom autograd Functions (``backward="recompute"``).

**stream** (``shc``, ``dhc``, ``mhc``: :class:`routers.stream.StreamRouter`, n copies of the
residual; the hooks' signatures are in :mod:`routers.stream`):

- ``schedule="naive"`` (coefficients carried in the state): points ``coefficients`` (a, W, c of
  a sublayer from the streams before it), ``pre_mix`` (h = Σ_s a_s X_s) and ``post_res``
  (X' = W X + c ⊗ u); an impl replaces any of them (Liger's mHC ops replace all three).
- ``schedule="width_depth"`` (HC paper App. J, Alg. 2): the *width connection* of sublayer k
  makes its branch input and the mixed streams W X at once, from the streams in the peer's own
  layout, and the *depth connection* adds c ⊗ u; points ``expand``, ``width``, ``depth``,
  ``reduce`` (lucidrains' ``hyper-connections``).

A peer that reproduces our router only under some of its convention options (mHC's Sinkhorn
start, …) declares them in ``options``: its cases run with those options, and so does the
``naive`` it is checked against.

Every impl is declared in its own file as ``IMPL = Impl(...)`` (``routers/block/``: two_phase, lean,
fused; ``routers/peers/``; :data:`REFERENCE` below), found by scanning (:func:`_load`): a new impl
file needs no other edit. What a caller would ask of an impl by its name is an attribute of its
:class:`Impl`; a name the registry does not know gets the declared defaults (:func:`attribute`).

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
import importlib.util
import os
import pkgutil
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from .errors import ConfigError

#: Every family's reference impl: routerbench's own PyTorch code, which every other impl must equal
#: (:mod:`harness.sweep.parity`), and what a cost model describes when none is named.
REFERENCE = "naive"
#: The impl a race, a profile or a sweep runs by default where a router offers it (the fast one of
#: routerbench's own); a router that does not offer it runs its first.
FAST = "two_phase"
#: The folders of ``routers/`` whose modules declare impls (``IMPL = Impl(...)``).
IMPL_DIRS = ("block", "peers")

#: The routers of the Attention Residuals family that take an ``impl`` (their class's ``impls``
#: lists the built-in ones).
BLOCK_ROUTERS = ("block_attnres", "full_attnres", "haares", "wav_v1")
#: The n-stream routers (``routers/hyper.py``, ``routers/mhc.py``) that take an ``impl``.
STREAM_ROUTERS = ("shc", "dhc", "mhc")


@dataclass(frozen=True)
class Family:
    """Routers that share their schedules and plug-in points.

    Attributes:
        name: ``"block"`` or ``"stream"``.
        routers: its routers.
        points: schedule → the plug-in points a peer of that schedule may supply.
    """

    name: str
    routers: tuple[str, ...]
    points: dict[str, tuple[str, ...]]


#: family name → :class:`Family` (module doc).
FAMILIES: dict[str, Family] = {
    "block": Family("block", BLOCK_ROUTERS, {"naive": ("mix",), "two_phase": ("phases",)}),
    "stream": Family("stream", STREAM_ROUTERS, {"naive": ("coefficients", "pre_mix", "post_res"),
                                                "width_depth": ("expand", "width", "depth", "reduce")}),
}


def family_of(router: str) -> Family | None:
    """The family of ``router``, or None for a router without implementations (prenorm, …)."""
    return next((f for f in FAMILIES.values() if router in f.routers), None)


@dataclass(frozen=True)
class StateModel:
    """An impl's router state, for the block routers' live-state cost model (``routers.block.costs``). ``phase1``:
    each block's phase-1 outputs and statistics (the two-phase schedule; only it has the layer scope's padded layout);
    ``keeps_updates``: the block's updates (lean, fused; block 1's phase-1 outputs are then e itself);
    ``first_output_apart``: o_0 of a block of m ≥ 2 is a tensor beside the (m, B, T, d) result (lean);
    ``key_rms_cached``: an inverse RMS per completed source (not fused's); ``query_copies``: fused's query copies."""

    phase1: bool = False
    keeps_updates: bool = False
    first_output_apart: bool = False
    key_rms_cached: bool = True
    query_copies: bool = False


#: What ``impl NAME …`` says of an impl without a region form (a peer's kernels), by default.
NO_REGION_FORM = "is a peer kernel, which has no region form"


@dataclass(frozen=True)
class Impl:
    """One implementation of routers of one family (the built-in ``naive`` spans them all).

    Attributes:
        name: the ``impl`` option's value (``--impls``).
        routers: routers it implements.
        schedule: the schedule it plugs into, one of its family's (:data:`FAMILIES`).
        mix: block family, naive schedule: the depth mixer (module doc); None for the built-in.
        phases: block family, two_phase schedule: a peer's ``(phase1, merge)``, or a whole
            :class:`routers.block.phases.Phases` (the built-ins'); None: plain autograd.
        hooks: the other families' plug-in points it supplies, point → callable (stream family:
            :mod:`routers.stream`); the points it leaves out run ours.
        options: per router, the options it implements that router only with (its conventions,
            e.g. Liger's mHC: ``{"mhc": {"sk_init": "softmax_eps", …}}``); its cases and their
            parity check run with them (:func:`case_options`).
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
            the rest: ``lean``, ``routers/block/lean.py``).
        state: its router state for the cost models (:class:`StateModel`); None: the router's
            cost models do not describe it (a peer costs what its schedule's built-in costs).
        check: called with a block router built with this impl once its plan is made; raises
            ``ConfigError`` for a shape the impl refuses (``fused``: its kernels' limits), or None.
        no_layer_scope: why it cannot run under ``--compile-scope layer``, said after ``impl
            NAME`` (:data:`NO_REGION_FORM` by default); None: it can.
        parity_tokens: ``(case's B·T, device type) -> tokens`` its parity check runs (``fused``
            on CUDA), or None (the default). Its parity reference is always :attr:`reference`.
        against: the impl a report reads its time against (``lean``: ``two_phase``), or None.
        compile_weight: the forecast's weight of its graph's compile time, relative to naive's.
        line, marker: its line style and marker in the figures; None: the figure's default.
    """

    name: str
    routers: tuple[str, ...]
    schedule: str
    mix: Callable | None = None
    phases: tuple | None = None
    devices: tuple[str, ...] = ("cpu", "cuda")
    dtypes: tuple[str, ...] = ("float32", "float64", "bfloat16", "float16")
    modes: tuple[str, ...] = ("fwd", "fwd_bwd", "train_step", "decode")
    package: str | None = None
    probe: Callable[[], str | None] = field(default=lambda: None)
    conventions: str = ""
    builtin: bool = False
    interpretable: bool = False
    backward: str = "autograd"
    hooks: dict[str, Callable] = field(default_factory=dict)
    options: dict[str, dict[str, object]] = field(default_factory=dict)
    state: StateModel | None = None
    check: Callable[[object], None] | None = None
    no_layer_scope: str | None = NO_REGION_FORM
    parity_tokens: Callable[[int, str], int] | None = None
    against: str | None = None
    compile_weight: float = 1.0
    line: str | None = None
    marker: str | None = None

    @property
    def reference(self) -> str | None:
        """The impl it must equal (:mod:`harness.sweep.parity`): :data:`REFERENCE`; None for itself."""
        return None if self.name == REFERENCE else REFERENCE

    @property
    def family(self) -> Family | None:
        """The family of its routers (None for :data:`REFERENCE`, every family's reference)."""
        fams = {f.name for f in map(family_of, self.routers) if f is not None}
        return FAMILIES[fams.pop()] if len(fams) == 1 else None

    def point(self, name: str) -> Callable | None:
        """The callable it supplies for plug-in point ``name`` (None: ours runs there)."""
        if name in ("mix", "phases"):
            return getattr(self, name)
        return self.hooks.get(name)

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
        ``TRITON_INTERPRET=1`` (Triton's interpreter: slow, for tests at tiny shapes)."""
        if self.interpretable and "cpu" not in self.devices and os.environ.get("TRITON_INTERPRET") == "1":
            return self.devices + ("cpu",)
        return self.devices


#: name -> implementation, built-ins first (:func:`_load`), then the peers and plugins.
IMPLS: dict[str, Impl] = {}


def register(impl: Impl) -> Impl:
    """Add ``impl`` to :data:`IMPLS`.

    Raises:
        ValueError: the name is taken; its routers are of no family or of several (only the
            built-in ``naive`` spans families); the schedule is not one of its family's; it
            supplies a plug-in point its schedule does not have.
    """
    if impl.name in IMPLS and IMPLS[impl.name] is not impl:
        raise ValueError(f"implementation name {impl.name!r} is registered twice")
    unknown = [r for r in impl.routers if family_of(r) is None]
    fam = impl.family
    if unknown or (fam is None and not (impl.builtin and impl.reference is None)):
        fams = "; ".join(f"{f.name}: " + ", ".join(f.routers) for f in FAMILIES.values())
        raise ValueError(f"impl {impl.name}: its routers must be of one family ({fams}); "
                         f"got {', '.join(impl.routers)}")
    schedules = fam.points if fam is not None else {REFERENCE: ()}
    if impl.schedule not in schedules:
        raise ValueError(f"impl {impl.name}: schedule must be one of {', '.join(schedules)}, got {impl.schedule!r}")
    given = [p for p in ("mix", "phases", *impl.hooks) if impl.point(p) is not None]
    wrong = [p for p in given if p not in schedules[impl.schedule]]
    if wrong:
        raise ValueError(f"impl {impl.name}: the {impl.schedule} schedule of the {fam.name} family has plug-in "
                         f"points {', '.join(schedules[impl.schedule])}, not {', '.join(wrong)}")
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
    _load()
    impl = IMPLS.get(name)
    if impl is None or (router is not None and router not in impl.routers):
        known = ", ".join(n for n, i in IMPLS.items() if router is None or router in i.routers)
        what = f"of {router}" if router else "known"
        raise ConfigError(f"--impls: {name!r} is not an implementation {what}; known: {known}")
    return impl


def case_options(impl: Impl, router: str, given: dict, defaults: dict) -> dict:
    """The options a case of ``impl`` on ``router`` runs with: ``given`` (the user's), plus the
    conventions ``impl`` declares (:attr:`Impl.options`) where they differ from the router's
    ``defaults`` (``routers.router_options``; so a peer's case and naive's under the same
    conventions share their options).

    Raises:
        ConfigError: ``given`` sets a declared convention to another value (naming
            ``--router-options`` and ``--impls``).
    """
    declared = impl.options.get(router, {})
    clash = {k: v for k, v in declared.items() if k in given and given[k] != v}
    if clash:
        want = ", ".join(f"{k}={v!r}" for k, v in clash.items())
        got = ", ".join(f"{k}={given[k]!r}" for k in clash)
        raise ConfigError(f"--impls {impl.name}: it implements {router} only with {want}, but "
                          f"--router-options sets {got}; drop those options or that impl")
    return {**given, **{k: v for k, v in declared.items() if k not in given and defaults.get(k) != v}}


def names() -> list[str]:
    """Every registered implementation's name (peers loaded)."""
    _load()
    return list(IMPLS)


def impls_for(router: str) -> list[Impl]:
    """Every registered implementation of ``router`` (built-ins first)."""
    _load()
    return [i for i in IMPLS.values() if router in i.routers]


#: How a built-in's ``conventions`` begins.
BUILTIN_NOTE = "routerbench's own PyTorch code"
register(Impl(REFERENCE, BLOCK_ROUTERS + STREAM_ROUTERS, "naive", conventions=BUILTIN_NOTE + ": the reference",
              builtin=True, state=StateModel(), no_layer_scope=None, line="-", marker="o"))

_loaded = False


def _load() -> None:
    """Import once every module of :data:`IMPL_DIRS` that declares an ``IMPL`` and register it (a
    module that fails to import raises); on first use, so that a light import loads no torch."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    for folder in IMPL_DIRS:
        where = Path(__file__).with_name(folder)
        for m in pkgutil.iter_modules([str(where)]):  # found by name, as the registry finds routers
            text = (where / f"{m.name}.py").read_text(encoding="utf-8")  # a module without IMPL is not
            if not m.name.startswith("_") and re.search(r"^IMPL\b", text, re.M):  # imported (Triton's)
                mod = importlib.import_module(f"{__package__}.{folder}.{m.name}")
                register(mod.IMPL)
    # built-ins first: the reference, then by schedule, autograd first, those that run anywhere first
    order = {s: i for f in FAMILIES.values() for i, s in enumerate(f.points)}
    first = sorted((i for i in IMPLS.values() if i.builtin),
                   key=lambda i: (i.reference is not None, order.get(i.schedule, 0), i.backward != "autograd",
                                  "cpu" not in i.devices))
    rest = [i for i in IMPLS.values() if not i.builtin]
    IMPLS.clear()
    IMPLS.update((i.name, i) for i in first + rest)


def lookup(name: str | None) -> Impl | None:
    """The registered impl ``name``, or None for a name the registry does not know (a plugin's not
    loaded, a run's record): callers then use :class:`Impl`'s declared defaults."""
    _load()
    return IMPLS.get(name) if name is not None else None


def attribute(name: str | None, attr: str, default: object = None) -> object:
    """``lookup(name).<attr>``, or ``default`` for an unknown name or an attribute that is None."""
    impl = lookup(name)
    value = getattr(impl, attr) if impl is not None else None
    return default if value is None else value

