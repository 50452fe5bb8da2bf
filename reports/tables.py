"""Tidy rows -> pandas tables: step-time summaries, overhead vs prenorm, backends, router cost
models, MFU, the training runs by router, failures.

Every derived number of DESIGN.md ("Results") is computed here, never stored: medians and IQR of
the timed repeats, overhead against the ``prenorm`` case of the same run, setting and shape, GFLOP
from fvcore's FMA count (FLOP = 2·FMA), MiB from bytes. Functions take the frame of
:func:`reports.frame.load_frame` and return new frames; an empty input gives an empty frame with
the documented columns, never an exception.
"""

from __future__ import annotations

from typing import Iterable

import numpy as np
import pandas as pd

from harness.step.backends import plain
from routers import BASELINE

from . import declared
from .frame import (BASE_KEYS, CASE_KEYS, MIB, SHAPE_COLS, STATIC_KEYS, TO_MS, TRAIN_KEYS, TRAIN_MODE,
                    case_label, cost_rows, ok_rows, sort_cases)

FLOP_CONVENTION = "FLOP = 2·FMA, causal attention not halved, see docs/FLOPS.md"
#: Ops per step are counted once per router, impl and shape of a run, on its device and torch.
OPS_KEYS = ("run_id", *STATIC_KEYS, "device")


def _median(df: pd.DataFrame, metric: str, keys: Iterable[str], name: str) -> pd.DataFrame:
    rows = ok_rows(df, metric)
    keys = list(keys)
    if rows.empty:
        return pd.DataFrame(columns=keys + [name])
    return rows.groupby(keys, dropna=False)["value"].median().rename(name).reset_index()


def step_time_summary(df: pd.DataFrame) -> pd.DataFrame:
    """Median, IQR and count of the timed repeats of every cost case.

    Args:
        df: a frame of :func:`load_frame`.

    Returns:
        :data:`CASE_KEYS` + ``median_ms``, ``q25_ms``, ``q75_ms``, ``iqr_ms`` (q75 − q25), ``n``
        (repeats), from the ``ok`` ``step_time`` rows outside training (units ``s``/``us`` are
        converted to ms).
    """
    cols = [*CASE_KEYS, "median_ms", "q25_ms", "q75_ms", "iqr_ms", "n"]
    st = ok_rows(cost_rows(df), "step_time")
    if st.empty:
        return pd.DataFrame(columns=cols)
    st = st.assign(value=st["value"] * st["unit"].map(TO_MS).fillna(1.0))
    g = st.groupby(list(CASE_KEYS), dropna=False)["value"]
    out = g.agg(median_ms="median", q25_ms=lambda v: v.quantile(0.25),
                q75_ms=lambda v: v.quantile(0.75), n="count").reset_index()
    out["iqr_ms"] = out["q75_ms"] - out["q25_ms"]
    return out[cols]


def _fma(df: pd.DataFrame, metric: str, name: str) -> pd.DataFrame:
    rows = ok_rows(cost_rows(df), metric)
    rows = rows.assign(value=np.where(rows["unit"] == "FLOP", rows["value"] / 2, rows["value"]))
    return _median(rows, metric, STATIC_KEYS, name)


