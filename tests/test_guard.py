"""The capture-safety guard (:mod:`harness.step.guard`; MEASUREMENT.md, "CUDA graphs"): planted
violations of each kind are found at their file and line, clean code gives nothing, every router ×
impl × mode × compile scope is capture-safe, and a ``cudagraph`` case on a CPU names in its
``skipped`` row what would break its capture."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import torch

from harness.rundir.records import load_rows
from harness.rundir.writer import RunWriter
from harness.step import cudagraph
from harness.step.cudagraph import CaptureError, preflight
from harness.step.guard import Finding, capture_findings, format_findings
from harness.step.modes import make_optimizer, make_step, prefill_for_decode
from harness.sweep.cases import expand
from harness.sweep.options import SweepOptions
from harness.sweep.run import run_sweep
from harness.timing.timer import TimingPolicy
from routers import ROUTERS, impls, router_options
from routers.fixed import PreNorm
from routers.registry import register
from workloads.config import DecoderConfig
from workloads.decoder import Decoder, Regions

HERE = "tests/test_guard.py"
LINES = Path(__file__).read_text().splitlines()
CFG = DecoderConfig(vocab_size=32, d_model=16, n_layers=2, n_heads=2, seq_len=8, batch_size=2)
FAST = SweepOptions(flops=False, timing=TimingPolicy(warmup_min_count=1, warmup_min_s=0.0, repeats=2),
                    max_attempts=1)
#: Options that keep the matrix small without changing its structure (tests/test_backends.py SMALL).
SMALL = {"mhc": {"sk_iters": 3}}


def line_of(marker: str) -> int:
    """The line of this file that ends with ``# <marker>`` (a planted statement)."""
    hits = [n for n, text in enumerate(LINES, 1) if text.rstrip().endswith(f"# {marker}")]
    assert len(hits) == 1, (marker, hits)
    return hits[0]


def keys(findings: list[Finding]) -> list[tuple[str, str, int]]:
    return [(f.kind, f.file, f.line) for f in findings]


# --- planted violations, one per statement -------------------------------------------------------
def _plants(t: torch.Tensor) -> dict:
    return {
        "list": lambda: t[[0, 1]],  # PLANT:list
        "tuple_list": lambda: t[:, [0, 1]],  # PLANT:tuple_list
        "set_list": lambda: t.detach().__setitem__([0, 1], 0.0),  # PLANT:set_list
        "tensor": lambda: torch.tensor([1.0]),  # PLANT:tensor
        "arange": lambda: torch.arange(3),  # PLANT:arange
        "zeros": lambda: torch.zeros(2),  # PLANT:zeros
        "item": lambda: t.sum().item(),  # PLANT:item
        "tolist": lambda: t.tolist(),  # PLANT:tolist
        "nonzero": lambda: torch.nonzero(t),  # PLANT:nonzero
        "mask": lambda: t[t > 0],  # PLANT:mask
        "if_tensor": lambda: 1 if t.sum() > 0 else 0,  # PLANT:if_tensor
    }


KIND = {"list": "list_index", "tuple_list": "list_index", "set_list": "list_index", "tensor": "host_tensor",
        "arange": "host_tensor", "zeros": "host_tensor", "item": "host_sync", "tolist": "host_sync",
        "nonzero": "host_sync", "mask": "host_sync", "if_tensor": "host_sync"}


@pytest.mark.parametrize("name", list(KIND))
def test_a_planted_violation_is_found_at_its_line(name):
    """Exactly one finding, of its kind, at the planted line of this file (a list index's
    ``lift_fresh`` is folded into its ``list_index`` finding)."""
    t = torch.randn(4, 3)
    found = capture_findings(_plants(t)[name])
    assert keys(found) == [(KIND[name], HERE, line_of(f"PLANT:{name}"))], format_findings(found)
    assert str(found[0]).startswith(f"{HERE}:{line_of(f'PLANT:{name}')}: {KIND[name].replace('_', ' ')}: ")


