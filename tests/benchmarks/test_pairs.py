"""Every benchmark of the suite: one pair (a router vs prenorm, or compiled vs eager), set up on
``routerbench run``'s path (:mod:`harness.ci.pairbench`). pytest-benchmark records the measured
side of each round (the router, or the compiled step); the baseline runs untimed beside it in
``pedantic``'s setup or teardown by ABBA order. The paired ratio and its interval, FLOPs, memory,
tokens/s and MFU are in ``extra_info`` (``--benchmark-json``), and ``routerbench report`` /
``routerbench gate`` read that JSON. Rounds: the suite's, or pytest-benchmark's rule when
``--benchmark-min-rounds`` / ``--benchmark-max-time`` is given (:mod:`harness.ci.benchplugin`).

    pytest tests/benchmarks --benchmark-only [--bench-suite cpu|gpu] [--benchmark-json out.json]
"""

import math

import pytest
import torch

from harness.ci.benchplugin import bench_rounds
from harness.ci.pairbench import PairBench
from harness.ci.suite import default_suite, suite_pairs
from harness.step import backends


def _suite(config) -> str:
    return config.getoption("--bench-suite") or default_suite()


def pytest_generate_tests(metafunc):
    if "pair_id" in metafunc.fixturenames:
        ids = [p.id for p in suite_pairs(_suite(metafunc.config))]
        metafunc.parametrize("pair_id", ids, ids=ids)  # strings: the JSON's params stay readable


def test_pair(benchmark, pair_id, request):
    pair = {p.id: p for p in suite_pairs(_suite(request.config))}[pair_id]
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    for case in (pair.a, pair.b):
        reason = backends.unavailable_reason(case.backend, case.compile_mode, device)
        if reason:
            pytest.skip(reason)
    benchmark.group = pair.group
    with PairBench(pair, device) as pb:
        if pb.error:
            pytest.fail(pb.error)
        rounds = bench_rounds(request.config, pair.rounds, pb.round_s)
        benchmark.pedantic(**pb.pedantic(rounds))
        info = pb.finish()
    benchmark.extra_info.update(info)
    assert info["pairs"] == rounds
    assert math.isfinite(info["ratio"]) and info["ratio"] > 0