def overhead_table(df: pd.DataFrame) -> pd.DataFrame:
    """Every cost case against the ``prenorm`` case of the same setting and shape.

    Args:
        df: a frame of :func:`load_frame`.

    Returns:
        :data:`CASE_KEYS` + ``median_ms``, ``iqr_ms``, ``n``, ``prenorm_ms``, ``overhead_pct``
        (median / prenorm median − 1, in %; 0 for prenorm; NaN without a prenorm case of the same
        run, backend, compile mode, mode, workload and shape), ``gflop_fwd`` (2·FMA/1e9, fvcore),
        ``router_flop_pct`` (router FMA / forward FMA, %), ``saved_mib`` (saved activations),
        ``saved_ratio`` (to prenorm), ``router_state_mib``, ``state_ratio`` (router state over
        prenorm's at the same shape: about n for the n-stream routers), ``peak_mib`` (CUDA only),
        ``ops_fwd`` and ``ops_bwd`` (ops one eager forward and its backward dispatch, counted
        per router, impl and shape on the run's device), ``ops_ratio`` (their sum over
        prenorm's), ``params_matrix``, ``params_router``. One row per case with at least one
        ``ok`` number; prenorm first within a shape.
    """
    cols = [*CASE_KEYS, "median_ms", "iqr_ms", "n", "prenorm_ms", "overhead_pct", "gflop_fwd",
            "router_flop_pct", "saved_mib", "saved_ratio", "router_state_mib", "state_ratio", "peak_mib",
            "ops_fwd", "ops_bwd", "ops_ratio", "params_matrix", "params_router"]
    cost = cost_rows(df)
    ok = cost[(cost["status"] == "ok") & cost["value"].notna()]
    keys = list(CASE_KEYS)
    t = ok[keys].drop_duplicates()
    if t.empty:
        return pd.DataFrame(columns=cols)
    st = step_time_summary(df)[keys + ["median_ms", "iqr_ms", "n"]]
    t = t.merge(st, on=keys, how="left")
    base = st[st["router"] == BASELINE].groupby(list(BASE_KEYS), dropna=False)["median_ms"]
    t = t.merge(base.median().rename("prenorm_ms").reset_index(), on=list(BASE_KEYS), how="left")
    t["overhead_pct"] = (t["median_ms"].astype(float) / t["prenorm_ms"].astype(float) - 1) * 100

    for metric, name in (("fwd_flops_fvcore", "fwd_fma"), ("router_flops_fvcore", "router_fma")):
        t = t.merge(_fma(df, metric, name), on=list(STATIC_KEYS), how="left")
    t["gflop_fwd"] = 2 * t["fwd_fma"].astype(float) / 1e9
    t["router_flop_pct"] = t["router_fma"].astype(float) / t["fwd_fma"].astype(float) * 100

    for metric, name, on in (("saved_activation", "saved_mib", keys),
                             ("router_state", "router_state_mib", list(STATIC_KEYS)),
                             ("peak_allocated", "peak_mib", keys)):
        m = _median(cost, metric, on, name)
        t = t.merge(m, on=on, how="left")
        t[name] = t[name].astype(float) / MIB
    saved = t[t["router"] == BASELINE].groupby(list(BASE_KEYS), dropna=False)["saved_mib"].median()
    t = t.merge(saved.rename("prenorm_saved").reset_index(), on=list(BASE_KEYS), how="left")
    t["saved_ratio"] = t["saved_mib"] / t["prenorm_saved"].astype(float)
    state = t[t["router"] == BASELINE].groupby(list(BASE_KEYS), dropna=False)["router_state_mib"].median()
    t = t.merge(state.rename("prenorm_state").reset_index(), on=list(BASE_KEYS), how="left")
    t["state_ratio"] = t["router_state_mib"] / t["prenorm_state"].astype(float)
    for metric, on in (("ops_fwd", OPS_KEYS), ("ops_bwd", OPS_KEYS), ("params_matrix", STATIC_KEYS),
                       ("params_router", STATIC_KEYS)):
        t = t.merge(_median(cost, metric, on, metric), on=list(on), how="left")
        t[metric] = t[metric].astype(float)
    t["ops_step"] = t["ops_fwd"] + t["ops_bwd"]
    ops = t[t["router"] == BASELINE].groupby(list(BASE_KEYS), dropna=False)["ops_step"].median()
    t = t.merge(ops.rename("prenorm_ops").reset_index(), on=list(BASE_KEYS), how="left")
    t["ops_ratio"] = t["ops_step"] / t["prenorm_ops"].astype(float)

    return sort_cases(t)[cols].reset_index(drop=True)


def backend_table(df: pd.DataFrame) -> pd.DataFrame:
    """Every cost case against prenorm and against its own eager run.

    Args:
        df: a frame of :func:`load_frame`.

    Returns:
        :data:`CASE_KEYS` + ``median_ms``, ``overhead_pct`` (vs prenorm, as in
        :func:`overhead_table`), ``eager_ms`` and ``vs_eager`` (median / the eager median of the
        same router, impl, mode, workload and shape in the same run; 1 for eager) and
        ``setup_s`` (compile time or CUDA-graph capture time in seconds, never part of a step).
    """
    cols = [*CASE_KEYS, "median_ms", "overhead_pct", "eager_ms", "vs_eager", "setup_s"]
    t = overhead_table(df)
    if t.empty:
        return pd.DataFrame(columns=cols)
    same = [k for k in CASE_KEYS if k not in ("backend", "compile_mode", "compile_scope")]
    eager = t[t["backend"].map(plain).astype(bool)].groupby(same, dropna=False)["median_ms"].median()
    t = t.merge(eager.rename("eager_ms").reset_index(), on=same, how="left")
    t["vs_eager"] = t["median_ms"].astype(float) / t["eager_ms"].astype(float)
    setup = pd.concat([_median(cost_rows(df), m, CASE_KEYS, "setup_s")
                       for m in ("compile_time", "capture_time")])
    t = t.merge(setup, on=list(CASE_KEYS), how="left")
    return sort_cases(t)[cols].reset_index(drop=True)