def test_the_list_index_finding_reads_as_documented():
    t = torch.randn(3)
    found = capture_findings(lambda: t[[0, 1]])  # PLANT:doc
    want = f"{HERE}:{line_of('PLANT:doc')}: list index: Tensor.__getitem__ with a Python list"
    assert format_findings(found) == want


def test_a_factory_on_another_device_is_found_and_on_the_steps_is_not():
    def step():
        torch.zeros(2, device="cpu")
        torch.ones(2, device="meta")  # PLANT:meta
    assert keys(capture_findings(step)) == [("host_tensor", HERE, line_of("PLANT:meta"))]
    assert capture_findings(lambda: torch.zeros(2), device="meta")[0].detail == "torch.zeros without a device"


def test_findings_are_deduplicated_in_order_of_first_occurrence():
    t = torch.randn(4, 3)

    def step():
        for _ in range(3):
            t.sum().item()  # PLANT:loop_item
            t[[0]]  # PLANT:loop_list
    assert keys(capture_findings(step)) == [("host_sync", HERE, line_of("PLANT:loop_item")),
                                           ("list_index", HERE, line_of("PLANT:loop_list"))]


class _HostInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        g.sum().item()  # PLANT:backward
        return g * 2


def test_the_backward_of_a_custom_function_is_seen_at_its_line():
    x = torch.randn(3, requires_grad=True)

    def step():
        _HostInBackward.apply(x).sum().backward()
    found = capture_findings(step)
    assert keys(found) == [("host_sync", HERE, line_of("PLANT:backward"))], format_findings(found)
    assert "in the backward" in found[0].detail


def test_a_clean_step_has_no_finding():
    x = torch.randn(2, 4, 3, requires_grad=True)
    buf = torch.tensor([0, 2])  # an integer index buffer made outside the step

    def step():
        a = x.new_zeros(2, 3) + x[:, 1] + x[0, :, :].sum(0)
        b = x[:, 1:3].sum() + x[..., 0].sum() + x[1][2][0]
        c = x.index_select(1, buf).sum() + x[:, buf].sum() + torch.zeros(2, device=x.device).sum()
        d = torch.zeros_like(x).sum() + torch.full_like(x, 2.0).sum() + torch.as_tensor(x).sum()
        (a.sum() + b + c + d).backward()
    assert capture_findings(step) == []


# --- planted in a real model -----------------------------------------------------------------
class _ListReadPreNorm(PreNorm):
    """PreNorm whose read gathers the batch rows with a Python list (the same rows)."""

    def read(self, state, role, params):
        return state[list(range(state.shape[0]))]  # PLANT:read


def test_a_list_index_in_a_router_of_a_real_model_is_found_in_its_file():
    torch.manual_seed(0)
    model = Decoder(CFG, _ListReadPreNorm(CFG.d_model, CFG.n_layers))
    x = torch.randint(0, 32, (2, 8))
    found = capture_findings(make_step(model, "fwd_bwd", x, torch.roll(x, -1, 1)))
    assert keys(found) == [("list_index", HERE, line_of("PLANT:read"))], format_findings(found)


def test_a_list_index_after_the_forward_of_a_real_model_is_found():
    torch.manual_seed(0)
    model = Decoder(CFG, "prenorm")
    x = torch.randint(0, 32, (2, 8))

    def step():
        return model(x)[:, [0, 1]]  # PLANT:after
    assert keys(capture_findings(step)) == [("list_index", HERE, line_of("PLANT:after"))]


# --- every router, impl, mode and compile scope ------------------------------------------------
MATRIX_CFG = DecoderConfig(vocab_size=32, d_model=16, n_layers=2, n_heads=2, seq_len=8, batch_size=2)
PAIRS = [(n, i) for n in sorted(ROUTERS) for i in ROUTERS[n].impls if impls.get(i).builtin]


def _matrix_model(name: str, impl: str) -> Decoder:
    torch.manual_seed(0)
    opts = {"impl": impl} if "impl" in router_options(name) else {}
    opts.update(SMALL.get(name, {}))
    model = Decoder(MATRIX_CFG, name, opts)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # non-trivial router parameters (zero queries make every mix uniform)
        for p in model.router.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype))
    return model


