"""The re-timing policy alone (harness/sweep/retime.py): fed what attempts measured, it names the
next job, with no step, device or writer involved; and the backends as objects
(harness/step/backends.py): what each is, asked by property, never by comparing its name."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from harness.step import backends
from harness.sweep.cases import expand
from harness.sweep.options import SweepOptions
from harness.sweep.retime import Job, RetimePolicy
from harness.timing.timer import TimingPolicy
from workloads.config import DecoderConfig

CFG = DecoderConfig(vocab_size=32, d_model=16, n_layers=2, n_heads=2, seq_len=8, batch_size=2)
OPTS = SweepOptions(timing=TimingPolicy(warmup_min_s=0.0, repeats=5), remeasure_s=60.0, max_attempts=3)
QUIET = {"iqr_rel": 0.01}
NOISY = {"iqr_rel": 0.5}
ROOT = Path(__file__).resolve().parents[1]


def _group(backends_=("eager",)):
    cases = expand(["haares", "prenorm", "block_attnres"], CFG, [16], [2], ["fwd"], backends=list(backends_))
    return cases, {c.router + ("" if c.backend == "eager" else "@" + c.backend): c.key for c in cases}


def _measure(policy: RetimePolicy, job: Job, noisy: set[str], ms: float = 1.0, stop: str = "fixed") -> list[str]:
    times = {k: [ms] * 5 for k in job.keys}
    readings = {k: NOISY if k in noisy else QUIET for k in job.keys}
    return policy.measured(job, times, readings, stop, seconds=0.1)


def test_the_first_job_is_the_whole_group_prenorm_first():
    cases, key = _group()
    policy = RetimePolicy(cases, OPTS)
    job = policy.first()
    assert job.keys[0] == key["prenorm"] and set(job.keys) == set(key.values())
    assert (job.attempt, job.retimed, job.left_noisy, job.budget_s) == (1, None, None, OPTS.group_budget_s)
    assert policy.bases == {key["haares"]: key["prenorm"], key["block_attnres"]: key["prenorm"]}
    assert policy.partners[key["haares"]] == [key["prenorm"], key["block_attnres"]]


def test_a_noisy_case_is_timed_again_with_its_partners_until_quiet():
    cases, key = _group()
    policy = RetimePolicy(cases, OPTS)
    assert _measure(policy, policy.first(), {key["haares"]}) == [key["haares"]]
    job = policy.next()
    assert job.keys == [key["prenorm"], key["block_attnres"], key["haares"]]
    assert (job.attempt, job.retimed) == (2, key["haares"])
    _measure(policy, job, set())  # quiet now: nothing more
    assert policy.next() is None


def test_a_noisy_prenorm_times_the_whole_group_again():
    cases, key = _group()
    policy = RetimePolicy(cases, OPTS)
    _measure(policy, policy.first(), {key["prenorm"]})
    job = policy.next()
    assert job.retimed is None and set(job.keys) == set(key.values()) and job.attempt == 2


def test_max_attempts_and_the_budget_stop_re_timing():
    cases, key = _group()
    policy = RetimePolicy(cases, replace(OPTS, max_attempts=2))
    _measure(policy, policy.first(), {key["haares"]})
    _measure(policy, policy.next(), {key["haares"]})  # noisy again, but that was its second timing
    assert policy.next() is None
    slow = RetimePolicy(cases, replace(OPTS, remeasure_s=1.0))
    _measure(slow, slow.first(), {key["haares"]}, ms=100.0)  # (5 + 1) rounds x 3 cases x 0.1 s > 1 s
    assert slow.next() is None


def test_a_precise_timing_ignores_the_spread_and_a_busy_machine_keeps_the_timing_flagged():
    cases, key = _group()
    policy = RetimePolicy(cases, OPTS)
    assert _measure(policy, policy.first(), {key["haares"]}, stop="precise") == []
    assert policy.next() is None
    busy = RetimePolicy(cases, OPTS, busy=lambda k: 0.9)
    _measure(busy, busy.first(), {key["haares"]})
    job = busy.next()
    assert (job.retimed, job.left_noisy, job.attempt) == (key["haares"], 0.9, 1)
    assert busy.next() is None  # kept: nothing else was noisy


def test_an_eager_twin_partners_a_compiled_case():
    cases, key = _group(("eager", "compile"))
    policy = RetimePolicy(cases, OPTS)
    assert policy.partners[key["haares@compile"]] == [key["prenorm@compile"], key["block_attnres@compile"],
                                                      key["haares"]]


def test_each_backend_says_what_it_is():
    eager, comp, graph = (backends.of(n) for n in ("eager", "compile", "cudagraph"))
    assert backends.of(None) is eager and list(backends.BY_NAME) == ["eager", "compile", "cudagraph"]
    assert (eager.plain, comp.compiles, graph.captures) == (True, True, True)
    assert (eager.hides_launches, comp.hides_launches, graph.hides_launches) == (False, True, True)
    assert [b.warmup_metric for b in (eager, comp, graph)] == ["warmup_time", "compile_time", "capture_time"]
    assert comp.scope("layer") == "layer" and eager.scope("layer") is None
    cpu = torch.device("cpu")
    assert graph.unavailable(None, cpu) == "cudagraph captures CUDA work: no CUDA device here"
    assert comp.unavailable("reduce-overhead", cpu).startswith("compile mode reduce-overhead uses CUDA graphs")
    assert eager.unavailable(None, cpu) is None and comp.unavailable("default", cpu) is None
    with pytest.raises(ValueError, match="unknown backend 'jit'"):
        backends.of("jit")


def test_no_module_but_the_backends_own_compares_a_backend_name():
    """The grep of the issue that made backends objects: a backend's name compared with a string
    literal, anywhere in the harness, the reports and the workloads but the backends' module."""
    pattern = re.compile(r'backend\s*(==|!=)\s*"|backend\s+(not )?in\s+\(')
    hits = [f"{p.relative_to(ROOT)}:{i}" for d in ("harness", "reports", "workloads") for p in (ROOT / d).rglob("*.py")
            if p != ROOT / "harness" / "step" / "backends.py"
            for i, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert hits == []
