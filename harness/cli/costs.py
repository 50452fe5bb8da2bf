"""``routerbench costs``: what one step of each router and impl dispatches and moves, counted on the
meta device (no timing, no Triton: a ``fused`` kernel's launch is recorded with its declared byte
model), beside the ideal models and the floor (docs/MEASUREMENT.md, "The byte rule";
docs/ROUTERS.md, "The ideal fwd+bwd model")."""

from __future__ import annotations

import json
import textwrap

import click

from . import SHORT_HELP
from ..spec.costs import CostsSpec
from .common import load_spec, spec_options

#: The fields of every row (``--json``), in order.
#: ``bytes_per_token_sublayer`` and ``ideal_io_per_token_sublayer`` are bytes per token and
#: sublayer of the counted step (the count, and the ideal model of the same step); every
#: ``*_units`` field is that in units of d elements of the dtype; ``ideal_fwd_units`` is the
#: forward half of the ideal model whatever the mode; ``saved_units`` is None for a forward.
#: ``not_declared`` lists the cost models the router does not declare (``routers.api.MAY_GIVE``
#: names): their fields (``ideal_*``, ``floor_units``, ``x_floor``, ``router_flops_per_token``) are
#: None, and the text table says "not declared" in their cells.
FIELDS = ("router", "impl", "d_model", "n_layers", "tokens", "dtype", "scope", "mode", "launches_kernel",
          "launches_other", "launches", "launches_vs_prenorm", "bytes_per_token_sublayer", "units",
          "units_kernel", "units_vs_prenorm", "ideal_io_per_token_sublayer", "ideal_units", "ideal_fwd_units",
          "floor_units", "x_floor", "saved_units", "saved_vs_prenorm", "router_flops_per_token", "not_declared",
          "error")


def cost_rows(spec: CostsSpec) -> list[dict]:
    """One row per router × impl (where offered) × width × depth × scope (:data:`FIELDS`): its
    launches, bytes per token and sublayer (and in units of d), each against prenorm's at the same
    shape and scope; the ideal forward model, the ideal model of the counted step and the floor
    (router − prenorm in that model) with ``x_floor`` = (units − prenorm's) / floor; the saved
    activations; the router's analytic forward FLOPs per token. A case that cannot be counted (an
    impl not offered, a width ``fused`` refuses) has its ``error``."""
    import torch

    from harness.costs.step_costs import step_costs
    from harness.sweep.cases import offered_impls
    from routers import BASELINE, build_router, router_options
    from routers.errors import ConfigError
    c = spec.costs
    dtype = getattr(torch, c.dtype)
    backward = not c.forward_only
    rows: list[dict] = []
    for d in c.widths:
        for L in c.depths:
            for scope in c.scopes:
                base = None
                for router in c.routers:
                    offered = offered_impls(router)
                    wanted = [i for i in c.impls if i in offered] or (offered[:1] if router == BASELINE else [])
                    if not wanted:  # said, not swapped for another impl
                        rows.append({"router": router, "impl": "–", "d_model": d, "n_layers": L, "tokens": c.tokens,
                                     "dtype": c.dtype, "scope": scope, "mode": "fwd_bwd" if backward else "fwd",
                                     "error": f"offers none of --impls {','.join(c.impls)} (it offers "
                                              f"{','.join(offered)})"})
                        continue
                    for impl in wanted:
                        row = {"router": router, "impl": impl, "d_model": d, "n_layers": L, "tokens": c.tokens,
                               "dtype": c.dtype, "scope": scope, "mode": "fwd_bwd" if backward else "fwd"}
                        try:
                            s = step_costs(router, d, L, c.tokens, dtype, impl=impl, region=scope == "layer",
                                           backward=backward)
                            r = build_router(router, d, L, **({"impl": impl} if "impl" in router_options(router) else {}))
                        except (ConfigError, ValueError, RuntimeError) as exc:
                            why = str(exc).removeprefix(f"--router-options: {router}: ")
                            rows.append({**row, "error": why if isinstance(exc, ConfigError)
                                         else f"{type(exc).__name__}: {why}"})
                            continue
                        ideal = _ideal(r, scope, backward)
                        width = d * dtype.itemsize
                        flops = r.analytic_fwd_flops(1, c.tokens)
                        fwd_units = _forward(r, scope)
                        missing = [m for m, v in (("analytic_fwd_flops", flops), ("ideal_io_fwd_per_token", fwd_units),
                                                  ("ideal_io_fwd_bwd_per_token", ideal if backward else 0))
                                   if v is None]
                        row.update(launches_kernel=s.launches_kernel, launches_other=s.launches_other,
                                   launches=s.launches, bytes_per_token_sublayer=s.per_token_sublayer(s.bytes),
                                   units=s.units(s.bytes), units_kernel=s.units(s.bytes_kernel),
                                   ideal_io_per_token_sublayer=None if ideal is None else ideal * width,
                                   ideal_units=ideal, ideal_fwd_units=fwd_units,
                                   saved_units=s.units(s.saved_bytes) if backward else None,
                                   router_flops_per_token=None if flops is None else flops / c.tokens,
                                   not_declared=missing)
                        if base is None:
                            base = row
                        row.update(launches_vs_prenorm=row["launches"] / base["launches"],
                                   units_vs_prenorm=row["units"] - base["units"],
                                   saved_vs_prenorm=row["saved_units"] - base["saved_units"] if backward else None,
                                   floor_units=None if ideal is None or base["ideal_units"] is None
                                   else ideal - base["ideal_units"])
                        f = row["floor_units"]
                        row["x_floor"] = row["units_vs_prenorm"] / f if f else None
                        rows.append(row)
    return [{k: r.get(k) for k in FIELDS} for r in rows]


