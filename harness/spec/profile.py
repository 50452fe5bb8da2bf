"""The spec of ``routerbench profile``: torch.profiler traces of one case and the router's share."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

from harness.step import backends
from harness.step.backends import BACKENDS, compiles
from harness.step.modes import MODES
from harness.sweep.profile import METHODS
from routers import ROUTERS, check_router_options, router_options
from routers.errors import ConfigError
from routers.impls import FAST

from .base import Labels, given, option
from .parts import (NOT_IN_FILE, Output, Single, base_shape, check_heads, check_output, preset_base,
                    resolve_device, resolved_shape)


@dataclass(frozen=True)
class Profiling:
    """The profiled case and the profiler's schedule (``[profile]``)."""

    router: str | None = option("str", "The router to profile (required; `routerbench list`).",
                                choices=lambda: tuple(sorted(ROUTERS)))
    router_options: dict | None = option("table", 'JSON options of this router: \'{"n_blocks": 2}\'.')
    impl: str | None = option("str", "Router implementation (default: two_phase where the router has it, "
                              "as the block routers do; naive otherwise).")
    backend: str | None = option("str", "eager (default), compile or cudagraph.", choices=tuple(BACKENDS))
    compile_mode: str | None = option("str", "Mode of the compile backend (default: default).",
                                      choices=tuple(m for m in BACKENDS["compile"] if m))
    mode: str | None = option("str", "fwd, fwd_bwd (default), train_step or decode.", choices=MODES)
    methods: tuple[str, ...] | None = option(
        "strs", "Router-share methods: labels (eager), paired_difference, router_only (default: labels "
        "on eager, the other two on compile/cudagraph).", choices=METHODS)
    wait: int | None = option("int", "Profiler schedule: steps skipped (default: 1).", min=0)
    warmup: int | None = option("int", "Profiler schedule: steps traced and dropped (default: 2).", min=0)
    active: int | None = option("int", "Profiler schedule: steps traced and kept (default: 3).", min=1)
    pairs: int | None = option("int", "Interleaved A/B rounds of paired_difference and router_only "
                               "(default: 10).", min=1)
    memory_snapshot: bool | None = option("bool", "CUDA: dump the allocator history of one step "
                                          "(memory_snapshot.pickle, for pytorch.org/memory_viz).")
    max_entries: int | None = option("int", "Allocator events the snapshot keeps (default: 100000).", min=1)


@dataclass(frozen=True)
class ProfileSpec:
    """Everything ``routerbench profile`` needs; :meth:`resolve` checks it and fills in defaults."""

    COMMAND: ClassVar[str] = "profile"
    NOT_IN_FILE: ClassVar[tuple[str, ...]] = NOT_IN_FILE
    #: Options of the shared parts that this command does not take.
    EXCLUDE: ClassVar[tuple[str, ...]] = ("output.report",)

    shape: Single = Single()
    profile: Profiling = Profiling()
    output: Output = Output()

    def resolve(self, L: Labels) -> "ProfileSpec":
        """Check every option and fill in defaults.

        Raises:
            ConfigError: no router, contradictory impl or compile mode, a backend this device
                cannot run, a method the backend cannot give, a bad shape or router option.
        """
        from harness.sweep.profile import check_methods, default_methods

        s, p, out = self.shape, self.profile, self.output
        if p.router is None:
            raise ConfigError(f"{L('profile.router')} is required: one of {', '.join(sorted(ROUTERS))}")
        check_output(out, L)
        dev = resolve_device(out.device, L("output.device"))
        opts = dict(p.router_options or {})
        named = opts.pop("impl", None)
        from harness.sweep.cases import offered_impls
        offered = offered_impls(p.router)
        if named is not None and p.impl is not None and named != p.impl:
            raise ConfigError(f"{L('profile.impl')} {p.impl} contradicts impl={named!r} in "
                              f"{L('profile.router_options')}; give one of them")
        # the fast implementation by default, as the race and the example of docs/SWEEPS.md ("Profiling") use
        impl = p.impl or named or (FAST if FAST in offered else offered[0])
        if impl not in offered:
            raise ConfigError(f"{L('profile.impl')} {impl!r}: router {p.router} offers {', '.join(offered)}")
        backend = p.backend or "eager"
        if given(p, "compile_mode") and not compiles(backend):
            raise ConfigError(f"{L('profile.compile_mode')} has no effect with --backend {backend}; "
                              "use --backend compile or drop it")
        cm = (p.compile_mode or "default") if compiles(backend) else None
        reason = backends.unavailable_reason(backend, cm, dev)
        if reason:
            raise ConfigError(f"{L('profile.backend')} {backend}: {reason}; use --backend eager or compile")
        try:
            methods = check_methods(p.methods or default_methods(backend), backend, cm)
        except ValueError as exc:
            raise ConfigError(str(exc).replace("--methods", L("profile.methods"), 1)) from None
        if given(p, "pairs") and not {"paired_difference", "router_only"} & set(methods):
            raise ConfigError(f"{L('profile.pairs')} has no effect with --methods {','.join(methods)}: it sets "
                              "the rounds of paired_difference and router_only; add one of them to "
                              f"{L('profile.methods')} or drop it")
        if given(p, "max_entries") and not p.memory_snapshot:
            raise ConfigError(f"{L('profile.max_entries')} has no effect without --memory-snapshot")
        snapshot = bool(p.memory_snapshot) and dev.type == "cuda"  # CUDA only; said on the console
        if s.grad_checkpoint and (p.mode or "fwd_bwd") in ("fwd", "decode"):
            raise ConfigError(f"{L('shape.grad_checkpoint')} has no effect in --mode {p.mode}: it changes "
                              "the backward pass only")
        pb = preset_base(s, dev)
        d_model, n_layers = s.d_model or pb.d_model, s.n_layers or pb.n_layers
        check_heads([d_model], s.n_heads or pb.n_heads, L, "shape.d_model")
        base = base_shape(s, dev, d_model=d_model, n_layers=n_layers)
        opts_full = {**opts, "impl": impl} if "impl" in router_options(p.router) else opts
        check_router_options(p.router, opts_full, d_model, n_layers, L("profile.router_options"))
        return replace(
            self,
            shape=resolved_shape(s, base, d_model=d_model, n_layers=n_layers),
            profile=replace(p, router_options=opts or None, impl=impl, backend=backend, compile_mode=cm,
                            mode=p.mode or "fwd_bwd", methods=tuple(methods),
                            wait=1 if p.wait is None else p.wait, warmup=2 if p.warmup is None else p.warmup,
                            active=p.active or 3,
                            pairs=(p.pairs or 10) if {"paired_difference", "router_only"} & set(methods) else None,
                            memory_snapshot=snapshot, max_entries=(p.max_entries or 100_000) if snapshot else None),
            output=replace(out, device=str(dev), quiet=bool(out.quiet)),
        )

    def case(self):
        """The profiled :class:`~harness.sweep.cases.Case` of a resolved spec."""
        import torch

        from harness.sweep.cases import Case
        s, p = self.shape, self.profile
        cfg = base_shape(s, torch.device(self.output.device), d_model=s.d_model, n_layers=s.n_layers)
        return Case(p.router, cfg, p.mode, p.backend, p.compile_mode,
                    tuple(sorted((p.router_options or {}).items())), p.impl)
