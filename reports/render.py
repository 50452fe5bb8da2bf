"""The per-GPU report: tables and figures of one or more runs as ``report.md`` and ``report.html``.

Both documents come from one list of sections, so they say the same thing; the HTML one embeds its
figures as base64 PNG data URIs and needs no other file.
"""

from __future__ import annotations

import base64
import html
import json
import math
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

import pandas as pd

from harness import noise
from harness.records import MANIFEST_FILE, aborted_summary

from . import figures, floor, impls, paired, sentences, summary, tables, training

CPU_RACE_NOTE = ("On CPU the race is a smoke test: the papers see gains only at 24–48 layers. "
                 "Time, steps and tokens to target are interpolated linearly between the two "
                 "evaluations around the crossing, as the protocol below says.")

#: Report header and number format of each measured column.
COLUMN_STYLE = {
    "median_ms": ("median step (ms)", "{:.3f}"), "iqr_ms": ("IQR (ms)", "{:.3f}"),
    "n": ("repeats", None), "prenorm_ms": ("prenorm (ms)", "{:.3f}"),
    "overhead_pct": ("overhead vs prenorm (%)", "{:+.1f}"), "gflop_fwd": ("fwd GFLOP", "{:.3f}"),
    "router_flop_pct": ("router FLOP (%)", "{:.2f}"), "saved_mib": ("saved act. (MiB)", "{:.2f}"),
    "saved_ratio": ("saved / prenorm", "{:.2f}"), "router_state_mib": ("router state (MiB)",
                                                                      "{:.3f}"),
    "peak_mib": ("peak alloc. (MiB)", "{:.1f}"), "params_matrix": ("matrix params", "{:,.0f}"),
    "params_router": ("router params", "{:,.0f}"), "target_loss": ("target (nats)", "{:.4f}"),
    "time_to_target": ("time to target (s)", sentences.fmt_sig),
    "steps_to_target": ("steps", None),
    "tokens_to_target": ("tokens", "{:,.0f}"), "token_budget": ("token budget", "{:,.0f}"),
    "loss_at_token_budget": ("loss at budget (nats)", "{:.4f}"),
    "final_val_loss": ("final val loss", "{:.4f}"), "final_step": ("final step", None),
    "median_time_to_target": ("median time to target (s)", sentences.fmt_sig),
    "min_s": ("min (s)", sentences.fmt_sig), "max_s": ("max (s)", sentences.fmt_sig),
    "median_loss_at_budget": ("median loss at budget", "{:.4f}"),
    "tokens_per_s": ("tokens/s", "{:,.0f}"), "model_gflop": ("model GFLOP/step", "{:.3f}"),
    "model_tflops": ("model TFLOP/s", "{:.3f}"), "device_name": ("device name", None),
    "peak_tflops": ("peak BF16 TFLOP/s", "{:.0f}"), "mfu_pct": ("MFU (%)", "{:.2f}"),
    "train_time": ("training clock (s)", sentences.fmt_sig),
}
COLUMN_STYLE.update(paired.COLUMN_STYLE)  # headers of the paired-timing table
COLUMN_STYLE.update(floor.COLUMN_STYLE)
COLUMN_STYLE.update(summary.COLUMN_STYLE)
COLUMN_STYLE.update(impls.COLUMN_STYLE)
#: Case columns that, when equal in every row, move into a sentence above the table.
_COMMON = ("run_id", "options", "impl", "backend", "compile_mode", "mode", "workload",
           *tables.SHAPE_COLS, "device", "seed")

CSS = """body{font-family:system-ui,sans-serif;max-width:1200px;margin:2em auto;padding:0 1em;
color:#222;line-height:1.45}table{border-collapse:collapse;margin:.6em 0 1.2em;font-size:.88em}
th,td{border:1px solid #ccc;padding:.25em .55em;text-align:right}th{background:#f2f2f2}
td:first-child,th:first-child{text-align:left}img{max-width:100%}h1{font-size:1.5em}
.toc{background:#f7f7f7;padding:.4em 1em;margin:1em 0}.toc ol{margin:.3em 0}
h2{font-size:1.2em;border-bottom:1px solid #ddd;padding-bottom:.2em}.note{color:#555}"""


