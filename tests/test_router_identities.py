"""Identities between routers, pool bookkeeping and the paper-size parameter counts."""

from __future__ import annotations

import pytest
import torch

from reference import drive
from routers import build_router
from workloads.config import preset
from workloads.decoder import Decoder, parameter_counts

B, T, D = 2, 3, 8


def run(router, e, ups):
    reads, out, state = drive(router, e, ups)
    return torch.stack(reads + [out]), state


def inputs(L, seed=0):
    g = torch.Generator().manual_seed(seed)
    e = torch.randn(B, T, D, generator=g, dtype=torch.float64)
    return e, [torch.randn(B, T, D, generator=g, dtype=torch.float64) for _ in range(2 * L)]


def randomise(router, seed=1):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in router.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype))
    return router


@pytest.mark.parametrize("impl", ["naive", "two_phase"])
def test_block_attnres_one_sublayer_per_block_is_full_attnres(impl):
    L = 3
    block = randomise(build_router("block_attnres", D, L, block_unit="sublayer", n_blocks=2 * L,
                                   key_norm_gain=True, impl=impl).double())
    full = build_router("full_attnres", D, L, key_norm_gain=True).double()
    full.load_state_dict(block.state_dict())
    e, ups = inputs(L)
    torch.testing.assert_close(run(full, e, ups)[0], run(block, e, ups)[0], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", ["haares", "wav_v1"])
@pytest.mark.parametrize("impl", ["naive", "two_phase"])
def test_detail_routers_with_details_disabled_equal_block_attnres(name, impl):
    L = 4
    block = randomise(build_router("block_attnres", D, L, n_blocks=2, impl=impl).double())
    e, ups = inputs(L, seed=2)
    expect = run(block, e, ups)[0]
    for opts in ({"detail_bias_init": float("-inf")},
                 {"detail_bias_init": float("-inf"), "readout_details": True}):
        r = build_router(name, D, L, n_blocks=2, impl=impl, **opts).double()
        with torch.no_grad():
            r.pseudo_query.copy_(block.pseudo_query)
        out = run(r, e, ups)[0]
        assert torch.isfinite(out).all()
        torch.testing.assert_close(out, expect, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name,per_block", [("block_attnres", 1), ("haares", 2), ("wav_v1", 3)])
def test_embedding_never_in_a_block_and_each_block_enters_once(name, per_block):
    L, N = 6, 3
    e, ups = inputs(L, seed=3)
    naive = build_router(name, D, L, n_blocks=N, readout_details=True) if name != "block_attnres" \
        else build_router(name, D, L, n_blocks=N)
    _, state = run(naive.double(), e, ups)
    assert len(state.pool) == N * per_block            # every block once, with its details
    for b in range(N):                                 # C_b is exactly the block's updates
        torch.testing.assert_close(state.pool[b * per_block], sum(ups[4 * b: 4 * b + 4]))
    fast = build_router(name, D, L, n_blocks=N, impl="two_phase",
                        **({"readout_details": True} if name != "block_attnres" else {})).double()
    _, st = run(fast, e, ups)
    assert len(st.values) == 1 + N * per_block and st.values[-1] is e   # newest first, e last
    for b in range(N):
        torch.testing.assert_close(st.values[(N - 1 - b) * per_block], sum(ups[4 * b: 4 * b + 4]))


def test_online_bases_equal_recomputed_from_stored_updates():
    L, N = 4, 2
    e, ups = inputs(L, seed=4)
    r = build_router("wav_v1", D, L, n_blocks=N, max_detail_scale=1e9, readout_details=True).double()
    _, state = run(r, e, ups)
    for b in range(N):
        u = ups[4 * b: 4 * b + 4]                      # attn, mlp, attn, mlp
        C, phase, split = state.pool[3 * b: 3 * b + 3]
        torch.testing.assert_close(C, u[0] + u[1] + u[2] + u[3])
        raw_phase, raw_split = u[0] - u[1] + u[2] - u[3], u[0] + u[1] - u[2] - u[3]
        rms = lambda x: x.pow(2).mean(-1, keepdim=True).sqrt()
        torch.testing.assert_close(phase, raw_phase * rms(C) / (rms(raw_phase) + 1e-6))
        torch.testing.assert_close(split, raw_split * rms(C) / (rms(raw_split) + 1e-6))


@pytest.mark.parametrize("name,matrix", [("haares-201m", 201_326_592), ("haares-453m", 452_984_832)])
def test_paper_size_parameter_counts(name, matrix):
    cfg = preset(name)
    d, L = cfg.d_model, cfg.n_layers
    with torch.device("meta"):
        counts = parameter_counts(Decoder(cfg, "haares"))
    assert counts["matrix"] == matrix == 16 * d * d * L
    assert counts["router"] == (2 * L + 1) * d + (2 * L + 1)     # pseudo-queries + split biases
    assert counts["norm"] == (2 * L + 1) * d                       # sublayer input norms + final
    assert counts["embedding"] == counts["lm_head"] == cfg.vocab_size * d
