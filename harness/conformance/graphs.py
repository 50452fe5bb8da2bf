"""What the compiler sees of a router, with Dynamo's ``eager`` backend (no code generation: seconds
on a CPU):

- :func:`graph_breaks`: ``torch._dynamo.explain`` over the forward of a tiny decoder under the
  model compile scope; each break is one failed line with its reason and the innermost project
  (or plugin) file:line of its stack (``--compile-scope model`` compiles the whole step as one
  graph: ``fullgraph=True`` would refuse a break);
- :func:`layer_recompiles`: the layer scope's regions (:class:`workloads.decoder.Regions`) compiled
  with ``fullgraph=True`` at 4 and at 8 layers: the region count must not grow with depth and
  no region may compile twice (a role or a state layout that depends on the slot's index);
- :func:`inductor_equality` (``--inductor``): the model-scope step compiled by Inductor against
  eager, loss and every gradient, norm-relative ``TOLERANCES[float32]`` of the parity check.
"""

from __future__ import annotations

import contextlib
import logging
import re
from typing import Iterator

import torch

from harness.step.guard import project_frame
from harness.sweep.parity import TOLERANCES
from routers import router_options
from workloads.decoder import Regions, region_count

from .capture import CFG, tiny_model, tokens
from .findings import Finding, rel_err

#: Depths (layers) of the layer-scope recompile check (a router with ``n_blocks`` runs 2 blocks
#: at both: 2 and 4 layers per block, so every role of a block occurs at both).
DEPTHS = (4, 8)


@contextlib.contextmanager
def quiet_dynamo() -> Iterator[None]:
    """Dynamo's graph-break warnings off (the findings say them, once each); a fresh cache on
    entry and on exit, and Dynamo's counters (graph breaks, unique graphs) as they were on entry:
    a check leaves no trace in what the caller's process counts next."""
    from torch._dynamo.utils import counters
    saved = {key: dict(value) for key, value in counters.items()}
    log = logging.getLogger("torch._dynamo")
    level = log.level
    log.setLevel(logging.ERROR)
    torch._dynamo.reset()
    try:
        yield
    finally:
        torch._dynamo.reset()
        counters.clear()
        for key, value in saved.items():
            counters[key].update(value)
        log.setLevel(level)


def _what(exc: BaseException) -> str:
    """``file:line: reason (explanation)`` of Dynamo's error: the innermost project or plugin
    frame of its user stack, its first line and its explanation."""
    stack = getattr(exc, "real_stack", None) or []
    where = project_frame((f.filename, f.lineno) for f in stack)
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    head = lines[0] if lines else type(exc).__name__
    why = next((ln for ln in lines[1:] if ln.startswith("Explanation:")), "")
    text = " ".join(f"{head}{f' ({why})' if why else ''}".split())[:300]
    return (f"{where[0]}:{where[1]}: " if where else "") + text


def graph_breaks(name: str, options: dict | None = None, device: str = "cpu") -> list[Finding]:
    """Graph breaks of the model-scope forward (module doc): one ``graph breaks`` finding; a
    failure places the first break at its file:line (a ``fullgraph=True`` compile's error) and
    counts them all (a compile that may break, ``counters["graph_break"]``)."""
    from torch._dynamo.utils import counters
    model = tiny_model(name, options, device=device)
    x, _ = tokens(device=device)
    with quiet_dynamo():
        try:
            torch.compile(model, backend="eager", fullgraph=True)(x)
            return [Finding("graph breaks", True, "", "0 breaks (model scope, eager backend)")]
        except Exception as exc:  # noqa: BLE001 - Unsupported, or any error while tracing
            first = _what(exc)
        torch._dynamo.reset()
        counters["graph_break"].clear()
        try:
            torch.compile(model, backend="eager")(x)
            n = int(sum(counters["graph_break"].values()))
        except Exception:  # noqa: BLE001 - the count is a figure; the first break is the finding
            n = 1
    return [Finding("graph breaks", False, f"graph break at {first}; keep read/write/output free of Python side "
                    "effects (print, logging), of Python branches on tensor values (torch.where) and of host "
                    "copies (.item(), .tolist())", f"{n} breaks (model scope, eager backend)")]


