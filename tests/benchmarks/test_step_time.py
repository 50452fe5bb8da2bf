"""Step time of every router's ``fwd_bwd`` step at a small CPU shape (pytest-benchmark).

Compare routers with ``pytest tests/benchmarks --benchmark-only --benchmark-group-by=param:mode``;
the harness's own sweep (``routerbench run``) records the same numbers as tidy rows.
"""

import pytest
import torch

from harness.modes import make_step
from routers import ROUTERS
from workloads.config import DecoderConfig
from workloads.data import synthetic_batch
from workloads.decoder import Decoder

CFG = DecoderConfig(d_model=128, n_layers=8, n_heads=4, seq_len=128, batch_size=4)


@pytest.mark.parametrize("mode", ["fwd", "fwd_bwd"])
@pytest.mark.parametrize("router", sorted(ROUTERS))
def test_step_time(benchmark, router, mode):
    torch.manual_seed(0)
    model = Decoder(CFG, router)
    x, y = synthetic_batch(CFG.vocab_size, CFG.batch_size, CFG.seq_len, seed=0)
    step = make_step(model, mode, x, y)
    benchmark.extra_info.update(router=router, mode=mode, d_model=CFG.d_model, n_layers=CFG.n_layers)
    out = benchmark.pedantic(step, rounds=10, iterations=1, warmup_rounds=2)
    assert torch.isfinite(out).all()
