"""What the reader must know before trusting a number (the report's "Warnings" section): problems
met reading the records, noisy timings, timings stopped short of their precision target, the GPU
readings a CUDA run had, diverged training runs, and numbers the data itself contradicts.
"""

from __future__ import annotations

import pandas as pd

from harness.timing import noise
from routers import impls

from . import frame, paired, race, tables
from . import plotting as pl


def _thresholds(t: dict) -> str:
    """``cpu_util_min 0.8`` -> ``cpu_util < 0.8``: the noise thresholds as the flags read."""
    return ", ".join(f"{k.rsplit('_', 1)[0]} {'<' if k.endswith('_min') else '>'} {v:g}"
                     for k, v in t.items())


#: Above this share of noisy timed cases a run's verdict is that it cannot answer.
MOSTLY_NOISY = 0.5


def verdict(df: pd.DataFrame) -> str | None:
    """One sentence for the top of the report and of ``summary`` when most timed cases of the
    runs (more than :data:`MOSTLY_NOISY`) were noisy in their last timing: how many, the reading
    that crossed its threshold most often (with its worst value), and what to do; None otherwise."""
    noisy = paired.noise_by_case(df, df.attrs.get("noise_thresholds"))
    timed = frame.ok_rows(df, "step_time")["case_key"].nunique() if len(df) else 0
    if not timed or len(noisy) <= MOSTLY_NOISY * timed:
        return None
    worst: dict[str, tuple[int, str]] = {}
    for reasons in noisy.values():
        for r in reasons:
            name = r.split()[0]
            n, text = worst.get(name, (0, r))
            worst[name] = (n + 1, max(text, r, key=lambda t: float(t.split()[1])))
    name, (n, text) = max(worst.items(), key=lambda kv: kv[1][0])
    hint = {"cpu_pressure": "other work took the CPU", "cpu_util": "the process got less CPU than it asked for",
            "iqr_rel": "step times spread", "ci_width_rel": "paired intervals stayed wide",
            "sm_clock_spread": "the GPU clock moved"}.get(name, "")
    return (f"Verdict: this run cannot answer. {len(noisy)} of {timed} timed cases were noisy in their last timing "
            f"({n} by {name}, worst {text}{': ' + hint if hint else ''}), so their ratios may be off by more "
            "than their intervals say. Run it again when nothing else runs (/proc/pressure/cpu avg10 near 0); "
            "the numbers below are kept, each flagged.")


def incomplete(df: pd.DataFrame, manifests: dict[str, dict]) -> list[str]:
    """One sentence per cost run that holds fewer cases than it planned (``manifest.json``'s
    ``cases``): a run stopped early (interrupted, crashed, out of time) whose missing cases a
    resume would measure."""
    out = []
    rows = frame.cost_rows(df)
    for run_id, m in (manifests or {}).items():
        planned = m.get("cases") if m.get("command") == "run" else None
        if not isinstance(planned, int) or planned <= 0:
            continue
        got = rows[(rows["run_id"] == run_id) & (rows["metric"] == "step_time")]["case_key"].nunique()
        if got < planned:
            out.append(f"Incomplete: run {run_id} holds {got} of the {planned} cost cases it planned; the "
                       "others were never measured (the run was stopped or its process died): "
                       "`routerbench status` on its directory says how to resume it.")
    return out


def interpreted(df: pd.DataFrame, manifests: dict[str, dict]) -> list[str]:
    """One sentence per run made with ``TRITON_INTERPRET=1`` (``manifest.json``'s environment)
    whose rows hold a Triton impl's timings (``fused``, or a peer that runs under the interpreter):
    Python ran those kernels, so their step times, ratios and × floor say nothing of a GPU."""
    out = []
    for run_id, m in (manifests or {}).items():
        if str((m.get("environment") or {}).get("triton_interpret")) != "1":
            continue
        rows = df[(df["run_id"] == run_id) & (df["metric"] == "step_time")] if "run_id" in df else df.iloc[:0]
        names = sorted(n for n in rows.get("impl", pd.Series(dtype=object)).dropna().unique()
                       if n in impls.IMPLS and impls.IMPLS[n].interpretable)
        if names:
            out.append(f"Triton's interpreter: run {run_id} ran with TRITON_INTERPRET=1, so Python executed the "
                       f"Triton kernels of {', '.join(names)} on the CPU; their step times, ratios and x floor are "
                       "the interpreter's, not a GPU's. Only their parity and byte counts (router_io_kernel) "
                       "carry over.")
    return out


