"""Ops per eager step (harness/costs/ops.py): hand-counted tiny functions, views, backward, custom
autograd Functions and ``torch.library`` custom ops, the profiler's launch filter, and the
``ops_fwd`` / ``ops_bwd`` rows of a sweep."""

from __future__ import annotations

from types import SimpleNamespace

import pandas as pd
import pytest
import torch
from torch import nn

from harness.costs.ops import (OpCounter, count_kernel_launches, count_ops, count_ops_step,
                               launch_count)
from harness.rundir.records import load_rows
from harness.rundir.writer import RunWriter
from harness.sweep.cases import expand
from harness.sweep.options import SweepOptions
from harness.sweep.run import run_sweep
from harness.timing.timer import TimingPolicy
from workloads.config import DecoderConfig
from workloads.decoder import Decoder

CPU = torch.device("cpu")


@torch.library.custom_op("routerbench_test::double_exp", mutates_args=())
def double_exp(a: torch.Tensor) -> torch.Tensor:
    """exp(2a): two aten ops inside one custom op."""
    return (a * 2).exp()


@double_exp.register_fake
def _(a):
    return torch.empty_like(a)


class SinExp(torch.autograd.Function):
    """exp(sin(a)) with a hand-written backward."""

    @staticmethod
    def forward(ctx, a):
        out = a.sin().exp()
        ctx.save_for_backward(a, out)
        return out

    @staticmethod
    def backward(ctx, g):
        a, out = ctx.saved_tensors
        return g * out * a.cos()


def test_a_hand_counted_function_is_three_ops():
    x = torch.randn(2, 3)
    assert count_ops(lambda: (x + 1).view(-1).sum()) == 3  # add, view, sum
    with OpCounter() as c:
        (x + 1).view(-1).sum()
    assert c.by_op == {"aten.add.Tensor": 1, "aten.view.default": 1, "aten.sum.default": 1}
    assert not c.custom


def test_views_count_as_ops():
    x = torch.randn(4, 6)
    # view, transpose, t, expand, unsqueeze: five views, no data moved
    assert count_ops(lambda: x.view(6, 4).transpose(0, 1).t().unsqueeze(0).expand(3, 6, 4)) == 5


def test_the_backward_is_counted():
    x = torch.randn(5, requires_grad=True)
    loss = (x * 3).sum()
    with OpCounter() as c:
        loss.backward()
    # the seed gradient (ones_like), sum's backward (expand), mul's backward (mul), and the
    # accumulation into x.grad (a detach of the new gradient)
    assert c.by_op["aten.ones_like.default"] == 1 and c.by_op["aten.expand.default"] == 1
    assert c.by_op["aten.mul.Tensor"] == 1
    assert c.total >= 3


def test_ops_inside_a_custom_autograd_function_are_counted():
    x = torch.randn(4, requires_grad=True)
    with OpCounter() as fwd:
        out = SinExp.apply(x)
    assert fwd.by_op["aten.sin.default"] == 1 and fwd.by_op["aten.exp.default"] == 1
    # besides them at most the detach by which autograd saves the Function's own output
    assert set(fwd.by_op) <= {"aten.sin.default", "aten.exp.default", "aten.detach.default"}
    loss = out.sum()
    with OpCounter() as bwd:
        loss.backward()
    assert bwd.by_op["aten.cos.default"] == 1 and bwd.by_op["aten.mul.Tensor"] == 2  # g·out·cos a
    torch.testing.assert_close(x.grad, x.sin().exp() * x.cos())


def test_a_custom_op_counts_once_and_its_inner_ops_too():
    x = torch.randn(4)
    with OpCounter() as c:
        out = double_exp(x)
    # the custom op itself, then its implementation re-run under the counter: mul, exp
    assert c.by_op == {"routerbench_test.double_exp.default": 1, "aten.mul.Tensor": 1, "aten.exp.default": 1}
    assert c.total == 3 and c.custom == {"routerbench_test.double_exp.default": 1}
    torch.testing.assert_close(out, (2 * x).exp())


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(8, 8)  # logits over a vocabulary of 8
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        return self.drop(self.emb(x))


def test_count_ops_step_leaves_the_model_as_it_was():
    torch.manual_seed(0)
    m = Tiny().eval()
    x = torch.randint(0, 8, (2, 3))
    before = [p.detach().clone() for p in m.parameters()]
    rng = torch.get_rng_state()
    got = count_ops_step(m, x, x)
    assert set(got) == {"fwd", "bwd"} and all(isinstance(v, int) and v > 0 for v in got.values())
    assert torch.equal(rng, torch.get_rng_state())  # the dropout's draw did not move the RNG
    assert all(torch.equal(a, b) for a, b in zip(before, m.parameters()))
    assert all(p.grad is None for p in m.parameters()) and not m.training
    assert count_ops_step(m, x, x) == got  # and a second count sees the same step


