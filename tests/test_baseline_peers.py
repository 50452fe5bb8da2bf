"""Cross-checks of the baseline routers against public implementations (docs/BASELINES.md,
"Cross-checks"): lucidrains' ``hyper-connections`` (PyPI, pure PyTorch; in the ``test`` extra) for
``shc`` / ``dhc``, and DeepSeek's TileKernels reference (``tile_kernels/torch/mhc.py``, loaded by
path: the package itself imports TileLang) for ``mhc``'s coefficients, Sinkhorn and apply. Our
parameters are copied into the peer; no port defaults to App. A.6. Each skips cleanly when its
package is not installed."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
from reference_baselines import randomised

from routers import build_router, route
from routers.stream import Coefficients, StreamState
from routers.mhc import sinkhorn

B, T, D, N = 2, 3, 8, 4
#: TileKernels 1.0.0's conventions (tile_kernels/modeling/mhc/functional.py defaults, checked)
TILEKERNELS = {"sk_init": "softmax_eps", "sk_iters": 10, "res_apply": "HT", "post_mult": 1.0, "pre_eps": 1e-6,
               "rms_eps": 1e-6, "rms_eps_mode": "inside", "sk_eps": 1e-6}


def streams_in(dtype=torch.float64, seed=0, L=2):
    g = torch.Generator().manual_seed(seed)
    e = torch.randn(B, T, D, generator=g, dtype=dtype)
    return e, [torch.randn(B, T, D, generator=g, dtype=dtype) for _ in range(2 * L)]


# --- lucidrains/hyper-connections ----------------------------------------------------------------
@pytest.mark.parametrize("name", ["shc", "dhc"])
def test_hyper_connections_equal_lucidrains(name):
    hc = pytest.importorskip("hyper_connections", reason="hyper-connections==0.4.11 (the test extra) not installed")
    L = 2
    opts = {"dyn_norm": "rmsnorm", "dyn_norm_eps": 0.0} if name == "dhc" else {}
    r = randomised(build_router(name, D, L, **opts).double())
    e, ups = streams_in(L=L)
    ours, h_out, _ = route(r, e, lambda slot, h: ups[slot.index])
    ours.append(h_out)

    residuals = e.repeat_interleave(N, dim=0)                 # '(b s) t d', the package's expand
    theirs = []
    for k in range(2 * L):
        peer = hc.HyperConnections(N, dim=D, layer_index=k, tanh=True).double()
        with torch.no_grad():
            peer.static_alpha.copy_(r.static_alpha[k])
            peer.static_beta.copy_(r.static_beta[k])
            if name == "dhc":                                  # shc: the dynamic weights stay 0
                peer.dynamic_alpha_fn.copy_(r.dynamic_alpha_fn[k])
                peer.dynamic_beta_fn.copy_(r.dynamic_beta_fn[k])
                peer.dynamic_alpha_scale.copy_(r.dynamic_alpha_scale[k])
                peer.dynamic_beta_scale.copy_(r.dynamic_beta_scale[k])
                peer.norm.gamma.copy_(r.norm_weight[k] - 1)
        branch_input, add_residual = peer(residuals)
        theirs.append(branch_input)
        residuals = add_residual(ups[k])
    theirs.append(residuals.unflatten(0, (B, N)).sum(1))       # the package's reduce: sum
    for k, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12, msg=f"read {k}")


# --- TileKernels ---------------------------------------------------------------------------------
def tilekernels_reference():
    """``tile_kernels/torch/mhc.py`` loaded by path, without importing the package (TileLang)."""
    spec = importlib.util.find_spec("tile_kernels")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("tile-kernels==1.0.0 not installed (pip install --no-deps tile-kernels==1.0.0)")
    path = Path(next(iter(spec.submodule_search_locations))) / "torch" / "mhc.py"
    mod_spec = importlib.util.spec_from_file_location("tilekernels_mhc_reference", path)
    module = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(module)
    return module


def test_sinkhorn_equals_tilekernels():
    tk = tilekernels_reference()
    z = torch.randn(64, N, N, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    torch.testing.assert_close(sinkhorn(z, 10, init="softmax_eps"), tk.sinkhorn_normalize_ref(z, 10, 1e-6),
                               rtol=1e-14, atol=1e-15)


def test_mhc_coefficients_and_apply_equal_tilekernels_under_its_conventions():
    tk = tilekernels_reference()
    r = randomised(build_router("mhc", D, 1, **TILEKERNELS), scale=1.0)         # float32, as the reference
    k = 1
    g = torch.Generator().manual_seed(3)
    X = torch.randn(B, T, N, D, generator=g)
    u = torch.randn(B, T, D, generator=g)
    a, W, c = r.coefficients(X, r.next_params(k))

    mixes = tk.mhc_pre_norm_fn_ref(X, r.phi[k].detach().T.contiguous(), None, 1e-6)       # fn = φᵀ
    pre, post, comb = tk.mhc_pre_split_mixes_ref(mixes, r.alpha[k].detach(), r.bias[k].detach(), N, 1.0, 1e-6)
    h_res = tk.sinkhorn_normalize_ref(comb, 10, 1e-6)
    torch.testing.assert_close(a, pre[..., 0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(c, post[..., 0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(W, h_res.transpose(-1, -2), rtol=1e-5, atol=1e-6)            # res_apply="HT"

    # apply: the reference returns bfloat16, so compare at its rounding
    state = StreamState(X, Coefficients(a, W, c))
    first, last = r.slots[0], r.slots[-1]
    torch.testing.assert_close(r.read(state, r.role(first), r.params(state, first)).bfloat16(),
                               tk.mhc_pre_apply_mix_ref(X, pre), rtol=1e-2, atol=1e-2)
    x_new = r.write(state, r.role(last), r.params(state, last), u).x
    torch.testing.assert_close(x_new.bfloat16(), tk.mhc_post_ref(u, X, post, h_res), rtol=1e-2, atol=2e-2)


def test_the_papers_defaults_differ_from_tilekernels():
    """The conventions are not cosmetic: under the paper's defaults the coefficients differ."""
    tk = tilekernels_reference()
    r = randomised(build_router("mhc", D, 1), scale=1.0)
    X = torch.randn(B, T, N, D, generator=torch.Generator().manual_seed(3))
    _, W, c = r.coefficients(X, r.next_params(0))
    mixes = tk.mhc_pre_norm_fn_ref(X, r.phi[0].detach().T.contiguous(), None, 1e-6)
    _, post, comb = tk.mhc_pre_split_mixes_ref(mixes, r.alpha[0].detach(), r.bias[0].detach(), N, 1.0, 1e-6)
    assert torch.allclose(c, 2 * post[..., 0], rtol=1e-5, atol=1e-6)                  # post_mult 2 vs 1
    assert not torch.allclose(W, tk.sinkhorn_normalize_ref(comb, 10, 1e-6).transpose(-1, -2), atol=1e-4)