def router_cost_table(df: pd.DataFrame) -> pd.DataFrame:
    """The routers' own cost models, per router, impl and shape (from the cost-sweep rows).

    Returns:
        :data:`STATIC_KEYS` + ``flop_per_token`` (analytic router FLOP / (B·T), naive reference),
        ``io_ideal_d``, ``io_measured_d`` and ``io_kernel_d`` (bytes per token and sublayer in
        units of d elements: the ideal I/O model of the AttnRes paper's Table 1, what the eager
        ops of this impl read and write, and for ``fused`` what its Triton kernels load and
        store, else NaN), ``state_mib`` (peak live router state). A model the router does not
        declare is NaN (:func:`reports.declared.sentence` says so in words).
    """
    keys = list(STATIC_KEYS)
    cols = [*keys, "flop_per_token", "io_ideal_d", "io_measured_d", "io_kernel_d", "state_mib"]
    cost = cost_rows(df)
    # every router with a count of its forward, its declared models or not (blank where not declared)
    anchors = ("router_io_ideal", "router_io_measured")
    t = cost[cost["metric"].isin(anchors) & ((cost["status"] == "ok") | declared.mask(cost))][keys].drop_duplicates()
    if t.empty:
        return pd.DataFrame(columns=cols)
    for metric, name in (("router_flops_analytic", "flop"), ("router_io_ideal", "ideal"),
                         ("router_io_measured", "measured"), ("router_io_kernel", "kernel"),
                         ("router_state", "state")):
        t = t.merge(_median(cost, metric, keys, name), on=keys, how="left")
    elem = t["dtype"].map({"float32": 4, "float64": 8, "bfloat16": 2, "float16": 2}).astype(float)
    width = t["d_model"].astype(float) * elem
    t["flop_per_token"] = t["flop"].astype(float) / (t["batch_size"] * t["seq_len"]).astype(float)
    t["io_ideal_d"] = t["ideal"].astype(float) / width
    t["io_measured_d"] = t["measured"].astype(float) / width
    t["io_kernel_d"] = t["kernel"].astype(float) / width  # NaN but for fused
    t["state_mib"] = t["state"].astype(float) / MIB
    return t.sort_values(["workload", *SHAPE_COLS, "router", "impl"])[cols].reset_index(drop=True)


def _last(rows: pd.DataFrame, metric: str, col: str = "value") -> pd.Series:
    rows = rows[rows["metric"] == metric].sort_values("repeat", kind="stable")
    if rows.empty:  # keep the index names, so joining an absent metric gives NaN, not an error
        index = pd.MultiIndex.from_arrays([[] for _ in TRAIN_KEYS], names=list(TRAIN_KEYS))
        return pd.Series(index=index, dtype=object, name=metric)
    return rows.groupby(list(TRAIN_KEYS), dropna=False)[col].last().rename(metric)


def training_summary(df: pd.DataFrame) -> pd.DataFrame:
    """One row per training run (router and seed) of the time-to-target race.

    Args:
        df: a frame of :func:`load_frame`.

    Returns:
        ``impl`` and the shape columns, :data:`TRAIN_KEYS` + ``target_loss``, ``time_to_target`` (seconds, or the string
        ``"not converged"``/``"diverged"``; NaN when the run never wrote it), ``steps_to_target``,
        ``tokens_to_target``, ``loss_at_token_budget``, ``token_budget``, ``final_val_loss`` and
        ``final_step`` (the last evaluation; NaN, like the loss at the budget, for a diverged
        run). The full race (pilot, pairs by seed) is :mod:`reports.training`.
    """
    metrics = ("target_loss", "time_to_target", "steps_to_target", "tokens_to_target",
               "loss_at_token_budget", "token_budget")
    cols = [*TRAIN_KEYS, *metrics, "final_val_loss", "final_step"]
    tr = df[df["mode"] == TRAIN_MODE]
    if tr.empty:
        return pd.DataFrame(columns=cols)
    ok = tr[(tr["status"] == "ok") & tr["value"].notna()]
    out = tr[list(TRAIN_KEYS)].drop_duplicates().set_index(list(TRAIN_KEYS))
    for m in metrics:
        out = out.join(_last(ok, m))
    out = out.join(_last(ok, "val_loss").rename("final_val_loss"))
    out = out.join(_last(ok, "val_loss", "repeat").rename("final_step"))
    status = _last(tr, "time_to_target", "status")
    ttt = out["time_to_target"].astype(object)
    for key, s in status.items():
        if s in ("not_converged", "diverged"):
            ttt[key] = s.replace("_", " ")
    out["time_to_target"] = ttt
    # A diverged run's last finite loss is no result (MEASUREMENT.md): never shown as one.
    diverged = tr[(tr["metric"] == "diverged") | (tr["status"] == "diverged")]
    dead = out.index.isin(list(diverged[list(TRAIN_KEYS)].itertuples(index=False, name=None)))
    out.loc[dead, ["final_val_loss", "final_step", "loss_at_token_budget"]] = np.nan
    shapes = tr.groupby(list(TRAIN_KEYS), dropna=False)[["impl", *SHAPE_COLS]].first()
    out = out.join(shapes).reset_index()
    out = out.assign(_base=out["router"] != BASELINE).sort_values(["_base", "variant", "seed",
                                                                   "run_id"], kind="stable")
    return out[["impl", *SHAPE_COLS, *cols]].reset_index(drop=True)


