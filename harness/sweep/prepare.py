"""Preparing a group of cases to be timed: the one prepare step of ``routerbench run``, the
pytest-benchmark suite (:mod:`harness.ci.pairbench`) and ``routerbench profile``
(:mod:`harness.sweep.profile`) (DESIGN.md, "Layers"; MEASUREMENT.md, "Timing", "Memory",
"torch.compile").

Per case, in separate passes (MEASUREMENT.md): parity of an impl other than ``naive``
(:mod:`harness.sweep.parity`); the model; parameter counts; FLOPs, the router's cost models and the
ops per eager step on the uncompiled model, once per router and shape (:mod:`harness.sweep.counts`); saved-activation
bytes (eager ``fwd_bwd``); the backend's set-up (compile time and graph breaks, or the CUDA-graph
capture); CUDA peak memory in an untimed step; warm-up. A failing case becomes an ``error``,
``oom`` or ``skipped`` row, never an exception out of :func:`prepare_case`. The warm steps of a
group are then timed together (:mod:`harness.sweep.timed`).
"""

from __future__ import annotations

import contextlib
import sys
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, NamedTuple, Protocol

import torch
from tqdm import tqdm

from harness.costs.memory import cuda_peak_memory, model_tensors, saved_activation_bytes
from harness.rundir import faults
from harness.rundir.writer import StagingWriter
from harness.step import backends
from harness.step.backends import compiles, of
from harness.step.device_errors import DeviceContextLost, poisons_context
from harness.step.guard import capture_findings
from harness.step.modes import make_optimizer, make_step, prefill_for_decode
from harness.timing.gpu import device_busy_share
from harness.timing.timer import warm_up
from routers import impls
from workloads.batches import synthetic_batch
from workloads.decoder import Decoder, parameter_counts

from . import counts, parity
from .cases import Case
from .options import SweepOptions

#: A warm step: one call runs one step of the case's mode on its backend.
Step = Callable[[], object]


class Heartbeat(Protocol):
    """Called before each phase of a unit: ``beat(stage, weight, **info)``.

    ``stage`` is a short name (``case``, ``parity``, ``build``, ``count``, ``saved_activation``,
    ``compile``, ``capture``, ``peak_memory``, ``warmup``, ``device_busy``, ``prepared``, ``timing``), ``weight``
    how many cases' time the next phase may take, and ``info`` JSON-able fields: ``text`` (a
    sentence for a person), ``case`` (the case key) with ``router`` (its router), ``k`` and ``n``
    (model k of the group's n), and any other. :func:`harness.sweep.run.run_sweep` records each
    beat as a progress event (:class:`harness.rundir.progress.Progress`); under ``--isolate`` the
    child sends them to the parent, which also takes ``weight`` × ``--case-timeout`` as the
    deadline of the next beat (:mod:`harness.sweep.isolate`).
    """

    def __call__(self, stage: str, weight: int = 1, **info: Any) -> None: ...


def no_beat(stage: str, weight: int = 1, **info: Any) -> None:
    """The :class:`Heartbeat` that tells nobody."""


def case_label(case: Case) -> str:
    """``haares two_phase compile, layer scope``: what tells the cases of a group apart, for
    progress texts."""
    backend = case.backend
    if case.compile_mode and case.compile_mode != "default":
        backend += f":{case.compile_mode}"
    return f"{case.router} {case.impl} {backend}" + (f", {case.compile_scope} scope" if case.compile_scope else "")


def build_model(case: Case, device: torch.device) -> Decoder:
    """The case's decoder with seeded weights on ``device``."""
    torch.manual_seed(case.seed)
    return Decoder(case.cfg, case.router, case.router_kwargs()).to(device)


def flops_key(case: Case) -> tuple:
    """FLOPs are a property of router, options, impl and shape: counted once per key."""
    return (case.router, case.options_json, case.impl, case.cfg)


