"""What a case's router costs, counted on its uncompiled model once per router and shape: FLOPs by
two paths (docs/FLOPS.md), the analytic FLOP and ideal I/O models beside the code of each router,
its live state, the traffic its eager ops measure (MEASUREMENT.md, "FLOPs"), and the ops (and on
CUDA the kernel launches) of one eager step.
"""

from __future__ import annotations

import torch

from harness.costs.flop_counter import count_flops_dispatch, recompute_counter
from harness.costs.ops import count_kernel_launches, count_ops_step
from harness.costs.step_costs import step_costs
from harness.rundir.writer import StagingWriter
from routers.api import not_declared
from workloads.decoder import Decoder

from .cases import Case


def count_case(case: Case, model: Decoder, x: torch.Tensor, w: StagingWriter, flops: bool = True,
               costs_of: Decoder | None = None, ops_of: Decoder | None = None,
               y: torch.Tensor | None = None) -> None:
    """The router's cost models (:func:`measure_router_costs`, on ``costs_of`` when given), the
    ops of one eager step (:func:`measure_ops`, on ``ops_of``, the case's own model, when given,
    else ``costs_of`` or ``model``; targets ``y``, default ``x``; whatever ``flops`` says) and,
    with ``flops``, its FLOPs (:func:`measure_flops`) on ``model``: a count that fails is an
    ``error`` row of its metric (``router_io_measured``, ``ops_fwd``, ``fwd_flops_fvcore``) and
    never stops the case's timing."""
    cols = case.columns()
    own = model if costs_of is None else costs_of
    for what, fn in (("router_io_measured", lambda: measure_router_costs(case, own, w)),
                     ("ops_fwd", lambda: measure_ops(case, ops_of or own, x, x if y is None else y, w)),
                     ("fwd_flops_fvcore", lambda: flops and measure_flops(case, model, x, w))):
        try:
            fn()
        except Exception as exc:  # noqa: BLE001 - a count that fails never stops the timing
            w.write(**cols, metric=what, status="error", error=f"not counted: {type(exc).__name__}: "
                    f"{str(exc).splitlines()[0] if str(exc) else ''}")


def measure_ops(case: Case, model: Decoder, x: torch.Tensor, y: torch.Tensor, w: StagingWriter) -> None:
    """Ops of one eager step of the case's uncompiled model at its shape, dtype and device
    (:mod:`harness.costs.ops`; the model's grads, train flag and the RNG are left as they were).

    Rows: ``ops_fwd`` and ``ops_bwd`` (count: aten ops dispatched by ``model(x)`` in train mode
    and by the backward of the ``fwd_bwd`` loss), whatever the case's mode; on CUDA
    ``kernels_fwd_bwd`` (count: the profiler's kernel launches of one ``fwd_bwd`` step). A count
    that fails is an ``error`` row of its metric(s).
    """
    cols = case.columns()

    def failed(metrics: tuple[str, ...], exc: Exception) -> None:
        text = str(exc).splitlines()[0] if str(exc) else ""
        for metric in metrics:
            w.write(**cols, metric=metric, unit="count", status="error",
                    error=f"not counted: {type(exc).__name__}: {text}")
    try:
        ops = count_ops_step(model, x, y)
    except Exception as exc:  # noqa: BLE001 - a count that fails never stops the timing
        failed(("ops_fwd", "ops_bwd"), exc)
    else:
        w.write(**cols, metric="ops_fwd", value=ops["fwd"], unit="count")
        w.write(**cols, metric="ops_bwd", value=ops["bwd"], unit="count")
    try:
        launches = count_kernel_launches(model, x, y)
    except Exception as exc:  # noqa: BLE001
        failed(("kernels_fwd_bwd",), exc)
    else:
        if launches is not None:  # CUDA only
            w.write(**cols, metric="kernels_fwd_bwd", value=launches, unit="count")


def measure_flops(case: Case, model: Decoder, x: torch.Tensor, w: StagingWriter) -> None:
    """FLOPs of the uncompiled model, by two paths (docs/FLOPS.md).

    Rows: ``fwd_flops_dispatch``, ``router_flops_dispatch`` (FLOP, :mod:`harness.costs.flop_counter`,
    needs only torch), ``bwd_flops_dispatch`` (FLOP of the backward; counted whatever the
    case's mode, since a router and shape is counted once); ``fwd_flops_fvcore``,
    ``router_flops_fvcore`` (FMA, fvcore, skipped without it).
    """
    cols = case.columns()
    dc = count_flops_dispatch(model, (x,), backward=True, strict=False)
    if dc["unsupported"]:  # a kernel of another device or torch version: name it, go on
        w.write(**cols, metric="fwd_flops_dispatch", unit="FLOP", status="error",
                error=f"no FLOP rule for {sorted(dc['unsupported'])} (harness/costs/flop_counter.py)")
    else:
        w.write(**cols, metric="fwd_flops_dispatch", value=dc["fwd_flops"], unit="FLOP")
        w.write(**cols, metric="router_flops_dispatch", value=dc["router_fwd_flops"], unit="FLOP")
        if dc["bwd_flops"] is not None:
            w.write(**cols, metric="bwd_flops_dispatch", value=dc["bwd_flops"], unit="FLOP")
    try:
        from harness.costs.flops import count_fwd_flops
    except ImportError as exc:  # fvcore is optional on a bare GPU box
        w.write(**cols, metric="fwd_flops_fvcore", unit="FMA", status="skipped", error=f"fvcore unavailable: {exc}")
        return
    fc = count_fwd_flops(model, (x,))
    w.write(**cols, metric="fwd_flops_fvcore", value=fc.total_fma, unit="FMA")
    w.write(**cols, metric="router_flops_fvcore", value=fc.router_fma, unit="FMA")


