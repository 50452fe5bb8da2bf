"""Each port bug of docs/BASELINES.md ("Port bugs to test") that changes the function, planted as a
variant of our router: the check the router passes fails on the variant."""

from __future__ import annotations

import pytest
import reference_baselines as ref
from reference_baselines import B, D, SIG3, SIGM3, T, a6, drive, inputs, prenorm, randomised
import torch

from routers import build_router
from routers.hyper import DynamicHyperConnections, StaticHyperConnections
from routers.stream import StreamState
from routers.mhc import ManifoldHyperConnections
from workloads.config import DecoderConfig
from workloads.decoder import Decoder


# --- port bugs, planted (BASELINES.md "Port bugs to test") -------------------------------------
class FieldOrderPort(ManifoldHyperConnections):
    """Columns read as [pre | res | post] (a DSv4 port) over parameters laid out [pre | post | res]."""

    def fields(self, hbar):
        n = self.n
        return hbar[..., :n], hbar[..., n + n * n:], hbar[..., n:n + n * n].unflatten(-1, (n, n))


class ZeroBiasPort(ManifoldHyperConnections):
    """b = 0 at init (Liger's default, PaddleFleet before #1849, Megatron @023f5cf)."""

    def a6_bias(self, k):
        return torch.zeros(self.n * self.n + 2 * self.n)


class PostMisplacedPort(ManifoldHyperConnections):
    """X' = H_post·(F(H_pre x) + H_res H_pre x): the residual mixes the pre-mixed read."""

    def write(self, state, role, params, update):
        coef = state.coef
        h = torch.einsum("btsd,bts->btd", state.x, coef.a)
        x = coef.c.unsqueeze(-1) * (update.unsqueeze(-2) + coef.w.sum(-1).unsqueeze(-1) * h.unsqueeze(-2))
        return StreamState(x, None if role == ("last",) else self.coefficients(x, params))


class EpsOutsidePort(ManifoldHyperConnections):
    """Claims ε inside the root and puts it outside (GLM-5-Next's ``mhc_norm_eps_inside_sqrt``)."""

    def coefficients(self, x, params):
        self.rms_eps_mode = "outside"
        try:
            return super().coefficients(x, params)
        finally:
            self.rms_eps_mode = "inside"


class RandomHomePort(StaticHyperConnections):
    """lucidrains without ``layer_index``: a random home stream per sublayer."""

    def home(self, k):
        return (7 * k + 3) % self.n


class ReExpandedPort(DynamicHyperConnections):
    """Streams summed and re-expanded at every layer: n plain residuals, not n streams."""

    def write(self, state, role, params, update):
        out = super().write(state, role, params, update)
        if out.coef is None:
            return out
        x = (out.x.sum(-2, keepdim=True) / self.n).expand_as(out.x)
        return StreamState(x, self.coefficients(x, params))


def check_a6(cls):
    r = cls(D, 2, phi_init="zeros").double()
    a, W, c = (t[0, 0] for t in a6(r, 1))
    assert a[1].item() == pytest.approx(0.952574, abs=1e-6) and c.tolist() == pytest.approx([1.0] * 4, abs=1e-12)
    assert W.diagonal().tolist() == pytest.approx([0.992619] * 4, abs=1e-6)


def check_random_parameters(cls):
    """H_res doubly stochastic and 0 < c < post_mult for random parameters, as the reference."""
    r = randomised(cls(D, 2).double(), scale=1.0)
    X = torch.randn(B, T, 4, D, dtype=torch.float64)
    a, W, c = r.coefficients(X, r.next_params(1))
    assert (W.sum(-2) - 1).abs().max() < 1e-12               # the last-normalised axis (columns)
    assert (W.sum(-1) - 1).abs().max() < 0.1                 # rows: Sinkhorn's t = 20 convergence
    assert (c > 0).all() and (c < r.post_mult).all()
    for got, want in zip((a, W, c), ref.mhc_coefficients(r, 1, X)):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


def check_invariant_3(cls):
    L = 2
    e, ups = inputs(L)
    reads, _ = drive(cls(D, L, phi_init="zeros").double(), e, ups)
    for got, want in zip(reads, prenorm(e, ups)[0]):
        torch.testing.assert_close(got, (SIG3 + 3 * SIGM3) * want, rtol=1e-14, atol=1e-14)


def check_small_norm_tokens(cls):
    """A token of RMS 1e-4: r = √(1e-8 + ε) ≈ 1.005e-3, not 1e-4 + ε."""
    r = randomised(cls(D, 2).double(), scale=1.0)
    X = 1e-4 * torch.randn(1, 2, 4, D, dtype=torch.float64)
    for got, want in zip(r.coefficients(X, r.next_params(0)), ref.mhc_coefficients(r, 0, X)):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


def check_home_streams(cls):
    r = cls(D, 3)
    for k in range(6):
        assert r.static_alpha[k, :, 0].tolist() == [1.0 if s == k % 4 else 0.0 for s in range(4)]
    m = build_router("mhc", D, 3)
    assert all(m.bias[k, :4].argmax().item() == k % 4 for k in range(6))


def check_carried_streams(cls):
    L = 3
    e, ups = inputs(L)
    r = randomised(cls(D, L).double())
    _, out = drive(r, e, ups)
    torch.testing.assert_close(out, ref.streams(r, e, ups)[1], rtol=1e-12, atol=1e-12)


def check_denseformer_identity_after_init(global_init):
    cfg = DecoderConfig(vocab_size=32, d_model=D, n_layers=3, n_heads=2, seq_len=5, dtype="float64")
    x = torch.randint(0, 32, (2, 5))
    model = Decoder(cfg, "denseformer", init_seed=0)
    if global_init:                                  # a Linear-style init over every weight
        with torch.no_grad():
            for p in model.router.parameters():
                torch.nn.init.normal_(p, std=0.02, generator=torch.Generator().manual_seed(0))
    assert torch.equal(model(x), Decoder(cfg, "prenorm", init_seed=0)(x))


PLANTED = [(check_a6, FieldOrderPort), (check_a6, ZeroBiasPort), (check_invariant_3, PostMisplacedPort),
           (check_small_norm_tokens, EpsOutsidePort), (check_home_streams, RandomHomePort),
           (check_carried_streams, ReExpandedPort)]
REAL = {FieldOrderPort: ManifoldHyperConnections, ZeroBiasPort: ManifoldHyperConnections,
        PostMisplacedPort: ManifoldHyperConnections, EpsOutsidePort: ManifoldHyperConnections,
        RandomHomePort: StaticHyperConnections, ReExpandedPort: DynamicHyperConnections}


@pytest.mark.parametrize("check,port", PLANTED, ids=lambda v: v.__name__)
def test_each_port_bug_fails_the_test_the_router_passes(check, port):
    check(REAL[port])
    with pytest.raises(AssertionError):
        check(port)


def test_zero_bias_gives_the_uniform_values():
    a, W, c = (t[0, 0] for t in a6(ZeroBiasPort(D, 2, phi_init="zeros").double()))
    assert a.tolist() == pytest.approx([0.5] * 4) and W.flatten().tolist() == pytest.approx([0.25] * 16)


def test_random_parameters_give_a_doubly_stochastic_h_res():
    check_random_parameters(ManifoldHyperConnections)


def test_a_global_init_over_denseformers_weights_breaks_the_identity():
    check_denseformer_identity_after_init(False)
    with pytest.raises(AssertionError):
        check_denseformer_identity_after_init(True)