def impl_unavailable(case: Case, device: torch.device) -> str | None:
    """Why the case's implementation cannot run here (a peer kernel's package, device, dtype or
    mode, or ``fused``'s Triton, device or dtype; ``routers/impls.py``), or None."""
    if impls.family_of(case.router) is None:
        return None
    impl = impls.get(case.impl, case.router)
    if case.compile_scope == "layer" and impl.no_layer_scope:
        return f"impl {case.impl} {impl.no_layer_scope}: it runs under --compile-scope model"
    if impl.builtin:  # ours: naive, two_phase and lean run anywhere; fused needs Triton and CUDA (or its
        return impl.unavailable_reason(device.type, case.cfg.dtype, case.mode)  # interpreter), and no float64
    why = impl.unavailable_reason(device.type, case.cfg.dtype, case.mode)
    if why is None and device.type == "cpu" and impl.interpretable and not of(case.backend).plain:
        why = f"impl {impl.name} runs on a CPU only under Triton's interpreter, eager only (not {case.backend})"
    return why


def skip_reason(case: Case, device: torch.device) -> str | None:
    """Why ``case`` cannot run on ``device`` and will be a ``skipped`` row: its backend
    (:func:`harness.step.backends.unavailable_reason`: ``cudagraph`` or ``reduce-overhead`` without
    CUDA) or its impl (:func:`impl_unavailable`); None when it can run. The plan lists these
    before any work (``--dry-run`` too)."""
    return backends.unavailable_reason(case.backend, case.compile_mode, device) or impl_unavailable(case, device)


def naive_twin(case: Case, model: Decoder) -> Decoder:
    """``model`` itself, or for an opaque impl's case (a peer kernel of ``routers/peers/``, or
    ``lean``'s custom autograd Functions; ``routers.impls.Impl.opaque``) the same decoder with
    the naive impl and the same weights: fvcore and the traffic model see a peer's Triton
    launches, custom ops or a custom Function as one opaque call, while the maths, and so the
    FLOPs, are naive's."""
    if "impl" not in case.router_kwargs() or not impls.get(case.impl, case.router).opaque:
        return model
    twin = Decoder(case.cfg, case.router, {**case.router_kwargs(), "impl": impls.REFERENCE})
    twin.load_state_dict(model.state_dict())
    return twin.to(next(model.parameters()).device)


def capture_preflight(case: Case, device: torch.device, reason: str, quiet: bool = False) -> str:
    """The ``error`` text of a ``cudagraph`` case on a device without CUDA: ``reason`` (nothing is
    timed) and what would break its capture, found by running the step it would capture (its
    mode's :func:`harness.step.modes.make_step`; ``train_step`` with a non-capturable AdamW) once
    under :func:`harness.step.guard.capture_findings` on ``device`` (MEASUREMENT.md, "CUDA
    graphs"), each finding by file and line, or ``no finding``. Unless ``quiet`` each finding is
    also printed to stderr, one line each. Never raises: a step that fails is named in the text.
    """
    where = f"capture pre-flight on {device.type.upper()}"
    try:
        model = build_model(case, device)
        x, y = synthetic_batch(case.cfg.vocab_size, case.cfg.batch_size, case.cfg.seq_len,
                               seed=case.seed, device=device)
        decode_input = prefill_for_decode(model, x) if case.mode == "decode" else None
        optimizer = make_optimizer(model, capturable=False) if case.mode == "train_step" else None
        step = make_step(model, case.mode, x, y, decode_input=decode_input, optimizer=optimizer)
        findings = capture_findings(step, device)
    except Exception as exc:  # the skipped row still says why nothing was timed
        return f"{reason}, nothing timed; {where} failed: {type(exc).__name__}: {exc}"
    if not findings:
        return f"{reason}, nothing timed; {where}: no finding"
    if not quiet:
        for f in findings:
            # above a progress bar that may be drawing, on a line of its own
            tqdm.write(f"{where} ({case_label(case)} {case.mode}): {f}", file=sys.stderr)
    n = f"{len(findings)} finding{'s' * (len(findings) > 1)}"
    return f"{reason}, nothing timed; {where}: {n} would break the capture: " + "; ".join(map(str, findings))


class Setup(NamedTuple):
    """How one case's set-up ended: ``status`` (``ok``, ``skipped``, ``error`` or ``oom``), its
    warm ``step`` and the eager ``model`` it runs when ``ok``, else the ``error`` text its
    ``step_time`` row holds."""

    status: str
    step: Step | None = None
    error: str | None = None
    model: Decoder | None = None


