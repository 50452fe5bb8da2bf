"""A CI gate on paired timing ratios (``routerbench gate``).

MEASUREMENT.md ("Noise on shared machines"): absolute times on a shared machine can be off by a
large factor while paired ratios hold, so the gate checks only ratios measured **in the same run**
(pairs of one interleaved group), never times across runs; and "a CI gate on timings fails only
when a ratio's whole confidence interval lies beyond its threshold; when the interval straddles it
the verdict is 'inconclusive', never a silent pass".

Metrics (:data:`METRICS`), each a ratio with its interval over pairs: the stopping rule's own
when the run timed to ``--precision-target`` (:func:`harness.stats.sequential.ratio_interval`),
else the 95 % percentile bootstrap:

- ``compile_vs_eager`` / ``cudagraph_vs_eager``: compiled (or graph-replayed) step time / eager
  step time of the same router, impl, options, mode and shape, paired per round in one group
  (:func:`reports.paired.paired_vs_eager_table`);
- ``overhead_vs_prenorm``: router step time / prenorm step time of the same group
  (:func:`reports.paired.paired_ratio_table`);
- ``overhead_growth``: this run's router/prenorm ratio divided by the baseline run's ratio for
  the same case (:func:`harness.stats.bootstrap.bootstrap_ratio_of_ratios`). Growth is the ratio of the two
  step-time ratios (a router that went from 1.20× to 1.32× prenorm grew 10 %), not the ratio of
  overhead percentages (20 % -> 32 %), which is unstable when an overhead is near zero. It is the
  only rule that looks across runs, and the baseline must come from the same device. Without
  ``--baseline`` these rules are ``skipped`` (one row says so; one rules file serves runs with and
  without a baseline), with an empty or missing baseline folder ``inconclusive``, "no baseline yet".

A rule ``max_pct = X`` sets the limit ``1 + X/100``: verdict ``fail`` when the interval's low end
lies above it, ``pass`` when its high end lies at or below it, ``inconclusive`` otherwise (the
interval straddles the limit, or there is none: fewer than :data:`harness.stats.bootstrap.MIN_PAIRS_FOR_CI`
pairs). An interval that straddles the limit says what would decide it: the pairs to add at the
observed spread, n·(h / |median − limit|)² − n (:func:`settle_note`), or "cannot be settled by
more pairs" when the median lies within 1 % of the limit. Exit status of the command: 0 all pass (or skipped), 1 a rule failed, 3 only inconclusive
besides passes (``--strict``: 1), 2 bad input.
"""

from __future__ import annotations

import math
import numbers
from pathlib import Path

import pandas as pd

from harness.stats.bootstrap import MIN_PAIRS_FOR_CI, bootstrap_ratio_of_ratios
from harness.stats.sequential import UNSETTLED_REL, pairs_needed
from harness.timing import noise
from reports.frame import backend_text, load_manifests
from reports.paired import paired_ratio_table, paired_rows, paired_vs_eager_table, pairs_by_variant
from routers.errors import ConfigError

from .rules import Rule

#: What must match for a case of this run and one of the baseline to be the same case.
GROWTH_KEYS = ("backend", "compile_mode", "compile_scope", "mode", "workload", "d_model", "n_layers", "n_heads",
               "seq_len", "batch_size", "dtype", "seed", "router", "options", "impl")


NO_CASE = "—"


NO_BASELINE = "needs --baseline DIR"


def device_of(dirs: list[Path], df: pd.DataFrame, what: str) -> tuple[str, str]:
    """The one device the runs were measured on.

    Args:
        dirs: the run directories; df: their rows (for runs without a manifest);
        what: how to name them in an error (``RESULTS …`` or ``--baseline DIR``).

    Returns:
        ``(device type, device name)``: ``environment.device`` and ``environment.device_name`` of
        their manifests (``cpu`` and the CPU model with its torch thread count, or ``cuda`` and
        the GPU name); without any manifest, the rows' ``device`` and ``"unknown"``.

    Raises:
        ConfigError: runs of several devices, naming them and ``what`` (the RESULTS or --baseline).
    """
    def ident(env: dict) -> tuple[str, str]:
        kind = str(env.get("device") or "?")
        name = str(env.get("device_name") or "unknown")
        if kind.startswith("cpu") and env.get("torch_threads"):  # on a CPU the threads are the device
            name += f", {env['torch_threads']} torch threads"
        return kind, name
    found = {ident(m.get("environment") or {}) for m in load_manifests(dirs).values()}
    if not found:
        found = {(str(d), "unknown") for d in set(df["device"]) if d} or {("?", "unknown")}
    if len(found) > 1:
        names = "; ".join(f"{n} ({t})" for t, n in sorted(found))
        raise ConfigError(f"{what}: runs of several devices ({names}); the gate compares ratios of one "
                          "device: give runs of one device")
    return next(iter(found))


