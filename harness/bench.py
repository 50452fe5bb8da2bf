"""The pytest-benchmark suite's cases, measured on the same path as ``routerbench run``.

``tests/benchmarks/`` is parametrised from one table (:func:`suite_table`: router × impl ×
backend × mode × shape). Each benchmark is a **pair** (:class:`BenchPair`): a router against
``prenorm`` on the same backend, or a compiled (or graph-replayed) step against the eager step
of the same router. :class:`PairBench` prepares both sides with
:func:`harness.sweep.prepared_group`, the function ``routerbench run`` prepares a paired group
with (parameters, FLOPs, saved activations, CUDA peak memory, compile warm-up or CUDA-graph
capture, warm-up, the recompile guard); its :meth:`PairBench.round` is the benchmark's callable
and times one interleaved round of the pair with :func:`harness.paired.time_paired` (CUDA events
and a wait on the end event on a GPU, so kernels are timed, not launches; ABBA order across
rounds). pytest-benchmark's own table then shows the host time of one round (both sides,
synchronised); ``extra_info`` (:meth:`PairBench.extra_info`) holds each side's median, the
per-pair ratio with its bootstrap interval, FLOPs with their convention, saved-activation bytes,
CUDA peak memory, tokens/s, MFU, the noise readings of :mod:`harness.noise`, and every record
row (``rows``), so ``routerbench report bench.json`` (:mod:`harness.benchjson`) rebuilds the
run's report and ``routerbench gate`` checks it like a results directory.

Suites (``pytest tests/benchmarks --benchmark-only --bench-suite cpu|gpu``; default ``gpu`` when a
CUDA device is visible, else ``cpu``):

- ``cpu``: the ``cpu-quick`` shape (d 64, L 4, T 64, B 8); every router and impl eager in ``fwd``
  and ``fwd_bwd``; ``torch.compile`` for ``prenorm`` and ``haares`` [two_phase] in ``fwd_bwd``.
  Under 5 minutes on 2 cores with a cold compile cache.
- ``gpu``: d 256 L 12 T 256 B 4 and d 1024 L 24 T 1024 B 4; every router and impl eager in
  ``fwd`` and ``fwd_bwd``; every router under ``compile`` and ``cudagraph`` in ``fwd_bwd``.
"""

from __future__ import annotations

import contextlib
import statistics
import sys
from dataclasses import dataclass
from typing import Any, Callable

import torch

from routers import ROUTERS, router_class
from workloads.config import PRESETS, DecoderConfig

from . import backends, noise
from .cases import Case
from .measure import SweepOptions, flops_key
from .paired import BASELINE, sm_clock_mhz, time_paired
from .records import make_row
from .stats import MIN_PAIRS_FOR_CI, bootstrap_ratio_ci
from .timing import synchronize

__all__ = ["SUITES", "BenchPair", "PairBench", "RowCollector", "default_suite", "machine_info",
           "suite_pairs", "suite_table"]

#: Shapes of each suite.
SUITE_SHAPES: dict[str, tuple[DecoderConfig, ...]] = {
    "cpu": (PRESETS["cpu-quick"],),
    "gpu": (DecoderConfig(d_model=256, n_layers=12, n_heads=4, seq_len=256, batch_size=4),
            DecoderConfig(d_model=1024, n_layers=24, n_heads=16, seq_len=1024, batch_size=4)),
}
SUITES = tuple(SUITE_SHAPES)
#: Timed rounds (pairs) per benchmark: enough for a bootstrap interval (>= 5) on a busy CPU.
ROUNDS = {"cpu": 15, "gpu": 30}
#: The detail router compiled in the CPU suite, beside prenorm.
CPU_COMPILED = (("prenorm", "naive"), ("haares", "two_phase"))
#: What a dispatch-counted FLOP is (docs/FLOPS.md).
FLOP_CONVENTION = ("FLOP = 2 x multiply-add, counted at dispatch by harness.flop_counter on the "
                   "uncompiled model (docs/FLOPS.md)")
