"""What a sweep measures besides step time, and how it runs its units (the ``[sweep]`` and
``[timing]`` parts of ``routerbench run``'s spec, resolved: :class:`SweepOptions`), and the timing
protocol the manifest records (:func:`timing_manifest`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from harness.timing.noise import THRESHOLDS
from harness.timing.paired import CACHE_STATE
from harness.timing.timer import TimingPolicy

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
            ``prenorm`` (:mod:`harness.timing.paired`), one unit of resume per group; otherwise each
            case alone, one unit per case.
        pair_order: ``"ABBA"`` or ``"ABAB"`` (:data:`harness.timing.paired.ORDERS`).
        isolate: run each unit in its own subprocess (a crash or a hang loses only that unit; its
            cases are then re-run one by one to pin the failure on its case).
        case_timeout: seconds a case may go without progress under ``isolate`` before its
            process is killed as hung.
        remeasure_s: seconds a noisy group (:mod:`harness.timing.noise`) may spend being timed again,
            its steps held: another attempt starts only when one more (as long as the last) fits.
        max_attempts: timings of one case at most, the first included (1: never re-measure).
        precision_target: None: ``timing.repeats`` rounds per group (fixed). Else the relative
            half-width every paired ratio of a group is timed down to, under the stopping rule of
            :mod:`harness.stats.sequential` (looks after whole ABBA cycles at pre-set pair counts,
            each look's interval at the corrected level).
        group_budget_s: with a precision target, seconds of timed rounds one group may spend.
        min_pairs: with a precision target, the first look's pairs (even).
        max_rounds: with a precision target, the last look's pairs.
        noise_thresholds: the thresholds of :data:`harness.timing.noise.THRESHOLDS` to re-measure by.
        group_budget_bytes: a paired group estimated above this many bytes is split into
            subgroups that each hold prenorm (:func:`harness.sweep.plan.split_group`); None: never.
        quiet: print nothing to stderr (the findings of a ``cudagraph`` case's capture pre-flight
            on a device without CUDA, :func:`harness.sweep.prepare.capture_preflight`).
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
    precision_target: float | None = None
    group_budget_s: float = 600.0
    min_pairs: int = 10
    max_rounds: int = 400
    quiet: bool = False


def timing_manifest(opts: "SweepOptions") -> dict[str, Any]:
    """The timing protocol of a session, for ``manifest.json``: cache state, pairing, warm-up."""
    t = opts.timing
    return {"cache_state": CACHE_STATE, "l2_flush": False, "paired": opts.paired,
            "pair_order": opts.pair_order if opts.paired else None,
            "repeats": t.repeats, "warmup_min_count": t.warmup_min_count,
            "warmup_min_s": t.warmup_min_s, "remeasure_s": opts.remeasure_s,
            "max_attempts": opts.max_attempts, "noise_thresholds": dict(opts.noise_thresholds),
            "precision_target": opts.precision_target,
            **({"group_budget_s": opts.group_budget_s, "min_pairs": opts.min_pairs,
                "max_rounds": opts.max_rounds} if opts.precision_target is not None else {})}
