"""Implementations of the stream routers (routers/impls.py family ``stream``,
routers/stream.py): the registry's families and plug-in points, the peers (lucidrains'
``hyper-connections`` for shc / dhc, Liger's mHC ops for mhc) checked against naive before they
are timed, a planted wrong mHC peer that the sweep records as ``parity failed`` and never times,
and the conventions a peer declares carried into its cases and its parity check."""

from __future__ import annotations

import pytest
import torch

from harness.rundir.writer import MemoryWriter
from harness.sweep import prepare
from harness.sweep.cases import Case, expand
from harness.sweep.options import SweepOptions
from harness.sweep.parity import router_parity
from harness.sweep.unit import measure_unit
from harness.timing.timer import TimingPolicy
from routers import build_router, impls
from routers.errors import ConfigError
from routers.stream import Coefficients
from workloads.config import DecoderConfig

TINY = DecoderConfig(d_model=16, n_layers=2, n_heads=2, seq_len=8, batch_size=2)
QUICK = SweepOptions(timing=TimingPolicy(warmup_min_count=1, warmup_min_s=0.0, repeats=3), max_attempts=1)
CPU = torch.device("cpu")
LUCIDRAINS_DHC = {"dyn_norm": "rmsnorm", "dyn_norm_eps": 0.0}


def _post_res_transposed(x, w, c, u):
    """A planted wrong mHC kernel: mixes the streams by H_resᵀ where the router applies H_res
    (TileKernels' convention run under the paper's: res_apply silently swapped)."""
    return torch.einsum("btsd,btso->btod", x, w.to(x.dtype)) + c.to(x.dtype).unsqueeze(-1) * u.unsqueeze(-2)


def _coefficients_post_mult_1(r, k, x):
    """A planted wrong mHC kernel: c = σ(H̄_post) without the paper's ×2 (TileKernels' default
    run under the paper's options). (Rows normalised last would not do: after 20 Sinkhorn
    iterations both axes sum to 1 within 1e-4, and parity rightly passes it.)"""
    ours = r.coefficients(x, r.next_params(k))
    return Coefficients(ours.a, ours.w, ours.c / r.post_mult)


WRONG = {"post_res": _post_res_transposed, "coefficients": _coefficients_post_mult_1}


def lucidrains():
    why = impls.get("lucidrains_hc").unavailable_reason("cpu", "float32", "fwd_bwd")
    if why:
        pytest.skip(why)


# --- the registry ------------------------------------------------------------------------------
def test_every_router_with_impls_is_in_one_family_and_naive_spans_them():
    assert impls.family_of("mhc").name == "stream" and impls.family_of("haares").name == "block"
    assert impls.family_of("prenorm") is None and impls.family_of("denseformer") is None
    assert set(impls.get("naive").routers) == set(impls.BLOCK_ROUTERS) | set(impls.STREAM_ROUTERS)
    assert impls.get("naive").family is None
    assert impls.get("lucidrains_hc").family.name == "stream" and impls.get("liger_mhc").family.name == "stream"
    assert impls.get("lucidrains_hc").schedule == "width_depth" and impls.get("liger_mhc").schedule == "naive"
    assert set(impls.get("liger_mhc").hooks) == {"coefficients", "pre_mix", "post_res"}


@pytest.mark.parametrize("impl,message", [
    (impls.Impl("x", ("mhc", "haares"), "naive"), "of one family"),
    (impls.Impl("x", ("prenorm",), "naive"), "of one family"),
    (impls.Impl("x", ("mhc",), "two_phase"), "schedule must be one of naive, width_depth"),
    (impls.Impl("x", ("mhc",), "naive", hooks={"width": print}), "has plug-in points coefficients, pre_mix, "
                                                                    "post_res, not width"),
    (impls.Impl("x", ("haares",), "naive", hooks={"pre_mix": print}), "not pre_mix"),
])
def test_register_refuses_an_impl_outside_its_family(impl, message):
    with pytest.raises(ValueError, match=message):
        impls.register(impl)
    assert "x" not in impls.IMPLS


def test_stream_routers_take_impl_and_refuse_an_unknown_one():
    assert build_router("dhc", 16, 2, impl="lucidrains_hc").peer_schedule == "width_depth"
    with pytest.raises(ConfigError, match=r"impl 'liger' is not an implementation of mhc; choose one of "
                                          r"\('naive', 'liger_mhc'\)"):
        build_router("mhc", 16, 2, impl="liger")


# --- a planted wrong mHC peer --------------------------------------------------------------------
@pytest.mark.parametrize("point", sorted(WRONG))
def test_a_wrong_mhc_peer_is_a_parity_failed_row_and_never_timed(point):
    with impls.registered(impls.Impl("wrong_mhc", ("mhc",), "naive", hooks={point: WRONG[point]})):
        w = MemoryWriter({"device": "cpu"})
        case = Case("mhc", TINY, "fwd_bwd", impl="wrong_mhc")
        status = measure_unit([(case, True)], CPU, w, QUICK)
    assert status == {case.key: "error"}
    parity = [r for r in w.rows if r["metric"] == "parity_error"]
    assert len(parity) == 1 and parity[0]["status"] == "error" and parity[0]["value"] > 1e-3
    step = [r for r in w.rows if r["metric"] == "step_time"]
    assert len(step) == 1 and step[0]["value"] is None and step[0]["error"].startswith("parity failed: max rel err")
    assert not [r for r in w.rows if r["metric"] in ("compile_time", "params_matrix")]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_parity_sees_a_transposed_h_res_in_float32_and_bfloat16(dtype):
    """The random parameters put H_res far from I (A.6's bias would make H and Hᵀ nearly equal)."""
    with impls.registered(impls.Impl("wrong_mhc", ("mhc",), "naive", hooks={"post_res": _post_res_transposed})):
        res = router_parity("mhc", {}, "wrong_mhc", 16, 2, 1, 8, dtype, CPU)
    assert not res.ok and res.max_rel_err > (100 if dtype == torch.float32 else 1) * res.tolerance, res.message()


