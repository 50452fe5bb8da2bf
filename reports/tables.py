"""Tidy rows -> pandas tables: step-time summaries, overhead vs prenorm, training race, failures.

Every derived number of DESIGN.md ("Results") is computed here, never stored: medians and IQR of
the timed repeats, overhead against the ``prenorm`` case of the same run, setting and shape, GFLOP
from fvcore's FMA count (FLOP = 2·FMA), MiB from bytes. Functions take the frame of
:func:`load_frame` and return new frames; an empty input gives an empty frame with the documented
columns, never an exception.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import pandas as pd

from harness.records import COLUMNS, RECORDS_FILE, load_rows

BASELINE = "prenorm"
TRAIN_MODE = "train"
#: Modes of the training race: measured runs and the pilot run that sets the target loss.
TRAIN_MODES = (TRAIN_MODE, "pilot")
FLOP_CONVENTION = "FLOP = 2·FMA, causal attention not halved, see docs/FLOPS.md"
MIB = 2**20

SHAPE_COLS = ("d_model", "n_layers", "n_heads", "seq_len", "batch_size", "dtype")
#: One cost case: what was routed, how it ran, on which shape, in which run (repeats of two runs,
#: maybe on two machines, are never pooled). ``variant`` labels (router, impl, options) for
#: legends; it adds no grouping of its own.
CASE_KEYS = ("run_id", "router", "options", "impl", "backend", "compile_mode", "mode", "workload",
             *SHAPE_COLS, "device", "variant")
#: A router's baseline: the prenorm case of the same run, setting and shape (any impl).
BASE_KEYS = ("run_id", "backend", "compile_mode", "mode", "workload", *SHAPE_COLS, "device")
#: Counts that do not depend on how the model ran (FLOPs, parameters).
STATIC_KEYS = ("router", "options", "impl", "workload", *SHAPE_COLS, "variant")
TRAIN_KEYS = ("run_id", "router", "options", "variant", "seed")

_NUMERIC = ("d_model", "n_layers", "n_heads", "seq_len", "batch_size", "seed", "repeat", "pair", "attempt")
_TEXT = tuple(c for c in COLUMNS if c not in _NUMERIC + ("value",))
#: Factor from a time ``unit`` to milliseconds.
TO_MS = {"ms": 1.0, "s": 1e3, "us": 1e-3, "ns": 1e-6}
#: Metrics of a run as a whole, not of a case (:mod:`harness.bandwidth`): no router, no shape.
RUN_METRICS = ("mem_bandwidth", "mem_bandwidth_nominal")


def run_dir_paths(run_dirs: Iterable[Path | str]) -> list[Path]:
    """The run directories as paths, each checked to hold ``records.jsonl``.

    Raises:
        ValueError: when no run directory is given.
        FileNotFoundError: naming the first directory without ``records.jsonl``.
    """
    paths = [Path(p) for p in run_dirs]
    if not paths:
        raise ValueError("no run directory given: pass at least one results/<device>/<run-id>/")
    for p in paths:
        if not (p / RECORDS_FILE).is_file():
            raise FileNotFoundError(
                f"no {RECORDS_FILE} in {p}: pass a run directory written by `routerbench run` "
                f"or `routerbench train` (results/<device-slug>/<run-id>/)")
    return paths


def _options_label(raw: Any) -> str:
    if raw is None or (isinstance(raw, float) and np.isnan(raw)) or raw == "":
        return ""
    opts = json.loads(raw) if isinstance(raw, str) else raw
    if not isinstance(opts, dict):
        return str(opts)
    return ", ".join(f"{k}={v}" for k, v in sorted(opts.items()))


def load_frame(run_dirs: Iterable[Path | str], finished_only: bool = True) -> pd.DataFrame:
    """Rows of the run directories as one DataFrame (``harness.records.load_rows``).

    Args:
        run_dirs: run directories, each holding ``records.jsonl``.
        finished_only: passed to ``load_rows``: rows of a case come only from the session that
            finished it, so an interrupted attempt is not counted twice.

    Returns:
        The columns of ``harness.records.COLUMNS``; ``value``, shape columns, seed, repeat and pair
        numeric (int64 where no value is missing); text columns with nulls as ``""``. Added:
        ``options`` (``router_options`` as ``"k=v, ..."``) and ``variant`` (the router, its impl
        when the router has several, and its options: the legend label of figures).
        ``df.attrs["run_rows"]``: the rows (dicts) of :data:`RUN_METRICS` (the run's memory
        bandwidth), kept out of the frame since they describe no case. ``df.attrs["record_problems"]``: the problems met reading the records (unparsable lines,
        units that do not match their end marker, an unfinished tail, schema-1 records), one line
        each naming the file and line numbers, for a report to show; ``[]`` when none. Each is
        also warned once as a :class:`harness.records.RecordsWarning`.

    Raises:
        FileNotFoundError: when a run directory has no ``records.jsonl``.
    """
    problems: list[str] = []
    df = pd.DataFrame(load_rows(run_dir_paths(run_dirs), finished_only=finished_only, problems=problems),
                      columns=list(COLUMNS))
    run_level = df["metric"].isin(RUN_METRICS)
    run_rows = df[run_level].assign(value=lambda r: pd.to_numeric(r["value"], errors="coerce"))
    df = df[~run_level].reset_index(drop=True)
    for c in _NUMERIC + ("value",):
        df[c] = pd.to_numeric(df[c], errors="coerce").astype(float)
        if c != "value" and len(df) and df[c].notna().all():
            df[c] = df[c].astype("int64")
    for c in _TEXT:
        df[c] = df[c].astype(object).where(df[c].notna(), "").astype(str)
    df = last_attempt(df)
    df["options"] = pd.Series([_options_label(r) for r in df["router_options"]], index=df.index,
                              dtype=str)
    impls = df.groupby("router")["impl"].nunique() if len(df) else pd.Series(dtype=int)
    df["variant"] = pd.Series([
        r + (f" [{i}]" if impls.get(r, 1) > 1 else "") + (f" ({o})" if o else "")
        for r, i, o in zip(df["router"], df["impl"], df["options"])], index=df.index, dtype=str)
    df.attrs["record_problems"] = problems
    df.attrs["run_rows"] = run_rows.to_dict("records")  # plain rows: pandas compares attrs
    return df


def last_attempt(df: pd.DataFrame) -> pd.DataFrame:
    """Keep, of each case, only the timing rows of its last attempt (a noisy group is timed again;
    every attempt is recorded, ``harness.noise``); rows without an attempt number (FLOPs, memory,
    rows written before re-measuring existed) are kept. Adds ``attempts``: the case's number of
    timings (1 when it was timed once)."""
    att = pd.to_numeric(df["attempt"], errors="coerce")
    last = att.groupby(df["case_key"]).transform("max").fillna(1)
    keep = att.isna() | (att == last)
    out = df[keep].copy()
    out["attempts"] = last[keep].astype("int64")
    out.attrs = dict(df.attrs)
    return out


def ok_rows(df: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Rows of ``metric`` with status ``ok`` and a value."""
    return df[(df["metric"] == metric) & (df["status"] == "ok") & df["value"].notna()]


