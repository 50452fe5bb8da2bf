"""Backends: compile and CUDA-graph replay compute what eager computes; their guards and rows."""

from __future__ import annotations

import contextlib
import gc
import weakref

import pandas as pd
import pytest
import torch

from harness.rundir.records import load_rows
from harness.rundir.writer import RunWriter
from harness.step import backends
from harness.step.cudagraph import CaptureError, GraphedStep, StaticInputs, preflight
from harness.step.modes import lm_loss, make_optimizer, make_step, prefill_for_decode
from harness.sweep.cases import expand
from harness.sweep.options import SweepOptions
from harness.sweep.run import run_sweep
from harness.timing.timer import TimingPolicy
from routers import ROUTERS, impls, router_options
from workloads.config import DecoderConfig
from workloads.decoder import Decoder

CFG = DecoderConfig(vocab_size=32, d_model=16, n_layers=2, n_heads=2, seq_len=8, batch_size=2)
FAST = SweepOptions(flops=False, timing=TimingPolicy(warmup_min_count=2, warmup_min_s=0.0, repeats=3), max_attempts=1)
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
# every router once, plus the two-phase path of the detail router with the most sources
VARIANTS = [(n, "naive") for n in sorted(ROUTERS)] + [("wav_v1", "two_phase")]
# every router × impl; those beyond VARIANTS run with --compile-matrix (tests/conftest.py)
ALL_IMPLS = [(n, i) for n in sorted(ROUTERS) for i in ROUTERS[n].impls]


#: Options that keep a compile test small without changing the graph's structure: mHC's Sinkhorn
#: loop unrolls ``sk_iters`` times per sublayer (20 took 71 s to compile here, 3 take a fraction).
SMALL = {"mhc": {"sk_iters": 3}}


def model_for(name, impl, device="cpu"):
    torch.manual_seed(0)
    opts = {"impl": impl} if "impl" in router_options(name) else {}
    opts.update(SMALL.get(name, {}))
    m = Decoder(CFG, name, opts).to(device)
    with torch.no_grad():  # non-trivial router parameters
        for p in m.router.parameters():
            p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(1)).to(device))
    return m


def batch(device="cpu"):
    x = torch.randint(0, 32, (2, 8), generator=torch.Generator().manual_seed(2)).to(device)
    return x, torch.roll(x, -1, dims=1)


def outputs_and_grads(model, x, y):
    logits = model(x)
    loss = lm_loss(logits, y)
    grads = torch.autograd.grad(loss, list(model.parameters()))
    return logits.detach(), loss.detach(), grads


#: (router, impl) whose CPU model-scope compile corrupts the heap under a torch release older than
#: the one given: Inductor's C++ vectorizer stores a full vector into the tail of a 2-D tiled
#: reduction (pytorch/pytorch#196681, open); dhc's backward has one (n = 4 streams, d = 16).
#: Reproduced here under torch 2.11.0 (glibc "corrupted size vs. prev_size", every run; with
#: ``torch._inductor.config.cpp.simdlen = 0`` it passes); 2.13.0 passes. GPUs compile with Triton,
#: not this vectorizer: the CUDA test below still runs there.
CPU_INDUCTOR_HEAP_BUG = {("dhc", "naive"): (2, 13)}


def _cpu_inductor_heap_bug(name, impl):
    fixed = CPU_INDUCTOR_HEAP_BUG.get((name, impl))
    return fixed is not None and tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2]) < fixed


@pytest.mark.compile
@pytest.mark.parametrize("name,impl", [pytest.param(n, i, marks=() if (n, i) in VARIANTS else pytest.mark.compile_matrix)
                                       for n, i in ALL_IMPLS])
def test_model_scope_compile_equals_eager(name, impl):
    """The whole forward as one Inductor graph (``--compile-scope model``) against eager."""
    if _cpu_inductor_heap_bug(name, impl):
        pytest.skip(f"torch {torch.__version__}'s Inductor C++ vectorizer overruns a buffer in {name}'s "
                    "backward on CPU (pytorch/pytorch#196681); the process would abort")
    eager = model_for(name, impl).train()
    x, y = batch()
    ref = outputs_and_grads(eager, x, y)
    compiled = backends.prepare(model_for(name, impl).train(), "compile", "default", "model").model
    got = outputs_and_grads(compiled, x, y)
    assert backends.graph_breaks() == 0
    torch.testing.assert_close(got[0], ref[0], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(got[1], ref[1], rtol=1e-5, atol=1e-6)
    for a, b in zip(got[2], ref[2]):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-5)