@pytest.mark.parametrize("scope", ["model", "layer"])
@pytest.mark.parametrize("mode", ["fwd", "fwd_bwd", "decode", "train_step"])
@pytest.mark.parametrize("name,impl", PAIRS)
def test_every_router_impl_mode_scope_is_capture_safe(name, impl, mode, scope):
    """The step the ``cudagraph`` backend would capture (``layer``: the region forms, run eagerly)
    has no host sync, no host tensor and no list index anywhere in the project's code."""
    model = _matrix_model(name, impl)
    x = torch.randint(0, 32, (2, 8), generator=torch.Generator().manual_seed(2))
    if scope == "layer":
        model.regions = Regions()
    decode_input = prefill_for_decode(model, x) if mode == "decode" else None
    optimizer = make_optimizer(model, capturable=False) if mode == "train_step" else None
    step = make_step(model, mode, x, torch.roll(x, -1, 1), decode_input=decode_input, optimizer=optimizer)
    try:
        found = capture_findings(step)
    except NotImplementedError as exc:  # a router without a region form names --compile-scope model
        pytest.skip(f"{name} has no region form: {exc}")
    assert found == [], f"{name} {impl} {mode} {scope}:\n" + format_findings(found)


# --- the sweep on a CPU ----------------------------------------------------------------------
@pytest.fixture
def planted_router():
    """``planted_list_read``: a registered router whose read indexes with a Python list; removed
    from the registry afterwards."""
    name = "planted_list_read"

    class Planted(_ListReadPreNorm):
        pass

    register(name)(Planted)
    try:
        yield name
    finally:
        ROUTERS.pop(name, None)


