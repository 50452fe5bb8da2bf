"""Per-router cost models (``analytic_fwd_flops``, ``live_state_bytes``, ``ideal_io_per_token``)
against fvcore, the router's real state, the AttnRes paper's Table 1, and measured traffic
(``harness/costs/traffic.py``)."""

from __future__ import annotations

import pytest
import torch

from harness.costs.flops import count_fwd_flops, count_router_fma
from harness.costs.traffic import measured_bytes, router_bytes_moved, tensor_bytes
from flop_goldens import GOLDEN
from routers import ROUTERS, build_router
from routers.api import declares, not_declared
from workloads.config import DecoderConfig
from workloads.decoder import Decoder

D = 8
DETAIL = ("haares", "wav_v1")

# (router, L, options): every registered router, blocks dividing and not dividing L, sublayer
# blocks, key gain, and each partial_details / readout_details value of the detail routers.
FLOP_CASES = [(n, L, {}) for n in sorted(ROUTERS) for L in (2, 3)] + [
    ("block_attnres", 5, {"n_blocks": 2}),
    ("block_attnres", 4, {"n_blocks": 3, "key_norm_gain": True}),
    ("block_attnres", 2, {"n_blocks": 3, "block_unit": "sublayer"}),
    ("full_attnres", 3, {"key_norm_gain": True}),
    ("shc", 2, {"n": 3, "readout": "mean"}),
    ("dhc", 2, {"tanh": False}), ("dhc", 3, {"dyn_norm": "rmsnorm", "n": 2}),
    ("mhc", 2, {"sk_init": "softmax_eps", "sk_iters": 10, "res_apply": "HT", "post_mult": 1.0, "pre_eps": 1e-6}),
    ("mhc", 2, {"sk_last": "row", "rms_eps_mode": "outside", "n": 3, "readout": "mean"}),
    ("denseformer", 4, {"dilation": 2}),            # m = 1 at the first unit: a plain product
    ("denseformer", 3, {"period": 2, "unit": "sublayer", "dilation": 3}),
] + [
    (n, L, {"n_blocks": nb, "block_unit": unit, "partial_details": pd, "readout_details": rd,
            "key_norm_gain": kg})
    for n in DETAIL
    for (L, nb, unit), pd, rd, kg in [
        ((5, 2, "layer"), "always", False, False),       # 2 + 3 layers: remainder to the last block
        ((5, 2, "layer"), "informative", False, True),
        ((5, 2, "layer"), "never", False, False),
        ((5, 2, "layer"), "informative", True, False),
        ((4, 2, "layer"), "always", True, True),
        ((4, 4, "layer"), "informative", False, False),   # one layer per block (m = 2)
        ((3, 3, "sublayer"), "always", False, False),
        ((4, 3, "layer"), "never", True, False),
    ]]


def _id(case):
    name, L, opts = case
    return f"{name}-L{L}-" + "-".join(f"{k}={v}" for k, v in opts.items())


@pytest.mark.parametrize("case", FLOP_CASES, ids=_id)
def test_analytic_flops_equal_fvcore_probe(case):
    name, L, opts = case
    router = build_router(name, D, L, **opts)
    assert router.analytic_fwd_flops(2, 3) == 2 * count_router_fma(router, 2, 3) > 0


@pytest.mark.parametrize("name,opts", [(n, {}) for n in sorted(ROUTERS)] + [
    ("wav_v1", {"partial_details": "informative", "n_blocks": 2}),
    ("haares", {"readout_details": True, "key_norm_gain": True}),
])
def test_analytic_flops_equal_decoder_router_fma(name, opts):
    cfg = DecoderConfig(vocab_size=16, d_model=D, n_layers=3, n_heads=2, seq_len=3, batch_size=2)
    model = Decoder(cfg, name, opts)
    if not declares(model.router, "analytic_fwd_flops"):  # nothing to compare the count with
        pytest.skip(not_declared("analytic_fwd_flops", name))
    c = count_fwd_flops(model, (torch.randint(0, 16, (2, 3)),))
    assert model.router.analytic_fwd_flops(2, 3) == 2 * c.router_fma


def test_analytic_flops_hand_goldens():
    # tests/flop_goldens.py: L = 2, d = 8, B = 1, T = 2, derived there by hand
    assert set(GOLDEN) == set(ROUTERS), "add a hand-derived golden for the new router (tests/flop_goldens.py)"
    assert GOLDEN["full_attnres"] == 2 * (2 + 3 + 4 + 5) * (7 * D + 7)
    for name, flop in GOLDEN.items():
        assert build_router(name, D, 2).analytic_fwd_flops(1, 2) == flop, name


