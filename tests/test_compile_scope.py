"""The layer compile scope (DESIGN.md, "Backends and modes"; docs/SWEEPS.md, "Compile scopes"): the region
path computes what the plain forward computes, its regions depend on the slot's role and not on
its index (so their count does not grow with depth), a compiled region compiles exactly once, a
fall-back to eager is an ``error`` row, and compiled steps of both scopes equal eager."""

from __future__ import annotations

import pytest
import torch

from harness.rundir.writer import MemoryWriter
from harness.step import backends
from harness.sweep import prepare
from harness.sweep.cases import Case
from harness.sweep.options import SweepOptions
from harness.sweep.unit import measure_unit
from harness.timing.timer import TimingPolicy
from routers import ROUTERS, build_router
from routers.block.phases import phase1
from routers.block.plan import code_bias
from workloads.config import DecoderConfig
from workloads.decoder import Decoder, Regions, region_count

CPU = torch.device("cpu")
BLOCK = ("block_attnres", "haares", "wav_v1")
VARIANTS = [(n, i) for n in sorted(ROUTERS) for i in ROUTERS[n].impls]
#: The Inductor cases ``make test`` runs (the rest need ``--compile-matrix``, tests/conftest.py):
#: the PreNorm path, a two-phase padded pool, a naive tuple of sources with details, and lean's
#: Functions on the padded pool with its register of updates.
IN_CI = {("prenorm", "naive"), ("block_attnres", "two_phase"), ("haares", "two_phase"), ("wav_v1", "naive"),
         ("wav_v1", "lean")}


def matrix(pairs):
    """``pairs`` as parameters, those outside :data:`IN_CI` marked ``compile_matrix``."""
    return [pytest.param(n, i, marks=() if (n, i) in IN_CI else pytest.mark.compile_matrix) for n, i in pairs]
#: Regions of the layer scope by the slot structure: init and head, plus one per sublayer role.
#: PreNorm's family reads and writes alike at every slot (attention and MLP: 2 roles); a block
#: router's two-phase roles (``lean``'s too: its register of updates has the block's length) are
#: the attention at a block start, an attention and an MLP inside a
#: block, the MLP that ends a block (phase 1 of the next), the one that ends the last (5); naive's
#: tuple grows by a block at a time, so its 4 roles repeat per block (4 N).
STATED = {"prenorm": 4, "rezero": 4, "layerscale": 4,
          # stream routers: attention, MLP, and (dynamic ones) the last MLP, which computes no
          # next coefficients; denseformer: add, DWA, the last DWA
          "shc": 4, "dhc": 5, "mhc": 5, "denseformer": 5, ("two_phase", 2): 7, ("lean", 2): 7, ("naive", 2): 10}


def stated(name: str, impl: str) -> int:
    """The stated region count of ``name`` (a block router's: its impl's at n_blocks=2).

    Raises:
        KeyError: naming the router to add to :data:`STATED` (a new router states its count).
    """
    from routers.impls import BLOCK_ROUTERS
    key = (impl, 2) if name in BLOCK_ROUTERS else name
    if key not in STATED:
        raise KeyError(f"{name}: add its region count of the layer scope (init, head, one per role) "
                       "to STATED in tests/test_compile_scope.py")
    return STATED[key]


FAST = SweepOptions(flops=False, memory=False, max_attempts=1,
                    timing=TimingPolicy(warmup_min_count=1, warmup_min_s=0.0, repeats=2))


def _options(name: str, impl: str, n_blocks: int = 2) -> dict:
    opts = {"impl": impl} if len(ROUTERS[name].impls) > 1 else {}
    return {**opts, "n_blocks": n_blocks} if name in BLOCK else opts


def _randomised(model: Decoder) -> Decoder:
    """Router parameters away from their init (zero queries make every mix uniform)."""
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in model.router.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return model


def _loss_and_grads(model: Decoder, x: torch.Tensor) -> tuple[torch.Tensor, dict]:
    model.zero_grad()
    out = model(x)
    out.square().sum().backward()
    return out.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