def test_a_correct_plugged_point_passes():
    def post_res(x, w, c, u):          # ours, written out: equal to naive to rounding
        return torch.einsum("btsd,btos->btod", x, w.to(x.dtype)) + c.to(x.dtype).unsqueeze(-1) * u.unsqueeze(-2)
    with impls.registered(impls.Impl("same_mhc", ("mhc",), "naive", hooks={"post_res": post_res})):
        res = router_parity("mhc", {}, "same_mhc", 16, 2, 1, 8, torch.float32, CPU)
    assert res.ok and res.max_rel_err < 1e-5, res.message()


# --- peers ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("router,opts", [("shc", {}), ("dhc", LUCIDRAINS_DHC), ("dhc", {**LUCIDRAINS_DHC, "tanh": False}),
                                         ("shc", {"readout": "mean", "n": 3})])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_lucidrains_passes_parity(router, opts, dtype):
    lucidrains()
    res = router_parity(router, opts, "lucidrains_hc", 16, 2, 1, 8, dtype, CPU)
    assert res.ok, res.message()
    if dtype == torch.float32:
        assert res.max_rel_err < 1e-5


def test_lucidrains_is_not_dhc_under_its_default_layernorm():
    """Why the peer declares dyn_norm=rmsnorm, dyn_norm_eps=0: under dhc's default (LayerNorm, ε 1e-5)
    the package computes another function, and parity says so."""
    lucidrains()
    res = router_parity("dhc", {}, "lucidrains_hc", 16, 2, 1, 8, torch.float32, CPU)
    assert not res.ok and res.max_rel_err > 0.1


def test_lucidrains_is_timed_after_parity_through_the_sweep():
    lucidrains()
    w = MemoryWriter({"device": "cpu"})
    cases = [c for c in expand(["dhc"], TINY, [16], [2], ["fwd_bwd"], impls=["naive", "lucidrains_hc"])]
    assert [(c.impl, dict(c.options)) for c in cases] == [("naive", {}), ("naive", LUCIDRAINS_DHC),
                                                         ("lucidrains_hc", LUCIDRAINS_DHC)]
    status = measure_unit([(c, True) for c in cases], CPU, w, QUICK)
    assert set(status.values()) == {"ok"}
    parity = [r for r in w.rows if r["metric"] == "parity_error"]
    assert len(parity) == 1 and parity[0]["impl"] == "lucidrains_hc" and parity[0]["value"] < 1e-5
    timed = {r["impl"] for r in w.rows if r["metric"] == "step_time" and r["status"] == "ok"}
    assert timed == {"naive", "lucidrains_hc"}


def test_liger_mhc_under_the_interpreter():
    """Liger's mHC ops (Triton) on CPU need TRITON_INTERPRET=1 set before Triton is imported; the
    CI run has no liger-kernel (the kernels extra), so this skips there with the reason."""
    impl = impls.get("liger_mhc")
    why = impl.unavailable_reason("cpu", "float32", "fwd_bwd")
    if why:
        pytest.skip(why)
    for dtype in (torch.float32, torch.bfloat16):
        res = router_parity("mhc", {"sk_init": "softmax_eps"}, "liger_mhc", 16, 2, 1, 8, dtype, CPU)
        assert res.ok, res.message()


# --- the conventions a peer declares -------------------------------------------------------------
def test_a_peers_conventions_bring_naive_under_them_and_clash_with_contrary_options():
    cases = expand(["mhc"], TINY, [16], [2], ["fwd"], impls=["naive", "liger_mhc"])
    assert [(c.impl, dict(c.options)) for c in cases] == [
        ("naive", {}), ("naive", {"sk_init": "softmax_eps"}), ("liger_mhc", {"sk_init": "softmax_eps"})]
    with pytest.raises(ConfigError, match=r"--impls liger_mhc: it implements mhc only with res_apply='H', but "
                                          r"--router-options sets res_apply='HT'"):
        expand(["mhc"], TINY, [16], [2], ["fwd"], impls=["liger_mhc"], options={"mhc": {"res_apply": "HT"}})
    only = expand(["mhc"], TINY, [16], [2], ["fwd"], impls=["liger_mhc"], options={"mhc": {"sk_iters": 5}})
    assert [(c.impl, dict(c.options)) for c in only] == [("liger_mhc", {"sk_iters": 5, "sk_init": "softmax_eps"})]


def test_a_stream_peer_is_skipped_under_the_layer_scope_and_without_its_package():
    case = Case("dhc", TINY, "fwd", "compile", "default", tuple(LUCIDRAINS_DHC.items()), "lucidrains_hc", 0, "layer")
    assert "no region form" in prepare.impl_unavailable(case, CPU)
    liger = Case("mhc", TINY, "fwd", "eager", None, (("sk_init", "softmax_eps"),), "liger_mhc", 0, None)
    assert prepare.impl_unavailable(liger, CPU) == impls.get("liger_mhc").unavailable_reason("cpu", "float32", "fwd")