@dataclass
class Section:
    """One report section: a heading and blocks ``("text", str)``, ``("subtitle", str)``,
    ``("table", DataFrame)`` or ``("figure", Path, caption)``."""

    title: str
    blocks: list[tuple] = field(default_factory=list)


#: Rows of the environment table: (label, shown when no manifest has it, candidate keys of the
#: manifest, each a dotted path or its last component; harness.env nests most under "environment").
_ENV_FIELDS = (
    ("device", True, ("gpu_name", "device_name", "gpu.name", "device")),
    ("torch", True, ("torch_version", "torch")),
    ("CPU", True, ("cpu_model", "cpu.model", "processor")),
    ("threads", True, ("torch_threads", "cpu_threads", "num_threads", "threads")),
    ("git sha", True, ("git_sha", "git.sha", "commit")),
    ("command line", True, ("command_line", "command", "argv")),
    ("corpus sha256", True, ("corpus.sha256", "corpus_sha256", "corpus_hash")),
    ("GPU count", False, ("gpu_count",)), ("CPU count", False, ("cpu_count",)),
    ("CUDA", False, ("cuda_version", "cuda")), ("driver", False, ("driver",)),
    ("Python", False, ("python_version", "python")),
    ("float32 matmul precision", False, ("precision_policy", "matmul_precision")),
)


