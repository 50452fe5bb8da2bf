"""What a report says, section by section: the summary of what each router costs, warnings, the
cost sweep (step time, paired timing, the physical floor, backends, implementations, cost
models), the training race, failures and the environment (:func:`build_sections`). Only what the
runs hold is reported; a figure without data is replaced by the sentence saying why
(:data:`NO_DATA`).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from harness.rundir.records import aborted_summary
from harness.step.backends import plain
from routers import BASELINE

from . import (cautions, conventions, count_figures, declared, floor, frame, impls, paired, paper_baseline, race, sentences,
               summary, tables, time_figures, training, training_figures)
from .environment import environment_table
from . import plotting as pl
from .render import Section, table_blocks

#: Why a figure is missing, by figure name (each figure module's own, and the paired figure's).
NO_DATA = {**time_figures.NO_DATA, **count_figures.NO_DATA, **training_figures.NO_DATA}


CPU_RACE_NOTE = ("On CPU the race is a smoke test: the papers see gains only at 24–48 layers. "
                 "Time, steps and tokens to target are interpolated linearly between the two "
                 "evaluations around the crossing, as the protocol below says.")


def _figure_block(path: Path | None, name: str, caption: str) -> tuple:
    return ("figure", path, caption) if path else ("text", NO_DATA[name])


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
                   "runs dotted, each alone, out of the band, named by router in the legend; the "
                   "pilot dashed; the target loss dash-dotted.",
    "time_to_target": "Time to target, router / baseline, per seed (dots) with the geometric "
                      "mean and its t-interval (black diamond); open triangles are bounds of "
                      "pairs where one run did not converge, left out of the interval.",
    "decomposition": "Time-to-target ratio = steps ratio × time-per-step ratio: geometric means "
                     "over the pairs where both runs reached the target, each with its own "
                     "t-interval; a line at 1.",
}


TRAIN_TITLE = "Training race: time to target loss"


def _race_headline(df: pd.DataFrame, manifests: dict[str, dict]) -> list:
    """The race's sentences for the report's summary (after the cost sentences), under a
    subtitle that points to the race's own section; a smoke race says it is one."""
    table = race.comparison_table(df)
    said = sentences.training_sentences(table, training.sentence_prefixes(df, table, manifests))
    smoke = training.smoke_runs(df)
    head = (f"Training race (section \"{TRAIN_TITLE}\" below"
            + (": a smoke test, one seed per router, not a result)" if smoke else ")"))
    if smoke:  # every sentence that quotes a one-seed race says so, not only its subtitle
        said = [f"One seed, a smoke test, not a result: {x[0].lower() + x[1:] if x[:1].isupper() and not x.split()[0].isupper() else x}"
                for x in said]
    return [("subtitle", head), *(("text", x) for x in said)] if said else []


def _training_blocks(df: pd.DataFrame, figs: dict[str, Path | None],
                     manifests: dict[str, dict]) -> list:
    """The training race: the settings of each run, the protocol, sentences, the comparison
    table, the figures, the per-run table (pilot rows marked), a line counting what did not
    converge or diverged."""
    runs = training.runs_table(df)
    table = race.comparison_table(df)
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
        blocks += [("text", race.METHOD), *said]
        blocks += table_blocks(race.comparison_display(table, pl.variant_labels(df)),
                                "No comparison: no router was trained beside its baseline "
                                f"({BASELINE}) in the same run and backend.",
                                split=("run_id", "backend"))
        blocks += [_figure_block(figs.get(n), n, TRAINING_CAPTIONS[n])
                   for n in TRAINING_CAPTIONS]
    blocks.append(("subtitle", "Every run" + (" (the pilot, mode pilot, set the target loss)"
                                              if (runs["mode"] == training.PILOT_MODE).any()
                                              else "")))
    blocks += table_blocks(runs, "", drop=("router",), split=("run_id", "backend"))
    pooled = tables.training_by_router(df)
    if not pooled.empty and pooled["seeds"].max() > 1:
        blocks.append(("text", "Pooled over seeds (a run that never reached the target counts "
                               "as slowest):"))
        blocks += table_blocks(pooled, "")
    blocks.append(("text", sentences.runs_sentence(runs)))
    return blocks


