"""Paired timing: variants interleaved in one process, ratios with bootstrap intervals.

MEASUREMENT.md ("Timing"): a comparison (router vs ``prenorm``, compile vs eager) interleaves the
variants in one process and reports the ratio per pair with a bootstrap confidence interval; run
order alone shifted one public comparison by 10–13 % (csarofeen/pytorch#2242). Round ``i`` calls
every variant once; index ``i`` of each variant's times is pair ``i``, so slow drift of the machine
(clocks, other tenants, thermal state) hits both sides of a pair alike and cancels in their ratio.

The bootstrap interval of :func:`harness.stats.bootstrap_ratio_ci` (importable from here too)
covers the noise *within one run*: it resamples that run's pairs and knows nothing of drift
*between* runs on a shared machine. Agreement between runs is shown as a figure
(``reports/paired.py``), never asserted by a test.

In a sweep (:func:`harness.sweep.run_sweep`) the cases that share backend, compile mode, mode, workload,
shape and seed form a group. Every case of a group is set up as in an unpaired sweep (parameters,
FLOPs, memory, compile or capture time, its own warm-up: :func:`harness.measure.run_case`), its
step is kept, and then all the group's steps are timed interleaved (:func:`time_group`);
``step_time`` rows get ``pair`` = ``repeat`` = round. A group is one unit of resume
(:mod:`harness.records`): its rows are recorded together or not at all.

Memory: a group's models (with their gradients, optimizer state, KV caches or CUDA-graph pools)
are all resident while it is timed. On CPU, ~10 small models are nothing; on CUDA resident memory
grows with the group (about 20 cases × (weights + grads) at the cuda-default grid's largest shape,
~35 GiB in bf16), so a large shape that fits alone may OOM in a group: ``--no-paired`` times each
case alone. Each case's ``peak_allocated``/``peak_reserved`` rows are written net of what the
group's earlier steps hold, so they read as in an unpaired sweep (allocated exactly, reserved
approximately: the allocator may reuse free space of segments the earlier steps hold).

``compile`` with ``reduce-overhead`` is never paired: CUDA-graph trees are one tree and one memory
pool per device, ``torch._dynamo.reset()`` per case tears them down, and a call of another
compiled model may overwrite or re-record them (pytorch/pytorch#170604). Those cases are timed
alone, as before.
"""

from __future__ import annotations

import contextlib
import subprocess
import time
import traceback
from typing import TYPE_CHECKING, Any, Callable

import torch

from . import backends, noise
from .rundir import StagingWriter
from .stats import MIN_PAIRS_FOR_CI, bootstrap_ratio_ci  # re-exported
from .timing import median_iqr, synchronize, time_steps

if TYPE_CHECKING:
    from .cases import Case
    from .measure import SweepOptions

__all__ = ["MIN_PAIRS_FOR_CI", "ORDERS", "bootstrap_ratio_ci", "compile_group", "group_key",
           "median_iqr", "pairable", "round_order", "sm_clock_mhz", "time_group", "time_paired",
           "timing_manifest"]

#: ``ABBA``: the order reverses every round (A B, B A, A B, …), so neither side always runs first;
#: ``ABAB``: the same order every round.
ORDERS = ("ABBA", "ABAB")
#: The router every other router of a group is compared with.
BASELINE = "prenorm"
#: What the timed steps found in the caches: no L2 flush between steps, so each timed step runs
#: right after another step (of another variant when paired). Recorded in the manifest.
CACHE_STATE = "warm"


def round_order(names: list[str], i: int, order: str = "ABBA") -> list[str]:
    """The call order of round ``i``: ``names``, reversed on odd rounds under ``ABBA``.

    Raises:
        ValueError: unknown ``order``.
    """
    if order not in ORDERS:
        raise ValueError(f"--pair-order must be one of {', '.join(ORDERS)}, got {order!r}")
    return list(reversed(names)) if order == "ABBA" and i % 2 else list(names)


