"""The paths a GPU will time, run on CPU under Triton's interpreter (``make test-kernels``): each
kernel's declared byte model against the interpreter's count (routers/block/fused_bytes.py), phase
2's backward over several rows per program and phase 1 in query groups against naive, ``routerbench
kernels``, the warm-up that tunes every kernel of a captured step before the capture, and on CUDA
one autotune config per row bucket (routers/block/fused_launch.py)."""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

if importlib.util.find_spec("triton") is None:
    pytest.skip("triton is not installed: make test-kernels installs the kernels extra and runs these",
                allow_module_level=True)
if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("no CUDA device and TRITON_INTERPRET is not 1: make test-kernels runs these under "
                "Triton's interpreter", allow_module_level=True)

import test_fused  # noqa: E402
from routers.block import fused, fused_launch  # noqa: E402
from test_fused import D, DETAILS, DEVICE, _build, _errors, _run  # noqa: E402


# --- the byte model of each kernel (routers/block/fused_bytes.py) --------------------------------
@pytest.fixture
def counted_launches(monkeypatch):
    """Every kernel launch, run under the interpreter's load and store count beside its declared
    byte model: yields the list of (kernel, model's bytes as asked, counted bytes)."""
    if DEVICE != "cpu":
        pytest.skip("the interpreter counts loads and stores; on CUDA the kernels run natively")
    from harness.costs.kernel_io import counting
    from routers.block import fused_bytes
    real, seen = fused_launch._launcher, []

    def watched(mod, name, d):
        run = real(mod, name, d)

        def at(grid):
            go = run(grid)

            def launch(*a, **k):
                want = fused_bytes.moved(name, grid, a, k).asked
                with counting() as moved:
                    go(*a, **k)
                seen.append((name, want, moved["load"] + moved["store"]))
            return launch
        return at
    monkeypatch.setattr(fused_launch, "_launcher", watched)
    return seen


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("region", [False, True], ids=["exact_pool", "padded_pool"])
@pytest.mark.parametrize("name", sorted(DETAILS))
def test_each_kernels_byte_model_is_what_the_interpreter_counts(counted_launches, name, region, dtype, monkeypatch):
    """Forward and backward of every router at a tiny shape, phase 2's backward and phase 1's ∂q over
    2 rows per program (MAX_PROGRAMS 4 over 6 rows) and phase 1 in query groups (a query block of 2): every
    launch moves, load for load and store for store, the bytes its model declares."""
    monkeypatch.setattr(fused_launch, "MAX_PROGRAMS", 4)
    monkeypatch.setattr(fused_launch, "query_block", lambda m, d: min(m, 2))
    _run(_build(name, dtype, "fused", 4, 2, True), dtype, region)
    ran = {k for k, *_ in counted_launches}
    matched = {"rms_match"} if name != "block_attnres" else set()  # the routers with details match them
    assert ran == {"phase1_fwd", "phase1_bwd_dot", "phase1_bwd", "phase1_bwd_q", "phase2_fwd", "phase2_bwd"} | matched
    bad = [(k, w, g) for k, w, g in counted_launches if w != g]
    assert not bad, bad[:5]


@pytest.mark.parametrize("rows", [5, 7, 12])
@pytest.mark.parametrize("name", sorted(DETAILS))
def test_phase2s_backward_over_several_rows_per_program_equals_naive(name, rows, monkeypatch):
    """The row loop of phase 2's backward, where each program takes ⌈R / MAX_PROGRAMS⌉ rows and
    the last program some dead rows (MAX_PROGRAMS 2 over 5, 7 and 12 rows: 3, 4 and 6 per
    program), and phase 1 in query groups summed chunk by chunk: every gradient equals naive's."""
    monkeypatch.setattr(fused_launch, "MAX_PROGRAMS", 2)
    monkeypatch.setattr(fused_launch, "query_block", lambda m, d: min(m, 2))
    monkeypatch.setattr(test_fused, "B", 1)  # the shape _run builds its inputs at
    monkeypatch.setattr(test_fused, "T", rows)
    ref = _run(_build(name, torch.float32, "naive", 4, 2, True), torch.float32, False)
    got = _run(_build(name, torch.float32, "fused", 4, 2, True), torch.float32, False)
    errs = _errors(ref, got)
    worst = max(errs, key=errs.get)
    assert errs[worst] < 1e-4, (rows, worst, errs[worst])


