"""One prepare and one timing path (DESIGN.md, "Layers"; MEASUREMENT.md, "Timing"): ``routerbench
run``, the pytest-benchmark suite and ``routerbench profile`` set their steps up with
:func:`harness.sweep.prepare.prepare_group`, time them with
:func:`harness.timing.paired.time_paired` and write the timing rows with
:func:`harness.sweep.timed.record_attempt`. Spies on those three see every caller."""

from __future__ import annotations

import pytest
import torch

from harness.ci.pairbench import PairBench
from harness.ci.suite import BenchPair
from harness.rundir.writer import MemoryWriter, RunWriter
from harness.sweep import prepare, profile, timed
from harness.sweep.cases import Case
from harness.sweep.options import SweepOptions
from harness.sweep.profile import profile_case
from harness.sweep.run import run_sweep
from harness.timing import paired
from harness.timing.timer import TimingPolicy
from workloads.config import DecoderConfig

CPU = torch.device("cpu")
TINY = DecoderConfig(vocab_size=32, d_model=16, n_layers=2, n_heads=2, seq_len=8, batch_size=2)
FAST = TimingPolicy(warmup_min_count=1, warmup_min_s=0.0, repeats=3)
OPTS = SweepOptions(flops=False, timing=FAST, max_attempts=1)
PATH = ("prepare_group", "time_paired", "record_attempt")


@pytest.fixture
def calls(monkeypatch):
    """The names of the path's functions in the order they were called."""
    seen: list[str] = []
    for mod, name in ((prepare, "prepare_group"), (paired, "time_paired"), (timed, "record_attempt")):
        def spy(*a, _real=getattr(mod, name), _name=name, **k):
            seen.append(_name)
            return _real(*a, **k)
        monkeypatch.setattr(mod, name, spy)
    return seen


def _runs(calls: list[str]) -> list[str]:
    """The calls with repeats folded: a timing calls time_paired once per ABBA cycle of rounds
    (harness.sweep.timed.time_rounds, so progress beats between cycles)."""
    return [name for i, name in enumerate(calls) if i == 0 or calls[i - 1] != name]


def test_run_prepares_times_and_records_through_the_path(calls, tmp_path):
    cases = [Case("prenorm", TINY, "fwd"), Case("rezero", TINY, "fwd")]
    with RunWriter(tmp_path, "r", "s") as w:
        assert run_sweep(cases, CPU, w, OPTS, progress=False) == {"resumed": 0, "ok": 2}
    assert _runs(calls) == list(PATH)  # one group: prepared once, timed in rounds, one attempt
    assert calls.count("time_paired") == 2  # FAST's 3 rounds: a whole ABBA cycle, then the last


def test_an_unpaired_case_takes_the_same_path(calls, tmp_path):
    with RunWriter(tmp_path, "r", "s") as w:
        run_sweep([Case("rezero", TINY, "fwd")], CPU, w, SweepOptions(flops=False, timing=FAST, paired=False,
                                                                    max_attempts=1), progress=False)
    assert _runs(calls) == list(PATH)


def test_the_benchmark_suite_prepares_times_and_records_through_the_path(calls):
    pair = BenchPair("vs_prenorm", Case("prenorm", TINY, "fwd"), Case("rezero", TINY, "fwd"), 3)
    with PairBench(pair, CPU, OPTS) as pb:
        for _ in range(pair.rounds):
            pb.round()
        info = pb.finish()
    assert calls == ["prepare_group", "time_paired", "time_paired", "time_paired", "record_attempt"]
    assert info["pairs"] == 3


def test_profile_prepares_times_and_records_through_the_path(calls, tmp_path):
    case = Case("rezero", TINY, "fwd")
    w = MemoryWriter({"device": "cpu"})
    res = profile_case(case, CPU, tmp_path, wait=0, warmup=1, active=1, writer=w,
                       methods=("paired_difference",), pairs=3, policy=FAST)
    assert _runs(calls) == list(PATH)
    assert set(res["table"].method) == {"paired_difference"}
    # the prenorm it was paired with is a case of its own rows, timed in the same rounds
    st = [r for r in w.rows if r["metric"] == "step_time"]
    assert {r["router"] for r in st} == {"prenorm", "rezero"} and {r["pair"] for r in st} == {0, 1, 2}
    assert not hasattr(profile, "interleaved_times") and not hasattr(profile, "build_step")