def layer_recompiles(name: str, options: dict | None = None, device: str = "cpu") -> list[Finding]:
    """Region counts and recompiles under the layer scope at :data:`DEPTHS` (module doc): one
    ``layer recompiles`` finding (failed: what grew or recompiled, and why it does)."""
    from torch._dynamo.utils import counters
    regions, frames = {}, {}
    opts = dict(options or {})
    if "n_blocks" in router_options(name):
        opts["n_blocks"] = 2
    for L in DEPTHS:
        model = tiny_model(name, opts, CFG.replace(n_layers=L), device)
        model.regions = Regions(lambda f: torch.compile(f, backend="eager", fullgraph=True))
        x, _ = tokens(device=device)
        with quiet_dynamo():
            before = int(counters["stats"]["unique_graphs"])
            try:
                model(x)
            except NotImplementedError as exc:
                return [Finding("layer recompiles", True, "",
                                f"layer scope not supported: {' '.join(str(exc).split())[:120]}")]
            except Exception as exc:  # noqa: BLE001 - a region that is not one graph
                return [Finding("layer recompiles", False, f"a region of the layer scope (L={L}) is not one "
                                f"graph: {_what(exc)}; see the graph breaks line")]
            frames[L] = int(counters["stats"]["unique_graphs"]) - before
        regions[L] = region_count(model.router)
    fig = ", ".join(f"L={L}: {regions[L]} regions, {frames[L] - regions[L]} recompiles" for L in DEPTHS)
    lo, hi = DEPTHS
    if regions[hi] != regions[lo]:
        return [Finding("layer recompiles", False, f"its regions grow with depth ({regions[lo]} at L={lo}, {regions[hi]} "
                        f"at L={hi}): role(slot) must depend on the slot's kind and position in its block, never "
                        "on slot.index", fig)]
    extra = {L: frames[L] - regions[L] for L in DEPTHS if frames[L] > regions[L]}
    if extra:
        L, n = next(iter(extra.items()))
        return [Finding("layer recompiles", False, f"{n} recompiles at L={L} ({_first_recompile(name, opts, L, device)}): "
                        "keep the packed state's shapes, strides and aliasing the same at every slot (begin() pads "
                        "what grows; no expanded views; no tensor both in the state and in params) and pass "
                        "per-slot values as tensors from params()", fig)]
    return [Finding("layer recompiles", True, "", fig)]


def _first_recompile(name: str, options: dict, n_layers: int, device: str) -> str:
    """The guard that failed at the first recompile of the layer scope (Dynamo's
    ``error_on_recompile``): ``region sublayer_region_1: Duplicate tensors found: …``."""
    model = tiny_model(name, options, CFG.replace(n_layers=n_layers), device)
    model.regions = Regions(lambda f: torch.compile(f, backend="eager", fullgraph=True))
    x, _ = tokens(device=device)
    with quiet_dynamo(), torch._dynamo.config.patch(error_on_recompile=True):
        try:
            model(x)
        except Exception as exc:  # noqa: BLE001 - RecompileError (or another error: said as it is)
            lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
            fn = lines[0].split(" in ")[0].replace("Recompiling function ", "region ") if lines else ""
            guard = next((ln.lstrip("- ") for ln in lines if ln.startswith("- ")), lines[-1] if lines else "")
            guard = re.sub(r"^\d+/\d+: ", "", guard)  # Dynamo's frame/compile ids
            return " ".join(f"{fn}: {guard}".split())[:200]
    return "the guard that failed did not fail again"


def _loss_and_grads(model, x, y, run=None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Loss and gradients (by ``model``'s parameter names) of one step run by ``run`` (default
    ``model``; e.g. its compiled wrapper, whose names carry a prefix)."""
    from harness.step.modes import lm_loss
    for p in model.parameters():
        p.grad = None
    loss = lm_loss((model if run is None else run)(x), y)
    loss.backward()
    return loss.detach(), {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def inductor_equality(name: str, options: dict | None = None, device: str = "cpu") -> list[Finding]:
    """The model-scope ``fwd_bwd`` step under Inductor against eager (module doc): one
    ``inductor`` finding with the worst norm-relative error over the loss and every gradient."""
    model = tiny_model(name, options, device=device)
    x, y = tokens(device=device)
    ref, gref = _loss_and_grads(model, x, y)
    with quiet_dynamo():
        try:
            got, grads = _loss_and_grads(model, x, y, torch.compile(model))
        except Exception as exc:  # noqa: BLE001
            return [Finding("inductor", False, f"Inductor failed to compile the step: {_what(exc)}")]
    errs = {"loss": rel_err(got, ref), **{f"grad {k}": rel_err(grads.get(k, torch.zeros_like(v)), v)
                                         for k, v in gref.items()}}
    worst = max(errs, key=lambda k: errs[k])
    tol = TOLERANCES[torch.float32]
    fig = f"max rel err {errs[worst]:.1e} ({worst}) <= {tol:.0e}" if errs[worst] <= tol else f"{errs[worst]:.1e} ({worst})"
    ok = errs[worst] <= tol
    return [Finding("inductor", ok, "" if ok else f"Inductor's step differs from eager: {worst} rel err "
                    f"{errs[worst]:.1e} > {tol:.0e}; look for ops whose result depends on evaluation order "
                    "or on uninitialised memory", fig)]