def measure_recompute(case: Case, model: Decoder, x: torch.Tensor, w: StagingWriter) -> None:
    """The FLOP a ``lean`` backward spends recomputing forward quantities (``routers/block/lean.py``:
    keys, logits, softmax weights, the partial sums it rebuilds), counted on the case's own model
    by the dispatch counter inside the Functions' :func:`routers.block.lean.recomputing` scopes
    (the router's ``recompute_scope``, set for the count and cleared after it).

    Row: ``recompute_flops_dispatch`` (FLOP, per step; part of ``bwd_flops_dispatch`` of this
    model, whose other FLOP rows are its naive twin's). A count that fails is an ``error`` row.
    """
    modes: list = []

    def counter():
        modes.append(recompute_counter())
        return modes[-1]
    model.router.recompute_scope = counter
    try:
        count_flops_dispatch(model, (x,), backward=True, strict=False)
        value = sum(m.get_total_flops() for m in modes)
    except Exception as exc:  # noqa: BLE001 - a count that fails never stops the timing
        w.write(**case.columns(), metric="recompute_flops_dispatch", unit="FLOP", status="error",
                error=f"not counted: {type(exc).__name__}: {exc}")
        return
    finally:
        model.router.recompute_scope = None
    w.write(**case.columns(), metric="recompute_flops_dispatch", value=value, unit="FLOP")


def measure_router_costs(case: Case, model: Decoder, w: StagingWriter) -> None:
    """The router's cost models and what its forward moves (per router, impl and shape).

    Rows: ``router_flops_analytic`` (FLOP, the naive reference formula), ``router_state``
    (bytes, peak live state of this impl), ``router_io_ideal`` and ``router_io_measured``
    (bytes per token and sublayer of one forward: the ideal I/O model of the AttnRes paper's
    Table 1, and what this impl moves by the byte rule, :mod:`harness.costs.step_costs`, counted
    on the meta device at the case's shape and state: every op of ours by its tensors, every
    ``fused`` kernel by its declared byte model, no Triton needed), and for ``fused``
    ``router_io_kernel`` (the part of that forward its Triton kernels move). A cost model the
    router does not declare (``routers.api.declares``) is a ``skipped`` row with no value whose
    ``error`` starts with ``not declared`` (:func:`routers.api.not_declared`).
    """
    cols, cfg, r = case.columns(), case.cfg, model.router
    item = cfg.torch_dtype.itemsize
    impl = case.impl if case.impl in getattr(r, "cost_models", r.impls) else None
    ideal = r.ideal_io_per_token()
    for metric, unit, model, value in (
            ("router_flops_analytic", "FLOP", "analytic_fwd_flops", r.analytic_fwd_flops(cfg.batch_size, cfg.seq_len)),
            ("router_state", "bytes", "live_state_bytes",
             r.live_state_bytes(cfg.batch_size, cfg.seq_len, cfg.torch_dtype, impl=impl)),
            ("router_io_ideal", "bytes/token/sublayer", "ideal_io_per_token",
             None if ideal is None else ideal * cfg.d_model * item)):
        if value is None:  # a cost model the router does not declare: said, never a number
            w.write(**cols, metric=metric, unit=unit, status="skipped", error=not_declared(model, case.router))
        else:
            w.write(**cols, metric=metric, unit=unit, value=value)
    fwd = step_costs(case.router, cfg.d_model, cfg.n_layers, cfg.batch_size * cfg.seq_len, cfg.torch_dtype,
                     options=case.router_kwargs(), region=case.compile_scope == "layer", backward=False)
    w.write(**cols, metric="router_io_measured", unit="bytes/token/sublayer", value=fwd.per_token_sublayer(fwd.bytes))
    if fwd.launches_kernel:
        w.write(**cols, metric="router_io_kernel", unit="bytes/token/sublayer",
                value=fwd.per_token_sublayer(fwd.bytes_kernel))