def _flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        out.update(_flatten(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def _lookup(flat: dict[str, Any], candidates: Iterable[str]) -> str | None:
    for c in candidates:
        hits = [v for k, v in flat.items() if k == c] or \
               [v for k, v in flat.items() if k.rsplit(".", 1)[-1] == c]
        for v in hits:
            if isinstance(v, (list, tuple)):
                return shlex.join(str(x) for x in v)
            if v not in (None, ""):
                return str(v)
    return None


def environment_table(run_dirs: Iterable[Path | str]) -> pd.DataFrame:
    """The environment of each run from its ``manifest.json``.

    Returns:
        ``field`` plus one column per run with a manifest (named by its ``run_id`` or directory
        name); empty when no run has a manifest. Long hashes are shortened.
    """
    manifests = {}
    for d in map(Path, run_dirs):
        try:
            manifests[d] = json.loads((d / MANIFEST_FILE).read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            continue  # a run without a (readable) manifest: the report says so
    if not manifests:
        return pd.DataFrame(columns=["field"])
    flats = {str(m.get("run_id") or d.name): _flatten(m) for d, m in manifests.items()}
    rows = []
    for label, always, cands in _ENV_FIELDS:
        vals = {run: _lookup(f, cands) for run, f in flats.items()}
        if not always and all(v is None for v in vals.values()):
            continue
        if label in ("git sha", "corpus sha256"):  # 12 hex digits name a commit or a corpus
            vals = {r: v and v[:12] + ("-dirty" if v.endswith("-dirty") else "")
                    for r, v in vals.items()}
        rows.append({"field": label, **{r: "–" if v is None else v for r, v in vals.items()}})
    return pd.DataFrame(rows)


def _cell(value, fmt: str | Callable[[float], str] | None) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)) or value == "":
        return "–"
    if isinstance(value, str):
        return value
    if fmt:
        return fmt(value) if callable(fmt) else fmt.format(value)
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def display_frame(frame: pd.DataFrame, drop: Iterable[str] = (),
                  move_common: bool = True) -> tuple[pd.DataFrame, list[str]]:
    """A table ready to print: numbers formatted as strings under report headers, empty columns
    dropped and, with ``move_common``, case columns equal in every row dropped too.

    Returns:
        (the formatted frame, the names of the columns equal in every row that were dropped).
    """
    frame = frame.drop(columns=[c for c in drop if c in frame])
    empty = [c for c in frame if frame[c].isna().all() or (frame[c].astype(str) == "").all()]
    common = [c for c in _COMMON if move_common and c in frame and c not in empty
              and len(frame) > 1 and frame[c].astype(str).nunique() == 1]
    frame = frame.drop(columns=empty + common)
    out = pd.DataFrame({COLUMN_STYLE.get(c, (c,))[0]:
                        [_cell(v, COLUMN_STYLE.get(c, (c, None))[1]) for v in frame[c]]
                        for c in frame})
    return out, common


def _table_blocks(frame: pd.DataFrame, empty_text: str, drop: Iterable[str] = (),
                  split: Iterable[str] = ()) -> list:
    """A sentence with the columns common to all rows, then the table, or one sub-table per
    value of the ``split`` columns that vary (e.g. one per mode and backend)."""
    if frame.empty:
        return [("text", empty_text)]
    frame = frame.drop(columns=[c for c in drop if c in frame])
    shown, common = display_frame(frame)
    blocks = [("text", "Common to all rows: " + ", ".join(
        f"{c} {_cell(frame[c].iloc[0], None)}" for c in common) + ".")] if common else []
    keys = [c for c in split if c in frame and c not in common]
    if not keys:
        return blocks + [("table", shown)]
    for values, group in frame.groupby(keys, sort=False):
        title = " · ".join(str(v) for v in values if str(v))
        if title:
            blocks.append(("subtitle", title))
        blocks.append(("table", display_frame(group, common + keys, move_common=False)[0]))
    return blocks


def _figure_block(path: Path | None, name: str, caption: str) -> tuple:
    return ("figure", path, caption) if path else ("text", figures.NO_DATA[name])


def _title(df: pd.DataFrame, env: pd.DataFrame, run_dirs: list[Path]) -> str:
    names = []
    for run in env.columns[1:]:
        device, cpu = (env.loc[env["field"] == f, run].iloc[0] for f in ("device", "CPU"))
        names.append(cpu if device.lower() in ("cpu", "–") and cpu != "–" else device)
    names = [n for n in names if n != "–"] or sorted(d for d in df["device"].unique() if d)
    runs = sorted(r for r in df["run_id"].unique() if r) or [d.name for d in run_dirs]
    return (f"routerbench report: {', '.join(dict.fromkeys(names)) or 'unknown device'}"
            f" — run {', '.join(runs)}")


#: Captions of the training figures; each says what its band, points and intervals are.
TRAINING_CAPTIONS = {
    "loss_curves": "Validation loss vs tokens seen and vs the training clock: per router the "
                   "mean over seeds (line) and the min–max over seeds (band; on the clock panel "
                   "each seed interpolated on a common grid up to the shortest run); diverged "
                   "runs dotted, each alone, out of the band; the pilot dashed; the target loss "
                   "dash-dotted.",
    "time_to_target": "Time to target, router / baseline, per seed (dots) with the geometric "
                      "mean and its t-interval (black diamond); open triangles are bounds of "
                      "pairs where one run did not converge, left out of the interval.",
    "decomposition": "Time-to-target ratio = steps ratio × time-per-step ratio: geometric means "
                     "over the pairs where both runs reached the target, each with its own "
                     "t-interval; a line at 1.",
}


def _training_blocks(df: pd.DataFrame, figs: dict[str, Path | None],
                     manifests: dict[str, dict]) -> list:
    """The training race: the settings of each run, the protocol, sentences, the comparison
    table, the figures, the per-run table (pilot rows marked), a line counting what did not
    converge or diverged."""
    runs = training.runs_table(df)
    table = training.comparison_table(df)
    said = [("text", s) for s in sentences.training_sentences(
        table, training.sentence_prefixes(df, table, manifests))]
    blocks = [("text", line) for line in training.protocol_lines(df, manifests)]
    if runs["status"].isin(sentences.UNMEASURED).all():  # nothing trained: only say why
        blocks += said
    else:
        smoke = training.smoke_runs(df)
        if smoke:  # one seed per router (the race of `routerbench run`): no interval, no test
            blocks.append(("text", f"Smoke test (run {', '.join(smoke)}): one seed per router, "
                                   "so no interval and no test; not a result."))
            if (training.train_rows(df)["device"] == "cpu").any():
                blocks.append(("text", CPU_RACE_NOTE))
        blocks += [("text", training.METHOD), *said]
        blocks += _table_blocks(training.comparison_display(table),
                                "No comparison: no router was trained beside its baseline "
                                f"({tables.BASELINE}) in the same run and backend.",
                                split=("run_id", "backend"))
        blocks += [_figure_block(figs.get(n), n, TRAINING_CAPTIONS[n])
                   for n in TRAINING_CAPTIONS]
    blocks.append(("subtitle", "Every run" + (" (the pilot, mode pilot, set the target loss)"
                                              if (runs["mode"] == training.PILOT_MODE).any()
                                              else "")))
    blocks += _table_blocks(runs, "", drop=("router",), split=("run_id", "backend"))
    pooled = tables.training_by_router(df)
    if not pooled.empty and pooled["seeds"].max() > 1:
        blocks.append(("text", "Pooled over seeds (a run that never reached the target counts "
                               "as slowest):"))
        blocks += _table_blocks(pooled, "")
    blocks.append(("text", sentences.runs_sentence(runs)))
    return blocks


def _cost_sections(df: pd.DataFrame, figs: dict[str, Path | None],
                   manifests: dict[str, dict]) -> list[Section]:
    """The sections of the cost sweep: step time, FLOPs and memory; paired timing; backends;
    the routers' cost models."""
    cost = Section("Cost: step time, FLOPs and memory vs prenorm", [])  # figures first, then tables
    # Paired ratios are the headline; a run timed --no-paired gets the unpaired figure, labelled.
    if figs.get("overhead_vs_width") is None and figs.get("step_time_overhead_vs_width"):
        cost.blocks.append(_figure_block(figs["step_time_overhead_vs_width"], "step_time_overhead_vs_width",
                                         "Step-time overhead vs prenorm by width, from unpaired medians "
                                         "(these runs hold no paired timing)"))
    if figs.get("router_flop_share_vs_width") is None and figs.get("flops_vs_depth"):
        cost.blocks.append(_figure_block(figs["flops_vs_depth"], "flops_vs_depth", "Forward GFLOP by depth"))
    cost.blocks += [
        _figure_block(figs.get("overhead_vs_width"), "overhead_vs_width",
                      "Paired step-time ratio to prenorm vs width (median of pairs, 95 % bootstrap CI "
                      "as bars; deepest depth); naive solid, two_phase dashed"),
        _figure_block(figs.get("overhead_vs_depth"), "overhead_vs_depth",
                      "Paired step-time ratio to prenorm vs depth (widest width)"),
        _figure_block(figs.get("router_flop_share_vs_width"), "router_flop_share_vs_width",
                      "Router FLOPs as a share of the forward's vs width: counted by fvcore (solid) "
                      "beside the analytic model (dotted)"),
        _figure_block(figs.get("memory_vs_depth"), "memory_vs_depth",
                      "Saved activations and router state vs depth, as multiples of prenorm's (eager)"),
    ]
    cost.blocks.append(("text", "Detail: unpaired medians (overhead = router median / prenorm median − 1 "
                                "in the same run; the paired ratios are in the summary and the paired "
                                "section)."))
    cost.blocks += _table_blocks(tables.overhead_table(df), "No timed cost cases.", drop=("variant",),
                                 split=("run_id", "workload", "mode", "backend", "compile_mode"))
    cost.blocks += [("subtitle", "Throughput and MFU"), (
        "text", "tokens/s = tokens per step (B·T; B for decode) / median step. Model FLOP per "
                "step (docs/FLOPS.md, \"MFU\"): per token 6·N + 12·L·d·T for fwd_bwd and "
                "train_step (2·N + 4·L·d·T for fwd and decode), N = the sublayers' matrix "
                "parameters, plus the router's analytic mixing (×3 when training). MFU = model "
                "FLOP/s ÷ the device's dense BF16 peak, looked up by name; blank on CPU or an "
                "unknown device.")]
    cost.blocks += _table_blocks(tables.mfu_table(df, manifests), "No timed cost cases.",
                                 drop=("variant",),
                                 split=("run_id", "workload", "mode", "backend", "compile_mode"))
    bt = tables.backend_table(df)
    bt = bt[bt["backend"] != "eager"]
    backends = Section("Backends: compiled and graph-replayed vs eager", [(
        "text", "Paired: each compiled step timed in one interleaved group with the eager step of "
                "the same router, impl and shape; vs eager = median over rounds of compiled / eager "
                "time of the same round, with a 95 % bootstrap CI (below 1 is faster).")])
    backends.blocks += _table_blocks(paired.paired_vs_eager_table(df),
                                     "No paired eager/compiled groups in these runs (runs before "
                                     "backends were paired: see the unpaired table below).",
                                     drop=("variant", "session"), split=("run_id", "mode"))
    backends.blocks.append(("text", "Unpaired (detail): vs_eager = median step / the eager median of "
                                    "the same router, impl, mode and shape; setup_s is the compile or "
                                    "CUDA-graph capture time, never included in a step."))
    backends.blocks += _table_blocks(bt, "No compile or cudagraph rows in these runs.",
                                     drop=("variant",), split=("run_id", "mode"))
    backends.blocks.append(_figure_block(figs.get("compile_vs_eager"), "compile_vs_eager",
                                         "Eager vs compiled"))
    models = Section("Router cost models", [(
        "text", "Per router and shape: analytic forward FLOP per token (naive reference, "
                f"{tables.FLOP_CONVENTION}); residual-stream traffic per token and sublayer in "
                "units of d elements: io_ideal_d is the ideal I/O model (each input read once, "
                "each output written once, two-phase schedule; the AttnRes paper's Table 1 gives "
                "3 for prenorm and 5.5 for Block AttnRes at 128 sublayers, N=8) and "
                "io_measured_d what this impl's eager ops actually read and write; state_mib is "
                "the peak live router state.")])
    models.blocks += _table_blocks(tables.router_cost_table(df), "No router cost rows.",
                                   drop=("variant",))
    models.blocks.append(_figure_block(figs.get("router_cost_models"), "router_cost_models",
                                       "Residual-stream traffic per token and sublayer (d elements): the "
                                       "ideal I/O model beside what each impl's eager ops move"))
    pairs = Section("Paired timing: ratio to prenorm with bootstrap CI", [("text", paired.METHOD)])
    pairs.blocks += _table_blocks(paired.paired_ratio_table(df), paired.NO_TABLE,
                                  drop=("variant",), split=("run_id", "mode", "backend",
                                                            "compile_mode"))
    if not figs.get("paired_ratios"):  # else the summary shows it
        pairs.blocks.append(("text", paired.NO_DATA))
    floor_t = floor.floor_table(df)
    floors = Section("Physical floor: the router's extra bytes over the memory bandwidth",
                     [("text", floor.FLOOR_METHOD)])
    floors.blocks += _table_blocks(floor_t, floor.NO_TABLE, drop=("variant",),
                                   split=("run_id", "mode", "backend", "compile_mode"))
    impl_t = impls.impl_table(df)
    impl_sec = Section("Implementations: step time relative to the fastest, with parity errors",
                       [("text", impls.METHOD)])
    if figs.get("impls"):
        impl_sec.blocks.append(_figure_block(figs["impls"], "impls", "Step time / fastest impl of "
                                             "each case; the label is the impl's parity error"))
    impl_sec.blocks += _table_blocks(impl_t, impls.NO_TABLE, split=("run_id", "mode", "backend"))
    return [cost, pairs, floors, backends, impl_sec, models]


#: Columns of a failed case folded into its label (:func:`reports.tables.case_label`); the case
#: key (hundreds of characters) stays out of the report.
_FAILURE_FOLDED = ("case_key", "router", "options", "impl", "backend", "compile_mode", "mode",
                   "workload", "d_model", "n_layers", "seq_len", "batch_size", "seed")


def _warnings(df: pd.DataFrame) -> list[str]:
    """What the reader must know before trusting a number: problems met reading the records, and
    timed groups whose last timing was noisy (:mod:`harness.noise`; their ratios are flagged in
    the paired table)."""
    out = [f"Records: {p}" for p in df.attrs.get("record_problems", [])]
    given = df.attrs.get("noise_thresholds")
    if given and given != noise.THRESHOLDS:
        out.append("Noise thresholds given to this report (not the defaults the run re-measured by): "
                   + ", ".join(f"{k} {v:g}" for k, v in given.items()) + ".")
    noisy = paired.noise_by_case(df, df.attrs.get("noise_thresholds"))
    if noisy:
        timed = tables.ok_rows(df, "step_time")["case_key"].nunique()
        retimed = int((df.drop_duplicates("case_key")["attempts"] > 1).sum()) if "attempts" in df else 0
        first = df.drop_duplicates("case_key").set_index("case_key", drop=False)
        examples = "; ".join(f"{tables.case_label(first.loc[k])}: {', '.join(r)}"
                             for k, r in list(noisy.items())[:5])
        out.append(f"Noise: {len(noisy)} of {timed} timed cases were noisy in their last timing "
                   f"({retimed} cases were timed more than once); their absolute times are unreliable, "
                   f"their paired ratios are flagged (column \"noisy\"). E.g. {examples}.")
    return out + consistency_warnings(df)


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
        keys = [k for k in tables.CASE_KEYS if k != "mode"]
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
            on = [k for k in ("run_id", "backend", "compile_mode", "mode", "workload", *tables.SHAPE_COLS,
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


def build_sections(df: pd.DataFrame, run_dirs: list[Path], figs: dict[str, Path | None]
                   ) -> tuple[str, list[Section]]:
    """The report's title and sections from the long frame, its run directories and its figures
    (name -> PNG path or ``None``).

    Only what the runs hold is reported: the cost sections when there are cost-sweep rows, the
    training race when there are training rows (first when there are no cost rows); then the
    failed cases, and the environment and method last.
    """
    manifests = tables.load_manifests(run_dirs)
    has_cost = not tables.cost_rows(df).empty
    has_train = not training.train_rows(df).empty
    sections = []
    if has_cost:
        said, table = summary.cost_sentences(df)
        if said:
            top = Section("Summary: what each router costs", [("text", x) for x in said])
            if figs.get("paired_ratios"):
                top.blocks.append(("figure", figs["paired_ratios"], "Per-pair ratio to prenorm (median and "
                                   "95 % bootstrap CI)"))
            top.blocks.append(("text", summary.METHOD))
            top.blocks += _table_blocks(table, "")
            sections.append(top)
    train = (Section("Training race: time to target loss", _training_blocks(df, figs, manifests))
             if has_train else None)
    if train is not None and not has_cost:  # a training run: its sentences are the summary
        sections.append(train)
    warnings = _warnings(df)
    for run_id, m in manifests.items():
        split = (m.get("group_memory") or {}).get("split") or []
        if split:
            warnings.append(f"Split groups (run {run_id}): {len(split)} paired group(s) did not fit in "
                            f"{m['group_memory']['budget_bytes'] / 2**30:.1f} GiB by estimate and were timed "
                            "as subgroups that each hold prenorm (and a router's eager and compiled steps "
                            "together): ratios to prenorm and to eager stay paired; times across "
                            "subgroups are not.")
    if warnings:
        sections.append(Section("Warnings", [("text", w) for w in warnings]))
    sections += _cost_sections(df, figs, manifests) if has_cost else []
    if train is not None and has_cost:
        sections.append(train)
    if not (has_cost or has_train):
        sections.append(Section("Results", [("text", "No rows in these runs: no cost-sweep "
                                                     "rows and no training rows.")]))
    fails = Section("Skipped and failed cases", _table_blocks(
        tables.failures(df), ("No failure row; but some records could not be read (see Warnings), "
                              "so cases may be missing: `routerbench status RUN_DIR` counts them."
                              if df.attrs.get("record_problems") else
                              "None: every case ran" + (" (not-converged training runs are listed above)."
                                                        if has_train else ".")), drop=_FAILURE_FOLDED))
    aborted = {str(d): aborted_summary(d) for d in run_dirs}
    if any(a["units"] for a in aborted.values()):
        fails.blocks.append(("text", "Units cut short and measured again (their rows are kept in "
                                     "aborted/ and never used here): " + "; ".join(
            f"{d}: {a['units']} unit(s), {a['rows']} row(s)" for d, a in aborted.items() if a["units"])))
    env = environment_table(run_dirs)
    head = Section("Environment", _table_blocks(
        env, "No manifest.json in " + ", ".join(map(str, run_dirs)) + "."))
    if has_cost:
        head.blocks.append(("text", "Method: step times are medians of the timed repeats (IQR = "
                            "q75 − q25); overhead = router median / prenorm median − 1 in the "
                            "same run, at the same backend, compile mode, mode, workload and "
                            f"shape. FLOPs from fvcore: {tables.FLOP_CONVENTION}. Memory in MiB "
                            "(2^20 bytes)."))
    return _title(df, env, run_dirs), [*sections, fails, head]


def render_markdown(title: str, sections: list[Section], out_dir: Path) -> str:
    """Markdown text; figures as image links relative to ``out_dir``."""
    lines = [f"# {title}", ""]
    for s in sections:
        lines += [f"## {s.title}", ""]
        for kind, *rest in s.blocks:
            if kind == "text":
                lines += [rest[0], ""]
            elif kind == "subtitle":
                lines += [f"### {rest[0]}", ""]
            elif kind == "table":  # a "|" (case keys use it) or a newline would break the row
                cells = rest[0].map(lambda v: v.replace("|", "\\|").replace("\n", " "))
                lines += [cells.to_markdown(index=False, disable_numparse=True), ""]
            else:
                path, caption = rest
                rel = Path(path).resolve().relative_to(Path(out_dir).resolve())
                lines += [f"![{caption}]({rel.as_posix()})", ""]
    return "\n".join(lines)


def render_html(title: str, sections: list[Section]) -> str:
    """A self-contained HTML page: inline CSS, tables via ``DataFrame.to_html``, figures as
    base64 PNG data URIs."""
    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
             f"<title>{html.escape(title)}</title><style>{CSS}</style></head><body>",
             f"<h1>{html.escape(title)}</h1>", '<nav class="toc"><strong>Contents</strong><ol>']
    parts += [f'<li><a href="#s{i}">{html.escape(s.title)}</a></li>' for i, s in enumerate(sections, 1)]
    parts.append("</ol></nav>")
    for i, s in enumerate(sections, 1):
        parts.append(f'<h2 id="s{i}">{html.escape(s.title)}</h2>')
        for kind, *rest in s.blocks:
            if kind == "text":
                parts.append(f'<p class="note">{html.escape(rest[0])}</p>')
            elif kind == "subtitle":
                parts.append(f"<h3>{html.escape(rest[0])}</h3>")
            elif kind == "table":
                parts.append(rest[0].to_html(index=False, border=0, escape=True))
            else:
                path, caption = rest
                data = base64.b64encode(Path(path).read_bytes()).decode("ascii")
                parts.append(f'<figure><img alt="{html.escape(caption)}" '
                             f'src="data:image/png;base64,{data}"><figcaption>'
                             f"{html.escape(caption)}</figcaption></figure>")
    parts.append("</body></html>")
    return "\n".join(parts)


def build_report(run_dirs: list[Path | str], out_dir: Path | str | None = None,
                 noise_thresholds: dict | None = None) -> dict[str, Path]:
    """Tables, figures and the report of one or more runs.

    Args:
        run_dirs: run directories (``results/<device-slug>/<run-id>/``), each with
            ``records.jsonl`` and, ideally, ``manifest.json``.
        out_dir: where to write; defaults to the run directory when there is exactly one.
        noise_thresholds: thresholds of a noisy group (:data:`harness.noise.THRESHOLDS` keys);
            None: the defaults.

    Returns:
        File name -> path of everything written: ``report.md``, ``report.html``,
        ``overhead.csv`` (when there are cost cases), ``paired.csv``
        (:func:`reports.paired.paired_ratio_table`, when there are paired step times),
        ``training_runs.csv`` and ``training_comparison.csv`` (:mod:`reports.training`, when
        there are training runs) and one ``<figure>.png`` per figure that had data, with
        ``<figure>.csv`` beside it where the figure writes its data. A CSV or figure without
        data is not written, and one left by an earlier report is removed.

    Raises:
        ValueError: no run directory, or several and no ``out_dir`` (``routerbench report --out``).
        FileNotFoundError: a run directory without ``records.jsonl`` (named in the message).
    """
    paths = tables.run_dir_paths(run_dirs)
    if out_dir is None:
        if len(paths) > 1:
            raise ValueError(f"{len(paths)} run directories given and no out_dir: pass out_dir "
                             "(routerbench report RESULTS... --out DIR)")
        out_dir = paths[0]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    df = tables.load_frame(paths)
    df.attrs["noise_thresholds"] = noise_thresholds  # None: harness.noise.THRESHOLDS
    names = {run: (m.get("environment") or {}).get("device_name") or m.get("device_name")
             for run, m in tables.load_manifests(paths).items()}
    df["device_name"] = [names.get(r) or d for r, d in zip(df["run_id"], df["device"])]
    written: dict[str, Path] = {}
    for name, frame in (("overhead.csv", tables.overhead_table(df)),
                        ("paired.csv", paired.paired_ratio_table(df)),
                        ("floor.csv", floor.floor_table(df)),
                        ("training_runs.csv", training.runs_table(df)),
                        ("training_comparison.csv", training.comparison_table(df))):
        if not frame.empty:  # like a figure: only when the runs hold its data
            frame.to_csv(out / name, index=False)
            written[name] = out / name
        elif (out / name).exists():
            (out / name).unlink()  # from an earlier report whose data is no longer here
    figs = {}
    for name, fn in {**figures.FIGURES, **paired.FIGURES, **impls.FIGURES}.items():
        figs[name] = fn(df, out)
        for stale in (out / f"{name}.png", out / f"{name}.csv"):
            if figs[name] is None and stale.exists():
                stale.unlink()  # a figure of an earlier report whose data is no longer here
        if figs[name] is not None:
            written[figs[name].name] = figs[name]
            data = figs[name].with_suffix(".csv")
            if data.exists():
                written[data.name] = data
    title, sections = build_sections(df, paths, figs)
    md, page = out / "report.md", out / "report.html"
    md.write_text(render_markdown(title, sections, out), encoding="utf-8")
    page.write_text(render_html(title, sections), encoding="utf-8")
    written[md.name], written[page.name] = md, page
    return written