def prepare_case(case: Case, device: torch.device, w: StagingWriter, opts: SweepOptions,
                 count_flops: bool = True, heartbeat: Heartbeat | None = None, k: int = 1,
                 n: int = 1) -> Setup:
    """Set one case up to be timed, writing its rows to ``w`` as they are measured: the module
    doc's stages, each after a ``heartbeat`` (:class:`Heartbeat`; model ``k`` of the group's ``n``).
    Rows: ``parity_error``, ``params_matrix`` / ``params_router``, :func:`_count`'s (``count_flops``),
    ``saved_activation`` and CUDA peak memory (``opts.memory``), the backend's
    (:meth:`harness.step.backends.Backend.ready_step`), :func:`_after_warmup`'s; else the
    ``step_time`` row of :func:`_unrunnable` (``skipped``) or :func:`_failed` (``error``, ``oom``).

    Returns:
        :class:`Setup`: ``ok`` and the warm step, or ``skipped`` / ``error`` / ``oom`` and why."""
    cols, b = case.columns(), backends.of(case.backend)
    label = f"model {k} of {n} ({case_label(case)})"

    def beat(stage: str, text: str) -> None:
        (heartbeat or no_beat)(stage, 1, text=text, case=case.key, router=case.router, k=k, n=n)

    if reason := _unrunnable(case, device, opts, beat, label):
        w.write(**cols, metric="step_time", unit="ms", status="skipped", error=reason)
        return Setup("skipped", error=reason)
    try:
        faults.maybe_inject(case.key)  # the test hook (harness/rundir/faults.py); a no-op unless set
        if parity.needs_parity(case):
            beat("parity", f"checking parity of {label} against naive")
        if (why := parity.check_parity(case, device, w)) is not None:
            return Setup("error", error=why)
        beat("build", f"building {label}")
        model = build_model(case, device)
        params = parameter_counts(model)
        for part in ("matrix", "router"):
            w.write(**cols, metric=f"params_{part}", value=params[part], unit="count")
        x, y = synthetic_batch(case.cfg.vocab_size, case.cfg.batch_size, case.cfg.seq_len, seed=case.seed,
                               device=device)
        if count_flops:
            beat("count", f"counting {'FLOPs, ' if opts.flops else ''}cost models and ops of {label}")
            _count(case, model, x, y, w, opts)
        if opts.memory and case.mode == "fwd_bwd" and b.plain:
            beat("saved_activation", f"measuring saved activations of {label}")
            model.train()  # autograd's saved tensors of the eager graph (a compiled graph saves its own)
            w.write(**cols, metric="saved_activation", unit="bytes",
                    value=saved_activation_bytes(lambda: model(x), exclude=model_tensors(model)))
        decode_input = prefill_for_decode(model, x) if case.mode == "decode" else None
        counted = backends.compile_counters() if b.compiles else None
        if b.stage is not None:
            beat(b.stage, f"compiling {label}" if b.compiles else f"capturing {label} in a CUDA graph")
        step = b.ready_step(model, case.mode, x, y, device, case.compile_mode, case.compile_scope, decode_input,
                            record=lambda metric, value, unit: w.write(**cols, metric=metric, value=value, unit=unit))
        if opts.memory and device.type == "cuda":
            beat("peak_memory", f"measuring CUDA peak memory of {label}")
            for metric, value in cuda_peak_memory(step, device).items():
                w.write(**cols, metric=metric, value=value, unit="bytes" if "peak" in metric else "count")
        step = faults.maybe_slow(case.key, step)
        beat("warmup", f"warming up {label}")
        warm_up(step, device, opts.timing)
        _after_warmup(case, b, model, step, device, w, counted, beat, label)
        return Setup("ok", step, model=model)
    except Exception as exc:  # one broken case never kills a sweep
        return _failed(case, w, exc)


def _unrunnable(case: Case, device: torch.device, opts: SweepOptions, beat, label: str) -> str | None:
    """Why the case cannot run here (:func:`skip_reason`), a ``cudagraph`` case without CUDA
    checked for what would break its capture first (:func:`capture_preflight`); None when it can."""
    reason = backends.unavailable_reason(case.backend, case.compile_mode, device)
    if reason and backends.captures(case.backend) and impl_unavailable(case, device) is None:
        beat("capture", f"checking {label} for what would break a CUDA-graph capture (no CUDA here)")
        reason = capture_preflight(case, device, reason, quiet=opts.quiet)
    return reason or impl_unavailable(case, device)