@pytest.mark.compile
def test_recompile_during_timing_is_an_error_row_not_a_timing(tmp_path, monkeypatch):
    """A shape change after warm-up makes dynamo recompile; the guard turns it into an error."""
    real = backends.make_step
    calls = {"n": 0}

    def shape_changing_step(model, mode, x, y, **kw):
        steps = [real(model, mode, x, y, **kw), real(model, mode, x[:, :4], y[:, :4], **kw)]

        def step():
            calls["n"] += 1
            return steps[calls["n"] > 3]()  # compile + 2 warm-up steps, then a new shape
        return step

    monkeypatch.setattr(backends, "make_step", shape_changing_step)  # the backend makes the step
    case = expand(["prenorm"], CFG, [16], [2], ["fwd"], backends=["compile"])
    with RunWriter(tmp_path, "run", "s") as w:
        assert run_sweep(case, torch.device("cpu"), w, FAST, progress=False) == {"resumed": 0, "error": 1}
    rows = pd.DataFrame(load_rows([tmp_path]))
    assert not ((rows.metric == "step_time") & (rows.status == "ok")).any()
    err = rows[rows.status == "error"].error.iloc[0]
    assert "Recompil" in err or "recompil" in err, err
    assert rows[rows.metric == "compile_time"].value.iloc[0] > 0


def test_backends_that_cannot_run_here_are_skipped_rows(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: nothing is skipped")
    cases = (expand(["prenorm"], CFG, [16], [2], ["fwd"], backends=["cudagraph"])
             + expand(["prenorm"], CFG, [16], [2], ["fwd"], backends=["compile"],
                      compile_modes=["reduce-overhead"]))
    with RunWriter(tmp_path, "run", "s") as w:
        assert run_sweep(cases, torch.device("cpu"), w, FAST, progress=False) == {"resumed": 0, "skipped": 2}
    rows = pd.DataFrame(load_rows([tmp_path]))
    assert rows.status.tolist() == ["skipped", "skipped"]
    assert "no CUDA device" in rows.error.iloc[0] and "reduce-overhead" in rows.error.iloc[1]


def test_capture_failure_is_an_error_row_and_the_sweep_goes_on(tmp_path, monkeypatch):
    def failing(*a, **k):
        raise CaptureError("capture of mode fwd failed: synthetic cause")

    monkeypatch.setattr(backends, "GraphedStep", failing)  # the backend captures the step
    monkeypatch.setattr(backends, "unavailable_reason", lambda *a: None)  # pretend CUDA is here
    cases = expand(["prenorm", "haares"], CFG, [16], [2], ["fwd"], backends=["cudagraph"])
    with RunWriter(tmp_path, "run", "s") as w:
        assert run_sweep(cases, torch.device("cpu"), w, FAST, progress=False) == {"resumed": 0, "error": 2}
    rows = pd.DataFrame(load_rows([tmp_path]))
    assert (rows[rows.status == "error"].error.str.contains("synthetic cause")).all()


def test_reduce_overhead_under_the_layer_scope_is_refused_naming_both_options():
    """Each compiled region would start a CUDA-graph-trees step of its own, which overwrites the
    outputs of the regions before it (the first GPU run: "accessing tensor output of CUDAGraphs
    that has been overwritten"); the model scope and the cudagraph backend capture graphs."""
    with pytest.raises(ValueError, match="--compile-modes reduce-overhead with --compile-scope layer"):
        backends.prepare(model_for("prenorm", "naive"), "compile", "reduce-overhead", "layer")


def test_static_inputs_refill_in_place_and_reject_new_shapes():
    x, y = batch()
    st = StaticInputs(x, y)
    ptrs = [b.data_ptr() for b in st.buffers]
    x2, y2 = x + 1, y + 2
    st.refill(x2, y2)
    assert [b.data_ptr() for b in st.buffers] == ptrs
    assert torch.equal(st.buffers[0], x2) and torch.equal(st.buffers[1], y2)
    with pytest.raises(ValueError, match="capture again"):
        st.refill(x[:, :4], y)
    with pytest.raises(ValueError, match="expected 2 inputs"):
        st.refill(x)


def test_graphed_step_and_preflight_on_cpu():
    x, y = batch()
    with pytest.raises(CaptureError, match="needs a CUDA device"):
        GraphedStep(model_for("prenorm", "naive"), "fwd", x, y)
    ran = []
    preflight(lambda: ran.append(1), torch.device("cpu"))
    assert ran == [1]


# --- CUDA only ----------------------------------------------------------------------------------
@CUDA
@pytest.mark.cuda
@pytest.mark.parametrize("name,impl", ALL_IMPLS)
@pytest.mark.parametrize("mode", ["fwd", "fwd_bwd", "decode"])
def test_cudagraph_equals_eager(name, impl, mode):
    """Replay equals eager, forward and gradients, for every router × impl (``two_phase`` and
    ``lean``'s Functions inside the capture too: no host sync, the same allocations every step)."""
    x, y = batch("cuda")
    eager, graphed = model_for(name, impl, "cuda"), model_for(name, impl, "cuda")
    dec_e = prefill_for_decode(eager, x) if mode == "decode" else None
    dec_g = prefill_for_decode(graphed, x) if mode == "decode" else None
    ref = make_step(eager, mode, x, y, decode_input=dec_e)()
    g = GraphedStep(graphed, mode, x, y, decode_input=dec_g)
    out = g()
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)
    assert g.capture_time_s > 0
    if mode == "fwd_bwd":
        for pe, pg in zip(eager.parameters(), graphed.parameters()):
            torch.testing.assert_close(pg.grad, pe.grad, rtol=1e-3, atol=1e-5)
        g.static.refill(*batch("cuda"))  # new data, same addresses: replay again
        torch.testing.assert_close(g(), ref, rtol=1e-4, atol=1e-5)