def case_label(r, with_run: bool = False) -> str:
    """``router [impl] (options) · backend[:compile_mode:compile_scope] · mode · d64 L4 T128 B8`` (plus the
    workload and dtype when not the defaults, and the run id when several runs are gated)."""
    parts = [f"{r['router']}" + (f" [{r['impl']}]" if r.get("impl") else "")
             + (f" ({r['options']})" if r.get("options") else ""),
             backend_text(r), r["mode"]]
    if r.get("workload") not in (None, "", "decoder"):
        parts.append(r["workload"])
    parts.append(" ".join(f"{k}{int(r[c])}" for c, k in (("d_model", "d"), ("n_layers", "L"),
                                                         ("seq_len", "T"), ("batch_size", "B"))))
    if r.get("dtype") not in (None, "", "float32"):
        parts[-1] += f" {r['dtype']}"
    if with_run:
        parts.append(f"run {r['run_id']}")
    return " · ".join(parts)


def verdict(lo: float, hi: float, limit: float) -> tuple[str, str]:
    """The verdict of one ratio's interval against its limit: MEASUREMENT.md's rule "a CI gate on
    timings fails only when a ratio's whole confidence interval lies beyond its threshold; when the
    interval straddles it the verdict is 'inconclusive', never a silent pass".

    Args:
        lo, hi: the interval's bounds (NaN when there is none: too few pairs).
        limit: the highest ratio allowed, ``1 + max_pct/100``.

    Returns:
        ``(verdict, note)``: ``("fail", "")`` when ``lo > limit``, ``("pass", "")`` when
        ``hi <= limit``, else ``"inconclusive"`` and why (the interval straddles the limit, or
        there is none).
    """
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return "inconclusive", f"no CI (fewer than {MIN_PAIRS_FOR_CI} pairs)"
    if lo > limit:
        return "fail", ""
    if hi <= limit:
        return "pass", ""
    return "inconclusive", "CI straddles the limit"


def pair_times(df: pd.DataFrame) -> pd.DataFrame:
    """The raw pairs behind :func:`reports.paired.paired_ratio_table`, grouped the same way
    (:func:`reports.paired.pairs_by_variant`): one row per run, group and variant, with
    ``prenorm`` and ``times`` (lists of ms, common rounds in order)."""
    return pd.DataFrame([{**p["group"], **p["variant_keys"], "prenorm": p["prenorm"], "times": p["times"]}
                         for p in pairs_by_variant(df)])


def has_paired_ratios(df: pd.DataFrame) -> bool:
    """Whether ``df`` holds any paired ratio a rule can check: a router beside prenorm, or a
    compiled or graph-replayed step beside eager, in one interleaved group."""
    return not pair_times(df).empty or not paired_vs_eager_table(df, n_boot=1).empty


#: Readings of the machine during a timing (:mod:`harness.timing.noise`): when one crosses its threshold
#: the machine was busy, which can bias a ratio, not only widen its interval, so the check is not
#: decided. Spread readings (``iqr_rel``, ``ci_width_rel``) are only noted: the interval already
#: carries the spread.
MACHINE_READINGS = ("cpu_util", "cpu_pressure")


#: Columns that place a check's rows among the records (those the check's table row has).
_PLACE = ("run_id", "session", "backend", "compile_mode", "compile_scope", "mode", "workload", "d_model", "n_layers",
          "n_heads", "seq_len", "batch_size", "dtype", "seed", "router", "options", "impl")


def unit_noise(df: pd.DataFrame, thresholds: dict | None = None) -> dict[tuple, tuple[list[str], list[str]]]:
    """Why each timed group (``(run_id, resume_unit)``) was noisy in its last timing, split into
    machine reasons (:data:`MACHINE_READINGS`) and spread reasons, under ``thresholds``
    (default :data:`harness.timing.noise.THRESHOLDS`); quiet groups are absent."""
    readings = df[df["metric"].isin(list(noise.UNITS)) & (df["status"] == "ok") & df["value"].notna()]
    out: dict[tuple, tuple[list[str], list[str]]] = {}
    for (run, unit, _case), g in readings.groupby(["run_id", "resume_unit", "case_key"], sort=False):
        m = dict(zip(g["metric"], g["value"]))
        machine = noise.noise_reasons({k: v for k, v in m.items() if k in MACHINE_READINGS},
                                      thresholds or noise.THRESHOLDS)
        spread = noise.noise_reasons({k: v for k, v in m.items() if k not in MACHINE_READINGS},
                                     thresholds or noise.THRESHOLDS)
        if machine or spread:
            a, b = out.setdefault((run, unit), ([], []))
            a += [r for r in machine if r not in a]
            b += [r for r in spread if r not in b]
    return out


