"""What a step, a compile and a set-up will take, estimated before any model is built: the
documented constants of a command's plan (``routerbench run|train|study depth --dry-run``), and
their calibration on earlier runs of the same device.

Every estimate is a range ``(low, high)`` in seconds: the low end takes every constant at its fast
end (a warm Inductor cache, an idle machine), the high end at its slow one. The constants were
measured on this project's 2-core CPU (torch 2.13, the ``cpu-default`` grid and ``cpu-train``; a
machine shared with other work, so the ranges are wide on purpose); the CUDA ones are stated from
the device's dense BF16 peak (:data:`harness.costs.peak.PEAK_BF16_FLOPS`) and typical small-model
utilisation, and are meant to be corrected by calibration.

Step time (:func:`step_seconds`) = passes × sublayers × per-sublayer overhead + the sublayers'
matrix FLOPs / :data:`MATRIX_FLOPS` + the router's mixing FLOPs / :data:`ROUTER_FLOPS`:

- the matrix FLOPs are :func:`harness.costs.peak.model_flops_per_step` (2·N per token + attention,
  3× for a backward) plus the LM head (2·d·V per token); the router's are its closed-form
  ``analytic_fwd_flops`` (counted on a router built on the ``meta`` device: no memory), 3× with a
  backward;
- matrix products run near the chip's matrix throughput: on this CPU a d=128, 8-layer ``fwd_bwd``
  step came to 110-140 GFLOP/s, d=64 4-layer ones to ~55 (the rest is overhead), so
  60-200 GFLOP/s; a router's mixing is elementwise and memory-bound: wav_v1's extra time over
  prenorm at d=128, L=8 was 333 MFLOP in ~140 ms, so 2-8 GFLOP/s;
- per-sublayer overhead (op dispatch, small kernels): at d=64, L=4 a prenorm ``fwd_bwd`` step of
  0.9 GFLOP took 16 ms, about 0.46 ms per sublayer pass beyond its FLOPs: 0.3-0.6 ms; on CUDA a
  sublayer launches ~15 kernels of 4-8 µs: 0.05-0.15 ms (a compiled or captured step: a third).

Compile (:func:`compile_seconds`, one per compiled case, plus Inductor's start-up once per
process): a cold ``model``-scope compile grows with depth and with the router's graph, about as
:data:`COMPILE_S` × weight × (2L)^0.75..0.95 (measured cold here at d=64, 4 layers, ``fwd_bwd``:
7-16 s for prenorm to 39-45 s for wav_v1 two_phase, the ten models of the default suite 228-306 s;
at d=256, 12 layers, 52-78 s for prenorm to 174-246 s for wav_v1 two_phase; docs/SWEEPS.md, "Compile
scopes"); a ``layer``-scope compile is :data:`COMPILE_REGION_S` per region
(``workloads.decoder.region_count``) and does not grow with depth. The low end assumes a warm
Inductor cache (FX graphs and AOTAutograd served from disk): :data:`WARM_COMPILE` of the cold time
(measured 0.03-0.1 here); the high end allows :data:`LOADED_MACHINE` for a shared machine.

Checked end to end: the default CPU suite (``routerbench run``, cold cache, a loaded machine) took
558 s where the plan with these constants says 171-1281 s (geometric mean 468 s: ratio 1.2; the
high end holds every group's whole ``remeasure_s``); its groups' summed step times fell inside
the estimated ranges in 7 of 8 groups.

Calibration (:func:`calibration`): every earlier run under the same results root and device slug
whose manifest holds a plan (its uncalibrated range) and the actual wall time of a whole,
uninterrupted, not resumed command gives one ratio actual / geometric mean of that range; the
median ratio (of the same command's runs when there are any, else of all) scales every constant.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Iterable

from harness.step.backends import of

from .peak import TRAINING_MODES, model_flops_per_step, peak_flops
from .router_flops import router_fwd_flops

Span = tuple[float, float]

#: Matrix-product throughput of a step, FLOP/s (low, high). CPU: measured (module docstring).
#: CUDA: a fraction of the dense BF16 peak (small models reach 5-40 %); float32 without TF32 (the
#: project's default ``highest`` matmul precision) runs on the CUDA cores, about 1/15 of it.
MATRIX_FLOPS = {"cpu": (60e9, 200e9), "cuda_fraction": (0.05, 0.4)}
FP32_CUDA_FACTOR = 1 / 15
#: A CUDA device whose peak is not in the table is taken as this many FLOP/s (an A100's order).
UNKNOWN_CUDA_PEAK = 300e12
#: The router's mixing (elementwise, memory-bound), FLOP/s (low, high). CUDA: a fraction of the peak.
ROUTER_FLOPS = {"cpu": (2e9, 8e9), "cuda_fraction": (0.002, 0.02)}
#: Overhead of one sublayer in one pass (a backward is two more), seconds (low, high).
SUBLAYER_OVERHEAD_S = {"cpu": (0.3e-3, 0.6e-3), "cuda": (0.05e-3, 0.15e-3)}
#: A compiled or captured step's overhead, as a share of the eager one.
FUSED_OVERHEAD = 1 / 3
#: AdamW's update per parameter (``train_step`` and training), FLOP at the router's throughput.
OPTIMIZER_FLOP_PER_PARAM = 20

#: A cold ``model``-scope compile of a ``fwd_bwd`` step, seconds: ``COMPILE_S`` × weight ×
#: (2L)^exponent, the exponent 0.75 for the PreNorm family and 0.95 for the block routers, whose
#: graphs grow faster with depth (measured cold, d=64, 4 layers: prenorm 16 s, block routers
#: 27-45 s; docs/SWEEPS.md, "Compile scopes": prenorm 52 s at 12 layers and 114 s at 48 (Inductor's
#: start-up included), haares two_phase 159 s and 557 s).
COMPILE_S = 2.8
COMPILE_DEPTH_EXPONENT = {"fixed": 0.75, "block": 0.95}
#: Under ``layer`` scope, seconds per region (``workloads.decoder.region_count``) of a cold
#: ``fwd_bwd`` compile, whatever the depth (docs/SWEEPS.md, "Compile scopes": block_attnres naive 65 s for 26 regions,
#: two_phase 36 s for 7, full_attnres 135 s for 26).
COMPILE_REGION_S = 4.0
#: Inductor's start-up, once per process that compiles (docs/SWEEPS.md, "Compile scopes": about 15-20 s cold; 3 s warm), (low, high).
COMPILE_STARTUP_S = (3.0, 20.0)
#: A forward alone compiles no joint graph: this share of the ``fwd_bwd`` figure.
COMPILE_FORWARD_ONLY = 0.6
#: CUDA compiles the same graphs with Triton kernels, which take longer to build: ×1.5.
COMPILE_CUDA_FACTOR = 1.5
#: Weight of a router's model graph, relative to prenorm's (fitted at 4, 12 and 48 layers),
#: times its impl's (``routers.impls.Impl.compile_weight``: the two-phase schedule's graph is
#: larger, lean's larger still; 1 for an impl that declares none or the registry does not know).
#: ``full_attnres`` adds one source per sublayer: 1 + L/16.
COMPILE_WEIGHT = {"prenorm": 1.0, "rezero": 1.1, "layerscale": 1.1, "block_attnres": 1.2,
                  "haares": 1.35, "wav_v1": 1.55}
DEFAULT_COMPILE_WEIGHT = 1.5
#: Routers whose graph grows with depth: router -> weight per layer, added to 1 (replaces
#: :data:`COMPILE_WEIGHT`): ``full_attnres`` adds one source per sublayer.
COMPILE_WEIGHT_PER_LAYER = {"full_attnres": 1 / 16}
#: Share of a cold compile that a warm Inductor cache leaves (the low end): measured 0.03-0.1 here
#: (d=64, 4 layers: 0.5-2.5 s where the cold compile took 16-45 s).
WARM_COMPILE = 0.06
#: The high end's allowance for a machine shared with other work (the figures above were measured
#: on an idle one; on a loaded one they came 1.2-1.5× longer).
LOADED_MACHINE = 1.3

#: One case's set-up besides its compile and warm-up, seconds (low, high), on CPU: model build and
#: parameter count 0.01-0.03 s, parity of a non-naive impl 0.01-0.06 s, saved activations
#: 0.01-0.6 s; and once per process, the first case's imports (fvcore, the traffic model) ~1 s.
CASE_SETUP_S = {"cpu": (0.05, 0.4), "cuda": (0.2, 1.0)}
PROCESS_SETUP_S = (1.0, 3.0)
#: Counting FLOPs by fvcore and FlopCounterMode (and the cost models), once per router and shape:
#: a fixed part plus the time of this many eager forward-and-backward steps (measured: 0.08-0.25 s
#: at d=64, 4 layers; 0.2-0.8 s at d=128, 8 layers).
COUNT_S = (0.05, 0.15)
COUNT_STEPS = (3, 6)
#: Warm-up: at least ``warmup_s`` and 3 steps, at most 200 steps (harness.timing.timer.TimingPolicy).
WARMUP_MIN_STEPS, WARMUP_MAX_STEPS = 3, 200
#: The run's copy-bandwidth measurement (``routerbench run``, once per run), seconds (low, high):
#: 1.3 s on this CPU (256 MiB); a GiB on CUDA.
BANDWIDTH_S = (1.0, 5.0)
#: Writing the report (tables, figures), seconds (low, high).
REPORT_S = (5.0, 30.0)
#: Writing a checkpoint (weights, AdamW state: 16 bytes per parameter), bytes/s (low, high).
CHECKPOINT_BYTES_S = (0.2e9, 2e9)
#: A training run's set-up besides its untimed warm-up steps and compile (build, optimizer,
#: validation batches, fused-AdamW probe), seconds (low, high).
TRAIN_SETUP_S = (0.3, 2.0)

#: Bytes of one row of ``records.jsonl`` (a JSON line with its case key): 750-860 in a seeds-suite
#: run on this CPU (587,809 bytes, 695 lines), rounded up.
ROW_BYTES = 900
#: Rows a cost case writes besides its step times: its set-up (FLOPs, memory, counts, parity,
#: compile) once and the noise readings of each timing.
SETUP_ROWS, READING_ROWS = 40, 10
#: Bytes on disk per parameter of a finished training run: its final weights, fp32 (the resume
#: checkpoint is removed when it ends).
FINAL_BYTES_PER_PARAM = 4
#: ... and of a run in progress: its resume checkpoint (fp32 weights and AdamW's two moments, 12),
#: twice while the next is written beside it before the old one is removed.
RESUME_BYTES_PER_PARAM = 24


def record_bytes(n_cases: int, rounds: int, attempts: int) -> int:
    """The most ``records.jsonl`` grows by for ``n_cases`` cost cases timed ``rounds`` rounds at
    most ``attempts`` times each (every attempt's rows are kept)."""
    return ROW_BYTES * n_cases * (SETUP_ROWS + attempts * (rounds + READING_ROWS))


def kind(device_type: str) -> str:
    return "cuda" if str(device_type).startswith("cuda") else "cpu"


def add(*spans: Span) -> Span:
    """The sum of ranges."""
    return (sum(s[0] for s in spans), sum(s[1] for s in spans))


def scale(span: Span, k: float) -> Span:
    return (span[0] * k, span[1] * k)


def router_model(cfg, router: str, options: dict):
    """The router of a decoder of shape ``cfg``, built on the ``meta`` device (no memory), once
    per router, shape and options (:func:`harness.costs.estimate.meta_router`)."""
    from .estimate import meta_router
    return meta_router(router, cfg.d_model, cfg.n_layers, options)


def step_flops(cfg, router: str, options: dict, mode: str) -> dict[str, float]:
    """FLOP of one step by where it runs: ``matrix`` (sublayers' matrices, attention, LM head) and
    ``router`` (its mixing: :func:`router_fwd_flops`, analytic where declared), forward and
    backward as the mode has them."""
    d, L, V = cfg.d_model, cfg.n_layers, cfg.vocab_size
    only = cfg.workload == "router_only"
    mlp = 12 * d * d if cfg.mlp == "swiglu" else 8 * d * d
    n_matrix = 0 if only else L * (4 * d * d + mlp)
    fwd_router, _ = router_fwd_flops(cfg, router, options)
    total = model_flops_per_step(mode if mode != "train" else "train_step", n_matrix=n_matrix,
                                 n_layers=L, d_model=d, seq_len=cfg.seq_len, batch_size=cfg.batch_size,
                                 router_fwd_flops=fwd_router, attention=not only)
    back = 3 if mode in (*TRAINING_MODES, "train") else 1
    tokens = cfg.batch_size if mode == "decode" else cfg.batch_size * cfg.seq_len
    router_part = back * fwd_router * tokens / (cfg.batch_size * cfg.seq_len)
    return {"matrix": total - router_part + back * 2 * d * V * tokens, "router": router_part}


def _throughputs(device_type: str, device_name: str | None, dtype: str) -> tuple[Span, Span]:
    if kind(device_type) == "cpu":
        return MATRIX_FLOPS["cpu"], ROUTER_FLOPS["cpu"]
    peak = peak_flops(device_name, "cuda") or UNKNOWN_CUDA_PEAK
    f = FP32_CUDA_FACTOR if dtype in ("float32", "float64") else 1.0
    return scale(MATRIX_FLOPS["cuda_fraction"], peak * f), scale(ROUTER_FLOPS["cuda_fraction"], peak)


def step_seconds(cfg, router: str, options: dict, mode: str, device_type: str = "cpu",
                 device_name: str | None = None, backend: str = "eager", params: int = 0) -> Span:
    """Seconds of one step (low, high) of ``mode`` (``fwd``, ``fwd_bwd``, ``train_step``,
    ``decode``, or ``train``: a training step with AdamW over ``params`` parameters), from its
    FLOPs (:func:`step_flops`) and the constants of the module docstring."""
    fl = step_flops(cfg, router, options, mode)
    (m_lo, m_hi), (r_lo, r_hi) = _throughputs(device_type, device_name, cfg.dtype)
    passes = 3 if mode in (*TRAINING_MODES, "train") else 1
    o_lo, o_hi = SUBLAYER_OVERHEAD_S[kind(device_type)]
    fused = FUSED_OVERHEAD if of(backend).hides_launches else 1.0
    subl = passes * 2 * cfg.n_layers * fused
    opt = OPTIMIZER_FLOP_PER_PARAM * params if mode in ("train", "train_step") else 0
    return (subl * o_lo + fl["matrix"] / m_hi + (fl["router"] + opt) / r_hi,
            subl * o_hi + fl["matrix"] / m_lo + (fl["router"] + opt) / r_lo)


def compile_seconds(cfg, router: str, options: dict, scope: str | None, mode: str,
                    device_type: str = "cpu") -> Span:
    """Seconds of one compile (low: warm Inductor cache, high: cold on a loaded machine) of a
    decoder of shape ``cfg`` under ``scope`` (``model`` or ``layer``), its backward included when
    ``mode`` has one; Inductor's start-up (:data:`COMPILE_STARTUP_S`) is not included."""
    if scope == "layer":
        from workloads.decoder import region_count
        cold = COMPILE_REGION_S * region_count(router_model(cfg, router, options))
    else:
        per_layer = COMPILE_WEIGHT_PER_LAYER.get(router)
        w = 1 + cfg.n_layers * per_layer if per_layer else COMPILE_WEIGHT.get(router, DEFAULT_COMPILE_WEIGHT)
        from routers.impls import BLOCK_ROUTERS, attribute
        w *= attribute(options.get("impl"), "compile_weight", 1.0)
        p = COMPILE_DEPTH_EXPONENT["block" if router in BLOCK_ROUTERS else "fixed"]
        cold = COMPILE_S * w * (2 * cfg.n_layers) ** p
    if mode not in (*TRAINING_MODES, "train"):
        cold *= COMPILE_FORWARD_ONLY
    if kind(device_type) == "cuda":
        cold *= COMPILE_CUDA_FACTOR
    return (cold * WARM_COMPILE, cold * LOADED_MACHINE)


def warmup_seconds(step: Span, warmup_s: float) -> Span:
    """The warm-up of one case: at least ``warmup_s`` and 3 steps, at most 200 steps."""
    return tuple(min(WARMUP_MAX_STEPS * s, max(warmup_s, WARMUP_MIN_STEPS * s)) for s in step)


def geometric_mean(span: Span) -> float:
    lo, hi = span
    return math.sqrt(lo * hi) if lo > 0 and hi > 0 else (lo + hi) / 2


# --- calibration on earlier runs -------------------------------------------------------------

def read_manifests(device_dir: Path) -> list[dict]:
    """The manifests under ``device_dir`` (``results/<device-slug>``), each with its run id;
    unreadable ones are passed over."""
    out = []
    for path in sorted(Path(device_dir).glob("*/manifest.json")):
        try:
            m = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(m, dict):
            out.append({**m, "run_id": m.get("run_id", path.parent.name)})
    return out


def busy_start(manifest: dict) -> bool:
    """Whether an earlier run began on a busy machine: its first session's ``cpu_pressure_start``
    above the noisy-group threshold ``cpu_pressure_max``, or its ``others_start`` (the CPUs other
    work held; older manifests: ``load_avg_start``, which also holds an earlier command's tail)
    above :data:`harness.timing.noise.LOAD_SHARE_MAX` of its ``cpus`` (the oldest manifests have
    neither: their pressure alone decides)."""
    from harness.timing.noise import LOAD_SHARE_MAX, THRESHOLDS
    sessions = manifest.get("sessions") or [manifest]
    first = sessions[0] if isinstance(sessions[0], dict) else {}
    p, cpus = first.get("cpu_pressure_start"), first.get("cpus")
    load = first["others_start"] if "others_start" in first else first.get("load_avg_start")
    num = lambda v: isinstance(v, (int, float))  # noqa: E731
    return bool((num(p) and p > THRESHOLDS["cpu_pressure_max"])
                or (num(load) and num(cpus) and cpus > 0 and load > LOAD_SHARE_MAX * cpus))


def ratio_of(manifest: dict) -> float | None:
    """actual / estimate of one earlier run: its first session's ``actual_s`` over the geometric
    mean of its uncalibrated estimate; None when it has none, was resumed or interrupted, or began
    on a busy machine (:func:`busy_start`: its time says more of the load than of the work)."""
    sessions = manifest.get("sessions") or [manifest]
    first = sessions[0] if isinstance(sessions[0], dict) else {}
    plan, actual = first.get("plan"), first.get("actual_s")
    if not isinstance(plan, dict) or not isinstance(actual, (int, float)) or plan.get("resumed") \
            or busy_start(manifest):
        return None
    raw = plan.get("uncalibrated_s") or plan.get("estimate_s")
    try:
        point = geometric_mean((float(raw[0]), float(raw[1])))
    except (TypeError, ValueError, IndexError):
        return None
    return actual / point if point > 0 and actual > 0 else None


def calibration(manifests: Iterable[dict], command: str) -> dict | None:
    """The factor every constant is scaled by: the median ratio (:func:`ratio_of`) of the earlier
    runs of ``command``, else of every command; None when no earlier run has a plan and an actual
    time; runs begun on a busy machine are left out (``busy`` counts them; with none left the
    factor is 1). Returns ``{"factor", "runs", "command", "run_ids", "busy"}``."""
    manifests = list(manifests)
    busy = sum(busy_start(m) for m in manifests)
    found = [(m.get("command"), m.get("run_id"), ratio_of(m)) for m in manifests]
    found = [f for f in found if f[2] is not None]
    same = [f for f in found if f[0] == command]
    use = same or found
    if not use:
        return {"factor": 1.0, "runs": 0, "command": command, "run_ids": [], "busy": busy} if busy else None
    return {"factor": statistics.median(f[2] for f in use), "runs": len(use),
            "command": command if same else "any", "run_ids": [f[1] for f in use], "busy": busy}


def describe_calibration(cal: dict | None) -> str:
    """``calibrated on 3 earlier runs on this device: ×1.4`` or ``uncalibrated: documented constants``."""
    if not cal:
        return "uncalibrated: documented constants"
    left = f"; {cal['busy']} begun on a busy machine left out" if cal.get("busy") else ""
    if not cal["runs"]:
        return f"uncalibrated: documented constants{left}"
    which = "" if cal["command"] != "any" else " (of other commands)"
    return (f"calibrated on {cal['runs']} earlier run{'s' * (cal['runs'] != 1)}{which} on this device: "
            f"×{cal['factor']:.3g}{left}")


def load_now() -> dict | None:
    """How much slower the machine's present load may make a command, for the high end of its
    plan: None when the machine is quiet (:func:`harness.timing.noise.machine_load`: CPU pressure
    and the CPUs other work holds within their thresholds), else ``{"factor", "pressure",
    "others", "load_avg", "cpus"}`` with factor = 1 + max(others / CPUs, CPU pressure), capped at
    1 + 1: the share of the CPUs other work holds, which a run that keeps every core busy must
    wait for (the load average stands in for ``others`` where ``/proc/stat`` cannot be read). The
    low end stays, since the load may lift; calibration leaves runs begun busy out
    (:func:`busy_start`), so the factor never compounds. Reads
    :data:`harness.timing.noise.PRESSURE_FILE` and :data:`harness.timing.others.STAT_FILE`."""
    from harness.timing import noise
    m = noise.machine_load()
    if not m["busy"]:
        return None
    held = m["others"] if m["others"] is not None else (m["load_avg"] or 0.0)
    share = min(1.0, max(m["pressure"] or 0.0, held / m["cpus"]))
    return {"factor": round(1.0 + share, 3), "pressure": m["pressure"], "others": m["others"],
            "load_avg": m["load_avg"], "cpus": m["cpus"]}


def describe_load(load: dict | None) -> str:
    """``busy now: the high end allows ×1.95 for the load (other work holds 1.9 of 2 CPUs, CPU
    pressure 96 %)``, or "" on a quiet machine."""
    if not load:
        return ""
    if load.get("others") is not None:
        held = [f"other work holds {load['others']:.1f} of {load['cpus']} CPUs"]
    elif load.get("load_avg") is not None:
        held = [f"load average {load['load_avg']:.1f} on {load['cpus']} CPUs"]
    else:
        held = []
    said = held + ([f"CPU pressure {load['pressure'] * 100:.0f} %"] if load.get("pressure") is not None else [])
    return f"busy now: the high end allows ×{load['factor']:.2f} for the load ({', '.join(said)})"


def fmt_span(span: Span) -> str:
    """``40–90 s``, ``2.9–17 min``, ``1.2–3.5 h``, ``105–356 days`` (one unit, the high end's)."""
    lo, hi = span
    for limit, unit, div in ((90, "s", 1), (5400, "min", 60), (48 * 3600, "h", 3600), (math.inf, "days", 86400)):
        if hi < limit:
            a, b = lo / div, hi / div
            return f"{_num(a)}–{_num(b)} {unit}"
    return ""


def _num(x: float) -> str:
    return f"{x:.1f}" if x < 10 and x != round(x) else f"{x:.0f}"


def fmt_bytes(n: float) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"
