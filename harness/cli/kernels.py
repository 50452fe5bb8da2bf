"""``routerbench kernels``: each ``fused`` kernel alone, and each peer depth mixer per op, at a shape
(docs/IMPLS.md, "Each kernel alone"). On CUDA: the time of each kernel re-run alone, warm and after
an L2 flush, its bytes by the byte rule, GB/s and share of the copy bandwidth measured here, and the
config the autotuner chose. On a CPU: each kernel once under Triton's interpreter, its counted bytes
beside its byte model (no time)."""

from __future__ import annotations

import os

import click

from . import SHORT_HELP
from ..spec.kernels import KernelsSpec
from .common import load_spec, spec_options


def _plan(spec: KernelsSpec, cuda: bool) -> list[str]:
    k = spec.kernels
    how = (f"each kernel re-run alone, {k.repeats} samples warm and {k.repeats} after an L2 flush (CUDA events)"
           if cuda else "each kernel once under Triton's interpreter, its loads and stores counted (no time)")
    lines = [f"kernels: fused of {', '.join(k.routers)} at d={k.d_model}, {k.n_layers} layers, {k.tokens} rows, "
             f"{k.dtype}, one training step of route() alone: {how}"]
    if cuda and k.peers:
        lines.append("peers: each available depth mixer of block_attnres, forward and forward+backward, over "
                     "the last block's pool")
    return lines


def _cannot_run_here(cuda: bool) -> str | None:
    """Why the kernels cannot run on this machine as started, or None."""
    import importlib.util
    if importlib.util.find_spec("triton") is None:
        return ("kernels: triton is not installed: pip install -e '.[kernels]' in the checkout "
                "(make test-kernels does)")
    if not cuda and os.environ.get("TRITON_INTERPRET") != "1":
        return ("kernels: no CUDA device here, so the kernels run under Triton's interpreter, which "
                "Triton reads when it is imported: run TRITON_INTERPRET=1 routerbench kernels …")
    return None


@click.command("kernels", short_help=SHORT_HELP["kernels"])
@spec_options(KernelsSpec)
@click.option("--dry-run", "dry_run", is_flag=True, default=False,
              help="Print what would run (the routers, the shape, how each kernel is measured) and whether "
                   "it can run here, and exit 0: no kernel runs.")
def kernels_cmd(config, dry_run, **cli) -> None:
    """Each fused kernel alone at a shape (default: d=1024, 12 layers, 8,192 rows, bf16 on CUDA;
    d=64, 4 layers, 16 rows, float32 under Triton's interpreter on a CPU), and on CUDA each peer
    depth mixer per op: time warm and after an L2 flush, GB/s by the byte rule and share of the copy
    bandwidth measured here, the autotuner's config; on a CPU the interpreter's byte count beside
    each kernel's byte model. --dry-run prints what would run."""
    import torch
    cuda = torch.cuda.is_available()
    spec, _ = load_spec(KernelsSpec, cli, config)
    why = _cannot_run_here(cuda)
    if dry_run:
        for line in _plan(spec, cuda):
            click.echo(line)
        click.echo(f"here: it would stop at once: {why.removeprefix('kernels: ')}" if why else "here: it can run")
        click.echo("dry run: no kernel run")
        return
    if why:
        from routers.errors import ConfigError
        raise ConfigError(why)
    for line in _plan(spec, cuda):
        click.echo(line)
    _run(spec, torch.device("cuda" if cuda else "cpu"))


def _run(spec: KernelsSpec, device) -> None:
    import torch

    from harness.costs import kernel_times as kt
    k = spec.kernels
    dtype = getattr(torch, k.dtype)
    bandwidth = None
    if device.type == "cuda":
        from harness.costs.bandwidth import measure_bandwidth
        bandwidth = measure_bandwidth(device)["median_gbs"]
        click.echo(f"copy bandwidth measured here: {bandwidth:.0f} GB/s")
    for router in k.routers:
        launches = kt.capture(router, k.d_model, k.n_layers, k.tokens, dtype, device)
        click.echo(f"\n{router} fused: {sum(x.per_step for x in launches)} launches a step, {len(launches)} distinct")
        head = f"  {'kernel':<15} {'key':<18} {'per step':>8} {'grid':<14} {'MB (rule)':>10}"
        click.echo(head + (f" {'µs warm':>12} {'µs flushed':>12} {'GB/s':>7} {'of copy':>8}  config"
                           if device.type == "cuda" else f" {'MB asked':>9} {'MB counted':>11}"))
        for x in launches:
            row = f"  {x.name:<15} {_key(x):<18} {x.per_step:>8} {str(x.grid):<14} {x.rule_bytes / 1e6:>10.3f}"
            if device.type == "cuda":
                warm, flushed = (kt.time_launch(x, device, k.repeats, flush) for flush in (False, True))
                gbs = x.rule_bytes / (flushed[0] * 1e-6) / 1e9
                row += (f" {warm[0]:>7.1f}±{warm[1]:<4.1f} {flushed[0]:>7.1f}±{flushed[1]:<4.1f} {gbs:>7.0f} "
                        f"{gbs / bandwidth:>7.0%}  {kt.chosen_config(x)}")
            else:
                counted = kt.count_launch(x)
                row += f" {x.asked_bytes / 1e6:>9.3f} {counted / 1e6:>11.3f}" + ("" if counted == x.asked_bytes
                                                                                  else "  (differs from its model)")
            click.echo(row)
    if device.type == "cuda" and k.peers:
        _peers(spec, device, dtype)


#: How the columns name the autotune key's parameters (``routers.block.fused_launch.KEYS``).
KEY_NAMES = {"N": "pool", "n_q": "queries", "K": "kinds", "U": "updates"}


def _key(x) -> str:
    """The launch's autotune key less the width and the row bucket (the same for every launch of
    one command), in words: ``pool=7 queries=2`` (slots of the pool read, pseudo-queries),
    ``kinds=1 updates=3`` (detail kinds, the block's updates so far)."""
    from routers.block.fused_launch import KEYS
    return " ".join(f"{KEY_NAMES.get(k, k)}={v}" for k, v in zip(KEYS[x.name], x.key)
                    if k not in ("d", "R_BUCKET")) or "–"


def _peers(spec: KernelsSpec, device, dtype) -> None:
    from harness.costs import kernel_times as kt
    from routers import build_router, impls
    k = spec.kernels
    n = build_router("block_attnres", k.d_model, k.n_layers).n_blocks + 1
    click.echo(f"\npeers: a read over {n} sources of ({k.tokens}, {k.d_model}) {k.dtype}, µs (median ± IQR)")
    for impl in impls.impls_for("block_attnres"):
        mix = impl.point("mix")
        if impl.builtin or mix is None:
            continue
        why = impl.unavailable_reason(device.type, k.dtype, "fwd_bwd")
        if why:
            click.echo(f"  {impl.name:<15} not here: {why}")
            continue
        t = kt.time_peer(mix, n, k.d_model, k.tokens, dtype, device, k.repeats)
        click.echo(f"  {impl.name:<15} fwd {t['fwd'][0]:.1f}±{t['fwd'][1]:.1f}  fwd+bwd {t['fwd_bwd'][0]:.1f}±{t['fwd_bwd'][1]:.1f}")


COMMANDS = (kernels_cmd,)
