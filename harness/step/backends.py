"""Backends: the same decoder run eagerly, through ``torch.compile``, or captured in a CUDA graph
(``harness/step/cudagraph.py``) (DESIGN.md, "Backends and modes").

Rules (MEASUREMENT.md, "torch.compile"): ``fullgraph=True`` so a graph break is an error, not a
silent eager island; ``torch._dynamo.reset()`` and a fresh model per case; the first call (the
compile) is timed on its own as ``compile_time`` and never folded into step time; during timing
``error_on_recompile`` turns a recompile (e.g. a shape change after warm-up) into an error row
instead of a silently re-compiled or eager step.
"""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterator

import torch
from torch import nn

from .cudagraph import GraphedStep
from .modes import make_step

@dataclass(frozen=True)
class Backend:
    """One backend: everything the harness asks of it by name, in one place (the sweep, training,
    the forecasts, profile and the reports ask this object, never compare its name).

    Attributes:
        name: the ``--backends`` / ``--backend`` value and the records' ``backend`` column.
        word: what a report calls its figures (``eager``, ``compiled``, ``graph replay``).
        devices: the device types it runs on.
        modes: its compile modes (``(None,)`` where not applicable); the first is the default.
        compiles: whether it runs torch.compile (compile modes and scopes, ``compile_time``,
            ``graph_breaks``, the compile rows, a recompile while timed is an error).
        captures: whether it captures a CUDA graph (``capture_time``; CUDA only; a group of its own).
        plain: whether each op is launched from Python as written (the reference the others are
            measured against: ``vs eager``; saved activations and profiler labels are its own).
        warmup_metric: the training row of its untimed warm-up (``warmup_time``, ``compile_time``,
            ``capture_time``).
        plan: what one training step is under it, as the plan says it.
    """

    name: str
    word: str
    devices: tuple[str, ...]
    modes: tuple[str | None, ...] = (None,)
    compiles: bool = False
    captures: bool = False
    plain: bool = False
    warmup_metric: str = "warmup_time"
    plan: str = ""

    @property
    def hides_launches(self) -> bool:
        """Whether its steps do not pay a Python launch per op (compiled or replayed)."""
        return not self.plain

    def scope(self, compile_scope: str | None) -> str | None:
        """``compile_scope`` where it compiles, else None (a scope means nothing to it)."""
        return compile_scope if self.compiles else None

    def unavailable(self, compile_mode: str | None, device: torch.device) -> str | None:
        """Why it (with ``compile_mode``) cannot run on ``device``, or None when it can."""
        if self.compiles and compile_mode == "reduce-overhead" and device.type != "cuda":
            return "compile mode reduce-overhead uses CUDA graphs: no CUDA device here"
        if self.captures and device.type != "cuda":
            return f"{self.name} captures CUDA work: no CUDA device here"
        return None

    @property
    def stage(self) -> str | None:
        """The heartbeat stage of its set-up (``compile``, ``capture``), None where it has none."""
        return "compile" if self.compiles else "capture" if self.captures else None

    def ready_step(self, model: nn.Module, mode: str, x, y, device: torch.device, compile_mode: str | None = None,
                   compile_scope: str | None = None, decode_input=None,
                   record: Callable[[str, float, str], None] | None = None) -> Callable[[], object]:
        """The step of ``mode`` (:func:`harness.step.modes.make_step`) on this backend, set up, with
        its set-up rows given to ``record(metric, value, unit)``: eager, the model's step; compile,
        the compiled step (:func:`prepare`), ``compile_time`` (its first call, the compile, off
        the clock) and ``graph_breaks``; cudagraph, the step captured in a CUDA graph
        (:class:`harness.step.cudagraph.GraphedStep`) and ``capture_time``.

        Raises:
            whatever the compile or the capture raises (the caller records it as the case's row).
        """
        record = record or (lambda metric, value, unit: None)
        if self.captures:
            step = GraphedStep(model, mode, x, y, decode_input=decode_input)
            record("capture_time", step.capture_time_s, "s")
            return step
        prepared = prepare(model, self.name, compile_mode, compile_scope)
        step = make_step(prepared.model, mode, x, y, clone_outputs=prepared.clone_outputs, decode_input=decode_input)
        if self.compiles:
            record("compile_time", first_call_seconds(step, device), "s")
            record("graph_breaks", graph_breaks(), "count")
        return step

    @contextlib.contextmanager
    def guard(self) -> Iterator[None]:
        """While its steps are timed: a recompile raises instead of running new code."""
        if self.compiles:
            with torch._dynamo.config.patch(error_on_recompile=True):
                yield
        else:
            yield