def cost_rows(df: pd.DataFrame) -> pd.DataFrame:
    """Rows of the cost sweep (every mode except ``train`` and ``pilot``)."""
    return df[~df["mode"].isin(TRAIN_MODES)]


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
        ``saved_ratio`` (to prenorm), ``router_state_mib``, ``peak_mib`` (CUDA only),
        ``params_matrix``, ``params_router``. One row per case with at least one ``ok`` number;
        prenorm first within a shape.
    """
    cols = [*CASE_KEYS, "median_ms", "iqr_ms", "n", "prenorm_ms", "overhead_pct", "gflop_fwd",
            "router_flop_pct", "saved_mib", "saved_ratio", "router_state_mib", "peak_mib",
            "params_matrix", "params_router"]
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
    for metric in ("params_matrix", "params_router"):
        t = t.merge(_median(cost, metric, STATIC_KEYS, metric), on=list(STATIC_KEYS), how="left")
        t[metric] = t[metric].astype(float)

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
    same = [k for k in CASE_KEYS if k not in ("backend", "compile_mode")]
    eager = t[t["backend"] == "eager"].groupby(same, dropna=False)["median_ms"].median()
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
        ``io_ideal_d`` and ``io_measured_d`` (bytes per token and sublayer in units of d
        elements: the ideal I/O model of the AttnRes paper's Table 1, and what the eager ops of
        this impl read and write), ``state_mib`` (peak live router state).
    """
    keys = list(STATIC_KEYS)
    cols = [*keys, "flop_per_token", "io_ideal_d", "io_measured_d", "state_mib"]
    cost = cost_rows(df)
    t = ok_rows(cost, "router_io_ideal")[keys].drop_duplicates()
    if t.empty:
        return pd.DataFrame(columns=cols)
    for metric, name in (("router_flops_analytic", "flop"), ("router_io_ideal", "ideal"),
                         ("router_io_measured", "measured"), ("router_state", "state")):
        t = t.merge(_median(cost, metric, keys, name), on=keys, how="left")
    elem = t["dtype"].map({"float32": 4, "float64": 8, "bfloat16": 2, "float16": 2}).astype(float)
    width = t["d_model"].astype(float) * elem
    t["flop_per_token"] = t["flop"].astype(float) / (t["batch_size"] * t["seq_len"]).astype(float)
    t["io_ideal_d"] = t["ideal"].astype(float) / width
    t["io_measured_d"] = t["measured"].astype(float) / width
    t["state_mib"] = t["state"].astype(float) / MIB
    return t.sort_values(["workload", *SHAPE_COLS, "router", "impl"])[cols].reset_index(drop=True)


#: Report order of backends; unknown ones come after, alphabetically.
BACKEND_ORDER = ("eager", "compile", "cudagraph")