def _noise_of(r: dict, rows: pd.DataFrame, noisy: dict) -> tuple[list[str], list[str]]:
    """The noise reasons of the group(s) that timed the check row ``r`` (matched on the columns of
    :data:`_PLACE` it has; the pairs of a check share one group)."""
    if not noisy:
        return [], []
    sel = rows
    for c in _PLACE:
        if c in r and c in sel:
            sel = sel[sel[c].astype(str) == str(r[c])]
    machine: list[str] = []
    spread: list[str] = []
    for key in set(zip(sel["run_id"], sel["resume_unit"])):
        m, s_ = noisy.get(key, ([], []))
        machine += [x for x in m if x not in machine]
        spread += [x for x in s_ if x not in spread]
    return machine, spread


def _with_noise(row: dict, machine: list[str], spread: list[str]) -> dict:
    """A check row with its group's noise: a machine reason makes a pass or a fail
    ``inconclusive`` (not decided on a busy machine); spread reasons are noted."""
    notes = [row["note"]] if row["note"] else []
    if machine and row["verdict"] in ("pass", "fail"):
        notes.insert(0, f"busy machine, not decided (would be {row['verdict']}): {', '.join(machine)}")
        row = {**row, "verdict": "inconclusive"}
    elif machine:
        notes.append(f"busy machine: {', '.join(machine)}")
    if spread:
        notes.append(f"noisy: {', '.join(spread)}")
    return {**row, "note": "; ".join(notes)}


def _select(t: pd.DataFrame, rule: Rule) -> pd.DataFrame:
    for col, allowed in (("router", rule.routers), ("mode", rule.modes), ("backend", rule.backends)):
        if allowed is not None and len(t):
            t = t[t[col].isin(allowed)]
    return t


def settle_note(n: int, ratio: float, lo: float, hi: float, limit: float) -> str:
    """What would decide an inconclusive check whose interval straddles ``limit``: the pairs to
    add at the observed spread (:func:`harness.stats.sequential.pairs_needed`: the half-width
    shrinks as 1/√n), or that no number of pairs settles it (the median within 1 % of the limit)."""
    side = (ratio - lo) if limit < ratio else (hi - ratio)   # the interval's side that crosses the limit
    more = pairs_needed(n, side / ratio, ratio, limit)
    if more is None:
        return (f"cannot be settled by more pairs: the median {ratio:.3f} is within "
                f"{UNSETTLED_REL:.0%} of the limit {limit:.3f}")
    target = abs(ratio - limit) / ratio
    hint = f"; --precision-target {target:.3f} times to it" if 0 < target <= 1 else ""
    return (f"about {max(1, math.ceil(more))} more pairs would decide it at this spread "
            f"({n} now{hint})")


def _row(rule: Rule, case: str, ratio: float, lo: float, hi: float, note: str = "",
         pairs: str = "", n: int | None = None) -> dict:
    v, why = verdict(lo, hi, rule.limit)
    if not math.isfinite(ratio):  # nothing measured: the note says why
        why = ""
    elif why.startswith("no CI") and pairs:
        why = f"no CI: {pairs}, {MIN_PAIRS_FOR_CI} needed"
    elif v == "inconclusive" and n:
        why += "; " + settle_note(n, ratio, lo, hi, rule.limit)
    return {"rule": rule.name, "metric": rule.metric, "case": case, "ratio": ratio, "lo": lo,
            "hi": hi, "limit": rule.limit, "verdict": v, "note": "; ".join(n for n in (why, note) if n)}


def _growth_rows(rule: Rule, now: pd.DataFrame, base: pd.DataFrame | str, label) -> list[tuple]:
    """(this run's pair row or None, check row) per case of ``now`` the rule selects."""
    nan = float("nan")
    if isinstance(base, str):
        row = _row(rule, NO_CASE, nan, nan, nan, base)
        return [(None, {**row, "verdict": "skipped"} if base == NO_BASELINE else row)]
    by_case: dict[tuple, dict] = {}
    for b in sorted(base.to_dict("records"), key=lambda b: str(b["run_id"]), reverse=True):
        by_case[_case_key(b)] = b  # several baseline runs of a case: the first run id
    out = []
    for r in _select(now, rule).to_dict("records"):
        b = by_case.get(_case_key(r))
        if b is None:
            out.append((r, _row(rule, label(r), nan, nan, nan, "not in the baseline")))
            continue
        g, lo, hi = bootstrap_ratio_of_ratios(r["prenorm"], r["times"], b["prenorm"], b["times"])
        out.append((r, _row(rule, label(r), g, lo, hi, n=min(len(r["times"]), len(b["times"])),
                            pairs=f"{len(r['times'])} pair(s) now, {len(b['times'])} in the baseline")))
    return out