@pytest.mark.parametrize("name,impl", VARIANTS)
def test_the_region_path_equals_the_plain_forward_in_float64(name, impl):
    """Regions run eagerly (no compile): output and every gradient as the plain forward, with 2
    blocks and the details on; the two-phase pool is padded and newest-first, so only the
    summation order differs."""
    cfg = DecoderConfig(vocab_size=32, d_model=16, n_layers=4, n_heads=2, seq_len=8, batch_size=2,
                        dtype="float64")
    torch.manual_seed(0)
    model = _randomised(Decoder(cfg, name, _options(name, impl)))
    x = torch.randint(0, 32, (2, 8))
    ref, gref = _loss_and_grads(model, x)
    model.regions = Regions()
    got, grads = _loss_and_grads(model, x)
    assert _rel(got, ref) < 1e-12
    assert max(_rel(grads[k], gref[k]) for k in gref if gref[k].abs().sum() > 0) < 1e-10
    assert len(model.regions.roles) + 2 == region_count(model.router)


@pytest.mark.parametrize("name,impl", VARIANTS)
def test_the_region_path_decodes_as_the_plain_forward(name, impl):
    """``decode`` under the layer scope: the same regions (of the decoded token's shape) read the
    KV cache the eager prefill filled; logits as the plain forward's decode, float64."""
    from harness.step.modes import prefill_for_decode
    cfg = DecoderConfig(vocab_size=32, d_model=16, n_layers=4, n_heads=2, seq_len=8, batch_size=2,
                        dtype="float64")
    torch.manual_seed(0)
    model = _randomised(Decoder(cfg, name, _options(name, impl)))
    tok, pos = prefill_for_decode(model, torch.randint(0, 32, (2, 8)))
    with torch.no_grad():
        ref = model(tok, pos)
        model.regions = Regions()
        got = model(tok, pos)
    assert got.shape == (2, 1, 32) and _rel(got, ref) < 1e-12


@pytest.mark.parametrize("name,impl", [v for v in VARIANTS if v[0] != "full_attnres"])
def test_region_counts_do_not_grow_with_depth(name, impl):
    counts = {L: region_count(build_router(name, 16, L, **_options(name, impl))) for L in (4, 8, 16)}
    want = stated(name, impl)
    assert counts == {4: want, 8: want, 16: want}


def test_full_attnres_is_the_one_router_whose_regions_grow():
    """One sublayer per block: every slot adds a source, so its naive tuple has 2L lengths."""
    assert [region_count(build_router("full_attnres", 16, L)) for L in (2, 4)] == [4 + 2, 8 + 2]


def test_the_padded_pool_keeps_each_source_in_a_storage_of_its_own():
    """The layout a backward that saves each completed source once needs: in the state after
    every write, each source is one tensor with a storage of its own, and every pad a view of
    the one zero storage (so the pool's storages are the sources plus one)."""
    r = build_router("haares", 8, 4, n_blocks=2, impl="two_phase")
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        st = r.begin(r.init_state(torch.randn(2, 3, 8, generator=g), region=True))
        for slot in r.slots:
            role, p = r.role(slot), r.params(st, slot, region=True)
            st = r.write(st, role, p, torch.randn(2, 3, 8, generator=g))
            valid = int(st.valid.sum())
            storages = {v.untyped_storage().data_ptr() for v in st.values}
            pads = {v.untyped_storage().data_ptr() for v, ok in zip(st.values, st.valid) if ok == 0}
            assert len(st.values) == r.plan.capacity == 5
            assert len(storages) == valid + (1 if pads else 0) and len(pads) <= 1


