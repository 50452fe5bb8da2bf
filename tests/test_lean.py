"""The ``lean`` impl (routers/block/lean.py): its gradients equal naive's in float64, its Functions pass
gradcheck, they keep every tensor through ``ctx.save_for_backward``, its saved activations are
the count its design states, and the recompute of its backward is a FLOP row of its own."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from harness.costs.memory import model_tensors, saved_activation_bytes
from harness.rundir.writer import MemoryWriter
from harness.sweep.cases import Case
from harness.sweep.counts import measure_recompute
from routers import build_router, route
from routers.block import lean
from routers.block.plan import coefficient_bits
from workloads.config import DecoderConfig
from workloads.decoder import Decoder

F64 = torch.float64
DETAILS = {"block_attnres": 0, "haares": 1, "wav_v1": 2}


# --- the float64 gradient equality (item 5) ----------------------------------------------------
def tanh_sublayers(weights, us: list):
    """``(slot, h) -> u``: the nonlinear sublayer u = tanh(h W_k) of slot k (as the parity check
    runs it), each u retained for its gradient and appended to ``us``."""
    def sublayer(slot, h):
        u = torch.tanh(h @ weights[slot.index])
        u.retain_grad()
        us.append(u)
        return u
    return sublayer


def _contract(router, e, weights):
    """The router contract with :func:`tanh_sublayers`: the output and every sublayer output."""
    us = []
    return route(router, e, tanh_sublayers(weights, us))[1], us


def _grads(name: str, impl: str, **opts) -> dict[str, torch.Tensor]:
    """Output and the gradients of the embedding, every sublayer output and every router
    parameter (pseudo-queries, key gains, detail biases), 4 layers in 2 blocks, float64."""
    d, B, T = 16, 2, 5
    r = build_router(name, d, 4, n_blocks=2, impl=impl, key_norm_gain=True, **opts).to(F64)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in r.parameters():
            p.add_(torch.randn(p.shape, generator=g, dtype=F64) * 0.5)
    e = torch.randn(B, T, d, generator=g, dtype=F64, requires_grad=True)
    weights = [torch.randn(d, d, generator=g, dtype=F64) / math.sqrt(d) for _ in r.slots]
    out, us = _contract(r, e, weights)
    (out * torch.randn(out.shape, generator=g, dtype=F64)).sum().backward()
    got = {"output": out.detach(), "embedding": e.grad}
    got.update({f"u{i}": u.grad for i, u in enumerate(us)})
    got.update({n: p.grad for n, p in r.named_parameters()})
    return got


def _worst(name: str, **opts) -> tuple[float, str]:
    """The largest norm-relative difference of lean from naive over every quantity."""
    ref, got = _grads(name, "naive", **opts), _grads(name, "lean", **opts)
    errs = {k: float((got[k] - ref[k]).norm() / ref[k].norm()) for k in ref}
    worst = max(errs, key=errs.get)
    return errs[worst], worst


@pytest.mark.parametrize("name", sorted(DETAILS))
def test_lean_gradients_equal_naive_in_float64(name):
    opts = {"readout_details": True} if DETAILS[name] else {}
    err, where = _worst(name, **opts)
    assert err < 1e-10, where
    expected = {"output", "embedding", "pseudo_query", "key_gain"} | ({"detail_bias"} if DETAILS[name] else set())
    assert expected <= set(_grads(name, "lean", **opts))


def test_a_dropped_detail_bias_gradient_fails_the_equality(monkeypatch):
    """Planted: phase 2's backward loses the detail biases' gradient (phase 1's and the readout's
    remain), which the equality above must see."""
    real = lean.Phase2._backward

    def dropped(ctx, g):
        grads = list(real(ctx, g))
        grads[9] = None if grads[9] is None else torch.zeros_like(grads[9])  # the bias (apply's 10th)
        return tuple(grads)

    monkeypatch.setattr(lean.Phase2, "_backward", staticmethod(dropped))
    err, where = _worst("haares")
    assert err > 1e-3 and where == "detail_bias"


# --- gradcheck (item 5) ---------------------------------------------------------------------------
class _Contract(nn.Module):
    """block_attnres driven by fixed sublayers, as a module whose parameters gradcheck can vary."""

    def __init__(self, router, weights):
        super().__init__()
        self.router, self.weights = router, weights

    def forward(self, e):
        return _contract(self.router, e, self.weights)[0]


def test_gradcheck_of_a_whole_lean_block_attnres():
    d = 4
    r = build_router("block_attnres", d, 2, n_blocks=2, impl="lean", key_norm_gain=True).to(F64)
    g = torch.Generator().manual_seed(2)
    weights = [torch.randn(d, d, generator=g, dtype=F64) for _ in r.slots]
    module = _Contract(r, weights)
    e = torch.randn(1, 2, d, generator=g, dtype=F64, requires_grad=True)
    pq = torch.randn(r.pseudo_query.shape, generator=g, dtype=F64, requires_grad=True)
    kg = (1 + 0.3 * torch.randn(r.key_gain.shape, generator=g, dtype=F64)).requires_grad_()

    def f(e, pq, kg):
        return torch.func.functional_call(module, {"router.pseudo_query": pq, "router.key_gain": kg}, (e,))
    assert torch.autograd.gradcheck(f, (e, pq, kg))


def _rand(*shape, g, positive=False):
    t = torch.randn(*shape, generator=g, dtype=F64)
    return (t.abs() + 0.5 if positive else t).requires_grad_()


def test_gradcheck_of_the_inverse_rms():
    g = torch.Generator().manual_seed(3)
    assert torch.autograd.gradcheck(lean.inv_rms, (_rand(2, 3, 5, g=g),))


@pytest.mark.parametrize("n,bias,masked", [(1, False, False), (3, False, False), (3, True, False), (4, True, True)])
def test_gradcheck_of_phase_1(n, bias, masked):
    """m = 3 queries over n sources (their inverse RMS independent inputs); one slot a pad of the
    layer scope's pool when ``masked``; n = 1 is block 1's alias (only μ and s). Checked: the
    outputs o and the log-sum-exp μ + log s (s alone is not a function of the inputs: μ is the
    detached max)."""
    g = torch.Generator().manual_seed(4)
    B, T, d, m = 2, 2, 4, 3
    values = [_rand(B, T, d, g=g) for _ in range(n)]
    inv = [_rand(B, T, g=g, positive=True) for _ in range(n)]
    valid = torch.tensor([True] * (n - 1) + [False]) if masked else None
    q = _rand(m, d, g=g)
    b = _rand(m, n, g=g) if bias else None

    def f(q, b, *vi):  # μ is a detached shift: what is a function of the inputs is lse = μ + log s
        *o, mx, s = lean.Phase1.apply(n, n == 1, False, None, q, b, valid, *vi)
        return (*o, mx + torch.log(s))
    assert torch.autograd.gradcheck(f, (q, b, *values, *inv))


@pytest.mark.parametrize("layer_form", [False, True])
@pytest.mark.parametrize("K", [0, 2])
def test_gradcheck_of_phase_2_with_the_gain_as_a_constant(K, layer_form):
    """A read at p = 3 (updates u_0, u_1, u_2) seeing K details; the gains c are a
    non-differentiable input; coefficients as Python constants or (layer scope) a tensor behind a
    zero pad."""
    g = torch.Generator().manual_seed(5)
    B, T, d = 2, 2, 4
    coefs = ((1, 1), (-1, 1), (1, -1))[:3]
    updates = [torch.randn(B, T, d, generator=g, dtype=F64) for _ in range(3)]
    bits = coefficient_bits(list(coefs), 2)
    P, D = lean.rebuild(updates, bits, range(K), 2)
    P, D = P.clone().requires_grad_(), [x.clone().requires_grad_() for x in D]
    o, mx = _rand(B, T, d, g=g), torch.randn(B, T, generator=g, dtype=F64)
    s, q = _rand(B, T, g=g, positive=True), _rand(d, g=g)
    bias = _rand(K, g=g) if K else None
    c = lean.gains(P, D, 4.0)
    if layer_form:
        kept = [torch.zeros_like(updates[0])] + updates
        coef_t = torch.tensor([(0, 0)] + list(coefs), dtype=F64)[:, :max(K, 1)]
        bits, extra = 0, coef_t
    else:
        kept, extra = updates, None

    def f(o, s, q, bias, P, *D):
        return lean.Phase2.apply(0, K, 2, bits, None, o, mx, s, q, bias, c, extra, P, *D, *kept)
    assert torch.autograd.gradcheck(f, (o, s, q, bias, P, *D))


# --- save_for_backward only (item 3) ---------------------------------------------------------------
def ctx_tensors(out: torch.Tensor) -> dict[str, list[str]]:
    """Per custom Function in ``out``'s graph (its class name), the ctx attributes that hold a
    tensor (directly or in a tuple or list): those bypass the saved-tensor hooks."""
    found: dict[str, list[str]] = {}
    seen, stack = {}, [out.grad_fn]  # id -> node: holding each node keeps its id from being reused
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen[id(node)] = node
        if isinstance(node, torch.autograd.function.BackwardCFunction):
            bad = [k for k, v in vars(node).items() if isinstance(v, torch.Tensor) or (
                isinstance(v, (tuple, list)) and any(isinstance(x, torch.Tensor) for x in v))]
            found.setdefault(type(node).__name__, []).extend(bad)
        stack.extend(f for f, _ in node.next_functions)
    return found


def test_every_lean_function_keeps_its_tensors_through_save_for_backward():
    r = build_router("wav_v1", 8, 4, n_blocks=2, impl="lean").double()
    e = torch.randn(2, 3, 8, dtype=F64, requires_grad=True)
    out, _ = _contract(r, e, [torch.randn(8, 8, dtype=F64) for _ in r.slots])
    found = ctx_tensors(out)
    assert set(found) == {"InvRmsBackward", "Phase1Backward", "Phase2Backward"}
    assert found == {k: [] for k in found}


def test_a_ctx_tensor_attribute_is_found():
    class Stash(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.kept = (x * 2,)
            return x * 3

        @staticmethod
        def backward(ctx, g):
            return g * 3

    out = Stash.apply(torch.ones(3, requires_grad=True))
    assert ctx_tensors(out) == {"StashBackward": ["kept"]}


# --- saved activations against the design (items 1 and 3) ----------------------------------------
def _saved(router: str, opts: dict, d: int, L: int, T: int, B: int) -> int:
    cfg = DecoderConfig(vocab_size=32, d_model=d, n_layers=L, n_heads=2, seq_len=T, batch_size=B)
    torch.manual_seed(0)
    model = Decoder(cfg, router, opts)
    x = torch.randint(0, 32, (B, T), generator=torch.Generator().manual_seed(0))
    return saved_activation_bytes(lambda: model(x), exclude=model_tensors(model))


def design_per_token(K: int, L: int, N: int, d: int) -> int:
    """Float32 elements per token lean keeps beyond prenorm, by routers/block/lean.py's design
    statement (not by its code): 2L + K(N − 1) tensors of width d, plus statistics: the inverse
    RMS of e and of every completed source, the gain of every completed detail, per phase 1
    m(n + 2) for m queries over n sources (the readout: m = 1 over e and the N summaries), per
    phase-2 read its weights and gains (2 + 2K) and its sources' dots and inverse RMS (2 + 2K)."""
    m = 2 * L // N
    sources = [1 + (b - 1) * (1 + K) for b in range(1, N + 1)]       # n of each block's phase 1
    stats = (1 + N + K * (N - 1)) + K * (N - 1) + sum(m * (n + 2) for n in sources)
    stats += N * (m - 1) * (4 + 4 * K) + (1 + N) + 2
    return (2 * L + K * (N - 1)) * d + stats


