"""The ``fused`` impl (routers/block/fused.py, routers/block/fused_kernels.py) under Triton's
interpreter: every router's output and every gradient equal ``naive``'s, its custom ops pass
``torch.library.opcheck``, and planted kernel bugs fail the phase check.

Runs where a CUDA device is, or on CPU with ``TRITON_INTERPRET=1`` (``make test-kernels``);
elsewhere it skips naming that command. Tolerances are harness/sweep/parity.py's: float32 within
1e-4 of naive relative to each quantity's norm; in bfloat16 fused and two_phase are both judged
against naive in float64 on the same values, and fused may err by twice two_phase's bfloat16 error
plus 8e-3.
"""

from __future__ import annotations

import importlib.util
import math
import os
import sys
from pathlib import Path

import pytest
import torch

if importlib.util.find_spec("triton") is None:
    pytest.skip("triton is not installed: make test-kernels installs the kernels extra and runs these",
                allow_module_level=True)
if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("no CUDA device and TRITON_INTERPRET is not 1: make test-kernels runs these under "
                "Triton's interpreter", allow_module_level=True)

from routers import build_router, impls, route  # noqa: E402
from routers.block import fused, fused_interp, fused_launch, phases  # noqa: E402
from routers.block.plan import coefficient_bits  # noqa: E402
from test_lean import tanh_sublayers  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DETAILS = {"block_attnres": 0, "haares": 1, "wav_v1": 2}
B, T, D = 2, 3, 16


def _build(name: str, dtype: torch.dtype, impl: str, layers: int, blocks: int, details: bool) -> torch.nn.Module:
    opts = {}
    if DETAILS[name]:
        opts = {"readout_details": True} if details else {"partial_details": "never"}
    r = build_router(name, D, layers, n_blocks=blocks, impl=impl, key_norm_gain=True, **opts)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in r.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.5)
    return r.to(device=DEVICE, dtype=dtype)


def _run(r, dtype: torch.dtype, region: bool) -> dict[str, torch.Tensor]:
    """Output and the gradients of e, every sublayer output and every router parameter, with
    u = tanh(h W_k) per slot; ``region``: the layer scope's padded pool, driven eagerly."""
    g = torch.Generator().manual_seed(2)
    e = torch.randn(B, T, D, generator=g).to(DEVICE, dtype).requires_grad_()
    weights = [(torch.randn(D, D, generator=g) / math.sqrt(D)).to(DEVICE, dtype) for _ in r.slots]
    us = []
    sublayer = tanh_sublayers(weights, us)
    if region:
        state = r.begin(r.init_state(e, region=True))
        for slot in r.slots:
            role, p = r.role(slot), r.params(state, slot, region=True)
            state = r.write(state, role, p, sublayer(slot, r.read(state, role, p)))
        out = r.output(state, r.output_params(region=True))
    else:
        out = route(r, e, sublayer)[1]
    w = torch.randn(out.shape, generator=torch.Generator().manual_seed(3)).to(DEVICE, dtype)
    (out.float() * w.float()).sum().backward()
    got = {"output": out.detach(), "embedding": e.grad}
    got.update({f"u{i}": u.grad for i, u in enumerate(us)})
    got.update({n: p.grad for n, p in r.named_parameters()})
    return got


def _errors(ref: dict, got: dict) -> dict[str, float]:
    return {k: float((got[k].double() - ref[k].double()).norm() / ref[k].double().norm().clamp_min(1e-30))
            for k in ref}


#: (layers, blocks): partial and completed blocks of equal and unequal lengths
SHAPES = [(4, 2), (3, 2)]