#: Version of the ``extra_info`` layout.
EXTRA_SCHEMA = 1


def default_suite() -> str:
    """``gpu`` when a CUDA device is visible, else ``cpu``."""
    return "gpu" if torch.cuda.is_available() else "cpu"


def _variants() -> list[tuple[str, str]]:
    """Every registered router with each of its impls, prenorm first."""
    names = [BASELINE] + sorted(r for r in ROUTERS if r != BASELINE)
    return [(r, i) for r in names for i in router_class(r).impls]


def suite_table(suite: str) -> list[Case]:
    """The suite's cases (router × impl × backend × mode × shape), in a stable order.

    Raises:
        ValueError: unknown ``suite`` (naming ``--bench-suite``).
    """
    if suite not in SUITE_SHAPES:
        raise ValueError(f"--bench-suite must be one of {', '.join(SUITES)}, got {suite!r}")
    cases = []
    for cfg in SUITE_SHAPES[suite]:
        for mode in ("fwd", "fwd_bwd"):
            cases += [Case(r, cfg, mode, "eager", None, (), i) for r, i in _variants()]
        compiled = CPU_COMPILED if suite == "cpu" else _variants()
        for backend, cm in (("compile", "default"),) + ((("cudagraph", None),) if suite == "gpu" else ()):
            cases += [Case(r, cfg, "fwd_bwd", backend, cm, (), i) for r, i in compiled]
    return cases


@dataclass(frozen=True)
class BenchPair:
    """One benchmark: the measured case ``b`` against its baseline ``a``.

    Attributes:
        kind: ``"vs_prenorm"`` (``a`` is prenorm on ``b``'s backend) or ``"vs_eager"`` (``a`` is
            ``b``'s router eager).
        a, b: the two cases; ratio = time of ``b`` / time of ``a`` per round.
        rounds: timed rounds.
    """

    kind: str
    a: Case
    b: Case
    rounds: int

    @property
    def id(self) -> str:
        """The pytest id, e.g. ``fwd_bwd-d64L4-eager-haares[two_phase]-vs-prenorm``."""
        c = self.b.cfg
        return (f"{self.b.mode}-d{c.d_model}L{c.n_layers}-{self.b.backend}-{_variant(self.b)}-vs-"
                f"{'prenorm' if self.kind == 'vs_prenorm' else 'eager'}")

    @property
    def group(self) -> str:
        """pytest-benchmark's group: shape and mode (``d64 L4 T64 B8 · fwd_bwd``)."""
        c = self.b.cfg
        return f"d{c.d_model} L{c.n_layers} T{c.seq_len} B{c.batch_size} · {self.b.mode}"


def _variant(case: Case) -> str:
    many = len(router_class(case.router).impls) > 1
    return case.router + (f"[{case.impl}]" if many else "")


def suite_pairs(suite: str) -> list[BenchPair]:
    """The suite's benchmarks: each non-prenorm case against prenorm on its backend, and each
    compiled or graph-replayed case against its router's eager case (:func:`suite_table`)."""
    cases = suite_table(suite)
    by = {(c.router, c.impl, c.backend, c.mode, c.cfg): c for c in cases}
    pairs = []
    for c in cases:
        base = next((by[(BASELINE, i, c.backend, c.mode, c.cfg)] for i in router_class(BASELINE).impls
                     if (BASELINE, i, c.backend, c.mode, c.cfg) in by), None)
        if c.router != BASELINE and base is not None:
            pairs.append(BenchPair("vs_prenorm", base, c, ROUNDS[suite]))
        if c.backend != "eager" and (c.router, c.impl, "eager", c.mode, c.cfg) in by:
            pairs.append(BenchPair("vs_eager", by[(c.router, c.impl, "eager", c.mode, c.cfg)], c, ROUNDS[suite]))
    return pairs


