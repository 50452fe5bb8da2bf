"""The plan ``run``, ``train`` and ``study depth`` print before they build a model, and
``--dry-run``, which prints it and exits.

A plan is four lines: what will run (cases, groups, models to compile; training runs and steps),
the estimated time range with its calibration, the range by part, and the estimated peak memory.
Its numbers come from shapes alone (:mod:`harness.sweep.forecast`, :mod:`harness.training.forecast`;
the estimate model and its constants: :mod:`harness.costs.forecast`), scaled by the median
actual/estimate ratio of earlier runs of this device under the same results root
(:func:`harness.costs.forecast.calibration`); on a machine already busy the high end also allows
for the load (:func:`harness.costs.forecast.load_now`). The manifest keeps the plan (``plan``:
``estimate_s``, ``uncalibrated_s``, ``parts``, ``calibration``, ``load``, ``peak_bytes``) and, when the
command finishes, the wall time beside it (``actual_s``, :meth:`harness.cli.common.Run.finish`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import click

from harness.costs import forecast as fc

from .common import DEFAULT_OUT

#: The embedded stdlib corpus keeps printable ASCII and newline (``workloads.data``): a dry run
#: plans with this vocabulary instead of building the corpus.
EMBEDDED_VOCAB = 96


def dry_run_option(f: Callable) -> Callable:
    """``--dry-run``: a command-line flag only (never in ``spec.toml``)."""
    return click.option("--dry-run", "dry_run", is_flag=True, default=False,
                        help="Print the plan (cases, groups, models to compile, estimated time range and "
                             "peak memory) and exit: no model is built, no run directory created.")(f)


def corpus_vocab(data: str | None, label: str) -> int:
    """The vocabulary of the corpus at ``data`` (opened and checked, nothing built), else of the
    embedded corpus (:data:`EMBEDDED_VOCAB`, its bound)."""
    if not data:
        return EMBEDDED_VOCAB
    from workloads.data import CharCorpus
    return CharCorpus.open(data, label).vocab_size


def _n(k: int, word: str) -> str:
    return f"{k} {word}{'s' * (k != 1)}"


#: How far a plan's estimated peak memory may exceed the free memory and still be tried (with a
#: warning): the estimate is soft (:meth:`Plan.check_memory`).
MEMORY_SLACK = 2.0


@dataclass
class Plan:
    """A command's plan: its first line, the parts of its estimate (seconds, uncalibrated), how
    they are shown, the peak memory and the calibration."""

    command: str
    head: str
    parts: dict[str, fc.Span]
    shown: list[tuple[str, tuple[str, ...], tuple[str, tuple[str, ...]] | None]]
    note: str
    peak_bytes: int
    peak_what: str
    calibration: dict | None = None
    details: dict = field(default_factory=dict)
    #: the machine's load when the plan was made (:func:`harness.costs.forecast.load_now`)
    load: dict | None = None
    #: (case label, why) of each planned case that cannot run here (a ``skipped`` row)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    #: what the command writes under ``--out`` at most (records, checkpoints), bytes
    disk_bytes: int = 0
    #: sentences the plan adds (a router's FLOPs not declared: :func:`harness.costs.router_flops.flop_note`)
    notes: list[str] = field(default_factory=list)

    @property
    def factor(self) -> float:
        return self.calibration["factor"] if self.calibration else 1.0

    @property
    def uncalibrated(self) -> fc.Span:
        return fc.add((0.0, 0.0), *self.parts.values())

    def _scaled(self, span: fc.Span) -> fc.Span:
        """``span`` × the calibration, its high end × the load factor on a busy machine."""
        lo, hi = fc.scale(span, self.factor)
        return lo, hi * (self.load["factor"] if self.load else 1.0)

    @property
    def estimate(self) -> fc.Span:
        return self._scaled(self.uncalibrated)

    def span(self, names: tuple[str, ...]) -> fc.Span:
        return self._scaled(fc.add((0.0, 0.0), *(self.parts[n] for n in names if n in self.parts)))

    def lines(self) -> list[str]:
        items = []
        for label, names, sub in self.shown:
            if not any(n in self.parts for n in names):
                continue
            text = f"{label} {fc.fmt_span(self.span(names))}"
            if sub is not None:
                text += f" ({sub[0]}: {fc.fmt_span(self.span(sub[1]))})"
            items.append(text)
        return [self.head,
                f"estimate: {fc.fmt_span(self.estimate)} ({fc.describe_calibration(self.calibration)}; "
                + (f"{fc.describe_load(self.load)}; " if self.load else "") + f"{self.note})",
                "  " + ", ".join(items),
                f"peak memory (estimate): {fc.fmt_bytes(self.peak_bytes)} ({self.peak_what})"
                + (f"; disk: at most {fc.fmt_bytes(self.disk_bytes)} written" if self.disk_bytes else ""),
                *self.skipped_lines(), *self.notes]

    def skipped_lines(self, most: int = 4) -> list[str]:
        """One line per reason a planned case cannot run here, with its count and up to ``most``
        of its cases (``skipped here (4 cases): cudagraph captures CUDA work: …: prenorm naive
        cudagraph, …``); for a cost sweep that skips nothing, one line that says so."""
        if self.command == "run" and not self.skipped:
            return ["skipped here: none (every planned case can run on this device)"]
        by: dict[str, list[str]] = {}
        for label, why in self.skipped:
            by.setdefault(why, []).append(label)
        return [f"skipped here ({_n(len(who), 'case')}): {why}: {', '.join(who[:most])}"
                + (f", … ({len(who) - most} more)" if len(who) > most else "") for why, who in by.items()]

    def check_out(self, out: str | None, label: str = "--out") -> None:
        """Refuse, before any work, an output root that cannot be written or whose disk has less
        free space than the command writes by estimate (:attr:`disk_bytes`); nothing is created.

        Raises:
            ConfigError: ``out`` (default ``results``) or its nearest existing parent is not a
                writable directory, or has less than :attr:`disk_bytes` free (naming ``label``).
        """
        import os
        import shutil

        from routers.errors import ConfigError
        root = Path(out or DEFAULT_OUT).absolute()
        probe = root
        while not probe.exists() and probe != probe.parent:
            probe = probe.parent
        if not probe.is_dir():
            raise ConfigError(f"{label} {root}: {probe} is a file, not a directory; give {label} a directory")
        if not os.access(probe, os.W_OK | os.X_OK):
            raise ConfigError(f"{label} {root}: {probe} is not writable here; give {label} a writable directory")
        free = shutil.disk_usage(probe).free
        if free < self.disk_bytes:
            raise ConfigError(f"{label} {root}: {fc.fmt_bytes(free)} free on its disk and this plan writes about "
                              f"{fc.fmt_bytes(self.disk_bytes)} (records, checkpoints); free some space or give "
                              f"{label} a directory on another disk")

    def echo(self) -> None:
        for line in self.lines():
            click.echo(line)

    def check_memory(self, device, change: str, free: int | None = None) -> str | None:
        """Refuse a plan whose estimated peak memory is more than :data:`MEMORY_SLACK` times what
        ``device`` has free, before any work, in one line naming the options to ``change``; warn
        (return the warning) when it exceeds the free memory by less.

        The estimate is soft (:mod:`harness.costs.estimate`: activations by Korthikanti et al.'s
        count with attention scores materialised, which a fused attention does not hold; no
        router state, no allocator overhead), so only a plan that misses by more than that factor
        is refused.

        Returns:
            the warning, or None when the plan fits.

        Raises:
            ConfigError: the estimate exceeds ``MEMORY_SLACK`` × ``free`` bytes (default: the
            device's free memory, :func:`harness.costs.memory.available_bytes`).
        """
        from harness.costs.memory import available_bytes
        from routers.errors import ConfigError
        free = available_bytes(device) if free is None else free
        if self.peak_bytes <= free:
            return None
        what = (f"this plan needs {fc.fmt_bytes(self.peak_bytes)} by estimate ({self.peak_what}) and "
                f"{device.type} has {fc.fmt_bytes(free)} free")
        if self.peak_bytes > MEMORY_SLACK * free:
            raise ConfigError(f"{what}: lower {change}")
        return (f"warning: {what}; the estimate is soft (within {MEMORY_SLACK:g}x), so the run goes on, "
                f"but it may run out of memory: lower {change} to be safe")

    def manifest(self, resumed: bool = False) -> dict:
        """The manifest's ``plan``: ranges as ``[low, high]`` seconds."""
        r = lambda s: [round(s[0], 1), round(s[1], 1)]  # noqa: E731
        return {"estimate_s": r(self.estimate), "uncalibrated_s": r(self.uncalibrated),
                "parts": {k: r(v) for k, v in self.parts.items()}, "calibration": self.calibration,
                "load": self.load,
                "peak_bytes": self.peak_bytes, "resumed": resumed, "summary": self.lines(), **self.details}


def calibrate(plan: Plan, out: str | None, device, exclude: str | None = None) -> Plan:
    """``plan`` with the calibration of earlier runs under ``out/<device slug>`` (``exclude``: the
    run id of this run, which a resumed run's own manifest must not calibrate) and the machine's
    present load (:func:`harness.costs.forecast.load_now`: a busy machine widens the high end),
    once ``out`` is found writable with room for what the plan writes (:meth:`Plan.check_out`).

    Raises:
        ConfigError: as :meth:`Plan.check_out`.
    """
    from harness.rundir.environment import device_slug
    plan.check_out(out)
    root = Path(out or DEFAULT_OUT) / device_slug(device)
    earlier = [m for m in fc.read_manifests(root) if m.get("run_id") != exclude]
    plan.calibration = fc.calibration(earlier, plan.command)
    plan.load = fc.load_now()
    return plan


def _device_name(device) -> str | None:
    if device.type != "cuda":
        return None
    from harness.rundir.environment import device_name
    return device_name(device)


def plan_run(spec, cases, opts, device, race_tc=None, race_options=None, vocab: int = EMBEDDED_VOCAB) -> Plan:
    """The plan of ``routerbench run``: the sweep, the smoke race (``race_tc`` None: none), the report."""
    from harness.sweep.forecast import forecast_sweep
    name = _device_name(device)
    sw = forecast_sweep(cases, opts, device.type, name)
    parts = dict(sw.parts)
    singles = sum(n == 1 for n in sw.units)
    if opts.paired:
        groups = _n(sw.groups, "group") + " (paired)" + (f" and {_n(singles, 'single case')}" if singles else "")
    else:
        groups = f"{_n(len(sw.units), 'unit')} (unpaired: one case each)"
    head = f"plan: {_n(sw.cases, 'cost case')} in {groups}, {_n(sw.compiled, 'model')} to compile"
    peak, what = sw.peak_bytes, f"group {sw.peak_unit + 1}: {_n(sw.peak_cases, 'case')} resident"
    details = {"sweep": sw.manifest()}
    if race_tc is not None:
        from harness.training.forecast import PlannedRun, forecast_training
        runs = [PlannedRun(r, o, race_tc, race_tc.max_steps) for r, o in race_options.items()]
        from harness.costs.memory import available_bytes
        tr = forecast_training(runs, vocab, device.type, name, schedule="auto",
                               available_bytes=available_bytes(device))
        parts["race"] = tr.total
        head += f"; smoke race: {_n(len(runs), 'run')} x {race_tc.max_steps} steps"
        details["race"] = tr.manifest()
        if tr.peak_bytes > peak:
            peak, what = tr.peak_bytes, "smoke race: " + _schedule_words(tr, _n(len(runs), "run"))[1]
    if spec.output.report:
        parts["report"] = fc.REPORT_S
    sub = (f"compile {_n(sw.compiled, 'model')}", ("compile",)) if sw.compiled else None
    shown = [("set-up", ("setup", "compile"), sub), ("timing", ("timing",), None),
             ("race", ("race",), None), ("report", ("report",), None)]
    disk = sw.disk_bytes + (tr.disk_bytes if race_tc is not None else 0)
    return Plan("run", head, parts, shown, f"timing: {sw.rounds}", peak, what, details=details,
                skipped=sw.skipped, disk_bytes=disk, notes=list(sw.notes))


def _training_shown(tr) -> list:
    sub = (f"compile {_n(tr.compiled, 'model')}", ("compile",)) if tr.compiled else None
    return [("set-up", ("setup", "compile"), sub), ("steps", ("steps",), None),
            ("evaluations", ("evals",), None), ("report", ("report",), None)]


def _schedule_words(tr, held: str) -> tuple[str, str]:
    """(the schedule in words, what the peak memory holds)."""
    kinds = sorted(set(tr.schedules.values()) - {"alone"}) or ["sequential"]
    inter = "interleaved" in kinds
    return "/".join(kinds), (f"{held}, interleaved" if inter else "one run at a time")


def plan_train(spec, tc, options: dict[str, dict], seeds: list[int], device, vocab: int,
               pilot: tuple[str, dict, int] | None = None, world_size: int = 1) -> Plan:
    """The plan of ``routerbench train``: ``pilot`` is ``(router, options, stop step)`` or None."""
    from harness.costs.memory import available_bytes
    from harness.training.forecast import PlannedRun, forecast_training
    runs = [PlannedRun(r, o, tc, tc.max_steps, group=s) for s in seeds for r, o in options.items()]
    if pilot is not None:
        runs.insert(0, PlannedRun(pilot[0], pilot[1], tc, pilot[2], group="pilot"))
    tr = forecast_training(runs, vocab, device.type, _device_name(device), spec.training.schedule,
                           available_bytes(device), world_size)
    sched, what = _schedule_words(tr, f"the {len(options)} runs of a seed")
    pilot_words = f" and a {pilot[0]} pilot to step {pilot[2]}" if pilot else ""
    head = (f"plan: {_n(len(runs) - bool(pilot), 'training run')} ({_n(len(options), 'router')} x "
            f"{_n(len(seeds), 'seed')}){pilot_words}, {tr.steps} steps, schedule {sched}, "
            f"{_n(tr.compiled, 'model')} to compile")
    parts = dict(tr.parts)
    if spec.output.report:
        parts["report"] = fc.REPORT_S
    note = f"at most {tc.max_steps} steps a run" + (", fewer with --stop-at-target" if tc.stop_at_target else "")
    return Plan("train", head, parts, _training_shown(tr), note, tr.peak_bytes, what,
                details={"training": tr.manifest()}, disk_bytes=tr.disk_bytes)


def plan_study(spec, device, vocab: int) -> Plan:
    """The plan of ``routerbench study depth``: the timed estimate it makes first, then the runs."""
    from harness.costs.memory import available_bytes
    from harness.training.forecast import PlannedRun, forecast_training, probe_seconds
    st, name = spec.study, _device_name(device)
    runs, probe = [], (0.0, 0.0)
    for seed in st.seed_list:
        for depth in st.depths:
            tc = spec.train_config(depth)
            for r, o in spec.options_at(depth).items():
                runs.append(PlannedRun(r, o, tc, tc.max_steps, group=(seed, depth)))
                if seed == st.seed_list[0]:
                    probe = fc.add(probe, probe_seconds(runs[-1], min(st.estimate_steps, tc.max_steps),
                                                        vocab, device.type, name))
    tr = forecast_training(runs, vocab, device.type, name, st.schedule, available_bytes(device))
    routers = spec.routers.routers
    sched, what = _schedule_words(tr, f"the {len(routers)} runs of a seed and depth")
    head = (f"plan: {_n(len(runs), 'study run')} ({_n(len(routers), 'router')} x {_n(len(st.depths), 'depth')} x "
            f"{_n(st.seeds, 'seed')}), {tr.steps} steps, schedule {sched}, {_n(tr.compiled, 'model')} to compile")
    parts = {"estimate": probe, **tr.parts}
    if spec.output.report:
        parts["report"] = fc.REPORT_S
    shown = [("timed estimate", ("estimate",), None), *_training_shown(tr)]
    return Plan("study depth", head, parts, shown, f"{st.max_steps} steps a run", tr.peak_bytes, what,
                details={"training": tr.manifest(), "estimate_steps": st.estimate_steps},
                disk_bytes=tr.disk_bytes)