def _count(case: Case, model: Decoder, x, y, w: StagingWriter, opts: SweepOptions) -> None:
    """The router's cost models, the ops of one eager step (``ops_fwd``, ``ops_bwd``; on CUDA
    ``kernels_fwd_bwd``) and its FLOPs (``opts.flops``): :func:`harness.sweep.counts.count_case`.
    lean's FLOPs are its naive twin's (fvcore cannot see into its Functions), its models its own."""
    lean = "impl" in case.router_kwargs() and impls.get(case.impl, case.router).backward == "recompute"
    counts.count_case(case, naive_twin(case, model), x, w, opts.flops, costs_of=model if lean else None,
                      ops_of=model, y=y)
    if opts.flops and lean:
        counts.measure_recompute(case, model, x, w)


def _after_warmup(case: Case, b: backends.Backend, model: Decoder, step: Step, device: torch.device,
                  w: StagingWriter, counted: dict[str, int] | None, beat, label: str) -> None:
    """On the warm step: a plain backend on CUDA, ``device_busy`` (the share of the step the host
    bounds); a compiled one, the compile's graphs and caches, warm-up recompiles included."""
    cols = case.columns()
    if b.plain and device.type == "cuda":
        beat("device_busy", f"tracing the device-busy share of {label}")
        if (busy := device_busy_share(step, device)) is not None:
            w.write(**cols, metric="device_busy", value=busy, unit="ratio")
    if counted is not None:
        regions = len(model.regions.roles) + 2 if model.regions is not None else 1
        for metric, value in backends.compile_rows(counted, backends.compile_counters(), regions).items():
            w.write(**cols, metric=metric, value=value, unit="count")


def _failed(case: Case, w: StagingWriter, exc: Exception) -> Setup:
    """The row of a case whose set-up raised: ``oom`` (its first line) or ``error`` (type, text and
    where), unless the error poisons the device, which ends the process's work
    (:class:`harness.step.device_errors.DeviceContextLost`)."""
    if isinstance(exc, torch.cuda.OutOfMemoryError):
        why = str(exc).splitlines()[0]
        w.write(**case.columns(), metric="step_time", unit="ms", status="oom", error=why)
        return Setup("oom", error=why)
    last = traceback.extract_tb(exc.__traceback__)[-1]
    why = f"{type(exc).__name__}: {exc} ({last.filename}:{last.lineno})"
    if poisons_context(exc):  # nothing more can run in this process: the sweep records it
        raise DeviceContextLost(case.key, why) from exc
    w.write(**case.columns(), metric="step_time", unit="ms", status="error", error=why)
    return Setup("error", error=why)


class NetOfResident:
    """A writer that subtracts the memory held by a group's earlier steps from a case's CUDA
    peak-memory rows, so they read as in an unpaired sweep (allocated exactly, reserved
    approximately: the allocator may reuse free space of segments the earlier steps hold);
    everything else passes through."""

    def __init__(self, w: StagingWriter, device: torch.device) -> None:
        self._w = w
        self._held = {"peak_allocated": torch.cuda.memory_allocated(device),
                      "peak_reserved": torch.cuda.memory_reserved(device)}

    def write(self, **row: Any) -> dict[str, Any]:
        if row.get("metric") in self._held and row.get("value") is not None:
            row["value"] = row["value"] - self._held[row["metric"]]
        return self._w.write(**row)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._w, name)