def _case_key(r: dict) -> tuple:
    """:data:`GROWTH_KEYS` of a row, numbers as floats and missing values as "" (two frames may
    type a column differently)."""
    def norm(v):
        if v is None or (isinstance(v, float) and math.isnan(v)):
            return ""
        return float(v) if isinstance(v, numbers.Number) and not isinstance(v, bool) else str(v)
    return tuple(norm(r.get(k)) for k in GROWTH_KEYS)


def evaluate(rules: list[Rule], df: pd.DataFrame, baseline: pd.DataFrame | str = NO_BASELINE,
             noise_thresholds: dict | None = None) -> pd.DataFrame:
    """Every rule on every case of ``df`` it selects, each judged by :func:`verdict` (a check fails
    only when the ratio's whole 95 % interval lies above the limit).

    Args:
        rules: of :func:`load_rules`.
        df: this run's rows (:func:`reports.frame.load_frame`).
        baseline: the baseline's rows for ``overhead_growth``; else why there are none, the note of
            the rule's one row: :data:`NO_BASELINE` (no ``--baseline``: verdict ``skipped``) or,
            e.g., "no baseline yet" (verdict ``inconclusive``).
        noise_thresholds: of :mod:`harness.timing.noise` (default its ``THRESHOLDS``): a check whose group
            crossed a machine threshold (CPU pressure, CPU utilisation) while it was timed is
            ``inconclusive`` whatever its interval says (:func:`_with_noise`).

    Returns:
        One row per rule and case: ``rule``, ``metric``, ``case``, ``ratio``, ``lo``, ``hi``
        (NaN without an interval), ``limit``, ``verdict`` (``pass``/``fail``/``inconclusive``,
        ``skipped`` for a growth rule without a baseline) and ``note`` (why inconclusive; the
        noise flags of the group). A rule that selects no case gives one row, case ``"—"``,
        inconclusive, "no case matched".

    Raises:
        ValueError: a non-positive step time among the pairs (:mod:`harness.stats`).
    """
    with_run = df["run_id"].nunique() > 1
    noisy = unit_noise(df, noise_thresholds)
    timed = paired_rows(df)

    def label(r):
        return case_label(r, with_run)
    tables: dict[str, pd.DataFrame] = {}
    rows: list[dict] = []
    for rule in rules:
        if rule.metric == "overhead_vs_prenorm":
            t = tables.setdefault("ratio", paired_ratio_table(df))
            got = [_with_noise(_row(rule, label(r), r["ratio"], r["ratio_lo"], r["ratio_hi"],
                                    pairs=f"{r['pairs']} pair(s)", n=int(r["pairs"])), *_noise_of(r, timed, noisy))
                   for r in _select(t, rule).to_dict("records")]
        elif rule.metric == "overhead_growth":
            if "growth" not in tables:
                tables["growth"] = pair_times(df)
                tables["base"] = baseline if isinstance(baseline, str) else pair_times(baseline)
            got = [_with_noise(row, *_noise_of(r, timed, noisy)) if r is not None else row
                   for r, row in _growth_rows(rule, tables["growth"], tables["base"], label)]
        else:
            t = tables.setdefault("eager", paired_vs_eager_table(df))
            t = _select(t[t["backend"] == rule.metric.split("_vs_")[0]], rule)
            got = [_with_noise(_row(rule, label(r), r["paired_vs_eager"], r["paired_vs_eager_lo"],
                                    r["paired_vs_eager_hi"], pairs=f"{r['pairs']} pair(s)", n=int(r["pairs"])),
                               *_noise_of(r, timed, noisy))
                   for r in t.to_dict("records")]
        rows += got or [_row(rule, NO_CASE, float("nan"), float("nan"), float("nan"), "no case matched")]
    return pd.DataFrame(rows)


def exit_status(results: pd.DataFrame, strict: bool = False) -> int:
    """0 every verdict ``pass`` (or ``skipped``); 1 any ``fail``; 3 only ``inconclusive`` besides
    passes (1 when ``strict``)."""
    if (results["verdict"] == "fail").any():
        return 1
    if (results["verdict"] == "inconclusive").any():
        return 1 if strict else 3
    return 0
