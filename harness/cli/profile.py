"""``routerbench profile``: torch.profiler traces of one case and the router's share of its step."""

from __future__ import annotations

import sys

import click

from . import SHORT_HELP
from ..spec import ProfileSpec
from .common import Run, load_spec, spec_options


@click.command("profile", short_help=SHORT_HELP["profile"])
@spec_options(ProfileSpec)
def profile_cmd(config, **cli) -> None:
    """torch.profiler traces of one case and the router's share of its step time.

    Writes results/<device>/profile-<run-id>/ (the prefix is added to --run-id). The shape defaults
    to this device's grid base (CPU: d=64, 4 layers, T=64, B=8)."""
    import torch

    from harness.sweep.profile import profile_case

    spec, _ = load_spec(ProfileSpec, cli, config)
    p, case = spec.profile, spec.case()
    if cli.get("memory_snapshot") and not p.memory_snapshot:
        click.echo("--memory-snapshot: CUDA only, skipped on this CPU run")
    run = Run("profile", spec, prefix="profile-")
    if case.key in run.writer.completed:
        run.writer.close()
        click.echo(f"{run.dir}: this profile is complete; nothing left to do (routerbench report {run.dir})")
        return
    _set_aside_partial_outputs(run)
    run.manifest({"case": case.key, "methods": list(p.methods),
                  "schedule": {"wait": p.wait, "warmup": p.warmup, "active": p.active}})
    run.announce()
    with run.guarded(lambda: [case.key]):
        with run.writer.unit([case.key], kind="profile") as u:
            try:
                res = profile_case(case, run.device, run.dir, wait=p.wait, warmup=p.warmup, active=p.active,
                                   writer=u, methods=p.methods, pairs=p.pairs or 10,
                                   memory_snapshot=p.memory_snapshot, max_entries=p.max_entries or 100_000)
            except Exception as exc:  # noqa: BLE001 - recorded as the case's row, then one line
                oom = isinstance(exc, torch.cuda.OutOfMemoryError)
                first = (str(exc).strip().splitlines() or [""])[0][:300]
                u.write(**case.columns(), metric="router_share", unit="%", status="oom" if oom else "error",
                        error=f"{type(exc).__name__}: {first}")
                u.commit({case.key: "oom" if oom else "error"})
                hint = "out of CUDA memory" if oom else f"{type(exc).__name__}: {first}"
                click.echo(f"routerbench: error: profiling failed ({hint}); lower --batch-size, --seq-len "
                           "or --d-model if it is memory", err=True)
                sys.exit(1)
            u.commit({case.key: "ok"})
    shown = res["table"].copy()  # calls per step are counts: "1", "2.5", never "1.000"
    shown["calls"] = shown["calls"].map(lambda v: "–" if v != v else f"{v:g}").astype(object)
    click.echo(shown.to_string(index=False, na_rep="–", float_format=lambda v: f"{v:.3f}"))
    click.echo("router share: " + ", ".join(f"{m} {v:.1f} %" for m, v in res["router_share_by_method"].items()))
    click.echo(f"trace: {res['trace_dir']}  (tensorboard --logdir, ui.perfetto.dev, HTA TraceAnalysis)")
    if res["memory_snapshot"]:
        click.echo(f"memory snapshot: {res['memory_snapshot']}  (pytorch.org/memory_viz)")


def _set_aside_partial_outputs(run: Run) -> None:
    """Files an attempt that was cut short left beside the records (its trace, its share table)
    go to ``aborted/<session>-outputs/`` with its rows, so the directory holds one profile."""
    import os
    partial = [run.dir / n for n in PROFILE_OUTPUTS if (run.dir / n).exists()]
    if not partial:
        return
    dest = run.dir / "aborted" / f"{run.writer.session}-outputs"
    dest.mkdir(parents=True, exist_ok=True)
    for p in partial:
        os.replace(p, dest / p.name)


#: What ``harness.sweep.profile.profile_case`` writes beside the records.
PROFILE_OUTPUTS = ("trace", "router_share.csv", "router_share.png", "memory_snapshot.pickle")

COMMANDS = (profile_cmd,)
