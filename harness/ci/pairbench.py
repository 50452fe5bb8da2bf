"""One benchmark of the pytest-benchmark suite, measured on ``routerbench run``'s path.

Each benchmark is a **pair** (:class:`harness.ci.suite.BenchPair`): a router against ``prenorm``
on the same backend, or a compiled (or graph-replayed) step against the eager step of the same
router. :class:`PairBench` prepares both sides with :func:`harness.sweep.prepare.prepare_group`,
the function ``routerbench run`` prepares a group with (parameters, FLOPs, saved activations, CUDA
peak memory, compile warm-up or CUDA-graph capture, warm-up). :meth:`PairBench.pedantic` gives
``benchmark.pedantic`` its arguments: the **target** (the time pytest-benchmark records) is one
step of the measured case, and the baseline's step runs untimed by pytest-benchmark in ``setup``
or ``teardown``, before or after it by ABBA order (:func:`harness.timing.paired.round_order`), so
``--benchmark-compare-fail`` sees the router's (or the compiled step's) time, never diluted by
prenorm's. Both sides are also timed as ``routerbench run`` times a pair (CUDA events and a wait
on the end event on a GPU, so kernels are timed, not launches; ``perf_counter`` on CPU), under the
recompile guard; :meth:`PairBench.finish` writes those timing rows and noise readings with
:func:`harness.sweep.timed.record_attempt`, as ``run`` does. ``extra_info``
(:meth:`PairBench.extra_info`) holds each side's median, the per-pair ratio with its bootstrap
interval (the paired, statistically honest comparison: pytest-benchmark's compare is unpaired
across runs), FLOPs with their convention, saved-activation bytes, CUDA peak memory, tokens/s,
MFU, the noise readings, what differs between runs on one machine (hostname, command line,
clocks, environment; :func:`harness.ci.benchplugin.run_info`), and every record row (``rows``), so
``routerbench report bench.json`` (:mod:`reports.benchjson`) rebuilds the run's report and
``routerbench gate`` checks it like a results directory.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from typing import Any, Callable

import torch

from harness.costs.peak import model_flops_per_step, peak_flops, tokens_per_step
from harness.rundir.environment import device_name
from harness.rundir.writer import MemoryWriter
from harness.stats.bootstrap import MIN_PAIRS_FOR_CI, bootstrap_ratio_ci
from harness.step import backends
from harness.sweep import prepare, timed
from harness.sweep.cases import Case
from harness.sweep.options import SweepOptions
from harness.timing import noise, paired
from harness.timing.timer import synchronize, time_steps
from routers import BASELINE

from .benchplugin import run_info
from .suite import BenchPair

#: What a dispatch-counted FLOP is (docs/FLOPS.md).
FLOP_CONVENTION = ("FLOP = 2 x multiply-add, counted at dispatch by harness.costs.flop_counter on the "
                   "uncompiled model (docs/FLOPS.md)")


#: Version of the ``extra_info`` layout (2: ``hostname``, ``argv``, clocks and ``environment``
#: moved here from ``machine_info``; the recorded time is the measured side only).
EXTRA_SCHEMA = 2


class PairBench:
    """A pair set up on ``routerbench run``'s path and timed one interleaved round per call.

    Use as a context manager; the steps (and, on CUDA, their memory) are held until exit.

    Args:
        pair: the two cases.
        device: where they run.
        opts: the sweep options (FLOPs, memory, warm-up policy, pair order).

    Attributes (after entering):
        error: ``None``, or the failing case's status and error text (e.g. an ``oom`` row):
            the benchmark should fail with it; nothing may be timed.
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
        t0 = time.perf_counter()
        for step in self.steps.values():  # one untimed round re-warms each after the other's set-up
            step()
        synchronize(self.device)
        #: Host time of one round of the pair (both sides), s: the estimate ``--benchmark-max-time``
        #: divides (:func:`harness.ci.benchplugin.bench_rounds`).
        self.round_s = time.perf_counter() - t0
        self._backend = "compile" if "compile" in (a.backend, b.backend) else b.backend
        return self

    def __exit__(self, *exc) -> None:
        self._stack.close()

    def _start(self) -> None:
        if self._probe is None:
            self._clocks.append(noise.sm_clock_mhz(self.device))
            self._probe = noise.Probe().__enter__()

    def _time(self, case: Case) -> None:
        with backends.recompile_guard(self._backend):
            self.times[case.key] += time_steps(self.steps[case.key], self.device, 1)

    def _baseline_first(self) -> bool:
        """Whether the baseline ``a`` runs first in the round about to be (or just) timed."""
        a, b = self.pair.a, self.pair.b
        i = len(self.times[a.key])
        return paired.round_order([a.key, b.key], i, self.opts.pair_order)[0] == a.key

    def round(self) -> None:
        """Time one interleaved round of the pair, both sides, in ABBA order (for callers outside
        pytest-benchmark; the suite uses :meth:`pedantic`)."""
        self._start()
        with backends.recompile_guard(self._backend):
            t = paired.time_paired(self.steps, self.device, 1, self.opts.pair_order,
                                   first_round=len(self.times[self.pair.a.key]))
        for k, v in t.items():
            self.times[k] += v

    def setup(self) -> None:
        """``pedantic``'s setup, untimed by pytest-benchmark: on a round whose ABBA order puts the
        baseline first, time the baseline ``a`` (its time goes to the pairs, not to the
        benchmark's statistics)."""
        self._start()
        if self._baseline_first():
            self._time(self.pair.a)

    def target(self) -> None:
        """``pedantic``'s target, the time pytest-benchmark records: one step of the measured case
        ``b`` (host time; on CUDA the call waits on the step's end event, so it covers the kernels;
        its CUDA-event time goes to the pairs)."""
        self._time(self.pair.b)

    def teardown(self) -> None:
        """``pedantic``'s teardown, untimed: on a round whose order puts ``b`` first, time ``a``."""
        if len(self.times[self.pair.a.key]) < len(self.times[self.pair.b.key]):
            self._time(self.pair.a)

    def pedantic(self, rounds: int) -> dict[str, Any]:
        """Keyword arguments of ``benchmark.pedantic`` timing ``rounds`` pairs: the measured
        case's step is the target, the baseline's is run in setup or teardown by ABBA order."""
        return {"target": self.target, "setup": self.setup, "teardown": self.teardown,
                "rounds": rounds, "iterations": 1, "warmup_rounds": 0}

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
        "" when quiet; a noisy benchmark is flagged, not re-timed within the benchmark),
        :func:`harness.ci.benchplugin.run_info` (``hostname``, ``argv``, ``sm_clock_mhz``,
        ``cpu_mhz``, ``environment``),
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
            **run_info(self.device),
            "rows": [{k: v for k, v in r.items() if v is not None} for r in self.w.rows],
        }


def _step_flops(fwd: float | None, bwd: float | None, mode: str) -> float | None:
    """FLOP of one step of ``mode``: forward, plus backward for a training step."""
    if fwd is None:
        return None
    if mode in ("fwd_bwd", "train_step"):
        return None if bwd is None else fwd + bwd
    return fwd