class RowCollector:
    """A writer (``w.write(**row)``, as :class:`harness.rundir.StagingWriter`) that keeps full
    record rows in memory, for a benchmark's ``extra_info``.

    Args:
        base: column values of every row (``device``).
    """

    def __init__(self, base: dict[str, Any]) -> None:
        self.base, self.rows, self.run_dir = dict(base), [], None

    def write(self, **row: Any) -> dict[str, Any]:
        """Append one row (checked as a record row) and return it.

        Raises:
            ValueError: an unknown column or status.
        """
        full = make_row(self.base, row)
        self.rows.append(full)
        return full


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
        self.w = RowCollector({"device": str(self.device)})
        self.times: dict[str, list[float]] = {pair.a.key: [], pair.b.key: []}
        self.error: str | None = None
        self._stack = contextlib.ExitStack()
        self._probe: noise.Probe | None = None
        self._clocks: list[float | None] = []

    def __enter__(self) -> "PairBench":
        from .sweep import prepared_group
        a, b = self.pair.a, self.pair.b
        todo = [(a, True), (b, flops_key(a) != flops_key(b))]
        held, status = self._stack.enter_context(prepared_group(todo, self.device, self.w, self.opts))
        bad = [k for k, s in status.items() if s != "ok"]
        if bad:
            row = next((r for r in self.w.rows if r["case_key"] == bad[0] and r["status"] != "ok"), {})
            self.error = f"{row.get('status', status[bad[0]])}: {row.get('error') or 'set-up failed'} ({bad[0]})"
            return self
        self.steps: dict[str, Callable[[], object]] = {a.key: held[a.key], b.key: held[b.key]}
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
            self._clocks.append(sm_clock_mhz(self.device))
            self._probe = noise.Probe().__enter__()
        with backends.recompile_guard(self._backend):
            t = time_paired(self.steps, self.device, 1, self.opts.pair_order,
                            first_round=len(self.times[self.pair.a.key]))
        for k, v in t.items():
            self.times[k] += v

    def finish(self) -> dict[str, Any]:
        """Write the timing and noise rows of the rounds run, and return :meth:`extra_info`."""
        a, b = self.pair.a, self.pair.b
        n = min(len(v) for v in self.times.values())
        readings: dict[str, float] = {}
        if self._probe is not None:
            self._probe.__exit__(None, None, None)
            self._clocks.append(sm_clock_mhz(self.device))
            readings = dict(self._probe.metrics(self.device))
        ratio = (float("nan"),) * 3
        if n >= MIN_PAIRS_FOR_CI:
            ratio = bootstrap_ratio_ci(self.times[a.key][:n], self.times[b.key][:n])
        for case in (a, b):
            ts = self.times[case.key][:n]
            for i, ms in enumerate(ts):
                self.w.write(**case.columns(), metric="step_time", value=ms, unit="ms", repeat=i, pair=i,
                             attempt=1)
            m = {**readings, "iqr_rel": noise.iqr_rel(ts)}
            if case is b and ratio[0] == ratio[0] and ratio[0] > 0:
                m["ci_width_rel"] = (ratio[2] - ratio[1]) / ratio[0]
            for metric, value in m.items():
                if value == value:
                    self.w.write(**case.columns(), metric=metric, value=value, unit=noise.UNITS[metric], attempt=1)
            for i, mhz in enumerate(self._clocks):
                if mhz is not None:
                    self.w.write(**case.columns(), metric="sm_clock_mhz", value=mhz, unit="MHz", repeat=i, attempt=1)
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
        from .env import device_name
        from .peak import model_flops_per_step, peak_flops, tokens_per_step
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
    :func:`harness.env.environment` as ``routerbench_environment`` (the device identity the gate
    compares), and ``routerbench_argv`` (the command line, for the manifest of
    :mod:`harness.benchjson`)."""
    from .env import environment
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
        "routerbench_sm_clock_mhz": sm_clock_mhz(device),
        "routerbench_argv": list(sys.argv),
        "routerbench_environment": env,
    }
