"""The ``routerbench`` command (DESIGN.md, "Commands").

Every option is checked before any model is built; a bad value exits with status 2 and one line
``routerbench: error: …`` naming the option to change.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click
import torch

from routers import ROUTERS, router_class, router_options
from workloads.config import GRIDS, PRESETS, ConfigError, preset

from . import cases as cases_mod
from .env import default_device, device_slug, new_run_id, write_manifest
from .paired import ORDERS, PAIRED_DEFAULT, timing_manifest
from .records import RecordWriter, done_cases
from .timing import TimingPolicy

DEFAULT_TRAIN_ROUTERS = ("prenorm", "haares")
#: The default race: char-level, small enough for a 2-core CPU (a smoke test, see README).
DEFAULT_TRAIN = {"preset": "cpu-train", "target_loss": 1.9, "max_steps": 300, "eval_every": 20}


def _given(value, default):
    """An option's value when given (0 included, so validation can refuse it), else the default."""
    return default if value is None else value


def _csv(value: str | None) -> list[str] | None:
    return [v.strip() for v in value.split(",") if v.strip()] if value else None


def _ints(value: str | None, option: str) -> list[int] | None:
    try:
        return [int(v) for v in _csv(value)] if value else None
    except ValueError:
        raise ConfigError(f"{option} takes comma-separated integers, got {value!r}") from None


def _json_options(value: str | None) -> dict:
    if not value:
        return {}
    try:
        opts = json.loads(value)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--router-options must be JSON like '{{\"haares\": {{\"n_blocks\": 2}}}}': {exc}") from None
    if not isinstance(opts, dict) or not all(isinstance(v, dict) for v in opts.values()):
        raise ConfigError("--router-options must map router names to option objects, "
                          "e.g. '{\"haares\": {\"partial_details\": \"never\"}}'")
    return opts


def _device(name: str | None) -> torch.device:
    if name is None:
        return default_device()
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise ConfigError(f"--device {name!r} is not a torch device (cpu, cuda, cuda:1)") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda: no CUDA device is visible; use --device cpu")
    return dev


def _run_dir(out: str, device: torch.device, run_id: str | None) -> tuple[Path, str, bool]:
    run_id = run_id or new_run_id()
    run_dir = Path(out) / device_slug(device) / run_id
    return run_dir, run_id, (run_dir / "records.jsonl").exists()


class _Group(click.Group):
    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except (ConfigError, FileNotFoundError) as exc:
            click.echo(f"routerbench: error: {exc}", err=True)
            sys.exit(2)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """Benchmark and profile residual routers in decoder-only Transformers."""


@main.command("list")
def list_cmd() -> None:
    """Routers (with implementations and options), backends, modes and presets."""
    click.echo("routers:")
    for name in sorted(ROUTERS):
        cls = router_class(name)
        opts = ", ".join(f"{k}={v!r}" for k, v in router_options(name).items() if k != "impl")
        doc = (cls.__doc__ or "").strip().splitlines()[0]
        click.echo(f"  {name:14s} impls={','.join(cls.impls)}  {doc}")
        if opts:
            click.echo(f"  {'':14s} options: {opts}")
    click.echo("backends: " + ", ".join(
        b + (f" (compile modes: {', '.join(m for m in ms if m)})" if any(ms) else "")
        for b, ms in cases_mod.BACKENDS.items()))
    click.echo("modes: " + ", ".join(cases_mod.MODES) + ", train (routerbench train)")
    click.echo("presets:")
    for name, cfg in PRESETS.items():
        click.echo(f"  {name:12s} d={cfg.d_model} L={cfg.n_layers} heads={cfg.n_heads} "
                   f"T={cfg.seq_len} B={cfg.batch_size} {cfg.dtype}")


@main.command()
@click.option("--preset", "preset_name", default=None, help="Base shape (default: this device's grid base).")
@click.option("--routers", default=None, help="Comma-separated routers (default: all registered).")
@click.option("--router-options", default=None, help='JSON: {"haares": {"partial_details": "never"}}.')
@click.option("--backends", default=None, help="Comma-separated backends (default: eager on the grid "
              "+ compile at the smallest shape).")