class FakeGraphAPI:
    """The part of ``torch.cuda`` a :class:`GraphedStep` uses, as a CPU test double: streams and
    graphs that do nothing (the capture runs the step once, eagerly; a replay does nothing)."""

    class Stream:
        def __init__(self, device=None):
            pass

        def wait_stream(self, other):
            pass

    class CUDAGraph:
        def replay(self):
            pass

    @staticmethod
    def current_stream(device=None):
        return FakeGraphAPI.Stream()

    @staticmethod
    @contextlib.contextmanager
    def stream(s):
        yield

    @staticmethod
    @contextlib.contextmanager
    def graph(g, stream=None):
        yield

    @staticmethod
    def synchronize(device=None):
        pass


def test_a_graphed_train_step_keeps_alive_everything_its_graph_reads():
    """A captured ``train_step`` reads the parameters, their gradients and the optimizer's state at
    fixed addresses: nothing of them may die while the graph can replay (the first GPU run freed
    the AdamW state with the optimizer and replayed into unmapped memory)."""
    x, y = batch()
    model = model_for("haares", "two_phase")
    opt = make_optimizer(model)  # a capturable AdamW asserts on a CPU
    g = GraphedStep(model, "train_step", x, y, optimizer=opt, api=FakeGraphAPI)
    state = [t for st in opt.state.values() for t in st.values() if isinstance(t, torch.Tensor)]
    assert state  # the warm-up stepped the optimizer: moments and step counts exist
    refs = [weakref.ref(o) for o in (model, opt, *model.parameters(), *state)]
    del model, opt, state
    gc.collect()
    assert all(r() is not None for r in refs)
    del g
    gc.collect()
    assert all(r() is None for r in refs[:2])  # nothing else held them: the check can fail


@CUDA
@pytest.mark.cuda
@pytest.mark.parametrize("name,impl", [p for p in [("prenorm", "naive"), ("full_attnres", "naive"), ("haares", "two_phase"),
                                                   ("wav_v1", "lean")] if impls.lookup(p[1]) is not None])
def test_cudagraph_train_step_trains(name, impl):
    """Ten replays of a captured training step lower the loss, with garbage collected and the
    allocator's cache emptied before the replays (what the sweep does between cases)."""
    x, y = batch("cuda")
    g = GraphedStep(model_for(name, impl, "cuda"), "train_step", x, y)
    others = [GraphedStep(model_for("prenorm", "naive", "cuda"), "fwd_bwd", x, y) for _ in range(2)]
    del others  # graphs destroyed beside it must not take its cuBLAS workspace (pytorch#193402)
    gc.collect()
    torch.cuda.empty_cache()
    losses = [g().item() for _ in range(10)]
    assert losses[-1] < losses[0]


@CUDA
@pytest.mark.cuda
@pytest.mark.compile
@pytest.mark.parametrize("name,impl", [p for p in [("prenorm", "naive"), ("haares", "two_phase"), ("haares", "lean")]
                                       if impls.lookup(p[1]) is not None])
@pytest.mark.parametrize("scope", ["model"])
def test_reduce_overhead_equals_eager(name, impl, scope):
    x, y = batch("cuda")
    ref = make_step(model_for(name, impl, "cuda"), "fwd", x, y)()
    prepared = backends.prepare(model_for(name, impl, "cuda"), "compile", "reduce-overhead", scope)
    step = make_step(prepared.model, "fwd", x, y, clone_outputs=prepared.clone_outputs)
    outs = [step() for _ in range(3)]  # kept outputs must survive later replays
    for out in outs:
        torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)


def test_inductors_isa_probe_runs_beside_the_set_ups_and_is_optional(monkeypatch):
    """warm_inductor starts Inductor's once-per-process vector-ISA probe in the background on a CPU
    and returns the wait for it; afterwards the probe's answer is the one Inductor computes itself.
    On CUDA, or with a torch whose Inductor lacks the probe, it starts nothing and the wait returns
    at once."""
    import threading

    from harness.step import backends
    from torch._inductor import cpu_vec_isa
    before = threading.active_count()
    done = backends.warm_inductor(torch.device("meta"))
    assert done() is None and threading.active_count() == before
    wait = backends.warm_inductor(torch.device("cpu"))
    wait()
    assert not any(t.name == "warm-inductor" for t in threading.enumerate())
    cached = cpu_vec_isa.valid_vec_isa_list()
    cpu_vec_isa.valid_vec_isa_list.cache_clear()
    assert [str(i) for i in cpu_vec_isa.valid_vec_isa_list()] == [str(i) for i in cached]
    monkeypatch.delattr(cpu_vec_isa, "supported_vec_isa_list")
    assert backends.warm_inductor(torch.device("cpu"))() is None