def time_paired(steps: dict[str, Callable[[], object]], device: torch.device, repeats: int,
                order: str = "ABBA", warmup_rounds: int = 0,
                first_round: int = 0) -> dict[str, list[float]]:
    """Time the ``steps`` interleaved: ``repeats`` rounds, each calling every step once.

    Each call is timed exactly as :func:`harness.timing.time_steps` times one step (CUDA events
    and a wait on the end event on CUDA, ``perf_counter_ns`` on CPU), so paired and unpaired
    times mean the same thing; no host sync happens inside a timed call.

    Args:
        steps: variant name -> zero-argument step; dict order is the ``A B …`` order.
        device: where the steps run.
        repeats: rounds (pairs) kept.
        order: ``"ABBA"`` or ``"ABAB"`` (see :data:`ORDERS`).
        warmup_rounds: untimed rounds first (forward order).
        first_round: index of the first timed round, for the order (a caller timing one round
            per call, as the pytest-benchmark suite does, passes its round count so ABBA holds
            across calls).

    Returns:
        name -> ``repeats`` durations in ms; index ``i`` of every list is round ``i``.

    Raises:
        ValueError: unknown ``order`` or ``repeats < 1``.
    """
    names = list(steps)
    round_order(names, 0, order)  # validates the order before anything runs
    if repeats < 1:
        raise ValueError(f"--repeats must be >= 1, got {repeats}")
    for _ in range(warmup_rounds):
        for name in names:
            steps[name]()
        synchronize(device)
    out: dict[str, list[float]] = {name: [] for name in names}
    for i in range(first_round, first_round + repeats):
        for name in round_order(names, i, order):
            out[name].append(time_steps(steps[name], device, 1)[0])
    return out


# --- the paired sweep ------------------------------------------------------------------------

def group_key(case: "Case") -> tuple:
    """What the cases of one paired group share: mode, the whole decoder config (workload and
    shape) and seed; they differ in router, options, impl and backend. Eager and compiled steps of
    one shape are timed in one interleaved group, so "vs eager" is a per-pair ratio as "vs prenorm"
    is; CUDA-graph replays keep a group of their own (a capture beside compiled graphs is not
    worth the risk to the others)."""
    return ("cudagraph" if case.backend == "cudagraph" else "eager/compile", case.mode, case.cfg, case.seed)


def case_bytes(case: "Case") -> int:
    """Estimated memory one case of a paired group holds while the group is timed, in bytes (an
    estimate, stated as such): weights (by dtype); for ``fwd_bwd`` and ``train_step`` their
    gradients and the activations of a step (Korthikanti et al. 2022, eq. 1, at this dtype's
    bytes); AdamW's two float32 moments for ``train_step``; one layer's activations otherwise."""
    from .schedule import decoder_parameter_count
    cfg = case.cfg
    if cfg.workload == "router_only":
        n = decoder_parameter_count(cfg, case.router, case.router_kwargs()) - 16 * cfg.d_model ** 2 * cfg.n_layers
    else:
        n = decoder_parameter_count(cfg, case.router, case.router_kwargs())
    item = torch.tensor([], dtype=cfg.torch_dtype).element_size()
    b, t, d, h = cfg.batch_size, cfg.seq_len, cfg.d_model, cfg.n_heads
    layer = t * b * d * (34 + 5 * h * t / d) * item / 2
    total = n * item + 2 * b * t * cfg.vocab_size * 4
    if case.mode in ("fwd_bwd", "train_step"):
        total += n * item + cfg.n_layers * layer
    else:
        total += layer
    if case.mode == "train_step":
        total += 8 * n
    return int(total)


def split_group(group: list["Case"], budget: int | None) -> list[list["Case"]]:
    """``group`` as one unit when its estimated memory (:func:`case_bytes`) fits ``budget`` bytes,
    else as subgroups that each hold every ``prenorm`` case of the group (the A of every pair) and
    whole routers (a router's eager and compiled steps stay together, so "vs eager" stays paired),
    packed in order; a router that does not fit even alone with prenorm gets a subgroup of its own
    (it may then fail as an ``oom`` row)."""
    if budget is None or sum(case_bytes(c) for c in group) <= budget:
        return [group]
    anchors = [c for c in group if c.router == BASELINE]
    buckets: dict[tuple, list] = {}
    for c in group:
        if c.router != BASELINE:
            buckets.setdefault((c.router, str(sorted(c.router_kwargs().items())), c.impl), []).append(c)
    base = sum(case_bytes(c) for c in anchors)
    parts, cur, used = [], [], base
    for bucket in buckets.values():
        need = sum(case_bytes(c) for c in bucket)
        if cur and used + need > budget:
            parts.append(anchors + cur)
            cur, used = [], base
        cur += bucket
        used += need
    if cur or not parts:
        parts.append(anchors + cur)
    return parts


