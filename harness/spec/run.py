"""The spec of ``routerbench run``: a cost sweep, a one-seed smoke race and a report."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

from harness.step.backends import BACKENDS, COMPILE_SCOPES, DEFAULT_COMPILE_SCOPE
from harness.step.modes import MODES
from harness.sweep.cases import Case, expand
from harness.sweep.options import SweepOptions
from harness.timing.noise import check_thresholds
from harness.timing.paired import ORDERS
from harness.timing.timer import TimingPolicy
from routers import ROUTERS, router_class
from routers.errors import ConfigError
from routers.impls import FAST, REFERENCE

from .base import Labels, given, option
from .parts import (NOT_IN_FILE, Grid, Output, RouterSet, absolute, base_shape, check_heads, check_output,
                    check_router_set, default_grid, impl_names, offered_impls, preset_base, resolve_device,
                    resolved_shape)
from .suites import DEFAULT_SUITE, SUITES

#: The default smoke race: char-level, small enough for a 2-core CPU (docs/SWEEPS.md, "Suites").
RACE_ROUTERS = ("prenorm", "haares")
RACE_PRESET = "cpu-train"
RACE_EVAL_EVERY = 20


@dataclass(frozen=True)
class Sweep:
    """What the cost sweep measures (``[sweep]``)."""

    suite: str | None = option("str", "What the run measures where its options do not say: " + "; ".join(
        f"{name}: {su.what}" for name, su in SUITES.items()) + f" (default: {DEFAULT_SUITE}).",
                               choices=tuple(SUITES))
    impls: tuple[str, ...] | None = option("strs", "Router implementations (default: the suite's; each "
                                           "router runs those it offers).", choices=impl_names)
    backends: tuple[str, ...] | None = option("strs", "Backends on the whole grid (default: the suite's: "
                                              "eager, and cudagraph on CUDA for seeds).", choices=tuple(BACKENDS))
    compile_modes: tuple[str, ...] | None = option("strs", "Modes of the compile backend (default: "
                                                   "default).", choices=tuple(m for m in BACKENDS["compile"] if m))
    compile_scope: tuple[str, ...] | None = option(
        "strs", "What one compiled graph holds: layer (one region per sublayer role, compiled once and "
        f"reused at every layer) or model (the whole forward); layer,model times both (default: "
        f"{DEFAULT_COMPILE_SCOPE}).", choices=COMPILE_SCOPES)
    modes: tuple[str, ...] | None = option("strs", "Modes (default: the suite's: fwd_bwd for seeds, "
                                           "fwd,fwd_bwd for full and baselines).", choices=MODES)
    smallest_backends: tuple[str, ...] | None = option(
        "strs", "Backends run only at the smallest width and depth; '' for none (default: compile when "
        "--backends is not given, else none).", choices=tuple(BACKENDS), empty_ok=True)
    smallest_modes: tuple[str, ...] | None = option(
        "strs", "Modes of --smallest-backends (default: fwd_bwd on CPU, where a first compile takes "
        "tens of seconds; --modes on CUDA).", choices=MODES)
    flops: bool | None = option("bool", "Count FLOPs by fvcore and by FlopCounterMode (default: on).")
    isolate: bool | None = option("bool", "Run each paired group in its own subprocess: a crash or a "
                                  "hang costs one error row, not the sweep (default: off).")
    case_timeout: float | None = option("float", "With --isolate: seconds a case may make no progress "
                                        "before it is killed as hung (default: 900).", min=0, min_open=True)
    supervise: bool | None = option(
        "bool", "Measure in a child process and, after a sticky CUDA error (an illegal memory access, a "
        "launch failure), which leaves a process unable to use its device, record that case as an error "
        "row and resume the rest of the run in a new process (default: on with CUDA, off on CPU).")


@dataclass(frozen=True)
class Timing:
    """How step times are taken (``[timing]``)."""

    repeats: int | None = option("int", "Timed steps kept per case, a fixed number of rounds (default: 10; "
                                 "not with --precision-target).", min=1)
    precision_target: float | None = option(
        "float", "Time in rounds until every paired ratio's interval (the stopping rule's own, "
        "MEASUREMENT.md) is within this relative half-width, e.g. 0.03 for ±3 %, or the group's "
        "budget is spent (default: off, fixed --repeats).", min=0, min_open=True, max=1)
    group_budget_s: float | None = option("float", "With --precision-target: seconds of timing one "
                                          "group may spend, its first look included (default: 600).",
                                          min=0, min_open=True)
    min_pairs: int | None = option("int", "With --precision-target: pairs before the first look "
                                   "(even; default: 10).", min=2)
    max_rounds: int | None = option("int", "With --precision-target: rounds of one group at most; "
                                    "the last look (default: 400).", min=2)
    warmup_s: float | None = option("float", "Minimum warm-up seconds per case, within 3 to 200 warm-up "
                                    "steps (default: 0.5).", min=0)
    paired: bool | None = option("bool", "Time the routers of each backend, mode and shape interleaved "
                                 "with prenorm, for per-pair ratios with CIs (default: on).")
    pair_order: str | None = option("str", "Round order of --paired: ABBA (default) reverses the order "
                                    "every round.", choices=ORDERS)
    remeasure_s: float | None = option("float", "Seconds a group flagged noisy may spend being timed "
                                       "again (its models stay built); a new timing starts only if one "
                                       "more, as long as the last, fits in what is left (default: 60; "
                                       "0: never).", min=0)
    max_attempts: int | None = option("int", "Timings of one group at most, the first included "
                                      "(default: 3).", min=1)
    noise_thresholds: dict | None = option("table", "When a group counts as noisy, as JSON merged with "
                                           "the defaults: cpu_util_min 0.35 (process CPU time / (wall × "
                                           "threads)), cpu_pressure_max 0.2 (share of time a task waited "
                                           "for a CPU), iqr_rel_max 0.15 (IQR / median of a case), "
                                           "ci_width_rel_max 0.15 (paired CI width / ratio); e.g. "
                                           '{"cpu_pressure_max": 0.3}.', metavar="JSON")


@dataclass(frozen=True)
class Race:
    """The one-seed smoke race after the sweep (``[race]``; ``routerbench train`` for real studies)."""

    train: bool | None = option("bool", "Run the one-seed smoke race (default: on).")
    data: str | None = option("str", "Corpus dir of the race (default: the embedded stdlib corpus).",
                              metavar="DIR", path=True)
    train_steps: int | None = option("int", "Race step budget (default: 300).", min=1)
    target_loss: float | None = option("float", "Race target in nats (default: 1.9).", min=0, min_open=True)


@dataclass(frozen=True)
class RunSpec:
    """Everything ``routerbench run`` needs; :meth:`resolve` checks it and fills in defaults."""

    COMMAND: ClassVar[str] = "run"
    NOT_IN_FILE: ClassVar[tuple[str, ...]] = NOT_IN_FILE

    shape: Grid = Grid()
    routers: RouterSet = RouterSet()
    sweep: Sweep = Sweep()
    timing: Timing = Timing()
    race: Race = Race()
    output: Output = Output()

    def resolve(self, L: Labels) -> "RunSpec":
        """Check every option (one line naming it on the first bad one) and fill in defaults.

        Raises:
            ConfigError: a contradiction, an unknown or unselected router's options, a shape that
                does not split into heads, an invalid router option for some depth.
        """
        s, sw, t, race, out = self.shape, self.sweep, self.timing, self.race, self.output
        check_output(out, L)
        dev = resolve_device(out.device, L("output.device"))
        suite_name = sw.suite or DEFAULT_SUITE
        suite = SUITES[suite_name]
        grid = suite.grid_for(dev.type) or default_grid(dev)
        routers = self.routers.routers or suite.routers or tuple(sorted(ROUTERS))
        backends = sw.backends or suite.backends_for(dev.type)
        smallest = sw.smallest_backends if given(sw, "smallest_backends") else (
            () if given(sw, "backends") else suite.smallest)
        modes = sw.modes or suite.modes
        both = sorted(set(backends) & set(smallest))
        if both:
            raise ConfigError(f"{L('sweep.smallest_backends')} {','.join(both)} already runs on the whole grid "
                              f"({L('sweep.backends')}), smallest shape included; drop it from one of them")
        if given(sw, "smallest_modes") and not smallest:
            raise ConfigError(f"{L('sweep.smallest_modes')} has no effect without "
                              f"{L('sweep.smallest_backends')}; drop it or name backends there")
        smallest_modes = sw.smallest_modes or (modes if dev.type == "cuda" else (
            tuple(m for m in modes if m == "fwd_bwd") or modes)) if smallest else None
        if s.grad_checkpoint and not set(modes + tuple(smallest_modes or ())) & {"fwd_bwd", "train_step"}:
            raise ConfigError(f"{L('shape.grad_checkpoint')} has no effect without a backward pass: add "
                              f"fwd_bwd or train_step to {L('sweep.modes')}")
        uses_compile = "compile" in backends + tuple(smallest)
        for name in ("compile_modes", "compile_scope"):
            if given(sw, name) and not uses_compile:
                raise ConfigError(f"{L('sweep.' + name)} has no effect: neither {L('sweep.backends')} nor "
                                  f"{L('sweep.smallest_backends')} names compile; drop it or add compile "
                                  f"to {L('sweep.backends')}")
        if "reduce-overhead" in (sw.compile_modes or ()) and "layer" in (sw.compile_scope or ()):
            raise ConfigError(f"{L('sweep.compile_modes')} reduce-overhead with {L('sweep.compile_scope')} "
                              "layer: each compiled region would start a CUDA-graph-trees step that "
                              "overwrites the regions before it; use --compile-scope model with "
                              "reduce-overhead (or --backends cudagraph for a whole captured step)")
        if given(sw, "case_timeout") and not sw.isolate:
            raise ConfigError(f"{L('sweep.case_timeout')} needs --isolate (a hang can only be ended in a "
                              "subprocess); add --isolate or drop it")
        precise = t.precision_target is not None
        if precise and given(t, "repeats"):
            raise ConfigError(f"{L('timing.repeats')} fixes the rounds and {L('timing.precision_target')} "
                              "times until the ratios are precise; drop one of them")
        for name in ("group_budget_s", "min_pairs", "max_rounds"):
            if given(t, name) and not precise:
                raise ConfigError(f"{L('timing.' + name)} has no effect without "
                                  f"{L('timing.precision_target')}; add it or drop {L('timing.' + name)}")
        if precise and t.paired is False:
            raise ConfigError(f"{L('timing.precision_target')} is a target for paired ratios: it needs "
                              "--paired; drop --no-paired")
        min_pairs = (t.min_pairs or 10) + (t.min_pairs or 10) % 2 if precise else None
        max_rounds = (t.max_rounds or 400) if precise else None
        if precise and max_rounds < min_pairs:
            raise ConfigError(f"{L('timing.max_rounds')} {max_rounds} is below {L('timing.min_pairs')} "
                              f"{min_pairs}: the first look would come after the last round")
        if given(t, "max_attempts") and given(t, "remeasure_s") and t.remeasure_s == 0 and (t.max_attempts or 3) > 1:
            raise ConfigError(f"{L('timing.max_attempts')} has no effect with {L('timing.remeasure_s')} 0 (no "
                              "group is timed again); drop one of them")
        if given(t, "pair_order") and t.paired is False:
            raise ConfigError(f"{L('timing.pair_order')} has no effect with --no-paired; drop one of them")
        train = race.train is not False
        for name in ("data", "train_steps", "target_loss"):
            if not train and given(race, name):
                raise ConfigError(f"{L('race.' + name)} has no effect with --no-train; drop one of them")
        pb = preset_base(s, dev)
        # a named preset is its own shape; without one, the device's width × depth grid
        widths = s.widths or ((pb.d_model,) if s.preset else grid["d_model"])
        depths = s.depths or ((pb.n_layers,) if s.preset else grid["n_layers"])
        check_heads(widths, s.n_heads or pb.n_heads, L, "shape.widths")
        base = base_shape(s, dev, d_model=min(widths), n_layers=min(depths))
        # the default, of what the routers offer: a resolved spec must load again as given (resume)
        impls = sw.impls or (tuple(i for i in (suite.impls or (REFERENCE, FAST)) if i in offered_impls(routers))
                             or (REFERENCE,))
        check_router_set(self.routers, routers, depths, min(widths), L,
                         impls if given(sw, "impls") else None)
        if train and race.data is not None:
            from workloads.data import CharCorpus
            CharCorpus.open(race.data, L("race.data"))  # the corpus's own checks, one line each
        paired = t.paired is not False
        isolate = bool(sw.isolate)
        try:
            thresholds = check_thresholds(t.noise_thresholds, L("timing.noise_thresholds"))
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        return replace(
            self,
            shape=resolved_shape(s, base, widths=tuple(widths), depths=tuple(depths)),
            routers=replace(self.routers, routers=routers, router_options=self.routers.router_options or None),
            sweep=replace(sw, suite=suite_name, impls=impls, backends=backends, smallest_backends=smallest or None,
                          smallest_modes=smallest_modes, modes=modes,
                          compile_modes=(sw.compile_modes or ("default",)) if uses_compile else None,
                          compile_scope=(sw.compile_scope or (DEFAULT_COMPILE_SCOPE,)) if uses_compile else None,
                          flops=sw.flops is not False, isolate=isolate,
                          case_timeout=(sw.case_timeout or 900.0) if isolate else None,
                          supervise=dev.type == "cuda" if sw.supervise is None else sw.supervise),
            timing=replace(t, repeats=None if precise else (t.repeats or 10),
                           group_budget_s=(t.group_budget_s or 600.0) if precise else None,
                           min_pairs=min_pairs, max_rounds=max_rounds, warmup_s=0.5 if t.warmup_s is None else t.warmup_s,
                           paired=paired, pair_order=(t.pair_order or "ABBA") if paired else None,
                           remeasure_s=60.0 if t.remeasure_s is None else t.remeasure_s,
                           # no re-measuring time: one timing per group (the resolved spec says so)
                           max_attempts=1 if t.remeasure_s == 0 else (t.max_attempts or 3), noise_thresholds=thresholds),
            race=replace(race, train=train, data=absolute(race.data) if train else None, train_steps=(race.train_steps or 300) if train else None,
                         target_loss=(race.target_loss or 1.9) if train else None),
            output=replace(out, device=str(dev), report=out.report is not False, quiet=bool(out.quiet)),
        )

    # --- what a resolved spec means -------------------------------------------------------
    def cases(self) -> list[Case]:
        """The sweep's cases (of a resolved spec), validated."""
        import torch
        s, sw = self.shape, self.sweep
        dev = torch.device(self.output.device)
        base = base_shape(s, dev, d_model=min(s.widths), n_layers=min(s.depths))
        common = dict(options=self.routers.router_options or {}, impls=list(sw.impls),
                      compile_modes=list(sw.compile_modes or ()), compile_scopes=list(sw.compile_scope or ()))
        cases = expand(self.routers.routers, base, s.widths, s.depths, modes=list(sw.modes),
                       backends=list(sw.backends), **common)
        if sw.smallest_backends:
            cases += expand(self.routers.routers, base, [min(s.widths)], [min(s.depths)],
                            modes=list(sw.smallest_modes), backends=list(sw.smallest_backends), **common)
        return cases

    def sweep_options(self) -> SweepOptions:
        t, sw = self.timing, self.sweep
        return SweepOptions(flops=sw.flops, timing=TimingPolicy(repeats=t.repeats or t.min_pairs or 10,
                                                                warmup_min_s=t.warmup_s),
                            precision_target=t.precision_target, group_budget_s=t.group_budget_s or 600.0,
                            min_pairs=t.min_pairs or 10, max_rounds=t.max_rounds or 400,
                            paired=t.paired, pair_order=t.pair_order or "ABBA", isolate=sw.isolate,
                            case_timeout=sw.case_timeout or 900.0,
                            remeasure_s=60.0 if t.remeasure_s is None else t.remeasure_s,
                            max_attempts=t.max_attempts or 3,
                            noise_thresholds=check_thresholds(t.noise_thresholds),
                            quiet=bool(self.output.quiet))

    def race_routers(self) -> list[str]:
        """The routers of the smoke race: prenorm and haares where selected, filled up to two with
        the first other routers selected."""
        names = list(self.routers.routers)
        picked = [r for r in RACE_ROUTERS if r in names]
        return picked + [r for r in names if r not in picked][:max(0, 2 - len(picked))]

    def race_options(self) -> dict[str, dict]:
        """Per race router: its options, with ``impl`` two_phase where it has one and none is named
        (the same function as naive, tested; less wall time)."""
        out = {}
        for r in self.race_routers():
            opts = dict((self.routers.router_options or {}).get(r, {}))
            if "impl" not in opts and FAST in router_class(r).impls:
                opts["impl"] = FAST
            out[r] = opts
        return out