# --- live state ------------------------------------------------------------------------------
def state_bytes(state, params: frozenset = frozenset()) -> int:
    """Bytes of the distinct storages reachable from a router state (tuples, NamedTuples), less the
    storages of ``params`` (views of the router's parameters in the state are no state of its own)."""
    storages = {}

    def walk(x):
        if isinstance(x, torch.Tensor):
            s = x.untyped_storage()
            if s.data_ptr() not in params:
                storages[s.data_ptr()] = s.nbytes()
        elif isinstance(x, (tuple, list)):
            for y in x:
                walk(y)
        else:
            assert x is None, type(x)

    walk(state)
    return sum(storages.values())


def measured_peak_state(router, B, T, dtype):
    g = torch.Generator().manual_seed(0)
    shape = (B, T, router.d_model)
    state = router.init_state(torch.randn(shape, generator=g, dtype=dtype))
    params = frozenset(p.untyped_storage().data_ptr() for p in router.parameters())
    peak = state_bytes(state, params)
    with torch.no_grad():
        for slot in router.slots:
            role, p = router.role(slot), router.params(state, slot)
            router.read(state, role, p)
            state = router.write(state, role, p, torch.randn(shape, generator=g, dtype=dtype))
            peak = max(peak, state_bytes(state, params))
    return peak


STATE_CASES = [(n, L, {}) for n in sorted(ROUTERS) for L in (2, 5)] + [
    ("block_attnres", 5, {"n_blocks": 3}),
    ("block_attnres", 2, {"n_blocks": 3, "block_unit": "sublayer"}),
    ("shc", 2, {"n": 3}), ("mhc", 2, {"res_apply": "HT"}),
    ("denseformer", 5, {"period": 2}), ("denseformer", 4, {"dilation": 2, "unit": "sublayer"}),
] + [(n, 5, {"n_blocks": 2, "partial_details": pd, "readout_details": rd})
     for n in DETAIL for pd, rd in [("always", False), ("never", True), ("informative", False)]] + [
    (n, 4, {"n_blocks": 4, "readout_details": True}) for n in DETAIL]


@pytest.mark.parametrize("case,impl", [(c, i) for c in STATE_CASES for i in ROUTERS[c[0]].impls],
                         ids=lambda v: _id(v) if isinstance(v, tuple) else v)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_live_state_bytes_equal_measured_state(case, impl, dtype):
    # bfloat16: the two-phase statistics stay float32 (2 × 4 bytes per query and token)
    name, L, opts = case
    router = build_router(name, D, L, **opts, **({"impl": impl} if impl != "naive" else {}))
    router = router.to(dtype)
    B, T = 2, 3
    assert router.live_state_bytes(B, T, dtype) == measured_peak_state(router, B, T, dtype)
    assert router.live_state_bytes(B, T, dtype, impl=impl) == router.live_state_bytes(B, T, dtype)


def test_live_state_bytes_by_hand():
    B, T, item = 2, 3, 4
    unit = B * T * D * item                          # one (B, T, d) float32 tensor
    assert build_router("prenorm", D, 4).live_state_bytes(B, T) == unit
    # block_attnres L=4, N=4 blocks of m=2: peak after a block completes: e + C_1..C_4, or
    # within the last block e + C_1..C_3 + P: 5 tensors either way
    assert build_router("block_attnres", D, 4).live_state_bytes(B, T) == 5 * unit
    # full_attnres: e + u_0 … u_{2L-1} at the end
    assert build_router("full_attnres", D, 3).live_state_bytes(B, T) == 7 * unit
    # wav_v1, L=4, N=2 blocks of m=4, K=2: within block 2 after p >= 1: e, C_1, D̃_1 ×2, P, D ×2
    assert build_router("wav_v1", D, 4, n_blocks=2).live_state_bytes(B, T) == 7 * unit
    # two_phase block_attnres L=4 N=2 (m=4): in block 2: e, C_1 (2), P (1), phase-1 outputs
    # (4); float32 (B, T) statistics: the inverse RMS of e and C_1 (2) and 2·4 max/sum
    r = build_router("block_attnres", D, 4, n_blocks=2)
    assert r.live_state_bytes(B, T, impl="two_phase") == 7 * unit + (2 + 2 * 4) * B * T * 4
    assert r.live_state_bytes(B, T) == 3 * unit                     # naive: e, C_1, P
    with pytest.raises(ValueError, match="impl"):
        r.live_state_bytes(B, T, impl="fla")  # a peer: costs as its schedule, not by name
    with pytest.raises(ValueError, match="impl"):
        build_router("prenorm", D, 4).live_state_bytes(B, T, impl="two_phase")


