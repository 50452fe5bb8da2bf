"""Measuring one case: its model, parameter counts, FLOPs, router cost models, saved-activation
bytes, CUDA peak memory, compile or capture time, warm-up and (alone) its timed steps.

Per case, in separate passes (MEASUREMENT.md): parameter counts; FLOPs on the uncompiled model (once
per router and shape); saved-activation bytes (``fwd_bwd``); CUDA peak memory in an untimed step;
then warm-up and timed repeats. A failing case becomes an ``error`` or ``oom`` row, never an
exception out of :func:`run_case`. The sweep (:mod:`harness.sweep`) decides which cases form a unit
and times a paired group's kept steps together (:mod:`harness.paired`).
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass, field

import torch

from workloads.data import synthetic_batch
from workloads.decoder import Decoder, parameter_counts

from . import backends, faults
from .cases import Case
from .cudagraph import GraphedStep
from .memory import cuda_peak_memory, model_tensors, saved_activation_bytes
from .modes import make_step, prefill_for_decode
from .noise import THRESHOLDS
from .rundir import StagingWriter
from .timing import TimingPolicy, time_steps, warm_up

#: Paired timing is on by default (``routerbench run --paired/--no-paired``): it costs no extra
#: timed steps, only one untimed interleaved round and the group's resident memory.
PAIRED_DEFAULT = True


@dataclass(frozen=True)
class SweepOptions:
    """What to measure besides step time, and how to run the units of a sweep.

    Attributes:
        flops: count FLOPs by both paths (fvcore skipped with a reason when it is missing).
        memory: saved-activation bytes, and CUDA peak memory on CUDA.
        timing: warm-up and repeat policy.
        paired: time the routers of each backend, mode and shape interleaved with their
            ``prenorm`` (:mod:`harness.paired`), one unit of resume per group; otherwise each
            case alone, one unit per case.
        pair_order: ``"ABBA"`` or ``"ABAB"`` (:data:`harness.paired.ORDERS`).
        isolate: run each unit in its own subprocess (a crash or a hang loses only that unit; its
            cases are then re-run one by one to pin the failure on its case).
        case_timeout: seconds a case may go without progress under ``isolate`` before its
            process is killed as hung.
        remeasure_s: seconds a noisy group (:mod:`harness.noise`) may spend being timed again,
            its steps held: another attempt starts only when one more (as long as the last) fits.
        max_attempts: timings of one group at most (1: never re-measure).
        noise_thresholds: the thresholds of :data:`harness.noise.THRESHOLDS` to re-measure by.
        group_budget_bytes: a paired group estimated above this many bytes is split into
            subgroups that each hold prenorm (:func:`harness.paired.split_group`); None: never.
    """

    flops: bool = True
    memory: bool = True
    timing: TimingPolicy = TimingPolicy()
    paired: bool = PAIRED_DEFAULT
    pair_order: str = "ABBA"
    isolate: bool = False
    case_timeout: float = 900.0
    remeasure_s: float = 60.0
    max_attempts: int = 3
    noise_thresholds: dict = field(default_factory=lambda: dict(THRESHOLDS))
    group_budget_bytes: int | None = None


def build_model(case: Case, device: torch.device) -> Decoder:
    """The case's decoder with seeded weights on ``device``."""
    torch.manual_seed(case.seed)
    return Decoder(case.cfg, case.router, case.router_kwargs()).to(device)


def flops_key(case: Case) -> tuple:
    """FLOPs are a property of router, options, impl and shape: counted once per key."""
    return (case.router, case.key.split("|")[1], case.impl, case.cfg)


def measure_flops(case: Case, model: Decoder, x: torch.Tensor, w: StagingWriter) -> None:
    """FLOPs of the uncompiled model, by two paths (docs/FLOPS.md).

    Rows: ``fwd_flops_dispatch``, ``router_flops_dispatch`` (FLOP, :mod:`harness.flop_counter`,
    needs only torch), ``bwd_flops_dispatch`` (FLOP of the backward; counted whatever the
    case's mode, since a router and shape is counted once); ``fwd_flops_fvcore``,
    ``router_flops_fvcore`` (FMA, fvcore, skipped without it).
    """
    from .flop_counter import count_flops_dispatch

    cols = case.columns()
    dc = count_flops_dispatch(model, (x,), backward=True, strict=False)
    if dc["unsupported"]:  # a kernel of another device or torch version: name it, go on
        w.write(**cols, metric="fwd_flops_dispatch", unit="FLOP", status="error",
                error=f"no FLOP rule for {sorted(dc['unsupported'])} (harness/flop_counter.py)")
    else:
        w.write(**cols, metric="fwd_flops_dispatch", value=dc["fwd_flops"], unit="FLOP")
        w.write(**cols, metric="router_flops_dispatch", value=dc["router_fwd_flops"], unit="FLOP")
        if dc["bwd_flops"] is not None:
            w.write(**cols, metric="bwd_flops_dispatch", value=dc["bwd_flops"], unit="FLOP")
    try:
        from .flops import count_fwd_flops
    except ImportError as exc:  # fvcore is optional on a bare GPU box
        w.write(**cols, metric="fwd_flops_fvcore", unit="FMA", status="skipped", error=f"fvcore unavailable: {exc}")
        return
    fc = count_fwd_flops(model, (x,))
    w.write(**cols, metric="fwd_flops_fvcore", value=fc.total_fma, unit="FMA")
    w.write(**cols, metric="router_flops_fvcore", value=fc.router_fma, unit="FMA")