def pairable(case: "Case") -> bool:
    """Whether the case can be timed in a group (``reduce-overhead`` cannot: see the module doc)."""
    return not (case.backend == "compile" and case.compile_mode == "reduce-overhead")


def sm_clock_mhz(device: torch.device) -> float | None:
    """The SM clock of a CUDA ``device`` in MHz (NVML via ``torch.cuda.clock_rate``, else
    ``nvidia-smi`` matched by PCI bus id); ``None`` on CPU or when neither can tell. Read only:
    clocks are never changed."""
    if device.type != "cuda":
        return None
    try:
        return float(torch.cuda.clock_rate(device))
    except Exception:  # pynvml missing or NVML unusable: ask nvidia-smi
        pass
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=pci.bus_id,clocks.sm",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True,
                             timeout=10, check=True).stdout.strip().splitlines()
        props = torch.cuda.get_device_properties(device)
        want = (getattr(props, "pci_domain_id", None), getattr(props, "pci_bus_id", None),
                getattr(props, "pci_device_id", None))
        for line in out:
            bus, mhz = (s.strip() for s in line.split(","))
            dom, b, dev = bus.split(":")[0], bus.split(":")[1], bus.split(":")[2].split(".")[0]
            if (int(dom, 16), int(b, 16), int(dev, 16)) == want or len(out) == 1:
                return float(mhz)
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        pass
    return None


def timing_manifest(opts: "SweepOptions") -> dict[str, Any]:
    """The timing protocol of a session, for ``manifest.json``: cache state, pairing, warm-up."""
    t = opts.timing
    return {"cache_state": CACHE_STATE, "l2_flush": False, "paired": opts.paired,
            "pair_order": opts.pair_order if opts.paired else None,
            "repeats": t.repeats, "warmup_min_count": t.warmup_min_count,
            "warmup_min_s": t.warmup_min_s, "remeasure_s": opts.remeasure_s,
            "max_attempts": opts.max_attempts, "noise_thresholds": dict(opts.noise_thresholds)}


class NetOfResident:
    """A writer that subtracts the memory held by a group's earlier steps from a case's CUDA
    peak-memory rows (see the module doc); everything else passes through."""

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
def compile_group(backend: str, n: int):
    """Let the compiled models of one group live side by side.

    ``backends.prepare`` resets dynamo per case, which would drop the earlier cases' compiled
    code (and recompile it, in the timed region or at the recompile limit, silently eager). Here
    dynamo is reset once before and once after the group (``backends.one_dynamo_cache``), the
    recompile limit fits the group (all models share ``Decoder.forward``'s code object, one cache
    entry each; guards keep them apart), and automatic dynamic shapes are off so a later model's
    parameter shapes cannot turn an earlier graph dynamic. The recompile guard still turns any
    compile during timing into an error.
    """
    if backend != "compile":
        yield
        return
    cfg = torch._dynamo.config
    name = "recompile_limit" if hasattr(cfg, "recompile_limit") else "cache_size_limit"  # < 2.6
    limit = max(getattr(cfg, name), n + 8)
    with backends.one_dynamo_cache(), cfg.patch(**{name: limit}, automatic_dynamic_shapes=False):
        yield


def _error_text(exc: BaseException) -> str:
    if isinstance(exc, torch.cuda.OutOfMemoryError):
        return str(exc).splitlines()[0]
    last = traceback.extract_tb(exc.__traceback__)[-1]
    return f"{type(exc).__name__}: {exc} ({last.filename}:{last.lineno})"


def _fail(case: "Case", w: StagingWriter, exc: BaseException) -> str:
    status = "oom" if isinstance(exc, torch.cuda.OutOfMemoryError) else "error"
    w.write(**case.columns(), metric="step_time", unit="ms", status=status, error=_error_text(exc))
    return status