EAGER = Backend("eager", "eager", ("cpu", "cuda"), plain=True, plan="each op launched from Python")
COMPILE = Backend("compile", "compiled", ("cpu", "cuda"), ("default", "max-autotune-no-cudagraphs", "reduce-overhead"),
                  compiles=True, warmup_metric="compile_time",
                  plan="torch.compile(fullgraph=True), compiled once per run, off the clock")
CUDAGRAPH = Backend("cudagraph", "graph replay", ("cuda",), captures=True, warmup_metric="capture_time",
                    plan="forward, backward, clip and AdamW captured in one CUDA graph per run, the capture "
                         "off the clock")
#: Every backend by name, in the order the CLI lists them.
BY_NAME: dict[str, Backend] = {b.name: b for b in (EAGER, COMPILE, CUDAGRAPH)}
#: backend -> its compile modes (``None`` where not applicable); the first is the default.
BACKENDS: dict[str, tuple[str | None, ...]] = {b.name: b.modes for b in BY_NAME.values()}


def of(name: str | None) -> Backend:
    """The backend named ``name`` (None: eager, the default everywhere).

    Raises:
        ValueError: an unknown name (the CLI's choices make it unreachable from the command line).
    """
    if name is None:
        return EAGER
    try:
        return BY_NAME[name]
    except KeyError:
        raise ValueError(f"--backends: unknown backend {name!r}; known: {', '.join(BY_NAME)}") from None


def compiles(name: object) -> bool:
    """Whether backend ``name`` runs torch.compile (False for None, NaN or a name no backend has: a
    records column may hold any of them)."""
    b = BY_NAME.get(name) if isinstance(name, str) else None
    return b is not None and b.compiles


def captures(name: object) -> bool:
    """Whether backend ``name`` captures a CUDA graph (False as :func:`compiles` is)."""
    b = BY_NAME.get(name) if isinstance(name, str) else None
    return b is not None and b.captures


def plain(name: object) -> bool:
    """Whether backend ``name`` launches each op as written, the reference ``vs eager`` is taken
    against (False as :func:`compiles` is)."""
    b = BY_NAME.get(name) if isinstance(name, str) else None
    return b is not None and b.plain


#: What one compiled graph of the ``compile`` backend holds: ``layer``, one region per sublayer
#: role, each compiled once and called at every slot of its role
#: (:class:`workloads.decoder.Regions`), so compile time does not grow with depth; ``model``, the
#: whole forward unrolled into one graph (``torch.compile(model, fullgraph=True)``).
COMPILE_SCOPES = ("layer", "model")
#: The scope of ``--compile-scope`` when not given: ``model``, whose step times are the ones a cost
#: comparison trusts (on this project's CPU a layer-scope step was 1.02x a model-scope one for prenorm
#: but 1.09-1.39x for the block routers, so ``layer`` overstates a router's cost); ``layer`` is the
#: choice when compiling dominates (deep models, many cases). docs/SWEEPS.md, "Compile scopes", gives the
#: measurements.
DEFAULT_COMPILE_SCOPE = "model"


def unavailable_reason(backend: str, compile_mode: str | None, device: torch.device) -> str | None:
    """Why ``backend``/``compile_mode`` cannot run on ``device``, or None when it can."""
    return of(backend).unavailable(compile_mode, device)


@dataclass
class Prepared:
    """A model ready to time.

    Attributes:
        model: the module to call (compiled or not).
        clone_outputs: whether kept outputs must be cloned (CUDA-graph trees reuse their buffers).
    """

    model: Callable
    clone_outputs: bool = False


_reset_per_case = True


