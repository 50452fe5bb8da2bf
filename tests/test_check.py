"""``routerbench check NAME`` (harness/cli/check.py, harness/conformance/; docs/PLUGINS.md,
"routerbench check"): a correct plugin and the built-ins pass with exit 0; planted-bug plugins (a
``.item()`` in the read, a detached gate, a Python-list index, a print) each fail with their own
line at the plugin's file:line; an unknown name exits 2 with one line; the capture guard places a
finding in a plugin installed in site-packages; the conformance functions assert the built-ins'
float64 references and the budget's bound."""

from __future__ import annotations

import re
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from harness.cli import main
from harness.conformance import budget, equality
from harness.step.guard import capture_findings
from routers import ROUTERS, impls, plugins, registry

#: The correct plugin (docs/PLUGINS.md's example): a gated residual h_{k+1} = h_k + σ(g_k) u_k.
GOOD = '''
import torch
from torch import nn
from routers.api import Router, register_router
ROUTERBENCH_API_VERSION = 1

@register_router("{name}")
class Gated(Router):
    """Gated residual: h_{{k+1}} = h_k + sigmoid(g_k) u_k."""
    def __init__(self, d_model, n_layers):
        super().__init__(d_model, n_layers)
        self.gate = nn.Parameter(torch.full((2 * n_layers,), 2.0))
    def init_state(self, embedding, region=False): return embedding
    def params(self, state, slot, region=False): return (self.gate[slot.index],)
    def read(self, state, role, params):
        return state
    def write(self, state, role, params, update): return state + torch.sigmoid(params[0]) * update
    def output(self, state, params=()): return state
    def reference(self, embedding, updates):
        h = embedding.double(); reads = []
        for k, u in enumerate(updates):
            reads.append(h); h = h + torch.sigmoid(self.gate[k].double()) * u.double()
        return reads, h
'''
#: Planted bugs: (the statement replaced in GOOD, the planted one ending in ``# PLANT``).
READ = "    def read(self, state, role, params):\n        return state\n"
WRITE = "    def write(self, state, role, params, update): return state + torch.sigmoid(params[0]) * update\n"
PLANTS = {
    "item": (READ, "    def read(self, state, role, params):\n        s = params[0].item()  # PLANT\n"
                   "        return state * (s / s)\n"),
    "detach": (WRITE, "    def write(self, state, role, params, update):\n"
                      "        return state + torch.sigmoid(params[0]).detach() * update  # PLANT\n"),
    "list": (READ, "    def read(self, state, role, params):\n"
                   "        return state[list(range(state.shape[0]))]  # PLANT\n"),
    "print": (READ, "    def read(self, state, role, params):\n        print(end='')  # PLANT\n"
                    "        return state\n"),
}
#: (check, whether its line names the plugin's file:line, a phrase of its line) per plant.
EXPECT = {"item": ("capture", True, "host sync: Tensor.item"),
          "detach": ("gradients", False, "gradient wrt parameter gate"),
          "list": ("capture", True, "list index: Tensor.__getitem__ with a Python list"),
          "print": ("graph breaks", True, "graph break at")}


@pytest.fixture
def isolated_plugins():
    """Plugins loaded by a test are forgotten after it (registry, impls, loader, modules). The
    built-ins are loaded first, so what is restored is every built-in, not a registry half-loaded."""
    registry.load_routers()
    impls.names()
    saved = (dict(registry.ROUTERS), dict(registry.ORIGINS), dict(plugins.LOADED), list(plugins._asked),
             dict(impls.IMPLS), set(sys.modules))
    yield
    for live, old in zip((registry.ROUTERS, registry.ORIGINS, plugins.LOADED, impls.IMPLS),
                         (saved[0], saved[1], saved[2], saved[4])):
        live.clear()
        live.update(old)
    plugins._asked[:] = saved[3]
    for m in set(sys.modules) - saved[5]:
        if m.startswith("routerbench_plugin_") or m.startswith("planted_pkg"):
            sys.modules.pop(m)


def _plugin(tmp_path: Path, name: str, plant: str | None = None, folder: str = "") -> Path:
    text = textwrap.dedent(GOOD).format(name=name)
    if plant is not None:
        old, new = PLANTS[plant]
        assert old in text
        text = text.replace(old, new)
    path = tmp_path / folder / f"{name}.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _line_of(path: Path) -> int:
    return next(n for n, t in enumerate(path.read_text().splitlines(), 1) if t.endswith("# PLANT"))


def _check(*args: str):
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


def _failures(out: str) -> list[str]:
    return [ln for ln in out.splitlines() if ln and not ln.startswith(" ") and ": " in ln
            and not ln.startswith("routerbench check")]


@pytest.mark.slow
def test_a_correct_plugin_passes_with_exit_0(tmp_path, isolated_plugins):
    path = _plugin(tmp_path, "gated_ok")
    code, out = _check("--plugin", str(path), "check", "gated_ok")
    assert code == 0, out
    cells = [re.split(r"\s{2,}", ln.strip()) for ln in out.splitlines()[2:] if ln.startswith("  ")]
    assert {c[0]: c[1] for c in cells} == {
        "reference": "pass", "gradients": "pass", "capture": "pass", "graph breaks": "pass",
        "layer recompiles": "pass", "ops": "pass", "saved activations": "pass", "cost models": "info"}, out  # no flop model row: none declared
    assert "max rel err 0.0e+00" in out and "every check passed" in out
    assert "declared: none; not declared: analytic_fwd_flops" in out