def measure_router_costs(case: Case, model: Decoder, w: StagingWriter) -> None:
    """The router's cost models and its measured traffic (per router, impl and shape).

    Rows: ``router_flops_analytic`` (FLOP, the naive reference formula), ``router_state``
    (bytes, peak live state of this impl), ``router_io_ideal`` and ``router_io_measured``
    (bytes per token and sublayer: the ideal I/O model of the AttnRes paper's Table 1, and what
    this eager impl's ops read and write, :mod:`harness.traffic`, measured on the CPU on one
    sequence of at most 32 tokens).
    """
    from .traffic import router_bytes_moved

    cols, cfg, r = case.columns(), case.cfg, model.router
    item = cfg.torch_dtype.itemsize
    impl = case.impl if case.impl in r.impls else None
    w.write(**cols, metric="router_flops_analytic", unit="FLOP",
            value=r.analytic_fwd_flops(cfg.batch_size, cfg.seq_len))
    w.write(**cols, metric="router_state", unit="bytes",
            value=r.live_state_bytes(cfg.batch_size, cfg.seq_len, cfg.torch_dtype, impl=impl))
    w.write(**cols, metric="router_io_ideal", unit="bytes/token/sublayer",
            value=r.ideal_io_per_token() * cfg.d_model * item)
    w.write(**cols, metric="router_io_measured", unit="bytes/token/sublayer",
            # per-token traffic does not depend on B·T: measure on one short sequence
            value=router_bytes_moved(r, 1, min(cfg.seq_len, 32), cfg.torch_dtype) * cfg.d_model * item)


def impl_unavailable(case: Case, device: torch.device) -> str | None:
    """Why the case's implementation cannot run here (a peer kernel's package, device, dtype or
    mode; ``routers/impls.py``), or None."""
    from routers import impls
    if case.router not in impls.BLOCK_ROUTERS or case.impl in ("naive", "two_phase"):
        return None
    impl = impls.get(case.impl, case.router)
    why = impl.unavailable_reason(device.type, case.cfg.dtype, case.mode)
    if why is None and device.type == "cpu" and impl.interpretable and case.backend != "eager":
        why = f"impl {impl.name} runs on a CPU only under Triton's interpreter, eager only (not {case.backend})"
    return why


#: Tokens of the one sequence a parity check runs (the case's width, depth and dtype).
PARITY_TOKENS = 128
#: Parity results of this process, per router, options, impl, shape, dtype, device and backward.
_PARITY: dict[tuple, object] = {}


def check_parity(case: Case, device: torch.device, w: StagingWriter) -> bool:
    """Before an impl other than ``naive`` of a block router is timed, check it against ``naive``
    at the case's width, depth, dtype and device on one sequence of at most
    :data:`PARITY_TOKENS` tokens (:func:`harness.parity.router_parity`; once per router, options,
    impl, shape, dtype, device and backward in a process). Writes a ``parity_error`` row (the largest
    relative error; unit ``rel``) and, on failure, the case's ``error`` row ``parity failed: …``.

    Returns:
        whether the case may be timed.
    """
    from routers import impls

    from .parity import BACKWARD_MODES, router_parity
    if case.router not in impls.BLOCK_ROUTERS or case.impl == "naive":
        return True
    cfg, backward = case.cfg, case.mode in BACKWARD_MODES
    # The router mixes over depth per token: one sequence of at most PARITY_TOKENS tokens has every
    # source count, width and dtype of the case at a fraction of its memory (naive runs in float64).
    tokens = min(cfg.seq_len, PARITY_TOKENS)
    key = (case.router, case.key.split("|")[1], case.impl, cfg.d_model, cfg.n_layers, tokens,
           cfg.dtype, str(device), backward)
    if key not in _PARITY:
        _PARITY[key] = router_parity(case.router, case.options, case.impl, cfg.d_model, cfg.n_layers,
                                     1, tokens, cfg.torch_dtype, device, backward)
    res = _PARITY[key]
    cols = case.columns()
    w.write(**cols, metric="parity_error", value=res.max_rel_err if res.max_rel_err == res.max_rel_err else None,
            unit="rel", status="ok" if res.ok else "error", error=None if res.ok else res.message())
    if not res.ok:
        w.write(**cols, metric="step_time", unit="ms", status="error", error=res.message())
    return res.ok


