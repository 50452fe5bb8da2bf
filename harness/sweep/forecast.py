"""What a cost sweep will take, before any model is built: its units and groups
(:func:`harness.sweep.plan.sweep_units`), the models it compiles, a time range by part and the
peak memory of its largest group (the estimate model and its constants:
:mod:`harness.costs.forecast`).

Per run: the copy-bandwidth measurement (``BANDWIDTH_S``) and the first case's imports
(``PROCESS_SETUP_S``; once per unit under ``--isolate``). Per case: set-up (build, parameter
count, parity of a non-naive impl, saved activations: ``CASE_SETUP_S``), FLOP counting once per
router and shape (:func:`harness.sweep.prepare.flops_key`, as the sweep counts them), the compile
of a compiled case (and Inductor's start-up once per process), and the warm-up (at least
``warmup_s`` and 3 steps). Per group, the timing: with fixed ``--repeats`` R, (R + 1) rounds (one
untimed interleaved round re-warms every step) of one step of every case; with
``--precision-target``, between the first look (``min_pairs`` rounds) and the group's
``group_budget_s`` (or ``max_rounds`` rounds when fewer); what is flagged noisy may be timed again
within ``remeasure_s`` (each case at most ``max_attempts`` − 1 more times), which only the high
end counts.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from harness.costs import forecast as fc
from harness.costs.router_flops import flop_note, router_fwd_flops
from harness.step.backends import compiles

from .cases import Case
from .options import SweepOptions
from .plan import case_bytes, sweep_units
from .prepare import case_label, flops_key, skip_reason


@dataclass
class SweepForecast:
    """A sweep's plan: counts, parts (seconds, low and high) and memory.

    Attributes:
        cases: cost cases.
        units: case count of each unit, in sweep order.
        paired: whether groups are timed interleaved.
        compiled: compiled cases (each compiles its own model).
        parts: ``setup`` (per case, FLOP counting and warm-up included, compile excluded),
            ``compile``, ``timing`` (the timed rounds, re-measuring included at the high end).
        peak_bytes: the largest unit's resident estimate (sum of
            :func:`harness.costs.estimate.step_bytes` of its cases), ``peak_unit`` its index (0-based)
            and ``peak_cases`` its case count.
        rounds: what a group's timing is, in words (``10 rounds per group``).
    """

    cases: int
    units: list[int]
    paired: bool
    compiled: int
    parts: dict[str, fc.Span] = field(default_factory=dict)
    peak_bytes: int = 0
    peak_unit: int = 0
    peak_cases: int = 0
    rounds: str = ""
    #: (case label, why) of each case that cannot run here and will be a ``skipped`` row
    #: (:func:`harness.sweep.prepare.skip_reason`); it is neither compiled nor timed.
    skipped: list[tuple[str, str]] = field(default_factory=list)
    #: what the sweep adds to ``records.jsonl`` at most (:func:`harness.costs.forecast.record_bytes`)
    disk_bytes: int = 0
    #: one sentence per router whose step estimate is not from its declared FLOP model
    #: (:func:`harness.costs.router_flops.flop_note`: "analytic_fwd_flops not declared; …")
    notes: list[str] = field(default_factory=list)

    @property
    def groups(self) -> int:
        """Units of more than one case (paired groups)."""
        return sum(n > 1 for n in self.units)

    def manifest(self) -> dict:
        return {"cases": self.cases, "units": len(self.units), "groups": self.groups,
                "paired": self.paired, "compiled_models": self.compiled, "rounds": self.rounds,
                "peak_bytes": self.peak_bytes, "peak_unit": self.peak_unit + 1,
                "peak_cases": self.peak_cases, "parts": {k: list(v) for k, v in self.parts.items()},
                "skipped": len(self.skipped), "disk_bytes": self.disk_bytes}


def group_timing(round_s: fc.Span, opts: SweepOptions, n_cases: int = 1) -> fc.Span:
    """Seconds (low, high) of timing one group of ``n_cases`` whose round (one step of every case)
    takes ``round_s``: fixed rounds, or with a precision target between the first look and the
    group's budget; plus, at the high end, re-timing what is noisy (each case at most
    ``max_attempts`` − 1 more times, each re-timing no longer than the group's, all within
    ``remeasure_s``: :func:`harness.sweep.timed.time_group`)."""
    lo_r, hi_r = round_s
    if opts.precision_target is None:
        rounds = opts.timing.repeats + 1  # + the untimed interleaved round
        lo, hi = rounds * lo_r, rounds * hi_r
    else:
        lo = (opts.min_pairs + 1) * lo_r
        hi = max(lo, min(opts.group_budget_s, (opts.max_rounds + 1) * hi_r))
    again = min(opts.remeasure_s, max(0, opts.max_attempts - 1) * max(1, n_cases) * hi)
    return lo, hi + again


def describe_rounds(opts: SweepOptions) -> str:
    if opts.precision_target is None:
        return f"{opts.timing.repeats} rounds per {'group' if opts.paired else 'case'}"
    return (f"precision ±{opts.precision_target:.0%}: {opts.min_pairs} to {opts.max_rounds} rounds, "
            f"at most {opts.group_budget_s:.0f} s per group")


def forecast_sweep(cases: list[Case], opts: SweepOptions, device_type: str = "cpu",
                   device_name: str | None = None) -> SweepForecast:
    """The plan of a sweep of ``cases`` under ``opts`` (``opts.group_budget_bytes`` splits groups
    as the sweep will), built from shapes alone. A case that cannot run on ``device_type``
    (:func:`harness.sweep.prepare.skip_reason`) is listed in ``skipped`` and costs its set-up only."""
    import torch
    kind = fc.kind(device_type)
    units = sweep_units(cases, opts.paired, opts.group_budget_bytes)
    setup, compile_, timing = [fc.PROCESS_SETUP_S, fc.BANDWIDTH_S], [], []
    counted: set = set()
    steps: dict[str, fc.Span] = {}
    skipped: list[tuple[str, str]] = []
    notes: list[str] = []
    here = torch.device(device_type)
    for c in cases:
        if (why := skip_reason(c, here)) is not None:
            skipped.append((f"{case_label(c)} d={c.cfg.d_model} L={c.cfg.n_layers}", why))
            setup.append(fc.CASE_SETUP_S[kind])
            steps[c.key] = (0.0, 0.0)
            continue
        kw = c.router_kwargs()
        note = flop_note(c.router, router_fwd_flops(c.cfg, c.router, kw)[1])
        if note is not None and note not in notes:
            notes.append(note)
        step = fc.step_seconds(c.cfg, c.router, kw, c.mode, device_type, device_name, c.backend)
        steps[c.key] = step
        setup.append(fc.CASE_SETUP_S[kind])
        setup.append(fc.warmup_seconds(step, opts.timing.warmup_min_s))
        if opts.flops and flops_key(c) not in counted:
            counted.add(flops_key(c))
            eager = fc.step_seconds(c.cfg, c.router, kw, "fwd_bwd", device_type, device_name)
            setup.append((fc.COUNT_S[0] + fc.COUNT_STEPS[0] * eager[0],
                          fc.COUNT_S[1] + fc.COUNT_STEPS[1] * eager[1]))
        if compiles(c.backend):
            compile_.append(fc.compile_seconds(c.cfg, c.router, kw, c.compile_scope, c.mode, device_type))
    # Inductor's start-up and the first case's imports: once per process, so once per unit
    # under --isolate (each unit runs in a child of its own)
    processes = [u for u in units if any(compiles(c.backend) for c in u)] if opts.isolate else [cases]
    if compile_:
        compile_ += [fc.COMPILE_STARTUP_S] * len(processes)
    if opts.isolate:
        setup += [fc.PROCESS_SETUP_S] * (len(units) - 1)
    peak, peak_i = 0, 0
    for i, unit in enumerate(units):
        timing.append(group_timing(fc.add(*(steps[c.key] for c in unit)), opts, len(unit)))
        b = sum(case_bytes(c) for c in unit)
        if b > peak:
            peak, peak_i = b, i
    rounds = opts.timing.repeats if opts.precision_target is None else opts.max_rounds
    return SweepForecast(cases=len(cases), units=[len(u) for u in units], paired=opts.paired,
                         compiled=sum(compiles(c.backend) for c in cases) - sum(
                             1 for c in cases if compiles(c.backend) and skip_reason(c, here)),
                         skipped=skipped,
                         disk_bytes=fc.record_bytes(len(cases), rounds, max(1, opts.max_attempts)),
                         parts={"setup": fc.add(*setup), "compile": fc.add((0.0, 0.0), *compile_),
                                "timing": fc.add((0.0, 0.0), *timing)},
                         peak_bytes=peak, peak_unit=peak_i, peak_cases=len(units[peak_i]) if units else 0,
                         rounds=describe_rounds(opts), notes=notes)