def race_threads(manifests: dict[str, dict]) -> list[str]:
    """One sentence per run whose smoke race trained on fewer threads than the cost sweep, because
    the machine was busy at its start (a session's ``race_threads``, :func:`harness.cli.train.
    race_threads`): its step times are not those of the environment table's thread count."""
    out = []
    for run_id, m in (manifests or {}).items():
        for session in m.get("sessions") or [m]:
            rt = session.get("race_threads") if isinstance(session, dict) else None
            if isinstance(rt, dict) and rt.get("threads"):
                out.append(f"Race on fewer threads: run {run_id}'s smoke race trained on {rt['threads']} "
                           f"thread{'s' * (rt['threads'] != 1)}, not {rt.get('instead_of', '?')}, because the "
                           "machine was busy at its start (manifest: race_threads); its per-step times are "
                           "those of that thread count, the same for both sides of each pair.")
                break
    return out


def warnings(df: pd.DataFrame) -> list[str]:
    """What the reader must know before trusting a number: problems met reading the records, plugins
    the runs recorded that could not be loaded here (``df.attrs["plugin_notes"]``), and timed groups whose last timing was noisy (:mod:`harness.timing.noise`; their ratios are flagged in
    the paired table)."""
    out = [f"Records: {p}" for p in df.attrs.get("record_problems", [])]
    out += [f"Plugins: {n}." for n in df.attrs.get("plugin_notes", [])]
    given = df.attrs.get("noise_thresholds")
    if given and given != noise.THRESHOLDS:
        out.append("Noise thresholds given to this report (not the defaults the run re-measured by): "
                   + ", ".join(f"{k} {v:g}" for k, v in given.items()) + ".")
    noisy = paired.noise_by_case(df, df.attrs.get("noise_thresholds"))
    if noisy:
        timed = frame.ok_rows(df, "step_time")["case_key"].nunique()
        retimed = int((df.drop_duplicates("case_key")["attempts"] > 1).sum()) if "attempts" in df else 0
        first = df.drop_duplicates("case_key").set_index("case_key", drop=False)
        examples = "; ".join(f"{frame.case_label(first.loc[k])}: {', '.join(r)}"
                             for k, r in list(noisy.items())[:5])
        out.append(f"Noise: {len(noisy)} of {timed} timed cases were noisy in their last timing "
                   f"({retimed} cases were timed more than once); their absolute times are unreliable, "
                   f"their paired ratios are flagged (column \"noisy\": each reading that crossed its "
                   f"threshold, {_thresholds(given or noise.THRESHOLDS)}; paired.csv keeps the full "
                   f"reasons). E.g. {examples}.")
    left = frame.ok_rows(df, "left_noisy") if "metric" in df else df.iloc[:0]
    if len(left):
        n = left["case_key"].nunique()
        out.append(f"Load: {n} noisy case{'s' * (n != 1)} kept {'their' if n != 1 else 'its'} first timing, "
                   f"flagged noisy, because the machine was still busy when {'they' if n != 1 else 'it'} "
                   f"would have been timed again (a task waited for a CPU up to "
                   f"{left['value'].astype(float).max():.0%} of the last 10 s): timing again could not have "
                   "made them quiet. Run again when nothing else runs to quote these ratios.")
    t = paired.paired_ratio_table(df, n_boot=200)
    short = t[t["stop"].isin(["budget", "max_rounds"])] if len(t) else t
    if len(short):
        hw = ((short["ratio_hi"] - short["ratio_lo"]) / (2 * short["ratio"])).dropna()
        out.append(f"Precision: the timing of {len(short)} of {len(t)} paired ratios stopped on its budget "
                   f"or its last look before reaching --precision-target (column \"timing stopped\"); "
                   + (f"their half-widths reached ±{hw.min():.1%} to ±{hw.max():.1%}." if len(hw) else
                      "they have no interval."))
    return (out + gpu_readings(df) + race.diverged_warnings(df, pl.variant_labels(df))
            + consistency_warnings(df))