@pytest.mark.slow
@pytest.mark.parametrize("plant", list(PLANTS))
def test_a_planted_bug_fails_with_its_own_line(tmp_path, isolated_plugins, plant):
    name = f"planted_{plant}"
    path = _plugin(tmp_path, name, plant)
    code, out = _check("--plugin", str(path), "check", name)
    assert code == 1, out
    check, placed, phrase = EXPECT[plant]
    mine = [ln for ln in _failures(out) if ln.startswith(f"{check}: ")]
    assert len(mine) == 1, out
    assert phrase in mine[0], mine[0]
    if placed:
        assert f"{path}:{_line_of(path)}: " in mine[0], mine[0]
    assert f"{check} " in out and "FAIL" in next(ln for ln in out.splitlines() if ln.strip().startswith(check))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["prenorm", "haares"])
def test_builtins_pass(name):
    code, out = _check("check", name)
    assert code == 0, out
    assert "FAIL" not in out and "every check passed" in out


def test_an_unknown_name_is_one_line_and_exit_2():
    code, out = _check("check", "nope")
    assert code == 2
    lines = out.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("routerbench: error: check: unknown router or impl 'nope'")
    assert "prenorm" in lines[0] and "two_phase" in lines[0]


def test_a_capture_finding_points_into_a_plugin_installed_in_site_packages(tmp_path, isolated_plugins, monkeypatch):
    """A plugin package under a ``site-packages`` folder (where pip puts it): its module's and
    its package's other files are project frames for the guard."""
    site = tmp_path / "lib" / "site-packages"
    pkg = site / "planted_pkg"
    pkg.mkdir(parents=True)
    (pkg / "helpers.py").write_text("def host(t):\n    return t.sum().item()  # PLANT\n")
    (pkg / "__init__.py").write_text(textwrap.dedent(GOOD).format(name="planted_site").replace(
        READ, "    def read(self, state, role, params):\n        from .helpers import host\n"
              "        host(state)\n        return state\n"))
    monkeypatch.syspath_prepend(str(site))
    t = torch.randn(3)
    plugins.load("planted_pkg")
    r = ROUTERS["planted_site"](8, 1)
    found = capture_findings(lambda: r.read(t, (), ()))
    helpers = pkg / "helpers.py"
    assert [(f.kind, f.file, f.line) for f in found] == [("host_sync", str(helpers), 2)]


def test_without_the_plugin_a_site_packages_file_is_not_a_project_frame(tmp_path, monkeypatch):
    site = tmp_path / "site-packages"
    site.mkdir()
    (site / "planted_lib.py").write_text("def host(t):\n    return t.sum().item()\n")
    monkeypatch.syspath_prepend(str(site))
    import planted_lib
    t = torch.randn(3)
    found = capture_findings(lambda: planted_lib.host(t))  # PLANT:lib
    assert [(f.file, f.line) for f in found] == [("tests/test_check.py", _here("PLANT:lib"))]


def _here(marker: str) -> int:
    return next(n for n, t in enumerate(Path(__file__).read_text().splitlines(), 1) if t.endswith(f"# {marker}"))


# --- the conformance functions the tests share with `check` --------------------------------------

@pytest.mark.parametrize("name", sorted(ROUTERS))
def test_every_builtin_equals_its_float64_reference_with_gradients(name):
    found = equality.reference_equality(name)
    assert [(f.check, f.passed) for f in found] == [("reference", True), ("gradients", True)], found
    assert all(float(f.figure.split()[3]) < 1e-13 for f in found), found


@pytest.mark.parametrize("impl", ["two_phase", "lean"])
def test_an_impl_equals_naive(impl):
    (f,) = equality.impl_equality("haares", impl)
    assert f.passed and f.check == "reference", f


def test_a_wrong_reference_fails_and_names_the_read():
    r = equality.random_router("prenorm", 8, 3)
    cls = type(r)

    class Off(cls):
        def reference(self, embedding, updates):
            reads, h = super().reference(embedding, updates)
            return reads[:2] + [reads[2] + 1e-6] + reads[3:], h
    try:
        registry.ROUTERS["planted_off"] = Off
        found = equality.reference_equality("planted_off")
    finally:
        registry.ROUTERS.pop("planted_off")
    assert not found[0].passed and found[0].line.startswith("read h_2 at L=3 differs"), found[0]


