"""``routerbench list``: routers (implementations, options), backends, modes, presets."""

from __future__ import annotations

import click

from harness.step.backends import BACKENDS
from harness.step.modes import MODES
from harness.sweep.cases import offered_impls
from routers import ROUTERS, router_class, router_options
from routers.registry import origin
from workloads.config import PRESETS, TRAINING_PRESETS

from . import SHORT_HELP


@click.command("list", short_help=SHORT_HELP["list"])
def list_cmd() -> None:
    """Routers (with implementations and options), backends, modes and presets."""
    click.echo("routers:")
    for name in sorted(ROUTERS):
        cls = router_class(name)
        opts = ", ".join(f"{k}={v!r}" for k, v in router_options(name).items() if k != "impl")
        doc = (cls.__doc__ or "").strip().splitlines()[0]
        click.echo(f"  {name:14s} impls={','.join(offered_impls(name))}  [{origin(name)}]  {doc}")
        if opts:
            click.echo(f"  {'':14s} options: {opts}")
    import torch

    from routers import impls, plugins
    device = "cuda" if torch.cuda.is_available() else "cpu"
    click.echo(f"implementations (family, schedule; availability here, on {device}):")
    for name in impls.names():
        impl = impls.IMPLS[name]
        why = impl.unavailable_reason(device)
        ver = impl.version()
        fam = impl.family.name if impl.family else "every"
        conv = "; ".join(f"{r}: " + ", ".join(f"{k}={v!r}" for k, v in o.items()) for r, o in impl.options.items())
        click.echo(f"  {name:15s} {fam:6s} {impl.schedule:11s} [{plugins.impl_origin(name)}]  routers={','.join(impl.routers)}  "
                   f"dtypes={','.join(impl.dtypes)}  devices={','.join(impl.devices_here())}  "
                   + (f"conventions {conv}  " if conv else "")
                   + ("available" + (f" ({impl.package} {ver})" if ver else "") if not why else f"unavailable: {why}"))
    click.echo("backends: " + ", ".join(
        b + (f" (compile modes: {', '.join(m for m in ms if m)})" if any(ms) else "")
        for b, ms in BACKENDS.items()))
    click.echo("modes: " + ", ".join(MODES) + ", train (routerbench train)")
    click.echo("presets:")
    for name, cfg in PRESETS.items():
        click.echo(f"  {name:12s} d={cfg.d_model} L={cfg.n_layers} heads={cfg.n_heads} "
                   f"T={cfg.seq_len} B={cfg.batch_size} {cfg.dtype}")
    click.echo("training settings of the presets (each value from the paper or ours):")
    for tp in TRAINING_PRESETS.values():
        click.echo("  " + tp.describe())


COMMANDS = (list_cmd,)