def test_a_cudagraph_case_on_a_cpu_names_what_would_break_its_capture(tmp_path, planted_router, capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the case is captured, not skipped")
    cases = expand([planted_router, "prenorm"], CFG, [16], [2], ["fwd_bwd"], backends=["cudagraph"])
    with RunWriter(tmp_path, "run", "s") as w:
        assert run_sweep(cases, torch.device("cpu"), w, FAST, progress=False) == {"resumed": 0, "skipped": 2}
    rows = pd.DataFrame(load_rows([tmp_path])).set_index("router")
    assert (rows.status == "skipped").all() and (rows.metric == "step_time").all()
    planted, clean = rows.error[planted_router], rows.error["prenorm"]
    where = f"{HERE}:{line_of('PLANT:read')}: list index"
    assert "no CUDA device" in planted and where in planted, planted
    assert "no CUDA device" in clean and "capture pre-flight on CPU: no finding" in clean, clean
    err = capsys.readouterr().err
    assert where in err and "prenorm" not in err
    # a run that timed nothing still gets its report, which names the finding (it crashed once)
    from reports.report import build_report
    assert where in build_report([tmp_path])["report.md"].read_text()


def test_the_findings_stay_off_stderr_when_quiet(tmp_path, planted_router, capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the case is captured, not skipped")
    cases = expand([planted_router], CFG, [16], [2], ["fwd"], backends=["cudagraph"])
    quiet = SweepOptions(flops=False, max_attempts=1, quiet=True)
    with RunWriter(tmp_path, "run", "s") as w:
        assert run_sweep(cases, torch.device("cpu"), w, quiet, progress=False) == {"resumed": 0, "skipped": 1}
    assert "list index" in pd.DataFrame(load_rows([tmp_path])).error.iloc[0]
    assert "list index" not in capsys.readouterr().err


# --- the CUDA pre-flight names the line too ---------------------------------------------------
def test_the_preflight_error_text_lists_the_findings_and_never_masks_the_error(monkeypatch):
    t = torch.randn(3)
    text = cudagraph._findings_of(lambda: t[[0, 1]], torch.device("cpu"))  # PLANT:preflight_text
    assert f"{HERE}:{line_of('PLANT:preflight_text')}: list index" in text
    assert cudagraph._findings_of(lambda: t[0:1], torch.device("cpu")) == ""

    def broken(*a, **k):
        raise RuntimeError("the guard itself failed")
    monkeypatch.setattr(cudagraph, "capture_findings", broken)
    assert cudagraph._findings_of(lambda: None, torch.device("cpu")) == ""


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_failing_cuda_preflight_names_the_file_and_line():
    t = torch.randn(3, device="cuda")
    with pytest.raises(CaptureError) as err:
        preflight(lambda: t.sum().item(), torch.device("cuda"))  # PLANT:cuda_item
    assert "synchronises with the host" in str(err.value)
    assert f"{HERE}:{line_of('PLANT:cuda_item')}: host sync" in str(err.value)


def test_a_script_outside_the_checkout_is_named_by_its_absolute_path(tmp_path):
    """A researcher's own step, in a file anywhere: the finding names that file and line."""
    import importlib.util
    script = tmp_path / "mystep.py"
    script.write_text("import torch\nt = torch.randn(4)\n\n\ndef step():\n    return t[[0, 1]]\n")
    spec = importlib.util.spec_from_file_location("mystep", script)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    (f,) = capture_findings(mod.step)
    assert (f.kind, f.file, f.line) == ("list_index", str(script.resolve()), 6)


def _tiny_run(tmp_path, *args):
    """``routerbench run`` at a tiny shape, in process, with ``args`` (routers, backends, …)."""
    from click.testing import CliRunner

    from harness.cli import main
    return CliRunner().invoke(main, [
        "run", *args, "--widths", "16", "--depths", "2", "--n-heads", "2", "--seq-len", "8", "--batch-size", "2",
        "--modes", "fwd_bwd", "--no-train", "--no-flops", "--repeats", "3", "--quiet", "--out", str(tmp_path)])


def test_a_cudagraph_only_run_on_a_cpu_says_why_and_still_reports(tmp_path):
    """The command a researcher without a GPU types to see what would break a capture: it ends
    with each skip reason on the terminal and writes its report (whose implementations table once
    crashed on a run with no timing at all)."""
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the cases are captured, not skipped")
    res = _tiny_run(tmp_path, "--routers", "prenorm,block_attnres", "--impls", "naive,two_phase",
                    "--backends", "cudagraph")
    assert res.exit_code == 1, res.output  # it ran, but timed nothing: said in one line, non-zero
    assert res.output.strip().splitlines()[-1].startswith("routerbench: nothing was timed: every cost case was "
                                                          "skipped or failed")
    assert res.output.strip().endswith("on a cpu use --backends eager or compile (cudagraph captures CUDA work)")
    assert "cost sweep: 0 resumed, 3 skipped" in res.output
    assert "skipped (3): cudagraph captures CUDA work: no CUDA device here, nothing timed; capture " \
           "pre-flight on CPU: no finding" in res.output
    (report,) = tmp_path.glob("*/*/report.md")
    assert "capture pre-flight on CPU: no finding" in report.read_text()


def test_nothing_timed_names_the_option_that_skipped_it(tmp_path):
    """Every case skipped for reduce-overhead without CUDA: the last line names --compile-modes,
    the option that made them skip (it used to name --backends, which the user had right)."""
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: reduce-overhead runs")
    from harness.cli.run import what_to_change
    res = _tiny_run(tmp_path, "--routers", "prenorm", "--backends", "compile", "--compile-modes", "reduce-overhead")
    assert res.exit_code == 1, res.output
    last = res.output.strip().splitlines()[-1]
    assert last.endswith("on a cpu use --compile-modes default or max-autotune-no-cudagraphs (reduce-overhead "
                         "uses CUDA graphs)"), last
    assert "--backends" not in last
    (run_dir,) = tmp_path.glob("*/*")
    assert what_to_change(run_dir) == ("use --compile-modes default or max-autotune-no-cudagraphs (reduce-overhead "
                                       "uses CUDA graphs)")