@pytest.mark.parametrize("name", sorted(DETAILS))
@pytest.mark.parametrize("n_blocks", [2, 4])
def test_saved_activations_are_the_designed_count(name, n_blocks):
    """Per token (two batch sizes apart, so parameter-sized tensors cancel), lean keeps exactly
    the design's count beyond prenorm, float32, d = 64, 4 layers; and that is under a 1.2-times
    multiple of prenorm's here where naive and two_phase are far above."""
    d, L, T = 64, 4, 8
    opts = {"impl": "lean", "n_blocks": n_blocks}

    def per_token(router, o):
        return (_saved(router, o, d, L, T, 2) - _saved(router, o, d, L, T, 1)) / (T * 4)
    extra = per_token(name, opts) - per_token("prenorm", {})
    assert extra == design_per_token(DETAILS[name], L, n_blocks, d)
    base = per_token("prenorm", {})
    assert (base + extra) / base < 1.2
    assert per_token(name, {**opts, "impl": "two_phase"}) / base > (base + extra) / base + 0.1


# --- FLOPs: counted on the naive twin, the recompute a row of its own (item 3) -------------------
def test_the_recompute_of_the_backward_is_a_flop_row():
    """block_attnres, 4 layers in 2 blocks of 4 sublayers, one token: the backward recomputes,
    per phase 1 of m queries over n sources, the logits (m·n products) and the weights
    (m·n shifts, exponentials, divisions), and per phase-2 read at position p the P it saw
    (p − 1 additions of d: none at p = 1, where P is u_0). Phases 1: block 1 over e (m = 4,
    n = 1), block 2 over e, C_1 (m = 4, n = 2), the readout over e, C_1, C_2 (m = 1, n = 3)."""
    d = 8
    cfg = DecoderConfig(vocab_size=16, d_model=d, n_layers=4, n_heads=2, seq_len=1, batch_size=1)
    case = Case("block_attnres", cfg, "fwd_bwd", impl="lean", router_options=(("n_blocks", 2),))
    torch.manual_seed(0)
    model = Decoder(cfg, "block_attnres", case.router_kwargs())
    w = MemoryWriter({"device": "cpu"})
    measure_recompute(case, model, torch.zeros(1, 1, dtype=torch.long), w)
    (row,) = [r for r in w.rows if r["metric"] == "recompute_flops_dispatch"]
    phase1 = sum(4 * m * n for m, n in ((4, 1), (4, 2), (1, 3)))
    phase2 = 2 * (0 + d + 2 * d)
    assert (row["value"], row["unit"], row["status"]) == (phase1 + phase2, "FLOP", "ok")