# --- ideal I/O model -------------------------------------------------------------------------
def test_ideal_io_attnres_table_1():
    # 128 sublayers = 64 layers, N = 8 blocks of S = 16 sublayers, two-phase chunks S = 16
    L = 64
    expect = {"prenorm": 3, "rezero": 3, "layerscale": 3, "block_attnres": 5.5, "full_attnres": 24,
              # detail routers: (1+K)·N/S + 3 + 2(1+K)
              "haares": 2 * 0.5 + 3 + 4, "wav_v1": 3 * 0.5 + 3 + 6,
              # n = 4 streams: read n+1, write 2n+1; DWA: 3 + Σ m_i / 2L = (L + 15)/4
              "shc": 14, "dhc": 14, "mhc": 14, "denseformer": (L + 15) / 4}
    assert set(expect) == set(ROUTERS), "add the new router's ideal I/O per token by hand"
    blocks = {"block_attnres": 8, "haares": 8, "wav_v1": 8}
    for name, io in expect.items():
        opts = {"n_blocks": blocks[name]} if name in blocks else {}
        assert build_router(name, D, L, **opts).ideal_io_per_token() == io, name
    full = build_router("full_attnres", D, L)
    assert full.ideal_io_per_token(16) == full.ideal_io_per_token() == 24
    assert (expect["haares"], expect["wav_v1"]) == (8, 10.5)


def test_ideal_io_schedules():
    full = build_router("full_attnres", D, 3)                       # 2L = 6: default S = 6
    assert full.ideal_io_per_token() == 6 + 1 and full.ideal_io_per_token(2) == 2 + 3
    with pytest.raises(ValueError, match="schedule"):
        full.ideal_io_per_token(4)
    with pytest.raises(ValueError, match="schedule"):
        build_router("block_attnres", D, 4).ideal_io_per_token(16)
    with pytest.raises(ValueError, match="schedule"):
        build_router("prenorm", D, 4).ideal_io_per_token(16)
    # N blocks not dividing: the pool bound (1+K)·N per block averaged over 2L sublayers
    assert build_router("block_attnres", D, 5, n_blocks=2).ideal_io_per_token() == 4 / 10 + 5


# --- measured traffic ------------------------------------------------------------------------
def test_measured_bytes_hand_cases():
    a, b = torch.randn(4, 8), torch.randn(4, 8)
    m = measured_bytes(torch.add, a, b)
    assert (m["read"], m["written"], m["total"]) == (2 * 128, 128, 3 * 128)
    assert measured_bytes(lambda x: x.view(32), a)["total"] == 0
    assert measured_bytes(lambda x: x.t().unsqueeze(0).expand(3, 8, 4), a)["total"] == 0
    assert measured_bytes(lambda x: x.add_(1.0), a.clone())["total"] == 2 * 128   # read + write self
    out = torch.empty(4, 8)
    assert measured_bytes(lambda: torch.add(a, b, out=out))["total"] == 3 * 128
    assert measured_bytes(lambda: out.copy_(a))["total"] == 2 * 128                # self not read
    # a broadcast source is read once: expand (free) then add with a scalar
    assert measured_bytes(lambda: a.expand(3, 4, 8) + 1)["total"] == 128 + 3 * 128
    assert measured_bytes(lambda: torch.stack((a, b)))["total"] == 4 * 128
    assert tensor_bytes(torch.zeros(()).double()) == 8


def test_prenorm_measured_traffic_is_three():
    # per sublayer one add: read h, read u, write h; init, reads and readout run no op (0)
    for dtype in (torch.float32, torch.float64):
        assert router_bytes_moved(build_router("prenorm", 16, 3), 2, 5, dtype) == 3.0
    r, h = build_router("prenorm", 16, 3), torch.randn(2, 5, 16)
    assert measured_bytes(r.output, h)["total"] == 0                # h_out is h_2L itself
    assert measured_bytes(r.read, h, (), ())["total"] == 0
    assert measured_bytes(r.write, h, (), (), h)["n_ops"] == 1     # the add alone
    # rezero: α_k·u (read α 1 element + u, write) + add (3): 5 + 1/(B·T·d) per token and sublayer
    assert router_bytes_moved(build_router("rezero", 16, 3), 2, 5) == 5 + 1 / (2 * 5 * 16)
    # layerscale: γ_k (d elements) ⊙ u + add: 5 + 1/(B·T)
    assert router_bytes_moved(build_router("layerscale", 16, 3), 2, 5) == 5 + 1 / (2 * 5)


@pytest.mark.parametrize("name,impl", [(n, i) for n in ("block_attnres", "full_attnres", *DETAIL)
                                       for i in ROUTERS[n].impls])
def test_block_routers_measured_traffic_at_least_ideal(name, impl):
    router = build_router(name, 16, 4, impl=impl)
    measured = router_bytes_moved(router, 2, 3)
    assert measured >= router.ideal_io_per_token()


def test_every_router_has_cost_models():
    for name in ROUTERS:
        r = build_router(name, D, 2)
        assert r.analytic_fwd_flops(1, 1) > 0
        assert r.live_state_bytes(1, 1) >= D * 4
        assert r.ideal_io_per_token() >= 3