@contextlib.contextmanager
def one_dynamo_cache() -> Iterator[None]:
    """Inside, :func:`prepare` does not reset dynamo, so several compiled models can live side
    by side (a paired group); dynamo is reset once on entry and once on exit."""
    global _reset_per_case
    torch._dynamo.reset()
    _reset_per_case = False
    try:
        yield
    finally:
        _reset_per_case = True
        torch._dynamo.reset()


def prepare(model: nn.Module, backend: str, compile_mode: str | None,
            compile_scope: str | None = DEFAULT_COMPILE_SCOPE) -> Prepared:
    """Wrap ``model`` for ``backend``; compilation itself happens at the first call.

    Under ``compile`` with ``compile_scope="layer"`` the model itself is returned, its forward
    running regions each compiled with ``fullgraph=True`` and ``compile_mode``
    (:meth:`workloads.decoder.Decoder` ``.regions``); with ``"model"`` the compiled module.

    Raises:
        ValueError: unknown backend or compile scope, or ``reduce-overhead`` under the layer scope
            (each region would start a CUDA-graph-trees step that overwrites the outputs of the
            regions before it: the model scope or the ``cudagraph`` backend capture graphs).
    """
    b = of(backend)
    if b.compiles and compile_mode == "reduce-overhead" and compile_scope == "layer":
        raise ValueError("--compile-modes reduce-overhead with --compile-scope layer: each compiled region "
                         "would start a CUDA-graph-trees step that overwrites the regions before it; use "
                         "--compile-scope model (or --backends cudagraph)")
    if not b.compiles:  # cudagraph captures the eager step (harness.step.cudagraph)
        return Prepared(model)
    if _reset_per_case:
        torch._dynamo.reset()  # no compiled code reused from an earlier case
    if compile_scope == "layer":
        from workloads.decoder import Regions
        model.regions = Regions(lambda f: torch.compile(f, fullgraph=True, mode=compile_mode))
        return Prepared(model, clone_outputs=compile_mode == "reduce-overhead")
    if compile_scope not in (None, "model"):
        raise ValueError(f"--compile-scope: unknown scope {compile_scope!r}; known: {', '.join(COMPILE_SCOPES)}")
    return Prepared(torch.compile(model, fullgraph=True, mode=compile_mode),
                    clone_outputs=compile_mode == "reduce-overhead")


#: The counters behind the compile rows of a case (``torch._dynamo.utils.counters``): dynamo's
#: compiled frames and graphs, Inductor's FX-graph cache and AOTAutograd's cache.
COUNTERS = {"frames": ("frames", "ok"), "graphs": ("stats", "unique_graphs"),
            "fxgraph_cache_hit": ("inductor", "fxgraph_cache_hit"),
            "fxgraph_cache_miss": ("inductor", "fxgraph_cache_miss"),
            "fxgraph_cache_bypass": ("inductor", "fxgraph_cache_bypass"),
            "aot_cache_hit": ("aot_autograd", "autograd_cache_hit"),
            "aot_cache_miss": ("aot_autograd", "autograd_cache_miss")}


def compile_counters() -> dict[str, int]:
    """A snapshot of :data:`COUNTERS`. They are process-wide and only grow (nothing here clears
    them), so :func:`compile_rows` takes the difference of two snapshots."""
    from torch._dynamo.utils import counters
    return {k: int(counters[a][b]) for k, (a, b) in COUNTERS.items()}