def _cost_sections(df: pd.DataFrame, figs: dict[str, Path | None],
                   manifests: dict[str, dict]) -> list[Section]:
    """The sections of the cost sweep: step time, FLOPs and memory; paired timing; backends;
    the routers' cost models."""
    cost = Section("Cost: step time, FLOPs and memory vs prenorm", [])  # figures first, then tables
    # Every figure written is shown. Paired ratios are the headline; the unpaired overhead comes
    # first only where no paired timing exists (a run timed --no-paired), and says so.
    paired_fig = figs.get("overhead_vs_width") is not None
    unpaired = [_figure_block(figs["step_time_overhead_vs_width"], "step_time_overhead_vs_width",
                              "Step-time overhead vs prenorm by width, from unpaired medians "
                              "(router median / prenorm median − 1 in the same run)"
                              + ("" if paired_fig else "; these runs hold no paired timing"))
                ] if figs.get("step_time_overhead_vs_width") else []
    flops = [_figure_block(figs["flops_vs_depth"], "flops_vs_depth",
                           f"Forward GFLOP by depth (fvcore; {tables.FLOP_CONVENTION})")
             ] if figs.get("flops_vs_depth") else []
    cost.blocks += [] if paired_fig else unpaired
    cost.blocks += [
        _figure_block(figs.get("overhead_vs_width"), "overhead_vs_width",
                      "Paired step-time ratio to prenorm vs width (median of pairs; bars: the stopping "
                      "rule's interval when timed to a precision target, else a 95 % bootstrap CI; deepest depth); naive solid, two_phase dashed, lean dotted"),
        _figure_block(figs.get("overhead_vs_depth"), "overhead_vs_depth",
                      "Paired step-time ratio to prenorm vs depth (widest width)"),
        *(unpaired if paired_fig else []), *flops,
        _figure_block(figs.get("router_flop_share_vs_width"), "router_flop_share_vs_width",
                      "Router FLOPs as a share of the forward's vs width: counted by fvcore (solid) "
                      "beside the analytic model (dotted)"),
        _figure_block(figs.get("memory_vs_depth"), "memory_vs_depth",
                      "Saved activations and router state vs depth, as multiples of prenorm's (eager)"),
    ]
    cost.blocks.append(("text", "Detail: unpaired medians (overhead = router median / prenorm median − 1 in the same run; the paired ratios are in the "
                                "summary and the paired section). ops fwd / bwd: the aten ops one eager forward and its backward dispatch (ops / prenorm: "
                                "their sum over prenorm's; counts depend on the device and the torch version). On a GPU an eager step issues one kernel launch "
                                "per op from Python: when the host is slower than the device the step takes the launch count × the host's cost per op, so "
                                "eager ratios measure op counts, and graph replay and compile the device's cost."))
    cost.blocks += table_blocks(tables.overhead_table(df), "No timed cost cases.", drop=("variant",),
                                 split=("run_id", "workload", "mode", "backend", "compile_mode", "compile_scope"))
    cost.blocks += [("subtitle", "Throughput and MFU"), (
        "text", "tokens/s = tokens per step (B·T; B for decode) / median step. Model FLOP per "
                "step (docs/FLOPS.md, \"MFU\"): per token 6·N + 12·L·d·T for fwd_bwd and "
                "train_step (2·N + 4·L·d·T for fwd and decode), N = the sublayers' matrix "
                "parameters, plus the router's analytic mixing (×3 when training). MFU = model "
                "FLOP/s ÷ the device's dense BF16 peak, looked up by name; blank on CPU or an "
                "unknown device. HFU = the FLOPs the step dispatched (counted at dispatch, "
                "recomputation and masked attention included) per second ÷ the same peak: what the "
                "hardware was asked to do, not the model's useful work.")]
    cost.blocks += table_blocks(tables.mfu_table(df, manifests), "No timed cost cases.",
                                 drop=("variant",),
                                 split=("run_id", "workload", "mode", "backend", "compile_mode", "compile_scope"))
    if (said := declared.sentence(df[df["metric"] == "router_flops_analytic"],
                                  "its model FLOP and MFU cells are blank")) is not None:
        cost.blocks.append(("text", said))
    bt = tables.backend_table(df)
    bt = bt[~bt["backend"].map(plain).astype(bool)]
    backends = Section("Backends: compiled and graph-replayed vs eager", [(
        "text", "Paired: each compiled step timed in one interleaved group with the eager step of "
                "the same router, impl and shape; vs eager = median over rounds of compiled / eager "
                "time of the same round, with the stopping rule's interval when timed to a precision target, else a 95 % bootstrap CI (the interval column; below 1 is faster).")])
    backends.blocks += table_blocks(paired.paired_vs_eager_table(df),
                                     "No paired eager/compiled groups in these runs (runs before "
                                     "backends were paired: see the unpaired table below).",
                                     drop=("variant", "session"), split=("run_id", "mode"))
    backends.blocks.append(("text", "Unpaired (detail): vs_eager = median step / the eager median of "
                                    "the same router, impl, mode and shape; setup_s is the compile or "
                                    "CUDA-graph capture time, never included in a step."))
    backends.blocks += table_blocks(bt, "No compile or cudagraph rows in these runs.",
                                     drop=("variant",), split=("run_id", "mode"))
    backends.blocks.append(_figure_block(figs.get("compile_vs_eager"), "compile_vs_eager",
                                         "Eager vs compiled"))
    scope_t = paired.paired_scope_table(df)
    if not scope_t.empty:
        backends.blocks += [("subtitle", "Compile scopes: layer vs model"), (
            "text", "Paired: the layer-scope step (one compiled region per sublayer role, reused at every "
                    "layer) against the model-scope step (the whole forward in one graph) of the same "
                    "router, impl and shape, timed in one interleaved group; layer / model = median over "
                    "rounds with the stopping rule's interval when timed to a precision target, else a 95 % bootstrap CI (below 1 is faster).")]
        backends.blocks += table_blocks(scope_t, "", drop=("variant", "session"), split=("run_id", "mode"))
    comp_t = tables.compile_table(df)
    if not comp_t.empty:
        backends.blocks += [("subtitle", "What compiling took"), (
            "text", "Per compiled case: compile time (the first call, s); dynamo's graph breaks; "
                    "graphs_fwd, the forward graphs Inductor compiled (dynamo's stats.unique_graphs), "
                    "graphs_bwd, the backward graphs beyond them (Inductor's fxgraph_cache hits + "
                    "misses + bypasses, less the forward ones); recompiles, compiled frames beyond one "
                    "per compiled function (frames.ok); Inductor's FX-graph cache and AOTAutograd's "
                    "cache hits and misses (a cold compile misses every one).")]
        backends.blocks += table_blocks(comp_t, "", drop=("variant",), split=("run_id", "mode"))
    backends.blocks.append(_figure_block(figs.get("compile_time_vs_depth"), "compile_time_vs_depth",
                                         "Compile time vs depth: layer scope solid, model scope dashed; hollow markers hit Inductor's cache"))
    models = Section("Router cost models", [(
        "text", "Per router and shape: analytic forward FLOP per token (naive reference, "
                f"{tables.FLOP_CONVENTION}); residual-stream traffic of the forward only (its "
                "backward: `routerbench costs`) per token and sublayer in "
                "units of d elements, by the byte rule (docs/MEASUREMENT.md): io_ideal_d is the ideal I/O model (each input read once, "
                "each output written once, two-phase schedule; the AttnRes paper's Table 1 gives "
                "3 for prenorm and 5.5 for Block AttnRes at 128 sublayers, N=8) and "
                "io_measured_d what this impl's forward reads and writes; io_kernel_d "
                "(fused only) the part its Triton kernels load and store (their byte models), without the running sums' "
                "eager adds; state_mib is the peak live router state.")])
    models.blocks += table_blocks(tables.router_cost_table(df), "No router cost rows.",
                                   drop=("variant",))
    if (said := declared.sentence(df)) is not None:
        models.blocks.append(("text", said))
    models.blocks.append(_figure_block(figs.get("router_cost_models"), "router_cost_models",
                                       "Residual-stream traffic of one forward per token and sublayer (d elements): the "
                                       "ideal I/O model beside what each impl moves"))
    pairs = Section("Paired timing: ratio to prenorm with bootstrap CI", [("text", paired.METHOD)])
    pairs.blocks += table_blocks(paired.paired_ratio_table(df), paired.NO_TABLE,
                                  drop=("variant",), split=("run_id", "mode", "backend",
                                                            "compile_mode", "compile_scope"))
    if not figs.get("paired_ratios"):  # else the summary shows it
        pairs.blocks.append(("text", paired.NO_DATA))
    paper_t = paper_baseline.paired_vs_paper_table(df)
    if not paper_t.empty:
        pairs.blocks += [("subtitle", "Against the paper baseline: HAARES and WAV v1 vs Block AttnRes"),
                         ("text", paper_baseline.METHOD)]
        pairs.blocks += table_blocks(paper_t, paper_baseline.NO_TABLE, drop=("variant",),
                                     split=("run_id", "mode", "backend", "compile_mode", "compile_scope"))
    floor_t = floor.floor_table(df)
    floors = Section("Physical floor: the router's extra bytes over the memory bandwidth",
                     [("text", floor.FLOOR_METHOD)])
    floors.blocks += table_blocks(floor_t, floor.NO_TABLE, drop=("variant",),
                                   split=("run_id", "mode", "backend", "compile_mode", "compile_scope"))
    if (said := declared.floor_sentence(floor_t)) is not None:
        floors.blocks.append(("text", said))
    impl_t = impls.impl_table(df)
    impl_sec = Section("Implementations: step time relative to the fastest, with parity errors",
                       [("text", impls.METHOD)])
    if figs.get("impls"):
        impl_sec.blocks.append(_figure_block(figs["impls"], "impls", "Step time / fastest impl of "
                                             "each case; the label is the impl's parity error"))
    impl_sec.blocks += table_blocks(impl_t, impls.NO_TABLE, split=("run_id", "mode", "backend"))
    vs_t = impls.impl_vs_table(df)
    if not vs_t.empty:
        impl_sec.blocks += [("text", impls.VS_METHOD)] + table_blocks(vs_t, impls.NO_VS_TABLE, split=("run_id", "mode"))
    conv_t = conventions.conventions_table(df)
    if not conv_t.empty:
        impl_sec.blocks += [("text", conventions.METHOD)] + table_blocks(conv_t, "", split=("run_id",))
    return [cost, pairs, floors, backends, impl_sec, models]