@click.option("--compile-modes", default="default", show_default=True, help="Modes of the compile backend.")
@click.option("--impls", default="naive,two_phase", show_default=True,
              help="Router implementations to sweep (each router runs those it offers).")
@click.option("--modes", default="fwd,fwd_bwd", show_default=True, help="Comma-separated modes.")
@click.option("--workload", default="decoder", show_default=True,
              help="decoder, or router_only (every sublayer is its input RMSNorm: routing cost alone).")
@click.option("--grad-checkpoint", is_flag=True, help="Recompute sublayers in backward (saves activations).")
@click.option("--widths", default=None, help="Comma-separated d_model values (default: device grid).")
@click.option("--depths", default=None, help="Comma-separated n_layers values (default: device grid).")
@click.option("--n-heads", type=int, default=None, help="Attention heads (default: the base shape's).")
@click.option("--seq-len", type=int, default=None, help="Tokens per sequence (default: the base shape's).")
@click.option("--batch-size", type=int, default=None, help="Sequences per step (default: the base shape's).")
@click.option("--dtype", default=None, help="float32, bfloat16, float16 or float64 (default: the base shape's).")
@click.option("--repeats", default=10, show_default=True, help="Timed steps kept per case.")
@click.option("--warmup-s", default=0.5, show_default=True, help="Minimum warm-up seconds per case.")
@click.option("--device", default=None, help="cpu or cuda[:N] (default: cuda if visible).")
@click.option("--out", default="results", show_default=True, help="Results root.")
@click.option("--run-id", default=None, help="Run id; an existing one is resumed.")
@click.option("--no-flops", is_flag=True, help="Skip FLOP counting (fvcore and the FlopCounterMode path).")
@click.option("--train/--no-train", default=True, show_default=True, help="Run the short time-to-target race.")
@click.option("--data", default=None, help="Corpus dir for the race (default: embedded stdlib corpus).")
@click.option("--train-steps", default=DEFAULT_TRAIN["max_steps"], show_default=True, help="Race step budget.")
@click.option("--target-loss", default=DEFAULT_TRAIN["target_loss"], show_default=True, help="Race target (nats).")
@click.option("--report/--no-report", default=True, show_default=True, help="Write the report at the end.")
@click.option("--quiet", is_flag=True, help="No progress bars.")
@click.option("--paired/--no-paired", default=PAIRED_DEFAULT, show_default=True,
              help="Time the routers of each backend, mode and shape interleaved with prenorm, for "
                   "per-pair ratios with bootstrap CIs (holds a group's models at once; "
                   "--no-paired times each case alone).")
@click.option("--pair-order", type=click.Choice(ORDERS), default="ABBA", show_default=True,
              help="Round order of --paired: ABBA reverses the order every round.")