def training_by_router(df: pd.DataFrame) -> pd.DataFrame:
    """The seeds of each router's race in one run pooled: the median counts a run that never
    reached the target (not converged, diverged) as infinitely slow, since MEASUREMENT.md records
    such runs rather than dropping them; a run cut short before its verdict is left out.

    Returns:
        ``run_id``, ``variant``, ``seeds``, ``reached`` (e.g. ``"2/3"``), ``median_time_to_target``
        (seconds or ``"not converged"``), ``min_s``, ``max_s`` (over runs that reached it) and
        ``median_loss_at_budget``.
    """
    cols = ["run_id", "variant", "seeds", "reached", "median_time_to_target", "min_s", "max_s",
            "median_loss_at_budget"]
    runs = training_summary(df)
    runs = runs[runs["time_to_target"].notna()]
    rows = []
    for (run_id, variant), g in runs.groupby(["run_id", "variant"], sort=True):
        t = pd.to_numeric(g["time_to_target"], errors="coerce")
        med = float(np.median(t.fillna(np.inf)))
        rows.append({"run_id": run_id, "variant": variant, "seeds": len(g),
                     "reached": f"{t.notna().sum()}/{len(g)}",
                     "median_time_to_target": "not converged" if np.isinf(med) else med,
                     "min_s": t.min(), "max_s": t.max(),
                     "median_loss_at_budget": g["loss_at_token_budget"].astype(float).median()})
    return pd.DataFrame(rows, columns=cols)


def failures(df: pd.DataFrame) -> pd.DataFrame:
    """Rows whose status is neither ``ok`` nor ``not_converged`` (skipped, error, oom, diverged);
    a cost model a router does not declare is no failure (:mod:`reports.declared`).

    Returns:
        ``run_id``, ``case_key``, ``case`` (:func:`case_label`), ``router``, ``options``,
        ``impl``, ``backend``, ``compile_mode``, ``compile_scope``, ``mode``, ``workload``, ``d_model``,
        ``n_layers``, ``seq_len``, ``batch_size``, ``seed``, ``metric``, ``status``, ``error``;
        exact duplicates dropped.
    """
    cols = ["run_id", "case_key", "router", "options", "impl", "backend", "compile_mode", "compile_scope", "mode",
            "workload", "d_model", "n_layers", "seq_len", "batch_size", "seed", "metric",
            "status", "error"]
    bad = df[~df["status"].isin(["ok", "not_converged"]) & ~declared.mask(df)][cols].drop_duplicates()
    bad.insert(2, "case", [case_label(r) for r in bad.to_dict("records")])
    return bad.reset_index(drop=True)


