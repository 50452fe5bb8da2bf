"""Tests for harness/costs/flop_counter.py, the FlopCounterMode path (docs/FLOPS.md, "Second path").
Golden numbers in FLOP, derived by hand from the tables of docs/FLOPS.md."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from harness.costs.flop_counter import FORMULAS, FREE_OPS, UnsupportedOpError, count_flops_dispatch
from harness.costs.flops import count_fwd_flops
from routers import ROUTERS, impls, router_options
from workloads.config import DecoderConfig
from workloads.decoder import Decoder

# the tiny decoder of tests/test_flops.py: vocab 16, d 8, L 1, 2 heads (hs 4), T 4, B 1
V, D, H, HS, T, B = 16, 8, 2, 4, 4, 1
M = B * T
SCORES = B * H * T * T                        # dense causal score matrix: 32
LINEAR = 2 * M * D * (3 * D + D + 12 * D + V)  # qkv, proj, gate/up/down, LM head: 9216
SDPA_CONTRACTION = 2 * 2 * SCORES * HS        # QKᵀ + AV: 512


def tiny(router="prenorm", **kw):
    cfg = DecoderConfig(vocab_size=V, d_model=D, n_layers=1, n_heads=H, seq_len=T, batch_size=B, **kw)
    torch.manual_seed(0)
    return Decoder(cfg, router), torch.randint(0, V, (B, T))


def test_tiny_prenorm_forward_and_backward_golden():
    model, idx = tiny()
    c = count_flops_dispatch(model, (idx,), backward=True)
    assert c["fwd_flops"] == 11224            # the hand-derived golden of tests/test_flops.py
    assert c["router_fwd_flops"] == 2 * M * D  # two residual adds
    assert c["fwd_matmul_flops"] == LINEAR + SDPA_CONTRACTION == 9728
    assert c["fwd_by_op"]["_scaled_dot_product_flash_attention_for_cpu"] == (
        SDPA_CONTRACTION + 6 * SCORES)        # scale 1 + softmax 5 per score, not halved
    # backward: every linear is two products (input and weight gradient), SDPA four
    assert c["bwd_by_op"]["mm"] == 2 * LINEAR
    assert c["bwd_by_op"]["_scaled_dot_product_flash_attention_for_cpu_backward"] == (
        2 * SDPA_CONTRACTION + 5 * SCORES)    # softmax backward 4 + scale 1 per score
    assert c["bwd_by_op"]["embedding_dense_backward"] == M * D   # scatter-add of the gradient
    assert c["bwd_matmul_flops"] == 2 * c["fwd_matmul_flops"]
    assert c["total_flops"] == c["fwd_flops"] + c["bwd_flops"] == 11224 + 22468


def test_rms_norm_parts_sum_to_table():
    x = torch.randn(3, D)
    gain = count_flops_dispatch(nn.RMSNorm(D), (x,))
    assert gain["fwd_flops"] == 3 * (4 * D + 2)   # pow d, mean d, +ε 1, rsqrt 1, scale d, gain d
    assert set(gain["fwd_by_op"]) == {"pow", "mean", "add_", "rsqrt", "mul"}
    bare = count_flops_dispatch(_Fn(lambda t: F.rms_norm(t, (D,))), (x,))
    assert bare["fwd_flops"] == 3 * (3 * D + 2)


class _Fn(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


class _SiluLinear(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(3, 5))

    def forward(self, x):
        return F.silu(x @ self.w)


def test_backward_rules_small():
    c = count_flops_dispatch(_SiluLinear(), (torch.randn(4, 3),), backward=True)
    assert c["fwd_flops"] == 2 * 4 * 3 * 5 + 4 * 4 * 5          # mm + silu 4 per element
    # x needs no gradient: one product (weight gradient) + silu backward, 9 per element
    assert c["bwd_flops"] == 2 * 4 * 3 * 5 + 9 * 4 * 5
    assert c["bwd_matmul_flops"] == c["fwd_matmul_flops"] == 120


def test_sdpa_float_mask_and_backward():
    q, k, v = (torch.randn(1, 2, n, 8, requires_grad=True) for n in (4, 6, 6))
    mask = torch.randn(4, 6)
    c = count_flops_dispatch(_Fn(F.scaled_dot_product_attention), (q, k, v, mask),
                             backward=True)
    scores = 2 * 4 * 6
    assert c["fwd_flops"] == 4 * scores * 8 + 7 * scores            # + 1 per score: float mask
    assert c["bwd_flops"] == 8 * scores * 8 + 5 * scores


def eager_minus_trace(router, batch_size, seq_len):
    """FLOP the eager run counts beyond 2 × fvcore's FMA (docs/FLOPS.md, "Relation to fvcore"):
    dead detail writes the trace drops."""
    d, tokens = router.d_model, batch_size * seq_len
    dead = 0
    if getattr(router, "detail_kinds", ()):
        for slot in router.slots:
            for j, coef in enumerate(router._coefficients(slot)):
                is_op = slot.pos >= 1 or coef < 0           # P = u and +u are no op
                dead += d * tokens * (is_op and not router._detail_write_live(slot, j))
    return dead


#: lean's Functions are opaque to fvcore (tests/test_flops.py): its FLOPs are its naive twin's.
CASES = [(n, impl, wl, mlp, kg) for n in sorted(ROUTERS) for impl in ROUTERS[n].impls
         for wl, mlp in (("decoder", "swiglu"), ("decoder", "gelu"), ("router_only", "swiglu"))
         for kg in (False, True) if (not kg or "key_norm_gain" in router_options(n)) and not impls.get(impl).opaque]


@pytest.mark.parametrize("name,impl,workload,mlp,gain", CASES)
def test_forward_equals_fvcore(name, impl, workload, mlp, gain):
    cfg = DecoderConfig(vocab_size=V, d_model=D, n_layers=2, n_heads=H, seq_len=3, batch_size=2,
                        mlp=mlp, workload=workload)
    opts = {"key_norm_gain": True} if gain else {}
    if "impl" in router_options(name):
        opts["impl"] = impl
    torch.manual_seed(0)
    model = Decoder(cfg, name, opts)
    idx = torch.randint(0, V, (2, 3))
    with torch.no_grad():
        c = count_flops_dispatch(model, (idx,))
    f = count_fwd_flops(model, (idx,))
    extra = eager_minus_trace(model.router, 2, 3)
    assert c["fwd_flops"] == 2 * f.total_fma + extra
    assert c["router_fwd_flops"] == 2 * f.router_fma + extra
    assert c["unsupported"] == {}
    if (name, impl) in (("prenorm", "naive"), ("block_attnres", "naive"), ("full_attnres", "naive")):
        assert extra == 0


def test_relation_terms_are_not_vacuous():
    for name, impl, expected in (("haares", "naive", 1), ("wav_v1", "naive", 2),
                                 ("block_attnres", "two_phase", 0), ("wav_v1", "two_phase", 2)):
        cfg = DecoderConfig(vocab_size=V, d_model=D, n_layers=2, n_heads=H, seq_len=3, batch_size=2)
        model = Decoder(cfg, name, {"impl": impl})
        assert eager_minus_trace(model.router, 2, 3) == expected * D * 2 * 3


@pytest.mark.parametrize("name", ["prenorm", "rezero", "layerscale"])
def test_backward_matmul_twice_forward(name):
    model, idx = tiny(name)
    c = count_flops_dispatch(model, (idx,), backward=True)
    assert c["bwd_matmul_flops"] == 2 * c["fwd_matmul_flops"] > 0
    assert c["bwd_flops"] > c["fwd_flops"]


def test_backward_every_router_and_impl_has_rules():
    for name in sorted(ROUTERS):
        for impl in ROUTERS[name].impls:
            cfg = DecoderConfig(vocab_size=V, d_model=D, n_layers=2, n_heads=H, seq_len=3, batch_size=1)
            model = Decoder(cfg, name, {"impl": impl} if "impl" in router_options(name) else {})
            c = count_flops_dispatch(model, (torch.randint(0, V, (1, 3)),), backward=True)
            assert c["bwd_flops"] > c["fwd_flops"] > 0 and c["unsupported"] == {}


def test_inference_mode_and_no_grad():
    model, idx = tiny("haares")
    with torch.no_grad():
        expected = count_flops_dispatch(model, (idx,))["fwd_flops"]
    with torch.inference_mode():                  # pytorch/pytorch#126268: it is left inside
        assert count_flops_dispatch(model, (idx,))["fwd_flops"] == expected
        frozen = torch.randint(0, V, (B, T))      # an inference tensor
        assert count_flops_dispatch(model, (frozen,))["fwd_flops"] == expected
    assert count_flops_dispatch(model, (idx,))["fwd_flops"] == expected > 0


def test_state_restored():
    model, idx = tiny("wav_v1")
    model.train()
    count_flops_dispatch(model, (idx,), backward=True)
    assert model.training
    assert all(p.grad is None for p in model.parameters())


class _Unsupported(nn.Module):
    def forward(self, x):
        return torch.cumsum(x, 0)


def test_unsupported_op_raises_or_reports():
    assert torch.ops.aten.cumsum not in FORMULAS and torch.ops.aten.cumsum not in FREE_OPS
    with pytest.raises(UnsupportedOpError, match="cumsum"):
        count_flops_dispatch(_Unsupported(), (torch.ones(4),))
    c = count_flops_dispatch(_Unsupported(), (torch.ones(4),), strict=False)
    assert c["unsupported"] == {"cumsum": 1}


def test_formulas_and_free_ops_disjoint():
    assert not set(FORMULAS) & FREE_OPS


def test_cuda_kernel_rules_called_directly():
    """Kernels this CPU never runs (docs/FLOPS.md tables), on meta tensors: B 2, H 3, T 4, S 5."""
    aten = torch.ops.aten
    q, k, v = (torch.empty(2, 3, n, 8, device="meta") for n in (4, 5, 5))
    out = torch.empty(2, 3, 4, 8, device="meta")
    scores, contraction = 2 * 3 * 4 * 5, 4 * 2 * 3 * 4 * 5 * 8
    flash = FORMULAS[aten._scaled_dot_product_flash_attention](q, k, v, 0.0, True, False,
                                                              out_val=(out,))
    assert flash == contraction + 6 * scores
    bias = torch.empty(2, 3, 4, 5, device="meta")
    for op in (aten._scaled_dot_product_efficient_attention, aten._scaled_dot_product_cudnn_attention):
        assert FORMULAS[op](q, k, v, bias, False, out_val=(out,)) == contraction + 7 * scores
        assert FORMULAS[op](q, k, v, None, False, out_val=(out,)) == contraction + 6 * scores
    bwd = FORMULAS[aten._scaled_dot_product_flash_attention_backward](out, q, k, v, out_val=(q,))
    assert bwd == 2 * contraction + 5 * scores
    x, w = torch.empty(6, D, device="meta"), torch.empty(D, device="meta")
    rms = FORMULAS[aten._fused_rms_norm]
    assert rms(x, [D], w, 1e-6, out_val=(x,)) == 6 * (4 * D + 2)
    assert rms(x, [D], None, 1e-6, out_val=(x,)) == 6 * (3 * D + 2)
    rms_bwd = FORMULAS[aten._fused_rms_norm_backward]
    assert rms_bwd(x, x, [D], x, w, [True, True], out_val=(x, w)) == 6 * ((6 * D + 4) + 3 * D)
    assert rms_bwd(x, x, [D], x, None, [True, False], out_val=(x, None)) == 6 * (5 * D + 4)
    assert FORMULAS[aten.addmm](torch.empty(3, device="meta"), torch.empty(2, 4, device="meta"),
                                torch.empty(4, 3, device="meta"),
                                out_val=torch.empty(2, 3, device="meta")) == 2 * 2 * 4 * 3 + 2 * 3
