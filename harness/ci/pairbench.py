"""One benchmark of the pytest-benchmark suite, measured on ``routerbench run``'s path.

Each benchmark is a **pair** (:class:`harness.ci.suite.BenchPair`): a router against ``prenorm``
on the same backend, or a compiled (or graph-replayed) step against the eager step of the same
router. :class:`PairBench` prepares both sides with :func:`harness.sweep.prepare.prepare_group`,
the function ``routerbench run`` prepares a group with (parameters, FLOPs, saved activations, CUDA
peak memory, compile warm-up or CUDA-graph capture, warm-up); its :meth:`PairBench.round` is the
benchmark's callable and times one interleaved round of the pair with
:func:`harness.timing.paired.time_paired` under the recompile guard (CUDA events and a wait on the
end event on a GPU, so kernels are timed, not launches; ABBA order across rounds), and
:meth:`PairBench.finish` writes the timing rows and noise readings with
:func:`harness.sweep.timed.record_attempt`, as ``run`` does. pytest-benchmark's own table then
shows the host time of one round (both sides, synchronised); ``extra_info``
(:meth:`PairBench.extra_info`) holds each side's median, the per-pair ratio with its bootstrap
interval, FLOPs with their convention, saved-activation bytes, CUDA peak memory, tokens/s, MFU,
the noise readings, and every record row (``rows``), so ``routerbench report bench.json``
(:mod:`harness.ci.benchjson`) rebuilds the run's report and ``routerbench gate`` checks it like a
results directory.
"""

from __future__ import annotations

import contextlib
import statistics
import sys
from typing import Any, Callable

import torch

from harness.costs.peak import model_flops_per_step, peak_flops, tokens_per_step
from harness.rundir.environment import device_name, environment
from harness.rundir.writer import MemoryWriter
from harness.stats.bootstrap import MIN_PAIRS_FOR_CI, bootstrap_ratio_ci
from harness.step import backends
from harness.sweep import prepare, timed
from harness.sweep.cases import Case
from harness.sweep.options import SweepOptions
from harness.timing import noise, paired
from harness.timing.timer import synchronize
from routers import BASELINE

from .suite import BenchPair

#: What a dispatch-counted FLOP is (docs/FLOPS.md).
FLOP_CONVENTION = ("FLOP = 2 x multiply-add, counted at dispatch by harness.costs.flop_counter on the "
                   "uncompiled model (docs/FLOPS.md)")


#: Version of the ``extra_info`` layout.
EXTRA_SCHEMA = 1


