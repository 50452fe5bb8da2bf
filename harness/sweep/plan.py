"""Planning a sweep's cases into units of resume (DESIGN.md, "Results"; MEASUREMENT.md, "Timing").

With paired timing (the default) the cases that share mode, workload, shape and seed form one
group (:func:`group_key`), timed interleaved: eager and compiled steps of one shape together, so
"vs eager" is a per-pair ratio as "vs prenorm" is; CUDA-graph replays keep a group of their own.
``compile`` with ``reduce-overhead`` is never paired (:func:`pairable`): CUDA-graph trees are one
tree and one memory pool per device, ``torch._dynamo.reset()`` per case tears them down, and a call
of another compiled model may overwrite or re-record them (pytorch/pytorch#170604). A group
estimated above the memory budget is split into subgroups that each hold prenorm
(:func:`split_group`). Without pairing, each case is its own unit.

Memory: a group's models (with their gradients, optimizer state, KV caches or CUDA-graph pools)
are all resident while it is timed. On CPU, ~10 small models are nothing; on CUDA resident memory
grows with the group (about 20 cases × (weights + grads) at the cuda-default grid's largest shape,
~35 GiB in bf16), so a large shape that fits alone may OOM in a group: the split, or
``--no-paired``, times fewer at once.
"""

from __future__ import annotations

from typing import Iterable

from harness.costs.estimate import step_bytes
from harness.step.backends import captures, compiles
from routers import BASELINE

from .cases import Case
from .options import PAIRED_DEFAULT


def case_bytes(case: Case) -> int:
    """The estimated memory one case holds while its group is timed, in bytes
    (:func:`harness.costs.estimate.step_bytes`)."""
    return step_bytes(case.cfg, case.router, case.router_kwargs(), case.mode)


def group_key(case: Case) -> tuple:
    """What the cases of one paired group share: mode, the whole decoder config (workload and
    shape) and seed; they differ in router, options, impl and backend. Eager and compiled steps of
    one shape are timed in one interleaved group, so "vs eager" is a per-pair ratio as "vs prenorm"
    is; CUDA-graph replays keep a group of their own (a capture beside compiled graphs is not
    worth the risk to the others)."""
    return ("cudagraph" if captures(case.backend) else "eager/compile", case.mode, case.cfg, case.seed)


def pairable(case: Case) -> bool:
    """Whether the case can be timed in a group (``reduce-overhead`` cannot: see the module doc)."""
    return not (compiles(case.backend) and case.compile_mode == "reduce-overhead")


def split_group(group: list[Case], budget: int | None) -> list[list[Case]]:
    """``group`` as one unit when its estimated memory (:func:`harness.costs.estimate.step_bytes`) fits ``budget`` bytes,
    else as subgroups that each hold every ``prenorm`` case of the group (the A of every pair) and
    whole routers (a router's eager and compiled steps stay together, so "vs eager" stays paired),
    packed in order; a router that does not fit even alone with prenorm gets a subgroup of its own
    (it may then fail as an ``oom`` row)."""
    if budget is None or sum(case_bytes(c) for c in group) <= budget:
        return [group]
    anchors = [c for c in group if c.router == BASELINE]
    buckets: dict[tuple, list] = {}
    for c in group:
        if c.router != BASELINE:
            buckets.setdefault((c.router, str(sorted(c.router_kwargs().items())), c.impl), []).append(c)
    base = sum(case_bytes(c) for c in anchors)
    parts, cur, used = [], [], base
    for bucket in buckets.values():
        need = sum(case_bytes(c) for c in bucket)
        if cur and used + need > budget:
            parts.append(anchors + cur)
            cur, used = [], base
        cur += bucket
        used += need
    if cur or not parts:
        parts.append(anchors + cur)
    return parts


def sweep_units(cases: Iterable[Case], paired: bool = PAIRED_DEFAULT,
                budget_bytes: int | None = None) -> list[list[Case]]:
    """The units of a sweep in order of first appearance: paired groups (split when their
    estimated memory exceeds ``budget_bytes``, :func:`split_group`), or single
    cases."""
    groups: dict[object, list[Case]] = {}
    for i, case in enumerate(cases):
        key = group_key(case) if paired and pairable(case) else ("alone", i)
        groups.setdefault(key, []).append(case)
    return [part for g in groups.values() for part in (split_group(g, budget_bytes) if len(g) > 1 else [g])]


def split_groups(cases: Iterable[Case], paired: bool, budget_bytes: int | None) -> list[dict]:
    """For the manifest: each paired group that was split, with its subgroups' case counts."""
    whole = sweep_units(cases, paired, None)
    out = []
    for g in whole:
        parts = split_group(g, budget_bytes) if len(g) > 1 else [g]
        if len(parts) > 1:
            c = g[0]
            out.append({"mode": c.mode, "d_model": c.cfg.d_model, "n_layers": c.cfg.n_layers,
                        "cases": len(g), "subgroups": [len(p) for p in parts]})
    return out
