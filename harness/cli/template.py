"""The package ``routerbench new router NAME`` writes (:mod:`harness.cli.new`): a real router, a gated
residual ``h_{k+1} = h_k + σ(g_k)·u_k``, under the given name, with its float64 reference, its cost
models, a ``pyproject.toml`` with the ``routerbench.routers`` entry point, a test that uses the
pytest plugin (:mod:`harness.ci.pairplugin`) and a README. ``examples/gated_residual/`` in this
repository is exactly :func:`render` of ``gated_residual`` (tests/test_examples.py checks it).

Placeholders (``string.Template``): ``$name`` (the router and its package), ``$cls`` (the class),
``$dist`` (the distribution), ``$api`` (:data:`routers.api.API_VERSION`).
"""

from __future__ import annotations

from string import Template

PYPROJECT = '''\
[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "$dist"
version = "0.1.0"
description = "The $name residual router, measured by routerbench"
requires-python = ">=3.10"
# routerbench (and torch) come from the environment you install this package into

[project.entry-points."routerbench.routers"]
$name = "$name.router"

[tool.setuptools]
packages = ["$name"]
'''

INIT = '''\
"""The $name router for routerbench (its code: $name/router.py)."""
'''

ROUTER = '''\
"""$cls: a gated residual router, h_{k+1} = h_k + sigmoid(g_k) * u_k, for routerbench.

Installed (``pip install --no-build-isolation -e .``), routerbench finds it through the
``routerbench.routers`` entry point of pyproject.toml and loads this module, which registers the
router at import. The contract is routerbench's ``routers.api`` (docs/PLUGINS.md): what a router
must give (init_state, params, read, write, output, a docstring, a float64 ``reference``) and what
it may give (the cost models below).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from routers.api import Router, Slot, register_router

#: The routerbench plugin API this module was written for (``routers.api.API_VERSION``).
ROUTERBENCH_API_VERSION = $api

#: The initial gate logit g_k. sigmoid(2.0) = 0.881: each sublayer starts with most of its update
#: (between ReZero's 0 and PreNorm's 1), and the gate's slope sigmoid'(2.0) = 0.105 is not saturated.
GATE_INIT = 2.0


@register_router("$name")
class $cls(Router):
    """Gated residual: h_{k+1} = h_k + sigmoid(g_k) * u_k, one learned gate g_k per sublayer.

    h_0 = e (the embedding), h_out = h_2L. g_k starts at ``gate_init`` (:data:`GATE_INIT`).

    Args:
        d_model: width d.
        n_layers: transformer layers L (2L sublayers, attention and MLP).
        gate_init: the initial value of every g_k.
    """

    def __init__(self, d_model: int, n_layers: int, *, gate_init: float = GATE_INIT) -> None:
        super().__init__(d_model, n_layers)
        self.gate_init = float(gate_init)
        #: g_k, one logit per sublayer, shape (2L,)
        self.gate = nn.Parameter(torch.full((2 * n_layers,), self.gate_init))

    def options(self) -> dict:
        return {"gate_init": self.gate_init}

    def init_state(self, embedding: Tensor, region: bool = False) -> Tensor:
        """h_0 = e, (B, T, d)."""
        return embedding

    def params(self, state: Tensor, slot: Slot, region: bool = False) -> tuple:
        """g_k, a 0-d slice of the stacked gates (a tensor, never a Python number)."""
        return (self.gate[slot.index],)

    def read(self, state: Tensor, role: tuple, params: tuple) -> Tensor:
        """The sublayer's input h_k is the stream itself."""
        return state

    def write(self, state: Tensor, role: tuple, params: tuple, update: Tensor) -> Tensor:
        """h + sigmoid(g_k) * u."""
        return state + torch.sigmoid(params[0]) * update

    def output(self, state: Tensor, params: tuple = ()) -> Tensor:
        """h_out = h_2L."""
        return state

    def reference(self, embedding: Tensor, updates: list[Tensor]) -> tuple[list[Tensor], Tensor]:
        """The recurrence in float64 with plain loops: e (B, T, d) and the 2L updates u_k (each
        (B, T, d)) -> (the 2L reads h_k, h_out), with this instance's gates."""
        h = embedding.double()
        reads = []
        for k, u in enumerate(updates):
            reads.append(h)
            gate = 1.0 / (1.0 + torch.exp(-self.gate[k].double()))
            h = h + gate * u.double()
        return reads, h

    # --- cost models (optional; where absent, routerbench says "not declared") ----------------
    # They describe the math above: change them with it, or delete them. `routerbench check`
    # compares analytic_fwd_flops with the forward's counted FLOPs and fails where they differ.
    def analytic_fwd_flops(self, batch_size: int, seq_len: int) -> float:
        """Forward FLOP over B*T tokens (routerbench's docs/FLOPS.md convention): per sublayer,
        sigmoid(g_k) on a 0-d gate (4), sigmoid(g_k) * u (d per token) and the add (d per token).
        Total: 2L * (2d * B*T + 4)."""
        return float(len(self.slots) * (2 * self.d_model * batch_size * seq_len + 4))

    def live_state_bytes(self, batch_size: int, seq_len: int, dtype: torch.dtype | None = None,
                         impl: str | None = None) -> int:
        """Router state alive between sublayers: the stream h alone, one (B, T, d) tensor (the
        gates are parameters, not state)."""
        itemsize = torch.empty((), dtype=dtype or torch.float32).element_size()
        return batch_size * seq_len * self.d_model * itemsize

    def ideal_io_per_token(self, schedule: int | None = None) -> float:
        """3 (units of d per token and sublayer): read h, read u, write h; g_k is a parameter,
        amortised over tokens."""
        if schedule is not None:
            raise ValueError(f"{self.name} has no two-phase schedule; pass schedule=None")
        return 3.0

    def ideal_io_fwd_per_token(self) -> float:
        """3, the forward of the fwd+bwd model: the same reads and write as ideal_io_per_token."""
        return 3.0

    def ideal_io_fwd_bwd_per_token(self) -> float:
        """8 = prenorm's 6 + 2: the update's gradient sigmoid(g_k) * dh is written (1), and the
        gate's gradient sum(u * dh) re-reads u (1)."""
        return 8.0
'''