def test_masked_phase1_flops_are_what_the_padded_phase1_adds():
    from torch.utils.flop_counter import FlopCounterMode

    from harness.costs.flop_counter import FORMULAS

    def flops(fn) -> int:
        with FlopCounterMode(display=False, custom_mapping=FORMULAS) as f:
            fn()
        return sum(f.get_flop_counts()["Global"].values())

    for name, L in (("block_attnres", 6), ("haares", 4), ("wav_v1", 4)):
        r = build_router(name, 8, L, n_blocks=2 if name != "block_attnres" else 3, impl="two_phase")
        K, n_cap, B, T = len(r.detail_kinds), r.plan.capacity, 2, 3
        src = [torch.randn(B, T, 8) for _ in range(n_cap)]
        inv = [torch.rand(B, T) for _ in range(n_cap)]
        extra = 0
        for b in range(2, r.n_blocks + 1):
            m, valid = sum(s.block == b for s in r.slots), 1 + (b - 1) * (1 + K)
            q, rows = torch.randn(m, 8), torch.randn(m, K) if K else None
            mask = torch.tensor([True] * valid + [False] * (n_cap - valid))
            bias = {n: None if rows is None else code_bias(rows, r.plan_codes[r.plan.pool_codes[n]])
                    for n in (valid, n_cap)}
            padded = flops(lambda: phase1(q, bias[n_cap], tuple(src), tuple(inv), mask))
            compact = flops(lambda: phase1(q, bias[valid], tuple(src[:valid]), tuple(inv[:valid]), mask[:valid]))
            extra += padded - compact
        assert extra == r.masked_phase1_flops(B, T) > 0, name


def test_live_state_of_the_padded_layout_is_what_it_holds():
    r = build_router("wav_v1", 8, 4, n_blocks=2, impl="two_phase")
    B, T = 2, 3
    tuple_bytes, padded = r.live_state_bytes(B, T), r.live_state_bytes(B, T, layout="padded")
    # one zero tensor, one zero statistic, the mask; and at a block start c·u for every detail
    assert padded > tuple_bytes
    with pytest.raises(ValueError, match="layout"):
        r.live_state_bytes(B, T, impl="naive", layout="padded")


def test_ideal_io_of_the_padded_layout_counts_the_masked_reads():
    """haares, N=2 over 4 layers (K=1, pool of 1 + 2·2 = 5): phase 1 reads e, then all 5 slots
    (the tuple layout's bound: 2·2·2); phase 2 moves 3 + 2·2 per sublayer; 8 sublayers."""
    r = build_router("haares", 8, 4, n_blocks=2, impl="two_phase")
    assert r.ideal_io_per_token(layout="padded") == (1 + 5) / 8 + 7
    assert r.ideal_io_per_token() == 8 / 8 + 7
    with pytest.raises(ValueError, match="layout"):
        r.ideal_io_per_token(layout="stacked")


def test_a_peer_kernel_is_skipped_under_the_layer_scope():
    case = Case("block_attnres", DecoderConfig(d_model=16, n_layers=2, n_heads=2, seq_len=8, batch_size=2),
                "fwd", "compile", "default", (), "fla", 0, "layer")
    assert "no region form" in prepare.impl_unavailable(case, CPU)


# --- compiled (Inductor) --------------------------------------------------------------------

CFG4 = DecoderConfig(vocab_size=32, d_model=16, n_layers=4, n_heads=2, seq_len=8, batch_size=2)
#: Regions whose inputs are shaped by the layers per block: two-phase's init and block-end
#: regions batch phase 1 for the next block's m pseudo-queries (m = its sublayers).
DEPTH_SHAPED = {"naive": 0, "two_phase": 2}


@pytest.mark.compile
@pytest.mark.slow
@pytest.mark.parametrize("name,impl", matrix(VARIANTS))
def test_layer_scope_under_inductor_equals_eager(name, impl):
    """Output and every gradient of the layer-scope step (``backends.prepare``, Inductor) against
    eager, norm-relative 1e-5 (as ``harness/sweep/parity.py`` measures); 4 layers, 2 blocks, so
    every role of a block router runs; a second step compiles nothing. The model scope:
    tests/test_backends.py."""
    torch.manual_seed(0)
    model = _randomised(Decoder(CFG4, name, _options(name, impl)))
    x = torch.randint(0, 32, (2, 8), generator=torch.Generator().manual_seed(1))
    ref, gref = _loss_and_grads(model, x)
    compiled = backends.prepare(model, "compile", "default", "layer").model
    got, grads = _loss_and_grads(compiled, x)
    assert backends.graph_breaks() == 0
    assert _rel(got, ref) <= 1e-5
    assert max(_rel(grads[k], gref[k]) for k in gref) <= 1e-5
    with torch._dynamo.config.patch(error_on_recompile=True):  # a second step reuses every region
        again, _ = _loss_and_grads(compiled, x)                 # (no guard on a state object's id)
    assert _rel(again, got) <= 1e-6
    torch._dynamo.reset()