def run(preset_name, routers, router_options, backends, compile_modes, impls, modes, workload,
        grad_checkpoint, widths, depths, n_heads, seq_len, batch_size, dtype, repeats, warmup_s,
        device, out, run_id, no_flops, train, data, train_steps, target_loss, report, quiet,
        paired, pair_order) -> None:
    """Cost sweep (+ a short time-to-target race + report). With no options: this device's default suite."""
    from .sweep import SweepOptions, run_sweep
    from .train import TrainConfig

    dev = _device(device)
    grid = GRIDS["cuda-default" if dev.type == "cuda" else "cpu-default"]
    base = preset(preset_name) if preset_name else grid["base"]
    overrides = {k: v for k, v in dict(n_heads=n_heads, seq_len=seq_len, batch_size=batch_size,
                                         dtype=dtype).items() if v is not None}
    overrides.update(workload=workload, grad_checkpoint=grad_checkpoint)
    if train and train_steps < 1:
        raise ConfigError(f"--train-steps must be >= 1, got {train_steps}")
    names = _csv(routers) or sorted(ROUTERS)
    policy = TimingPolicy(repeats=repeats, warmup_min_s=warmup_s)
    ws, ds = _ints(widths, "--widths") or grid["d_model"], _ints(depths, "--depths") or grid["n_layers"]
    common = dict(modes=_csv(modes) or [], options=_json_options(router_options), impls=_csv(impls),
                  compile_modes=_csv(compile_modes), overrides=overrides)
    if backends is None:  # the default suite: eager on the grid, compile at its smallest shape
        sweep = cases_mod.expand(names, base, ws, ds, backends=["eager"], **common)
        # On CPU a first compile takes tens of seconds: compile the training step (fwd_bwd) only.
        cmodes = common["modes"] if dev.type == "cuda" else (
            [m for m in common["modes"] if m == "fwd_bwd"] or common["modes"])
        sweep += cases_mod.expand(names, base, [min(ws)], [min(ds)], backends=["compile"],
                                  **{**common, "modes": cmodes})
    else:
        sweep = cases_mod.expand(names, base, ws, ds, backends=_csv(backends) or [], **common)
    race = None
    if train:
        race_routers = [r for r in DEFAULT_TRAIN_ROUTERS if r in names] or names[:2]
        race = (race_routers, TrainConfig(preset(DEFAULT_TRAIN["preset"]), target_loss=target_loss,
                                          max_steps=train_steps, eval_every=DEFAULT_TRAIN["eval_every"]))
        corpus = _load_corpus(data)  # fails here, before any model, when --data is wrong
    run_dir, run_id, resumed = _run_dir(out, dev, run_id)
    w = RecordWriter(run_dir, run_id, new_run_id(), base={"device": str(dev)})
    opts = SweepOptions(flops=not no_flops, timing=policy, paired=paired, pair_order=pair_order)
    write_manifest(run_dir, dev, {"run_id": run_id, "cases": len(sweep), "timing": timing_manifest(opts),
                                  **({"corpus": _corpus_info(corpus)} if race else {})})
    click.echo(f"{'resuming' if resumed else 'writing'} {run_dir}  ({len(sweep)} cost cases)")
    stats = run_sweep(sweep, dev, w, opts, progress=not quiet)
    click.echo(f"cost sweep: {stats}")
    if race:
        _race(race[0], _json_options(router_options), corpus, race[1], [0], dev, w, quiet)
    if report:
        _report([run_dir], None)


def _load_corpus(data: str | None):
    from workloads.data import CharCorpus, default_corpus
    if data:
        return CharCorpus.load(data)
    return default_corpus(Path.home() / ".cache" / "routerbench")


def _corpus_info(corpus) -> dict:
    return {"source": corpus.source, "sha256": corpus.sha256, "vocab_size": corpus.vocab_size,
            "n_train": len(corpus.train), "n_val": len(corpus.val), "path": str(corpus.path)}


def _race(routers, options, corpus, tc, seeds, dev, w, quiet) -> None:
    from .train import run_training, train_case_key
    done = done_cases(w.run_dir)
    for seed in seeds:
        for r in routers:
            opts = dict(options.get(r, {}))
            if "impl" not in opts and "two_phase" in router_class(r).impls:
                opts["impl"] = "two_phase"  # same function as naive (tested), less wall time
            if train_case_key(r, opts, tc, seed, corpus.sha256) in done:
                click.echo(f"train {r} seed {seed}: already done, skipped")
                continue
            res = run_training(r, opts, corpus, tc, seed, dev, w, progress=not quiet)
            ttt = f"{res['time_to_target']:.1f} s" if res["time_to_target"] is not None else res["status"]
            click.echo(f"train {r} seed {seed}: time to target {ttt}, final val loss {res['final_val_loss']:.4f}")