def gpu_readings(df: pd.DataFrame) -> list[str]:
    """What the GPU readings of a CUDA run's timings were (:mod:`harness.timing.gpu`): without
    ``sm_clock_spread`` rows, one sentence saying that NVML was not read and what was; with them,
    the widest clock spread, the hottest reading and the throttle reasons seen. Nothing for a run
    without CUDA timings."""
    from harness.timing.gpu import throttle_text

    st = frame.ok_rows(df, "step_time")
    if st.empty or not st["device"].astype(str).str.startswith("cuda").any():
        return []
    read = df[df["metric"].isin(["sm_clock_spread", "gpu_temp_max", "throttle_reasons"])
              & (df["status"] == "ok") & df["value"].notna()]
    if read.empty:
        return ["GPU readings: these CUDA timings were taken without nvidia-ml-py (pynvml), so they hold "
                "the SM clock before and after each timing (sm_clock_mhz) and the host's readings, not "
                "the clock's spread over the timing, the temperature or the throttle reasons; install "
                "nvidia-ml-py on the GPU machine to record them."]
    get = {m: g["value"].astype(float) for m, g in read.groupby("metric")}
    mask = 0
    for v in get.get("throttle_reasons", []):
        mask |= int(v)
    parts = []
    if "sm_clock_spread" in get:
        parts.append(f"the SM clock moved by at most {get['sm_clock_spread'].max() * 100:.1f} % within a timing")
    if "gpu_temp_max" in get:
        parts.append(f"the hottest reading was {get['gpu_temp_max'].max():.0f} °C")
    parts.append(f"clock-event reasons seen: {throttle_text(mask & ~0x1)}")
    return ["GPU readings (NVML, sampled every 20 ms over each timing): " + "; ".join(parts) + "."]


#: How far a paired and an unpaired ratio to prenorm may differ (relative) before they disagree.
RATIO_TOLERANCE = 0.10


#: Each mode does strictly more work than the one before it, so it must not be faster.
MODE_ORDER = ("fwd", "fwd_bwd", "train_step")


def consistency_warnings(df: pd.DataFrame, tolerance: float = RATIO_TOLERANCE) -> list[str]:
    """Numbers that the data itself contradicts, as sentences: a case whose ``fwd`` is slower than
    its ``fwd_bwd`` (or ``fwd_bwd`` slower than ``train_step``), a paired and an unpaired ratio to
    prenorm that differ by more than ``tolerance``, skipped backends, and no CUDA device."""
    out = []
    st = tables.step_time_summary(df)
    if not st.empty:
        keys = [k for k in frame.CASE_KEYS if k != "mode"]
        med = st.pivot_table(index=keys, columns="mode", values="median_ms", aggfunc="first")
        for lighter, heavier in zip(MODE_ORDER, MODE_ORDER[1:]):
            if lighter in med and heavier in med:
                bad = med[med[lighter] > med[heavier]]
                if len(bad):
                    who = ", ".join(f"{r['variant']} {r['backend']} d={r['d_model']} L={r['n_layers']}"
                                    for r in bad.reset_index().head(5).to_dict("records"))
                    out.append(f"Inconsistent: {len(bad)} case(s) whose {lighter} step is slower than "
                               f"its {heavier} step ({who}); their absolute times are not to be trusted.")
        pt = paired.paired_ratio_table(df)
        ov = tables.overhead_table(df)
        if not pt.empty and not ov.empty:
            on = [k for k in ("run_id", "backend", "compile_mode", "compile_scope", "mode", "workload", *frame.SHAPE_COLS,
                              "variant") if k in pt and k in ov]
            both = pt.merge(ov[[*on, "overhead_pct"]], on=on)
            unpaired = 1 + both["overhead_pct"] / 100
            off = both[(unpaired / both["ratio"] - 1).abs() > tolerance]
            if len(off):
                who = ", ".join(f"{r['variant']} {r['mode']} {r['backend']} d={r['d_model']} "
                                f"L={r['n_layers']}: paired {r['ratio']:.2f}, "
                                f"unpaired {1 + r['overhead_pct'] / 100:.2f}"
                                for r in off.head(5).to_dict("records"))
                out.append(f"Inconsistent: {len(off)} paired and unpaired ratios to prenorm differ by "
                           f"more than {tolerance:.0%} ({who}); trust the paired ratio, whose two sides "
                           "ran under the same load.")
    skipped = df[(df["metric"] == "step_time") & (df["status"] == "skipped")]
    for backend, g in skipped.groupby("backend"):
        out.append(f"Skipped: backend {backend} ({g['case_key'].nunique()} cases): "
                   f"{g['error'].iloc[0]}.")
    if len(df) and not (df["device"].astype(str).str.startswith("cuda")).any():
        out.append("No CUDA device: every time here is a CPU time; the routers' costs on a GPU "
                   "(and the papers' claims) can differ widely.")
    return out
