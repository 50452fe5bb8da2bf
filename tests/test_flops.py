"""Tests for harness/costs/flops.py. Golden numbers are derived by hand from docs/FLOPS.md, in FLOP
(= 2·FMA), written out as arithmetic: a change of convention or of the models moves them."""
import itertools

import pytest
import torch
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from harness.costs.flops import HANDLES, UnsupportedOpError, count_fwd_flops, count_router_fma
from routers import ROUTERS, build_router, impls, router_options
from workloads.config import DecoderConfig
from workloads.decoder import Decoder

# the tiny decoder: vocab 16, d 8, L 1, 2 heads (hs 4), T 4, B 1 → M = 4 tokens
V, D, H, HS, T, B = 16, 8, 2, 4, 4, 1
M = B * T
SCORES = B * H * T * T                        # dense causal score matrix: 32


def tiny(router="prenorm", **kw):
    cfg = DecoderConfig(vocab_size=V, d_model=D, n_layers=1, n_heads=H, seq_len=T, batch_size=B, **kw)
    torch.manual_seed(0)
    return Decoder(cfg, router), torch.randint(0, V, (B, T))


def test_tiny_prenorm_swiglu_golden():
    flop = (0                                 # embedding lookup
            + M * (4 * D + 2)                 # attention RMSNorm with gain: 4 tokens × 34
            + 2 * M * 3 * D * D               # qkv linear
            + 2 * 6 * (B * H * T * HS // 2)   # rotary on q and k: 6 ops on half the channels
            + 2 * SCORES * HS                 # SDPA QKᵀ
            + 2 * SCORES * HS                 # SDPA AV
            + SCORES * (1 + 5)                # SDPA scale + softmax, not halved for causal
            + 2 * M * D * D                   # proj
            + M * D                           # residual add (router)
            + M * (4 * D + 2)                 # MLP RMSNorm
            + 2 * M * D * 4 * D               # gate
            + 2 * M * D * 4 * D               # up
            + 4 * M * 4 * D                   # silu
            + M * 4 * D                       # silu(gate) ⊙ up
            + 2 * M * 4 * D * D               # down
            + M * D                           # residual add (router)
            + M * (4 * D + 2)                 # final RMSNorm
            + 2 * M * D * V)                  # LM head
    assert flop == 11224
    model, idx = tiny()
    c = count_fwd_flops(model, (idx,))
    assert c.flops == flop and c.total_fma == flop / 2
    assert c.unsupported == {}
    assert c.router_fma * 2 == 2 * M * D
    assert c.by_operator["linear"] * 2 == 2 * M * D * (3 * D + D + 12 * D + V)
    assert c.by_module["sublayers.0.qkv"] * 2 == 2 * M * 3 * D * D
    assert c.by_module["norm"] * 2 == M * (4 * D + 2)


def test_tiny_gelu_and_router_only_golden():
    mlp_gelu = (M * (4 * D + 2)               # MLP RMSNorm
                + 2 * M * D * 4 * D           # fc
                + 5 * M * 4 * D               # gelu, erf form
                + 2 * M * 4 * D * D)          # down
    mlp_swiglu = M * (4 * D + 2) + 2 * 2 * M * D * 4 * D + 4 * M * 4 * D + M * 4 * D + 2 * M * 4 * D * D
    model, idx = tiny(mlp="gelu")
    assert count_fwd_flops(model, (idx,)).flops == 11224 - mlp_swiglu + mlp_gelu == 9176
    router_only = (2 * M * (3 * D + 2)        # two NormOnly sublayers: F.rms_norm, no gain
                   + 2 * M * D                # two residual adds
                   + M * (4 * D + 2)          # final RMSNorm
                   + 2 * M * D * V)           # LM head
    model, idx = tiny(workload="router_only")
    assert count_fwd_flops(model, (idx,)).flops == router_only == 1432


from flop_goldens import ADD, GOLDEN, RM, read  # noqa: E402 - the routers' hand-derived goldens


def small(name, **options):
    cfg = DecoderConfig(vocab_size=V, d_model=D, n_layers=2, n_heads=H, seq_len=2, batch_size=1)
    return Decoder(cfg, name, options), torch.randint(0, V, (1, 2))


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_router_mixing_golden(name):
    model, idx = small(name)
    assert 2 * count_fwd_flops(model, (idx,)).router_fma == GOLDEN[name]


def test_router_golden_values():
    assert (GOLDEN["block_attnres"], GOLDEN["haares"], GOLDEN["wav_v1"]) == (1292, 2104, 2902)
    gained = read(2, gain=True) * 2 + read(3, gain=True) * 2 + 2 * ADD
    model, idx = small("block_attnres", key_norm_gain=True)
    assert 2 * count_fwd_flops(model, (idx,)).router_fma == gained == 1292 + 10 * RM * D


def test_every_registered_router_has_golden():
    assert set(ROUTERS) <= set(GOLDEN), "add a hand-derived golden for the new router"


#: fvcore's trace sees lean's custom Functions as one opaque call each: its FLOPs are its naive
#: twin's (test_an_opaque_impl_is_refused_by_fvcore_and_its_twin_is_naive below).
CASES = [(n, wl, mlp, kg, impl) for n in sorted(ROUTERS)
         for wl, mlp, kg in itertools.product(("decoder", "router_only"), ("swiglu", "gelu"), (False, True))
         for impl in ROUTERS[n].impls
         if (not kg or "key_norm_gain" in router_options(n)) and not impls.get(impl).opaque]


@pytest.mark.parametrize("name,workload,mlp,gain,impl", CASES)
def test_no_unsupported_op(name, workload, mlp, gain, impl):
    cfg = DecoderConfig(vocab_size=V, d_model=D, n_layers=2, n_heads=H, seq_len=3, batch_size=1,
                        mlp=mlp, workload=workload)
    opts = {"key_norm_gain": True} if gain else {}
    if "impl" in router_options(name):
        opts["impl"] = impl
    model = Decoder(cfg, name, opts)
    c = count_fwd_flops(model, (torch.randint(0, V, (1, 3)),), strict=False)
    assert c.unsupported == {}
    assert c.total_fma > 0


@pytest.mark.skipif(impls.lookup("lean") is None, reason="lean is not registered (routers/block/lean.py)")
def test_an_opaque_impl_is_refused_by_fvcore_and_its_twin_is_naive():
    """fvcore records each of lean's Functions as a ``prim::PythonOp`` (0 FLOPs, were it not
    refused); the sweep counts the case on its naive twin, whose count is naive's exactly."""
    from harness.sweep.cases import Case
    from harness.sweep.prepare import naive_twin
    cfg = DecoderConfig(vocab_size=V, d_model=D, n_layers=2, n_heads=H, seq_len=3, batch_size=1)
    x = torch.randint(0, V, (1, 3))
    model = Decoder(cfg, "haares", {"impl": "lean"})
    c = count_fwd_flops(model, (x,), strict=False)
    assert set(c.unsupported) == {"prim::PythonOp.InvRms", "prim::PythonOp.Phase1", "prim::PythonOp.Phase2"}
    twin = naive_twin(Case("haares", cfg, "fwd_bwd", impl="lean"), model)
    assert twin.router.impl == "naive"
    assert count_fwd_flops(twin, (x,)).total_fma == count_fwd_flops(Decoder(cfg, "haares"), (x,)).total_fma


@pytest.mark.parametrize("name", sorted(ROUTERS))
@pytest.mark.parametrize("n_layers,seq_len", [(2, 2), (4, 3)])
def test_probe_count_equals_decoder_router_fma(name, n_layers, seq_len):
    cfg = DecoderConfig(vocab_size=V, d_model=D, n_layers=n_layers, n_heads=H, seq_len=seq_len,
                        batch_size=2)
    model = Decoder(cfg, name)
    c = count_fwd_flops(model, (torch.randint(0, V, (2, seq_len)),))
    assert count_router_fma(model.router, 2, seq_len) == c.router_fma > 0


def test_flop_counter_mode_cross_check():
    model, idx = tiny()
    c = count_fwd_flops(model, (idx,))
    sdpa_contraction_fma = 2 * B * H * T * T * HS          # QKᵀ + AV, dense: 256
    assert c.by_operator["scaled_dot_product_attention"] == sdpa_contraction_fma + 3 * SCORES
    with torch.no_grad(), FlopCounterMode(display=False) as fcm:
        model(idx)
    # torch 2.13 CPU: SDPA runs _scaled_dot_product_flash_attention_for_cpu, which has no formula
    assert fcm.get_total_flops() == 2 * c.by_operator["linear"] == 9216
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as fcm:
        model(idx)
    # the math path is two dense bmm (causal not halved)
    assert fcm.get_total_flops() == 2 * (c.by_operator["linear"] + sdpa_contraction_fma) == 9728


class _Odd(nn.Module):
    def forward(self, x, y):
        return torch.clamp(x + y, max=1.0)


def test_float_counts_and_clamp_counted():
    c = count_fwd_flops(_Odd(), (torch.ones(3), torch.ones(3)))
    assert c.total_fma == 0.5 * 3 + 0.5 * 3 == 3.0          # add 3 FLOP, clamp 3 FLOP
    c = count_fwd_flops(nn.Sequential(_Lin(), _Lin()), (torch.ones(3),))
    assert c.by_module == {"": 3.0, "0": 1.5, "1": 1.5}
    assert c.router_fma == 0.0


class _Lin(nn.Module):
    def forward(self, x):
        return x * 2.0


class _Unsupported(nn.Module):
    def forward(self, x):
        return torch.cumsum(x, 0)


def test_unsupported_op_raises_or_reports():
    assert "aten::cumsum" not in HANDLES
    with pytest.raises(UnsupportedOpError, match="aten::cumsum"):
        count_fwd_flops(_Unsupported(), (torch.ones(4),))
    c = count_fwd_flops(_Unsupported(), (torch.ones(4),), strict=False)
    assert c.unsupported == {"aten::cumsum": 1}


def test_training_flag_restored_and_router_untouched():
    model, idx = tiny("haares")
    model.train()
    count_fwd_flops(model, (idx,))
    assert model.training
    router = build_router("haares", D, 2)
    before = {k: v.clone() for k, v in router.state_dict().items()}
    count_router_fma(router, 1, 2, dtype=torch.float64)
    assert all(torch.equal(before[k], v) and v.dtype == torch.float32
               for k, v in router.state_dict().items())
