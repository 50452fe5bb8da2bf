"""The baseline routers of docs/BASELINES.md (shc, dhc, mhc, denseformer): the float64 reference,
the invariants at init, App. A.6's values, Sinkhorn's sums and gradcheck (the planted port bugs:
tests/test_baseline_port_bugs.py)."""

from __future__ import annotations

import math

import pytest
import reference_baselines as ref
from reference_baselines import B, D, SIG3, SIGM3, T, a6, drive, inputs, prenorm, randomised
import torch

from routers import ROUTERS, build_router, check_router_options, router_options
from routers.errors import ConfigError
from routers.mhc import sinkhorn
from workloads.config import DecoderConfig
from workloads.decoder import Decoder, decay_groups

BASELINES = ("shc", "dhc", "mhc", "denseformer")


def assert_same(got, want):
    for a, b in zip(got, want, strict=True):
        assert torch.equal(a, b)


# --- registry, options, parameters -------------------------------------------------------------
def test_the_four_baselines_are_registered_with_the_papers_defaults():
    assert set(BASELINES) <= set(ROUTERS)
    m = router_options("mhc")
    assert (m["sk_init"], m["sk_iters"], m["sk_last"], m["res_apply"], m["post_mult"], m["pre_eps"],
            m["rms_eps"], m["rms_eps_mode"], m["readout"], m["n"]) == ("exp", 20, "col", "H", 2.0, 0.0,
                                                                       1e-6, "inside", "sum", 4)
    assert router_options("dhc") == {"n": 4, "readout": "sum", "tanh": True, "dyn_norm": "layernorm",
                                     "dyn_norm_eps": 1e-5, "impl": "naive"}
    assert router_options("denseformer") == {"dilation": 1, "period": 1, "unit": "layer"}


@pytest.mark.parametrize("name,opts,match", [
    ("mhc", {"sk_init": "softmax"}, "sk_init"), ("mhc", {"sk_iters": 0}, "sk_iters"),
    ("mhc", {"sk_last": "both"}, "sk_last"), ("mhc", {"res_apply": "H^T"}, "res_apply"),
    ("mhc", {"post_mult": 0}, "post_mult"), ("mhc", {"rms_eps_mode": "in"}, "rms_eps_mode"),
    ("mhc", {"pre_eps": -1.0}, "pre_eps"), ("mhc", {"phi_init": "normal"}, "phi_init"),
    ("shc", {"n": 0}, "n"), ("dhc", {"dyn_norm": "batchnorm"}, "dyn_norm"),
    ("dhc", {"readout": "max"}, "readout"), ("denseformer", {"dilation": 0}, "dilation"),
    ("denseformer", {"unit": "block"}, "unit"), ("shc", {"tanh": True}, "no option"),
])
def test_bad_options_are_one_line_errors_naming_the_option(name, opts, match):
    with pytest.raises(ConfigError, match=match) as err:
        check_router_options(name, opts, D, 2)
    assert "\n" not in str(err.value) and name in str(err.value)


def test_parameter_counts_by_hand():
    d, L, n = 16, 3, 4
    K = 2 * L
    assert sum(p.numel() for p in build_router("shc", d, L).parameters()) == K * (n * n + 2 * n)
    assert sum(p.numel() for p in build_router("dhc", d, L).parameters()) == K * (n * n + 2 * n + (n + 4) * d + 2)
    assert sum(p.numel() for p in build_router("dhc", d, L, dyn_norm="rmsnorm").parameters()) == \
        K * (n * n + 2 * n + (n + 3) * d + 2)
    assert sum(p.numel() for p in build_router("mhc", d, L).parameters()) == K * (n * d * (n * n + 2 * n) + n * n + 2 * n + 3)
    assert sum(p.numel() for p in build_router("denseformer", d, L).parameters()) == L * (L + 3) // 2
    # period 2 over sublayer units: DWAs after units 1, 3, 5 with m = 3, 5, 7
    assert sum(p.numel() for p in build_router("denseformer", d, L, unit="sublayer", period=2).parameters()) == 15


@pytest.mark.parametrize("name", BASELINES)
def test_router_parameters_are_out_of_weight_decay(name):
    model = Decoder(DecoderConfig(vocab_size=16, d_model=D, n_layers=2, n_heads=2, seq_len=4), name)
    decay, no_decay = decay_groups(model, 0.1)
    router = {id(p) for p in model.router.parameters()}
    assert router and not router & {id(p) for p in decay["params"]}
    assert router <= {id(p) for p in no_decay["params"]} and no_decay["weight_decay"] == 0.0


