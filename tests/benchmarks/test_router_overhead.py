"""The router-overhead benchmark of the two-phase work: d=256, 12 layers, T=256, B=4, ``fwd_bwd``
on CPU, every block router × impl against prenorm, eager and compiled (pytest-benchmark).

    pytest tests/benchmarks/test_router_overhead.py --benchmark-only --benchmark-group-by=param:backend

For overheads with confidence intervals (interleaved timing), the harness's own sweep is the
better instrument: ``routerbench run --routers prenorm,block_attnres,haares,wav_v1 --impls
naive,two_phase --widths 256 --depths 12 --seq-len 256 --batch-size 4 --modes fwd_bwd
--backends eager,compile --no-train``.
"""

import pytest
import torch

from harness import backends
from harness.modes import make_step
from workloads.config import DecoderConfig
from workloads.data import synthetic_batch
from workloads.decoder import Decoder

CFG = DecoderConfig(d_model=256, n_layers=12, n_heads=4, seq_len=256, batch_size=4)
VARIANTS = [("prenorm", "naive")] + [(r, i) for r in ("block_attnres", "haares", "wav_v1")
                                     for i in ("naive", "two_phase")]


@pytest.mark.parametrize("backend", ["eager", "compile"])
@pytest.mark.parametrize("router,impl", VARIANTS)
def test_router_overhead(benchmark, router, impl, backend):
    torch.manual_seed(0)
    model = Decoder(CFG, router, {} if router == "prenorm" else {"impl": impl})
    prepared = backends.prepare(model, backend, "default" if backend == "compile" else None)
    x, y = synthetic_batch(CFG.vocab_size, CFG.batch_size, CFG.seq_len, seed=0)
    step = make_step(prepared.model, "fwd_bwd", x, y)
    step()  # compile (if any) outside the timed rounds
    benchmark.extra_info.update(router=router, impl=impl, backend=backend)
    loss = benchmark.pedantic(step, rounds=8, iterations=1, warmup_rounds=2)
    assert torch.isfinite(loss)