TEST = '''\
"""Tests of the $name router: its float64 reference against the router itself, and its step time
paired with prenorm's (routerbench's pytest plugin, harness.ci.pairplugin, loaded below).

    pytest tests/                                                      # both
    pytest tests/ --benchmark-only --benchmark-json bench.json         # the pair only
    routerbench gate bench.json --rules rules.toml                     # judge it
"""

import torch

pytest_plugins = ["harness.ci.pairplugin"]  # loads the installed routerbench plugins: $name among them

#: A small shape: d_model, n_layers, n_heads, seq_len, batch_size (any routerbench preset name works too).
SHAPE = {"d_model": 32, "n_layers": 2, "n_heads": 2, "seq_len": 16, "batch_size": 2}


def test_reference_equals_the_router():
    from routers import build_router
    from routers.api import route

    torch.manual_seed(0)
    router = build_router("$name", 8, 2).double()
    with torch.no_grad():
        router.gate.uniform_(-3.0, 3.0)
    e = torch.randn(2, 3, 8, dtype=torch.float64)
    updates = [torch.randn_like(e) for _ in router.slots]
    reads, out, _ = route(router, e, lambda slot, h: updates[slot.index])
    ref_reads, ref_out = router.reference(e, updates)
    for got, want in zip(reads, ref_reads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(out, ref_out, rtol=1e-12, atol=1e-12)


def test_pair_with_prenorm(routerbench_pair):
    info = routerbench_pair(router="$name", backend="eager", shape=SHAPE, mode="fwd_bwd")
    assert info["router"] == "$name" and info["baseline_key"].startswith("prenorm|")
    assert info["pairs"] >= 5 and info["ratio"] > 0
'''

README = '''\
# $name: a residual router for routerbench

`$name/router.py`: h_{k+1} = h_k + sigmoid(g_k) * u_k, its float64 `reference` and cost models (routers.api).

    pip install --no-build-isolation -e .       # into routerbench's environment (offline)
    routerbench list | grep $name               # found through the routerbench.routers entry point
    routerbench check $name                     # the conformance checks: reference, gradients, syncs, graph breaks, flop model
    routerbench run --routers prenorm,$name --widths 64 --depths 4 --seq-len 64 --batch-size 8 --modes fwd_bwd --backends eager --no-train --precision-target 0.03   # paired with prenorm until the ratio's CI is within 3 %, then the report
    pytest tests/ --benchmark-only --benchmark-json bench.json   # in your CI; then routerbench gate bench.json --rules R.toml
'''

#: Path inside the package directory -> template.
FILES = {"pyproject.toml": PYPROJECT, "$name/__init__.py": INIT, "$name/router.py": ROUTER,
         "tests/test_$name.py": TEST, "README.md": README}


def class_name(name: str) -> str:
    """The router class of ``name``: its ``_``-separated words capitalised (``gated_residual`` ->
    ``GatedResidual``; a name whose result would not be an identifier gets ``Router`` in front)."""
    cls = "".join(w[:1].upper() + w[1:] for w in name.split("_") if w) or "Router"
    return cls if cls.isidentifier() and not cls[0].isdigit() else "Router" + cls


def dist_name(name: str) -> str:
    """The distribution of router ``name``: ``routerbench-`` and the name with ``-`` for ``_``."""
    return "routerbench-" + name.strip("_").replace("_", "-")


def render(name: str, api: int | None = None) -> dict[str, str]:
    """The package of router ``name``: relative path -> text.

    Args:
        name: the router's name, a Python identifier (also its package's name).
        api: the plugin API version to declare (default :data:`routers.api.API_VERSION`).
    """
    if api is None:
        from routers.api import API_VERSION
        api = API_VERSION
    values = {"name": name, "cls": class_name(name), "dist": dist_name(name), "api": str(api)}
    return {Template(path).substitute(values): Template(text).substitute(values) for path, text in FILES.items()}
