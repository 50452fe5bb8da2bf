"""Numbers as the report writes them, and the sentences that quote them.

Every number of a generated sentence is a cell of a table formatted by the functions below, so a
reader can find it in the table; nothing here computes a statistic. Negative numbers take a real
minus sign (U+2212), ratios two decimals, losses three, p-values two significant digits.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping

from routers.registry import BASELINE

MINUS = "\u2212"


def _missing(x: Any) -> bool:
    return x is None or (isinstance(x, float) and math.isnan(x))


def fmt_num(x: float | None, digits: int = 2) -> str:
    """``x`` with ``digits`` decimals and a real minus sign; "–" when missing."""
    return "–" if _missing(x) else f"{x:.{digits}f}".replace("-", MINUS)


def fmt_signed(x: float | None, digits: int = 3) -> str:
    """``x`` with an explicit sign: "+0.021", "−0.021"."""
    return "–" if _missing(x) else f"{x:+.{digits}f}".replace("-", MINUS)


def fmt_ratio(x: float | None, digits: int = 2) -> str:
    """A ratio: two decimals ("0.91"); two significant digits below 0.1 ("0.0043") and none
    from 100 on ("183"), so a wide interval never reads as 0.00."""
    if _missing(x) or 0.1 <= abs(x) < 100:
        return fmt_num(x, digits)
    return f"{x:.0f}" if abs(x) >= 100 else f"{x:.{digits}g}".replace("-", MINUS)


def fmt_interval(lo: float | None, hi: float | None, digits: int = 2,
                 signed: bool = False) -> str:
    """``"[lo, hi]"`` of ratios (:func:`fmt_ratio`), or of signed differences with ``signed``;
    empty when either end is missing (one pair has no interval)."""
    if _missing(lo) or _missing(hi):
        return ""
    f = fmt_signed if signed else fmt_ratio
    return f"[{f(lo, digits)}, {f(hi, digits)}]"


def fmt_pct(x: float | None, digits: int = 1) -> str:
    """A signed percentage: "−2.1 %"."""
    return "–" if _missing(x) else f"{fmt_signed(x, digits)} %"


def fmt_p(p: float | None) -> str:
    """A p-value: two significant digits, "< 0.001" below that."""
    if _missing(p):
        return "–"
    return "< 0.001" if p < 0.001 else f"{p:.2g}"


def p_equals(p: float | None) -> str:
    """``"p = 0.04"``, or ``"p < 0.001"``."""
    text = fmt_p(p)
    return f"p {text}" if text.startswith("<") else f"p = {text}"


def fmt_sig(x: float | None, digits: int = 3) -> str:
    """``x`` with ``digits`` significant digits at least: "0.0123", "6.00", "12.3", "1234" (all
    integer digits from 10^digits on, never an exponent there)."""
    if _missing(x):
        return "–"
    text = f"{x:#.{digits}g}"
    if "e+" in text or abs(float(text)) >= 10 ** digits:
        text = f"{x:.0f}"
    return text.rstrip(".").replace("-", MINUS)


def fmt_seconds(x: float | None) -> str:
    """Seconds with three significant digits at least ("0.0123 s", "6.00 s", "12.3 s",
    "1234 s")."""
    return "–" if _missing(x) else f"{fmt_sig(x)} s"


def fmt_seeds(seeds: Iterable[Any]) -> str:
    """Seeds as ``"0, 1, 2"``."""
    return ", ".join(str(s) for s in seeds)


def fmt_per_seed(per_seed: Mapping[Any, Any]) -> str:
    """Per-seed ratios in seed order: a number with two decimals, or the string of
    :func:`harness.stats.seeds.paired_ratio` ("> 1.23", "diverged", ...)."""
    return ", ".join(v if isinstance(v, str) else fmt_ratio(v)
                     for _, v in sorted(per_seed.items()))


def _seeds_word(n: int) -> str:
    return f"{n} seed" + ("" if n == 1 else "s")


def training_sentence(row: Mapping[str, Any], prefix: str = "") -> str:
    """One sentence for a row of :func:`reports.race.comparison_table`, after ``prefix``
    (e.g. ``"[run r1, eager] "`` when several runs are reported together).

    Quotes the time-to-target ratio with its interval and seed count, its two factors (steps and
    per-step time), the loss difference at the token budget with the perplexity change and the
    paired t-test, and the loss difference at equal wall-clock time with the pairs it rests on.
    With no pair a sentence says which seeds were left out and why; with one pair it says there
    is no interval; when no run of either side was measured (skipped, failed) it says only that.
    When the two sides of a seed trained under different CPU load (``load``, a sequential race on
    a shared machine) the head says so, with the readings.
    """
    who, base = row["variant"], row["baseline"]
    if row.get("not_measured"):
        return f"{prefix}{who} vs {base}: not measured ({row['not_measured']})."
    target = ("the target" if _missing(row["target_loss"])
              else f"{fmt_num(row['target_loss'], 3)} nats")
    n = int(row["n"])
    if n == 0:
        head = f"{who} vs {base}: no seed reached {target} on both sides"
    else:
        ci = fmt_interval(row["time_lo"], row["time_hi"])
        spread = (f" {ci} ({_seeds_word(n)}, {row['conf']:.0%} t-interval)" if ci
                  else f" ({_seeds_word(n)}: no interval)")
        head = (f"{who} reached {target} in {fmt_ratio(row['time_ratio'])}× the time of "
                f"{base}{spread}: {fmt_ratio(row['steps_ratio'])}× the steps at "
                f"{fmt_ratio(row['step_time_ratio'])}× the step time")
    parts = [head]
    if row.get("load"):  # a time ratio of two runs that met different loads measures the load
        parts[0] = (f"{head} (under different load, {row['load']}: the time ratios measure the load too; "
                    "race interleaved or on a quiet machine)")
    if row.get("dropped"):
        parts.append(f"left out: {row['dropped']}")
    parts.append(_loss_clause(row))
    wall = _wall_clause(row)
    return prefix + "; ".join(parts + ([wall] if wall else [])) + "."


def _wall_clause(row: Mapping[str, Any]) -> str:
    """The loss difference at T* with the pairs it rests on: a run whose clock ended before T*
    cannot be read there, so its pair is named as left out."""
    n, short = int(row.get("wall_n") or 0), int(row.get("wall_short") or 0)
    if _missing(row.get("t_star")) or n + short == 0:
        return ""
    t_star = fmt_seconds(row["t_star"])
    if n == 0:
        return (f"no pair at equal wall-clock ({t_star}): {short} pair" + ("s" if short > 1 else "")
                + " ended sooner")
    pairs = f"{n} pair" + ("" if n == 1 else "s")
    if short:
        pairs = (f"{n} of {n + short} pairs, the other" + (f" {short}" if short > 1 else "")
                 + " ended sooner")
    ci = fmt_interval(row["wall_diff_lo"], row["wall_diff_hi"], 3, signed=True)
    test = f" {ci} ({p_equals(row['wall_p'])})" if ci else " (1 pair: no test)"
    return f"at equal wall-clock ({t_star}; {pairs}) {fmt_signed(row['wall_diff'])} nats{test}"


def _loss_clause(row: Mapping[str, Any]) -> str:
    n = int(row.get("loss_n") or 0)
    if n == 0:
        return "no loss at the token budget on both sides"
    text = (f"loss at the token budget {fmt_signed(row['loss_diff'])} nats "
            f"(perplexity {fmt_pct(row['ppl_change_pct'])}")
    if n == 1:
        return text + ", 1 seed: no test)"
    return text + f", paired t {p_equals(row['loss_p'])})"


def training_sentences(table: Any, prefixes: Iterable[str] | None = None) -> list[str]:
    """:func:`training_sentence` of every row of a comparison table (a DataFrame), each after
    its prefix (:func:`reports.training.sentence_prefixes`) when given."""
    rows = table.to_dict("records")
    return [training_sentence(r, p) for r, p in zip(rows, prefixes or [""] * len(rows))]


#: Statuses of runs that give no number at all (nothing was measured).
UNMEASURED = ("error", "skipped", "incomplete")


def notes(runs: Any) -> list[str]:
    """The distinct notes of runs (rows of :func:`reports.training.runs_table`), else their
    statuses, in order of first appearance."""
    return list(dict.fromkeys(n or s for n, s in zip(runs["note"], runs["status"])))


def reasons(runs: Any) -> str:
    """:func:`notes` as ``"a; b"``."""
    return "; ".join(notes(runs))


def runs_sentence(runs: Any) -> str:
    """How many runs of :func:`reports.training.runs_table` reached the target, and which did
    not (not converged, diverged, failed, skipped), by router and seed; when every run was
    skipped or failed alike, only that and why ("Runs: 2 measured, both skipped (...)")."""
    measured = runs[runs["mode"] == "train"]
    pilots = int((runs["mode"] == "pilot").sum())
    text = f"Runs: {len(measured)} measured" + (
        f" and {pilots} pilot" + ("s" if pilots != 1 else "") if pilots else "")
    statuses = set(runs["status"])
    if len(statuses) == 1 and statuses <= set(UNMEASURED):
        n = len(runs)
        every = {1: "", 2: "both "}.get(n, f"all {n} ")
        return f"{text}, {every}{runs['status'].iloc[0]} ({reasons(runs)})."
    text += f"; {int((measured['status'] == 'ok').sum())} reached the target"
    for status in ("not converged", "diverged", *UNMEASURED):
        bad = measured[measured["status"] == status]
        if len(bad):
            who = ", ".join(f"{r.variant} seed {r.seed}"
                            + (f" [{r.backend}]" if runs["backend"].nunique() > 1 else "")
                            for r in bad.itertuples(index=False))
            why = f": {reasons(bad)}" if status in UNMEASURED else ""
            text += f"; {len(bad)} {status} ({who}{why})"
    return text + "."


# --- the cost summary (reports/summary.py) -------------------------------------------------

def _pct(ratio: float, lo: float, hi: float, noisy: str | float, label: str,
         tolerance: float = 0.25) -> str:
    """``+36 % eager [CI 29 to 41 %]`` (``[CI −58 to +97 %]`` when the interval spans no change);
    the number is always given, flagged ``(imprecise: CI wider
    than 25 % of the ratio)`` when its interval is wide, ``(no CI: fewer than 5 pairs)`` when it
    has none, and ``(noisy group)`` when its timing crossed a noise threshold (a busy machine, or a
    spread or an interval wider than its threshold); ``""`` without a ratio."""
    if ratio != ratio:
        return ""

    def pct(x: float, sign: str = "+") -> str:
        return f"{(x - 1) * 100:{sign}.0f}".replace("-", MINUS)

    flags = []
    if hi != hi or lo != lo:
        text = f"{pct(ratio)} % {label}"
        flags.append("no CI: fewer than 5 pairs")
    else:
        text = f"{pct(ratio)} % {label} [CI {pct(lo, '')} to {pct(hi, '+' if lo < 1 <= hi else '')} %]"
        if (hi - lo) / ratio > tolerance:
            flags.append(f"imprecise: CI wider than {tolerance:.0%} of the ratio")
    if isinstance(noisy, str) and noisy:
        flags.append("noisy group")
    return text + "".join(f" ({f})" for f in flags)


def _paper_clause(r: dict, quoted: list[tuple[str, str]], tolerance: float) -> str:
    """``over block_attnres two_phase (same rounds): +16 % eager [CI 10 to 21 %], +8 % compiled
    [CI 3 to 12 %]`` for a row with a ``paper_baseline``: each backend quoted against prenorm, against
    the paper baseline timed in the same group; a backend where it was not timed says so, and a
    row where it was timed in none says only that (no ratio divided across groups)."""
    base = r["paper_baseline"].replace(" [", " ").rstrip("]")
    said, missing = [], []
    for key, word in quoted:
        def v(c: str) -> float:
            x = r.get(f"{key}_vs_paper{c}")
            return float("nan") if x is None else x
        p = _pct(v(""), v("_lo"), v("_hi"), r.get(f"{key}_vs_paper_noisy"), word, tolerance)
        (said if p else missing).append(p or word)
    if not said:
        return f"{base} was not timed in the same group, so no paired ratio to it"
    text = f"over {base} (same rounds): " + ", ".join(said)
    if missing:
        text += f" ({', '.join(missing)}: {base} not timed in the same group)"
    return text


def cost_sentence(r: dict, tolerance: float = 0.25, run: bool = False,
                  labels: list[tuple[str, str]] | None = None, host_bound: float = 0.8) -> str:
    """One sentence of a :func:`reports.summary.cost_summary` row, e.g. "haares two_phase over
    prenorm at d=256, 12 layers, T=256, B=4, fwd_bwd: +36 % eager [CI 29 to 41 %]; +16 % compiled
    [CI 10 to 21 %]; 1.40× the saved activations."; with ``run``, it starts with the row's
    ``run_id`` ("In run X, …").

    ``labels``: (column prefix, word) of each backend to quote, in order (default eager, then
    compiled); each ratio is followed by its ``(12.3× floor)`` where the row has a ``<prefix>_floor``.
    On a ``cuda`` row whose ``busy_share`` is below ``host_bound`` the eager ratio is flagged
    ``(host-bound: the GPU was busy 36 % of the step)`` and the sentence says which ratio measures
    the router's device cost (graph replay, else compiled, else that none was timed). A backend
    with no ratio but a ``<prefix>_failed`` text is said with it ("compiled failed: …"). A row
    with a ``paper_baseline`` (haares, wav_v1) ends with its ratio to it from the same rounds
    (:func:`_paper_clause`)."""
    labels = labels or [("eager", "eager"), ("compile", "compiled")]

    def num(x) -> float:
        return float("nan") if x is None else x

    def ok(x) -> bool:
        return x is not None and x == x

    busy = r.get("busy_share")
    flagged = (str(r.get("device") or "").startswith("cuda") and ok(busy) and busy < host_bound
               and ok(r.get("eager_ratio")))
    parts, quoted = [], []
    for key, word in labels:
        p = _pct(num(r.get(f"{key}_ratio")), num(r.get(f"{key}_lo")), num(r.get(f"{key}_hi")),
                 r.get(f"{key}_noisy"), word, tolerance)
        if not p:
            if isinstance(r.get(f"{key}_failed"), str) and r[f"{key}_failed"]:  # planned, not timed: why
                parts.append(f"{word} {r[f'{key}_failed']}")
            continue
        quoted.append(key)
        if key == "eager" and flagged:
            whose = f"{BASELINE}'s eager step" if r.get("busy_of") == BASELINE else "the step"
            p += f" (host-bound: the GPU was busy {busy * 100:.0f} % of {whose})"
        if ok(r.get(f"{key}_floor")):
            p += f" ({r[f'{key}_floor']:.1f}× floor)"
        parts.append(p)
    if flagged:
        device = [w for k, w in labels if k in quoted and k != "eager"]
        device.sort(key=lambda w: w != "graph replay")
        parts.append(f"{device[0]} measures the router's device cost, eager mostly host overhead"
                     if device else "no graph-replay or compiled ratio was timed for it, so its "
                     "device cost is not measured here")
    if r.get("saved_ratio") == r.get("saved_ratio") and r.get("saved_ratio") is not None:
        parts.append(f"{r['saved_ratio']:.2f}× the saved activations")
    if isinstance(r.get("paper_baseline"), str) and r["paper_baseline"]:
        parts.append(_paper_clause(r, [(k, w) for k, w in labels if k in quoted], tolerance))
    return ((f"In run {r['run_id']}, " if run else "") + f"{r['router']} {r['impl']} over prenorm at d={r['d_model']}, {r['n_layers']} layers, "
            f"T={r['seq_len']}, B={r['batch_size']}, {r['mode']}: " + "; ".join(parts) + ".")
