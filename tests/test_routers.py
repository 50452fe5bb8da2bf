"""Routers against ROUTERS.md: init identities, a float64 reference loop, layouts and registry."""

from __future__ import annotations

import math

import pytest
import reference as ref
import torch

from routers import ROUTERS, block_layout, build_router, default_n_blocks, router_options
from routers.errors import ConfigError
from workloads.config import DecoderConfig
from workloads.decoder import Decoder, parameter_counts

BLOCK_ROUTERS = ("block_attnres", "full_attnres", "haares", "wav_v1")
B, T, D = 2, 3, 8


def run_router(router, e, updates):
    """Every read and h_out of a router driven with the given updates."""
    reads, out, _ = ref.drive(router, e, updates)
    return reads, out


def random_inputs(n_layers, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    e = torch.randn(B, T, D, generator=g, dtype=dtype)
    # updates of very different scales, so RMS matching and its cap both matter
    ups = [torch.randn(B, T, D, generator=g, dtype=dtype) * (0.1 + k % 3) for k in range(2 * n_layers)]
    return e, ups


@pytest.mark.parametrize("d,L", [(64, 4), (96, 3), (128, 2)])
def test_non_embedding_matrix_params_are_16_d2_L(d, L):
    for name in ROUTERS:
        counts = parameter_counts(Decoder(DecoderConfig(d_model=d, n_layers=L, n_heads=4), name))
        assert counts["matrix"] == 16 * d * d * L


def test_router_parameter_counts_by_hand():
    d, L = 64, 4
    expect = {"prenorm": 0, "rezero": 2 * L, "layerscale": 2 * L * d,
              "block_attnres": (2 * L + 1) * d, "full_attnres": (2 * L + 1) * d,
              "haares": (2 * L + 1) * d + (2 * L + 1), "wav_v1": (2 * L + 1) * d + 2 * (2 * L + 1),
              # n = 4 streams: static α (n, n+1) and β (n) per sublayer; dhc + (n+4)d + 2;
              # mhc φ (nd, n²+2n), b (n²+2n), α (3); denseformer Σ m_i = L(L+3)/2
              "shc": 2 * L * 24, "dhc": 2 * L * (24 + 8 * d + 2), "mhc": 2 * L * (4 * d * 24 + 24 + 3),
              "denseformer": L * (L + 3) // 2}
    assert set(expect) == set(ROUTERS), "add the new router's parameter count by hand"
    for name, n in expect.items():
        assert sum(p.numel() for p in build_router(name, d, L).parameters()) == n, name


@pytest.mark.parametrize("L,n", [(48, 8), (24, 8), (12, 6), (4, 4), (7, 7), (9, 3)])
def test_default_n_blocks(L, n):
    assert default_n_blocks(L) == n


def test_block_layout_remainder_goes_to_last_block():
    slots = block_layout(12, n_blocks=5)
    lens = [next(s.block_len for s in slots if s.block == b) for b in range(1, 6)]
    assert lens == [4, 4, 4, 4, 8]  # whole layers: 2,2,2,2,4 layers
    assert [s.kind for s in slots[:4]] == ["attn", "mlp", "attn", "mlp"]
    assert all(s.kind == "attn" for s in slots if s.pos == 0)  # boundaries before attention
    with pytest.raises(ConfigError, match="n_blocks"):
        block_layout(4, n_blocks=5)


@pytest.mark.parametrize("name", ["block_attnres", "full_attnres"])
def test_attnres_read_at_init_is_plain_average(name):
    L = 3
    e, ups = random_inputs(L)
    r = build_router(name, D, L).double()
    reads, out = run_router(r, e, ups)
    for k, h in enumerate(reads + [out]):
        sources = [v for v, _ in ref.pool(name, r.slots, e, ups, k)]
        torch.testing.assert_close(h, sum(sources) / len(sources), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", ["haares", "wav_v1"])
def test_detail_router_weights_at_init(name):
    """Each state source (e, C, P) gets equal weight, each detail e^-2 of it."""
    L = 4
    e, ups = random_inputs(L, seed=1)
    r = build_router(name, D, L, n_blocks=2).double()
    reads, out = run_router(r, e, ups)
    n_detail_reads = 0
    for k, h in enumerate(reads + [out]):
        src = ref.pool(name, r.slots, e, ups, k)
        if k == len(reads):  # conservative readout: e and the C sources only
            src = [s for s in src if s[1] == "state"]
        w = ref.weights_at_init(src)
        n_detail_reads += any(kind != "state" for _, kind in src)
        details = [wi for wi, (_, kind) in zip(w, src) if kind != "state"]
        states = [wi for wi, (_, kind) in zip(w, src) if kind == "state"]
        assert all(math.isclose(x, states[0]) for x in states)
        assert all(math.isclose(x, math.exp(-2) * states[0]) for x in details)
        torch.testing.assert_close(h, sum(wi * v for wi, (v, _) in zip(w, src)), rtol=1e-12, atol=1e-12)
    assert n_detail_reads >= 4  # the test saw detail sources


ROUTER_PARTIAL = [("block_attnres", "always"), ("full_attnres", "always")] + [
    (n, p) for n in ("haares", "wav_v1") for p in ("always", "informative", "never")]


@pytest.mark.parametrize("name,partial", ROUTER_PARTIAL)
@pytest.mark.parametrize("L,n_blocks", [(4, 2), (5, 2), (3, None)])
def test_matches_float64_reference_with_random_parameters(name, partial, L, n_blocks):
    opts = {}
    if name in ("haares", "wav_v1"):
        opts = {"partial_details": partial, "max_detail_scale": 1.5}
    if name != "full_attnres":
        opts["n_blocks"] = n_blocks
    r = build_router(name, D, L, **opts).double()
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in r.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype))
    e, ups = random_inputs(L, seed=3)
    reads, out = run_router(r, e, ups)
    kinds = getattr(r, "detail_kinds", ())
    for k, h in enumerate(reads + [out]):
        src = ref.pool(name, r.slots, e, ups, k, rho=1.5, partial_details=partial)
        if k == len(reads):
            src = [s for s in src if s[1] == "state"]
        bias = (lambda kind, k=k: 0.0 if kind == "state" else r.detail_bias[k, kinds.index(kind)])
        expect = ref.mix(src, r.pseudo_query[k], bias)
        torch.testing.assert_close(h, expect, rtol=1e-10, atol=1e-10, msg=f"{name} read {k}")


def test_fixed_routers_recurrences_and_init():
    L = 2
    e, ups = random_inputs(L)
    reads, out = run_router(build_router("prenorm", D, L).double(), e, ups)
    torch.testing.assert_close(out, e + sum(ups))
    torch.testing.assert_close(reads[2], e + ups[0] + ups[1])
    rz = build_router("rezero", D, L)
    assert torch.count_nonzero(rz.alpha) == 0
    for L_, g in ((12, 0.1), (18, 0.1), (24, 1e-5), (48, 1e-6)):
        assert torch.all(build_router("layerscale", D, L_).gamma == g)


def test_pseudo_queries_zero_and_detail_bias_minus_two_at_init():
    for name in BLOCK_ROUTERS:
        r = build_router(name, D, 4)
        assert torch.count_nonzero(r.pseudo_query) == 0
        if hasattr(r, "detail_bias"):
            assert torch.all(r.detail_bias == -2.0)


def test_registry_errors_name_the_option():
    with pytest.raises(ConfigError, match="--routers: unknown router 'nope'.*prenorm"):
        build_router("nope", D, 2)
    with pytest.raises(ConfigError, match="no option.*'bogus'"):
        build_router("haares", D, 2, bogus=1)
    with pytest.raises(ConfigError, match="partial_details"):
        build_router("haares", D, 2, partial_details="sometimes")
    with pytest.raises(ConfigError, match="even number"):
        build_router("haares", D, 3, block_unit="sublayer", n_blocks=2)  # 6 sublayers -> 3 + 3
    assert "max_detail_scale" in router_options("wav_v1")


def test_decoder_rejects_bad_shape_before_building():
    with pytest.raises(ConfigError, match="--d-model 100 is not divisible by --n-heads 3"):
        DecoderConfig(d_model=100, n_heads=3)