class PairBench:
    """A pair set up on ``routerbench run``'s path and timed one interleaved round per call.

    Use as a context manager; the steps (and, on CUDA, their memory) are held until exit.

    Args:
        pair: the two cases.
        device: where they run.
        opts: the sweep options (FLOPs, memory, warm-up policy, pair order).

    Attributes (after entering):
        error: ``None``, or the failing case's status and error text (e.g. an ``oom`` row):
            the benchmark should fail with it; :meth:`round` must not be called.
    """

    def __init__(self, pair: BenchPair, device: torch.device, opts: SweepOptions | None = None) -> None:
        self.pair, self.device, self.opts = pair, torch.device(device), opts or SweepOptions()
        self.w = MemoryWriter({"device": str(self.device)})
        self.times: dict[str, list[float]] = {pair.a.key: [], pair.b.key: []}
        self.error: str | None = None
        self._stack = contextlib.ExitStack()
        self._probe: noise.Probe | None = None
        self._clocks: list[float | None] = []

    def __enter__(self) -> "PairBench":
        a, b = self.pair.a, self.pair.b
        todo = [(a, True), (b, prepare.flops_key(a) != prepare.flops_key(b))]
        group = self._stack.enter_context(prepare.prepare_group(todo, self.device, self.w, self.opts))
        if group.errors:
            key, why = next(iter(group.errors.items()))
            self.error = f"{group.status[key]}: {why} ({key})"
            return self
        self.steps: dict[str, Callable[[], object]] = {a.key: group.steps[a.key], b.key: group.steps[b.key]}
        for step in self.steps.values():  # one untimed round re-warms each after the other's set-up
            step()
        synchronize(self.device)
        self._backend = "compile" if "compile" in (a.backend, b.backend) else b.backend
        return self

    def __exit__(self, *exc) -> None:
        self._stack.close()

    def round(self) -> None:
        """Time one interleaved round of the pair (the benchmark's callable)."""
        if self._probe is None:
            self._clocks.append(noise.sm_clock_mhz(self.device))
            self._probe = noise.Probe().__enter__()
        with backends.recompile_guard(self._backend):
            t = paired.time_paired(self.steps, self.device, 1, self.opts.pair_order,
                                   first_round=len(self.times[self.pair.a.key]))
        for k, v in t.items():
            self.times[k] += v

    def finish(self) -> dict[str, Any]:
        """Write the timing and noise rows of the rounds run (one attempt, paired with ``a``, by
        :func:`harness.sweep.timed.record_attempt` as ``run`` writes them), and return
        :meth:`extra_info`."""
        a, b = self.pair.a, self.pair.b
        n = min(len(v) for v in self.times.values())
        readings: dict[str, float] = {}
        if self._probe is not None:
            self._probe.__exit__(None, None, None)
            self._clocks.append(noise.sm_clock_mhz(self.device))
            readings = dict(self._probe.metrics(self.device))
        ratio = (float("nan"),) * 3
        if n >= MIN_PAIRS_FOR_CI:
            ratio = bootstrap_ratio_ci(self.times[a.key][:n], self.times[b.key][:n])
        timed.record_attempt({a.key: a, b.key: b}, {c.key: self.times[c.key][:n] for c in (a, b)}, self.w,
                             attempt=1, base=a.key, readings=readings, clocks=self._clocks)
        return self.extra_info(ratio)

    def _value(self, case: Case, metric: str, same_router: bool = False) -> float | None:
        """The case's ``ok`` value of ``metric`` (FLOPs are counted once per router and shape:
        with ``same_router``, any case of the pair with ``case``'s router, impl and shape)."""
        for r in self.w.rows:
            if r["metric"] != metric or r["status"] != "ok" or r["value"] is None:
                continue
            if r["case_key"] == case.key or (same_router and r["router"] == case.router
                                             and r["impl"] == case.impl):
                return float(r["value"])
        return None

    def extra_info(self, ratio: tuple[float, float, float]) -> dict[str, Any]:
        """What the benchmark stores in pytest-benchmark's ``extra_info`` (JSON-able).

        Keys: ``routerbench`` (layout version), ``kind``, ``case_key``, ``baseline_key``, the
        measured case's columns (router, impl, backend, compile_mode, mode, shape), ``a_label``,
        ``a_ms``/``b_ms`` (medians of each side, ms: CUDA event time on a GPU, ``perf_counter``
        on a CPU), ``ratio``/``ratio_lo``/``ratio_hi`` (median per-pair b/a and its 95 %
        bootstrap interval; NaN below 5 pairs), ``pairs``, ``fwd_flops``/``bwd_flops``/
        ``router_fwd_flops``/``step_flops`` (FLOP; a step is the forward, plus the backward in
        ``fwd_bwd``/``train_step``; the optimizer is not counted) with ``flop_convention``, ``saved_activation_bytes`` (eager
        ``fwd_bwd``), ``cuda_peak_allocated_bytes``, ``compile_time_s``/``capture_time_s``,
        ``tokens_per_s``, ``model_tflops``, ``mfu_pct`` (None on a CPU or an unknown GPU),
        ``noise`` (the readings of ``b``) and ``noisy`` (why either side's timing counts as noisy,
        "" when quiet; a noisy benchmark is flagged, not re-timed: pytest-benchmark fixes the
        rounds),
        and ``rows``: every record row of both cases (non-null columns only).
        """
        a, b = self.pair.a, self.pair.b
        n = min(len(v) for v in self.times.values())
        med = {k: statistics.median(v[:n]) if n else float("nan") for k, v in self.times.items()}
        cfg = b.cfg
        tokens = tokens_per_step(b.mode, cfg.batch_size, cfg.seq_len)
        b_s = med[b.key] / 1e3
        n_matrix, router_flop = (self._value(b, "params_matrix"),
                                 self._value(b, "router_flops_analytic", same_router=True))
        model_flop = None
        if n_matrix is not None and router_flop is not None:
            model_flop = model_flops_per_step(b.mode, n_matrix=n_matrix, n_layers=cfg.n_layers,
                                              d_model=cfg.d_model, seq_len=cfg.seq_len,
                                              batch_size=cfg.batch_size, router_fwd_flops=router_flop,
                                              attention=cfg.workload != "router_only")
        peak = peak_flops(device_name(self.device), self.device.type)
        tflops = model_flop / b_s / 1e12 if model_flop and b_s > 0 else None
        readings = {r["metric"]: r["value"] for r in self.w.rows
                    if r["case_key"] == b.key and r["metric"] in noise.UNITS and r["value"] is not None}
        a_readings = {r["metric"]: r["value"] for r in self.w.rows
                      if r["case_key"] == a.key and r["metric"] in noise.UNITS and r["value"] is not None}
        reasons = [f"{side}: {why}" for side, m in (("measured", readings), ("baseline", a_readings))
                   for why in noise.noise_reasons(m, self.opts.noise_thresholds)]
        eager_saved = next((r["value"] for r in self.w.rows if r["metric"] == "saved_activation"
                            and r["router"] == b.router and r["impl"] == b.impl), None)
        return {
            "routerbench": EXTRA_SCHEMA, "kind": self.pair.kind, "case_key": b.key, "baseline_key": a.key,
            "router": b.router, "impl": b.impl, "backend": b.backend, "compile_mode": b.compile_mode,
            "compile_scope": b.compile_scope,
            "mode": b.mode, **cfg.shape_columns(),
            "a_label": BASELINE if self.pair.kind == "vs_prenorm" else "eager",
            "a_ms": med[a.key], "b_ms": med[b.key],
            "time_source": "cuda_event" if self.device.type == "cuda" else "perf_counter",
            "ratio": ratio[0], "ratio_lo": ratio[1], "ratio_hi": ratio[2], "conf": 0.95, "pairs": n,
            "fwd_flops": self._value(b, "fwd_flops_dispatch", same_router=True),
            "bwd_flops": self._value(b, "bwd_flops_dispatch", same_router=True),
            "router_fwd_flops": self._value(b, "router_flops_dispatch", same_router=True),
            "step_flops": _step_flops(self._value(b, "fwd_flops_dispatch", same_router=True),
                                      self._value(b, "bwd_flops_dispatch", same_router=True), b.mode),
            "flop_convention": FLOP_CONVENTION,
            "saved_activation_bytes": eager_saved,
            "cuda_peak_allocated_bytes": self._value(b, "peak_allocated"),
            "compile_time_s": self._value(b, "compile_time"),
            "capture_time_s": self._value(b, "capture_time"),
            "tokens_per_s": tokens / b_s if b_s > 0 else None,
            "model_tflops": tflops,
            "mfu_pct": tflops * 1e12 / peak * 100 if tflops and peak else None,
            "noise": readings,
            "noisy": "; ".join(reasons),
            "rows": [{k: v for k, v in r.items() if v is not None} for r in self.w.rows],
        }


