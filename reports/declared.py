"""Cost models a router does not declare (docs/PLUGINS.md, what a router may give): where a router leaves out
``analytic_fwd_flops``, ``live_state_bytes`` or an ideal I/O model, its count rows are ``skipped``
with an ``error`` starting ``not declared`` (:mod:`harness.sweep.counts`), its cells in the tables
are blank (NaN), and the report says so in words (:func:`sentence`), never a number.
"""

from __future__ import annotations

import pandas as pd

from routers.api import NOT_DECLARED

#: The count rows of each cost model (:func:`harness.sweep.counts.measure_router_costs`) and the
#: model a router declares to have them.
MODEL_OF = {"router_flops_analytic": "analytic_fwd_flops", "router_state": "live_state_bytes",
            "router_io_ideal": "ideal_io_per_token"}


def mask(df: pd.DataFrame) -> pd.Series:
    """Rows of ``df`` (record rows) that say a cost model is not declared."""
    if df.empty or "error" not in df:
        return pd.Series(False, index=df.index)
    return (df["status"] == "skipped") & df["error"].astype(str).str.startswith(NOT_DECLARED)


def undeclared(df: pd.DataFrame) -> dict[str, list[str]]:
    """router -> the cost models (names of ``routers.api.MAY_GIVE``) it does not declare, from
    the count rows of ``df``; routers that declare every one are absent."""
    rows = df[mask(df)]
    out: dict[str, list[str]] = {}
    for router, metric in rows[["router", "metric"]].drop_duplicates().itertuples(index=False):
        out.setdefault(router, [])
        model = MODEL_OF.get(metric, metric)
        if model not in out[router]:
            out[router].append(model)
    return {r: sorted(m) for r, m in sorted(out.items())}


def sentence(df: pd.DataFrame, what: str = "its cells are blank") -> str | None:
    """One sentence naming each router of ``df`` that declares no cost model of
    :data:`MODEL_OF` and what it leaves out (``"Not declared: router myr declares no
    analytic_fwd_flops, live_state_bytes (docs/PLUGINS.md); its cells are blank, never a
    number."``), or None when every router declares them all."""
    missing = undeclared(df)
    if not missing:
        return None
    who = "; ".join(f"router {r} declares no {', '.join(m)}" for r, m in missing.items())
    return f"Not declared: {who} (docs/PLUGINS.md); {what}, never a number."


def floor_sentence(floor_t: pd.DataFrame) -> str | None:
    """One sentence naming the routers of a floor table (:func:`reports.floor.floor_table`) whose
    floor is not declared (their router declares no ideal I/O model of the step's mode, or is
    not loaded here), or None."""
    if floor_t.empty or "extra_bytes" not in floor_t:
        return None
    gone = sorted(set(floor_t.loc[floor_t["extra_bytes"].isna(), "router"]))
    if not gone:
        return None
    return (f"Floor {NOT_DECLARED} for {', '.join(gone)}: the router declares no ideal I/O model "
            "(ideal_io_fwd_per_token / ideal_io_fwd_bwd_per_token, docs/PLUGINS.md) or is not loaded here; "
            "its floor cells are blank, never a number.")


__all__ = ["MODEL_OF", "floor_sentence", "mask", "sentence", "undeclared"]