def naive_twin(case: Case, model: Decoder) -> Decoder:
    """``model`` itself, or for a peer kernel's case (``routers/peers/``) the same decoder with
    the naive impl and the same weights: FLOP counters and the traffic model see a peer's Triton
    launches or custom ops as opaque, while the maths, and so the FLOPs, are naive's."""
    if case.impl in ("naive", "two_phase") or "impl" not in case.router_kwargs():
        return model
    twin = Decoder(case.cfg, case.router, {**case.router_kwargs(), "impl": "naive"})
    twin.load_state_dict(model.state_dict())
    return twin.to(next(model.parameters()).device)


def run_case(case: Case, device: torch.device, w: StagingWriter, opts: SweepOptions,
             count_flops: bool = True, hold: dict | None = None) -> str:
    """Measure one case; returns its final status (``ok``, ``oom`` or ``error``).

    With ``hold`` the case stops after its warm-up and leaves its step in ``hold[case.key]``,
    to be timed with the other cases of its group (:mod:`harness.paired`).
    """
    cols = case.columns()
    reason = backends.unavailable_reason(case.backend, case.compile_mode, device) or impl_unavailable(case, device)
    if reason:
        w.write(**cols, metric="step_time", unit="ms", status="skipped", error=reason)
        return "skipped"
    try:
        faults.maybe_inject(case.key)  # the test hook (harness/faults.py); a no-op unless set
        if not check_parity(case, device, w):
            return "error"
        model = build_model(case, device)
        counts = parameter_counts(model)
        w.write(**cols, metric="params_matrix", value=counts["matrix"], unit="count")
        w.write(**cols, metric="params_router", value=counts["router"], unit="count")
        x, y = synthetic_batch(case.cfg.vocab_size, case.cfg.batch_size, case.cfg.seq_len,
                               seed=case.seed, device=device)
        if count_flops:
            counted = naive_twin(case, model)  # FLOPs are the maths': a peer kernel's are naive's
            for what, fn in (("router_io_measured", lambda: measure_router_costs(case, counted, w)),
                             ("fwd_flops_fvcore", lambda: opts.flops and measure_flops(case, counted, x, w))):
                try:
                    fn()
                except Exception as exc:  # noqa: BLE001 - a count that fails never stops the timing
                    w.write(**cols, metric=what, status="error", error=f"not counted: {type(exc).__name__}: "
                            f"{str(exc).splitlines()[0] if str(exc) else ''}")
        if opts.memory and case.mode == "fwd_bwd" and case.backend == "eager":
            # autograd's saved tensors of the eager graph (a compiled graph saves its own set)
            model.train()
            saved = saved_activation_bytes(lambda: model(x), exclude=model_tensors(model))
            w.write(**cols, metric="saved_activation", value=saved, unit="bytes")
        decode_input = prefill_for_decode(model, x) if case.mode == "decode" else None
        prepared = backends.prepare(model, case.backend, case.compile_mode)
        step = make_step(prepared.model, case.mode, x, y, clone_outputs=prepared.clone_outputs,
                         decode_input=decode_input)
        if case.backend == "compile":
            w.write(**cols, metric="compile_time", value=backends.first_call_seconds(step, device), unit="s")
            w.write(**cols, metric="graph_breaks", value=backends.graph_breaks(), unit="count")
        elif case.backend == "cudagraph":
            step = GraphedStep(model, case.mode, x, y, decode_input=decode_input)
            w.write(**cols, metric="capture_time", value=step.capture_time_s, unit="s")
        if opts.memory and device.type == "cuda":
            for metric, value in cuda_peak_memory(step, device).items():
                w.write(**cols, metric=metric, value=value, unit="bytes" if "peak" in metric else "count")
        step = faults.maybe_slow(case.key, step)
        warm_up(step, device, opts.timing)
        if hold is not None:
            hold[case.key] = step
            return "ok"
        with backends.recompile_guard(case.backend):
            times = time_steps(step, device, opts.timing.repeats)
        for i, ms in enumerate(times):
            w.write(**cols, metric="step_time", value=ms, unit="ms", repeat=i)
        return "ok"
    except torch.cuda.OutOfMemoryError as exc:
        w.write(**cols, metric="step_time", unit="ms", status="oom", error=str(exc).splitlines()[0])
        return "oom"
    except Exception as exc:  # one broken case never kills a sweep
        last = traceback.extract_tb(exc.__traceback__)[-1]
        w.write(**cols, metric="step_time", unit="ms", status="error",
                error=f"{type(exc).__name__}: {exc} ({last.filename}:{last.lineno})")
        return "error"
    finally:
        if device.type == "cuda":
            torch.cuda.empty_cache()
