"""Parity before timing (harness/sweep/parity.py): every implementation other than naive is checked
against naive on the case it is about to be timed on; a wrong one is an error row, never timed."""

import math

import pytest
import torch

from harness.rundir.writer import MemoryWriter
from harness.sweep.cases import Case
from harness.sweep.options import SweepOptions
from harness.sweep.parity import router_parity
from harness.sweep.unit import measure_unit
from harness.timing.timer import TimingPolicy
from routers import ROUTERS, impls
from routers.mixer import depth_mix
from workloads.config import DecoderConfig

TINY = DecoderConfig(d_model=32, n_layers=2, n_heads=2, seq_len=16, batch_size=2)
QUICK = SweepOptions(timing=TimingPolicy(warmup_min_count=1, warmup_min_s=0.0, repeats=3),
                      max_attempts=1)  # a busy machine must not re-time the group: rows are counted
CPU = torch.device("cpu")


def _with_temperature(sources, query, bias, key_gain, eps):
    """A planted wrong kernel: the depth mixer with a 1/sqrt(d) temperature on the logits."""
    return depth_mix(sources, query / math.sqrt(query.shape[-1]), bias, key_gain, eps)


WRONG = impls.Impl("wrong_temperature", ("block_attnres",), "naive", mix=_with_temperature,
                   conventions="test-only: divides the logits by sqrt(d)")


def test_a_wrong_implementation_is_an_error_row_and_never_timed():
    with impls.registered(WRONG):
        w = MemoryWriter({"device": "cpu"})
        case = Case("block_attnres", TINY, "fwd_bwd", impl="wrong_temperature")
        status = measure_unit([(case, True)], CPU, w, QUICK)
    assert status == {case.key: "error"}
    parity = [r for r in w.rows if r["metric"] == "parity_error"]
    assert len(parity) == 1 and parity[0]["status"] == "error" and parity[0]["value"] > 0.01
    step = [r for r in w.rows if r["metric"] == "step_time"]
    assert len(step) == 1 and step[0]["status"] == "error" and step[0]["value"] is None
    assert step[0]["error"].startswith("parity failed: max rel err")
    assert not [r for r in w.rows if r["metric"] in ("compile_time", "params_matrix")]  # nothing built


@pytest.mark.parametrize("impl", [i for i in ROUTERS["haares"].impls if impls.get(i).schedule == "two_phase"])
def test_two_phase_passes_parity_and_its_error_is_recorded(impl):
    w = MemoryWriter({"device": "cpu"})
    case = Case("haares", TINY, "fwd_bwd", impl=impl)
    assert measure_unit([(case, True)], CPU, w, QUICK) == {case.key: "ok"}
    parity = [r for r in w.rows if r["metric"] == "parity_error"]
    assert len(parity) == 1 and parity[0]["status"] == "ok" and 0 <= parity[0]["value"] < 1e-4
    assert len([r for r in w.rows if r["metric"] == "step_time" and r["status"] == "ok"]) == 3
    w = MemoryWriter({"device": "cpu"})
    measure_unit([(Case("haares", TINY, "fwd_bwd", impl="naive"), True)], CPU, w, QUICK)
    assert not [r for r in w.rows if r["metric"] == "parity_error"]  # naive is the reference


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_parity_catches_a_temperature_a_dropped_source_and_changed_inputs(dtype):
    with impls.registered(WRONG):
        res = router_parity("block_attnres", {}, "wrong_temperature", 32, 4, 2, 8, dtype, CPU)
    assert not res.ok and res.max_rel_err > res.tolerance

    def drop_first(sources, query, bias, key_gain, eps):  # Liger-Kernel#1344 in small: a source lost
        return depth_mix(sources[1:] if len(sources) > 2 else sources, query, None if bias is None else bias[1:]
                         if len(sources) > 2 else bias, key_gain, eps)

    def in_place(sources, query, bias, key_gain, eps):
        out = depth_mix(sources, query, bias, key_gain, eps)
        with torch.no_grad():
            sources[0].mul_(1.0)  # touches nothing
            sources[0].add_(1e-3)  # but this changes the embedding it was given
        return out
    for name, mix in (("drop_first", drop_first), ("in_place", in_place)):
        with impls.registered(impls.Impl(name, ("block_attnres",), "naive", mix=mix)):
            res = router_parity("block_attnres", {}, name, 32, 4, 2, 8, dtype, CPU)
        assert not res.ok, (name, res.message())
    assert "the impl changed its inputs" in res.problems


def test_full_attnres_past_32_sources_and_single_source_reads_through_every_available_adapter():
    """The Liger-Kernel#1344 case (33+ sources: 17 layers give the readout 35) and the FLA#883 case
    (a read over one source: every block's first read of block_attnres) through the parity check
    of every peer adapter that can run here."""
    tried, why = [], {}
    for router, layers in (("full_attnres", 17), ("block_attnres", 4)):
        for impl in impls.impls_for(router):
            if impl.builtin:
                continue
            reason = impl.unavailable_reason("cpu", "float32", "fwd_bwd")
            if reason:
                why[impl.name] = reason
                continue
            res = router_parity(router, {}, impl.name, 16, layers, 1, 4, torch.float32, CPU)
            assert res.ok, f"{impl.name} on {router} ({layers} layers): {res.message()}"
            tried.append(impl.name)
    # the reference itself covers both cases: naive vs naive in float64 is exact
    assert router_parity("full_attnres", {}, "naive", 16, 17, 1, 4, torch.float64, CPU).max_rel_err == 0
    if not tried:
        pytest.skip("no peer adapter can run here: " + "; ".join(f"{k}: {v}" for k, v in why.items()))


def _drop_past_32(sources, query, bias, key_gain, eps):
    """A planted wrong kernel, Liger-Kernel#1344 in small: every source past the 32nd is lost."""
    if len(sources) > 32:
        sources, bias = sources[:32], None if bias is None else bias[:32]
    return depth_mix(sources, query, bias, key_gain, eps)


@pytest.mark.parametrize("backward", [False, True], ids=["fwd", "fwd_bwd"])
def test_the_bf16_floor_catches_one_source_dropped_of_33_and_naive_passes_against_itself(backward):
    """Full AttnRes with 16 layers: the readout mixes 33 sources (e and 32 sublayer outputs); a kernel
    that drops the 33rd fails bfloat16 parity by a wide margin (about 3.5x its allowance at d=64,
    T=32), while naive passes against itself (its error is its own rounding through the chain)."""
    with impls.registered(impls.Impl("drop_past_32", ("full_attnres",), "naive", mix=_drop_past_32)):
        res = router_parity("full_attnres", {}, "drop_past_32", 64, 16, 1, 32, torch.bfloat16, CPU, backward)
    assert not res.ok and res.max_rel_err > 2 * res.tolerance, res.message()
    own = router_parity("full_attnres", {}, "naive", 64, 16, 1, 32, torch.bfloat16, CPU, backward)
    assert own.ok and own.max_rel_err < own.tolerance, own.message()