@main.command("train")
@click.option("--preset", "preset_name", default=DEFAULT_TRAIN["preset"], show_default=True)
@click.option("--data", default=None, help="Corpus dir (routerbench data prepare); default: embedded corpus.")
@click.option("--routers", default=",".join(DEFAULT_TRAIN_ROUTERS), show_default=True)
@click.option("--router-options", default=None, help='JSON: {"haares": {"n_blocks": 2}}.')
@click.option("--target-loss", type=float, required=True, help="Validation loss (nats) that stops the clock.")
@click.option("--seeds", default=1, show_default=True, help="Number of seeds (0..N-1).")
@click.option("--max-steps", default=DEFAULT_TRAIN["max_steps"], show_default=True)
@click.option("--eval-every", default=DEFAULT_TRAIN["eval_every"], show_default=True)
@click.option("--lr", default=3e-3, show_default=True)
@click.option("--batch-size", type=int, default=None, help="Override the preset's batch size.")
@click.option("--seq-len", type=int, default=None, help="Override the preset's sequence length.")
@click.option("--stop-at-target", is_flag=True, help="End each run at the target (no loss at budget).")
@click.option("--device", default=None)
@click.option("--out", default="results", show_default=True)
@click.option("--run-id", default=None, help="Run id; an existing one is resumed.")
@click.option("--report/--no-report", default=True, show_default=True)
@click.option("--quiet", is_flag=True)
def train_cmd(preset_name, data, routers, router_options, target_loss, seeds, max_steps, eval_every,
              lr, batch_size, seq_len, stop_at_target, device, out, run_id, report, quiet) -> None:
    """Time to a target validation loss, per router and seed."""
    from .train import TrainConfig

    dev = _device(device)
    names = _csv(routers) or []
    for r in names:
        router_class(r)
    if seeds < 1:
        raise ConfigError(f"--seeds must be >= 1, got {seeds}")
    cfg = preset(preset_name)
    cfg = cfg.replace(batch_size=_given(batch_size, cfg.batch_size), seq_len=_given(seq_len, cfg.seq_len))
    options = _json_options(router_options)
    tc = TrainConfig(cfg, target_loss=target_loss, max_steps=max_steps, eval_every=eval_every, lr=lr,
                     stop_at_target=stop_at_target)
    corpus = _load_corpus(data)
    if len(corpus.val) < cfg.seq_len + 1:
        raise ConfigError(f"--seq-len {cfg.seq_len}: the validation split has only {len(corpus.val)} tokens")
    run_dir, run_id, resumed = _run_dir(out, dev, run_id)
    w = RecordWriter(run_dir, run_id, new_run_id(), base={"device": str(dev)})
    write_manifest(run_dir, dev, {"run_id": run_id, "corpus": _corpus_info(corpus)})
    click.echo(f"{'resuming' if resumed else 'writing'} {run_dir}")
    _race(names, options, corpus, tc, list(range(seeds)), dev, w, quiet)
    if report:
        _report([run_dir], None)


@main.command("profile")
@click.option("--router", required=True, help="The router to profile (routerbench list).")
@click.option("--router-options", default=None, help='JSON options of this router: {"n_blocks": 2}.')
@click.option("--impl", default=None, help="Router implementation (default: the router's first).")
@click.option("--backend", default="eager", show_default=True, help="eager, compile or cudagraph.")
@click.option("--compile-mode", default="default", show_default=True, help="Mode of the compile backend.")
@click.option("--mode", default="fwd_bwd", show_default=True, help="fwd, fwd_bwd, train_step or decode.")
@click.option("--preset", "preset_name", default=None, help="Base shape (default: this device's grid base).")
@click.option("--d-model", type=int, default=None, help="Width (default: the base shape's).")
@click.option("--n-layers", type=int, default=None, help="Layers (default: the base shape's).")
@click.option("--n-heads", type=int, default=None, help="Attention heads (default: the base shape's).")
@click.option("--seq-len", type=int, default=None, help="Tokens per sequence (default: the base shape's).")
@click.option("--batch-size", type=int, default=None, help="Sequences per step (default: the base shape's).")
@click.option("--dtype", default=None, help="float32, bfloat16, float16 or float64 (default: the base shape's).")
@click.option("--methods", default=None, help="Router-share methods: labels (eager), paired_difference, "
              "router_only (default: labels on eager, the other two on compile/cudagraph).")
