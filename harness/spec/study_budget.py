"""The depth study sized to a wall-clock budget on one GPU (``scripts/gpu_study.sh BUDGET``).

What it runs: ``routerbench study depth`` at the char scale (d=512, T=256, B=32), depths 12 and
48, ``block_attnres`` against ``haares`` (and ``wav_v1`` when the budget allows), all three with
their ``two_phase`` impl, :data:`SEEDS` seeds paired by seed, on the graphed training step
(``--backend cudagraph``) in ``bf16-mixed``.

How it sizes itself (:func:`size_study`): every part of the session is priced from the seconds
per step, per run set-up and per evaluation of each router at each depth: measured by a probe of
the study's own timed estimate on the machine (:mod:`harness.cli.study_budget`), or, with
``--dry-run`` and no GPU, the H100-class assumptions :func:`assumed_cases` (labelled so wherever
they are used). The steps per run are the most that fit ``budget − what was already spent − the
fixed parts`` (process start-up, the study's own estimate, set-up, evaluations and checkpoints,
report and diagnostics, the archive), rounded down to two significant digits and capped at the
full study's budget (the char preset's 5,000 steps).

The rules, stated in the plan it prints:

- seeds: :data:`SEEDS` = 5, so a paired t-interval has 4 degrees of freedom (t = 2.78 against
  4.30 with 3 seeds: with √(5/3) more, half as wide an interval for the same spread);
- routers: ``block_attnres`` + ``haares`` (the HAARES paper's comparison); ``wav_v1`` joins when
  three routers still get :data:`THIRD_ROUTER_MIN_STEPS` steps per run, a fifth of the full study;
- evaluations: below :data:`SHORT_RUN_STEPS` steps, at step 0 and the budget only (no resume
  checkpoint: one is 16 bytes per parameter, 3.2 GB at 48 layers); from there, every quarter;
- warm-up: the preset's 200 steps, at most a fifth of the run;
- below :data:`MIN_STEPS` steps per run the budget is refused, naming the budget that reaches it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from harness.costs import forecast as fc
from routers.errors import ConfigError
from workloads.config import PRESETS, TRAINING_PRESETS

from .study import budget_words

#: The study: depths, the baseline the others are paired against, the pair of a small budget and
#: the three routers of a larger one, their impl, backend and precision, and seeds.
DEPTHS = (12, 48)
BASE = "block_attnres"
PAIR = ("block_attnres", "haares")
ALL = ("block_attnres", "haares", "wav_v1")
IMPL = "two_phase"
BACKEND = "cudagraph"
PRECISION = "bf16-mixed"
SEEDS = 5
#: The rules (module docstring): the fewest steps per run taken; the steps three routers must
#: still get for wav_v1 to join; below ``SHORT_RUN_STEPS`` evaluations at 0 and the budget only,
#: from there ``LONG_RUN_EVALS`` segments.
MIN_STEPS = 100
THIRD_ROUTER_MIN_STEPS = 1000
SHORT_RUN_STEPS = 1000
LONG_RUN_EVALS = 4
#: The full study: the char-* presets' step budget (5,000; ours), warm-up and tokens per step.
FULL_STEPS = TRAINING_PRESETS["char-12L"].max_steps.value
PRESET_WARMUP = TRAINING_PRESETS["char-12L"].warmup_steps.value
TOKENS_PER_STEP = PRESETS["char-12L"].batch_size * PRESETS["char-12L"].seq_len
#: Steps the probe times per router and depth (after the run's 3 untimed ones); the study's own
#: estimate, run again by ``study depth`` before it trains, times :data:`STUDY_ESTIMATE_STEPS`.
PROBE_STEPS = 10
STUDY_ESTIMATE_STEPS = 1

# --- fixed parts and assumptions (seconds) ---------------------------------------------------
#: Start-up of one Python process of the session (imports, CUDA context, the corpus); two of them
#: (the probe, the study). An assumption, not measured.
STARTUP_S = 15.0
#: The study's report (tables, figures) and its diagnostics per run (weights loaded, 4 batches).
REPORT_S = 20.0
DIAGNOSE_PER_RUN_S = 1.5
#: The tar.gz of the run directory (records, report, diagnostics; checkpoints left out).
ARCHIVE_S = 10.0
#: Checkpoint writes, bytes/s: the geometric mean of the project's range
#: (:data:`harness.costs.forecast.CHECKPOINT_BYTES_S`). A resume checkpoint is 16 bytes per
#: parameter (weights and AdamW), a run's final weights 4.
CHECKPOINT_RATE = fc.geometric_mean(fc.CHECKPOINT_BYTES_S)

#: ASSUMED step time of block_attnres on an H100-class GPU (bf16-mixed, cudagraph, d=512, T=256,
#: B=32, two_phase), used only when no GPU was probed: base + per layer, so 15.0 ms at 12 layers
#: and 55.0 ms at 48. Why: 48 layers x 16·d² = 201M parameters, 6 x 201M x 8,192 tokens = 9.9 TFLOP
#: a step, at ~250 TFLOP/s (a quarter of the dense bf16 peak: d=512 matmuls are small) = 40 ms,
#: plus ~15 ms of router and elementwise kernels. Not measured.
ASSUMED_STEP_BASE_S = 1.7e-3
ASSUMED_STEP_PER_LAYER_S = 1.11e-3
#: ASSUMED step-time factor of each router over block_attnres (its dispatched ops per step,
#: docs/GPU.md, "Graph replay and capture safety", damped because the matmuls dominate at d=512).
ASSUMED_ROUTER_FACTOR = {"block_attnres": 1.0, "haares": 1.15, "wav_v1": 1.25}
#: ASSUMED fp32 slowdown (no TF32: the study leaves matmul precision at PyTorch's default).
ASSUMED_FP32_FACTOR = 4.0
#: ASSUMED set-up of one run (build, 3 untimed steps, capture): base + per layer; an evaluation
#: (4 forward batches, uncaptured) as 1.5 steps.
ASSUMED_SETUP_BASE_S = 1.0
ASSUMED_SETUP_PER_LAYER_S = 0.03
ASSUMED_EVAL_STEPS = 1.5
ASSUMPTION = (f"ASSUMED, not measured (no GPU probed): H100-class step time {ASSUMED_STEP_BASE_S * 1e3:.1f} ms + "
              f"{ASSUMED_STEP_PER_LAYER_S * 1e3:.2f} ms x layers for block_attnres (haares x"
              f"{ASSUMED_ROUTER_FACTOR['haares']:g}, wav_v1 x{ASSUMED_ROUTER_FACTOR['wav_v1']:g}), "
              f"bf16-mixed, cudagraph; set-up {ASSUMED_SETUP_BASE_S:g} s + {ASSUMED_SETUP_PER_LAYER_S:g} s x layers; "
              "harness/spec/study_budget.py says why")


@dataclass(frozen=True)
class Case:
    """One router at one depth: ``step_s`` per training step, ``setup_s`` per run (build, warm-up,
    capture), ``eval_s`` per evaluation, ``params`` (what a checkpoint holds)."""

    depth: int
    router: str
    step_s: float
    setup_s: float
    eval_s: float
    params: int


def assumed_cases(routers=ALL, depths=DEPTHS, precision: str = PRECISION, vocab: int = 96) -> list[Case]:
    """The H100-class assumptions (:data:`ASSUMPTION`) as cases, for a plan without a GPU."""
    from harness.costs.estimate import decoder_parameter_count
    slow = ASSUMED_FP32_FACTOR if precision == "fp32" else 1.0
    out = []
    for d in depths:
        cfg = PRESETS["char-12L"].replace(n_layers=d, vocab_size=vocab, dtype="float32")
        for r in routers:
            step = (ASSUMED_STEP_BASE_S + ASSUMED_STEP_PER_LAYER_S * d) * ASSUMED_ROUTER_FACTOR.get(r, 1.3) * slow
            out.append(Case(d, r, step, ASSUMED_SETUP_BASE_S + ASSUMED_SETUP_PER_LAYER_S * d,
                            ASSUMED_EVAL_STEPS * step, decoder_parameter_count(cfg, r, router_options(r))))
    return out


def router_options(router: str) -> dict:
    """The options a study run of ``router`` is built with here (the impl; the study adds its
    default layout, 4 blocks of whole layers)."""
    return {"impl": IMPL, "n_blocks": 4, "block_unit": "layer"}


def probe_seconds(cases: list[Case], steps: int = PROBE_STEPS) -> float:
    """What the probe costs: a process start-up, then per case a set-up, one evaluation and
    ``steps`` steps (and the 3 untimed ones, inside the set-up)."""
    return STARTUP_S + sum(c.setup_s + c.eval_s + steps * c.step_s for c in cases)


def eval_every(steps: int) -> int:
    """The evaluation cadence of a run of ``steps`` (module docstring, "evaluations")."""
    return steps if steps < SHORT_RUN_STEPS else math.ceil(steps / LONG_RUN_EVALS)


def warmup(steps: int) -> int:
    """Linear LR warm-up: the preset's, at most a fifth of the run."""
    return min(PRESET_WARMUP, steps // 5)


def study_seconds(cases: list[Case], routers, seeds: int, steps: int) -> dict[str, float]:
    """Seconds of the ``study depth`` process by part for ``steps`` steps per run."""
    mine = [c for c in cases if c.router in routers]
    every = eval_every(steps)
    n_evals = len({0, *range(every, steps, every), steps})
    n_ckpt = n_evals - 2  # a resume checkpoint at every evaluation but the first and the last
    return {"study start-up": STARTUP_S,
            "the study's own estimate": sum(c.setup_s + c.eval_s + STUDY_ESTIMATE_STEPS * c.step_s for c in mine),
            "set-up": seeds * sum(c.setup_s for c in mine),
            "steps": seeds * steps * sum(c.step_s for c in mine),
            "evaluations and checkpoints": seeds * sum(n_evals * c.eval_s + (16 * n_ckpt + 4) * c.params
                                                       / CHECKPOINT_RATE for c in mine),
            "report and diagnostics": REPORT_S + DIAGNOSE_PER_RUN_S * seeds * len(mine),
            "archive": ARCHIVE_S}


def fit_steps(left_s: float, cases: list[Case], routers, seeds: int, cap: int = FULL_STEPS) -> int:
    """The most steps per run (at most ``cap``; 0 when not even one fits) whose study takes at
    most ``left_s``, rounded down to two significant digits."""
    def fits(n: int) -> bool:
        return sum(study_seconds(cases, routers, seeds, n).values()) <= left_s
    lo, hi = 0, cap  # the cost grows with n: the largest n that fits, by bisection
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
    if lo >= 100:
        q = 10 ** (len(str(lo)) - 2)
        lo = lo // q * q
    return lo


@dataclass
class StudyPlan:
    """What :func:`size_study` chose and why; :meth:`args` is the ``study depth`` command line."""

    budget_s: float
    spent_s: float
    spent_what: str
    routers: tuple[str, ...]
    seeds: int
    steps: int
    parts: dict[str, float]
    three_router_steps: int
    measured: bool
    cases: list[Case]
    precision: str = PRECISION
    depths: tuple[int, ...] = DEPTHS
    full_s: dict[str, float] = field(default_factory=dict)

    @property
    def total_s(self) -> float:
        return self.spent_s + sum(self.parts.values())

    def args(self) -> list[str]:
        import json
        opts = {r: {"impl": IMPL} for r in self.routers}
        return ["--scale", "char", "--routers", ",".join(self.routers), "--depths", ",".join(map(str, self.depths)),
                "--seeds", str(self.seeds), "--max-steps", str(self.steps), "--eval-every", str(eval_every(self.steps)),
                "--warmup-steps", str(warmup(self.steps)), "--backend", BACKEND, "--precision", self.precision,
                "--router-options", json.dumps(opts, separators=(",", ":")),
                "--estimate-steps", str(STUDY_ESTIMATE_STEPS), "--quiet"]

    def buys(self) -> str:
        """What the budget buys, in words (the smoke-test sentence below the full study)."""
        note = budget_words(self.steps, FULL_STEPS, TOKENS_PER_STEP)
        if note is None:
            return (f"the full study: {FULL_STEPS:,} steps per run (the char preset's budget, "
                    f"{FULL_STEPS * TOKENS_PER_STEP / 1e6:.3g}M tokens); "
                    f"{_dur(self.budget_s - self.total_s)} of the budget left unused")
        full = " or ".join(f"{_dur(v)} with {k}" for k, v in self.full_s.items())
        where = "this machine" if self.measured else "the assumed H100-class GPU"
        return f"{note}; the full study on {where} would need a budget of about {full}"

    def lines(self) -> list[str]:
        src = ("measured by the probe (the study's timed estimate: median of "
               f"{PROBE_STEPS} graphed steps per router and depth)" if self.measured else ASSUMPTION)
        out = [f"budget: {_dur(self.budget_s)} ({self.budget_s:.0f} s); step times {src}"]
        for d in self.depths:
            cs = [c for c in self.cases if c.depth == d]
            out.append(f"  depth {d:2d}: " + ", ".join(f"{c.router} {c.step_s * 1e3:.1f} ms/step, set-up "
                                                        f"{c.setup_s:.1f} s" for c in cs))
        third = (f"three routers would get {self.three_router_steps:,} steps per run"
                 + (": wav_v1 joins" if len(self.routers) == 3 else ": too few, two routers"))
        out += [f"rule: {self.seeds} seeds paired by seed (paired t-interval with {self.seeds - 1} df: t = "
                f"{_t975(self.seeds - 1):.2f}; 3 seeds give t = 4.30); {BASE} + haares, and wav_v1 when three "
                f"routers still get >= {THIRD_ROUTER_MIN_STEPS:,} steps per run ({third}); evaluations "
                + ("at step 0 and the budget only (no resume checkpoint)" if self.steps < SHORT_RUN_STEPS
                   else f"every {eval_every(self.steps)} steps (3 resume checkpoints)")
                + f"; warm-up {warmup(self.steps)} steps",
                f"plan: {len(self.routers)} routers ({', '.join(self.routers)}, impl {IMPL}) x {len(self.depths)} "
                f"depths ({', '.join(map(str, self.depths))}) x {self.seeds} seeds = "
                f"{len(self.routers) * len(self.depths) * self.seeds} runs x {self.steps:,} steps per run, "
                f"backend {BACKEND}, {self.precision}, char scale (d=512, T=256, B=32)",
                f"estimate: {_dur(self.total_s)} ({self.total_s:.0f} s) of the {_dur(self.budget_s)} "
                f"({self.budget_s:.0f} s) budget: {self.spent_what} "
                f"{_dur(self.spent_s)}, " + ", ".join(f"{k} {_dur(v)}" for k, v in self.parts.items()),
                f"the budget buys: {self.buys()}"]
        return out


def _dur(s: float) -> str:
    return f"{s:.0f} s" if s < 90 else f"{s / 60:.1f} min" if s < 5400 else f"{s / 3600:.1f} h"


def _t975(df: int) -> float:
    from scipy import stats
    return float(stats.t.ppf(0.975, df))  # the 95 % t-interval of harness.stats.seeds


def size_study(budget_s: float, cases: list[Case], spent_s: float, spent_what: str = "spent so far",
               seeds: int = SEEDS, measured: bool = True, precision: str = PRECISION) -> StudyPlan:
    """Choose routers and steps per run for ``budget_s`` (the module docstring's rules).

    Args:
        cases: per router (all of :data:`ALL`) and depth, measured or :func:`assumed_cases`.
        spent_s: seconds of the budget already gone (set-up of the session, the probe).

    Raises:
        ConfigError: the budget buys fewer than :data:`MIN_STEPS` steps per run with two routers
            (naming ``BUDGET`` and the budget that would).
    """
    left = budget_s - spent_s
    three = fit_steps(left, cases, ALL, seeds)
    routers = ALL if three >= THIRD_ROUTER_MIN_STEPS else PAIR
    steps = three if routers == ALL else fit_steps(left, cases, PAIR, seeds)
    if steps < MIN_STEPS:
        need = spent_s + sum(study_seconds(cases, PAIR, seeds, MIN_STEPS).values())
        raise ConfigError(f"BUDGET {_dur(budget_s)} buys {steps} steps per run, fewer than {MIN_STEPS} "
                          f"({len(PAIR)} routers x {len(DEPTHS)} depths x {seeds} seeds after "
                          f"{_dur(spent_s)} {spent_what}); give at least {math.ceil(need / 60)}m")
    full = {f"{len(rs)} routers": spent_s + sum(study_seconds(cases, rs, seeds, FULL_STEPS).values())
            for rs in (PAIR, ALL)}
    return StudyPlan(budget_s, spent_s, spent_what, routers, seeds, steps,
                     study_seconds(cases, routers, seeds, steps), three, measured, cases, precision,
                     full_s=full)