def mfu_table(df: pd.DataFrame, manifests: dict[str, dict] | None = None) -> pd.DataFrame:
    """Tokens/s and model FLOPs utilisation of every timed cost case (docs/FLOPS.md, "MFU").

    Args:
        df: a frame of :func:`load_frame`.
        manifests: run_id -> manifest (:func:`load_manifests`); the device name is the
            manifest's ``environment.device_name``.

    Returns:
        :data:`CASE_KEYS` + ``median_ms``, ``tokens_per_s`` (tokens per step / median step: B·T
        for fwd, fwd_bwd, train_step; B for decode), ``model_gflop`` (model FLOP per step / 1e9,
        :func:`harness.costs.peak.model_flops_per_step`: 6·N + 12·L·d·T per token + 3 × the analytic
        router FLOP for training steps, a third of that for fwd; N = ``params_matrix``),
        ``model_tflops`` (model FLOP per second / 1e12), ``device_name``, ``peak_tflops``
        (dense BF16, :func:`harness.costs.peak.peak_flops`) and ``mfu_pct`` (%; NaN, shown blank,
        for a CPU, an unknown device or a case without ``params_matrix`` or
        ``router_flops_analytic`` rows); ``hfu_pct`` (%): the FLOPs dispatched per step
        (``fwd_flops_dispatch``, plus ``bwd_flops_dispatch`` for ``fwd_bwd`` and ``train_step``,
        recomputation included; NaN for ``decode``) over the step time and the same peak. HFU, not
        MFU: it counts what the kernels were asked to do (a lean backward's recompute, the
        attention's masked half), not the model's useful FLOPs.
    """
    from harness.costs.peak import model_flops_per_step, peak_flops, tokens_per_step

    cols = [*CASE_KEYS, "median_ms", "tokens_per_s", "model_gflop", "model_tflops",
            "device_name", "peak_tflops", "mfu_pct", "hfu_pct"]
    t = step_time_summary(df)[[*CASE_KEYS, "median_ms"]]
    if t.empty:
        return pd.DataFrame(columns=cols)
    keys, cost = list(STATIC_KEYS), cost_rows(df)
    for metric, name in (("params_matrix", "n_matrix"), ("router_flops_analytic", "router_flop"),
                         ("fwd_flops_dispatch", "_fwd_disp"), ("bwd_flops_dispatch", "_bwd_disp")):
        m = _median(cost, metric, keys, name)
        t = t.merge(m, on=keys, how="left") if len(m) else t.assign(**{name: np.nan})
    envs = {run: (m.get("environment") or {}) for run, m in (manifests or {}).items()}
    names, peaks, flops, tokens = [], [], [], []
    for r in t.itertuples(index=False):
        env = envs.get(r.run_id, {})
        names.append(env.get("device_name") or "")
        peak = peak_flops(names[-1], env.get("device") or r.device)
        peaks.append(np.nan if peak is None else peak / 1e12)
        tokens.append(tokens_per_step(r.mode, int(r.batch_size), int(r.seq_len)))
        flops.append(model_flops_per_step(
            r.mode, n_matrix=float(r.n_matrix), n_layers=int(r.n_layers), d_model=int(r.d_model),
            seq_len=int(r.seq_len), batch_size=int(r.batch_size),
            router_fwd_flops=float(r.router_flop), attention=r.workload != "router_only"))
    step_s = t["median_ms"].astype(float) / 1e3
    t["tokens_per_s"] = np.array(tokens, dtype=float) / step_s
    t["model_gflop"] = np.array(flops, dtype=float) / 1e9
    t["model_tflops"] = np.array(flops, dtype=float) / step_s / 1e12
    t["device_name"], t["peak_tflops"] = names, peaks
    t["mfu_pct"] = t["model_tflops"] / t["peak_tflops"].astype(float) * 100
    fwd, bwd = t["_fwd_disp"].astype(float), t["_bwd_disp"].astype(float)
    dispatched = fwd.where(t["mode"] == "fwd", (fwd + bwd).where(t["mode"].isin(["fwd_bwd", "train_step"])))
    t["hfu_pct"] = dispatched / step_s / 1e12 / t["peak_tflops"].astype(float) * 100
    return sort_cases(t)[cols].reset_index(drop=True)


#: The compile rows of a compiled case (``harness.step.backends.compile_rows``), in table order.
COMPILE_METRICS = ("compile_time", "graph_breaks", "graphs_fwd", "graphs_bwd", "recompiles",
                   "fxgraph_cache_hit", "fxgraph_cache_miss", "aot_cache_hit", "aot_cache_miss")


def compile_table(df: pd.DataFrame) -> pd.DataFrame:
    """What compiling each compiled case took: :data:`CASE_KEYS` and one column per
    :data:`COMPILE_METRICS` (``compile_time`` in s, the rest counts; the last value where a case
    was compiled more than once), blank where a run predates a metric."""
    rows = ok_rows(cost_rows(df), "compile_time")
    if rows.empty:
        return pd.DataFrame(columns=[*CASE_KEYS, *COMPILE_METRICS])
    keys = [k for k in CASE_KEYS if k in df]
    picked = df[df["metric"].isin(COMPILE_METRICS) & (df["status"] == "ok") & df["case_key"].isin(rows["case_key"])]
    wide = picked.pivot_table(index=keys, columns="metric", values="value", aggfunc="last", dropna=False)
    wide = wide.reindex(columns=list(COMPILE_METRICS)).reset_index()
    wide = wide[wide["compile_time"].notna()]
    return sort_cases(wide)[[*keys, *COMPILE_METRICS]].reset_index(drop=True)