def test_mhc_parameters_and_coefficients_stay_float32_in_a_bf16_decoder():
    cfg = DecoderConfig(vocab_size=16, d_model=D, n_layers=2, n_heads=2, seq_len=4, dtype="bfloat16")
    model = Decoder(cfg, "mhc")
    r = model.router
    assert {p.dtype for p in r.parameters()} == {torch.float32}
    assert model.lm_head.weight.dtype == torch.bfloat16
    e = torch.randn(B, T, D, dtype=torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        state, first = r.init_state(e), r.slots[0]
        state = r.write(state, r.role(first), r.params(state, first), torch.randn(B, T, D, dtype=torch.bfloat16))
    assert {t.dtype for t in state.coef} == {torch.float32} and state.x.dtype == torch.bfloat16
    assert model(torch.randint(0, 16, (2, 4))).dtype == torch.bfloat16
    # a cast keeps the float32 values themselves (no round trip through bfloat16)
    r32 = build_router("mhc", D, 2)
    phi = r32.phi.detach().clone()
    assert torch.equal(r32.to(torch.bfloat16).phi.data, phi)


# --- the float64 reference ---------------------------------------------------------------------
CASES = [("shc", {}), ("shc", {"readout": "mean", "n": 3}), ("dhc", {}), ("dhc", {"tanh": False}),
         ("dhc", {"dyn_norm": "rmsnorm", "dyn_norm_eps": 0.0}), ("mhc", {}), ("mhc", {"n": 2}),
         ("mhc", {"sk_init": "softmax_eps", "sk_iters": 10, "res_apply": "HT", "post_mult": 1.0,
                  "pre_eps": 1e-6}),
         ("mhc", {"sk_last": "row", "rms_eps_mode": "outside", "readout": "mean"}),
         ("denseformer", {}), ("denseformer", {"dilation": 2}), ("denseformer", {"period": 2, "unit": "sublayer"}),
         ("denseformer", {"dilation": 3, "period": 2})]


@pytest.mark.parametrize("name,opts", CASES, ids=lambda v: str(v))
def test_equals_the_float64_reference_with_random_parameters(name, opts):
    L = 3
    e, ups = inputs(L)
    r = randomised(build_router(name, D, L, **opts).double())
    reads, out = drive(r, e, ups)
    want_reads, want_out = (ref.denseformer if name == "denseformer" else ref.streams)(r, e, ups)
    for got, want in zip(reads + [out], want_reads + [want_out], strict=True):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


# --- invariants at init (BASELINES.md "Invariants") --------------------------------------------
@pytest.mark.parametrize("name", ["shc", "dhc"])
def test_hyper_connections_at_init_are_prenorm(name):
    L = 3
    e, ups = inputs(L)
    reads, out = drive(build_router(name, D, L).double(), e, ups)
    pre_reads, pre_out = prenorm(e, ups)
    assert_same(reads, pre_reads)                                     # bitwise
    torch.testing.assert_close(out, 4 * pre_out, rtol=1e-15, atol=0)
    _, mean_out = drive(build_router(name, D, L, readout="mean").double(), e, ups)
    torch.testing.assert_close(mean_out, pre_out, rtol=1e-15, atol=0)


def test_hyper_connections_logits_differ_from_prenorm_only_through_the_final_norms_eps():
    cfg = DecoderConfig(vocab_size=32, d_model=16, n_layers=2, n_heads=2, seq_len=5, dtype="float64")
    x = torch.randint(0, 32, (2, 5))
    base = Decoder(cfg, "prenorm", init_seed=0)(x)
    mean = Decoder(cfg, "shc", {"readout": "mean"}, init_seed=0)(x)
    summed = Decoder(cfg, "shc", init_seed=0)
    torch.testing.assert_close(mean, base, rtol=1e-14, atol=1e-14)
    assert (summed(x) - base).abs().max().item() > 1e-6                # 4·h vs h under RMSNorm's ε
    summed.norm.eps = 0.0
    eps_free = Decoder(cfg, "prenorm", init_seed=0)
    eps_free.norm.eps = 0.0
    torch.testing.assert_close(summed(x), eps_free(x), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("opts", [{}, {"dilation": 2}, {"period": 2}, {"unit": "sublayer", "dilation": 3}])
def test_denseformer_at_init_is_prenorm_bitwise_also_after_the_decoders_init(opts):
    L = 4
    e, ups = inputs(L)
    reads, out = drive(build_router("denseformer", D, L, **opts).double(), e, ups)
    pre_reads, pre_out = prenorm(e, ups)
    assert_same(reads + [out], pre_reads + [pre_out])
    cfg = DecoderConfig(vocab_size=32, d_model=D, n_layers=L, n_heads=2, seq_len=5, dtype="float64")
    x = torch.randint(0, 32, (2, 5))
    assert torch.equal(Decoder(cfg, "denseformer", opts, init_seed=0)(x), Decoder(cfg, "prenorm", init_seed=0)(x))


def test_mhc_a6_values_with_zero_phi():
    r = build_router("mhc", D, 2, phi_init="zeros").double()
    for k in range(4):
        a, W, c = (t[0, 0] for t in a6(r, k))
        home = k % 4
        assert a[home].item() == pytest.approx(SIG3, abs=1e-15) and SIG3 == pytest.approx(0.952574, abs=1e-6)
        assert all(a[s].item() == pytest.approx(0.047426, abs=1e-6) for s in range(4) if s != home)
        assert a.sum().item() == pytest.approx(1.094852, abs=1e-6)
        torch.testing.assert_close(c, torch.ones(4, dtype=torch.float64), rtol=0, atol=1e-15)
        diag, off = W.diagonal(), W[~torch.eye(4, dtype=torch.bool)]
        assert diag.min().item() == pytest.approx(1 / (1 + 3 * math.exp(-6)), abs=1e-12)
        assert diag.min().item() == pytest.approx(0.992619, abs=1e-6)
        assert diag.max() - diag.min() < 1e-15 and off.max().item() == pytest.approx(0.002460, abs=1e-6)
    soft = build_router("mhc", D, 2, phi_init="zeros", sk_init="softmax_eps").double()
    assert a6(soft)[1][0, 0, 0, 0].item() == pytest.approx(0.992615, abs=1e-6)   # tells the conventions apart


def test_mhc_at_a6_reads_are_a_fixed_multiple_of_prenorms():
    """With fixed updates (as ε-free sublayer norms would give) the streams stay identical."""
    L = 3
    e, ups = inputs(L)
    reads, out = drive(build_router("mhc", D, L, phi_init="zeros").double(), e, ups)
    pre_reads, pre_out = prenorm(e, ups)
    for got, want in zip(reads, pre_reads):
        torch.testing.assert_close(got, (SIG3 + 3 * SIGM3) * want, rtol=1e-14, atol=1e-14)
    torch.testing.assert_close(out, 4 * pre_out, rtol=1e-14, atol=1e-14)


def test_mhc_xavier_phi_moves_the_start_a_little():
    L = 3
    e, ups = inputs(L, d=16)
    reads, _ = drive(build_router("mhc", 16, L).double(), e, ups)
    pre_reads, _ = prenorm(e, ups)
    dev = max(((a - (SIG3 + 3 * SIGM3) * b).norm() / b.norm()).item() for a, b in zip(reads, pre_reads))
    assert 1e-4 < dev < 5e-2


@pytest.mark.parametrize("init", ["exp", "softmax_eps"])
@pytest.mark.parametrize("last", ["col", "row"])
def test_sinkhorn_sums(init, last):
    g = torch.Generator().manual_seed(0)
    z = torch.randn(500, 4, 4, generator=g, dtype=torch.float64)
    m = sinkhorn(z, 20, init=init, last=last)
    exact, other = (-2, -1) if last == "col" else (-1, -2)
    tol = 1e-12 if init == "exp" else 1e-5                            # 1 − O(ε_sk)
    assert (m.sum(exact) - 1).abs().max().item() < tol
    spread = (m.sum(other) - 1).abs()
    print(f"sinkhorn {init}/{last}: other axis |sum−1| median {spread.median():.1e} max {spread.max():.1e}")
    assert spread.median().item() < 1e-3
    for i in range(3):                                                 # the loop reference
        torch.testing.assert_close(m[i], ref.sinkhorn(z[i], 20, init, last), rtol=1e-12, atol=1e-14)


def test_gradcheck_of_sinkhorn():
    z = torch.randn(2, 3, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: sinkhorn(t, 5), (z,))
    assert torch.autograd.gradcheck(lambda t: sinkhorn(t, 5, init="softmax_eps", last="row"), (z,))


@pytest.mark.parametrize("name,opts", [("shc", {}), ("dhc", {}), ("dhc", {"dyn_norm": "rmsnorm"}), ("mhc", {"sk_iters": 4}),
                                       ("denseformer", {"dilation": 2})])
def test_gradcheck_inputs_and_parameters(name, opts):
    """float64 gradcheck of e, the updates and every router parameter (Sinkhorn included)."""
    from harness.costs.flops import _RouterProbe
    probe = _RouterProbe(randomised(build_router(name, 4, 2, **opts).double()))
    names = [n for n, _ in probe.named_parameters()]
    g = torch.Generator().manual_seed(2)
    xs = [torch.randn(1, 2, 4, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(5)]
    ps = [p.detach().clone().requires_grad_(True) for p in probe.parameters()]

    def f(*args):
        return torch.func.functional_call(probe, dict(zip(names, args[5:])), tuple(args[:5]))
    assert torch.autograd.gradcheck(f, (*xs, *ps))
