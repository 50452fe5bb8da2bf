"""The mHC conventions of every mHC implementation timed (docs/BASELINES.md, "Stream routers"): mHC has no
single reference, its public ports disagree on the Sinkhorn start and iteration count, which of
H_res and H_resᵀ mixes the streams, the H_post multiplier and where ε sits, so a time of "mHC" is
only reproducible beside the conventions it ran with. One row per run, impl and options: each
convention resolved (the router's defaults, the paper's, overridden by the case's options) and the
public port whose conventions it matches, if any.
"""

from __future__ import annotations

import json

import pandas as pd

from routers import router_options

#: The options that name a convention, in the order of BASELINES.md's table.
OPTIONS = ("sk_init", "sk_iters", "sk_last", "res_apply", "post_mult", "pre_eps", "rms_eps", "rms_eps_mode",
           "readout", "n")
#: Ports whose coefficients our options reproduce (docs/BASELINES.md, "Cross-checks"): name → options.
PORTS = {
    "paper (arXiv:2512.24880)": {},
    "TileKernels 1.0.0": {"sk_init": "softmax_eps", "sk_iters": 10, "res_apply": "HT", "post_mult": 1.0,
                          "pre_eps": 1e-6},
    "Liger (LigerMHC)": {"sk_init": "softmax_eps"},
}
COLUMNS = ["run_id", "impl", "options", *OPTIONS, "matches"]
METHOD = ("The conventions each timed mHC implementation ran with (docs/BASELINES.md): the router's "
          "defaults are the paper's; `matches` names the public port whose coefficients these options "
          "reproduce, if any.")


def _given(raw) -> dict:
    if isinstance(raw, dict):
        return raw
    if isinstance(raw, str) and raw.strip():
        return json.loads(raw)
    return {}


def matches(resolved: dict) -> str:
    """The ports of :data:`PORTS` whose conventions ``resolved`` equals on :data:`OPTIONS`."""
    defaults = router_options("mhc")
    out = [name for name, port in PORTS.items()
           if all(resolved[k] == {**defaults, **port}[k] for k in OPTIONS)]
    return ", ".join(out) or "none of the ports in docs/BASELINES.md"


def conventions_table(df: pd.DataFrame) -> pd.DataFrame:
    """One row per run, impl and options of the ``mhc`` cases with an ``ok`` step time.

    Args:
        df: a frame of :func:`reports.frame.load_frame`.

    Returns:
        :data:`COLUMNS`: every convention resolved, and ``matches``; empty without mhc rows.
    """
    rows = df[(df["router"] == "mhc") & (df["metric"] == "step_time") & (df["status"] == "ok")]
    if rows.empty:
        return pd.DataFrame(columns=COLUMNS)
    defaults = router_options("mhc")
    out = []
    for (run, impl, label), g in rows.groupby(["run_id", "impl", "options"], sort=True):
        resolved = {**defaults, **_given(g["router_options"].iloc[0])}
        out.append({"run_id": run, "impl": impl, "options": label, **{k: resolved[k] for k in OPTIONS},
                    "matches": matches(resolved)})
    return pd.DataFrame(out, columns=COLUMNS)