def test_saved_activations_past_the_bound_fail_and_ops_within_pass(monkeypatch):
    """A read that multiplies the state by a learnt scalar 150 times saves 150 copies of it per
    sublayer (past 8x prenorm's bytes) in about 2.6x prenorm's ops (within 12x)."""
    base = ROUTERS["prenorm"]

    class Hoarder(base):
        def __init__(self, d_model, n_layers):
            super().__init__(d_model, n_layers)
            self.g = torch.nn.Parameter(torch.ones(()))

        def read(self, state, role, params):
            for _ in range(150):
                state = state * self.g
            return state
    monkeypatch.setitem(registry.ROUTERS, "planted_hoarder", Hoarder)
    saved, ops = {f.check: f for f in budget.ops_and_saved("planted_hoarder")}.values()
    assert (saved.check, saved.passed, ops.check, ops.passed) == ("saved activations", False, "ops", True)
    assert float(saved.figure.split(", ")[1].rstrip("x prenorm")) > budget.BOUNDS["saved activations"]
    (base_saved, base_ops) = budget.ops_and_saved("prenorm")
    assert base_saved.figure.endswith("1.00x prenorm") and base_ops.figure.endswith("1.00x prenorm")


def test_regions_that_grow_with_depth_fail_layer_recompiles(monkeypatch):
    """A role that names the slot's index makes one region per sublayer: the count grows with
    depth (here at 1 and 2 layers, to keep the compile short)."""
    from harness.conformance import graphs

    class ByIndex(ROUTERS["prenorm"]):
        def role(self, slot):
            return (slot.index,)
    monkeypatch.setitem(registry.ROUTERS, "planted_by_index", ByIndex)
    monkeypatch.setattr(graphs, "DEPTHS", (1, 2))
    (f,) = graphs.layer_recompiles("planted_by_index")
    assert not f.passed and f.line.startswith("its regions grow with depth (4 at L=1, 6 at L=2)"), f
    assert f.figure == "L=1: 4 regions, 0 recompiles, L=2: 6 regions, 0 recompiles"


@pytest.mark.parametrize("args, start", [
    (["check", "haares", "--impl", "liger"], "routerbench: error: --impl: 'liger' is not an implementation of haares; "
                                             "its impls: naive, two_phase, lean"),
    (["check", "prenorm", "--impl", "two_phase"], "routerbench: error: --impl: 'two_phase' is not an implementation "
                                                  "of prenorm; prenorm has no impls; drop --impl"),
    (["check", "two_phase", "--impl", "lean"], "routerbench: error: --impl: 'two_phase' is an impl already"),
])
def test_a_bad_impl_is_one_line_and_exit_2(args, start):
    code, out = _check(*args)
    assert code == 2 and len(out.strip().splitlines()) == 1 and out.startswith(start), out


def test_a_stale_flop_model_fails_and_a_right_one_passes(isolated_plugins):
    """A FLOP model left from the template's sigmoid gate after the write changed to tanh (one op
    more per element) fails ``flop model``; the gate's true count passes."""
    from torch import nn
    import torch

    class Tanh(ROUTERS["prenorm"]):
        """h_{k+1} = h_k + (1 + tanh(a_k)) / 2 · u_k."""

        def __init__(self, d_model, n_layers):
            super().__init__(d_model, n_layers)
            self.a = nn.Parameter(torch.zeros(2 * n_layers))

        def params(self, state, slot, region=False):
            return (self.a[slot.index],)

        def write(self, state, role, params, update):
            return state + (1 + torch.tanh(params[0])) / 2 * update

        def analytic_fwd_flops(self, batch_size, seq_len):  # the sigmoid template's, stale
            return float(len(self.slots) * (2 * self.d_model * batch_size * seq_len + 4))

    registry.register("stale_tmp", Tanh)
    try:
        bad = budget.analytic_flops("stale_tmp")
        assert not bad.passed and bad.check == "flop model"
        assert "analytic_fwd_flops(2, 3) at d=8, L=2 is 400.0, but the forward counts 396 FLOP" in bad.line
        assert "update the model" in bad.line
    finally:
        registry.ROUTERS.pop("stale_tmp", None)
        registry.ORIGINS.pop("stale_tmp", None)
    good = budget.analytic_flops("rezero")
    assert good.passed and good.figure == "960 FLOP at d=16, L=3, B·T=5: declared = counted"


def test_a_check_leaves_dynamos_counters_as_it_found_them(tmp_path, isolated_plugins):
    """A graph break the check found (the planted print) is not left in Dynamo's counters, where
    the caller's next compile would read it (``harness.step.backends.graph_breaks``)."""
    from harness.conformance import graphs
    from harness.step import backends
    torch._dynamo.reset()
    from torch._dynamo.utils import counters
    counters.clear()
    path = _plugin(tmp_path, "gated_brk", "print")
    plugins.activate(str(path), entry=False)
    found = graphs.graph_breaks("gated_brk")
    assert not found[0].passed and "graph break at" in found[0].line
    assert backends.graph_breaks() == 0


@pytest.mark.parametrize("name", ["dhc", "mhc"])
def test_dynamic_stream_routers_compile_each_region_once_at_every_depth(name):
    """Under the layer scope the initial streams are a contiguous copy of e, so the first region
    sees the strides every later state has: no recompile at L=4 or L=8 (an expanded view
    recompiled it once per depth)."""
    from harness.conformance import graphs
    found = graphs.layer_recompiles(name)[0]
    assert found.passed, found
    assert found.figure == "L=4: 5 regions, 0 recompiles, L=8: 5 regions, 0 recompiles"