@pytest.mark.parametrize("region", [False, True], ids=["exact_pool", "padded_pool"])
@pytest.mark.parametrize("details", [True, False], ids=["details", "no_details"])
@pytest.mark.parametrize("name", sorted(DETAILS))
def test_fused_equals_naive_in_float32(name, details, region):
    if not DETAILS[name] and not details:
        pytest.skip("block_attnres has no details to turn off")
    for layers, blocks in SHAPES:
        ref = _run(_build(name, torch.float32, "naive", layers, blocks, details), torch.float32, False)
        got = _run(_build(name, torch.float32, "fused", layers, blocks, details), torch.float32, region)
        assert set(got) == set(ref)
        errs = _errors(ref, got)
        worst = max(errs, key=errs.get)
        assert errs[worst] < 1e-4, (layers, blocks, worst, errs[worst])


@pytest.mark.parametrize("name", sorted(DETAILS))
def test_fused_bfloat16_within_the_parity_rule(name):
    """bfloat16: fused's error against naive in float64 is at most twice two_phase's plus 8e-3."""
    ref = _run(_build(name, torch.float64, "naive", 4, 2, True), torch.float64, False)
    ours = _errors(ref, _run(_build(name, torch.bfloat16, "two_phase", 4, 2, True), torch.bfloat16, False))
    got = _errors(ref, _run(_build(name, torch.bfloat16, "fused", 4, 2, True), torch.bfloat16, False))
    for k in ref:
        assert got[k] <= 2 * ours[k] + 8e-3, (k, got[k], ours[k])


def test_fused_is_registered_with_its_routers_and_dtypes():
    impl = impls.get("fused")
    assert impl.routers == ("block_attnres", "haares", "wav_v1") and impl.schedule == "two_phase"
    assert impl.dtypes == ("float32", "bfloat16") and impl.opaque
    assert impl.unavailable_reason(DEVICE, "float32", "fwd_bwd") is None
    assert "float16" in impl.unavailable_reason(DEVICE, "float16", "fwd_bwd")
    r = build_router("haares", D, 4, n_blocks=2, impl="fused")
    assert r.phases is fused.FUSED and r.phases.keeps_updates