@click.option("--wait", default=1, show_default=True, help="Profiler schedule: steps skipped.")
@click.option("--warmup", default=2, show_default=True, help="Profiler schedule: steps traced and dropped.")
@click.option("--active", default=3, show_default=True, help="Profiler schedule: steps traced and kept.")
@click.option("--pairs", default=10, show_default=True, help="Interleaved A/B rounds (paired_difference, router_only).")
@click.option("--memory-snapshot", is_flag=True, help="CUDA: dump the allocator history of one step "
              "(memory_snapshot.pickle, for pytorch.org/memory_viz).")
@click.option("--max-entries", default=100_000, show_default=True, help="Allocator events the snapshot keeps.")
@click.option("--device", default=None, help="cpu or cuda[:N] (default: cuda if visible).")
@click.option("--out", default="results", show_default=True, help="Results root.")
@click.option("--run-id", default=None, help="Run id (the folder is profile-<run-id>).")
def profile_cmd(router, router_options, impl, backend, compile_mode, mode, preset_name, d_model, n_layers,
                n_heads, seq_len, batch_size, dtype, methods, wait, warmup, active, pairs, memory_snapshot,
                max_entries, device, out, run_id) -> None:
    """torch.profiler traces of one case and the router's share of its step time."""
    from .backends import BACKENDS, unavailable_reason
    from .modes import MODES
    from .profile import check_methods, default_methods, profile_case

    dev = _device(device)
    if router not in ROUTERS:
        raise ConfigError(f"--router: unknown router {router!r}; known routers: {', '.join(sorted(ROUTERS))}")
    if backend not in BACKENDS:
        raise ConfigError(f"--backend: unknown backend {backend!r}; known: {', '.join(BACKENDS)}")
    if backend == "compile" and compile_mode not in BACKENDS["compile"]:
        raise ConfigError(f"--compile-mode: unknown mode {compile_mode!r}; known: {', '.join(BACKENDS['compile'])}")
    cm = compile_mode if backend == "compile" else None
    if mode not in MODES:
        raise ConfigError(f"--mode: unknown mode {mode!r}; known: {', '.join(MODES)}")
    reason = unavailable_reason(backend, cm, dev)
    if reason:
        raise ConfigError(f"--backend {backend}: {reason}; use --backend eager or compile")
    try:
        opts = json.loads(router_options) if router_options else {}
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--router-options must be JSON like '{{\"n_blocks\": 2}}': {exc}") from None
    if not isinstance(opts, dict):
        raise ConfigError("--router-options must be a JSON object of this router's options, "
                          "e.g. '{\"n_blocks\": 2}'")
    default_impl, opts = cases_mod.split_impl(router, opts)
    impl = impl or default_impl
    if impl not in router_class(router).impls:
        raise ConfigError(f"--impl {impl!r}: router {router} offers {', '.join(router_class(router).impls)}")
    for name, value, least in (("--wait", wait, 0), ("--warmup", warmup, 0), ("--active", active, 1),
                               ("--pairs", pairs, 1), ("--max-entries", max_entries, 1)):
        if value < least:
            raise ConfigError(f"{name} must be >= {least}, got {value}")
    try:
        chosen = check_methods(_csv(methods) or default_methods(backend), backend, cm)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    grid = GRIDS["cuda-default" if dev.type == "cuda" else "cpu-default"]
    base = preset(preset_name) if preset_name else grid["base"]
    cfg = base.replace(d_model=d_model or base.d_model, n_layers=n_layers or base.n_layers,
                       n_heads=_given(n_heads, base.n_heads), seq_len=_given(seq_len, base.seq_len),
                       batch_size=_given(batch_size, base.batch_size), dtype=_given(dtype, base.dtype))
    case = cases_mod.Case(router, cfg, mode, backend, cm, tuple(sorted(opts.items())), impl)
    cases_mod.validate([case])  # builds the router only: checks its options
    if memory_snapshot and dev.type != "cuda":
        click.echo("--memory-snapshot: CUDA only, skipped on this CPU run")
        memory_snapshot = False

    run_id = f"profile-{run_id or new_run_id()}"
    run_dir = Path(out) / device_slug(dev) / run_id
    w = RecordWriter(run_dir, run_id, new_run_id(), base={"device": str(dev)})
    write_manifest(run_dir, dev, {"run_id": run_id, "case": case.key, "methods": list(chosen),
                                  "schedule": {"wait": wait, "warmup": warmup, "active": active}})
    click.echo(f"writing {run_dir}")
    try:
        res = profile_case(case, dev, run_dir, wait=wait, warmup=warmup, active=active, writer=w,
                           methods=chosen, pairs=pairs, memory_snapshot=memory_snapshot, max_entries=max_entries)
    except torch.cuda.OutOfMemoryError as exc:
        w.write(**case.columns(), metric="router_share", unit="%", status="oom", error=str(exc).splitlines()[0])
        raise click.ClickException("out of CUDA memory: lower --batch-size, --seq-len or --d-model") from None
    click.echo(res["table"].to_string(index=False, na_rep="–", float_format=lambda v: f"{v:.3f}"))
    click.echo("router share: " + ", ".join(f"{m} {v:.1f} %" for m, v in res["router_share_by_method"].items()))
    click.echo(f"trace: {res['trace_dir']}  (tensorboard --logdir, ui.perfetto.dev, HTA TraceAnalysis)")
    if res["memory_snapshot"]:
        click.echo(f"memory snapshot: {res['memory_snapshot']}  (pytorch.org/memory_viz)")


