"""What a step of a router dispatches and moves, counted on the meta device (harness/costs/step_costs.py,
``routerbench costs``; docs/MEASUREMENT.md, "The byte rule"): hand counts, the fused kernels counted
without Triton, and the command's rows."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

from harness.cli import main
from harness.cli.costs import FIELDS
from harness.costs.step_costs import step_costs
from routers.block import fused_bytes


def test_prenorm_moves_six_units_by_hand():
    """prenorm at L layers: 2L forward adds h + u (read 2, write 1) and 2L backward accumulations of
    h's two gradients (read 2, write 1): 4L launches and 6 units of d per token and sublayer; the
    add saves nothing for its backward."""
    c = step_costs("prenorm", 64, 3, 10, torch.float32)
    assert (c.launches_kernel, c.launches_other) == (0, 12)
    assert c.bytes == 12 * 3 * 10 * 64 * 4 and c.units(c.bytes) == 6.0 and c.saved_bytes == 0
    f = step_costs("prenorm", 64, 3, 10, torch.float32, backward=False)
    assert (f.launches, f.units(f.bytes)) == (6, 3.0)


def test_fused_launches_are_recorded_with_their_byte_models_and_no_triton():
    """block_attnres fused, 2 layers in 2 blocks, forward only: phase 1 of each block and of the
    readout (3; each key's inverse RMS inside it), phase 2 of each read that sees a partial block
    (one per block: 2); every launch is a kernel of ours counted by its model, parameters once per
    launch, and the only other ops are the running sums' adds that complete each block (2)."""
    c = step_costs("block_attnres", 32, 2, 6, torch.float32, impl="fused", options={"n_blocks": 2},
                   backward=False)
    assert dict(c.kernels) == {"phase1_fwd": 3, "phase2_fwd": 2} and dict(c.others) == {"aten.add.Tensor": 2}
    assert c.bytes_kernel < c.asked_kernel  # q re-read by every program counts once
    both = step_costs("block_attnres", 32, 2, 6, torch.float32, impl="fused", options={"n_blocks": 2})
    assert set(both.kernels) <= set(fused_bytes.MODELS) and both.kernels["phase2_bwd"] == 2
    assert both.launches > c.launches and both.bytes > c.bytes


def test_the_block_routers_move_more_than_prenorm_and_fused_least_of_their_impls():
    """At the byte rule's reference width and depth (fewer tokens: per-token figures), each
    block router's fused step moves the fewest bytes of its impls and launches the fewest, and every
    impl moves more than the ideal model of a training step."""
    from routers import ROUTERS, build_router
    for router in ("block_attnres", "haares", "wav_v1"):
        got = {impl: step_costs(router, 1024, 12, 256, torch.bfloat16, impl=impl)
               for impl in ROUTERS[router].cost_models}  # naive, two_phase, lean, fused
        units = {k: c.units(c.bytes) for k, c in got.items()}
        assert min(units, key=units.get) == "fused" and min(got, key=lambda k: got[k].launches) == "fused"
        ideal = build_router(router, 1024, 12).ideal_io_fwd_bwd_per_token()
        assert all(u > ideal for u in units.values()), (router, units, ideal)


def test_costs_prints_rows_for_every_router_impl_and_scope_against_prenorm():
    res = CliRunner().invoke(main, ["costs", "--routers", "haares", "--impls", "two_phase,fused", "--widths", "64",
                                    "--depths", "4", "--tokens", "16", "--json"])
    assert res.exit_code == 0, res.output
    rows = [json.loads(line) for line in res.output.splitlines()]
    assert [(r["router"], r["impl"], r["scope"]) for r in rows] == [
        (r, i, s) for s in ("model", "layer") for r, i in (("prenorm", "naive"), ("haares", "two_phase"),
                                                             ("haares", "fused"))]
    assert all(list(r) == list(FIELDS) and r["error"] is None for r in rows)
    pre, fused = rows[0], rows[2]
    assert pre["units"] == 6.0 and pre["floor_units"] == 0 and pre["launches_vs_prenorm"] == 1.0
    assert fused["launches_kernel"] > 0 and fused["units_kernel"] > 0
    assert fused["x_floor"] == pytest.approx((fused["units"] - 6.0) / fused["floor_units"])
    assert fused["floor_units"] == fused["ideal_units"] - 6.0
    # both byte fields in bytes of the counted step, the units fields in d elements of bf16
    assert fused["ideal_io_per_token_sublayer"] == fused["ideal_units"] * 64 * 2
    assert fused["bytes_per_token_sublayer"] == pytest.approx(fused["units"] * 64 * 2)
    assert fused["ideal_fwd_units"] < fused["ideal_units"]
    table = CliRunner().invoke(main, ["costs", "--routers", "haares", "--impls", "fused", "--widths", "64",
                                      "--depths", "4", "--tokens", "16", "--scopes", "model"])
    assert table.exit_code == 0 and "x_floor" in table.output and "haares" in table.output
    fwd = CliRunner().invoke(main, ["costs", "--routers", "haares", "--impls", "fused", "--widths", "64",
                                    "--depths", "4", "--tokens", "16", "--forward-only", "--json"])
    assert all(json.loads(line)["saved_units"] is None for line in fwd.output.splitlines())


def test_costs_refuses_bad_input_before_counting():
    res = CliRunner().invoke(main, ["costs", "--routers", "haares", "--impls", "nonesuch"])
    assert res.exit_code == 2 and "--impls: nonesuch is offered by none of prenorm, haares" in res.output
    wide = CliRunner().invoke(main, ["costs", "--routers", "haares", "--impls", "fused", "--widths", "8192",
                                     "--depths", "2", "--tokens", "4", "--scopes", "model"])
    assert wide.exit_code == 0 and "not counted: haares fused d=8192" in wide.output and "--impls lean" in wide.output
    assert "--router-options" not in wide.output  # an option of run, not of costs
    lines = wide.output.splitlines()
    row = next(line for line in lines if " prenorm " in line).split()
    assert row[5:8] == ["0", "8", "8"]  # launches stay integers beside a case not counted (not 8.0)
    # a router that offers none of the impls asked for is said, not counted with another impl
    none = CliRunner().invoke(main, ["costs", "--routers", "haares,rezero", "--impls", "fused", "--widths", "64",
                                     "--depths", "2", "--tokens", "4", "--scopes", "model"])
    assert none.exit_code == 0 and "not counted: rezero – d=64 L=2 model: offers none of --impls fused" in none.output
    assert not any(line.split()[3:4] == ["rezero"] for line in none.output.splitlines())


def _peak_temporaries(fn, *args) -> tuple[int, int]:
    """(peak bytes of the tensors ``fn`` makes and holds at once, bytes of those it returns), on the
    meta device: every op's new output counted until it is freed; views and in-place results not."""
    import weakref

    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    from harness.costs.traffic import moves_nothing
    live, peak = [0], [0]

    def freed(n):
        live[0] -= n

    class Live(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, a=(), k=None):
            out = func(*a, **(k or {}))
            ins = {id(t) for t in tree_leaves((a, k)) if isinstance(t, torch.Tensor)}
            alloc = func in (torch.ops.aten.empty.memory_format, torch.ops.aten.new_empty.default,
                             torch.ops.aten.empty_strided.default, torch.ops.aten.new_empty_strided.default)
            if alloc or not moves_nothing(func):
                for t in tree_leaves(out):
                    if isinstance(t, torch.Tensor) and id(t) not in ins:
                        n = t.numel() * t.element_size()
                        live[0] += n
                        weakref.finalize(t, freed, n)
            peak[0] = max(peak[0], live[0])
            return out
    with Live():
        result = fn(*args)
    kept = sum(t.numel() * t.element_size() for t in tree_leaves(result) if isinstance(t, torch.Tensor))
    return peak[0], kept


def test_phase1s_backward_holds_at_most_the_pools_size_beside_its_results():
    """wav_v1 at d = 4096, 12 layers (6 blocks: the last phase 1 has n = 16 sources and m = 4
    queries, one query per program at this width, so 4 groups), 16,384 rows, bf16, launches stubbed:
    the launcher's temporaries peak within the pool's own size (2 GiB), where one float32 partial
    per group, as before, took 17 GiB."""
    from routers.block.fused_bytes import RecordedLaunches
    from routers.block.fused_launch import run_phase1_bwd
    n, m, R, d = 16, 4, 16384, 4096
    with torch.device("meta"):
        values = [torch.empty(1, R, d, dtype=torch.bfloat16) for _ in range(n)]
        q, inv = torch.empty(m, d, dtype=torch.bfloat16), torch.empty(n, 1, R)
        mx, s = [torch.empty(1, R) for _ in range(m)], [torch.empty(1, R) for _ in range(m)]
        g_o = [torch.empty(1, R, d, dtype=torch.bfloat16) for _ in range(m)]
    rec = RecordedLaunches()
    peak, kept = _peak_temporaries(run_phase1_bwd, rec, values, inv, q, None, None, None, mx, s, g_o, mx)
    pool = n * R * d * 2
    assert pool == 2 * 2**30 and peak - kept <= pool, (peak - kept) / 2**30
    assert 4 * n * R * d * 4 == 8 * pool  # the old partials, one per group in float32: 16 GiB (17.2 GB)
    groups = {grid[1] for name, grid, _ in rec.launches if name == "phase1_bwd"}
    assert groups == {4} and sum(grid[0] for name, grid, _ in rec.launches if name == "phase1_bwd") == R


def test_the_autotune_key_holds_a_row_bucket():
    """The same router at 128 and 8,192 tokens launches each kernel under two autotune keys (the
    row bucket, a power of two, differs), so the config tuned by a 128-row parity check is not the
    one a case timed at 8,192 rows runs; 8,000 and 8,192 rows share a bucket."""
    from routers.block.fused_launch import KEYS
    keys = {n: step_costs("haares", 64, 4, n, torch.float32, impl="fused").tuning_keys for n in (128, 8000, 8192)}
    assert all("R_BUCKET" in k for k in KEYS.values())
    assert {name for name, _ in keys[128]} == set(KEYS) and keys[128].isdisjoint(keys[8192])
    assert keys[8000] == keys[8192] and {key[-1] for _, key in keys[8192]} == {8192}


def test_fused_on_cuda_checks_parity_at_its_own_rows():
    """Parity runs one sequence of at most 128 tokens, but fused on CUDA runs its case's own B·T,
    and at least 2 × MAX_PROGRAMS + 1 rows (its row loop and the configs it is timed with)."""
    from harness.sweep.cases import Case
    from harness.sweep.parity import PARITY_TOKENS, parity_tokens
    from routers.block.fused_launch import MAX_PROGRAMS
    from workloads.config import DecoderConfig
    big = DecoderConfig(vocab_size=32, d_model=64, n_layers=2, n_heads=2, seq_len=1024, batch_size=8)
    small = DecoderConfig(vocab_size=32, d_model=64, n_layers=2, n_heads=2, seq_len=16, batch_size=2)
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    fused = Case("haares", big, "fwd_bwd", impl="fused")
    assert parity_tokens(fused, cuda) == 8192 and parity_tokens(fused, cpu) == PARITY_TOKENS
    assert parity_tokens(Case("haares", small, "fwd_bwd", impl="fused"), cuda) == 2 * MAX_PROGRAMS + 1
    assert parity_tokens(Case("haares", big, "fwd_bwd", impl="two_phase"), cuda) == PARITY_TOKENS
