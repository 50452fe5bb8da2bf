"""The pytest-benchmark suite's table: its cases (router × impl × backend × mode × shape) and the
pairs each benchmark times (DESIGN.md, "Commands"; ``tests/benchmarks/`` is parametrised from
:func:`suite_pairs`).

Suites (``pytest tests/benchmarks --benchmark-only --bench-suite cpu|gpu``; default ``gpu`` when a
CUDA device is visible, else ``cpu``):

- ``cpu``: the ``cpu-quick`` shape (d 64, L 4, T 64, B 8); every router and impl eager in ``fwd``
  and ``fwd_bwd``; ``torch.compile`` for ``prenorm`` and ``haares`` [two_phase] in ``fwd_bwd``.
  Under 5 minutes on 2 cores with a cold compile cache.
- ``gpu``: d 256 L 12 T 256 B 4 and d 1024 L 24 T 1024 B 4; every router and impl eager in
  ``fwd`` and ``fwd_bwd``; every router under ``compile`` and ``cudagraph`` in ``fwd_bwd``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from harness.step.backends import of
from harness.sweep.cases import Case
from routers import BASELINE, ROUTERS, router_class
from workloads.config import PRESETS, DecoderConfig

#: Shapes of each suite.
SUITE_SHAPES: dict[str, tuple[DecoderConfig, ...]] = {
    "cpu": (PRESETS["cpu-quick"],),
    "gpu": (DecoderConfig(d_model=256, n_layers=12, n_heads=4, seq_len=256, batch_size=4),
            DecoderConfig(d_model=1024, n_layers=24, n_heads=16, seq_len=1024, batch_size=4)),
}


SUITES = tuple(SUITE_SHAPES)


#: Timed rounds (pairs) per benchmark: enough for a bootstrap interval (>= 5) on a busy CPU.
ROUNDS = {"cpu": 15, "gpu": 30}


#: The detail router compiled in the CPU suite, beside prenorm.
CPU_COMPILED = (("prenorm", "naive"), ("haares", "two_phase"))


def default_suite() -> str:
    """``gpu`` when a CUDA device is visible, else ``cpu``."""
    return "gpu" if torch.cuda.is_available() else "cpu"


def _variants() -> list[tuple[str, str]]:
    """Every registered router with each of its impls, prenorm first."""
    names = [BASELINE] + sorted(r for r in ROUTERS if r != BASELINE)
    return [(r, i) for r in names for i in router_class(r).impls]


def suite_table(suite: str) -> list[Case]:
    """The suite's cases (router × impl × backend × mode × shape), in a stable order.

    Raises:
        ValueError: unknown ``suite`` (naming ``--bench-suite``).
    """
    if suite not in SUITE_SHAPES:
        raise ValueError(f"--bench-suite must be one of {', '.join(SUITES)}, got {suite!r}")
    cases = []
    for cfg in SUITE_SHAPES[suite]:
        for mode in ("fwd", "fwd_bwd"):
            cases += [Case(r, cfg, mode, "eager", None, (), i) for r, i in _variants()]
        compiled = CPU_COMPILED if suite == "cpu" else _variants()
        for backend, cm in (("compile", "default"),) + ((("cudagraph", None),) if suite == "gpu" else ()):
            cases += [Case(r, cfg, "fwd_bwd", backend, cm, (), i) for r, i in compiled]
    return cases


@dataclass(frozen=True)
class BenchPair:
    """One benchmark: the measured case ``b`` against its baseline ``a``.

    Attributes:
        kind: ``"vs_prenorm"`` (``a`` is prenorm on ``b``'s backend) or ``"vs_eager"`` (``a`` is
            ``b``'s router eager).
        a, b: the two cases; ratio = time of ``b`` / time of ``a`` per round.
        rounds: timed rounds.
    """

    kind: str
    a: Case
    b: Case
    rounds: int

    @property
    def id(self) -> str:
        """The pytest id, e.g. ``fwd_bwd-d64L4-eager-haares[two_phase]-vs-prenorm``."""
        c = self.b.cfg
        return (f"{self.b.mode}-d{c.d_model}L{c.n_layers}-{self.b.backend}-{_variant(self.b)}-vs-"
                f"{'prenorm' if self.kind == 'vs_prenorm' else 'eager'}")

    @property
    def group(self) -> str:
        """pytest-benchmark's group: mode, shape and what is compared, ASCII only (it names
        ``--benchmark-histogram``'s files): ``fwd_bwd-d64-L4-T64-B8-vs-prenorm`` (routers against
        prenorm on one backend) or ``…-vs-eager`` (compiled or graph-replayed steps against eager)."""
        c = self.b.cfg
        vs = "prenorm" if self.kind == "vs_prenorm" else "eager"
        return f"{self.b.mode}-d{c.d_model}-L{c.n_layers}-T{c.seq_len}-B{c.batch_size}-vs-{vs}"


def _variant(case: Case) -> str:
    many = len(router_class(case.router).impls) > 1
    return case.router + (f"[{case.impl}]" if many else "")


def suite_pairs(suite: str) -> list[BenchPair]:
    """The suite's benchmarks: each non-prenorm case against prenorm on its backend, and each
    compiled or graph-replayed case against its router's eager case (:func:`suite_table`)."""
    cases = suite_table(suite)
    by = {(c.router, c.impl, c.backend, c.mode, c.cfg): c for c in cases}
    pairs = []
    for c in cases:
        base = next((by[(BASELINE, i, c.backend, c.mode, c.cfg)] for i in router_class(BASELINE).impls
                     if (BASELINE, i, c.backend, c.mode, c.cfg) in by), None)
        if c.router != BASELINE and base is not None:
            pairs.append(BenchPair("vs_prenorm", base, c, ROUNDS[suite]))
        if not of(c.backend).plain and (c.router, c.impl, "eager", c.mode, c.cfg) in by:
            pairs.append(BenchPair("vs_eager", by[(c.router, c.impl, "eager", c.mode, c.cfg)], c, ROUNDS[suite]))
    return pairs