@contextlib.contextmanager
def compile_group(cases: list[Case]) -> Iterator[None]:
    """Let the compiled models of one group live side by side, and make a fall-back to eager an
    error.

    ``backends.prepare`` resets dynamo per case, which would drop the earlier cases' compiled
    code (and recompile it, in the timed region or at the recompile limit, silently eager). Here
    dynamo is reset once before and once after the group (``backends.one_dynamo_cache``); the
    recompile limit fits the group's model-scope cases (all share ``Decoder.forward``'s code
    object, one cache entry each; guards keep them apart), and is 1 when every compiled case is
    of the layer scope (each region has a code object of its own and compiles once:
    :class:`workloads.decoder.Regions`); ``fail_on_recompile_limit_hit`` turns a region or model
    that would run eager past the limit into an error (an ``error`` row); automatic dynamic shapes
    are off so a later model's parameter shapes cannot turn an earlier graph dynamic. The
    recompile guard still turns any compile during timing into an error.
    """
    compiled = [c for c in cases if compiles(c.backend)]
    if not compiled:
        yield
        return
    cfg = torch._dynamo.config
    name = "recompile_limit" if hasattr(cfg, "recompile_limit") else "cache_size_limit"  # < 2.6
    n_model = sum(c.compile_scope != "layer" for c in compiled)
    limit = max(getattr(cfg, name), n_model + 8) if n_model else 1
    with backends.one_dynamo_cache(), cfg.patch(**{name: limit}, automatic_dynamic_shapes=False,
                                                fail_on_recompile_limit_hit=True):
        yield


@dataclass
class PreparedGroup:
    """The warm steps of a group, held while it is timed.

    Attributes:
        steps: case key -> warm step, for the cases that set up ``ok``.
        models: case key -> the eager model its step runs (a trace switches its labels on).
        status: case key -> status so far (timing adds to it).
        errors: case key -> why a case did not set up (its ``step_time`` row's error).
    """

    steps: dict[str, Step] = field(default_factory=dict)
    models: dict[str, Decoder] = field(default_factory=dict)
    status: dict[str, str] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)


@contextlib.contextmanager
def prepare_group(todo: list[tuple[Case, bool]], device: torch.device, w: StagingWriter,
                  opts: SweepOptions, heartbeat: Heartbeat | None = None) -> Iterator[PreparedGroup]:
    """Set up every case of a group (:func:`prepare_case`) and hold their warm steps while the
    body times them: the one prepare step of ``run``, the benchmark suite and ``profile``.

    The cases are prepared inside :func:`compile_group`, so the compiled models of the group live
    side by side; Inductor's once-per-process probe runs beside the set-ups before the first
    compiled case (:func:`harness.step.backends.warm_inductor`); on CUDA, a case's peak-memory rows are written net of what the steps prepared
    before it hold (:class:`NetOfResident`).

    Args:
        todo: (case, count its router's FLOPs here) for each case of the group.
        heartbeat: see :class:`Heartbeat`: ``case`` before each case, the stages of
            :func:`prepare_case`, then ``prepared`` with its ``status``.

    Yields:
        the :class:`PreparedGroup`. On exit its steps are dropped and, on CUDA, the cache emptied.
    """
    beat = heartbeat or no_beat
    cases = [c for c, _ in todo]
    group = PreparedGroup()
    lost = False
    any_compiled = any(compiles(c.backend) and skip_reason(c, device) is None for c in cases)
    inductor_ready = backends.warm_inductor(device) if any_compiled else (lambda: None)
    try:
        with compile_group(cases):
            for k, (case, first) in enumerate(todo, 1):
                if compiles(case.backend):
                    inductor_ready()  # Inductor's once-per-process probe, run beside the eager set-ups
                at = dict(case=case.key, router=case.router, k=k, n=len(todo))
                beat("case", 1, text=f"setting up model {k} of {len(todo)} ({case_label(case)})", **at)
                cw = NetOfResident(w, device) if group.steps and device.type == "cuda" else w
                got = prepare_case(case, device, cw, opts, count_flops=first, heartbeat=beat, k=k, n=len(todo))
                beat("prepared", 1, text=f"model {k} of {len(todo)} ({case_label(case)}) set up: {got.status}",
                     status=got.status, **({"error": got.error[:300]} if got.error else {}), **at)
                group.status[case.key] = got.status
                if got.step is not None:
                    group.steps[case.key], group.models[case.key] = got.step, got.model
                else:
                    group.errors[case.key] = got.error or got.status
                if device.type == "cuda":
                    torch.cuda.empty_cache()
            yield group
    except DeviceContextLost:
        lost = True  # the context is unusable: emptying the cache would raise the same error again
        raise
    finally:
        group.steps.clear()
        if device.type == "cuda" and not lost:
            torch.cuda.empty_cache()
