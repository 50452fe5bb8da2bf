"""``two_phase`` and ``lean`` (the same schedule with its memory-lean backward) equal ``naive`` for
every block router, forward and gradients, in float64."""

from __future__ import annotations

import pytest
import torch

from reference import drive
from routers import ROUTERS, build_router, impls
from workloads.config import DecoderConfig
from workloads.decoder import Decoder

B, T, D = 2, 3, 8
#: The built-in impls of the two-phase schedule (two_phase, lean), from the registry.
TWO_PHASE = [i for i in ROUTERS["haares"].impls if impls.get(i).schedule == "two_phase"]
CASES = [("block_attnres", "always")] + [
    (n, p) for n in ("haares", "wav_v1") for p in ("always", "informative", "never")]


def run(router, e, ups):
    reads, out, _ = drive(router, e, ups)
    return torch.stack(reads + [out])


def pair(name, L, impl="two_phase", **opts):
    """Naive and two-phase (or lean) routers sharing one set of random (non-trivial) parameters."""
    naive = build_router(name, D, L, impl="naive", **opts).double()
    g = torch.Generator().manual_seed(11)
    with torch.no_grad():
        for p in naive.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype))
    fast = build_router(name, D, L, impl=impl, **opts).double()
    fast.load_state_dict(naive.state_dict())
    return naive, fast


@pytest.mark.parametrize("impl", TWO_PHASE)
@pytest.mark.parametrize("name,partial", CASES)
@pytest.mark.parametrize("L,n_blocks", [(4, 2), (5, 2), (6, 4), (3, None)])
@pytest.mark.parametrize("extra", [{}, {"key_norm_gain": True, "readout_details": True}])
def test_two_phase_equals_naive_forward_and_backward(name, partial, L, n_blocks, extra, impl):
    opts = dict(extra)
    if name in ("haares", "wav_v1"):
        opts["partial_details"] = partial
    else:
        opts.pop("readout_details", None)
    if name != "full_attnres":
        opts["n_blocks"] = n_blocks
    naive, fast = pair(name, L, impl, **opts)
    g = torch.Generator().manual_seed(5)
    e = torch.randn(B, T, D, generator=g, dtype=torch.float64, requires_grad=True)
    ups = [torch.randn(B, T, D, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(2 * L)]
    weights = torch.randn(2 * L + 1, B, T, D, generator=g, dtype=torch.float64)
    outs, grads = [], []
    for r in (naive, fast):
        out = run(r, e, ups)
        params = list(r.parameters())
        loss = (out * weights).sum()
        grads.append(torch.autograd.grad(loss, [e, *ups, *params]))
        outs.append(out)
    torch.testing.assert_close(outs[1], outs[0], rtol=1e-10, atol=1e-10)
    for a, b in zip(grads[1], grads[0]):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10)


def test_two_phase_decoder_trains_like_naive_in_float32():
    cfg = DecoderConfig(vocab_size=32, d_model=16, n_layers=4, n_heads=2, seq_len=8, batch_size=2)
    x = torch.randint(0, 32, (2, 8), generator=torch.Generator().manual_seed(0))
    losses = {}
    for impl in ("naive", *TWO_PHASE):
        torch.manual_seed(0)
        m = Decoder(cfg, "wav_v1", {"impl": impl, "n_blocks": 2})
        opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
        trace = []
        for _ in range(5):
            loss = torch.nn.functional.cross_entropy(m(x).flatten(0, 1), x.flatten())
            opt.zero_grad()
            loss.backward()
            opt.step()
            trace.append(loss.item())
        losses[impl] = trace
    assert losses["naive"][-1] < losses["naive"][0]
    for impl in TWO_PHASE:
        torch.testing.assert_close(torch.tensor(losses[impl]), torch.tensor(losses["naive"]),
                                   rtol=1e-4, atol=1e-5)