# --- opcheck ---------------------------------------------------------------------------------
def _phase_inputs(dtype=torch.float32, n=3, m=2, K=2, p=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    mk = lambda *s: torch.randn(*s, generator=g).to(DEVICE, dtype)  # noqa: E731
    values = [mk(B, T, D) for _ in range(n)]
    inv = [phases.inv_rms(v).float() for v in values]
    updates = [mk(B, T, D) for _ in range(p)]
    bits = coefficient_bits([(1, 1)[:K], (-1, 1)[:K], (1, -1)[:K]][:p], K)
    P = sum(updates)
    details = [sum(u * (1 if (bits >> (i * K + j)) & 1 else -1) for i, u in enumerate(updates)) for j in range(K)]
    q = mk(m, D)
    return dict(values=values, inv=inv, q=q, bias=mk(m, n), updates=updates, bits=bits, P=P, details=details,
                dbias=mk(K) if K else None)


#: what ``torch.library.opcheck`` checks of an op (its result names each check it ran)
OPCHECKS = {"test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic"}


def _opcheck(op, args) -> None:
    result = torch.library.opcheck(op, args)
    assert set(result) == OPCHECKS and set(result.values()) == {"SUCCESS"}, result


def test_custom_ops_pass_opcheck():
    x = _phase_inputs()
    for t in x["values"] + [x["q"]] + x["updates"]:
        t.requires_grad_()
    x["bias"].requires_grad_()
    m, n = x["q"].shape[0], len(x["values"])
    rows = torch.randn(m, 2, device=DEVICE).requires_grad_()  # two detail kinds' bias rows
    codes = torch.tensor([0, 2, 1], device=DEVICE)             # a state source, a kind-2 and a kind-1 detail
    every = torch.arange(1, n + 1, device=DEVICE)              # an (m, n) bias: each source its own column
    _opcheck(fused.phase1_op, (x["values"], x["q"], x["bias"], every, None, True, True))
    _opcheck(fused.phase1_op, (x["values"], x["q"], rows, codes, None, True, True))
    _opcheck(fused.phase1_op, (x["values"][:1], x["q"], rows, None, None, False, True))
    _opcheck(fused.phase1_op, (x["values"], x["q"], x["bias"], every, None, True, False))
    valid = torch.tensor([True, True, False], device=DEVICE)
    _opcheck(fused.phase1_op, (x["values"], x["q"], None, None, valid, True, True))
    out = fused.phase1_op(x["values"], x["q"].detach(), rows.detach(), codes, None, True, True)
    o, mx, s, qc = out[0], out[m].detach(), out[2 * m], out[3 * m]   # qc: the query, then its 2 biases
    assert qc.shape == (D + 2,)
    _opcheck(fused.phase2_op, (o, mx, s, x["q"][0], x["P"], x["details"], x["dbias"], x["updates"], None, x["bits"],
                               0, 2, 4.0))
    _opcheck(fused.phase2_op, (o, mx, s, qc, x["P"], x["details"][1:], None, x["updates"], None, x["bits"], 1, 2, 4.0))
    _opcheck(fused.phase2_op, (o, mx, s, x["q"][0], x["P"], [], None, x["updates"], None, 0, 0, 0, 4.0))
    u = x["updates"][-1]
    _opcheck(fused.phase2_chain_op, (o, mx, s, qc, x["P"], u, x["details"], None, x["updates"], None, x["bits"], 0,
                                     2, 4.0, 2, 0b01))
    _opcheck(fused.phase2_chain_op, (o, mx, s, x["q"][0], x["P"], u, [], None, x["updates"], None, 0, 0, 0, 4.0,
                                     0, 0))
    _opcheck(fused.rms_match_op, (x["details"][0], x["P"], 4.0))


def test_opcheck_fails_an_op_whose_fake_is_wrong():
    """Planted: an op whose fake gives a transposed layout (the bug phase 1's backward once had:
    a ``.t()`` result against a contiguous fake) fails the check above."""
    @torch.library.custom_op("routerbench_test::planted_fake", mutates_args=())
    def planted(x: torch.Tensor) -> torch.Tensor:
        return (x * 2).t()

    @planted.register_fake
    def _(x):
        return x.new_empty((x.shape[1], x.shape[0]))
    with pytest.raises(Exception, match="stride|fake|meta"):
        _opcheck(planted, (torch.randn(3, 4, device=DEVICE),))


# --- planted kernel bugs ---------------------------------------------------------------------
#: a planted bug → (the kernels file, the kernel line it changes, its replacement)
PLANTED = {
    "a dropped source": ("fused_kernels.py", "    acc = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)\n    for i in tl.static_range(N):",
                         "    acc = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)\n    for i in tl.static_range(N - 1):"),
    "a detail without its bias": ("fused_kernels_merge.py", "        l_d += tl.load(bias + kk,",
                                  "        l_d += 0.0 * tl.load(bias + kk,"),
    "a max not subtracted": ("fused_kernels.py", "        m_safe = tl.where(m_new == NEG_INF, 0.0, m_new)",
                             "        m_safe = 0.0 * m_new"),
}


def _mutant(name: str, tmp_path: Path):
    """The kernels with one planted bug in a copy of its file (Triton reads a kernel's source from its
    file), the other file as it is."""
    file, old, new = PLANTED[name]
    src = Path(fused_launch.__file__).with_name(file).read_text()
    assert src.count(old) == 1, f"the planted bug {name!r} no longer matches the kernels"
    path = tmp_path / f"planted_{abs(hash(name))}.py"
    path.write_text(src.replace(old, new))
    return fused_interp.load_kernels({file: str(path)}, tag=path.stem)


def phase_error(mod) -> float:
    """The worst relative error of the kernels of ``mod`` against the plain phases, over phase 1
    (o, μ, s, with logits large enough that an unshifted exponential overflows float32) and
    phase 2 with two detail kinds and their biases."""
    x = _phase_inputs(K=2, p=3)
    q = x["q"] * 40.0
    codes = torch.arange(1, len(x["values"]) + 1, device=DEVICE)  # each source its own bias column
    *lists, inv = fused_launch.run_phase1(mod, x["values"], q, x["bias"], codes, None, True, True)
    got = [torch.stack(t) for t in lists]
    o_ref, mx_ref, s_ref = phases.phase1(q, x["bias"], x["values"], x["inv"], None)
    copies = torch.cat((q, x["bias"]), dim=1)  # each query, then its bias row
    errs = [float((a - b).norm() / b.norm()) for a, b in ((got[0], o_ref), (got[1], mx_ref), (got[2], s_ref),
                                                          (got[3], copies), (inv, torch.stack(x["inv"])))]
    o, mx, s = (t[1].contiguous() for t in (o_ref, mx_ref, s_ref))
    mx = mx - 4.0  # o's weight lowered, so that the details' weights are not negligible
    dbias = torch.tensor([1.5, -2.0], device=DEVICE)  # -2: the detail bias's initial value
    h = fused_launch.run_phase2(mod, o, mx, s, x["q"][1], x["P"], x["details"], dbias, 4.0)[0]
    h_ref = phases.merge(o, mx, s, x["q"][1], x["P"], x["details"], dbias, 4.0)
    errs.append(float((h - h_ref).norm() / h_ref.norm()))
    return max(math.inf if math.isnan(e) else e for e in errs)


def test_the_kernels_pass_the_phase_check():
    assert phase_error(fused_launch.kernels()) < 1e-5


@pytest.mark.parametrize("bug", sorted(PLANTED))
def test_a_planted_kernel_bug_fails_the_phase_check(bug, tmp_path):
    assert phase_error(_mutant(bug, tmp_path)) > 1e-3, bug


def test_phase1_in_query_groups_equals_plain():
    """d = 1024, m = 8: four queries per program, two programs per row (``fused_launch.query_block``),
    whose gradients of the sources and inverse RMS the launcher sums."""
    d, m, n = 1024, 8, 3
    assert fused_launch.query_block(m, d) == 4
    g = torch.Generator().manual_seed(5)
    values = [torch.randn(1, 2, d, generator=g).to(DEVICE).requires_grad_() for _ in range(n)]
    q = (torch.randn(m, d, generator=g) / 8).to(DEVICE).requires_grad_()
    bias = torch.randn(m, n, generator=g).to(DEVICE).requires_grad_()
    w = torch.randn(m, 1, 2, d, generator=g).to(DEVICE)
    out = []
    for ph in (fused.FUSED, phases.PLAIN):
        inv = [ph.inv_rms(v) for v in values]
        o, mx, s = ph.phase1(q, bias, values, inv, None)[:3]
        o, s = torch.stack(tuple(o)), torch.stack(tuple(s))
        loss = (o * w).sum() + (s * w[:, :, :, 0]).sum()
        out.append([o.detach(), torch.stack(tuple(mx)), s.detach(), *torch.autograd.grad(loss, [*values, q, bias])])
    for got, ref in zip(*out):
        assert float((got - ref).norm() / ref.norm()) < 1e-5


@pytest.mark.compile
@pytest.mark.parametrize("scope", ["model", "layer"])
def test_fused_compiles_as_opaque_ops_under_both_scopes(scope):
    """Inductor, model and layer scope: the custom ops are opaque calls (no graph break), and the
    compiled step's output and every gradient equal eager's (norm-relative 1e-5); a second step
    compiles nothing."""
    from harness.step import backends
    from workloads.config import DecoderConfig
    from workloads.decoder import Decoder
    cfg = DecoderConfig(vocab_size=32, d_model=16, n_layers=4, n_heads=2, seq_len=8, batch_size=2)
    torch.manual_seed(0)
    model = Decoder(cfg, "haares", {"impl": "fused", "n_blocks": 2, "readout_details": True}).to(DEVICE)
    with torch.no_grad():
        for p in model.router.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=torch.Generator().manual_seed(3)).to(DEVICE))
    x = torch.randint(0, 32, (2, 8), generator=torch.Generator().manual_seed(1)).to(DEVICE)

    def loss_and_grads(m):
        m.zero_grad()
        out = m(x)
        out.square().sum().backward()
        return out.detach(), [p.grad.clone() for p in m.parameters()]
    ref, gref = loss_and_grads(model)
    compiled = backends.prepare(model, "compile", "default", scope).model
    got, grads = loss_and_grads(compiled)
    assert backends.graph_breaks() == 0
    rel = lambda a, b: float((a - b).norm() / b.norm().clamp_min(1e-30))  # noqa: E731
    assert rel(got, ref) <= 1e-5 and len(grads) == len(gref)
    assert max(rel(a, b) for a, b in zip(grads, gref)) <= 1e-5
    with torch._dynamo.config.patch(error_on_recompile=True):
        again, _ = loss_and_grads(compiled)
    assert rel(again, got) <= 1e-6
    torch._dynamo.reset()