def test_kernel_launches_are_cuda_only():
    m = Tiny()
    x = torch.randint(0, 8, (2, 3))
    assert count_kernel_launches(m, x, x) is None


def test_launch_count_keeps_the_launch_calls():
    cpu, cuda = torch.autograd.DeviceType.CPU, torch.autograd.DeviceType.CUDA
    ev = lambda name, dev=cpu: SimpleNamespace(name=name, device_type=dev)  # noqa: E731
    events = [ev("aten::mm"), ev("cudaLaunchKernel"), ev("cudaLaunchKernelExC"), ev("cuLaunchKernelEx"),
              ev("cudaGraphLaunch"), ev("cudaMemcpyAsync"), ev("cudaStreamSynchronize"),
              ev("ampere_sgemm_32x32", cuda), ev("Memcpy HtoD", cuda)]
    assert launch_count(events) == 4  # the runtime / driver launches only
    # a trace without the runtime calls: the device's kernels, copies and sets left out
    assert launch_count([ev("aten::mm"), ev("sgemm", cuda), ev("elementwise", cuda), ev("Memset (Device)", cuda)]) == 2
    assert launch_count([ev("aten::add")]) == 0


CFG = DecoderConfig(vocab_size=32, d_model=16, n_layers=2, n_heads=2, seq_len=8, batch_size=2)
FAST = SweepOptions(flops=False, memory=False, max_attempts=1,
                    timing=TimingPolicy(warmup_min_count=1, warmup_min_s=0.0, repeats=3))


def test_a_sweep_records_ops_per_case_even_without_flops(tmp_path):
    cases = expand(["prenorm", "block_attnres"], CFG, [16], [2], ["fwd"], impls=["naive"])
    with RunWriter(tmp_path, "run", "s", base={"device": "cpu"}) as w:
        assert run_sweep(cases, CPU, w, FAST, progress=False) == {"resumed": 0, "ok": 2}
    rows = pd.DataFrame(load_rows([tmp_path]))
    ops = rows[rows.metric.isin(["ops_fwd", "ops_bwd"])]
    assert set(ops.status) == {"ok"} and set(ops.unit) == {"count"} and set(ops.device) == {"cpu"}
    assert ops.groupby(["router", "metric"]).size().to_dict() == {
        (r, m): 1 for r in ("prenorm", "block_attnres") for m in ("ops_fwd", "ops_bwd")}
    assert all(v > 0 and float(v).is_integer() for v in ops.value)
    assert "kernels_fwd_bwd" not in set(rows.metric)  # CUDA only
    fwd = ops[ops.metric == "ops_fwd"].set_index("router")["value"]
    assert fwd["prenorm"] < fwd["block_attnres"]  # the router's reads and writes are ops too
    # what the sweep recorded is what count_ops_step counts on the same model and batch
    from harness.sweep.prepare import build_model
    from workloads.batches import synthetic_batch
    x, y = synthetic_batch(CFG.vocab_size, CFG.batch_size, CFG.seq_len, seed=cases[0].seed, device=CPU)
    assert count_ops_step(build_model(cases[0], CPU), x, y)["fwd"] == fwd["prenorm"]


def test_a_failing_op_count_is_an_error_row_and_the_case_goes_on(tmp_path, monkeypatch):
    import harness.sweep.counts as counts

    def broken(*a, **k):
        raise RuntimeError("synthetic op-count failure")
    monkeypatch.setattr(counts, "count_ops_step", broken)
    cases = expand(["prenorm"], CFG, [16], [2], ["fwd"])
    with RunWriter(tmp_path, "run", "s") as w:
        assert run_sweep(cases, CPU, w, FAST, progress=False) == {"resumed": 0, "ok": 1}
    rows = pd.DataFrame(load_rows([tmp_path]))
    err = rows[rows.metric.isin(["ops_fwd", "ops_bwd"])]
    assert sorted(err.metric) == ["ops_bwd", "ops_fwd"] and set(err.status) == {"error"}
    assert err.error.str.contains("synthetic op-count failure").all()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_kernel_launches_of_a_cuda_step():
    torch.manual_seed(0)
    m = Decoder(CFG, "prenorm").cuda()
    x = torch.randint(0, CFG.vocab_size, (CFG.batch_size, CFG.seq_len), device="cuda")
    n = count_kernel_launches(m, x, x)
    ops = count_ops_step(m, x, x)
    assert isinstance(n, int) and 0 < n <= 2 * (ops["fwd"] + ops["bwd"])
    assert all(p.grad is None for p in m.parameters())