def test_kernels_command_runs_each_kernel_alone_and_counts_its_bytes():
    """``routerbench kernels`` on a CPU: every kernel of a training step of each router once under the
    interpreter, its counted bytes those its model declares (no line says it differs)."""
    if DEVICE != "cpu":
        pytest.skip("on CUDA the command times the kernels (gpu_check's impls stage runs it)")
    from click.testing import CliRunner

    from harness.cli import main
    res = CliRunner().invoke(main, ["kernels", "--d-model", "32", "--n-layers", "2", "--tokens", "6"])
    assert res.exit_code == 0, res.output
    for router in sorted(DETAILS):
        assert f"{router} fused: " in res.output
    assert "phase2_bwd" in res.output and "phase1_bwd_dot" in res.output and "MB counted" in res.output
    assert "differs from its model" not in res.output


def test_the_warm_up_launches_every_kernel_of_the_captured_step_at_its_shape_before_the_capture():
    """A captured step's eager warm-up (on the graph's side stream, before the pre-flight and the
    capture) launches every fused kernel the capture launches, with the same autotune key (row
    bucket included): on a GPU the autotuner has chosen each config before any capture begins.
    No warm-up is refused."""
    import contextlib

    from harness.step.cudagraph import GraphedStep
    from routers.block.fused_bytes import autotune_key
    from test_backends import FakeGraphAPI, batch, model_for
    events: list = []

    class Api(FakeGraphAPI):
        @staticmethod
        @contextlib.contextmanager
        def stream(s):
            events.append("warm-up")
            yield
            events.append("end")

        @staticmethod
        @contextlib.contextmanager
        def graph(g, stream=None):
            events.append("capture")
            yield
            events.append("end")

    def segment(tag):
        i = events.index(tag)
        return set(events[i + 1:events.index("end", i)])

    x, y = batch()
    with fused_launch.watching(lambda name, d, grid, a, k: events.append((name, grid, autotune_key(name, a, k)))):
        GraphedStep(model_for("haares", "fused"), "fwd_bwd", x, y, api=Api)
    captured = segment("capture")
    assert {e[0] for e in captured} >= {"phase1_fwd", "phase1_bwd", "phase2_fwd", "phase2_bwd"}
    assert captured <= segment("warm-up"), captured - segment("warm-up")
    with pytest.raises(ValueError, match="warmup must be at least 1"):
        GraphedStep(model_for("haares", "fused"), "fwd_bwd", x, y, warmup=0, api=Api)


@pytest.mark.cuda
def test_each_row_bucket_is_tuned_on_its_own():
    """On CUDA the autotuner keys on the row bucket: launches at 64 and at 4,096 rows each get a
    config of their own, so a case timed at many rows is not run with the config of its 128-row
    parity check."""
    if DEVICE != "cuda":
        pytest.skip("needs a CUDA device: the autotuner runs configs on a GPU")
    q = torch.randn(2, D, device=DEVICE)
    for rows in (64, 4096):
        v = torch.randn(1, rows, D, device=DEVICE)
        fused.phase1_op([v, v.clone()], q, None, None, True, True)
    torch.cuda.synchronize()
    tuner = fused_launch._launcher(fused_launch.kernels(), "phase1_fwd", D).__self__
    buckets = {key[3] for key in tuner.cache}  # KEYS["phase1_fwd"]: d, N, n_q, R_BUCKET
    assert {64, 4096} <= buckets, tuner.cache