@main.command("report")
@click.argument("results", nargs=-1, required=True)
@click.option("--out", default=None, help="Output dir (default: the run dir when one is given).")
def report_cmd(results, out) -> None:
    """Tables, seaborn figures, report.html and report.md from one or more run dirs."""
    _report([Path(r) for r in results], out)


def _report(run_dirs, out) -> None:
    from reports import build_report
    paths = build_report(run_dirs, out)
    click.echo("report: " + ", ".join(str(paths[k]) for k in ("report.html", "report.md") if k in paths))


@main.command("summary")
@click.argument("results", nargs=-1, required=True)
def summary_cmd(results) -> None:
    """Print step time per case: vs prenorm, vs eager, and compile/capture time apart."""
    from reports.tables import backend_table, load_frame
    t = backend_table(load_frame([Path(r) for r in results]))
    if t.empty:
        click.echo("no ok step_time rows")
        return
    t = t.assign(shape=t.apply(lambda r: f"d{r.d_model} L{r.n_layers} T{r.seq_len} B{r.batch_size}", axis=1),
                 backend=t.backend + t.compile_mode.map(lambda m: f"[{m}]" if m else ""))
    cols = ["shape", "mode", "backend", "router", "impl", "median_ms", "overhead_pct", "vs_eager", "setup_s"]
    click.echo(t[cols].to_string(index=False, float_format=lambda v: f"{v:.2f}", na_rep="–"))


@main.group("data")
def data_group() -> None:
    """Corpora for the training race."""


@data_group.command("prepare")
@click.option("--text", required=True, help="A UTF-8 text file.")
@click.option("--out", required=True, help="Output directory of the corpus.")
@click.option("--val-fraction", default=0.1, show_default=True, help="Tail of the text kept for validation.")
def data_prepare(text, out, val_fraction) -> None:
    """Make a char-level corpus (train.bin, val.bin, vocab.json) from a text file."""
    from workloads.data import prepare_corpus
    try:
        corpus = prepare_corpus(text, out, val_fraction=val_fraction)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    click.echo(f"{out}: vocab {corpus.vocab_size}, train {len(corpus.train):,} / val {len(corpus.val):,} "
               f"tokens, sha256 {corpus.sha256[:16]}…")


if __name__ == "__main__":
    main()