def sort_cases(t: pd.DataFrame) -> pd.DataFrame:
    """Cases in report order: run, workload, mode, backend (eager first), shape, prenorm first."""
    rank = {b: i for i, b in enumerate(BACKEND_ORDER)}
    t = t.assign(_backend=t["backend"].map(rank).fillna(len(rank)), _base=t["router"] != BASELINE)
    order = ["run_id", "workload", "mode", "_backend", "backend", "compile_mode", *SHAPE_COLS,
             "device", "_base", "router", "variant"]
    return t.sort_values([c for c in order if c in t], kind="stable").drop(
        columns=["_backend", "_base"])


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


#: Shape columns of a case label and their letters: "d=32 L=2 T=32 B=8".
_SHAPE_LETTERS = (("d_model", "d"), ("n_layers", "L"), ("seq_len", "T"), ("batch_size", "B"))


def case_label(r: Any) -> str:
    """A readable name of one case (a row with the case columns): router (options), impl,
    backend (compile mode), mode, shape and seed, e.g. ``"haares, naive, eager, train,
    d=32 L=2 T=32 B=8, seed 0"``; absent fields are left out."""
    def has(v: Any) -> bool:
        return v is not None and v == v and v != ""

    parts = [r["router"] + (f" ({r['options']})" if has(r.get("options")) else ""), r["impl"],
             r["backend"] + (f":{r['compile_mode']}" if has(r.get("compile_mode")) else ""),
             r["mode"],
             " ".join(f"{k}={int(r[c])}" for c, k in _SHAPE_LETTERS if has(r.get(c))),
             f"seed {int(r['seed'])}" if has(r.get("seed")) else ""]
    return ", ".join(p for p in parts if p)


def failures(df: pd.DataFrame) -> pd.DataFrame:
    """Rows whose status is neither ``ok`` nor ``not_converged`` (skipped, error, oom, diverged).

    Returns:
        ``run_id``, ``case_key``, ``case`` (:func:`case_label`), ``router``, ``options``,
        ``impl``, ``backend``, ``compile_mode``, ``mode``, ``workload``, ``d_model``,
        ``n_layers``, ``seq_len``, ``batch_size``, ``seed``, ``metric``, ``status``, ``error``;
        exact duplicates dropped.
    """
    cols = ["run_id", "case_key", "router", "options", "impl", "backend", "compile_mode", "mode",
            "workload", "d_model", "n_layers", "seq_len", "batch_size", "seed", "metric",
            "status", "error"]
    bad = df[~df["status"].isin(["ok", "not_converged"])][cols].drop_duplicates()
    bad.insert(2, "case", [case_label(r) for r in bad.to_dict("records")])
    return bad.reset_index(drop=True)


def load_manifests(run_dirs: Iterable[Path | str]) -> dict[str, dict]:
    """The readable ``manifest.json`` of each run directory, keyed by its ``run_id`` (else the
    directory name); runs without one are left out."""
    from harness.records import MANIFEST_FILE

    out: dict[str, dict] = {}
    for d in map(Path, run_dirs):
        try:
            manifest = json.loads((d / MANIFEST_FILE).read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            continue
        out[str(manifest.get("run_id") or d.name)] = manifest
    return out


def mfu_table(df: pd.DataFrame, manifests: dict[str, dict] | None = None) -> pd.DataFrame:
    """Tokens/s and model FLOPs utilisation of every timed cost case (docs/FLOPS.md, "MFU").

    Args:
        df: a frame of :func:`load_frame`.
        manifests: run_id -> manifest (:func:`load_manifests`); the device name is the
            manifest's ``environment.device_name``.

    Returns:
        :data:`CASE_KEYS` + ``median_ms``, ``tokens_per_s`` (tokens per step / median step: B·T
        for fwd, fwd_bwd, train_step; B for decode), ``model_gflop`` (model FLOP per step / 1e9,
        :func:`harness.peak.model_flops_per_step`: 6·N + 12·L·d·T per token + 3 × the analytic
        router FLOP for training steps, a third of that for fwd; N = ``params_matrix``),
        ``model_tflops`` (model FLOP per second / 1e12), ``device_name``, ``peak_tflops``
        (dense BF16, :func:`harness.peak.peak_flops`) and ``mfu_pct`` (%; NaN, shown blank,
        for a CPU, an unknown device or a case without ``params_matrix`` or
        ``router_flops_analytic`` rows).
    """
    from harness.peak import model_flops_per_step, peak_flops, tokens_per_step

    cols = [*CASE_KEYS, "median_ms", "tokens_per_s", "model_gflop", "model_tflops",
            "device_name", "peak_tflops", "mfu_pct"]
    t = step_time_summary(df)[[*CASE_KEYS, "median_ms"]]
    if t.empty:
        return pd.DataFrame(columns=cols)
    keys, cost = list(STATIC_KEYS), cost_rows(df)
    for metric, name in (("params_matrix", "n_matrix"), ("router_flops_analytic", "router_flop")):
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
    return sort_cases(t)[cols].reset_index(drop=True)