def _compiled(name: str, impl: str, L: int) -> dict:
    """The rows of one layer-scope ``fwd_bwd`` case through the sweep's own path."""
    case = Case(name, CFG4.replace(n_layers=L), "fwd_bwd", "compile", "default",
                tuple(sorted((k, v) for k, v in _options(name, impl).items() if k != "impl")), impl, 0, "layer")
    w = MemoryWriter({"device": "cpu"})
    status = measure_unit([(case, False)], CPU, w, FAST)
    rows = {r["metric"]: r for r in w.rows if r["case_key"] == case.key}
    assert status == {case.key: "ok"}, rows.get("step_time", {}).get("error")
    return {m: r["value"] for m, r in rows.items() if m != "step_time"}


@pytest.mark.compile
@pytest.mark.slow
@pytest.mark.parametrize("name,impl", matrix([("prenorm", "naive"), ("rezero", "naive"), ("layerscale", "naive"),
                                              ("block_attnres", "naive"), ("block_attnres", "two_phase"),
                                              ("haares", "naive"), ("haares", "two_phase")]))
def test_inductor_compiles_each_region_once_at_4_and_at_8_layers(name, impl):
    """The compile rows of a layer-scope case, n_blocks=2: at 4 and at 8 layers (2 and 4 per
    block) Inductor compiled the stated number of forward graphs (``graphs_fwd``, dynamo's
    ``stats.unique_graphs``) and as many backward graphs, AOTAutograd compiled each region once,
    nothing recompiled or broke; the 8-layer case compiles nothing new but the regions shaped by
    the layers per block (``DEPTH_SHAPED``, forward and backward)."""
    at = {L: _compiled(name, impl, L) for L in (4, 8)}
    want = stated(name, impl)
    for L, r in at.items():
        assert (r["graphs_fwd"], r["graphs_bwd"], r["recompiles"], r["graph_breaks"]) == (want, want, 0, 0), L
        assert r["aot_cache_hit"] + r["aot_cache_miss"] == want, L
        assert r["fxgraph_cache_hit"] + r["fxgraph_cache_miss"] == 2 * want, L
    assert at[8]["fxgraph_cache_miss"] <= 2 * DEPTH_SHAPED[impl]


@pytest.mark.compile
def test_a_region_that_recompiles_is_an_error_row_not_an_eager_fallback(monkeypatch):
    """Every region may compile once (``fail_on_recompile_limit_hit``): a step whose input shape
    changes after its first call makes a region compile again, and the case is an error row."""
    real = backends.make_step
    calls = {"n": 0}

    def shape_changing_step(model, mode, x, y, **kw):
        steps = [real(model, mode, x, y, **kw), real(model, mode, x[:, :4], y[:, :4], **kw)]

        def step():
            calls["n"] += 1
            return steps[calls["n"] > 1]()
        return step

    monkeypatch.setattr(backends, "make_step", shape_changing_step)  # the backend makes the step
    cfg = DecoderConfig(vocab_size=32, d_model=16, n_layers=2, n_heads=2, seq_len=8, batch_size=2)
    case = Case("prenorm", cfg, "fwd", "compile", "default", compile_scope="layer")
    w = MemoryWriter({"device": "cpu"})
    assert measure_unit([(case, False)], CPU, w, FAST) == {case.key: "error"}
    err = next(r for r in w.rows if r["metric"] == "step_time")["error"]
    assert "recompile" in err.lower(), err
