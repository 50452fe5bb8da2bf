"""Modes: decode against the KV cache equals the full forward; train_step trains."""

from __future__ import annotations

import pytest
import torch

from harness.step.modes import lm_loss, make_step, prefill_for_decode
from routers import ROUTERS, router_options
from workloads.config import DecoderConfig
from workloads.decoder import Decoder

CFG = DecoderConfig(vocab_size=32, d_model=16, n_layers=4, n_heads=2, seq_len=8, batch_size=2)
VARIANTS = [(n, i) for n in sorted(ROUTERS) for i in ROUTERS[n].impls]


def model_for(name, impl, cfg=CFG):
    torch.manual_seed(0)
    opts = {"impl": impl} if "impl" in router_options(name) else {}
    m = Decoder(cfg, name, opts)
    with torch.no_grad():  # non-trivial router parameters (zero pseudo-queries hide bugs)
        for n_, p in m.router.named_parameters():
            p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(1)))
    return m


@pytest.mark.parametrize("name,impl", VARIANTS)
def test_decode_logits_equal_last_position_of_full_forward(name, impl):
    m = model_for(name, impl).eval()
    x = torch.randint(0, 32, (2, 8), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        full = m(x)
    step = make_step(m, "decode", x, x, decode_input=prefill_for_decode(m, x))
    out = step()
    assert out.shape == (2, 1, 32)
    torch.testing.assert_close(out[:, 0], full[:, -1], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(step()[:, 0], full[:, -1], rtol=1e-5, atol=1e-5)  # repeatable
    # decoding two positions in turn from a cache of T-2 tokens gives the last two logits
    m.setup_kv_cache(2)
    with torch.no_grad():
        m(x[:, :-2])
        a = m(x[:, -2:-1], pos=torch.tensor([6]))
        b = m(x[:, -1:], pos=torch.tensor([7]))
    torch.testing.assert_close(torch.cat([a, b], 1), full[:, -2:], rtol=1e-5, atol=1e-5)


def test_decode_needs_its_input():
    with pytest.raises(ValueError, match="decode_input"):
        make_step(model_for("prenorm", "naive"), "decode", torch.zeros(1, 8, dtype=torch.long), None)


def test_train_step_lowers_the_loss_on_a_fixed_batch():
    m = model_for("haares", "two_phase")
    x = torch.randint(0, 32, (2, 8), generator=torch.Generator().manual_seed(3))
    step = make_step(m, "train_step", x, x)
    losses = [step().item() for _ in range(8)]
    assert losses[-1] < losses[0] - 0.1
    with torch.no_grad():
        assert abs(lm_loss(m(x), x).item() - losses[-1]) < 0.5


def test_unknown_mode():
    with pytest.raises(ValueError, match="--modes"):
        make_step(model_for("prenorm", "naive"), "sample", None, None)
