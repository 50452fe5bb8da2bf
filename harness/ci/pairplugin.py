"""routerbench's opt-in pytest plugin: a router benchmarked paired with prenorm, in any repository.

Loaded only on request, never by a ``pytest11`` entry point (it replaces pytest-benchmark's
``machine_info``, which would change every pytest run of the environment)::

    pytest -p harness.ci.pairplugin tests/ --benchmark-only --benchmark-json bench.json
    # or, in a test module or the root conftest.py:  pytest_plugins = ["harness.ci.pairplugin"]

It loads the routerbench plugins this environment has (installed ``routerbench.routers`` /
``routerbench.impls`` entry points and ``ROUTERBENCH_PLUGINS``; :func:`routers.plugins.activate`) at
configure time, a bad plugin stopping pytest with its one line, and gives the fixture
:func:`routerbench_pair`::

    def test_pair(routerbench_pair):
        info = routerbench_pair(router="gated_residual", backend="eager",
                                shape={"d_model": 64, "n_layers": 4, "n_heads": 4, "seq_len": 64, "batch_size": 8})

Each call is one benchmark of the project's own suite (``tests/benchmarks``): the router's case
and prenorm's on the same backend, mode and shape, set up on ``routerbench run``'s path and timed
in alternating (ABBA) rounds, pytest-benchmark recording the router's side
(:class:`harness.ci.pairbench.PairBench`). Its ``extra_info`` holds the paired ratio with its
interval and every record row, and its group is the suite's (``fwd_bwd-d64-L4-T64-B8-vs-prenorm``),
so ``routerbench report bench.json`` and ``routerbench gate bench.json --rules R.toml`` read the
JSON as they read the suite's. Rounds: :data:`harness.ci.suite.ROUNDS` of the device's suite, the
``rounds`` argument, or pytest-benchmark's rule under ``--benchmark-min-rounds`` /
``--benchmark-max-time`` (:func:`harness.ci.benchplugin.bench_rounds`).
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any, Callable

import pytest
import torch

from harness.step import backends
from harness.step.modes import MODES
from harness.stats.bootstrap import MIN_PAIRS_FOR_CI
from harness.step.backends import compiles
from harness.sweep.cases import Case
from routers import BASELINE
from workloads.config import PRESETS, DecoderConfig

from .benchplugin import bench_rounds, check_options
from .benchplugin import pytest_benchmark_generate_machine_info  # noqa: F401 - a hook of this plugin
from .pairbench import PairBench
from .suite import ROUNDS, BenchPair, default_suite

__all__ = ["pair_case", "resolve_shape", "routerbench_pair"]


def pytest_configure(config: pytest.Config) -> None:
    """pytest hook: the round options checked (under ``--benchmark-only``), then every routerbench
    plugin of this environment loaded; a bad one is a usage error (its one line, exit 4)."""
    if config.getoption("benchmark_only", default=False):
        check_options(config)
    from routers import plugins
    try:
        plugins.activate()
    except plugins.PluginError as exc:
        raise pytest.UsageError(str(exc)) from None


def resolve_shape(shape: DecoderConfig | str | dict[str, Any] | None) -> DecoderConfig:
    """The decoder shape of ``shape``.

    Args:
        shape: a :class:`workloads.config.DecoderConfig`; a preset name (``routerbench list``); a
            dict of its fields (``d_model``, ``n_layers``, ``n_heads``, ``seq_len``,
            ``batch_size``, ``workload``, ``dtype``, …; the rest default); None: ``cpu-quick``.

    Raises:
        ValueError: an unknown preset or field, or a value out of range (one line naming ``shape``).
    """
    if shape is None:
        return PRESETS["cpu-quick"]
    if isinstance(shape, DecoderConfig):
        return shape
    if isinstance(shape, str):
        if shape not in PRESETS:
            raise ValueError(f"shape={shape!r}: unknown preset; give one of {', '.join(PRESETS)} or a dict "
                             "of d_model, n_layers, n_heads, seq_len, batch_size")
        return PRESETS[shape]
    if isinstance(shape, dict):
        known = [f.name for f in fields(DecoderConfig)]
        bad = sorted(set(shape) - set(known))
        if bad:
            raise ValueError(f"shape: unknown field {bad[0]!r}; known: {', '.join(known)}")
        try:
            return DecoderConfig(**shape)
        except Exception as exc:  # noqa: BLE001 - ConfigError of a value out of range
            raise ValueError(f"shape={shape!r}: {exc}") from None
    raise ValueError(f"shape must be a DecoderConfig, a preset name or a dict, got {type(shape).__name__}")


def pair_case(router: str, *, backend: str = "eager", shape: DecoderConfig | str | dict | None = None,
              mode: str = "fwd_bwd", impl: str | None = None, compile_mode: str | None = None,
              router_options: dict[str, Any] | None = None, rounds: int | None = None) -> BenchPair:
    """The benchmark pair of ``router`` against prenorm: two :class:`harness.sweep.cases.Case` of
    one backend, mode and shape (prenorm ``naive``; the router ``impl``, default its first).

    Args:
        router: a registered router (a built-in, or one a loaded plugin registered); not prenorm.
        backend: ``eager``, ``compile`` or ``cudagraph``; compile mode ``compile_mode`` (default
            ``default`` under ``compile``), compile scope ``model``.
        shape: see :func:`resolve_shape`.
        mode: one of :data:`harness.step.modes.MODES`.
        router_options: the router's keyword options (``routerbench list``).
        rounds: timed pairs (>= :data:`harness.stats.bootstrap.MIN_PAIRS_FOR_CI`); default the
            device suite's :data:`harness.ci.suite.ROUNDS`.

    Raises:
        ValueError: one line naming the argument to change (an unknown router names the plugin
            mechanism: its package is not installed, or not found by this pytest).
    """
    from routers import ROUTERS, check_router_options, router_class
    if router not in ROUTERS:
        raise ValueError(f"router={router!r}: not registered (known: {', '.join(sorted(ROUTERS))}); install its "
                         "package (pip install -e DIR) so its routerbench.routers entry point is found")
    if router == BASELINE:
        raise ValueError(f"router={router!r}: {BASELINE} is the baseline of every pair; name another router")
    if backend not in backends.BACKENDS:
        raise ValueError(f"backend={backend!r}: one of {', '.join(backends.BACKENDS)}")
    if mode not in MODES:
        raise ValueError(f"mode={mode!r}: one of {', '.join(MODES)}")
    impls = router_class(router).impls
    impl = impls[0] if impl is None else impl
    if impl not in impls:
        raise ValueError(f"impl={impl!r}: {router} offers {', '.join(impls)}")
    if compile_mode is None and compiles(backend):
        compile_mode = "default"
    if compile_mode not in backends.BACKENDS[backend]:
        raise ValueError(f"compile_mode={compile_mode!r}: {backend} takes "
                         f"{', '.join(str(m) for m in backends.BACKENDS[backend])}")
    if rounds is not None and (not isinstance(rounds, int) or rounds < MIN_PAIRS_FOR_CI):
        raise ValueError(f"rounds={rounds!r}: a paired interval needs at least {MIN_PAIRS_FOR_CI} pairs")
    cfg = resolve_shape(shape)
    opts = dict(router_options or {})
    check_router_options(router, opts, cfg.d_model, cfg.n_layers, label="router_options")
    scope = backends.DEFAULT_COMPILE_SCOPE if compiles(backend) else None
    base = Case(BASELINE, cfg, mode, backend, compile_mode, (), router_class(BASELINE).impls[0],
                compile_scope=scope)
    case = Case(router, cfg, mode, backend, compile_mode, tuple(sorted(opts.items())), impl, compile_scope=scope)
    return BenchPair("vs_prenorm", base, case, rounds or ROUNDS[default_suite()])


@pytest.fixture
def routerbench_pair(benchmark, request) -> Callable[..., dict[str, Any]]:
    """A function that benchmarks a router paired with prenorm (module doc); call it once per test.

    ``routerbench_pair(router, backend="eager", shape=None, mode="fwd_bwd", impl=None,
    compile_mode=None, router_options=None, rounds=None, device=None)`` (arguments of
    :func:`pair_case`; ``device`` default CUDA when visible, else CPU) sets the benchmark's group,
    times the rounds with ``benchmark.pedantic``, stores the pair's ``extra_info``
    (:meth:`harness.ci.pairbench.PairBench.extra_info`) and returns it: ``ratio`` (router / prenorm
    per round, median) with ``ratio_lo``/``ratio_hi``, ``a_ms``/``b_ms``, ``pairs``, FLOPs, memory,
    ``rows``. A backend this device cannot run skips the test; a case that fails to set up (an
    ``oom``, an error) fails it with its status and error. Under ``--benchmark-disable`` it times
    :data:`harness.stats.bootstrap.MIN_PAIRS_FOR_CI` pairs, which pytest-benchmark does not record.
    """
    used = []

    def run(router: str, backend: str = "eager", shape: DecoderConfig | str | dict | None = None,
            mode: str = "fwd_bwd", impl: str | None = None, compile_mode: str | None = None,
            router_options: dict[str, Any] | None = None, rounds: int | None = None,
            device: str | torch.device | None = None) -> dict[str, Any]:
        if used:
            raise RuntimeError("routerbench_pair: one pair per test (pytest-benchmark records one benchmark "
                               "per test); parametrize the test for more")
        used.append(router)
        pair = pair_case(router, backend=backend, shape=shape, mode=mode, impl=impl, compile_mode=compile_mode,
                         router_options=router_options, rounds=rounds)
        dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        reason = backends.unavailable_reason(pair.b.backend, pair.b.compile_mode, dev)
        if reason:
            pytest.skip(reason)
        benchmark.group = pair.group
        with PairBench(pair, dev) as pb:
            if pb.error:
                pytest.fail(pb.error)
            n = pair.rounds if rounds is not None else bench_rounds(request.config, pair.rounds, pb.round_s)
            if getattr(benchmark, "disabled", False):  # --benchmark-disable: the fewest pairs, run once
                benchmark.pedantic(lambda: [pb.round() for _ in range(MIN_PAIRS_FOR_CI)], rounds=1, iterations=1)
            else:
                benchmark.pedantic(**pb.pedantic(n))
            info = pb.finish()
        benchmark.extra_info.update(info)
        return info

    return run
