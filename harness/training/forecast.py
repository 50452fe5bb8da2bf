"""What training runs will take, before any model is built (``routerbench train``, the smoke race
of ``routerbench run``, ``routerbench study depth``): a time range by part and the peak memory
(the estimate model and its constants: :mod:`harness.costs.forecast`).

Per run: set-up (build, optimizer, validation batches: ``TRAIN_SETUP_S``; the untimed warm-up
steps, ``TrainConfig.untimed_warmup``; the compile under ``--backend compile``), its steps ×
the estimated step time (a training step with AdamW; ``--grad-accum`` micro-batches each pay the
per-sublayer overhead; under DDP each rank's slice of the batch), the evaluations up to its last
step (``eval_batches`` forwards each, uncompiled) and a checkpoint per evaluation (16 bytes per
parameter at ``CHECKPOINT_BYTES_S``). A run stops at its step budget (a pilot at its stop step):
``max_steps`` bounds the estimate; ``--stop-at-target`` can only shorten it.

Peak memory: per group of runs that may share the device (a seed's runs; a study's seed and
depth), the sum of :func:`harness.costs.estimate.estimate_bytes` when the group is interleaved,
else its largest run; ``auto`` is decided as :func:`harness.training.schedule.choose_schedule`
decides it (interleaved when the sum fits in ``MEMORY_FRACTION`` of the free memory).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from harness.costs import forecast as fc
from harness.costs.estimate import decoder_parameter_count, estimate_bytes
from harness.step.backends import compiles

from .config import TrainConfig, train_options
from .schedule import MEMORY_FRACTION


@dataclass(frozen=True)
class PlannedRun:
    """One training run as planned: ``steps`` it trains (a pilot stops early), ``group`` the
    runs that may be held together (interleaved) share."""

    router: str
    options: dict
    tc: TrainConfig
    steps: int
    group: object = 0


@dataclass
class TrainForecast:
    """Training runs' plan: parts (seconds, low and high), peak memory and schedules.

    Attributes:
        runs: runs planned; ``steps``: their steps together.
        parts: ``setup`` (untimed warm-up included), ``compile`` (Inductor's start-up once),
            ``steps``, ``evals`` (checkpoints included).
        peak_bytes: the largest group's estimate under its schedule; ``schedules``: group ->
            ``interleaved``, ``sequential`` or ``alone`` (a group of one run, as a pilot);
            ``compiled``: runs that compile their model.
    """

    runs: int
    steps: int
    parts: dict[str, fc.Span] = field(default_factory=dict)
    peak_bytes: int = 0
    schedules: dict = field(default_factory=dict)
    compiled: int = 0
    #: what the runs write to disk at most: checkpoints and records (bytes)
    disk_bytes: int = 0

    @property
    def total(self) -> fc.Span:
        return fc.add((0.0, 0.0), *self.parts.values())

    def manifest(self) -> dict:
        return {"runs": self.runs, "steps": self.steps, "peak_bytes": self.peak_bytes,
                "compiled_models": self.compiled, "disk_bytes": self.disk_bytes,
                "schedules": {str(k): v for k, v in self.schedules.items()},
                "parts": {k: list(v) for k, v in self.parts.items()}}


def run_cfg(run: PlannedRun, vocab_size: int):
    """The decoder a run builds: its shape with the corpus's vocabulary, float32 weights."""
    return run.tc.cfg.replace(vocab_size=vocab_size, dtype="float32")


def run_seconds(run: PlannedRun, vocab_size: int, device_type: str = "cpu", device_name: str | None = None,
                world_size: int = 1) -> dict[str, fc.Span]:
    """Seconds (low, high) of one run by part: ``setup``, ``compile``, ``steps``, ``evals``, and
    ``step`` (one training step) and ``eval`` (one evaluation)."""
    tc = run.tc
    cfg = run_cfg(run, vocab_size)
    opts = train_options(run.router, run.options)
    params = decoder_parameter_count(cfg, run.router, opts)
    dtype = "bfloat16" if tc.precision == "bf16-mixed" and fc.kind(device_type) == "cuda" else "float32"
    micro = cfg.replace(batch_size=max(1, cfg.batch_size // (world_size * tc.grad_accum)), dtype=dtype)
    one = fc.step_seconds(micro, run.router, opts, "train", device_type, device_name, tc.backend, params)
    step = fc.scale(one, tc.grad_accum)
    rank = cfg.replace(batch_size=max(1, cfg.batch_size // world_size), dtype=dtype)
    fwd = fc.step_seconds(rank, run.router, opts, "fwd", device_type, device_name)
    ckpt = (16 * params / fc.CHECKPOINT_BYTES_S[1], 16 * params / fc.CHECKPOINT_BYTES_S[0])
    evaluation = fc.add(fc.scale(fwd, tc.eval_batches), ckpt)
    n_evals = sum(1 for s in tc.eval_steps() if s <= run.steps)
    compiled = (fc.compile_seconds(cfg, run.router, opts, tc.compile_scope, "train", device_type)
                if compiles(tc.backend) else (0.0, 0.0))
    return {"setup": fc.add(fc.TRAIN_SETUP_S, fc.scale(step, tc.untimed_warmup)), "compile": compiled,
            "steps": fc.scale(step, run.steps), "evals": fc.scale(evaluation, n_evals), "step": step,
            "eval": evaluation}


def run_bytes(run: PlannedRun, vocab_size: int, world_size: int = 1) -> int:
    """Estimated peak memory of one run (:func:`harness.costs.estimate.estimate_bytes`)."""
    tc = run.tc
    return sum(estimate_bytes(run_cfg(run, vocab_size), run.router, train_options(run.router, run.options),
                              tc.precision, tc.grad_accum, world_size).values())


def choose(schedule: str, group_bytes: int, available_bytes: int | None) -> str:
    """``interleaved`` or ``sequential`` for a group, as ``choose_schedule`` decides ``auto``."""
    if schedule != "auto":
        return schedule
    return "interleaved" if available_bytes is None or group_bytes <= MEMORY_FRACTION * available_bytes \
        else "sequential"


def forecast_training(runs: list[PlannedRun], vocab_size: int, device_type: str = "cpu",
                      device_name: str | None = None, schedule: str = "sequential",
                      available_bytes: int | None = None, world_size: int = 1) -> TrainForecast:
    """The plan of ``runs``: parts summed over runs, peak memory of the largest group under
    ``schedule`` (``auto`` decided per group against ``available_bytes``)."""
    parts = {"setup": (0.0, 0.0), "compile": (0.0, 0.0), "steps": (0.0, 0.0), "evals": (0.0, 0.0)}
    groups: dict[object, list[int]] = {}
    for r in runs:
        s = run_seconds(r, vocab_size, device_type, device_name, world_size)
        for k in parts:
            parts[k] = fc.add(parts[k], s[k])
        groups.setdefault(r.group, []).append(run_bytes(r, vocab_size, world_size))
    if any(compiles(r.tc.backend) for r in runs):
        parts["compile"] = fc.add(parts["compile"], fc.COMPILE_STARTUP_S)  # once per process
    peak, chosen = 0, {}
    for g, sizes in groups.items():
        chosen[g] = choose(schedule, sum(sizes), available_bytes) if len(sizes) > 1 else "alone"
        peak = max(peak, sum(sizes) if chosen[g] == "interleaved" else max(sizes))
    # on disk: every run's final weights and records, and the resume checkpoints of the largest
    # group of runs trained together
    params = [decoder_parameter_count(run_cfg(r, vocab_size), r.router, train_options(r.router, r.options))
              for r in runs]
    by_group: dict[object, int] = {}
    for r, n in zip(runs, params):
        by_group[r.group] = by_group.get(r.group, 0) + n
    disk = (sum(fc.FINAL_BYTES_PER_PARAM * n + fc.ROW_BYTES * (fc.SETUP_ROWS + 4 * (r.steps // max(1, r.tc.eval_every) + 1))
                for r, n in zip(runs, params)) + fc.RESUME_BYTES_PER_PARAM * max(by_group.values(), default=0))
    return TrainForecast(runs=len(runs), steps=sum(r.steps for r in runs), parts=parts, peak_bytes=peak,
                         schedules=chosen, compiled=sum(compiles(r.tc.backend) for r in runs),
                         disk_bytes=disk)


def probe_seconds(run: PlannedRun, steps: int, vocab_size: int, device_type: str = "cpu",
                  device_name: str | None = None) -> fc.Span:
    """What ``routerbench study depth``'s timed estimate of one router and depth takes before
    training (:func:`harness.training.study.estimate_cost`): a set-up, one evaluation and
    ``steps`` steps."""
    s = run_seconds(run, vocab_size, device_type, device_name)
    return fc.add(s["setup"], s["compile"], s["eval"], fc.scale(s["step"], steps))