def test_a_recompute_backward_is_registered_on_the_two_phase_schedule_only():
    from routers import impls
    with pytest.raises(ValueError, match="backward must be autograd, or recompute on the two_phase"):
        impls.register(impls.Impl("planted", ("block_attnres",), "naive", backward="recompute"))
    assert impls.get("lean").opaque and impls.get("lean").builtin and not impls.get("two_phase").opaque


def test_under_bf16_autocast_lean_computes_what_two_phase_does_with_float32_statistics():
    """A float32 decoder under CPU bfloat16 autocast: lean's forward is two_phase's (the same ops
    under the same autocast), its statistics are float32, and every gradient is within bfloat16
    rounding of two_phase's (the backward runs under the forward's autocast state)."""
    import warnings
    cfg = DecoderConfig(vocab_size=32, d_model=32, n_layers=4, n_heads=2, seq_len=8, batch_size=2)
    x = torch.randint(0, 32, (2, 8), generator=torch.Generator().manual_seed(1))
    got, stats = {}, {}
    for impl in ("two_phase", "lean"):
        torch.manual_seed(0)
        m = Decoder(cfg, "wav_v1", {"impl": impl, "n_blocks": 2})
        with torch.no_grad():
            for p in m.router.parameters():
                p.add_(0.3 * torch.randn(p.shape, generator=torch.Generator().manual_seed(3)))
        with warnings.catch_warnings(), torch.autocast("cpu", dtype=torch.bfloat16):
            warnings.simplefilter("ignore")  # RMSNorm's float32 weight meets a bf16 input
            out = m(x)
            stats[impl] = m.router.init_state(m.embed(x)).block_sum.dtype
        out.float().square().sum().backward()
        got[impl] = (out.detach().float(), {n: p.grad for n, p in m.named_parameters()})
    (o_tp, g_tp), (o_lean, g_lean) = got["two_phase"], got["lean"]
    assert stats == {"two_phase": torch.float32, "lean": torch.float32}
    assert float((o_lean - o_tp).norm() / o_tp.norm()) < 1e-2
    assert max(float((g_lean[k] - g_tp[k]).norm() / g_tp[k].norm()) for k in g_tp if g_tp[k].norm() > 0) < 5e-2