#: Columns of a failed case folded into its label (:func:`reports.tables.case_label`); the case
#: key (hundreds of characters) stays out of the report.
_FAILURE_FOLDED = ("case_key", "router", "options", "impl", "backend", "compile_mode", "compile_scope", "mode",
                   "workload", "d_model", "n_layers", "seq_len", "batch_size", "seed")


def build_sections(df: pd.DataFrame, run_dirs: list[Path], figs: dict[str, Path | None]
                   ) -> tuple[str, list[Section]]:
    """The report's title and sections from the long frame, its run directories and its figures
    (name -> PNG path or ``None``).

    Only what the runs hold is reported: the cost sections when there are cost-sweep rows, the
    training race when there are training rows (first when there are no cost rows); then the
    failed cases, and the environment and method last.
    """
    manifests = frame.load_manifests(run_dirs)
    has_cost = not frame.cost_rows(df).empty
    has_train = not training.train_rows(df).empty
    sections = []
    if has_cost:
        said, table = summary.cost_sentences(df, manifests)
        if (first := cautions.verdict(df)) is not None:  # a run that cannot answer says so first
            said = [first, *said]
        if said:
            top = Section("Summary: what each router costs", [("text", x) for x in said])
            if figs.get("paired_ratios"):
                top.blocks.append(("figure", figs["paired_ratios"], "Per-pair ratio to prenorm (median; "
                                   "the stopping rule's interval or a 95 % bootstrap CI)"))
            if figs.get("paper_ratios"):
                top.blocks.append(("figure", figs["paper_ratios"], "HAARES and WAV v1 against Block AttnRes: "
                                   "per-pair ratio to the paper baseline with the same impl, timed in the "
                                   "same group (median; the stopping rule's interval or a 95 % bootstrap CI)"))
            top.blocks.append(("text", summary.METHOD))
            top.blocks += table_blocks(table, "")
            sections.append(top)
    train = (Section(TRAIN_TITLE, _training_blocks(df, figs, manifests)) if has_train else None)
    if train is not None and sections:  # the race's headline beside the costs, on the first screen
        sections[0].blocks[len(said):len(said)] = _race_headline(df, manifests)
    if train is not None and not has_cost:  # a training run: its sentences are the summary
        sections.append(train)
    warnings = (cautions.incomplete(df, manifests) + cautions.interpreted(df, manifests)
                + cautions.race_threads(manifests) + cautions.warnings(df))
    for run_id, m in manifests.items():
        split = (m.get("group_memory") or {}).get("split") or []
        if split:
            warnings.append(f"Split groups (run {run_id}): {len(split)} paired group(s) did not fit in "
                            f"{m['group_memory']['budget_bytes'] / 2**30:.1f} GiB by estimate and were timed "
                            "as subgroups that each hold prenorm (and a router's eager and compiled steps "
                            "together): ratios to prenorm and to eager stay paired; times across "
                            "subgroups are not.")
    old_floor = sorted(r for r, m in manifests.items() if m.get("floor_version", 1) != floor.FLOOR_VERSION)
    if old_floor and has_cost and not floor.floor_table(df).empty:
        warnings.append(f"Floor: run(s) {', '.join(old_floor)} were made under floor version "
                        f"{manifests[old_floor[0]].get('floor_version', 1)} (a training step charged 3× its forward, "
                        f"prenorm 9 units); this report shows version {floor.FLOOR_VERSION}, the ideal fwd+bwd model "
                        "(docs/ROUTERS.md), so its × floor differs from their earlier reports'.")
    if warnings:
        sections.append(Section("Warnings", [("text", w) for w in warnings]))
    sections += _cost_sections(df, figs, manifests) if has_cost else []
    if train is not None and has_cost:
        sections.append(train)
    if not (has_cost or has_train):
        sections.append(Section("Results", [("text", "No rows in these runs: no cost-sweep "
                                                     "rows and no training rows.")]))
    fails = Section("Skipped and failed cases", table_blocks(
        tables.failures(df), ("No failure row; but some records could not be read (see Warnings), "
                              "so cases may be missing: `routerbench status RUN_DIR` counts them."
                              if df.attrs.get("record_problems") else
                              "None: every case ran" + (" (not-converged training runs are listed above)."
                                                        if has_train else ".")), drop=_FAILURE_FOLDED))
    aborted = {str(d): aborted_summary(d) for d in run_dirs}
    if any(a["units"] for a in aborted.values()):
        fails.blocks.append(("text", "Units cut short (an interrupt, a crash or a sticky device error; their rows "
                                     "are kept in aborted/ and never used here, and a resume measures their "
                                     "cases again): " + "; ".join(
            f"{d}: {a['units']} unit(s), {a['rows']} row(s)" for d, a in aborted.items() if a["units"])))
    env = environment_table(run_dirs)
    head = Section("Environment", table_blocks(
        env, "No manifest.json in " + ", ".join(map(str, run_dirs)) + "."))
    if has_cost:
        head.blocks.append(("text", "Method: step times are medians of the timed repeats (IQR = "
                            "q75 − q25); overhead = router median / prenorm median − 1 in the "
                            "same run, at the same backend, compile mode, mode, workload and "
                            f"shape. FLOPs from fvcore: {tables.FLOP_CONVENTION}. Memory in MiB "
                            "(2^20 bytes)."))
    return _title(df, env, run_dirs), [*sections, fails, head]