def _step_flops(fwd: float | None, bwd: float | None, mode: str) -> float | None:
    """FLOP of one step of ``mode``: forward, plus backward for a training step."""
    if fwd is None:
        return None
    if mode in ("fwd_bwd", "train_step"):
        return None if bwd is None else fwd + bwd
    return fwd


def machine_info(device: torch.device | str | None = None) -> dict[str, Any]:
    """What pytest-benchmark's ``machine_info`` gets from routerbench: GPU name and count,
    driver, CUDA, cuDNN, torch, Triton, CPU model and threads, and on CUDA the SM clock now
    (MHz; read, never set). Keys ``routerbench_*`` plus the whole
    :func:`harness.rundir.environment.environment` as ``routerbench_environment`` (the device
    identity the gate compares), and ``routerbench_argv`` (the command line, for the manifest of
    :mod:`harness.ci.benchjson`)."""
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    env = environment(device)
    try:
        import triton
        triton_version = triton.__version__
    except Exception:  # noqa: BLE001 - absent on CPU builds
        triton_version = None
    return {
        "routerbench_device": env["device"], "routerbench_device_name": env["device_name"],
        "routerbench_gpu_name": env["device_name"] if device.type == "cuda" else None,
        "routerbench_gpu_count": env["gpu_count"], "routerbench_driver": env.get("driver"),
        "routerbench_cuda": env["cuda"], "routerbench_cudnn": env["cudnn"],
        "routerbench_torch": env["torch"], "routerbench_triton": triton_version,
        "routerbench_cpu_model": env["cpu_model"], "routerbench_cpu_count": env["cpu_count"],
        "routerbench_torch_threads": env["torch_threads"],
        "routerbench_sm_clock_mhz": noise.sm_clock_mhz(device),
        "routerbench_argv": list(sys.argv),
        "routerbench_environment": env,
    }