def compile_rows(before: dict[str, int], after: dict[str, int], regions: int) -> dict[str, int]:
    """What compiling one case took, from two :func:`compile_counters` snapshots around its
    compile and warm-up.

    Args:
        regions: compiled functions the case has (1 under the model scope; its regions under the
            layer scope), each expected to compile exactly once.

    Returns:
        ``graphs_fwd`` (dynamo graphs: each is one forward graph Inductor compiled,
        ``stats.unique_graphs``), ``graphs_bwd`` (Inductor graphs beyond those: the backward of
        each forward with a backward; ``inductor.fxgraph_cache_{hit,miss,bypass}`` count every
        Inductor graph), ``recompiles`` (frames compiled beyond one per function,
        ``frames.ok``), ``fxgraph_cache_hit``, ``fxgraph_cache_miss``, ``aot_cache_hit``,
        ``aot_cache_miss`` (AOTAutograd's ``autograd_cache_{hit,miss}``).
    """
    d = {k: after[k] - before[k] for k in after}
    inductor = d["fxgraph_cache_hit"] + d["fxgraph_cache_miss"] + d["fxgraph_cache_bypass"]
    return {"graphs_fwd": d["graphs"], "graphs_bwd": max(0, inductor - d["graphs"]),
            "recompiles": max(0, d["frames"] - regions), "fxgraph_cache_hit": d["fxgraph_cache_hit"],
            "fxgraph_cache_miss": d["fxgraph_cache_miss"], "aot_cache_hit": d["aot_cache_hit"],
            "aot_cache_miss": d["aot_cache_miss"]}


def graph_breaks() -> int:
    """Graph breaks dynamo counted since the last ``torch._dynamo.reset()``."""
    from torch._dynamo.utils import counters
    return int(sum(counters["graph_break"].values()))


def first_call_seconds(step: Callable[[], object], device: torch.device) -> float:
    """Wall time of one call including compilation, synchronised, in seconds."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - t0


@contextlib.contextmanager
def recompile_guard(backend: str) -> Iterator[None]:
    """While timing a compiled model, a recompile raises instead of running new code."""
    with of(backend).guard():
        yield


def _warm_compile_pool() -> None:
    """Start Inductor's pool of compile workers and its first job (``AsyncCompile.warm_pool``,
    ``use_process_pool``): until the pool answers, Inductor compiles each kernel in the main
    process, one after the other. Nothing where this torch lacks them."""
    with contextlib.suppress(Exception):
        from torch._inductor.async_compile import AsyncCompile
        AsyncCompile.warm_pool()
        AsyncCompile.use_process_pool()


def warm_inductor(device: torch.device) -> Callable[[], None]:
    """Start, in background threads, the work Inductor does once per process before its first
    compile, and return the function that waits for it (call it before the first compile).

    Inductor compiles kernels in a pool of worker processes, but only once the pool has started and
    answered its first job: until then each kernel compiles in the main process. On a CPU it first
    finds which vector ISAs both the compiler and the CPU support
    (``torch._inductor.cpu_vec_isa.valid_vec_isa_list``): it builds a test program per ISA with the
    system compiler and loads it in a child process, one after the other. On this project's 2-core
    CPU that took 11-13 s of the first compiled case's 40 s, cold, nearly all of it waiting on those
    child processes. Here the pool is started and each ISA probed in a thread of its own while the
    group's eager cases are set up (nothing is timed then), so the first compile no longer carries
    them and its ``compile_time`` is the model's own. Where this torch has neither (a release that
    moved them), nothing starts and the returned function returns at once. The meta device starts
    nothing.
    """
    if device.type not in ("cpu", "cuda"):
        return lambda: None
    isas: list = []
    probe: Callable[[], object] = lambda: None  # noqa: E731
    if device.type == "cpu":
        try:
            from torch._inductor import cpu_vec_isa
            probe, isas = cpu_vec_isa.valid_vec_isa_list, list(cpu_vec_isa.supported_vec_isa_list)
            flags = cpu_vec_isa.x86_isa_checker() if hasattr(cpu_vec_isa, "x86_isa_checker") else None
        except Exception:  # noqa: BLE001 - an optimisation only: the compile probes as it always did
            return lambda: None
        if flags is not None:  # only those this CPU has (the probe skips the others without building)
            isas = [i for i in isas if all(f in flags for f in str(i).split())]

    def one(isa) -> None:
        with contextlib.suppress(Exception):
            bool(isa)  # builds and loads its test program; cached per ISA for the process

    def run() -> None:
        threads = [threading.Thread(target=f, args=a, daemon=True)
                   for f, a in [(_warm_compile_pool, ()), *((one, (i,)) for i in isas)]]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        with contextlib.suppress(Exception):
            probe()  # cached from here on, so the first compile reads it

    t = threading.Thread(target=run, name="warm-inductor", daemon=True)
    t.start()
    return t.join