def _padded(method) -> dict:
    """``layout="padded"`` where a cost model takes the layer scope's pool (the block routers')."""
    import inspect
    return {"layout": "padded"} if "layout" in inspect.signature(method).parameters else {}


def _forward(r, scope: str) -> float:
    """The forward half of the ideal model (the floor's, docs/ROUTERS.md)."""
    return r.ideal_io_fwd_per_token(**(_padded(r.ideal_io_fwd_per_token) if scope == "layer" else {}))


def _ideal(r, scope: str, backward: bool) -> float | None:
    """The ideal model of the counted step: the forward's, or the training step's (None where the
    router declares none)."""
    if not backward:
        return _forward(r, scope)
    method = r.ideal_io_fwd_bwd_per_token
    return method(**(_padded(method) if scope == "layer" else {}))


def _table(rows: list[dict]) -> str:
    """The rows as a text table, one per router, impl and scope, at each shape."""
    import pandas as pd

    from routers.api import NOT_DECLARED
    t = pd.DataFrame(rows)
    ok = t[t["error"].isna()] if "error" in t else t
    fmt = {"launches_kernel": "{:.0f}", "launches_other": "{:.0f}", "launches": "{:.0f}", "launches_vs_prenorm": "{:.2f}", "units": "{:.2f}", "units_kernel": "{:.2f}",
           "units_vs_prenorm": "{:+.2f}", "ideal_units": "{:.2f}", "floor_units": "{:.2f}", "x_floor": "{:.2f}",
           "saved_units": "{:.2f}"}
    cols = ["d_model", "n_layers", "scope", "router", "impl", "launches_kernel", "launches_other", "launches",
            "launches_vs_prenorm", "units", "units_kernel", "units_vs_prenorm", "ideal_units", "floor_units",
            "x_floor", "saved_units"]
    shown = ok[cols].copy()
    undeclared = [bool(m) for m in (ok["not_declared"] if "not_declared" in ok else [None] * len(ok))]
    for k, f in fmt.items():
        said = NOT_DECLARED if k in ("ideal_units", "floor_units", "x_floor") else "–"
        shown[k] = [((said if nd else "–") if v is None or v != v else f.format(v))
                    for v, nd in zip(shown[k], undeclared)]
    head = {"launches_kernel": "kernels", "launches_other": "other_ops", "launches_vs_prenorm": "launches/prenorm",
            "units": "units", "units_kernel": "units_kernels", "units_vs_prenorm": "units-prenorm",
            "ideal_units": "ideal", "floor_units": "floor", "x_floor": "x_floor", "saved_units": "saved"}
    text = shown.rename(columns=head).to_string(index=False)
    for r in ok.to_dict("records"):
        if r.get("not_declared"):
            text += (f"\n{NOT_DECLARED}: {r['router']} d={r['d_model']} L={r['n_layers']} {r['scope']} declares no "
                     f"{', '.join(r['not_declared'])} (docs/PLUGINS.md): its ideal, floor and FLOPs are not given")
    bad = t[t["error"].notna()] if "error" in t else t.iloc[:0]
    for r in bad.to_dict("records"):
        text += f"\nnot counted: {r['router']} {r['impl']} d={r['d_model']} L={r['n_layers']} {r['scope']}: {r['error']}"
    return text


@click.command("costs", short_help=SHORT_HELP["costs"])
@spec_options(CostsSpec)
def costs_cmd(config, **cli) -> None:
    """What one training step (or, with --forward-only, one forward) of each router and impl
    dispatches and moves: launches (Triton kernels and other ops), bytes per token and sublayer by
    the byte rule, in units of d elements, each against prenorm, the ideal model and the floor
    (docs/ROUTERS.md), saved activations. Counted on the meta device at the byte rule's reference
    shape by default (d=1024, 12 layers, 8,192 tokens, bf16): nothing runs or is timed, and fused's
    kernels are counted by their declared byte models (no Triton needed)."""
    spec, _ = load_spec(CostsSpec, cli, config)
    rows = cost_rows(spec)
    if spec.costs.json:
        for r in rows:
            click.echo(json.dumps(r))
        return
    fwd = spec.costs.forward_only
    half = "the forward half of " if fwd else ""
    click.echo(textwrap.fill(f"one {'forward' if fwd else 'training step (forward and backward)'} of route() alone, "
               f"{spec.costs.tokens} tokens, {spec.costs.dtype} (docs/IMPLS.md, \"What a step dispatches and moves\"). "
               "kernels, other_ops: launches (our Triton kernels; other ops that launch work). units: bytes per "
               "token and sublayer / (d x element size), by the byte rule; units_kernels: the kernels' part. "
               f"ideal: {half}the ideal fwd+bwd model (docs/ROUTERS.md); floor = ideal - prenorm's; "
               "x_floor = (units - prenorm's) / floor"
               + ("." if fwd else "; saved: the activations autograd keeps, in units too."), width=110))
    click.echo(_table(rows))


COMMANDS = (costs_cmd,)