@pytest.mark.parametrize("name", sorted(DETAILS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_live_state_model_equals_measured_state(name, dtype):
    """``live_state_bytes(impl="fused")`` (routers/block/costs.py) against the peak of the state's
    distinct storages over a forward (tests/test_costs.py's measure, on CPU tensors: the
    interpreter), 5 layers in 2 and 3 blocks."""
    if DEVICE != "cpu":
        pytest.skip("the state measure of tests/test_costs.py builds CPU tensors")
    sys.path.insert(0, str(Path(__file__).parent))
    from test_costs import measured_peak_state
    for blocks in (2, 3):
        opts = {"readout_details": True} if DETAILS[name] else {}
        r = build_router(name, D, 5, n_blocks=blocks, impl="fused", **opts).to(DEVICE, dtype)
        assert r.live_state_bytes(2, 3, dtype) == measured_peak_state(r, 2, 3, dtype)


@pytest.mark.cuda
@pytest.mark.parametrize("name", sorted(DETAILS))
def test_fused_on_cuda_equals_naive_and_replays_from_a_cuda_graph(name):
    """On a GPU, at d = 1024 (query groups, the configs of that width, autotuned on the first call):
    output and gradients in bfloat16 within the parity rule against naive in float64, and one
    ``fwd_bwd`` step captured in a CUDA graph after an eager warm-up (which autotunes) replays to
    the eager step's output and gradients."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    d, layers = 1024, 4
    g = torch.Generator().manual_seed(7)
    base = build_router(name, d, layers, n_blocks=2, key_norm_gain=True)
    with torch.no_grad():
        for p in base.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.5)
    e0 = torch.randn(2, 64, d, generator=g)
    ws = [torch.randn(d, d, generator=g) / math.sqrt(d) for _ in base.slots]

    def model(impl, dtype):
        r = build_router(name, d, layers, n_blocks=2, key_norm_gain=True, impl=impl)
        r.load_state_dict(base.state_dict())
        return r.to("cuda", dtype)

    def step(r, e, weights):
        out = route(r, e, lambda slot, h: torch.tanh(h @ weights[slot.index]))[1]
        loss = out.float().square().mean()
        grads = torch.autograd.grad(loss, [e, *r.parameters()])
        return [out.detach(), *grads]
    ref = step(model("naive", torch.float64), e0.to("cuda", torch.float64).requires_grad_(),
               [w.to("cuda", torch.float64) for w in ws])
    errs = {}
    for impl in ("two_phase", "fused"):
        got = step(model(impl, torch.bfloat16), e0.to("cuda", torch.bfloat16).requires_grad_(),
                   [w.to("cuda", torch.bfloat16) for w in ws])
        errs[impl] = [float((a.double() - b).norm() / b.norm()) for a, b in zip(got, ref)]
    assert all(f <= 2 * t + 8e-3 for f, t in zip(errs["fused"], errs["two_phase"])), errs
    r = model("fused", torch.bfloat16)
    e = e0.to("cuda", torch.bfloat16).requires_grad_()
    wb = [w.to("cuda", torch.bfloat16) for w in ws]
    eager = step(r, e, wb)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            step(r, e, wb)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step(r, e, wb)
    graph.replay()
    torch.cuda.synchronize()
    for a, b in zip(captured, eager):
        assert torch.equal(a, b) or float((a.float() - b.float()).norm() / b.float().norm()) < 1e-3


def test_a_block_of_18_sublayers_rebuilds_its_details_from_34_coefficient_bits():
    """wav_v1, 9 layers in one block: phase 2's backward decodes update i's coefficient in kind j
    from bit 2i + j of an int past 32 bits (an int32 shift would be undefined there)."""
    ref = _run(_build("wav_v1", torch.float32, "naive", 9, 1, True), torch.float32, False)
    got = _run(_build("wav_v1", torch.float32, "fused", 9, 1, True), torch.float32, False)
    errs = _errors(ref, got)
    assert max(errs.values()) < 1e-4, max(errs, key=errs.get)


@pytest.mark.slow
def test_a_tiny_sweep_checks_fused_parity_and_records_its_kernel_bytes(tmp_path):
    """``routerbench run`` of haares naive and fused on this device: fused passes the parity check
    against naive before it is timed, and its rows carry ``router_io_kernel`` beside
    ``router_io_ideal``."""
    from click.testing import CliRunner

    from harness.cli import main
    from harness.rundir.records import load_rows
    res = CliRunner().invoke(main, ["run", "--routers", "prenorm,haares", "--impls", "naive,fused", "--widths", "16",
                                    "--depths", "2", "--seq-len", "8", "--batch-size", "2", "--modes", "fwd_bwd",
                                    "--repeats", "2", "--max-attempts", "1", "--warmup-s", "0", "--backends", "eager",
                                    "--no-train", "--no-report", "--quiet", "--out", str(tmp_path), "--run-id", "t"],
                             catch_exceptions=False)
    assert res.exit_code == 0, res.output
    rows = [r for r in load_rows([next(tmp_path.glob("*/t"))]) if r.get("impl") == "fused"]
    by = {r["metric"]: r for r in rows}
    assert by["parity_error"]["status"] == "ok" and by["parity_error"]["value"] < 1e-4
    assert by["step_time"]["status"] == "ok"
    assert 0 < by["router_io_kernel"]["value"] and by["router_io_ideal"]["value"] > 0


def test_a_fully_masked_pool_gives_zeros_and_finite_gradients_through_both_phases():
    """Phase 1 over a pool whose every source is a pad: o = 0, μ = −inf, s = 0; phase 2 then gives o
    no weight, and every gradient (sources, query, P) is finite, none NaN."""
    g = torch.Generator().manual_seed(4)
    vals = [torch.randn(1, 2, D, generator=g).to(DEVICE).requires_grad_() for _ in range(3)]
    q = torch.randn(2, D, generator=g).to(DEVICE).requires_grad_()
    P = torch.randn(1, 2, D, generator=g).to(DEVICE).requires_grad_()
    outs, mx, s, qc = fused.phase1(q, None, vals, [fused.inv_rms(v) for v in vals],
                                   torch.zeros(3, dtype=torch.bool, device=DEVICE))
    mx, s = torch.stack(mx), torch.stack(s)
    assert float(outs[0].abs().max()) == 0.0 and bool((mx == float("-inf")).all()) and float(s.abs().max()) == 0.0
    h = fused.merge(outs[0], mx[0], s[0], qc[0], P, [], None, 4.0, updates=[P], coefs=0, kinds=slice(0, 0))
    torch.testing.assert_close(h, P)  # o has no weight: h is P
    (h * torch.randn(h.shape, generator=g).to(DEVICE)).sum().backward()
    for t in (*vals, q, P):
        assert bool(torch.isfinite(t.grad).all())