def time_group(cases: list["Case"], steps: dict[str, Callable[[], object]], device: torch.device,
               w: StagingWriter, opts: "SweepOptions") -> dict[str, str]:
    """Time the kept steps of a group interleaved and write their rows; re-time a noisy group.

    The group's prenorm goes first (it is the ``A`` of every pair), the others follow in sweep
    order; one untimed interleaved round re-warms every step after the other cases' set-up. Rows
    of each attempt (``attempt`` = 1, 2, …): ``step_time`` per round (``repeat`` = ``pair`` =
    round; no ``pair`` when the group timed a single step); the noise readings of
    :mod:`harness.noise` (``cpu_util``, ``cpu_pressure``, ``load_avg`` of the group, ``iqr_rel`` and
    ``ci_width_rel`` of the case); on CUDA ``sm_clock_mhz`` before (``repeat`` 0) and after (1).
    While an attempt is noisy (:func:`harness.noise.noise_reasons` under
    ``opts.noise_thresholds``), the group is timed again, its steps still held, up to
    ``opts.max_attempts`` timings and while another attempt (as long as the last) fits in
    ``opts.remeasure_s`` seconds of re-measuring. If the
    interleaved timing fails, each step is timed alone (one attempt) so the failure lands on its
    case.

    Returns:
        case key -> final status (``ok``, ``error`` or ``oom``).
    """
    by_key = {c.key: c for c in cases if c.key in steps}
    keys = sorted(by_key, key=lambda k: by_key[k].router != BASELINE)  # stable: prenorm first
    backend = "compile" if any(c.backend == "compile" for c in cases) else cases[0].backend
    spent, last = 0.0, 0.0  # seconds spent re-measuring; duration of the last attempt
    for attempt in range(1, max(1, opts.max_attempts) + 1):
        t0 = time.perf_counter()
        clocks = [sm_clock_mhz(device)]
        try:
            with noise.Probe() as probe, backends.recompile_guard(backend):
                times = time_paired({k: steps[k] for k in keys}, device, opts.timing.repeats,
                                    opts.pair_order, warmup_rounds=1)
            paired = len(keys) > 1
        except Exception:  # one broken step must not take the group down: find it by timing alone
            times, paired, probe = {}, False, None
        clocks.append(sm_clock_mhz(device))
        status: dict[str, str] = {}
        readings = {}
        for k in keys:
            case = by_key[k]
            if k not in times:
                try:
                    with backends.recompile_guard(backend):
                        times[k] = time_steps(steps[k], device, opts.timing.repeats)
                except Exception as exc:  # noqa: BLE001 - recorded as the case's error row
                    status[k] = _fail(case, w, exc)
                    continue
            for i, ms in enumerate(times[k]):
                w.write(**case.columns(), metric="step_time", value=ms, unit="ms", repeat=i,
                        pair=i if paired else None, attempt=attempt)
            for i, mhz in enumerate(clocks):
                if mhz is not None:
                    w.write(**case.columns(), metric="sm_clock_mhz", value=mhz, unit="MHz", repeat=i,
                            attempt=attempt)
            m = dict(probe.metrics(device)) if probe is not None else {}
            m["iqr_rel"] = noise.iqr_rel(times[k])
            base = keys[0]
            if paired and k != base and base in times and len(times[k]) >= MIN_PAIRS_FOR_CI:
                med, lo, hi = bootstrap_ratio_ci(times[base], times[k])
                m["ci_width_rel"] = (hi - lo) / med if med > 0 else float("nan")
            for metric, value in m.items():
                if value == value:  # not NaN
                    w.write(**case.columns(), metric=metric, value=value, unit=noise.UNITS[metric],
                            attempt=attempt)
            readings[k] = m
            status[k] = "ok"
        noisy = any(noise.noise_reasons(m, opts.noise_thresholds) for m in readings.values())
        last = time.perf_counter() - t0
        spent += last if attempt > 1 else 0.0
        # another attempt only when it fits in what is left of the budget (an attempt takes as
        # long as the last one did)
        if (probe is None or not noisy or attempt >= opts.max_attempts
                or spent + last > opts.remeasure_s):
            return status
    return status
